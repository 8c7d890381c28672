# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Where a served step's time goes, from a torch-profiler trace of vLLM's
worker (``--profiler-config``, ``/start_profile`` .. ``/stop_profile``).

The worker wraps each engine step in an annotation naming its context
(prefill) and generation (decode) requests. A step's kernels are those
launched (by CUDA runtime call, graph replays included) between its start and
the next step's; each kernel goes to the first category whose pattern its name
matches. A step's period is the time from its start to the next one's; what
the kernels do not cover of it is host time the GPU waited for.

    python benchmarks/dsv41_serve_profile.py TRACE.json.gz
"""

import bisect
import gzip
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

STEP = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
# Kernel name -> category, first match wins (case-insensitive).
CATEGORIES = (
    # FlashMLA's scheduling metadata is part of its attention call.
    ("sparse attention", r"sparse_mla|flash_fwd|mla_combine|sparse_attn|mla_metadata"),
    ("MoE", r"moe|expert|gating"),
    ("indexer", r"mqa_logits|indexer|topk|top_k"),
    ("GEMM", r"gemm|nvjet|xmma|cutlass|cublas|matmul"),
    ("mHC", r"mhc_"),
    ("KV cache and compressor", r"cache|compress|quant|rope"),
)
KINDS = ("decode", "prefill", "mixed")
KEPT = ("user_annotation", "cpu_op", "cuda_runtime", "cuda_driver", "kernel",
        "gpu_memcpy", "gpu_memset")  # fmt: skip


def category(kernel: str) -> str:
    for name, pattern in CATEGORIES:
        if re.search(pattern, kernel, re.IGNORECASE):
            return name
    return "other"


def step_kind(annotation: str) -> str | None:
    m = STEP.fullmatch(annotation)
    if m is None:
        return None
    context, generation = int(m[1]), int(m[3])
    return "decode" if not context else "prefill" if not generation else "mixed"


def load(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def slim(events: list[dict]) -> list[dict]:
    """The events ``breakdown`` reads, with no argument but the correlation
    id (a trace is a few times smaller so)."""
    out = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in KEPT:
            continue
        d = {k: e[k] for k in ("ph", "cat", "name", "tid", "ts", "dur") if k in e}
        if "correlation" in e.get("args", {}):
            d["args"] = {"correlation": e["args"]["correlation"]}
        out.append(d)
    return out


def _torch_op_time(ops: list[dict], step: dict) -> float:
    """Time in the outermost torch operators the step's thread ran inside it."""
    total, end = 0.0, -1.0
    i = bisect.bisect_left(ops, step["ts"], key=lambda o: o["ts"])
    while i < len(ops) and ops[i]["ts"] < step["ts"] + step["dur"]:
        o = ops[i]
        if o["tid"] == step["tid"] and o["ts"] >= end:
            total, end = total + o["dur"], o["ts"] + o["dur"]
        i += 1
    return total


def breakdown(events: list[dict]) -> dict[str, dict]:
    """Per step kind, means a step in µs: the period, the worker's own step
    (its annotation) and the torch operators inside it, kernel time per
    category and in all, and the period the kernels leave uncovered."""
    steps = sorted(
        (e for e in events
         if e.get("ph") == "X" and e.get("cat") == "user_annotation"
         and step_kind(e.get("name", ""))),
        key=lambda e: e["ts"],
    )  # fmt: skip
    ops = sorted(
        (e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"),
        key=lambda e: e["ts"],
    )
    launches = sorted(
        (e["ts"], e["args"]["correlation"])
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver")
        and "correlation" in e.get("args", {})
    )
    kernels: dict[int, list[tuple[str, float]]] = defaultdict(list)
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            name = category(e["name"]) if e["cat"] == "kernel" else "copies"
            kernels[e["args"]["correlation"]].append((name, e["dur"]))
    totals: dict[str, dict] = {}
    j = 0
    for step, following in zip(steps, steps[1:], strict=False):
        start, end = step["ts"], following["ts"]
        while j < len(launches) and launches[j][0] < start:
            j += 1
        t = totals.setdefault(step_kind(step["name"]), defaultdict(float))
        t["steps"] += 1
        t["period"] += end - start
        t["step"] += step["dur"]
        t["torch_ops"] += _torch_op_time(ops, step)
        while j < len(launches) and launches[j][0] < end:
            for name, dur in kernels.get(launches[j][1], ()):
                t[f"kernel:{name}"] += dur
            j += 1
    result = {}
    for kind in KINDS:
        if kind not in totals:
            continue
        t = totals[kind]
        n = t["steps"]
        per = {k[7:]: v / n for k, v in sorted(t.items()) if k.startswith("kernel:")}
        busy = sum(per.values())
        result[kind] = {
            "steps": int(n), "period_us": t["period"] / n, "step_us": t["step"] / n,
            "torch_ops_us": t["torch_ops"] / n, "kernels_us": per,
            "kernel_total_us": busy, "uncovered_us": t["period"] / n - busy,
        }  # fmt: skip
    return result


def table(by_way: dict[str, dict]) -> str:
    """Markdown: one row a way and step kind, mean µs a step."""
    names = sorted(
        {k for b in by_way.values() for r in b.values() for k in r["kernels_us"]}
    )
    lines = [
        "| way | steps | period | worker step | its torch ops | " + " | ".join(names)
        + " | all kernels | period not covered by kernels |",
        "|---|---|---:|---:|---:|" + "---:|" * (len(names) + 2),
    ]  # fmt: skip
    for way, b in by_way.items():
        for kind, r in b.items():
            cells = [f"{r['kernels_us'].get(k, 0.0):.1f}" for k in names]
            lines.append(
                f"| ({way}) | {r['steps']} {kind} | {r['period_us']:.1f} | "
                f"{r['step_us']:.1f} | {r['torch_ops_us']:.1f} | "
                + " | ".join(cells)
                + f" | {r['kernel_total_us']:.1f} | {r['uncovered_us']:.1f} |"
            )
    return "\n".join(lines) + "\n"


def top_kernels(events: list[dict], n: int = 15) -> list[tuple[str, str, float]]:
    """The ``n`` kernels of most total time: (name, category, µs)."""
    total: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "kernel":
            total[e["name"]] += e["dur"]
    ranked = sorted(total.items(), key=lambda kv: -kv[1])[:n]
    return [(k, category(k), v) for k, v in ranked]


if __name__ == "__main__":
    trace = load(Path(sys.argv[1]))
    print(table({"trace": breakdown(trace)}))
    for name, cat, us in top_kernels(trace):
        print(f"{us:12.1f} us  {cat:24s} {name[:100]}")
