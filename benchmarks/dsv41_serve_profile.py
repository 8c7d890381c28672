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

import gzip
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

STEP = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
# Kernel name -> category, first match wins (case-insensitive).
CATEGORIES = (
    ("sparse attention", r"sparse_mla|flash_fwd|flashmla|mla_combine|sparse_attn"),
    ("indexer", r"mqa_logits|indexer|topk|top_k"),
    ("GEMM", r"gemm|nvjet|xmma|cutlass|cublas|matmul|splitk"),
    ("MoE", r"moe|expert"),
    ("KV cache and compressor", r"cache|compress|quant|rope"),
)
KINDS = ("decode", "prefill", "mixed")


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


def breakdown(events: list[dict]) -> dict[str, dict]:
    """Per step kind: steps, mean period (µs), mean kernel time (µs) per
    category and in all, and the period the kernels leave uncovered."""
    steps = sorted(
        (e["ts"], kind)
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") == "user_annotation"
        and (kind := step_kind(e.get("name", "")))
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
    for (start, kind), (end, _) in zip(steps, steps[1:], strict=False):
        while j < len(launches) and launches[j][0] < start:
            j += 1
        t = totals.setdefault(kind, {"steps": 0, "period": 0.0, "kernels": {}})
        t["steps"] += 1
        t["period"] += end - start
        while j < len(launches) and launches[j][0] < end:
            for name, dur in kernels.get(launches[j][1], ()):
                t["kernels"][name] = t["kernels"].get(name, 0.0) + dur
            j += 1
    result = {}
    for kind in KINDS:
        if kind not in totals:
            continue
        t = totals[kind]
        n = t["steps"]
        per = {k: v / n for k, v in sorted(t["kernels"].items())}
        busy = sum(per.values())
        result[kind] = {
            "steps": n, "period_us": t["period"] / n, "kernels_us": per,
            "kernel_total_us": busy, "uncovered_us": t["period"] / n - busy,
        }  # fmt: skip
    return result


def table(by_way: dict[str, dict]) -> str:
    """Markdown: one row a way and step kind, mean µs a step."""
    names = sorted(
        {k for b in by_way.values() for r in b.values() for k in r["kernels_us"]}
    )
    lines = [
        "| way | steps | mean period | " + " | ".join(names)
        + " | all kernels | not covered by kernels |",
        "|---|---|---:|" + "---:|" * (len(names) + 2),
    ]  # fmt: skip
    for way, b in by_way.items():
        for kind, r in b.items():
            cells = [f"{r['kernels_us'].get(k, 0.0):.1f}" for k in names]
            lines.append(
                f"| ({way}) | {r['steps']} {kind} | {r['period_us']:.1f} | "
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
