# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Serve a DeepSeek V4.1 checkpoint with ``vllm serve`` through each sparse-MLA
way on one GPU, side by side, and record what each answered, raw.

    python benchmarks/dsv41_serve.py run --model DIR --out DIR [--ways a,b]
    python benchmarks/dsv41_serve.py report DIR
    python benchmarks/dsv41_serve.py trim DIR   # a folder written in full

The ways: (a) ``FLASHMLA_SPARSE_DSV41``, the reference; (b) the fork's
``FLASHINFER_MLA_SPARSE_DSV41`` on the pages vLLM plans for this GPU; (c) the
same with SM12x's fixed pages (``dsv41_serve_sm12x_pages.py``). ``run``
starts one server per way and a second server of (a), all at once on
loopback, each with its KV cache capped at the same number of blocks (pages
of equal tokens on one GPU), small enough that the check set must preempt:

1. the check set (greedy, two log-probabilities a step) on every way but the
   second (a), sent all at once;
2. teacher forcing: each of (a)'s check completions, appended to its prompt,
   is scored by every server (``prompt_logprobs``), all at once, and one at a
   time by the second (a), whose difference from (a) is the threshold;
3. the ``openai`` client, bad requests and faults, each probed after, and a
   streaming client that leaves mid-generation;
4. a torch-profiler trace of each way under the same load;
5. ``vllm bench serve`` at an unbounded rate, then near saturation, the ways
   taking turns, repeated while the time budget lasts.

Every phase is bracketed by raw ``/metrics`` scrapes. ``report``
(``dsv41_serve_report.py``) judges the files and exits 1 when anything failed.
"""

import argparse
import concurrent.futures
import gzip
import hashlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import dsv41_serve_profile  # noqa: E402
from dsv41_engine_generate import PROMPTS  # noqa: E402

# way -> (attention backend, launcher); the launcher plans SM12x's pages.
WAYS = {
    "a": ("FLASHMLA_SPARSE_DSV41", None),
    "b": ("FLASHINFER_MLA_SPARSE_DSV41", None),
    "c": ("FLASHINFER_MLA_SPARSE_DSV41", HERE / "dsv41_serve_sm12x_pages.py"),
}
# The second server of (a): teacher forcing only, the threshold's other half.
REPEAT = "a2"
MODEL_NAME = "dsv41"
MAX_MODEL_LEN = 2304
MAX_NUM_SEQS = 16
CHECK_TOKENS = 96
PROBE_TOKENS = 16
# The check set: the engine run's prompts and longer ones up to what
# --max-model-len leaves room for, each also reversed (other tokens),
# CHECK_TOKENS new tokens each; and short prompts that grow by GROW_TOKENS.
# The prompts fill the capped cache and the growing requests then take its
# last pages, so vLLM must preempt. The tokenizer is byte-level.
_LONG = tuple((PROMPTS[3] * 2)[:n] for n in (1536, 1792, 2048))
_SHORT = tuple(PROMPTS[3][i : i + 24 + 8 * i] for i in range(12))
CHECK_PROMPTS = (*PROMPTS, *_LONG, *(p[::-1] for p in (*PROMPTS, *_LONG)), *_SHORT)
GROW_TOKENS = 480
# KV cache blocks of every server: 825 held 6,937 tokens on the H200 and the
# check set (22,000 tokens) ran without a preemption; this holds about 3,780.
KV_BLOCKS = 450
# The profiled load: the first PROFILE_PROMPTS check prompts, all at once.
PROFILE_PROMPTS = 16
PROFILE_TOKENS = 48
BENCH_SECONDS = 60
BENCH_REPEATS = 3
# Near saturation: this share of (a)'s unbounded request rate.
SATURATION = 0.9


def check_tokens(prompt: str) -> int:
    return GROW_TOKENS if prompt in _SHORT else CHECK_TOKENS


CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
# Faults: name -> (request, the status vLLM answers it with).
FAULTS = {
    "prompt longer than --max-model-len": (
        {"prompt": "x" * (MAX_MODEL_LEN + 100)},
        400,
    ),
    "max_tokens 0": ({"max_tokens": 0}, 400),
    "max_tokens -1": ({"max_tokens": -1}, 400),
    "malformed JSON": (b'{"model": "dsv41", "prompt": ', 400),
    "unknown model": ({"model": "no-such-model"}, 404),
    "empty prompt": ({"prompt": ""}, 400),
    "prompt_logprobs -2": ({"prompt_logprobs": -2}, 400),
    "token id past the vocabulary": ({"prompt": [5, 10**6]}, 400),
}  # fmt: skip
# Start-up lines that name the attention backend, kernel, pages and cache.
STARTUP_LINES = re.compile(
    r"attention backend|sparse MLA on|GPU KV cache size|num_gpu_blocks|block_size",
    re.IGNORECASE,
)


def completion_body(prompt: str | list[int], max_tokens: int) -> dict:
    """A greedy completion request that returns each step's two most likely
    tokens, and the prompt's and answer's tokens, as token ids."""
    return {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "logprobs": 2,
        "ignore_eos": True,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
    }


def scoring_body(token_ids: list[int]) -> dict:
    """Teacher forcing: ``token_ids`` as the prompt, each position's
    log-probability and rank of its token, with the two most likely."""
    return {
        "model": MODEL_NAME,
        "prompt": token_ids,
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 2,
        "return_tokens_as_token_ids": True,
    }


def http(
    url: str, body: dict | bytes | None = None, timeout: float = 600
) -> tuple[int, object]:
    """(status, parsed JSON or text); status 0 when no answer came."""
    data = (
        body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    )
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode(errors="replace")
    except OSError as e:
        return 0, repr(e)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def metric(text: str, names: tuple[str, ...] | str) -> float | None:
    """The sum of a Prometheus metric's samples (the first of ``names`` the
    server exports), or None."""
    for name in (names,) if isinstance(names, str) else names:
        values = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if re.match(rf"{re.escape(name)}(\{{| )", line)
        ]
        if values:
            return sum(values)
    return None


class Server:
    """One ``vllm serve`` process on loopback, its output in ``log``; what
    it answered goes into ``record``, its ``/metrics`` into ``scrapes``."""

    def __init__(self, name: str, args: argparse.Namespace, port: int):
        self.name, self.way = name, name.rstrip("0123456789")
        backend, launcher = WAYS[self.way]
        out: Path = args.out
        template = out / "chat_template.jinja"
        template.write_text(CHAT_TEMPLATE)
        entry = [str(launcher)] if launcher else ["-m", "vllm.entrypoints.cli.main"]
        self.args = [
            "serve", args.model, "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", MODEL_NAME, "--attention-backend", backend,
            "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS),
            "--num-gpu-blocks-override", str(args.num_gpu_blocks),
            # A fixed reservation skips memory profiling, which other servers
            # starting on the same GPU would disturb.
            "--kv-cache-memory-bytes", "4G", "--gpu-memory-utilization", "0.2",
            "--no-enable-prefix-caching", "--seed", "0",
            "--limit-mm-per-prompt", '{"image": 0}', "--chat-template", str(template),
            "--compilation-config", '{"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}',
        ]  # fmt: skip
        self.profile_dir = None
        if name != REPEAT:
            self.profile_dir = Path(f"/tmp/dsv41-profile-{name}-{port}")
            shutil.rmtree(self.profile_dir, ignore_errors=True)
            config = {
                "profiler": "torch",
                "torch_profiler_dir": str(self.profile_dir),
                "torch_profiler_with_stack": False,
                "ignore_frontend": True,
            }
            self.args += ["--profiler-config", json.dumps(config)]
        self.url = f"http://127.0.0.1:{port}"
        self.out = out
        self.log = out / f"{name}.log"
        self.record: dict = {
            "server": name,
            "way": self.way,
            "backend": backend,
            "sm12x_pages": self.way == "c",
            "server_args": self.args,
        }
        self.scrapes: dict[str, str] = {}
        # PyTorch's sampler: FlashInfer's compiles from CUDA sources at first
        # use, and greedy sampling is an argmax either way.
        env = {**os.environ, "VLLM_USE_FLASHINFER_SAMPLER": "0"}
        self.started = time.monotonic()
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, *entry, *self.args],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip

    def wait_ready(self, timeout: float) -> None:
        while time.monotonic() - self.started < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited ({self.process.returncode})")
            if http(self.url + "/health", timeout=5)[0] == 200:
                self.record["start_s"] = round(time.monotonic() - self.started, 1)
                text = self.log.read_text(errors="replace")
                self.record["startup_lines"] = [
                    line for line in text.splitlines() if STARTUP_LINES.search(line)
                ]
                return
            time.sleep(2)
        raise RuntimeError(f"server not ready in {timeout:.0f} s")

    def metrics(self) -> str:
        """The ``/metrics`` page, or "" when the server gave none."""
        status, text = http(self.url + "/metrics", timeout=30)
        return text if status == 200 and isinstance(text, str) else ""

    def scrape(self, label: str) -> str:
        self.scrapes[label] = self.metrics()
        return self.scrapes[label]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.record["exit_code"] = self.process.returncode

    def save(self, comps: list[list[int]]) -> None:
        write_json_gz(self.out / f"{self.name}.json.gz", slim(self.record, comps))
        write_json_gz(self.out / f"{self.name}-scrapes.json.gz", self.scrapes)


def write_json_gz(path: Path, value: object) -> None:
    with gzip.open(path, "wt", compresslevel=9) as f:
        json.dump(value, f)


def read_json_gz(path: Path) -> object:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def slim(record: dict, comps: list[list[int]]) -> dict:
    """``record`` with each scoring answer's prompt positions emptied (None)
    but those of the scored completion, the only ones anything reads."""
    for answer, comp in zip(record.get("score", []), comps, strict=False):
        if answer.get("status") == 200:
            choice = answer["response"]["choices"][0]
            logprobs = choice["prompt_logprobs"]
            keep = len(logprobs) - len(comp)
            choice["prompt_logprobs"] = [None] * keep + logprobs[keep:]
    return record


def post(server: Server, body: dict) -> dict:
    """A completion's raw answer with its status."""
    status, answer = http(server.url + "/v1/completions", body)
    if status != 200 or not isinstance(answer, dict):
        return {"status": status, "error": str(answer)[:500]}
    return {"status": status, "response": answer}


def post_all(server: Server, bodies: list[dict], at_once: bool = True) -> list[dict]:
    if not at_once:
        return [post(server, b) for b in bodies]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda b: post(server, b), bodies))


def phase(server: Server, label: str, work) -> None:
    """``work(server)`` into the record under ``label``, between two
    scrapes; an exception is recorded, not raised."""
    server.scrape(f"{label}-before")
    try:
        server.record[label] = work(server)
    except Exception as e:  # noqa: BLE001 - recorded; the report fails it
        server.record.setdefault("errors", []).append(f"{label}: {e!r}")
    server.scrape(f"{label}-after")


def completions(reference: list[dict]) -> list[list[int]]:
    """(a)'s check completions that were scored, in scoring order."""
    return [
        a["response"]["choices"][0]["token_ids"] for a in reference if scored_tokens(a)
    ]


def scored_tokens(answer: dict) -> list[int] | None:
    """A check answer's prompt and completion tokens, for scoring."""
    if answer.get("status") != 200:
        return None
    choice = answer["response"]["choices"][0]
    prompt = choice.get("prompt_token_ids") or answer["response"].get(
        "prompt_token_ids"
    )
    return [*prompt, *choice["token_ids"]] if prompt is not None else None


def clients(server: Server) -> dict:
    """The ``openai`` client on chat and completions, streaming and not:
    each call's outcome; a stream's text must equal the plain answer's."""
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    common = {"model": MODEL_NAME, "max_tokens": 24, "temperature": 0.0}
    messages = [{"role": "user", "content": PROMPTS[1]}]
    results = {}
    try:
        plain = client.completions.create(prompt=PROMPTS[1], **common)
        results["completion"] = {
            "ok": bool(plain.choices[0].text),
            "text": plain.choices[0].text,
        }
        chunks = client.completions.create(prompt=PROMPTS[1], stream=True, **common)
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        results["completion stream"] = {
            "ok": text == plain.choices[0].text,
            "text": text,
        }
        chat = client.chat.completions.create(messages=messages, **common)
        content = chat.choices[0].message.content or ""
        results["chat"] = {"ok": bool(content), "text": content}
        chunks = client.chat.completions.create(
            messages=messages, stream=True, **common
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        results["chat stream"] = {"ok": text == content, "text": text}
    except openai.OpenAIError as e:
        results["error"] = {"ok": False, "text": repr(e)[:500]}
    return results


def kv_usage(server: Server) -> float | None:
    return metric(server.metrics(), KV_USAGE)


def disconnect(server: Server) -> dict:
    """A streaming client that leaves after a few chunks: does the KV cache
    usage come back to its idle value?"""
    idle = kv_usage(server)
    body = {**completion_body(CHECK_PROMPTS[3], 1000), "stream": True}
    request = urllib.request.Request(
        server.url + "/v1/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as r:
        chunks = [r.readline() for _ in range(8)]
        busy = kv_usage(server)
    deadline = time.monotonic() + 60
    after = kv_usage(server)
    while after != idle and time.monotonic() < deadline:
        time.sleep(1)
        after = kv_usage(server)
    return {
        "chunks_read": sum(1 for c in chunks if c.startswith(b"data:")),
        "kv_usage_idle": idle, "kv_usage_while_streaming": busy,
        "kv_usage_after": after,
    }  # fmt: skip


def faults(server: Server) -> list[dict]:
    """Each bad request or fault, its status, and a probe completion after."""
    results = []
    for name, (change, expected) in FAULTS.items():
        body = change if isinstance(change, bytes) else {
            **completion_body(PROMPTS[0], PROBE_TOKENS), **change
        }  # fmt: skip
        status, answer = http(server.url + "/v1/completions", body)
        results.append({
            "name": name, "status": status, "expected": expected,
            "answer": str(answer)[:300],
            "probe": post(server, completion_body(PROMPTS[0], PROBE_TOKENS)),
        })  # fmt: skip
    burst = post_all(
        server, [completion_body(PROMPTS[0], PROBE_TOKENS)] * (3 * MAX_NUM_SEQS)
    )
    results.append({
        "name": f"burst of {3 * MAX_NUM_SEQS} requests (--max-num-seqs {MAX_NUM_SEQS})",
        "status": sorted({r["status"] for r in burst}), "expected": [200],
        "answer": "", "probe": post(server, completion_body(PROMPTS[0], PROBE_TOKENS)),
    })  # fmt: skip
    return results


def profile(server: Server) -> dict:
    """The torch profiler's trace of one fixed load, copied into the results."""
    bodies = [
        completion_body(p, PROFILE_TOKENS) for p in CHECK_PROMPTS[:PROFILE_PROMPTS]
    ]
    started = http(server.url + "/start_profile", {})[0]
    answers = post_all(server, bodies)
    stopped = http(server.url + "/stop_profile", {})[0]
    deadline, traces = time.monotonic() + 90, []
    while not traces and time.monotonic() < deadline:
        time.sleep(2)
        traces = (
            sorted(server.profile_dir.rglob("*.json*")) if server.profile_dir else []
        )
    name = f"{server.name}-profile.trace.json.gz"
    if traces:
        time.sleep(2)  # the writer may still be flushing
        events = dsv41_serve_profile.slim(dsv41_serve_profile.load(traces[-1]))
        write_json_gz(server.out / name, {"traceEvents": events})
    return {
        "start_status": started, "stop_status": stopped,
        "statuses": [a["status"] for a in answers],
        "trace": name if traces else None, "traces_found": [t.name for t in traces],
    }  # fmt: skip


def bench(server: Server, model: str, rate: str, n: int, tag: str) -> dict:
    """One ``vllm bench serve`` run, its result file kept as it wrote it."""
    name = f"{server.name}-bench-{tag}.json"
    command = [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve",
        "--backend", "vllm", "--base-url", server.url, "--model", MODEL_NAME,
        "--tokenizer", model, "--dataset-name", "random", "--random-input-len", "1008",
        # Prompts of 16 to 2,000 tokens (1008 +- 98.4 %), 64 new tokens each.
        "--random-range-ratio", '{"input": 0.984, "output": 0}',
        "--random-output-len", "64",
        "--num-prompts", str(n), "--request-rate", rate, "--ignore-eos", "--seed", "0",
        "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99",
        "--save-result", "--result-dir", str(server.out), "--result-filename", name,
    ]  # fmt: skip
    server.scrape(f"bench-{tag}-before")
    started = time.monotonic()
    with (server.out / f"{server.name}-bench-{tag}.log").open("w") as log:
        rc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
    server.scrape(f"bench-{tag}-after")
    entry = {"tag": tag, "rate": rate, "num_prompts": n, "rc": rc,
             "wall_s": round(time.monotonic() - started, 1),
             "file": name if (server.out / name).exists() else None}  # fmt: skip
    server.record.setdefault("bench", []).append(entry)
    return entry


def _request_rate(server: Server, entry: dict) -> float | None:
    if not entry.get("file"):
        return None
    return json.loads((server.out / entry["file"]).read_text()).get(
        "request_throughput"
    )


def benches(servers: list[Server], args: argparse.Namespace) -> None:
    """The ways take turns: BENCH_REPEATS runs each of ``--bench-prompts``
    unbounded, then as many at SATURATION of (a)'s median unbounded request
    rate, sized for at least BENCH_SECONDS; no run starts that the way's last
    run (at first ``--bench-expect-s``) says would end after the budget."""
    expect = {s.name: args.bench_expect_s for s in servers}
    plans = [("inf", args.bench_prompts)]
    a_rates: list[float] = []
    while plans:
        rate, n = plans.pop(0)
        for rep in range(1, BENCH_REPEATS + 1):
            for s in servers:
                if time.monotonic() + expect[s.name] + 15 > args.deadline:
                    print(
                        f"bench {rate} #{rep} of ({s.name}): no time left", flush=True
                    )
                    return
                entry = bench(s, args.model, rate, n, f"{rate}-{rep}")
                expect[s.name] = entry["wall_s"]
                if rate == "inf" and s.name == "a":
                    a_rates.append(_request_rate(s, entry) or 0.0)
        if rate == "inf" and any(a_rates):
            near = round(SATURATION * sorted(a_rates)[len(a_rates) // 2], 1)
            plans.append((str(near), math.ceil(BENCH_SECONDS * 1.1 * near)))


def checkpoint_record(model: Path) -> dict:
    """The checkpoint's config and each file's sha256, taken where it ran."""
    sums = {}
    for p in sorted(model.iterdir()):
        if p.is_file():
            with p.open("rb") as f:
                sums[p.name] = hashlib.file_digest(f, "sha256").hexdigest()
    return {"config": json.loads((model / "config.json").read_text()), "sha256": sums}


def in_parallel(servers: list[Server], work) -> None:
    with concurrent.futures.ThreadPoolExecutor(len(servers)) as pool:
        list(pool.map(work, servers))


def run(args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "checkpoint.json").write_text(
        json.dumps(checkpoint_record(Path(args.model)), indent=1) + "\n"
    )
    names = [*args.ways, REPEAT]
    servers = [Server(n, args, args.port + i) for i, n in enumerate(names)]
    ready = []
    for s in servers:
        try:
            s.wait_ready(args.start_timeout)
            ready.append(s)
        except RuntimeError as e:
            s.record.setdefault("errors", []).append(f"start: {e}")
    up = {s.name: s for s in ready}
    ways = [s for s in ready if s.name != REPEAT]
    print(f"up at {time.monotonic() - args.started:.0f} s: {sorted(up)}", flush=True)
    try:
        check = [completion_body(p, check_tokens(p)) for p in CHECK_PROMPTS]
        in_parallel(ways, lambda s: phase(s, "check", lambda s: post_all(s, check)))
        reference = up["a"].record.get("check", []) if "a" in up else []
        scored = [scored_tokens(a) for a in reference]
        bodies = [scoring_body(t) for t in scored if t is not None]
        if bodies:
            in_parallel(list(up.values()), lambda s: phase(
                s, "score", lambda s: post_all(s, bodies, at_once=s.name != REPEAT)
            ))  # fmt: skip
        if REPEAT in up:
            up[REPEAT].stop()
        for label, work in (("clients", clients), ("faults", faults),
                            ("disconnect", disconnect)):  # fmt: skip
            in_parallel(ways, lambda s, label=label, work=work: phase(s, label, work))
        for s in ways:
            phase(s, "profile", profile)
        print(f"benches from {time.monotonic() - args.started:.0f} s", flush=True)
        benches(ways, args)
    finally:
        comps = completions(up["a"].record.get("check", [])) if "a" in up else []
        for s in servers:
            if s.process.poll() is None:
                s.scrape("end")
            s.stop()
            s.save(comps)
    print(f"done at {time.monotonic() - args.started:.0f} s", flush=True)


def trim(out: Path) -> None:
    """What ``run`` now keeps, made of a folder an earlier ``run`` wrote in
    full: scoring answers slimmed, scrapes compressed, traces slimmed."""
    comps = completions(read_json_gz(out / "a.json.gz").get("check", []))
    for path in sorted(out.glob("*.json.gz")):
        if path.name.endswith(".trace.json.gz"):
            events = dsv41_serve_profile.load(path)
            write_json_gz(path, {"traceEvents": dsv41_serve_profile.slim(events)})
        elif not path.name.endswith("-scrapes.json.gz"):
            write_json_gz(path, slim(read_json_gz(path), comps))
    for path in sorted(out.glob("*-scrapes.json")):
        write_json_gz(path.with_suffix(".json.gz"), json.loads(path.read_text()))
        path.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="serve, check, score, fault and bench each way")
    r.add_argument("--model", required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--ways", default="a,b")
    r.add_argument("--port", type=int, default=8731)
    r.add_argument("--num-gpu-blocks", type=int, default=KV_BLOCKS)
    r.add_argument("--start-timeout", type=float, default=300)
    r.add_argument("--bench-prompts", type=int, default=600,
                   help="requests a run at the unbounded rate")  # fmt: skip
    r.add_argument("--bench-expect-s", type=float, default=100,
                   help="a bench run's length until one has run")  # fmt: skip
    r.add_argument("--budget-s", type=float, default=540,
                   help="no bench run starts that would end after this")  # fmt: skip
    rep = sub.add_parser("report", help="judge a run's files")
    rep.add_argument("out", type=Path)
    t = sub.add_parser("trim", help="slim a folder an earlier run wrote in full")
    t.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.command == "trim":
        raise SystemExit(trim(args.out))
    if args.command == "report":
        from dsv41_serve_report import report

        raise SystemExit(report(args.out))
    args.started = time.monotonic()
    args.deadline = args.started + args.budget_s
    args.ways = args.ways.split(",")
    if unknown := set(args.ways) - set(WAYS):
        parser.error(f"--ways: unknown {sorted(unknown)}; choose from {sorted(WAYS)}")
    if "a" not in args.ways:
        parser.error("--ways: (a) is the reference every way is judged by")
    run(args)
    from dsv41_serve_report import report

    raise SystemExit(report(args.out))


if __name__ == "__main__":
    main()
