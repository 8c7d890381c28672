# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The serving run and its report on CPU: the script as the device run uses
it (a subprocess), against a stand-in server (tests/benchmarks/stand_in_vllm),
and the report on recorded files changed by hand."""

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# The run and the report use no vLLM: one base covers them.
pytestmark = pytest.mark.default_base_only

REPO = Path(__file__).resolve().parents[2]
SERVE = REPO / "benchmarks" / "dsv41_serve.py"
STAND_IN = Path(__file__).resolve().parent / "stand_in_vllm"
sys.path.insert(0, str(SERVE.parent))
import dsv41_serve  # noqa: E402

PORT = 18731
# The stand-in's second (a) server (third port: a, b, a2) scores 0.003 higher.
NOISE = 0.003
# 14 check prompts of 96 new tokens and 12 growing by 480.
POSITIONS = 14 * 96 + 12 * 480


def _run(out: Path, port: int) -> subprocess.CompletedProcess:
    model = out.parent / f"{out.name}-model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(
        json.dumps({"text_config": {"num_attention_heads": 32}})
    )
    return subprocess.run(
        [sys.executable, SERVE, "run", "--model", model, "--out", out,
         "--ways", "a,b", "--port", str(port), "--start-timeout", "60"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(STAND_IN),
             "STAND_IN_NOISE": f"{port + 2}:{NOISE}"},
    )  # fmt: skip


def _report(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, SERVE, "report", out], capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of ways (a) and (b) against the stand-in server, with a head
    count the targets do not cover."""
    out = tmp_path_factory.mktemp("serve") / "run"
    result = _run(out, PORT)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _read(path: Path):
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _write(path: Path, value) -> None:
    with gzip.open(path, "wt") as f:
        json.dump(value, f)


def _edit(path: Path, change) -> None:
    value = _read(path)
    change(value)
    _write(path, value)


@pytest.fixture
def recorded(served: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(served, out)
    return out


def test_every_position_is_scored_and_judged_by_the_second_reference(
    served: Path,
) -> None:
    summary = _summary(served)
    assert summary["failures"] == [] and summary["target_misses"] == []
    tf = summary["teacher_forcing"]
    assert (tf["completions"], tf["positions"]) == (26, POSITIONS)
    assert tf["threshold"] == pytest.approx(NOISE)
    servers = tf["servers"]
    assert servers["b"]["max_diff"] == 0 and servers["b"]["scored"] == POSITIONS
    assert servers["a2"]["max_diff"] == pytest.approx(NOISE)
    # The stand-in's greedy answers are its own top token everywhere.
    assert all(s["not_top1"] == 0 for s in servers.values())
    # The second (a) scores one request at a time, the others all at once:
    # only those make the stand-in count preemptions.
    preempted = {w: summary["ways"][w]["preemptions"] for w in ("a", "b")}
    assert all(p["check"] > 0 and p["score"] > 0 for p in preempted.values())
    a2_scrapes = _read(served / "a2-scrapes.json.gz")
    before, after = a2_scrapes["score-before"], a2_scrapes["score-after"]
    assert dsv41_serve.metric(before, "vllm:num_preemptions_total") == 0
    assert dsv41_serve.metric(after, "vllm:num_preemptions_total") == 0


def test_records_hold_raw_answers_and_the_prompt_positions_are_emptied(
    served: Path,
) -> None:
    a = _read(served / "a.json.gz")
    first = a["check"][0]["response"]["choices"][0]
    prompt = dsv41_serve.CHECK_PROMPTS[0]
    assert len(first["prompt_token_ids"]) == len(prompt.encode())
    assert len(first["token_ids"]) == 96
    scored = a["score"][0]["response"]["choices"][0]["prompt_logprobs"]
    assert len(scored) == len(prompt.encode()) + 96
    assert all(e is None for e in scored[: len(prompt.encode())])
    assert all(e is not None for e in scored[len(prompt.encode()) :])
    assert a["server_args"][a["server_args"].index("--host") + 1] == "127.0.0.1"
    assert any("GPU KV cache size" in line for line in a["startup_lines"])
    statuses = {f["name"]: f["status"] for f in a["faults"]}
    assert statuses["malformed JSON"] == 400 and statuses["unknown model"] == 404
    assert statuses["token id past the vocabulary"] == 400
    assert all(f["probe"]["status"] == 200 for f in a["faults"])
    assert a["disconnect"]["kv_usage_while_streaming"] > 0
    # Three unbounded runs a way, then three at 0.9 of (a)'s 8 requests/s.
    tags = [(e["rate"], e["tag"]) for e in a["bench"]]
    assert tags == [("inf", f"inf-{i}") for i in (1, 2, 3)] + [
        ("7.2", f"7.2-{i}") for i in (1, 2, 3)
    ]
    assert "a2" not in {e for e in _summary(served)["ways"]}


def _move(record: dict, prompt: int, step: int, by: float) -> None:
    """(b)'s log-probability of (a)'s token at ``step`` of completion
    ``prompt`` moved by ``by``."""
    choice = record["score"][prompt]["response"]["choices"][0]
    comp = 96
    entry = choice["prompt_logprobs"][-comp + step]
    token = max(entry, key=lambda t: entry[t]["logprob"])
    entry[token]["logprob"] += by


def test_one_position_moved_past_the_threshold_fails(recorded: Path) -> None:
    _edit(recorded / "b.json.gz", lambda r: _move(r, 4, 30, NOISE / 2))
    assert _report(recorded).returncode == 0
    _edit(recorded / "b.json.gz", lambda r: _move(r, 4, 30, NOISE))
    result = _report(recorded)
    assert result.returncode == 1
    b = _summary(recorded)["teacher_forcing"]["servers"]["b"]
    assert b["max_diff"] == pytest.approx(1.5 * NOISE)
    assert b["over_threshold"] == 1
    assert "(b) a position differs from (a) by 0.0045 > 0.003" in result.stdout


def test_token_outside_the_top_two_more_often_than_a_fails(recorded: Path) -> None:
    def demote(record: dict) -> None:
        choice = record["score"][1]["response"]["choices"][0]
        for entry in choice["prompt_logprobs"][-3:]:
            for e in entry.values():
                e["rank"] = 3

    _edit(recorded / "b.json.gz", demote)
    result = _report(recorded)
    assert result.returncode == 1
    assert "(b) (a)'s token outside the top two at 3 positions, (a) 0" in result.stdout


def test_unscored_answer_and_unequal_cache_and_no_check_preemption_fail(
    recorded: Path,
) -> None:
    def break_b(record: dict) -> None:
        record["score"][2] = {"status": 500, "error": "engine dead"}
        record["startup_lines"] = ["GPU KV cache size: 9,999 tokens"]

    _edit(recorded / "b.json.gz", break_b)

    def no_preemption(scrapes: dict) -> None:
        scrapes["check-after"] = scrapes["check-before"]

    _edit(recorded / "a-scrapes.json.gz", no_preemption)
    result = _report(recorded)
    assert result.returncode == 1
    failures = _summary(recorded)["failures"]
    lost = 96  # check prompt 2 asks for 96 new tokens
    assert f"(b) scored {POSITIONS - lost} of {POSITIONS}" in failures
    assert any(f.startswith("KV caches of unequal or unknown tokens") for f in failures)
    assert "(a) no preemption in the check phase" in failures
    assert "(b) no preemption in the check phase" not in failures


def test_faults_dead_probe_and_held_pages_fail(recorded: Path) -> None:
    def break_b(record: dict) -> None:
        record["faults"][1]["status"] = 500
        record["faults"][2]["probe"] = {"status": 0, "error": "refused"}
        record["disconnect"]["kv_usage_after"] = 0.5

    _edit(recorded / "b.json.gz", break_b)
    result = _report(recorded)
    assert result.returncode == 1
    failures = _summary(recorded)["failures"]
    assert "(b) max_tokens 0: 500, probe 200" in failures
    assert "(b) max_tokens -1: 400, probe 0" in failures
    assert "(b) KV usage did not return after a disconnect" in failures
    assert not any(f.startswith("(a)") for f in failures)


def _set_bench(out: Path, server: str, rate: str, key: str, values: list) -> None:
    for rep, value in enumerate(values, 1):
        path = out / f"{server}-bench-{rate}-{rep}.json"
        result = json.loads(path.read_text())
        result[key] = value
        path.write_text(json.dumps(result))


def test_bench_medians_ratios_and_targets(recorded: Path) -> None:
    checkpoint = json.loads((recorded / "checkpoint.json").read_text())
    checkpoint["config"]["text_config"]["num_attention_heads"] = 8
    (recorded / "checkpoint.json").write_text(json.dumps(checkpoint))
    # (a) gives 500 tokens/s, 10 ms everywhere (the stand-in's figures).
    _set_bench(recorded, "b", "inf", "output_throughput", [600.0, 540.0, 560.0])
    _set_bench(recorded, "b", "inf", "median_tpot_ms", [8.0, 9.5, 8.5])
    _set_bench(recorded, "b", "inf", "median_ttft_ms", [12.0, 12.0, 12.0])
    result = _report(recorded)
    assert result.returncode == 1
    row = next(
        line for line in result.stdout.splitlines()
        if line.startswith("| (b) | 3 | 12.0")
    )  # fmt: skip
    assert "| 560.0 (540.0) [1.12] |" in row
    assert "| 8.5 (8.0) [0.85] |" in row
    misses = _summary(recorded)["target_misses"]
    assert misses == ["(b) median_ttft_ms 1.20 of (a)'s, target <= 1.1"]
    assert _summary(recorded)["failures"] == []


def test_short_or_failed_bench_runs_fail(recorded: Path) -> None:
    _set_bench(recorded, "b", "inf", "duration", [61.0, 45.0, 61.0])
    _set_bench(recorded, "a", "7.2", "failed", [0, 0, 3])
    result = _report(recorded)
    assert result.returncode == 1
    failures = _summary(recorded)["failures"]
    assert "(b) bench inf-2 ran 45 s" in failures
    assert "(a) bench 7.2-3: rc 0, failed 3" in failures


def test_targets_need_three_runs_a_way(recorded: Path) -> None:
    checkpoint = json.loads((recorded / "checkpoint.json").read_text())
    checkpoint["config"]["text_config"]["num_attention_heads"] = 8
    (recorded / "checkpoint.json").write_text(json.dumps(checkpoint))
    # The stand-in's equal figures miss the 8-head targets.
    assert _report(recorded).returncode == 1
    assert _summary(recorded)["target_misses"] == [
        "(b) output_throughput 1.00 of (a)'s, target >= 1.1",
        "(b) median_tpot_ms 1.00 of (a)'s, target <= 0.9",
    ]
    record = _read(recorded / "b.json.gz")
    for entry in record["bench"]:
        if entry["tag"] in ("inf-2", "inf-3"):
            (recorded / entry["file"]).unlink()
            entry["file"] = None
    _write(recorded / "b.json.gz", record)
    assert _report(recorded).returncode == 1
    assert _summary(recorded)["target_misses"] == [
        "(b) targets not judged: 1 of 3 runs"
    ]


def test_trim_empties_the_prompt_positions_of_a_full_run(tmp_path: Path) -> None:
    entry = {"8": {"logprob": -0.5, "rank": 1}}
    check = {"status": 200, "response": {"choices": [
        {"prompt_token_ids": [5, 6, 7], "token_ids": [8, 9]}]}}  # fmt: skip
    score = {"status": 200, "response": {"choices": [
        {"prompt_logprobs": [None, entry, entry, entry, entry]}]}}  # fmt: skip
    _write(tmp_path / "a.json.gz", {"check": [check], "score": [score]})
    (tmp_path / "a-scrapes.json").write_text(json.dumps({"check-before": "x 1"}))
    subprocess.run([sys.executable, SERVE, "trim", tmp_path], check=True)
    record = _read(tmp_path / "a.json.gz")
    kept = record["score"][0]["response"]["choices"][0]["prompt_logprobs"]
    assert kept == [None, None, None, entry, entry]
    assert _read(tmp_path / "a-scrapes.json.gz") == {"check-before": "x 1"}
    assert not (tmp_path / "a-scrapes.json").exists()


def test_scored_tokens_read_a_completion_response() -> None:
    # vLLM's /v1/completions answer with return_token_ids.
    answer = {"status": 200, "response": {"choices": [
        {"text": "ab", "prompt_token_ids": [4, 5], "token_ids": [70, 9]}]}}  # fmt: skip
    assert dsv41_serve.scored_tokens(answer) == [4, 5, 70, 9]
    assert dsv41_serve.completions([answer, {"status": 500}]) == [[70, 9]]
    body = dsv41_serve.scoring_body([4, 5, 70, 9])
    assert (body["prompt"], body["prompt_logprobs"], body["max_tokens"]) == (
        [4, 5, 70, 9], 2, 1,
    )  # fmt: skip


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


@pytest.mark.parametrize("folder", ["heads8", "heads16", "heads8-first"])
def test_committed_results_are_what_report_makes_of_their_raw_files(
    folder: str, tmp_path: Path
) -> None:
    committed = REPO / "benchmarks/results/dsv41_serve_h200/v0.34.0" / folder
    out = tmp_path / folder
    shutil.copytree(committed, out)
    for made in ("summary.json", "table.md", "profile.md"):
        (out / made).unlink(missing_ok=True)
    # The runs missed the rules: the report says so.
    assert _report(out).returncode == 1
    for made in ("summary.json", "table.md", "profile.md"):
        if (committed / made).exists():
            assert (out / made).read_text() == (committed / made).read_text(), made
