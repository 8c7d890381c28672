# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The main job: build the fork wheel and the upstream patch series, install
the wheel into a clean venv, smoke it and print what it will do.

    python3 tools/fork/main_job.py

It prints which upstream files the in-place edits change, writes the wheel to
``dist/`` and the patch series to ``dist/patches/vllm-<version>/``. The venv
(``.venv-wheel``) is rebuilt whenever the wheel's bytes change (the build is
reproducible, so unchanged sources reuse it). The smoke check and
the page-size plans run from the installed wheel, not from this checkout.
"""

import fcntl
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.fork.build_wheel import build  # noqa: E402
from tools.fork.common import (  # noqa: E402
    REPO,
    load_pin,
    log,
    provision_venv,
    sha256_of,
    venv_python,
)
from tools.fork.patch_series import generate  # noqa: E402

WHEEL_VENV = REPO / ".venv-wheel"
# The architectures whose plan the main job prints: B200, RTX PRO 6000, GB10.
PLAN_CAPABILITIES = ("10.0", "12.0", "12.1")


def install_fresh(wheel: Path, venv: Path = WHEEL_VENV) -> Path:
    """Install ``wheel`` into ``venv``, reusing it only if it holds this wheel."""
    stamp = venv / ".fork-wheel-sha256"
    digest = sha256_of(wheel)
    # One installer at a time: the main job and the wheel tests share the venv.
    with open(venv.with_name(venv.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == digest:
            log(f"reusing {venv.name}: it already holds this exact wheel")
            return venv_python(venv)
        shutil.rmtree(venv, ignore_errors=True)
        provision_venv(venv, wheel)
        stamp.write_text(digest)
    return venv_python(venv)


def main() -> None:
    wheel = build(REPO / "dist")
    patches = generate(REPO / "dist" / "patches" / f"vllm-{load_pin().VLLM_VERSION}")
    python = install_fresh(wheel)
    # Run outside the checkout so nothing can be imported from it.
    with tempfile.TemporaryDirectory() as cwd:
        subprocess.run(
            [python, REPO / "tools" / "fork" / "smoke.py"], check=True, cwd=cwd
        )
        for capability in PLAN_CAPABILITIES:
            subprocess.run(
                [python, "-m", "vllm.models.deepseek_v41.report", "plan",
                 "--capability", capability],
                check=True, cwd=cwd,
            )  # fmt: skip
    log(f"fork wheel ready: {wheel}")
    for patch in patches:
        log(f"upstream patch: {patch.relative_to(REPO)}")


if __name__ == "__main__":
    main()
