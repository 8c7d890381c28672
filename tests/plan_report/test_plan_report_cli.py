# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The plan report as a user runs it: a subprocess, bad and edge inputs, its
exit status (0 served, 1 refused, 2 usage) and the first line of its answer.

One case of each kind of answer runs as a subprocess (a fresh interpreter
that imports vLLM: seconds apiece), the served one with --json; the other
cases run through the same ``main`` in this process."""

import contextlib
import io
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

COMMAND = [sys.executable, "-m", "vllm_dsv41_plan"]

# A small DeepSeek V4.1 text model, as its config.json spells it.
DSV41 = {
    "architectures": ["DeepseekV41ForCausalLM"],
    "model_type": "deepseek_v41",
    "num_attention_heads": 64,
    "head_dim": 512,
    "sliding_window": 128,
    "compress_ratios": [0, 1, 2, 0],
    "kv_source_layer_ids": [1, 2],
    "index_source_layer_ids": [1, 2],
    "index_head_dim": 128,
}


def _with(**changes) -> dict:
    config = dict(DSV41)
    for key, value in changes.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    return config


# The layout upstream's DeepseekV41Config documents: the text model nested.
NESTED = {
    "architectures": ["DeepseekV41ForCausalLM"],
    "model_type": "deepseek_v41",
    "text_config": {k: v for k, v in DSV41.items() if k != "architectures"},
    "vision_config": {"num_hidden_layers": 2},
}


@dataclass
class Case:
    args: list[str]
    status: int
    needle: str  # in the answer's first line (stdout; stderr's last for usage)
    config: object = None  # JSON-able config, or raw text when a str
    extra: dict = field(default_factory=dict)


CASES = {
    # usage errors: exit 2, argparse's message, nothing on stdout
    "capability-word": Case(["--capability", "blackwell"], 2, "compute capability"),
    "tp-zero": Case(["--capability", "12.0", "--tp", "0"], 2, "0 is not a positive"),
    "config-missing": Case(["--capability", "12.0"], 2, "No such file", config=None),
    "config-malformed": Case(["--capability", "12.0"], 2, "is not JSON", config="{"),
    "config-llama": Case(
        ["--capability", "12.0"],
        2,
        "is not a DeepSeek V4.1 config (model_type 'llama'",
        config={"model_type": "llama", "num_attention_heads": 32},
    ),
    "backend-unknown": Case(
        ["--capability", "12.0", "--attention-backend", "FLASHINFER_DSV41"],
        2,
        "'FLASHINFER_DSV41' is not a vLLM attention backend",
    ),
    # refused: exit 1, start-up's own message
    "backend-not-dsv41": Case(
        ["--capability", "12.0", "--attention-backend", "FLASHINFER_MLA_SPARSE"],
        1,
        "is not a DeepSeek V4.1 attention backend",
    ),
    "sm80": Case(["--capability", "8.0"], 1, "has no DeepSeek V4.1 kernel for SM80"),
    "sm90-flashinfer": Case(
        ["--capability", "9.0"], 1, "has no DeepSeek V4.1 kernel for SM90"
    ),
    "sm89-triton": Case(
        ["--capability", "8.9", "--attention-backend", "TRITON_MLA_SPARSE_DSV41"],
        1,
        "TRITON_MLA_SPARSE_DSV41 has no DeepSeek V4.1 kernel for SM89",
    ),
    "tp-3-of-128": Case(
        ["--capability", "120", "--tp", "3"],
        1,
        "128 attention heads cannot be split evenly over --tensor-parallel-size 3",
    ),
    "block-32": Case(
        ["--capability", "12.0", "--block-size", "32"], 1, "--block-size 32"
    ),
    # served: exit 0
    "sm_120": Case(["--capability", "sm_120"], 0, "plan for SM120"),
    "sm90": Case(
        ["--capability", "90", "--attention-backend", "TRITON_MLA_SPARSE_DSV41"],
        0,
        "plan for SM90",
    ),
    "nested-text-config": Case(
        ["--capability", "12.0"], 0, "plan for SM120", config=NESTED
    ),
}


def _config_args(name: str, config, tmp: Path) -> list[str]:
    """--config naming ``config`` (JSON-able, or raw text) written to a file;
    none for None."""
    if config is None:
        return []
    path = tmp / f"{name}.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return ["--config", str(path)]


# The cases plan the FlashInfer layers; the default classes are tested apart.
FLASHINFER = ["--attention-backend", "FLASHINFER_MLA_SPARSE_DSV41"]


def _args(name: str, case: Case, tmp: Path, *extra: str) -> list[str]:
    args = ["plan", *FLASHINFER, *case.args, *extra]
    if name == "config-missing":
        return [*args, "--config", str(tmp / "absent.json")]
    return [*args, *_config_args(name, case.config, tmp)]


def _run(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    # Outside the checkout: the command imports as installed.
    return subprocess.run(
        [*COMMAND, *args], capture_output=True, text=True, timeout=300, cwd=tmp
    )


def _run_main(args: list[str]) -> SimpleNamespace:
    """The command's main() in this process, as a subprocess would end."""
    from vllm_dsv41_plan import report

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = report.main(args)
        except SystemExit as e:
            status = e.code
    return SimpleNamespace(
        returncode=status, stdout=out.getvalue(), stderr=err.getvalue()
    )


# The command's parsing does not depend on the vLLM release; a run that
# tests several releases can ask for a few cases on all but one.
FEW = ("tp-3-of-128", "nested-text-config")
# --json for one case of each kind of answer: refused, served, a usage error.
JSON_CASES = ("block-32", "nested-text-config", "config-malformed")
if os.environ.get("DSV41_PLAN_REPORT_CASES") == "few":
    CASES = {n: c for n, c in CASES.items() if n in FEW}


# A fresh interpreter (seconds apiece) for one case of each exit status, the
# served one with --json (vLLM's log lines must stay off stdout in a process
# of its own); main() in this process answers the other cases.
SUBPROCESS_CASES = {
    ("capability-word", False),
    ("block-32", False),
    ("nested-text-config", True),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every case as text, one of each kind of answer also with --json; the
    subprocesses side by side."""
    tmp = tmp_path_factory.mktemp("configs")
    jobs = {(n, False): _args(n, c, tmp) for n, c in CASES.items()}
    jobs |= {
        (n, True): _args(n, c, tmp, "--json")
        for n, c in CASES.items()
        if n in JSON_CASES
    }
    fresh = [k for k in jobs if k in SUBPROCESS_CASES]
    done = {k: _run_main(args) for k, args in jobs.items() if k not in fresh}
    with ThreadPoolExecutor(max_workers=len(fresh) or 1) as pool:
        ran = pool.map(lambda k: _run(jobs[k], tmp), fresh)
        done |= dict(zip(fresh, ran, strict=True))
    return done


@pytest.mark.parametrize("name", list(CASES))
def test_exit_status_and_first_line(results, name):
    case = CASES[name]
    result = results[(name, False)]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.returncode == case.status, result.stdout + result.stderr[-2000:]
    if case.status == 2:
        assert result.stdout == ""
        last = result.stderr.strip().splitlines()[-1]
        assert "error:" in last and case.needle in last, last
        return
    lines = result.stdout.splitlines()
    first = lines[1] if case.status == 1 else lines[0]
    if case.status == 1:
        assert first.startswith("start-up error: ")
    assert case.needle in first, result.stdout


@pytest.mark.parametrize("name", [n for n in CASES if n in JSON_CASES])
def test_json_is_all_of_stdout_with_the_text_fields(results, name):
    case = CASES[name]
    result = results[(name, True)]
    assert "Traceback" not in result.stderr
    assert result.returncode == case.status
    if case.status == 2:
        assert result.stdout == ""
        return
    plan = json.loads(result.stdout)  # nothing but JSON on stdout
    text = results[(name, False)].stdout
    assert f"plan for SM{plan['capability'].replace('.', '')}" in text
    if case.status == 1:
        assert plan["error"] and case.needle in plan["error"]
        assert plan["caches"] == []
        return
    assert plan["error"] is None
    assert plan["kernel_path"] in text and plan["attention_class"] in text
    for cache in plan["caches"]:
        assert cache["cache"] in text
        assert str(cache["page_bytes"]) in text


def test_nested_config_reads_the_text_model(results):
    plan = json.loads(results[("nested-text-config", True)].stdout)
    assert plan["local_heads"] == DSV41["num_attention_heads"]
    assert {c["cache"] for c in plan["caches"]} == {
        "swa",
        "compressed r=1",
        "compressed r=2",
        "indexer r=1",
        "indexer r=2",
    }


# ---------------------------------------------------------------------------
# More inputs of each kind, through the same main() in this process
# ---------------------------------------------------------------------------

MORE_USAGE_ERRORS = {
    "capability-three-parts": (["--capability", "12.0.1"], "12.0.1", None),
    "tp-word": (["--capability", "12.0", "--tp", "two"], "'two' is not an int", None),
    "spec-negative": (
        ["--capability", "12.0", "--num-speculative-tokens", "-1"],
        "-1 is not at least 0",
        None,
    ),
    "config-empty": (["--capability", "12.0"], "is not JSON", ""),
    "config-no-window": (
        ["--capability", "12.0"],
        "the field 'sliding_window' is missing",
        _with(sliding_window=None),
    ),
    "config-window-string": (
        ["--capability", "12.0"],
        "sliding_window is '128'; expected an integer",
        _with(sliding_window="128"),
    ),
    "config-text-not-object": (
        ["--capability", "12.0"],
        "text_config is not an object",
        {**NESTED, "text_config": [1]},
    ),
    "compress-ratios-empty": (
        ["--capability", "12.0"],
        "compress_ratios is empty",
        _with(compress_ratios=[], kv_source_layer_ids=[]),
    ),
    "no-index-source": (
        ["--capability", "12.0"],
        "compressed layer 1 has no source layer at or below it",
        _with(index_source_layer_ids=[]),
    ),
}

MORE_REFUSALS = {
    "ratio-4": (
        ["--capability", "12.0"],
        "compress ratios [4] are not DeepSeek V4.1's",
        _with(compress_ratios=[0, 4, 1, 0]),
    ),
    "zero-heads": (
        ["--capability", "12.0"],
        "the model has 0 attention heads",
        _with(num_attention_heads=0),
    ),
    "heads-over-128": (
        ["--capability", "12.0"],
        "does not support 256 heads",
        _with(num_attention_heads=256),
    ),
    "bf16-on-sm120": (
        ["--capability", "12.0", "--kv-cache-dtype", "bfloat16"],
        "bfloat16",
        None,
    ),
}


@pytest.mark.parametrize("name", list(MORE_USAGE_ERRORS))
def test_more_usage_errors(capsys, tmp_path, name):
    from vllm_dsv41_plan import report

    args, needle, config = MORE_USAGE_ERRORS[name]
    with pytest.raises(SystemExit) as exit_info:
        report.main(
            [
                "plan",
                *FLASHINFER,
                *args,
                *_config_args(name, config, tmp_path),
            ]
        )
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    last = err.strip().splitlines()[-1]
    assert out == "" and "error:" in last and needle in last, last


@pytest.mark.parametrize("name", list(MORE_REFUSALS))
def test_more_refusals(capsys, tmp_path, name):
    from vllm_dsv41_plan import report

    args, needle, config = MORE_REFUSALS[name]
    assert (
        report.main(
            [
                "plan",
                *FLASHINFER,
                *args,
                *_config_args(name, config, tmp_path),
            ]
        )
        == 1
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("start-up error: ") and needle in lines[1], lines
