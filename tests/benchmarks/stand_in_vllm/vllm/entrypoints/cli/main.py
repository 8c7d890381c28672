# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""``vllm serve`` and ``vllm bench serve`` as far as benchmarks/dsv41_serve.py
uses them, in the standard library.

The server answers the OpenAI routes in vLLM's shapes and statuses with made-up
greedy tokens: step i of a prompt is a fixed function of the prompt and i,
with two log-probabilities (-0.1 and -2.5, a clear winner). A request that
arrives while four are in flight counts a preemption; the KV cache usage is the
share of --max-num-seqs in flight. The KV cache holds
--num-gpu-blocks-override / 90 requests; below one the server refuses to start.
``STAND_IN_NON_TIE=<backend>`` makes that backend choose the runner-up at step 5
of prompts over 1,000 characters: an answer that parts from any other backend's
at a non-tie.
"""

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STEP = 3  # first byte token: three special tokens come first
BLOCKS_PER_REQUEST = 90


def _tokens(prompt: str, n: int, swap: bool) -> list[tuple[int, int]]:
    """(chosen, runner-up) per step."""
    seed = sum(prompt.encode())
    steps = []
    for i in range(n):
        top, second = STEP + (seed + 7 * i) % 256, STEP + (seed + 7 * i + 1) % 256
        steps.append((second, top) if swap and i == 5 else (top, second))
    return steps


class _State:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.lock = threading.Lock()
        self.in_flight = 0
        self.preemptions = 0

    def enter(self) -> None:
        with self.lock:
            if self.in_flight >= 4:
                self.preemptions += 1
            self.in_flight += 1

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1


def _handler(state: _State) -> type[BaseHTTPRequestHandler]:
    args = state.args

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a) -> None:
            pass

        def _send(
            self, status: int, body: object, kind: str = "application/json"
        ) -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            self._send(status, {"error": {"message": message, "code": status}})

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, "", "text/plain")
            elif self.path == "/metrics":
                usage = state.in_flight / args.max_num_seqs
                preemptions = float(state.preemptions)
                self._send(200, (
                    f'vllm:num_preemptions_total{{model_name="m"}} {preemptions}\n'
                    f'vllm:kv_cache_usage_perc{{model_name="m"}} {usage}\n'
                ), "text/plain")  # fmt: skip
            else:
                self._error(404, "not found")

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            try:
                body = json.loads(raw)
            except ValueError:
                return self._error(400, "malformed JSON")
            chat = self.path == "/v1/chat/completions"
            prompt = (
                "".join(m["content"] for m in body.get("messages", []))
                if chat
                else body.get("prompt", "")
            )
            if body.get("model") != args.served_model_name:
                return self._error(
                    404, f"The model `{body.get('model')}` does not exist."
                )
            max_tokens = body.get("max_tokens", 16)
            if max_tokens < 1:
                return self._error(400, "max_tokens must be at least 1")
            if not prompt:
                return self._error(400, "empty prompt")
            if len(prompt) + max_tokens > args.max_model_len:
                return self._error(400, "longer than the maximum context length")
            swap = os.environ.get("STAND_IN_NON_TIE") == args.attention_backend
            steps = _tokens(prompt, max_tokens, swap and len(prompt) > 1000)
            state.enter()
            try:
                if body.get("stream"):
                    self._stream(chat, steps)
                else:
                    time.sleep(0.05)
                    self._send(200, self._answer(chat, steps, body.get("logprobs")))
            finally:
                state.leave()

        def _answer(self, chat: bool, steps: list, logprobs: int | None) -> dict:
            text = "".join(chr(ord("a") + t % 26) for t, _ in steps)
            base = {"id": "x", "created": 0, "model": args.served_model_name}
            if chat:
                message = {"role": "assistant", "content": text}
                choice = {"index": 0, "message": message, "finish_reason": "length"}
                return {**base, "object": "chat.completion", "choices": [choice]}
            choice = {"index": 0, "text": text, "finish_reason": "length"}
            if logprobs:
                choice["logprobs"] = {
                    "tokens": [f"token_id:{t}" for t, _ in steps],
                    "token_logprobs": [-0.1 for _ in steps],
                    "top_logprobs": [
                        {f"token_id:{t}": -0.1, f"token_id:{s}": -2.5} for t, s in steps
                    ],
                    "text_offset": list(range(len(steps))),
                }
            return {**base, "object": "text_completion", "choices": [choice]}

        def _stream(self, chat: bool, steps: list) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            kind = "chat.completion.chunk" if chat else "text_completion"
            try:
                for t, _ in steps:
                    char = chr(ord("a") + t % 26)
                    choice = (
                        {"index": 0, "delta": {"content": char}, "finish_reason": None}
                        if chat
                        else {"index": 0, "text": char, "finish_reason": None}
                    )
                    chunk = {"id": "x", "created": 0, "model": args.served_model_name,
                             "object": kind, "choices": [choice]}  # fmt: skip
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(0.01)
                self.wfile.write(b"data: [DONE]\n\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True

    return Handler


def serve(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--attention-backend", required=True)
    parser.add_argument("--max-model-len", type=int, required=True)
    parser.add_argument("--max-num-seqs", type=int, required=True)
    parser.add_argument("--num-gpu-blocks-override", type=int, required=True)
    args, _ = parser.parse_known_args(argv)
    # A request of --max-model-len takes BLOCKS_PER_REQUEST blocks.
    requests = args.num_gpu_blocks_override / BLOCKS_PER_REQUEST
    if requests < 1:
        held = int(requests * args.max_model_len)
        raise SystemExit(
            f"ValueError: ... the estimated maximum model length is {held}."
        )
    print(f"Maximum concurrency for {args.max_model_len:,} tokens per request: "
          f"{requests:.2f}x", flush=True)  # fmt: skip
    # A listen backlog like uvicorn's: bursts of requests are queued, not refused.
    ThreadingHTTPServer.request_queue_size = 2048
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(_State(args)))
    print(f"stand-in serving {args.attention_backend} on {args.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        server.server_close()


def bench_serve(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-prompts", type=int, required=True)
    parser.add_argument("--result-dir", required=True)
    parser.add_argument("--result-filename", required=True)
    args, _ = parser.parse_known_args(argv)
    figures = dict.fromkeys(
        ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
         "median_itl_ms", "p99_itl_ms"), 10.0,
    )  # fmt: skip
    result = {"completed": args.num_prompts, "failed": 0,
              "num_prompts": args.num_prompts, "output_throughput": 500.0,
              **figures}  # fmt: skip
    with open(os.path.join(args.result_dir, args.result_filename), "w") as f:
        json.dump(result, f)


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["serve"]:
        serve(argv[1:])
    elif argv[:2] == ["bench", "serve"]:
        bench_serve(argv[2:])
    else:
        raise SystemExit(f"stand-in vllm: not a command it knows: {argv}")


if __name__ == "__main__":
    main()
