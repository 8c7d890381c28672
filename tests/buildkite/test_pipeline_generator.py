# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The test area through upstream vLLM's real pipeline generator.

``.buildkite/test_areas/deepseek_v4_1_blackwell.yaml`` is turned into
Buildkite steps upstream by ci-infra's generator
(vllm-project/ci-infra, ``buildkite/pipeline_generator``), which is not on PyPI
and not in this repository. These tests run it from a fetched copy of that
repository: the folder named by ``VLLM_CI_INFRA_DIR``, else
``<repo>/.cache/ci-infra`` (git-ignored); without one they skip.

The generator runs as upstream runs it, in a scratch git checkout with two
commits, on ``main`` with ``RUN_ALL=1``; each emitted step is then checked
against an expectation table written here from ci-infra's constants (device ->
agent queue), and against the test area itself (commands emitted verbatim, from
tests/, dependencies, soft-fail, optional steps behind a block step). A device
the generator does not know must fail the check: the generator itself accepts
it and puts the step on its generic queue.

The first command of every step checks the GPU's CUDA capability; that is
checked here without the generator, against a stub ``torch``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TEST_AREAS = REPO / ".buildkite" / "test_areas"
TEST_AREA = TEST_AREAS / "deepseek_v4_1_blackwell.yaml"
CI_INFRA_ENV = "VLLM_CI_INFRA_DIR"
DEFAULT_CI_INFRA = REPO / ".cache" / "ci-infra"
GENERATOR = Path("buildkite") / "pipeline_generator"
# The generator's own dependencies (its pyproject.toml).
GENERATOR_MODULES = ("yaml", "click", "pydantic", "requests")
# Upstream's generator cds here before a test area's commands (a group with
# depends_on, repository vllm-project/vllm) unless the step names working_dir.
UPSTREAM_WORKDIR = "/vllm-workspace/tests"


@dataclass(frozen=True)
class Device:
    queue: str  # the agent queue the generator should give the step
    capability: tuple[int, int]  # what torch.cuda.get_device_capability() says
    arm64_image: bool = False  # the generator picks the -arm64 test image


# NVIDIA devices as ci-infra's generator maps them (commit 3e4cfe4bf1f2,
# constants.AgentQueue values behind buildkite_step.get_agent_queue), written
# out here so that a change there shows up as a failure here.
NVIDIA_DEVICES = {
    "a100": Device("a100_queue", (8, 0)),
    "h100": Device("mithril-h100-pool", (9, 0)),
    "h200": Device("H200", (9, 0)),
    "gh200": Device("gh200_queue", (9, 0)),
    "b200": Device("B200", (10, 0)),
    "b200-k8s": Device("b200-k8s", (10, 0)),
    "dgx-spark": Device("dgx-spark", (12, 1), arm64_image=True),
}
# GPUs a step may land on that no step of the test area names.
OTHER_CAPABILITIES = {
    (8, 9): "L4 / L40S",
    (10, 3): "B300",
    (12, 0): "RTX PRO 6000 / RTX 5090",
}
# A device ci-infra's generator does not know (checked against its constants
# at run time): the SM120 device the pull request asks CI to add.
UNKNOWN_DEVICE = "rtx-pro-6000"


def _ci_infra_dir() -> Path:
    return Path(os.environ.get(CI_INFRA_ENV) or DEFAULT_CI_INFRA)


@pytest.fixture(scope="module")
def generator_dir() -> Path:
    root = _ci_infra_dir()
    path = root / GENERATOR
    if not (path / "main.py").is_file():
        pytest.skip(
            f"no pipeline generator at {path}: {root} is to hold a fetched copy "
            f"of vllm-project/ci-infra (set {CI_INFRA_ENV} to another folder)"
        )
    missing = [m for m in GENERATOR_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"ci-infra's pipeline generator needs {', '.join(missing)}")
    return path


@pytest.fixture(scope="module")
def constants(generator_dir: Path) -> ModuleType:
    """ci-infra's constants module, loaded from the checkout."""
    spec = importlib.util.spec_from_file_location(
        "ci_infra_constants", generator_dir / "constants.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def known_devices(constants: ModuleType) -> set[str]:
    return {device.value for device in constants.DeviceType}


def _git(cwd: Path, env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        ["git", "-c", "commit.gpgsign=false", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip()


CI_CONFIG = {
    # Not upstream's "vllm_ci": that name makes the generator log in to AWS
    # ECR (docker) to fill $-variables, which no test-area command uses.
    "name": "vllm_ci_test_area_check",
    "job_dirs": [".buildkite/test_areas"],
    "run_all_patterns": ["docker/Dockerfile", "setup.py", "csrc/"],
    "run_all_exclude_patterns": [],
    "registries": "public.ecr.aws/q9t5s3a7",
    "repositories": {"main": "vllm-ci-postmerge-repo", "premerge": "vllm-ci-test-repo"},
}


def run_generator(
    generator_dir: Path, test_areas: dict[str, str], work: Path
) -> dict[str, Any]:
    """Run ci-infra's generator on ``test_areas`` (file name -> text) in a
    scratch checkout under ``work`` and return the pipeline it wrote."""
    checkout, home, out = work / "checkout", work / "home", work / "out"
    for path in (checkout, home, out):
        path.mkdir(parents=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "test",
        "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "test",
        "GIT_COMMITTER_EMAIL": "test@example.com",
    }
    # It diffs HEAD~1 on main: two commits, the second adding the test areas.
    _git(checkout, env, "init", "-q", "-b", "main")
    (checkout / "README.md").write_text("scratch checkout\n")
    _git(checkout, env, "add", ".")
    _git(checkout, env, "commit", "-q", "-m", "base")
    areas = checkout / ".buildkite" / "test_areas"
    areas.mkdir(parents=True)
    for name, text in test_areas.items():
        (areas / name).write_text(text)
    config = checkout / ".buildkite" / "ci_config.yaml"
    config.write_text(yaml.safe_dump(CI_CONFIG, sort_keys=False))
    _git(checkout, env, "add", ".")
    _git(checkout, env, "commit", "-q", "-m", "test areas")
    commit = _git(checkout, env, "rev-parse", "HEAD")

    output = out / "pipeline.yaml"
    env.update(
        PYTHONPATH=str(generator_dir),
        PYTHONDONTWRITEBYTECODE="1",
        BUILDKITE_BRANCH="main",
        BUILDKITE_COMMIT=commit,
        BUILDKITE_PULL_REQUEST="false",
        RUN_ALL="1",
    )
    result = subprocess.run(
        [sys.executable, str(generator_dir / "main.py")]
        + ["--pipeline_config_path", str(config.relative_to(checkout))]
        + ["--output_file_path", str(output)],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return yaml.safe_load(output.read_text())


def check_steps(
    test_area: dict[str, Any], pipeline: dict[str, Any], devices: set[str]
) -> list[str]:
    """What the generator emitted for ``test_area`` that is not what its steps
    ask for; ``devices`` are the devices the generator knows."""
    groups = [g for g in pipeline["steps"] if g.get("group") == test_area["group"]]
    if len(groups) != 1:
        return [f"group {test_area['group']!r} emitted {len(groups)} times"]
    emitted = groups[0]["steps"]
    commands = {s["key"]: s for s in emitted if "commands" in s}
    blocks = {s["key"]: s for s in emitted if "block" in s}
    problems = []
    keys = {s["key"] for s in test_area["steps"]}
    if set(commands) != keys:
        problems.append(f"emitted command steps {sorted(commands)}, not {sorted(keys)}")
    for step in test_area["steps"]:
        key, device = step["key"], step["device"]
        out = commands.get(key)
        if out is None:
            continue
        where = f"{key} (device {device})"
        queue = out["agents"].get("queue")
        if device not in devices:
            problems.append(
                f"{where}: {device!r} is not a device ci-infra's generator knows "
                f"(constants.DeviceType); it put the step on {queue!r}"
            )
        expected = NVIDIA_DEVICES.get(device)
        if expected is None:
            problems.append(f"{where}: no expected queue for {device!r}")
        else:
            if queue != expected.queue:
                problems.append(f"{where}: queue {queue!r}, not {expected.queue!r}")
            images = json.dumps(out.get("plugins") or [])
            if ("-arm64" in images) != expected.arm64_image:
                wanted = "the -arm64" if expected.arm64_image else "the x86_64"
                problems.append(f"{where}: not on {wanted} test image")
        if out["label"] != step["label"]:
            problems.append(f"{where}: label {out['label']!r}")
        if out.get("timeout_in_minutes") != step["timeout_in_minutes"]:
            problems.append(f"{where}: timeout {out.get('timeout_in_minutes')}")

        # Commands: from the working directory, each one verbatim (the
        # generator wraps them and rewrites ' to "), in order.
        generated = out["commands"]
        workdir = step.get("working_dir", UPSTREAM_WORKDIR)
        if generated[0] != f"cd {workdir}":
            problems.append(f"{where}: first command {generated[0]!r}")
        last = 0
        for command in step["commands"]:
            if "$" in command:
                problems.append(
                    f"{where}: $ in {command!r} (Buildkite and the "
                    "generator substitute variables)"
                )
            found = [
                i for i, g in enumerate(generated) if f"\n{command}\n" in f"\n{g}\n"
            ]
            if not found:
                problems.append(f"{where}: {command!r} not emitted verbatim")
            elif found[0] <= last:
                problems.append(f"{where}: {command!r} out of order")
            else:
                last = found[0]

        # Dependencies: the step's own, else the group's; an optional step
        # waits behind a block step (a person unblocks it), others do not.
        depends_on = list(step.get("depends_on") or test_area.get("depends_on") or [])
        block = f"block-{key}"
        if step.get("optional"):
            if block not in blocks:
                problems.append(f"{where}: optional, but no block step {block}")
            depends_on.insert(0, block)
        elif block in blocks:
            problems.append(f"{where}: not optional, but behind {block}")
        if out.get("depends_on") != depends_on:
            problems.append(
                f"{where}: depends_on {out.get('depends_on')}, not {depends_on}"
            )
        if out.get("soft_fail", False) is not step.get("soft_fail", False):
            problems.append(f"{where}: soft_fail {out.get('soft_fail')}")
        rules = (out.get("retry") or {}).get("automatic") or []
        statuses = [r.get("exit_status") for r in rules]
        if -1 not in statuses:
            problems.append(f"{where}: no retry when the agent is lost")
    return problems


@pytest.fixture(scope="module")
def test_area() -> dict[str, Any]:
    return yaml.safe_load(TEST_AREA.read_text())


@pytest.fixture(scope="module")
def generated(generator_dir: Path, tmp_path_factory) -> dict[str, Any]:
    areas = {p.name: p.read_text() for p in sorted(TEST_AREAS.glob("*.yaml"))}
    return run_generator(generator_dir, areas, tmp_path_factory.mktemp("generator"))


def test_generator_emits_each_step_as_the_test_area_asks(
    test_area, generated, constants
) -> None:
    problems = check_steps(test_area, generated, known_devices(constants))
    commit = _ci_infra_dir() / "COMMIT"
    at = commit.read_text().strip() if commit.is_file() else "unknown commit"
    assert not problems, f"ci-infra {at}:\n" + "\n".join(problems)


def test_expectations_name_the_generators_own_queues(constants) -> None:
    """The table's queues and devices are the ones ci-infra defines."""
    queues = {queue.value for queue in constants.AgentQueue}
    assert {d.queue for d in NVIDIA_DEVICES.values()} <= queues
    assert set(NVIDIA_DEVICES) <= known_devices(constants)


def test_generated_pipeline_matches_buildkite_schema(generated) -> None:
    spec = importlib.util.find_spec("check_jsonschema")
    assert spec is not None and spec.origin is not None
    path = Path(spec.origin).parent / "builtin_schemas" / "vendor" / "buildkite.json"
    schema = json.loads(path.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [e.message for e in validator.iter_errors(generated)]
    assert not errors, errors[:10]


def _mutated(test_area: dict[str, Any], mutation: str) -> tuple[dict, str]:
    broken = yaml.safe_load(yaml.safe_dump(test_area))
    if mutation == "unknown-device":
        step = next(s for s in broken["steps"] if s["device"] == "b200-k8s")
        step["device"] = UNKNOWN_DEVICE
        return broken, f"{UNKNOWN_DEVICE!r} is not a device ci-infra's generator knows"
    step = next(s for s in broken["steps"] if s["device"] == "h100")
    step["commands"][0] = "python3 -c 'import torch'"
    return broken, "not emitted verbatim"


@pytest.mark.parametrize("mutation", ["unknown-device", "single-quoted-command"])
def test_check_fails_on_a_broken_copy(
    mutation: str, test_area, generator_dir, constants, tmp_path: Path
) -> None:
    """The check is live: a copy of the test area with a device the generator
    does not know (or a command it rewrites) fails it, though the generator
    itself takes the copy without complaint."""
    broken, expected = _mutated(test_area, mutation)
    if mutation == "unknown-device":
        assert UNKNOWN_DEVICE not in known_devices(constants)
    areas = {TEST_AREA.name: yaml.safe_dump(broken, sort_keys=False)}
    pipeline = run_generator(generator_dir, areas, tmp_path)
    problems = check_steps(broken, pipeline, known_devices(constants))
    assert any(expected in p for p in problems), problems
    if mutation == "unknown-device":
        (key,) = [s["key"] for s in broken["steps"] if s["device"] == UNKNOWN_DEVICE]
        assert any(p.startswith(f"{key} (device {UNKNOWN_DEVICE})") for p in problems)
        (group,) = pipeline["steps"]
        (step,) = [s for s in group["steps"] if s["key"] == key]
        # The silent fallback the check exists for.
        assert step["agents"]["queue"] == constants.AgentQueue.GPU_1.value


# ---------------------------------------------------------------------------
# The capability check each step runs first (no generator needed)
# ---------------------------------------------------------------------------

STUB_TORCH = """\
import os


class cuda:
    @staticmethod
    def get_device_capability(device=None):
        major, minor = os.environ["STUB_CUDA_CAPABILITY"].split(",")
        return int(major), int(minor)
"""


@pytest.fixture(scope="module")
def stub_env(tmp_path_factory) -> dict[str, str]:
    """An environment whose python3 imports a stub torch that reports the
    capability in STUB_CUDA_CAPABILITY."""
    root = tmp_path_factory.mktemp("stub")
    (root / "torch").mkdir()
    (root / "torch" / "__init__.py").write_text(STUB_TORCH)
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name in ("python3", "python"):
        (bin_dir / name).symlink_to(sys.executable)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "PYTHONPATH": str(root),
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _steps() -> list[dict[str, Any]]:
    return yaml.safe_load(TEST_AREA.read_text())["steps"]


@pytest.mark.parametrize("step", _steps(), ids=lambda s: s["key"])
def test_each_step_first_checks_its_gpu(step: dict[str, Any], stub_env) -> None:
    """The first command passes on the GPU the step names and fails on every
    other, run by the shell as the CI agent runs it."""
    command = step["commands"][0]
    argv = shlex.split(command)
    assert argv[0] in ("python3", "python") and argv[1] == "-c", command
    assert all(c.startswith("pytest ") for c in step["commands"][1:]), step["key"]
    wanted = NVIDIA_DEVICES[step["device"]].capability
    others = {d.capability for d in NVIDIA_DEVICES.values()} | set(OTHER_CAPABILITIES)
    for capability in sorted(others | {wanted}):
        env = dict(stub_env, STUB_CUDA_CAPABILITY=",".join(map(str, capability)))
        result = subprocess.run(
            ["bash", "-c", command], env=env, capture_output=True, text=True
        )
        passed = result.returncode == 0
        assert passed == (capability == wanted), (
            f"{step['key']} on SM{capability[0]}{capability[1]}: "
            f"rc {result.returncode} {result.stderr[-500:]}"
        )
