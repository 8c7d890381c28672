# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The serving run's request building, comparison and verdict on CPU: the
script as the device run uses it (a subprocess), against a stand-in server
(tests/benchmarks/stand_in_vllm) and on recorded files changed by hand."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVE = REPO / "benchmarks" / "dsv41_serve.py"
STAND_IN = Path(__file__).resolve().parent / "stand_in_vllm"
sys.path.insert(0, str(SERVE.parent))
import dsv41_serve  # noqa: E402


def _run(out: Path, port: int, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, SERVE, "run", "--model", "unused", "--out", out,
         "--ways", "a,b", "--port", str(port), "--start-timeout", "60", *args],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(STAND_IN), **env},
    )  # fmt: skip


def _report(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, SERVE, "report", out], capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of ways (a) and (b) against the stand-in server."""
    out = tmp_path_factory.mktemp("serve")
    result = _run(out, 18731, "--num-gpu-blocks", "50")
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_run_counts_and_faults(served: Path) -> None:
    summary = _summary(served)
    assert summary["failures"] == []
    for way in ("a", "b"):
        w = summary["ways"][way]
        assert (w["sent"], w["completed"], w["failed"]) == (26, 26, {})
        assert w["preemptions"] > 0 and w["non_tie_partings"] == 0
    record = json.loads((served / "b.json").read_text())
    statuses = {f["name"]: f["status"] for f in record["faults"]}
    assert statuses["malformed JSON"] == 400
    assert statuses["unknown model"] == 404
    assert statuses["prompt longer than --max-model-len"] == 400
    assert all(f["probe"]["status"] == 200 for f in record["faults"])
    assert set(record["clients"]) == {
        "completion", "completion stream", "chat", "chat stream",
    }  # fmt: skip
    assert record["disconnect"]["kv_usage_while_streaming"] > 0
    assert record["disconnect"]["returned"]
    # The server was started on loopback and stopped by the script.
    args = record["server_args"]
    assert args[args.index("--host") + 1] == "127.0.0.1"
    assert record["exit_code"] is not None


def test_kv_cache_is_capped_from_the_servers_own_capacity(served: Path) -> None:
    # The stand-in takes 90 blocks a request of 2,304 tokens: 50 blocks hold
    # 1,280 tokens, so it refuses; 1.5 requests take 1.5 * 2304 / 1280 * 50.
    starts = json.loads((served / "a.json").read_text())["starts"]
    assert [s["blocks"] for s in starts] == [50, 136]
    assert starts[0]["holds_tokens"] == 1280
    assert starts[1]["holds_requests"] == 1.51
    assert (served / "a.0.log").exists() and (served / "a.log").exists()


def test_served_answer_parting_at_a_non_tie_fails(tmp_path: Path) -> None:
    result = _run(tmp_path, 18732, STAND_IN_NON_TIE="FLASHINFER_MLA_SPARSE_DSV41")
    assert result.returncode == 1
    summary = _summary(tmp_path)
    # The stand-in swaps step 5 of the eight prompts over 1,000 characters.
    assert summary["ways"]["b"]["non_tie_partings"] == 8
    assert summary["ways"]["a"]["non_tie_partings"] == 0
    assert any(f.startswith("(b) 8 answers part") for f in summary["failures"])
    rows = summary["ways"]["b"]["rows"]
    assert [r["parted_at"] for r in rows if r["non_tie"]] == [5] * 8
    # From 500 blocks (5.56 requests) the second start aims at 1.5.
    starts = json.loads((tmp_path / "b.json").read_text())["starts"]
    assert [s["blocks"] for s in starts] == [500, 135]


def _recorded(served: Path, tmp_path: Path) -> Path:
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text((served / name).read_text())
    return tmp_path


def _edit(path: Path, change) -> None:
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


def _part_at(record: dict, step: int, gap: float) -> None:
    """(a)'s reference of prompt 2 given top-two gap ``gap`` at ``step``; (b)'s
    answer there takes the runner-up."""
    ref = record["reference"][2]
    first, second = ref["top2"][step]
    ref["top2"][step] = [first, [second[0], first[1] - gap]]


def test_parting_at_a_near_tie_passes(served: Path, tmp_path: Path) -> None:
    out = _recorded(served, tmp_path)

    def noisy(record: dict) -> None:
        # (a) under load differs from itself by 0.05 before any parting.
        record["check"][0]["top2"][0][0][1] += 0.05
        _part_at(record, 10, 0.08)

    _edit(out / "a.json", noisy)

    def take_runner_up(record: dict) -> None:
        record["check"][2]["token_ids"][10] = record["check"][2]["top2"][10][1][0]

    _edit(out / "b.json", take_runner_up)
    result = _report(out)
    assert result.returncode == 0, result.stdout
    row = _summary(out)["ways"]["b"]["rows"][2]
    assert (row["parted_at"], row["non_tie"]) == (10, False)
    assert "2N = 0.1" in result.stdout
    # The same parting where the reference's gap is 0.2 > 2N is a loss.
    _edit(out / "a.json", lambda r: _part_at(r, 10, 0.2))
    result = _report(out)
    assert result.returncode == 1
    assert "(b) 1 answers part at a non-tie" in result.stdout


def test_wrong_status_dead_server_and_held_pages_fail(
    served: Path, tmp_path: Path
) -> None:
    out = _recorded(served, tmp_path)

    def break_b(record: dict) -> None:
        record["faults"][1]["status"] = 500
        record["faults"][2]["probe"] = {"status": 0, "error": "refused"}
        record["disconnect"]["returned"] = False
        record["preemptions_total"] = 0

    _edit(out / "b.json", break_b)
    result = _report(out)
    assert result.returncode == 1
    failures = _summary(out)["failures"]
    assert "(b) max_tokens 0: 500, probe 200" in failures
    assert "(b) max_tokens -1: 400, probe 0" in failures
    assert "(b) KV usage did not return after a disconnect" in failures
    assert "(b) no preemption" in failures
    assert not any(f.startswith("(a)") for f in failures)


def test_bench_figures_are_ratios_to_the_reference(
    served: Path, tmp_path: Path
) -> None:
    out = _recorded(served, tmp_path)

    def slower(record: dict) -> None:
        record["bench"]["inf"]["p99_ttft_ms"] = 25.0
        record["bench"]["inf"]["output_throughput"] = 400.0

    _edit(out / "b.json", slower)
    text = _report(out).stdout
    row = next(
        line for line in text.splitlines()
        if line.startswith("| (b) | 10.0 (1.00) | 25.0")
    )  # fmt: skip
    # 25 / 10 and 400 / 500, from the stand-in's figures for (a).
    assert "25.0 (2.50)" in row and row.endswith("400.0 (0.80) |")


def test_generation_reads_a_completion_response() -> None:
    # vLLM's /v1/completions answer with logprobs=2 and
    # return_tokens_as_token_ids: the sampled token's entry may repeat.
    response = {
        "choices": [{
            "text": "ab",
            "logprobs": {
                "tokens": ["token_id:70", "token_id:9"],
                "token_logprobs": [-0.5, -1.25],
                "top_logprobs": [
                    {"token_id:12": -1.0, "token_id:70": -0.5},
                    {"token_id:9": -1.25, "token_id:4": -0.75, "token_id:5": -3.0},
                ],
            },
        }],
    }  # fmt: skip
    assert dsv41_serve.generation(response) == {
        "token_ids": [70, 9],
        "top2": [[[70, -0.5], [12, -1.0]], [[4, -0.75], [9, -1.25]]],
    }
    body = dsv41_serve.completion_body("hi", 7)
    assert (body["temperature"], body["logprobs"], body["max_tokens"]) == (0.0, 2, 7)
    assert body["return_tokens_as_token_ids"] and body["ignore_eos"]


def test_metric_sums_samples_of_the_exported_name() -> None:
    text = (
        "# HELP vllm:num_preemptions_total Cumulative number of preemption.\n"
        '# TYPE vllm:num_preemptions_total counter\n'
        'vllm:num_preemptions_total{engine="0",model_name="m"} 3.0\n'
        'vllm:num_preemptions_total{engine="1",model_name="m"} 2.0\n'
        'vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e9\n'
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.25\n'
    )  # fmt: skip
    assert dsv41_serve.metric(text, "vllm:num_preemptions_total") == 5.0
    assert dsv41_serve.metric(text, dsv41_serve.KV_USAGE) == 0.25
    assert dsv41_serve.metric(text, "vllm:absent") is None
