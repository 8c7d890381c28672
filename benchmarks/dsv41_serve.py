# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Serve a DeepSeek V4.1 checkpoint with ``vllm serve`` through each sparse-MLA
way in turn on one GPU, load it, fault it, and judge what it answered.

    python benchmarks/dsv41_serve.py run --model DIR --out DIR [--ways a,b,c]
    python benchmarks/dsv41_serve.py report DIR

The ways: (a) ``FLASHMLA_SPARSE_DSV41``, the reference; (b) the fork's
``FLASHINFER_MLA_SPARSE_DSV41`` on the pages vLLM plans for this GPU; (c) the
same with SM12x's fixed pages (``dsv41_serve_sm12x_pages.py``). ``run`` starts
one server per way on loopback, with a KV cache small enough that the
scheduler must preempt, keeps its log and writes ``<way>.json``:

- the check set (greedy, two log-probabilities a step) sent all at once, and
  for (a) also one prompt at a time: the reference, whose difference from (a)
  under load is the noise N the other ways are judged by;
- the ``openai`` client on chat and completions, streaming and not;
- bad requests and faults, each with the status it got and a probe
  completion after it; a streaming client that leaves mid-generation, and
  whether the KV cache usage returns to its idle value;
- ``vllm bench serve`` on random prompts of 16 to 2,000 tokens, with no
  request-rate bound and at a fixed rate; preemptions from ``/metrics``.

``report`` judges the files (``verdict``) and writes ``summary.json`` and
``table.md``; it exits 1 when anything failed.
"""

import argparse
import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from dsv41_engine_compare import LOGPROB_TOLERANCE, compare_prompt  # noqa: E402
from dsv41_engine_generate import PROMPTS  # noqa: E402

# way -> (attention backend, launcher); the launcher plans SM12x's pages.
WAYS = {
    "a": ("FLASHMLA_SPARSE_DSV41", None),
    "b": ("FLASHINFER_MLA_SPARSE_DSV41", None),
    "c": ("FLASHINFER_MLA_SPARSE_DSV41", HERE / "dsv41_serve_sm12x_pages.py"),
}
MODEL_NAME = "dsv41"
MAX_MODEL_LEN = 2304
MAX_NUM_SEQS = 16
CHECK_TOKENS = 96
PROBE_TOKENS = 16
# The check set, sent all at once: the engine run's prompts and longer ones
# up to what --max-model-len leaves room for, each also reversed (other
# tokens), CHECK_TOKENS new tokens each; and short prompts that grow by
# GROW_TOKENS. The scheduler admits a request only when its prompt fits, so
# the prompts fill the capped cache and the growing requests then take its
# last pages: the running requests need more than it holds, and vLLM must
# preempt. The tokenizer is byte-level: a character is a token.
_LONG = tuple((PROMPTS[3] * 2)[:n] for n in (1536, 1792, 2048))
_SHORT = tuple(PROMPTS[3][i : i + 24 + 8 * i] for i in range(12))
CHECK_PROMPTS = (*PROMPTS, *_LONG, *(p[::-1] for p in (*PROMPTS, *_LONG)), *_SHORT)
GROW_TOKENS = 480


def check_tokens(prompt: str) -> int:
    return GROW_TOKENS if prompt in _SHORT else CHECK_TOKENS


CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREEMPTIONS = "vllm:num_preemptions_total"
# The capped KV cache holds this many requests of --max-model-len (3,500
# tokens); the check set's prompts need 15,000 and its growing requests 6,500.
KV_REQUESTS = 1.5
CAPACITY = r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"
BENCH_KEYS = (
    "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
    "median_itl_ms", "p99_itl_ms", "output_throughput",
)  # fmt: skip
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
}  # fmt: skip


def completion_body(prompt: str, max_tokens: int) -> dict:
    """A greedy completion request that returns each step's two most likely
    tokens, as token ids."""
    return {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "logprobs": 2,
        "ignore_eos": True,
        "return_tokens_as_token_ids": True,
    }


def _token_id(token: str) -> int:
    return int(token.removeprefix("token_id:"))


def generation(response: dict) -> dict:
    """A completion response as the engine run's comparison reads it: the
    tokens and each step's top two [token, logprob], most likely first."""
    logprobs = response["choices"][0]["logprobs"]
    top2 = [
        sorted(([_token_id(t), lp] for t, lp in step.items()), key=lambda x: -x[1])[:2]
        for step in logprobs["top_logprobs"]
    ]
    return {"token_ids": [_token_id(t) for t in logprobs["tokens"]], "top2": top2}


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
    """One ``vllm serve`` process on loopback, its output in ``log``."""

    def __init__(self, way: str, model: str, out: Path, port: int, blocks: int):
        backend, launcher = WAYS[way]
        template = out / "chat_template.jinja"
        template.write_text(CHAT_TEMPLATE)
        entry = [str(launcher)] if launcher else ["-m", "vllm.entrypoints.cli.main"]
        self.args = [
            "serve", model, "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", MODEL_NAME, "--attention-backend", backend,
            "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS),
            "--num-gpu-blocks-override", str(blocks), "--no-enable-prefix-caching",
            "--gpu-memory-utilization", "0.5", "--seed", "0",
            "--limit-mm-per-prompt", '{"image": 0}', "--chat-template", str(template),
            "--compilation-config", '{"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}',
        ]  # fmt: skip
        self.url = f"http://127.0.0.1:{port}"
        self.log = out / f"{way}.log"
        # PyTorch's sampler: FlashInfer's compiles from CUDA sources at first
        # use, and greedy sampling is an argmax either way.
        env = {**os.environ, "VLLM_USE_FLASHINFER_SAMPLER": "0"}
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, *entry, *self.args],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip

    def wait_ready(self, timeout: float) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited ({self.process.returncode})")
            if http(self.url + "/health", timeout=5)[0] == 200:
                return time.monotonic() - started
            time.sleep(2)
        raise RuntimeError(f"server not ready in {timeout:.0f} s")

    def metrics(self) -> str:
        status, text = http(self.url + "/metrics", timeout=30)
        return text if status == 200 and isinstance(text, str) else ""

    def stop(self) -> int | None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode


def complete(server: Server, prompt: str, max_tokens: int) -> dict:
    status, body = http(
        server.url + "/v1/completions", completion_body(prompt, max_tokens)
    )
    if status != 200 or not isinstance(body, dict):
        return {"status": status, "error": str(body)[:500]}
    return {"status": status, **generation(body)}


def complete_all(
    server: Server, prompts: tuple[str, ...], max_tokens: int | None = None
) -> list:
    """``prompts`` sent at once; ``max_tokens`` None: the check set's own."""
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return list(
            pool.map(
                lambda p: complete(server, p, max_tokens or check_tokens(p)), prompts
            )
        )


def clients(server: Server) -> dict:
    """The ``openai`` client on chat and completions, streaming and not:
    each call's outcome; a stream's tokens must equal the plain answer's."""
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


def disconnect(server: Server, idle: float | None) -> dict:
    """A streaming client that leaves after a few chunks: does the KV cache
    usage come back to its idle value?"""
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
        "kv_usage_after": after, "returned": after == idle,
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
            "probe": complete(server, PROMPTS[0], PROBE_TOKENS),
        })  # fmt: skip
    burst = complete_all(server, (PROMPTS[0],) * (3 * MAX_NUM_SEQS), PROBE_TOKENS)
    results.append({
        "name": f"burst of {3 * MAX_NUM_SEQS} requests (--max-num-seqs {MAX_NUM_SEQS})",
        "status": sorted({r["status"] for r in burst}), "expected": [200],
        "answer": "", "probe": complete(server, PROMPTS[0], PROBE_TOKENS),
    })  # fmt: skip
    return results


def bench(server: Server, model: str, out: Path, way: str, rate: str, n: int) -> dict:
    name = f"{way}-bench-rate-{rate}.json"
    command = [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve",
        "--backend", "vllm", "--base-url", server.url, "--model", MODEL_NAME,
        "--tokenizer", model, "--dataset-name", "random", "--random-input-len", "1008",
        # Prompts of 16 to 2,000 tokens (1008 +- 98.4 %), 64 new tokens each.
        "--random-range-ratio", '{"input": 0.984, "output": 0}',
        "--random-output-len", "64",
        "--num-prompts", str(n), "--request-rate", rate, "--ignore-eos", "--seed", "0",
        "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99",
        "--save-result", "--result-dir", str(out), "--result-filename", name,
    ]  # fmt: skip
    with (out / f"{way}-bench-rate-{rate}.log").open("w") as log:
        rc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc or not (out / name).exists():
        return {"rc": rc}
    result = json.loads((out / name).read_text())
    keep = ("completed", "failed", "num_prompts", *BENCH_KEYS)
    return {"rc": rc, **{k: result.get(k) for k in keep}}


def _log_number(log: Path, pattern: str) -> float | None:
    found = re.findall(pattern, log.read_text(errors="replace"))
    return float(found[-1].replace(",", "")) if found else None


def start(way: str, args: argparse.Namespace) -> tuple[Server, list[dict]]:
    """A ready server whose KV cache holds about ``KV_REQUESTS`` requests of
    --max-model-len: how many blocks that takes depends on the way's pages,
    so the first start's own capacity line (or its refusal, which estimates
    the length the blocks hold) sets the next start's block count."""
    blocks, tries = args.num_gpu_blocks, []
    for attempt in range(3):
        server = Server(way, args.model, args.out, args.port, blocks)
        tries.append({"blocks": blocks})
        try:
            tries[-1]["start_s"] = round(server.wait_ready(args.start_timeout), 1)
        except RuntimeError as e:
            server.stop()
            held = _log_number(
                server.log, r"estimated maximum model length is ([\d,]+)"
            )
            tries[-1].update(error=str(e), holds_tokens=held)
            if not held or attempt == 2:
                raise RuntimeError(f"{e}; tries {tries}") from e
            blocks = int(blocks * KV_REQUESTS * MAX_MODEL_LEN / held) + 1
        else:
            requests = _log_number(server.log, CAPACITY)
            tries[-1]["holds_requests"] = requests
            if requests is None or 1.2 <= requests <= 2.2 or attempt == 2:
                return server, tries
            server.stop()
            blocks = int(blocks * KV_REQUESTS / requests) + 1
        server.log.rename(server.log.with_suffix(f".{attempt}.log"))
    raise AssertionError("unreachable")


def serve_way(way: str, args: argparse.Namespace) -> dict:
    """Everything ``run`` does with one way's server."""
    record: dict = {"way": way, "backend": WAYS[way][0], "sm12x_pages": way == "c"}
    try:
        server, record["starts"] = start(way, args)
    except RuntimeError as e:
        return {**record, "error": str(e)}
    record["server_args"] = server.args
    try:
        if way == "a":
            record["reference"] = [
                complete(server, p, check_tokens(p)) for p in CHECK_PROMPTS
            ]
        before = metric(server.metrics(), PREEMPTIONS) or 0.0
        record["check"] = complete_all(server, CHECK_PROMPTS)
        after = metric(server.metrics(), PREEMPTIONS) or 0.0
        record["check_preemptions"] = after - before
        record["clients"] = clients(server)
        record["faults"] = faults(server)
        record["disconnect"] = disconnect(server, kv_usage(server))
        record["bench"] = {"inf": bench(server, args.model, args.out, way, "inf", 200)}
        if time.monotonic() < args.deadline:
            record["bench"]["8"] = bench(server, args.model, args.out, way, "8", 80)
        record["preemptions_total"] = metric(server.metrics(), PREEMPTIONS)
    except Exception as e:  # noqa: BLE001 - recorded; the report fails it
        record["error"] = repr(e)
    finally:
        record["exit_code"] = server.stop()
    return record


# --- verdict: reads recorded files only -------------------------------------


def _gen(r: dict) -> dict:
    return {"token_ids": r.get("token_ids", []), "top2": r.get("top2", [])}


def judge(reference: list[dict], served: list[dict], bound: float) -> list[dict]:
    """Each served answer against the reference: where it parts, and whether
    that is at a near tie (the reference's top-two gap at most ``bound``)."""
    rows = []
    for ref, run in zip(reference, served, strict=True):
        row = {"status": run.get("status")}
        if run.get("status") == 200:
            row.update(compare_prompt(_gen(ref), _gen(run)))
            parted = row["parted_at"]
            row["non_tie"] = parted is not None and row["ref_gap"] > bound
            row["lost"] = len(run["token_ids"]) < len(ref["token_ids"])
        rows.append(row)
    return rows


def verdict(records: dict[str, dict]) -> dict:
    """Every way's counts and failures, judged by (a)'s measured noise."""
    a = records["a"]
    noise_rows = judge(a["reference"], a["check"], float("inf"))
    noise = max((r.get("max_logprob_diff", 0.0) for r in noise_rows), default=0.0)
    bound = 2 * noise
    summary: dict = {"noise": noise, "bound": bound, "ways": {}}
    failures = []
    if noise > LOGPROB_TOLERANCE:
        failures.append(f"(a)'s noise {noise:.3g} exceeds {LOGPROB_TOLERANCE}")
    for way, rec in records.items():
        if "error" in rec:
            failures.append(f"({way}) stopped: {rec['error']}")
        rows = judge(a["reference"], rec.get("check", []), bound)
        probes = [f["probe"] for f in rec.get("faults", [])]
        probe_rows = judge([a["reference"][0]] * len(probes), probes, bound)
        statuses = [r["status"] for r in rows]
        preempted = rec.get("preemptions_total") or 0
        w = {
            "sent": len(rows), "completed": statuses.count(200),
            "failed": {str(s): statuses.count(s) for s in set(statuses) if s != 200},
            "preemptions": preempted, "check_preemptions": rec.get("check_preemptions"),
            "non_tie_partings": sum(r.get("non_tie", False) for r in rows + probe_rows),
            "kv_requests": (rec.get("starts") or [{}])[-1].get("holds_requests"),
            "rows": rows,
        }  # fmt: skip
        summary["ways"][way] = w
        if w["completed"] != w["sent"] or not rows:
            failures.append(f"({way}) completed {w['completed']} of {w['sent']}")
        if w["non_tie_partings"] or any(r.get("lost") for r in rows):
            failures.append(
                f"({way}) {w['non_tie_partings']} answers part at a non-tie"
            )
        if not preempted > 0:
            failures.append(f"({way}) no preemption")
        for f in rec.get("faults", []):
            if f["status"] != f["expected"] or f["probe"].get("status") != 200:
                failures.append(
                    f"({way}) {f['name']}: {f['status']}, "
                    f"probe {f['probe'].get('status')}"
                )
        for name, c in rec.get("clients", {}).items():
            if not c["ok"]:
                failures.append(f"({way}) openai client {name}: {c['text'][:80]}")
        if not rec.get("disconnect", {}).get("returned"):
            failures.append(f"({way}) KV usage did not return after a disconnect")
        w["bench"] = rec.get("bench", {})
        for rate, b in w["bench"].items():
            if b.get("rc") or b.get("failed"):
                failures.append(
                    f"({way}) bench rate {rate}: rc {b.get('rc')}, "
                    f"failed {b.get('failed')}"
                )
    summary["failures"] = failures
    return summary


def _counts(by_status: dict) -> str:
    return ", ".join(f"{n} ({s})" for s, n in sorted(by_status.items())) or "0"


def table(summary: dict) -> str:
    """The markdown table: counts, then bench figures as ratios to (a)."""
    lines = [
        (
            f"Noise N = {summary['noise']:.3g} ((a) under load against (a) one "
            f"prompt at a time); answers judged by 2N = {summary['bound']:.3g}."
        ),
        "",
        (
            "| way | KV cache (requests of --max-model-len) | sent | completed "
            "| failed | preemptions (check / total) | non-tie partings |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    ways = summary["ways"]
    for way, w in ways.items():
        lines.append(
            f"| ({way}) | {w['kv_requests']} | {w['sent']} | {w['completed']} "
            f"| {_counts(w['failed'])} "
            f"| {w['check_preemptions']} / {w['preemptions']} "
            f"| {w['non_tie_partings']} |"
        )
    a_bench = ways.get("a", {}).get("bench", {})
    for rate, ref in a_bench.items():
        lines += ["", (f"`vllm bench serve`, request rate {rate}; ratio to (a) in "
                       "brackets (times: lower is better; throughput: higher)"), "",
                  "| way | " + " | ".join(BENCH_KEYS) + " |",
                  "|---|" + "---:|" * len(BENCH_KEYS)]  # fmt: skip
        for way, w in ways.items():
            b = w["bench"].get(rate, {})
            cells = [
                f"{b[k]:.1f} ({b[k] / ref[k]:.2f})" if b.get(k) and ref.get(k) else "-"
                for k in BENCH_KEYS
            ]
            lines.append(f"| ({way}) | " + " | ".join(cells) + " |")
    lines += ["", "Failures: " + ("; ".join(summary["failures"]) or "none")]
    return "\n".join(lines) + "\n"


def report(out: Path) -> int:
    records = {w: json.loads((out / f"{w}.json").read_text()) for w in WAYS
               if (out / f"{w}.json").exists()}  # fmt: skip
    if "a" not in records:
        print(f"{out}: no a.json (the reference way)", file=sys.stderr)
        return 2
    summary = verdict(records)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    text = table(summary)
    (out / "table.md").write_text(text)
    print(text)
    return 1 if summary["failures"] else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="serve, load and fault each way")
    run.add_argument("--model", required=True)
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--ways", default="a,b,c")
    run.add_argument("--port", type=int, default=8731)
    run.add_argument("--num-gpu-blocks", type=int, default=500,
                     help="first start's; later ones aim at KV_REQUESTS")  # fmt: skip
    run.add_argument("--start-timeout", type=float, default=240)
    run.add_argument("--budget-s", type=float, default=540,
                     help="skip the fixed-rate bench once this is spent")  # fmt: skip
    rep = sub.add_parser("report", help="judge a run's files")
    rep.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.command == "report":
        raise SystemExit(report(args.out))
    ways = args.ways.split(",")
    if unknown := set(ways) - set(WAYS):
        parser.error(f"--ways: unknown {sorted(unknown)}; choose from {sorted(WAYS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    for i, way in enumerate(ways):
        # The fixed-rate bench only while this way's share of the budget lasts.
        args.deadline = started + args.budget_s * (i + 1) / len(ways) - 30
        record = serve_way(way, args)
        (args.out / f"{way}.json").write_text(json.dumps(record) + "\n")
        print(f"({way}) done at {time.monotonic() - started:.0f} s: "
              f"{record.get('error', 'no error')}", flush=True)  # fmt: skip
    raise SystemExit(report(args.out))


if __name__ == "__main__":
    main()
