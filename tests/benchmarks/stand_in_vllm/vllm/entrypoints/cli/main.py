# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""``vllm serve`` and ``vllm bench serve`` as far as benchmarks/dsv41_serve.py
uses them, in the standard library.

The server answers the OpenAI routes in vLLM's shapes and statuses with a
made-up model over a byte-level vocabulary: the token after a sequence is a
fixed function of the sequence (log-probability -0.1), its runner-up is the
next id (-2.5), any other token -9 at rank 50. Greedy answers and
``prompt_logprobs`` follow the same rule, so scoring a greedy answer finds it
the top token everywhere. ``STAND_IN_NOISE=<port>:<nats>,...`` shifts the
scored log-probabilities of the server on that port. A request that arrives
while four are in flight counts a preemption; the KV cache usage is the share
of --max-num-seqs in flight. The KV cache holds
--num-gpu-blocks-override / 90 requests; below one the server refuses to
start. ``STAND_IN_NON_TIE=<backend>`` makes that backend choose the runner-up
at step 5 of prompts over 1,000 tokens. ``/start_profile`` and
``/stop_profile`` write a three-step trace into the profiler's folder.
"""

import argparse
import gzip
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

STEP = 3  # first byte token: three special tokens come first
VOCAB = 1024
BLOCKS_PER_REQUEST = 90


def encode(prompt: str | list[int]) -> list[int]:
    return (
        list(prompt)
        if isinstance(prompt, list)
        else [STEP + b for b in prompt.encode()]
    )


def next_token(ids: list[int]) -> int:
    return STEP + (7 * sum(ids) + len(ids)) % 256


def generate(ids: list[int], n: int, swap_at: int | None) -> list[tuple[int, int]]:
    """(chosen, runner-up) per step; the runner-up chosen at ``swap_at``."""
    ids, steps = list(ids), []
    for i in range(n):
        top = next_token(ids)
        second = STEP + (top - STEP + 1) % 256
        steps.append((second, top) if i == swap_at else (top, second))
        ids.append(steps[-1][0])
    return steps


def scored(ids: list[int], noise: float) -> list[dict | None]:
    """vLLM's ``prompt_logprobs``: per position, the actual token and the
    two most likely, each with log-probability and rank."""
    out: list[dict | None] = [None]
    for p in range(1, len(ids)):
        top = next_token(ids[:p])
        second = STEP + (top - STEP + 1) % 256
        entries = {top: (-0.1, 1), second: (-2.5, 2)}
        entries.setdefault(ids[p], (-9.0, 50))
        out.append({str(t): {"logprob": lp + noise, "rank": r, "decoded_token": str(t)}
                    for t, (lp, r) in entries.items()})  # fmt: skip
    return out


class _State:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.lock = threading.Lock()
        self.in_flight = 0
        self.preemptions = 0
        noise = dict(
            item.split(":") for item in os.environ.get("STAND_IN_NOISE", "").split(",")
            if item
        )  # fmt: skip
        self.noise = float(noise.get(str(args.port), 0.0))

    def enter(self) -> None:
        with self.lock:
            if self.in_flight >= 4:
                self.preemptions += 1
            self.in_flight += 1

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1


def _trace() -> dict:
    """Three engine steps (decode, prefill, decode), a kernel each."""
    events = []
    for i, (name, kernel) in enumerate((
        ("execute_context_0(0)_generation_2(2)", "_sparse_mla_fwd_kernel"),
        ("execute_context_1(100)_generation_0(0)", "nvjet_gemm"),
        ("execute_context_0(0)_generation_2(2)", "fused_moe_kernel"),
    )):  # fmt: skip
        ts = 1000.0 * i
        events += [
            {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": 900},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
             "ts": ts + 10, "dur": 5, "args": {"correlation": i}},
            {"ph": "X", "cat": "kernel", "name": kernel, "ts": ts + 20,
             "dur": 100.0 * (i + 1), "args": {"correlation": i}},
        ]  # fmt: skip
    return {"traceEvents": events}


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
            if self.path in ("/start_profile", "/stop_profile"):
                return self._profile()
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
            ids = encode(prompt)
            if max(ids) >= VOCAB:
                return self._error(400, f"Token id {max(ids)} is out of vocabulary")
            if (body.get("prompt_logprobs") or 0) < -1:
                return self._error(400, "`prompt_logprobs` must be a positive value")
            if len(ids) + max_tokens > args.max_model_len:
                return self._error(400, "longer than the maximum context length")
            swap = os.environ.get("STAND_IN_NON_TIE") == args.attention_backend
            steps = generate(ids, max_tokens, 5 if swap and len(ids) > 1000 else None)
            state.enter()
            try:
                if body.get("stream"):
                    self._stream(chat, steps)
                else:
                    time.sleep(0.05)
                    self._send(200, self._answer(chat, ids, steps, body))
            finally:
                state.leave()

        def _profile(self) -> None:
            config = json.loads(args.profiler_config or "{}")
            folder = Path(config.get("torch_profiler_dir", "/nonexistent"))
            if self.path == "/stop_profile" and folder != Path("/nonexistent"):
                folder.mkdir(parents=True, exist_ok=True)
                with gzip.open(folder / "worker.pt.trace.json.gz", "wt") as f:
                    json.dump(_trace(), f)
            self._send(200, "", "text/plain")

        def _answer(self, chat: bool, ids: list, steps: list, body: dict) -> dict:
            text = "".join(chr(ord("a") + t % 26) for t, _ in steps)
            base = {"id": "x", "created": 0, "model": args.served_model_name}
            if chat:
                message = {"role": "assistant", "content": text}
                choice = {"index": 0, "message": message, "finish_reason": "length"}
                return {**base, "object": "chat.completion", "choices": [choice]}
            choice = {"index": 0, "text": text, "finish_reason": "length"}
            if body.get("logprobs"):
                choice["logprobs"] = {
                    "tokens": [f"token_id:{t}" for t, _ in steps],
                    "token_logprobs": [-0.1 for _ in steps],
                    "top_logprobs": [
                        {f"token_id:{t}": -0.1, f"token_id:{s}": -2.5} for t, s in steps
                    ],
                    "text_offset": list(range(len(steps))),
                }
            if body.get("return_token_ids"):
                choice["prompt_token_ids"] = ids
                choice["token_ids"] = [t for t, _ in steps]
            if body.get("prompt_logprobs") is not None:
                choice["prompt_logprobs"] = scored(ids, state.noise)
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
    parser.add_argument("--profiler-config")
    args, _ = parser.parse_known_args(argv)
    # A request of --max-model-len takes BLOCKS_PER_REQUEST blocks.
    requests = args.num_gpu_blocks_override / BLOCKS_PER_REQUEST
    if requests < 1:
        held = int(requests * args.max_model_len)
        raise SystemExit(
            f"ValueError: ... the estimated maximum model length is {held}."
        )
    tokens = int(requests * args.max_model_len)
    print(
        f"GPU KV cache size: {tokens:,} tokens, Maximum concurrency for "
        f"{args.max_model_len:,} tokens per request: {requests:.2f}x",
        flush=True,
    )
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
    result = {"completed": args.num_prompts, "failed": 0, "duration": 61.0,
              "num_prompts": args.num_prompts, "output_throughput": 500.0,
              "request_throughput": 8.0, **figures}  # fmt: skip
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
