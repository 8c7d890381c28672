# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Judge a ``dsv41_serve.py run`` folder from its raw files alone: the
servers' answers (``<server>.json.gz``), their ``/metrics`` scrapes, the
``vllm bench serve`` result files and the profiler traces. Writes
``summary.json``, ``table.md`` and ``profile.md``; returns 1 when a check
failed or a target was missed.

Teacher forcing: every position of every check completion of (a) is scored by
each server. The threshold is the largest difference between (a)'s two
servers; a way passes when no position differs from (a) by more, and (a)'s
token falls outside its top two no more often than in either run of (a).
"""

import json
import math
import re
import statistics
from pathlib import Path

from dsv41_serve import (
    BENCH_REPEATS,
    BENCH_SECONDS,
    REPEAT,
    WAYS,
    completions,
    metric,
    read_json_gz,
)
from dsv41_serve_profile import breakdown, load, top_kernels
from dsv41_serve_profile import table as profile_table

PREEMPTIONS = "vllm:num_preemptions_total"
KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
BENCH_KEYS = (
    "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
    "median_itl_ms", "p99_itl_ms", "output_throughput", "duration",
)  # fmt: skip
# Targets at equal KV budgets, median of the unbounded-rate runs, as the ratio
# of the way's figure to (a)'s: heads -> figure -> (bound, "min" | "max").
TARGETS = {
    8: {"output_throughput": (1.1, "min"), "median_tpot_ms": (0.9, "max"),
        "median_ttft_ms": (1.1, "max")},
    16: {"output_throughput": (1.0, "min"), "median_tpot_ms": (1.0, "max"),
         "median_ttft_ms": (1.1, "max")},
}  # fmt: skip


def load_records(out: Path) -> dict[str, dict]:
    records = {}
    for name in (*WAYS, REPEAT):
        path = out / f"{name}.json.gz"
        if path.exists():
            records[name] = read_json_gz(path)
            scrapes = out / f"{name}-scrapes.json.gz"
            records[name]["scrapes"] = read_json_gz(scrapes) if scrapes.exists() else {}
    return records


def scores(answers: list[dict], comps: list[list[int]]) -> list[tuple | None]:
    """Per position of every completion: (log-probability, rank) of (a)'s
    token as this server scored it; None where it gave no answer."""
    out: list[tuple | None] = []
    for k, comp in enumerate(comps):
        answer = answers[k] if k < len(answers) else {}
        if answer.get("status") != 200:
            out += [None] * len(comp)
            continue
        entries = answer["response"]["choices"][0]["prompt_logprobs"][-len(comp) :]
        for token, entry in zip(comp, entries, strict=True):
            e = (entry or {}).get(str(token))
            out.append((e["logprob"], e["rank"]) if e else None)
    return out


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)] if ordered else 0.0


def teacher_forcing(records: dict[str, dict]) -> dict:
    comps = completions(records["a"].get("check", []))
    by = {n: scores(r.get("score", []), comps) for n, r in records.items()}
    ref = by["a"]

    def diffs(name: str, against: list = ref) -> list[float]:
        pairs = zip(against, by[name], strict=True)
        return [abs(x[0] - y[0]) for x, y in pairs if x and y]

    threshold = max(diffs(REPEAT), default=0.0) if REPEAT in by else None
    result = {"completions": len(comps), "positions": len(ref),
              "threshold": threshold, "servers": {}}  # fmt: skip
    for name, got in by.items():
        d = diffs(name)
        result["servers"][name] = {
            "positions": len(got), "scored": len(d),
            "max_diff": max(d, default=0.0), "p99_diff": _p99(d),
            "over_threshold": sum(x > threshold for x in d) if threshold else None,
            # Against the second (a) instead: which of the two (a)s is nearer.
            "max_diff_to_a2": (
                max(diffs(name, by[REPEAT]), default=0.0) if REPEAT in by else None
            ),
            "not_top1": sum(1 for y in got if y and y[1] != 1),
            "outside_top2": sum(1 for y in got if y and y[1] > 2),
        }  # fmt: skip
    return result


def _delta(scrapes: dict, label: str, name: str = PREEMPTIONS) -> float | None:
    before, after = scrapes.get(f"{label}-before"), scrapes.get(f"{label}-after")
    if not before or not after:
        return None
    return (metric(after, name) or 0.0) - (metric(before, name) or 0.0)


def preemptions(scrapes: dict) -> dict[str, float | None]:
    labels = sorted({k.rsplit("-", 1)[0] for k in scrapes if k.endswith("-before")})
    return {label: _delta(scrapes, label) for label in labels}


def kv_tokens(record: dict) -> int | None:
    for line in record.get("startup_lines", []):
        if m := KV_TOKENS.search(line):
            return int(m[1].replace(",", ""))
    return None


def bench_runs(out: Path, record: dict) -> dict[str, list[dict]]:
    """Rate -> the counted runs' raw results (the warm-up left out)."""
    runs: dict[str, list[dict]] = {}
    for entry in record.get("bench", []):
        if entry["tag"] == "warmup":
            continue
        result = json.loads((out / entry["file"]).read_text()) if entry["file"] else {}
        runs.setdefault(entry["rate"], []).append({**entry, "result": result})
    return runs


def bench_figures(runs: list[dict]) -> dict[str, dict]:
    """Each figure's min and median over the runs that completed."""
    figures = {}
    for key in BENCH_KEYS:
        values = [r["result"][key] for r in runs if r["result"].get(key) is not None]
        if values:
            figures[key] = {"min": min(values), "median": statistics.median(values),
                            "runs": values}  # fmt: skip
    return figures


def _target_misses(heads: int | None, ways: dict) -> list[str]:
    targets = TARGETS.get(heads or 0)
    a = ways.get("a", {}).get("bench", {}).get("inf", {})
    misses = []
    for way, w in ways.items():
        if way == "a" or targets is None:
            continue
        b = w.get("bench", {}).get("inf", {})
        runs = min(len(a.get("output_throughput", {}).get("runs", [])),
                   len(b.get("output_throughput", {}).get("runs", [])))  # fmt: skip
        if runs < BENCH_REPEATS:
            misses.append(f"({way}) targets not judged: {runs} of {BENCH_REPEATS} runs")
            continue
        for key, (bound, kind) in targets.items():
            ratio = b[key]["median"] / a[key]["median"]
            w.setdefault("ratios", {})[key] = ratio
            if ratio < bound if kind == "min" else ratio > bound:
                misses.append(f"({way}) {key} {ratio:.2f} of (a)'s, target "
                              f"{'>=' if kind == 'min' else '<='} {bound}")  # fmt: skip
    return misses


def verdict(out: Path, records: dict[str, dict]) -> dict:
    failures: list[str] = []
    tf = teacher_forcing(records)
    threshold = tf["threshold"]
    servers = tf["servers"]
    for name in ("a", REPEAT):
        s = servers.get(name)
        if s is None or s["scored"] != tf["positions"] or not tf["positions"]:
            failures.append(f"({name}) scored {s and s['scored']} of "
                            f"{tf['positions']} positions")  # fmt: skip
    baseline = max(servers.get(n, {}).get("outside_top2", 0) for n in ("a", REPEAT))
    ways: dict[str, dict] = {}
    tokens = {n: kv_tokens(r) for n, r in records.items()}
    if len(set(tokens.values())) != 1 or None in tokens.values():
        failures.append(f"KV caches of unequal or unknown tokens: {tokens}")
    for name, rec in records.items():
        for error in rec.get("errors", []):
            failures.append(f"({name}) {error}")
        if name == REPEAT:
            continue
        s = servers[name]
        if name != "a" and threshold is not None:
            if s["scored"] != tf["positions"]:
                failures.append(f"({name}) scored {s['scored']} of {tf['positions']}")
            if s["max_diff"] > threshold:
                failures.append(f"({name}) a position differs from (a) by "
                                f"{s['max_diff']:.3g} > {threshold:.3g}")  # fmt: skip
            if s["outside_top2"] > baseline:
                failures.append(
                    f"({name}) (a)'s token outside the top two at "
                    f"{s['outside_top2']} positions, (a) {baseline}"
                )
        check = rec.get("check", [])
        statuses = [c["status"] for c in check]
        pre = preemptions(rec.get("scrapes", {}))
        runs = bench_runs(out, rec)
        w = ways[name] = {
            "sent": len(statuses), "completed": statuses.count(200),
            "preemptions": pre, "kv_tokens": tokens.get(name),
            "bench": {rate: bench_figures(r) for rate, r in runs.items()},
            "bench_runs": {rate: [(r["tag"], r["rc"], r["result"].get("failed"))
                                  for r in r_] for rate, r_ in runs.items()},
        }  # fmt: skip
        if not statuses or w["completed"] != len(statuses):
            failures.append(f"({name}) completed {w['completed']} of {len(statuses)}")
        if not (pre.get("check") or 0) > 0:
            failures.append(f"({name}) no preemption in the check phase")
        for f in rec.get("faults", []):
            if f["status"] != f["expected"] or f["probe"].get("status") != 200:
                failures.append(f"({name}) {f['name']}: {f['status']}, "
                                f"probe {f['probe'].get('status')}")  # fmt: skip
        for label, c in rec.get("clients", {}).items():
            if not c["ok"]:
                failures.append(f"({name}) openai client {label}: {c['text'][:80]}")
        d = rec.get("disconnect", {})
        if d.get("kv_usage_after") is None or d["kv_usage_after"] != d["kv_usage_idle"]:
            failures.append(f"({name}) KV usage did not return after a disconnect")
        for rate, r_ in runs.items():
            for r in r_:
                if r["rc"] or r["result"].get("failed") or not r["result"]:
                    failures.append(f"({name}) bench {r['tag']}: rc {r['rc']}, "
                                    f"failed {r['result'].get('failed')}")  # fmt: skip
                elif r["result"].get("duration", 0) < BENCH_SECONDS:
                    failures.append(f"({name}) bench {r['tag']} ran "
                                    f"{r['result']['duration']:.0f} s")  # fmt: skip
    config = json.loads((out / "checkpoint.json").read_text())
    text = config["config"].get("text_config", config["config"])
    heads = text.get("num_attention_heads")
    misses = _target_misses(heads, ways)
    return {"heads": heads, "checkpoint_sha256": config["sha256"],
            "teacher_forcing": tf, "ways": ways, "failures": failures,
            "target_misses": misses}  # fmt: skip


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def table(summary: dict) -> str:
    tf = summary["teacher_forcing"]
    head = (
        f"Checkpoint: {summary['heads']} heads. Teacher forcing: "
        f"{tf['completions']} completions of (a), {tf['positions']} positions; "
        f"threshold = (a) against its second server = {_fmt(tf['threshold'])}."
    )
    columns = ("scored", "max diff", "p99 diff", "> threshold", "not top",
               "not top 2", "max diff to (a2)")  # fmt: skip
    lines = [
        head,
        "",
        "| server | " + " | ".join(columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for name, s in tf["servers"].items():
        cells = (s["scored"], _fmt(s["max_diff"]), _fmt(s["p99_diff"]),
                 s["over_threshold"], s["not_top1"], s["outside_top2"],
                 _fmt(s["max_diff_to_a2"]))  # fmt: skip
        lines.append(f"| ({name}) | " + " | ".join(map(str, cells)) + " |")
    lines += [
        "",
        "| way | KV cache tokens | check sent | completed | preemptions by phase |",
        "|---|---:|---:|---:|---|",
    ]
    for way, w in summary["ways"].items():
        pre = ", ".join(f"{k} {v:g}" for k, v in w["preemptions"].items() if v)
        lines.append(f"| ({way}) | {w['kv_tokens']} | {w['sent']} | "
                     f"{w['completed']} | {pre or 'none'} |")  # fmt: skip
    a = summary["ways"].get("a", {}).get("bench", {})
    rates = {r for w in summary["ways"].values() for r in w["bench"]}
    for rate in sorted(rates, key=lambda r: (r != "inf", r)):
        lines += [
            "",
            f"`vllm bench serve` at request rate {rate}: median (min) [ratio to (a)]",
            "",
            "| way | runs | " + " | ".join(BENCH_KEYS) + " |",
            "|---|---:|" + "---:|" * len(BENCH_KEYS),
        ]
        for way, w in summary["ways"].items():
            b = w["bench"].get(rate, {})
            cells = []
            for k in BENCH_KEYS:
                f, ref = b.get(k), a.get(rate, {}).get(k)
                ratio = f" [{f['median'] / ref['median']:.2f}]" if f and ref else ""
                cells.append(f"{f['median']:.1f} ({f['min']:.1f}){ratio}" if f else "-")
            n = len(b.get("duration", {}).get("runs", []))
            lines.append(f"| ({way}) | {n} | " + " | ".join(cells) + " |")
    misses = "; ".join(summary["target_misses"]) or "none"
    lines += ["", "Failures: " + ("; ".join(summary["failures"]) or "none")]
    lines += ["", "Targets missed: " + misses]
    return "\n".join(lines) + "\n"


def profile_report(out: Path, records: dict[str, dict]) -> str | None:
    traces = {n: out / r["profile"]["trace"] for n, r in records.items()
              if (r.get("profile") or {}).get("trace")}  # fmt: skip
    traces = {n: p for n, p in traces.items() if p.exists()}
    if not traces:
        return None
    events = {n: load(p) for n, p in traces.items()}
    text = profile_table({n: breakdown(e) for n, e in events.items()})
    for n, e in events.items():
        text += f"\nTop kernels of ({n}), µs in the whole trace:\n\n"
        text += "".join(
            f"- {us:.0f} {cat}: `{k[:90]}`\n" for k, cat, us in top_kernels(e)
        )
    return text


def report(out: Path) -> int:
    records = load_records(out)
    if "a" not in records:
        print(f"{out}: no a.json.gz (the reference way)")
        return 2
    summary = verdict(out, records)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    text = table(summary)
    (out / "table.md").write_text(text)
    print(text)
    if (profile := profile_report(out, records)) is not None:
        (out / "profile.md").write_text(profile)
        print(profile)
    return 1 if summary["failures"] or summary["target_misses"] else 0
