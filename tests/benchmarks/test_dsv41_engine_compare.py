# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The engine comparison's verdicts, run as the device run uses it (a
subprocess), on generations written by hand."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMPARE = REPO / "benchmarks" / "dsv41_engine_compare.py"


def _run(name: str, prompts: list[tuple[list[int], list[list[float]]]]) -> dict:
    """A generation file: per prompt the tokens and each step's (top-1
    logprob, top-2 logprob); the top-2 token is always 999."""
    return {
        "backend": name,
        "gpu": "test",
        "versions": {"vllm": "x"},
        "date": "today",
        "tokens_per_s": 100.0,
        "prompts": [
            {
                "prompt_token_ids": [1, 2, 3],
                "token_ids": tokens,
                "top2": [
                    [[t, a], [999, b]] for t, (a, b) in zip(tokens, steps, strict=True)
                ],
            }
            for tokens, steps in prompts
        ],
    }


def _compare(
    tmp_path: Path, ref: dict, run: dict, self_run: dict | None = None
) -> subprocess.CompletedProcess:
    (tmp_path / "ref.json").write_text(json.dumps(ref))
    (tmp_path / "run.json").write_text(json.dumps(run))
    noise = []
    if self_run is not None:
        (tmp_path / "self.json").write_text(json.dumps(self_run))
        noise = ["--noise", tmp_path / "self.json"]
    return subprocess.run(
        [sys.executable, COMPARE, tmp_path / "ref.json", tmp_path / "run.json",
         *noise, "--md", tmp_path / "t.md"],
        capture_output=True, text=True,
    )  # fmt: skip


TOKENS = [5, 6, 7, 8]
REF = _run("ref", [(TOKENS, [(-0.1, -3.0), (-0.2, -0.25), (-0.3, -2.0), (-1, -2)])])


def test_identical_tokens_pass(tmp_path: Path) -> None:
    run = _run("run", [(TOKENS, [(-0.12, -3), (-0.21, -0.3), (-0.3, -2), (-1, -2)])])
    result = _compare(tmp_path, REF, run)
    assert result.returncode == 0, result.stdout
    assert "| run | 0 | 3 | 4 / 4 | - | - | 0.02 | match |" in result.stdout
    summary = "largest logprob difference 0.02 (bound 0.25; near ties below twice it)"
    assert f"{summary}; PASS" in (tmp_path / "t.md").read_text()


def test_parting_at_a_near_tie_passes(tmp_path: Path) -> None:
    # Parts at step 1, where the reference's top two are 0.05 apart; the
    # noise before (step 0) is 0.04, so 0.05 < 2 x 0.04.
    run = _run("run", [([5, 9, 7, 8], [(-0.14, -3), (-0.2, -0.3), (-1, -2), (-1, -2)])])
    result = _compare(tmp_path, REF, run)
    assert result.returncode == 0, result.stdout
    assert "| 1 / 4 | 1 | 0.05 | 0.04 | near tie |" in result.stdout


def test_parting_where_the_reference_is_sure_fails(tmp_path: Path) -> None:
    # Parts at step 2, where the reference's gap is 1.7 nats.
    run = _run("run", [([5, 6, 0, 8], [(-0.1, -3), (-0.2, -0.25), (-1, -2), (-1, -2)])])
    result = _compare(tmp_path, REF, run)
    assert result.returncode == 1
    assert "| 2 / 4 | 2 | 1.7 | 0 | MISMATCH |" in result.stdout
    assert "FAIL" in result.stdout


def test_logprobs_beyond_the_tolerance_fail(tmp_path: Path) -> None:
    run = _run("run", [(TOKENS, [(-0.1, -3), (-0.5, -0.6), (-0.3, -2), (-1, -2)])])
    result = _compare(tmp_path, REF, run)
    assert result.returncode == 1
    assert "largest logprob difference 0.3 (bound 0.25; near" in result.stdout
    assert "FAIL" in result.stdout


# The reference again, one prompt at a time: 0.09 from it at step 0.
SELF = _run("self", [(TOKENS, [(-0.19, -3.0), (-0.2, -0.25), (-0.3, -2.0), (-1, -2)])])


def test_runs_are_judged_by_the_reference_own_noise(tmp_path: Path) -> None:
    """N = 0.09, so a run may differ by up to 0.18 and part where the
    reference's gap is up to 0.18; 0.15 passes, 0.2 does not."""
    within = _run("run", [(TOKENS, [(-0.25, -3), (-0.2, -0.3), (-0.3, -2), (-1, -2)])])
    result = _compare(tmp_path, REF, within, SELF)
    assert result.returncode == 0, result.stdout
    assert "Reference's own noise N = 0.09" in result.stdout
    assert "| 4 / 4 | - | - | 0.15 | match |" in result.stdout
    assert "largest logprob difference 0.15 (bound 2N = 0.18); PASS" in result.stdout

    beyond = _run("run", [(TOKENS, [(-0.3, -3), (-0.2, -0.3), (-0.3, -2), (-1, -2)])])
    result = _compare(tmp_path, REF, beyond, SELF)
    assert result.returncode == 1
    assert "largest logprob difference 0.2 (bound 2N = 0.18); FAIL" in result.stdout


def test_a_parting_beyond_twice_the_reference_noise_fails(tmp_path: Path) -> None:
    # Parts at step 2, where the reference's gap (1.7) is far above 2N.
    run = _run("run", [([5, 6, 0, 8], [(-0.1, -3), (-0.2, -0.25), (-1, -2), (-1, -2)])])
    result = _compare(tmp_path, REF, run, SELF)
    assert result.returncode == 1
    assert "| 2 / 4 | 2 | 1.7 | 0 | MISMATCH |" in result.stdout


def test_a_reference_too_noisy_to_judge_by_fails(tmp_path: Path) -> None:
    noisy = _run("self", [(TOKENS, [(-0.4, -3), (-0.2, -0.25), (-0.3, -2), (-1, -2)])])
    result = _compare(tmp_path, REF, REF, noisy)
    assert result.returncode == 1
    assert "N = 0.3 (" in result.stdout and "within 0.25: NO" in result.stdout
