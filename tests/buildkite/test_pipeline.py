# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""CPU checks of the Buildkite CI definitions.

* ``.buildkite/pipeline.yml`` validates against Buildkite's schema (the one
  check-jsonschema vendors, as the pre-commit hook does) and has the shape the
  GPU steps rely on: queues, timeouts, retries on agent loss, dependencies,
  trigger paths.
* ``.buildkite/test_areas/deepseek_v4_1_blackwell.yaml`` uses only the keys and
  devices upstream vLLM's test areas use, and the Buildkite steps it stands for
  validate against the same schema.
* Every command names scripts and test files that exist, and every ``-k``
  selects tests; every CUDA-gated test file under tests/ is reached by a GPU
  step of both files.
* On a machine without CUDA, the GPU tests collect without errors and every
  one of them skips with a reason that names what is missing.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
import yaml
from _pytest.mark.expression import Expression

from tools.fork.common import on_base

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / ".buildkite" / "pipeline.yml"
TEST_AREA = REPO / ".buildkite" / "test_areas" / "deepseek_v4_1_blackwell.yaml"
GPU_RUNNER = ".buildkite/scripts/gpu_tests.py"

# What upstream vLLM's .buildkite/test_areas/*.yaml use.
UPSTREAM_GROUP_KEYS = {"group", "depends_on", "steps"}
UPSTREAM_STEP_KEYS = {
    "label",
    "key",
    "timeout_in_minutes",
    "device",
    "num_devices",
    "working_dir",
    "optional",
    "soft_fail",
    "depends_on",
    "source_file_dependencies",
    "commands",
    "parallelism",
    "mirror",
}
REQUIRED_STEP_KEYS = {
    "label",
    "key",
    "timeout_in_minutes",
    "device",
    "source_file_dependencies",
    "commands",
}
# NVIDIA devices upstream's pipeline generator knows (ci-infra's
# constants.DeviceType; it has no "l4": steps without a known device go to its
# generic gpu_1_queue).
UPSTREAM_DEVICES = {
    "a100",
    "h100",
    "h200",
    "h200_18gb",
    "h200_35gb",
    "gh200",
    "b200",
    "b200-k8s",
    "dgx-spark",
}
# Upstream runs test-area commands from tests/ unless working_dir says else.
UPSTREAM_WORKDIR = "/vllm-workspace/tests"
# Exit statuses Buildkite reports when the agent, not the job, went away.
AGENT_LOSS_EXIT_STATUSES = {-1, 255}


def _schema() -> dict[str, Any]:
    spec = importlib.util.find_spec("check_jsonschema")
    assert spec is not None and spec.origin is not None
    path = Path(spec.origin).parent / "builtin_schemas" / "vendor" / "buildkite.json"
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = _schema()
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


@pytest.fixture(scope="module")
def pipeline() -> dict[str, Any]:
    return yaml.safe_load(PIPELINE.read_text())


@pytest.fixture(scope="module")
def test_area() -> dict[str, Any]:
    return yaml.safe_load(TEST_AREA.read_text())


def _header_ok(path: Path) -> bool:
    lines = path.read_text().splitlines()[:2]
    return lines == [
        "# SPDX-License-Identifier: Apache-2.0",
        "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project",
    ]


def test_yaml_files_carry_the_license_header() -> None:
    assert _header_ok(PIPELINE)
    assert _header_ok(TEST_AREA)


# ---------------------------------------------------------------------------
# pipeline.yml
# ---------------------------------------------------------------------------


def test_pipeline_matches_buildkite_schema(validator, pipeline) -> None:
    errors = [e.message for e in validator.iter_errors(pipeline)]
    assert not errors, errors


def test_schema_check_is_not_vacuous(validator, pipeline) -> None:
    """A misspelt step key or a bad retry rule must fail validation."""
    broken = yaml.safe_load(PIPELINE.read_text())
    broken["steps"][0]["timeout_minutes"] = 5
    assert list(validator.iter_errors(broken))
    broken = yaml.safe_load(PIPELINE.read_text())
    broken["steps"][0]["retry"]["automatic"][0]["signal_reason"] = "agent_gone"
    assert list(validator.iter_errors(broken))


def test_pipeline_passes_the_pre_commit_hook() -> None:
    """The same command the buildkite-schema hook runs."""
    result = subprocess.run(
        [sys.executable, "-m", "check_jsonschema"]
        + ["--builtin-schema", "vendor.buildkite", str(PIPELINE)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _steps(pipeline: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in pipeline["steps"] if isinstance(s, dict) and "key" in s]


def _gpu_steps(pipeline: dict[str, Any]) -> list[dict[str, Any]]:
    """The GPU test steps (the runner in pytest mode)."""
    return [
        s
        for s in _steps(pipeline)
        if s["agents"]["queue"].startswith("gpu-")
        and not any("--exec" in c for c in s["commands"])
    ]


def _bench_steps(pipeline: dict[str, Any]) -> list[dict[str, Any]]:
    """The GPU benchmark steps (the runner in --exec mode)."""
    return [
        s
        for s in _steps(pipeline)
        if s["agents"]["queue"].startswith("gpu-")
        and any("--exec" in c for c in s["commands"])
    ]


def test_every_step_has_queue_timeout_and_agent_loss_retry(pipeline) -> None:
    steps = _steps(pipeline)
    assert len(steps) == len(pipeline["steps"]), "every step needs a key"
    keys = [s["key"] for s in steps]
    assert len(keys) == len(set(keys))
    for step in steps:
        assert step["agents"]["queue"], step["key"]
        assert 0 < step["timeout_in_minutes"] <= 60, step["key"]
        rules = step["retry"]["automatic"]
        statuses = {r.get("exit_status") for r in rules}
        assert statuses >= AGENT_LOSS_EXIT_STATUSES, step["key"]
        assert any(r.get("signal_reason") == "agent_stop" for r in rules)
        # Test failures (exit 1) must not be retried into a pass.
        assert all(r.get("exit_status") not in ("*", 1) for r in rules), step["key"]
        for dependency in step.get("depends_on", []):
            assert dependency in keys, f"{step['key']} depends on {dependency}"


def test_wheel_and_gpu_steps_fit_together(pipeline) -> None:
    steps = {s["key"]: s for s in _steps(pipeline)}
    wheel = steps["fork-wheel"]
    assert wheel["commands"] == ["python3 tools/fork/main_job.py"]
    assert "dist/*.whl" in wheel["artifact_paths"]
    runner = (REPO / GPU_RUNNER).read_text()
    assert 'WHEEL_STEP_KEY = "fork-wheel"' in runner
    queues = {s["agents"]["queue"]: s for s in _gpu_steps(pipeline)}
    assert set(queues) == {
        "gpu-h100",
        "gpu-b200",
        "gpu-rtx-pro-6000",
        "gpu-dgx-spark",
    }
    for step in queues.values():
        assert {"fork-wheel", "cpu-tests"} <= set(step["depends_on"])
        assert step["if_changed"], step["key"]
        assert all(GPU_RUNNER in c for c in step["commands"]), step["key"]
    assert queues["gpu-dgx-spark"]["soft_fail"] is True
    assert not any(queues[q].get("soft_fail") for q in queues if q != "gpu-dgx-spark")
    expected_sm = {
        "gpu-h100": {"90"},
        "gpu-b200": {"100,103"},
        "gpu-rtx-pro-6000": {"120"},
        "gpu-dgx-spark": {"121"},
    }
    for queue, step in queues.items():
        sms = {
            shlex.split(c)[shlex.split(c).index("--expect-sm") + 1]
            for c in step["commands"]
        }
        assert sms == expected_sm[queue], queue


def test_benchmark_step_reports_without_gating(pipeline) -> None:
    """Timings vary with the host: the benchmark runs after the H100 tests
    passed, uploads its tables and never fails the build."""
    (bench,) = _bench_steps(pipeline)
    assert bench["agents"]["queue"] == "gpu-h100"
    assert bench["depends_on"] == ["gpu-h100"]
    assert bench["soft_fail"] is True
    assert bench["if_changed"]
    (command,) = bench["commands"]
    argv = shlex.split(command)
    assert argv[:2] == ["python3", GPU_RUNNER]
    script = argv[argv.index("--") + 1]
    assert (REPO / script).is_file()
    out_dir = argv[argv.index("--out-dir") + 1]
    # Results stay out of the tracked tree (.cache/ is ignored) and are
    # uploaded from there.
    assert out_dir.startswith(".cache/")
    assert f"{out_dir}/*" in bench["artifact_paths"]


def _glob_matches(pattern: str, path: str) -> bool:
    # Buildkite's globs: ** crosses directories, * does not.
    regex = re.escape(pattern).replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
    return re.fullmatch(regex, path) is not None


@pytest.mark.parametrize(
    "path, queues",
    [
        (
            "vllm/models/deepseek_v41/nvidia/sparse_mla_pages.py",
            {"gpu-h100", "gpu-b200", "gpu-rtx-pro-6000", "gpu-dgx-spark"},
        ),
        (
            "vllm/v1/attention/backends/mla/indexer_pages.py",
            {"gpu-h100", "gpu-b200", "gpu-rtx-pro-6000", "gpu-dgx-spark"},
        ),
        ("vllm_dsv41_plan/report.py", set()),
        ("tools/pre_commit/check_spdx_header.py", set()),
        (
            "vllm/v1/attention/ops/triton_dsv41_sparse_mla.py",
            {"gpu-h100", "gpu-b200", "gpu-rtx-pro-6000", "gpu-dgx-spark"},
        ),
        (
            "tests/v1/attention/dsv41/sparse_mla_reference.py",
            {"gpu-h100", "gpu-b200", "gpu-rtx-pro-6000", "gpu-dgx-spark"},
        ),
        ("docs/upstream-pr.md", set()),
        ("README.md", set()),
    ],
)
def test_if_changed_triggers(pipeline, path: str, queues: set[str]) -> None:
    triggered = {
        s["agents"]["queue"]
        for s in _gpu_steps(pipeline)
        if any(_glob_matches(p, path) for p in s["if_changed"])
    }
    assert triggered == queues


# ---------------------------------------------------------------------------
# test_areas/deepseek_v4_1_blackwell.yaml
# ---------------------------------------------------------------------------


def test_test_area_uses_upstream_keys_and_devices(test_area) -> None:
    assert set(test_area) <= UPSTREAM_GROUP_KEYS
    assert test_area["group"] and test_area["steps"]
    keys = [s["key"] for s in test_area["steps"]]
    assert len(keys) == len(set(keys))
    for step in test_area["steps"]:
        assert REQUIRED_STEP_KEYS <= set(step) <= UPSTREAM_STEP_KEYS, step["key"]
        assert re.fullmatch(r"[a-z0-9][a-z0-9-]*", step["key"]), step["key"]
        assert isinstance(step["timeout_in_minutes"], int)
        # No proposed devices: upstream's generator would put a step for a
        # device it does not know on its generic queue (see
        # test_pipeline_generator.py); the SM120 step is in docs/upstream-pr.md.
        assert step["device"] in UPSTREAM_DEVICES, step["key"]
        assert all(isinstance(c, str) for c in step["commands"])
    devices = {s["device"] for s in test_area["steps"]}
    assert {"h100", "b200-k8s", "dgx-spark"} <= devices


def _to_buildkite(test_area: dict[str, Any]) -> dict[str, Any]:
    """The Buildkite group a test area stands for, roughly as upstream's
    generator emits it: device -> agent queue, source_file_dependencies ->
    if_changed, working directory -> a cd before the commands."""
    steps = []
    for step in test_area["steps"]:
        deps = step["source_file_dependencies"]
        include = [d.rstrip("/") + "/**" if d.endswith("/") else d for d in deps]
        converted = {
            "label": step["label"],
            "key": step["key"],
            "timeout_in_minutes": step["timeout_in_minutes"],
            "agents": {"queue": step["device"]},
            "if_changed": [p for p in include if not p.startswith("!")],
            "commands": [f"cd {step.get('working_dir', UPSTREAM_WORKDIR)}"]
            + step["commands"],
        }
        for key in ("depends_on", "soft_fail", "parallelism"):
            if key in step:
                converted[key] = step[key]
        steps.append(converted)
    group = {"group": test_area["group"], "steps": steps}
    if "depends_on" in test_area:
        group["depends_on"] = test_area["depends_on"]
    return {"steps": [group]}


def test_test_area_steps_match_buildkite_schema(validator, test_area) -> None:
    errors = [e.message for e in validator.iter_errors(_to_buildkite(test_area))]
    assert not errors, errors
    # The raw file is not a Buildkite pipeline: upstream's keys are not
    # Buildkite's, which is why it is converted first.
    assert list(validator.iter_errors({"steps": [test_area]}))


def _upstream_vllm_root() -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent.parent


def test_test_area_dependencies_exist(test_area) -> None:
    """Every dependency is a path the pinned upstream tree has once the
    base's series is applied: upstream's own, or one the series adds."""
    upstream = _upstream_vllm_root()
    for step in test_area["steps"]:
        for dep in step["source_file_dependencies"]:
            path = dep.lstrip("!").rstrip("/")
            found = ((REPO / path).exists() and on_base(path)) or (
                path.startswith("vllm/") and (upstream / path).exists()
            )
            assert found, f"{step['key']}: {dep} exists neither here nor upstream"


# ---------------------------------------------------------------------------
# Commands, test paths and CUDA-gated test files
# ---------------------------------------------------------------------------


def _pytest_runs_in_pipeline(pipeline) -> Iterator[tuple[str, list[str]]]:
    """``(step key, pytest args)`` of each GPU test run in pipeline.yml."""
    for step in _gpu_steps(pipeline):
        for command in step["commands"]:
            argv = shlex.split(command)
            assert argv[:2] == ["python3", GPU_RUNNER], command
            yield step["key"], argv[argv.index("--") + 1 :]


def _pytest_runs_in_test_area(test_area) -> Iterator[tuple[str, list[str]]]:
    for step in test_area["steps"]:
        workdir = step.get("working_dir", UPSTREAM_WORKDIR)
        # Paths are relative to the working directory in upstream's image.
        prefix = "tests/" if workdir.rstrip("/").endswith("/tests") else ""
        for command in step["commands"]:
            argv = shlex.split(command)
            if argv[0] != "pytest":
                continue
            args = [
                prefix + a if a.endswith(".py") or "::" in a else a for a in argv[1:]
            ]
            yield step["key"], args


def _split(args: list[str]) -> tuple[list[str], str | None]:
    """Test paths and the -k expression of a pytest argument list."""
    paths, keyword = [], None
    it = iter(args)
    for arg in it:
        if arg == "-k":
            keyword = next(it)
        elif not arg.startswith("-"):
            paths.append(arg.split("::")[0])
    return paths, keyword


def test_pipeline_commands_name_existing_files(pipeline) -> None:
    for step in _steps(pipeline):
        for command in step["commands"]:
            for token in shlex.split(command):
                if token.startswith(".venv"):
                    continue  # made by the command before it
                if re.search(r"\.(py|sh|ya?ml)$", token) or token.startswith(
                    ("tests/", "tools/", ".buildkite/", "benchmarks/")
                ):
                    assert (REPO / token.split("::")[0]).exists(), (step["key"], token)


def _gpu_gated_test_files() -> set[str]:
    gated = set()
    for path in (REPO / "tests").rglob("test_*.py"):
        if path.parent == Path(__file__).parent:
            continue
        text = path.read_text()
        if "torch.cuda.is_available()" in text or "mark.gpu" in text:
            gated.add(path.relative_to(REPO).as_posix())
    return gated


@pytest.fixture(scope="module")
def gpu_test_ids() -> dict[str, list[str]]:
    """Test ids of every CUDA-gated test file, collected on this machine."""
    files = sorted(_gpu_gated_test_files())
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q"]
        + ["-p", "no:cacheprovider", *files],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ids: dict[str, list[str]] = {f: [] for f in files}
    for line in result.stdout.splitlines():
        if "::" in line:
            ids[line.split("::")[0]].append(line)
    return ids


def test_known_gpu_test_files_are_found() -> None:
    assert {
        "tests/kernels/attention/test_triton_dsv41_sparse_mla.py",
        "tests/kernels/attention/test_flashinfer_sparse_mla_dsv41_blackwell.py",
    } <= _gpu_gated_test_files()


def _selected(ids: dict[str, list[str]], args: list[str]) -> list[str]:
    paths, keyword = _split(args)
    chosen = [i for p in paths for i in ids.get(p, [])]
    if keyword is None:
        return chosen
    expression = Expression.compile(keyword)
    return [
        i
        for i in chosen
        if expression.evaluate(lambda name, i=i, **_: name in i.split("::", 1)[1])
    ]


@pytest.mark.parametrize("source", ["pipeline", "test_area"])
def test_every_gpu_test_file_is_reached(
    source: str, pipeline, test_area, gpu_test_ids
) -> None:
    runs = list(
        _pytest_runs_in_pipeline(pipeline)
        if source == "pipeline"
        else _pytest_runs_in_test_area(test_area)
    )
    reached: set[str] = set()
    for key, args in runs:
        paths, _ = _split(args)
        for path in paths:
            assert (REPO / path).is_file(), (key, path)
        selected = _selected(gpu_test_ids, args)
        assert selected, f"{key}: {' '.join(args)} selects no test"
        reached |= {i.split("::")[0] for i in selected}
    missing = set(gpu_test_ids) - reached
    assert not missing, f"CUDA-gated test files no GPU step runs: {missing}"


def test_gpu_steps_select_their_architecture(pipeline, gpu_test_ids) -> None:
    """Each Blackwell step runs its own architecture's kernel tests."""
    wanted = {"gpu-b200": "test_sm10x_", "gpu-rtx-pro-6000": "test_sm12x_"}
    wanted["gpu-dgx-spark"] = "test_sm12x_"
    for key, args in _pytest_runs_in_pipeline(pipeline):
        step = next(s for s in _gpu_steps(pipeline) if s["key"] == key)
        prefix = wanted.get(step["agents"]["queue"])
        names = [i.split("::", 1)[1] for i in _selected(gpu_test_ids, args)]
        if prefix and "blackwell" in " ".join(args):
            assert any(n.startswith(prefix) for n in names), key
            other = "test_sm12x_" if prefix == "test_sm10x_" else "test_sm10x_"
            assert not any(n.startswith(other) for n in names), key


# Against the default base only: every base's own run collects and skips the
# same files, which fails on an import error; the reasons are base-blind.
@pytest.mark.default_base_only
def test_gpu_tests_skip_with_reasons_on_cpu(tmp_path: Path, gpu_test_ids) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: the GPU tests would run here")
    report = tmp_path / "gpu.xml"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        + [f"--junitxml={report}", *sorted(gpu_test_ids)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    root = ET.parse(report).getroot()
    cases = root.findall(".//testcase")
    # Every CUDA-gated file contributed tests to the run.
    files = {c.get("classname", "").replace(".", "/") + ".py" for c in cases}
    assert set(gpu_test_ids) <= files
    for case in cases:
        name = f"{case.get('classname')}::{case.get('name')}"
        assert case.find("error") is None and case.find("failure") is None, name
        skipped = case.find("skipped")
        assert skipped is not None, f"{name} ran without a GPU"
        assert "CUDA" in (skipped.get("message") or ""), name


# ---------------------------------------------------------------------------
# The GPU runner's guards
# ---------------------------------------------------------------------------


def _runner() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_tests", REPO / GPU_RUNNER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "suite, ran",
    [
        ('<testsuite tests="4" skipped="4" errors="0" failures="0"/>', 0),
        ('<testsuite tests="4" skipped="1" errors="0" failures="0"/>', 3),
        (
            (
                '<testsuites><testsuite tests="2" skipped="2"/>'
                '<testsuite tests="5" skipped="0"/></testsuites>'
            ),
            5,
        ),
        ('<testsuite tests="0" skipped="0"/>', 0),
    ],
)
def test_runner_counts_tests_that_ran(tmp_path: Path, suite: str, ran: int) -> None:
    """A GPU step whose tests all skipped (wrong GPU, missing FlashInfer) must
    not pass: the runner fails when this count is 0."""
    report = tmp_path / "report.xml"
    report.write_text(suite)
    assert _runner().ran_tests(report) == ran


def test_runner_reads_tool_pins_from_dev_requirements() -> None:
    runner = _runner()
    lines = (REPO / "requirements" / "dev.txt").read_text().splitlines()
    assert runner.pinned_requirement("pytest") in lines
    with pytest.raises(SystemExit):
        runner.pinned_requirement("not-a-pinned-tool")
