# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Run GPU tests against the fork wheel on a Buildkite GPU agent.

    python3 .buildkite/scripts/gpu_tests.py --expect-sm 100 --report b200 \
        -- tests/kernels/attention/test_flashinfer_sparse_mla_dsv41_blackwell.py

1. Takes the fork wheel of the step's base (``VLLM_FORK_BASE``, default the
   pin's) for the agent's CPU architecture (x86_64, or aarch64 on GB200 and
   DGX Spark) that the ``fork-wheel`` step uploaded (inside Buildkite), or
   builds it (anywhere else).
2. Installs it into ``.venv-gpu`` with the pinned torch and FlashInfer from
   the package index (CUDA builds there); the venv is reused while the wheel
   is the same.
3. Refuses to run on a GPU other than the one the step is for: a B200 step
   that lands on an H100 would otherwise skip every test and pass.
4. Runs pytest with the given arguments from the checkout, writes a JUnit
   report under ``.cache/reports/`` and fails when no test ran (everything
   skipped or deselected): a green GPU step must mean kernels ran.
   With ``--exec`` it runs the given Python script instead (benchmarks):

    python3 .buildkite/scripts/gpu_tests.py --expect-sm 90 --exec \
        -- benchmarks/kernels/benchmark_dsv41_sparse_mla.py --out-dir .cache/bench

With ``--offline BUNDLE`` (an air-gapped agent that has Python, torch and
Triton but no package index) steps 1 and 2 install the GPU-host bundle that
``tools/fork/gpu_bundle.py`` built, all its parts in the folder ``BUNDLE``,
and the run uses it with this interpreter. The GPU check and the rule that a
run where nothing ran fails are the same.
"""

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.fork.common import (  # noqa: E402
    DEV_REQUIREMENTS,
    log,
    provision_venv,
    run,
    sha256_of,
    venv_python,
)

VENV = REPO / ".venv-gpu"
STAMP = VENV / ".fork-gpu-stamp"
WHEEL_STEP_KEY = "fork-wheel"
# JUnit reports; the pipeline uploads them as artifacts (.cache/ is ignored).
REPORTS = REPO / ".cache" / "reports"
BUNDLE = [sys.executable, "-m", "tools.fork.gpu_bundle"]


def pinned_requirement(name: str) -> str:
    """``name`` with the version requirements/dev.txt gives it (one place for
    the tool pins)."""
    for line in DEV_REQUIREMENTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if re.split(r"[=<>!~ ;\[]", line, maxsplit=1)[0] == name:
            return line
    raise SystemExit(f"{DEV_REQUIREMENTS.name} pins no {name}")


def machine_arch() -> str:
    machine = platform.machine().lower()
    return "aarch64" if machine in ("aarch64", "arm64") else machine


def fork_wheel() -> Path:
    """The fork wheel of this step's base (``VLLM_FORK_BASE``) for this
    agent's CPU architecture: the wheel step's artifact, else built here."""
    from tools.fork.build_wheel import build, fork_wheel_name

    name = fork_wheel_name(machine_arch())
    if os.environ.get("BUILDKITE_BUILD_ID"):
        run(
            "buildkite-agent", "artifact", "download", f"dist/{name}", ".",
            "--step", WHEEL_STEP_KEY, cwd=REPO,
        )  # fmt: skip
    wheel = REPO / "dist" / name
    return wheel if wheel.exists() else build(REPO / "dist", machine_arch())


def provision() -> Path:
    """``.venv-gpu`` with the fork wheel (x86_64 or aarch64) and pytest."""
    pytest_pin = pinned_requirement("pytest")
    wheel = fork_wheel()
    wanted = sha256_of(wheel)
    if STAMP.exists() and STAMP.read_text() == wanted:
        log(f"reusing {VENV.name}: it holds {wheel.name}")
    else:
        shutil.rmtree(VENV, ignore_errors=True)
        provision_venv(VENV, wheel, (pytest_pin,))
        STAMP.write_text(wanted)
    return venv_python(VENV)


def check_gpu(python: Path, expected: set[int]) -> None:
    query = (
        "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA GPU';"
        "c = torch.cuda.get_device_capability();"
        "print(c[0] * 10 + c[1], torch.cuda.get_device_name())"
    )
    out = subprocess.run(
        [python, "-c", query], check=True, capture_output=True, text=True
    ).stdout.split(maxsplit=1)
    sm, name = int(out[0]), out[1].strip()
    log(f"GPU: {name} (SM{sm})")
    if sm not in expected:
        raise SystemExit(
            f"this step is for SM{sorted(expected)}, but the agent's GPU is "
            f"{name} (SM{sm}); check the step's agent queue"
        )


def on_this_base(args: list[str]) -> list[str]:
    """``args`` without the test files the step's base does not ship
    (tools/fork/series.toml), so one command serves every base."""
    from tools.fork.common import on_base

    kept = [a for a in args if not a.endswith(".py") or on_base(a.split("::")[0])]
    for dropped in sorted(set(args) - set(kept)):
        log(f"not on this base, not run: {dropped}")
    return kept


def ran_tests(report: Path) -> int:
    """Tests in the JUnit report that ran (neither skipped nor errored out)."""
    root = ET.parse(report).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    total = sum(int(s.get("tests", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return total - skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--expect-sm",
        required=True,
        help="comma-separated compute capabilities the step is for, e.g. 100,103",
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--report", help="JUnit report name of the pytest run")
    mode.add_argument(
        "--exec", action="store_true", help="run a Python script, not pytest"
    )
    parser.add_argument(
        "--offline",
        type=Path,
        metavar="BUNDLE",
        help="install this GPU-host bundle (tools/fork/gpu_bundle.py), not the index",
    )
    parser.add_argument("args", nargs="+", help="pytest or script arguments")
    args = parser.parse_args()

    if shutil.which("nvidia-smi"):
        subprocess.run(["nvidia-smi"], check=False)
    # Offline, this interpreter is the host's, with its torch and Triton.
    python = Path(sys.executable) if args.offline else provision()
    check_gpu(python, {int(sm) for sm in args.expect_sm.split(",")})
    if args.offline:
        subprocess.run(
            [*BUNDLE, "install", args.offline.resolve()], check=True, cwd=REPO
        )
    # Offline, the command runs with the bundle installed (gpu_bundle run).
    prefix = [*BUNDLE, "run", "--"] if args.offline else []
    if args.exec:
        cmd = [*prefix, python, *args.args]
        sys.exit(subprocess.run(cmd, cwd=REPO, check=False).returncode)
    report = REPORTS / f"{args.report}.xml"
    report.parent.mkdir(parents=True, exist_ok=True)
    cmd = [*prefix, python, "-m", "pytest", "-v", "-rs", f"--junitxml={report}"]
    cmd += on_this_base(args.args)
    status = subprocess.run(cmd, cwd=REPO, check=False).returncode
    if status != 0:
        sys.exit(status)
    if ran_tests(report) == 0:
        raise SystemExit(
            "every selected test was skipped: the GPU step checked nothing"
        )


if __name__ == "__main__":
    main()
