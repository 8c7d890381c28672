# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The main job: build the fork wheel and the upstream patch series, install
the wheel into a clean venv, smoke it and print what it will do.

    python3 tools/fork/main_job.py [--base 0.30.0] [--base 0.33.0]

For every base in the pin (or the ones named) it prints which upstream files
the in-place edits change, writes the wheel to ``dist/`` and the patch series
to ``dist/patches/vllm-<version>/``. Each base's venv (``.venv-wheel``, or
``.venv-wheel-<version>`` for a base other than the default) is rebuilt
whenever the wheel's bytes change (the build is reproducible, so unchanged
sources reuse it). The smoke check and
the page-size plans run from the installed wheel, not from this checkout.
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.fork.build_wheel import build  # noqa: E402
from tools.fork.common import (  # noqa: E402
    REPO,
    all_bases,
    log,
    provision_venv,
    select_base,
    sha256_of,
    venv_dir,
    venv_python,
)
from tools.fork.patch_series import default_out_dir, generate  # noqa: E402

# The architectures whose plan the main job prints: B200, RTX PRO 6000, GB10.
PLAN_CAPABILITIES = ("10.0", "12.0", "12.1")
PLAN_REPORT = "vllm_dsv41_plan"


def install_fresh(wheel: Path, venv: Path | None = None) -> Path:
    """Install ``wheel`` into ``venv`` (default: this base's ``.venv-wheel``),
    reusing it only if it holds this wheel."""
    venv = venv or venv_dir(".venv-wheel")
    stamp = venv / ".fork-wheel-sha256"
    digest = sha256_of(wheel)
    if stamp.exists() and stamp.read_text() == digest:
        log(f"reusing {venv.name}: it already holds this exact wheel")
        return venv_python(venv)
    shutil.rmtree(venv, ignore_errors=True)
    provision_venv(venv, wheel)
    stamp.write_text(digest)
    return venv_python(venv)


def run_base(base: str) -> list[Path]:
    """Build, install and check the fork of one base; returns its products."""
    pin = select_base(base)
    log(f"=== vLLM {base} ===")
    # One wheel per CPU architecture; this machine installs and checks its own.
    wheels = [build(REPO / "dist", arch) for arch in pin.ARCHES]
    wheel = wheels[pin.ARCHES.index(pin.DEFAULT_ARCH)]
    patches = generate(default_out_dir())
    python = install_fresh(wheel)
    # Run outside the checkout so nothing can be imported from it.
    with tempfile.TemporaryDirectory() as cwd:
        subprocess.run(
            [python, REPO / "tools" / "fork" / "smoke.py"], check=True, cwd=cwd
        )
        for capability in PLAN_CAPABILITIES:
            subprocess.run(
                [python, "-m", PLAN_REPORT, "plan", "--capability", capability],
                check=True, cwd=cwd,
            )  # fmt: skip
    return [*wheels, *patches]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--base",
        choices=all_bases(),
        action="append",
        help="only this base (repeatable; default: every base in the pin)",
    )
    bases = parser.parse_args().base or all_bases()
    products = [p for base in bases for p in run_base(base)]
    for product in products:
        log(f"ready: {product.relative_to(REPO)}")


if __name__ == "__main__":
    main()
