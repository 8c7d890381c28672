# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The main job: build the wheels and the patch series, install and check them.

    python3 tools/fork/main_job.py [--base 0.30.0] [--base 0.34.0]

For every base in the pin (or the ones named), the bases side by side, it
writes the wheels to ``dist/`` and the patch series to
``dist/patches/vllm-<version>/``. The smoke check and the page-size plans run
from the installed wheel, not this checkout.
"""

import argparse
import contextlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.fork import common  # noqa: E402
from tools.fork.build_wheel import build  # noqa: E402
from tools.fork.common import REPO, log  # noqa: E402
from tools.fork.patch_series import default_out_dir, generate  # noqa: E402

# The architectures whose plan the main job prints: B200, RTX PRO 6000, GB10.
PLAN_CAPABILITIES = ("10.0", "12.0", "12.1")
PLAN_REPORT = "vllm_dsv41_plan"


def install_fresh(wheel: Path) -> Path:
    """Install ``wheel`` into ``.venv-wheel``, reused if it holds these bytes."""
    venv = common.venv_dir(".venv-wheel")
    stamp, digest = venv / common.WHEEL_VENV_STAMP, common.sha256_of(wheel)
    if stamp.exists() and stamp.read_text() == digest:
        log(f"reusing {venv.name}: it already holds this exact wheel")
    else:
        shutil.rmtree(venv, ignore_errors=True)
        common.provision_venv(venv, wheel)
        stamp.write_text(digest)
    return common.venv_python(venv)


def run_base(base: str) -> list[Path]:
    pin = common.select_base(base)
    log(f"=== vLLM {base} ===")
    # One wheel per CPU architecture; this machine installs and checks its own.
    wheels = [build(REPO / "dist", arch) for arch in pin.ARCHES]
    patches = generate(default_out_dir())
    python = install_fresh(wheels[pin.ARCHES.index(pin.DEFAULT_ARCH)])
    plans = (["-m", PLAN_REPORT, "plan", "--capability", c] for c in PLAN_CAPABILITIES)
    # Run outside the checkout so nothing can be imported from it.
    with tempfile.TemporaryDirectory() as cwd:
        for args in ([REPO / "tools" / "fork" / "smoke.py"], *plans):
            subprocess.run([python, *args], check=True, cwd=cwd)
    return [*wheels, *patches]


def run_side_by_side(bases: list[str]) -> int:
    """Each base in a process of its own, all at once: they share only the
    download caches, and a venv install waits on the network and the disk
    more than on a core. Each base's output is printed whole when it ends."""
    failed = []
    with contextlib.ExitStack() as stack:
        jobs = []
        for base in bases:
            out = stack.enter_context(tempfile.TemporaryFile())
            command = [sys.executable, __file__, "--base", base]
            job = subprocess.Popen(command, stdout=out, stderr=out)
            jobs.append((base, out, job))
        for base, out, job in jobs:
            status = job.wait()
            out.seek(0)
            sys.stdout.buffer.write(out.read())
            sys.stdout.flush()
            if status:
                failed.append(base)
    if failed:
        log(f"the main job failed for vLLM {', '.join(failed)}")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    only = "only this base (repeatable; default: every base in the pin)"
    common.add_base_argument(parser, action="append", help=only)
    bases = parser.parse_args().base or common.all_bases()
    if len(bases) > 1:
        return run_side_by_side(bases)
    for product in run_base(bases[0]):
        log(f"ready: {product.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
