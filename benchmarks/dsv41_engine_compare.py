# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Compare greedy generations of benchmarks/dsv41_engine_generate.py with a
reference run, token by token, and write a markdown table.

    python benchmarks/dsv41_engine_compare.py REF.json RUN.json [RUN.json ...] \
        [--noise SELF.json] [--md table.md]

Per prompt and run: how many generated tokens equal the reference's, the
first position where they part, the reference's top-two log-probability gap
there (a near tie lets two correct kernels part), and the largest difference
of the chosen token's log-probability before that point.

The noise is measured, not assumed. With ``--noise``, it is the reference
backend's difference from itself: SELF.json is the reference run one prompt
at a time (other batch shapes, so other roundings), and the noise N is the
largest difference above between it and REF.json. N must stay within
``LOGPROB_TOLERANCE`` (else the reference is too noisy to judge by). A run
passes when its own largest difference is at most 2N and each prompt either
matches throughout or parts where the reference's gap is at most 2N: each of
the two runs may round by N, in opposite directions. Without ``--noise``, N
is the run's own largest difference, which must stay within
``LOGPROB_TOLERANCE``.
"""

import argparse
import json
from pathlib import Path

# Largest difference of a chosen token's log-probability (nats) between two
# runs of the same model on the same tokens that still counts as rounding.
# The engine returns BF16 logits: one BF16 step of a logit between 8 and 16,
# where the checkpoint's largest logits lie, is 1/16, and the reference
# backend differs from itself by about two such steps; this allows four.
LOGPROB_TOLERANCE = 0.25


def compare_prompt(ref: dict, run: dict) -> dict:
    """Where ``run``'s tokens part from ``ref``'s, and the noise before."""
    matched = 0
    for a, b in zip(ref["token_ids"], run["token_ids"], strict=False):
        if a != b:
            break
        matched += 1
    noise = max(
        (abs(ref["top2"][i][0][1] - run["top2"][i][0][1]) for i in range(matched)),
        default=0.0,
    )
    parted = matched < min(len(ref["token_ids"]), len(run["token_ids"]))
    gap = None
    if parted:
        first, second = ref["top2"][matched][:2]
        gap = first[1] - second[1]
    return {
        "tokens": len(ref["token_ids"]),
        "matched": matched,
        "parted_at": matched if parted else None,
        "ref_gap": gap,
        "max_logprob_diff": noise,
    }


def compare_run(ref: dict, run: dict, ref_noise: float | None = None) -> dict:
    """``run`` against ``ref``, judged by the reference's own noise when it
    was measured (``ref_noise``), else by the run's."""
    rows = [
        compare_prompt(a, b)
        for a, b in zip(ref["prompts"], run["prompts"], strict=True)
    ]
    noise = max(r["max_logprob_diff"] for r in rows)
    if ref_noise is None:
        bound = 2 * noise
        within = noise <= LOGPROB_TOLERANCE
    else:
        bound = 2 * ref_noise
        within = ref_noise <= LOGPROB_TOLERANCE and noise <= bound
    for r in rows:
        r["near_tie"] = r["parted_at"] is not None and r["ref_gap"] <= bound
    passed = within and all(r["parted_at"] is None or r["near_tie"] for r in rows)
    return {"rows": rows, "noise": noise, "bound": bound, "passed": passed}


def _label(run: dict) -> str:
    pages = ", SM12x pages forced" if run.get("force_sm12x_pages") else ""
    solo = ", one prompt at a time" if run.get("solo") else ""
    return f"{run['backend']}{pages}{solo}"


def _bound_text(result: dict, ref_noise: float | None) -> str:
    if ref_noise is None:
        return f"{LOGPROB_TOLERANCE}; near ties below twice it"
    return f"2N = {result['bound']:.3g}"


def _repeat_note(run: dict) -> str:
    repeats = run.get("second_pass_repeats_first")
    if repeats is None:
        return ""
    return "" if repeats else "; its second pass did NOT repeat its first"


def table(
    ref: dict, runs: list[dict], self_run: dict | None = None
) -> tuple[str, bool]:
    """The markdown table, and whether every run passed."""
    versions = ", ".join(f"{k} {v}" for k, v in ref["versions"].items())
    lines = [
        (
            f"Reference: {_label(ref)}, {ref['tokens_per_s']} tokens/s "
            f"({ref['gpu']}; {versions}; {ref['date']}){_repeat_note(ref)}."
        ),
    ]
    ref_noise = None
    if self_run is not None:
        ref_noise = compare_run(ref, self_run)["noise"]
        lines.append(
            f"Reference's own noise N = {ref_noise:.3g} ({_label(self_run)}; "
            f"within {LOGPROB_TOLERANCE}: "
            f"{'yes' if ref_noise <= LOGPROB_TOLERANCE else 'NO'}); "
            f"runs are judged by 2N = {2 * ref_noise:.3g}."
        )
        runs = [self_run, *runs]
    lines += [
        "",
        (
            "| run | prompt | prompt tokens | matched / generated | parted at | "
            "ref top-2 gap there | max logprob diff before | verdict |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    summaries = []
    passed = True
    for run in runs:
        result = compare_run(ref, run, ref_noise)
        passed = passed and result["passed"]
        for i, (r, p) in enumerate(zip(result["rows"], run["prompts"], strict=True)):
            verdict = (
                "match"
                if r["parted_at"] is None
                else ("near tie" if r["near_tie"] else "MISMATCH")
            )
            gap = "-" if r["ref_gap"] is None else f"{r['ref_gap']:.3g}"
            parted = "-" if r["parted_at"] is None else str(r["parted_at"])
            lines.append(
                f"| {_label(run)} | {i} | {len(p['prompt_token_ids'])} | "
                f"{r['matched']} / {r['tokens']} | {parted} | {gap} | "
                f"{r['max_logprob_diff']:.3g} | {verdict} |"
            )
        summaries.append(
            f"- {_label(run)}: {run['tokens_per_s']} tokens/s "
            f"({run['tokens_per_s'] / ref['tokens_per_s']:.2f}x the reference); "
            f"largest logprob difference {result['noise']:.3g} "
            f"(bound {_bound_text(result, ref_noise)}); "
            f"{'PASS' if result['passed'] else 'FAIL'}{_repeat_note(run)}"
        )
    return "\n".join([*lines, "", *summaries]) + "\n", passed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ref", type=Path)
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument(
        "--noise",
        type=Path,
        help="the reference run one prompt at a time: measures its own noise",
    )
    parser.add_argument("--md", type=Path, help="also write the table here")
    args = parser.parse_args()
    ref = json.loads(args.ref.read_text())
    runs = [json.loads(p.read_text()) for p in args.runs]
    self_run = json.loads(args.noise.read_text()) if args.noise else None
    text, passed = table(ref, runs, self_run)
    print(text)
    if args.md:
        args.md.write_text(text)
    if not passed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
