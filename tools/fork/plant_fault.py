# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Plant a known fault in the fork's code and run pytest: its guard must fail.

The faults sit in the dev venv's edited vLLM (the [Bugfix]'s rule, the
model's selection), in the plan report and in the wheel build.

    python3 tools/fork/plant_fault.py FAULT [--base 0.34.0] [-- PYTEST ARGS]
    python3 tools/fork/plant_fault.py --list

A fault in vLLM goes into a copy of the venv's ``vllm`` put ahead of it on
PYTHONPATH, so the venv itself is never changed; one in the plan report is
made in the checkout and undone after the run (so no other test run may
share the checkout meanwhile). Exit status: 0 when pytest
failed (the fault was caught), 1 when it passed, 2 on a usage error.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.fork import common  # noqa: E402

ATTENTION = "vllm/models/deepseek_v41/attention.py"
WORKER_UTILS = "vllm/v1/worker/utils.py"
MODEL = "vllm/models/deepseek_v41/nvidia/model.py"
REPORT = "vllm_dsv41_plan/report.py"
BUILD_WHEEL = "tools/fork/build_wheel.py"

# name: (file, the text the fault replaces, what replaces it, what it breaks)
FAULTS = {
    "bugfix-no-check": (
        ATTENTION,
        "self._check_kv_cache_block_size(vllm_config)\n",
        "pass\n",
        "the kv-source layers no longer ask the rule",
    ),
    "bugfix-rule-accepts": (
        WORKER_UTILS,
        "    spec = customize_attention_spec(backend, spec)\n",
        "    return None\n",
        "the rule accepts every block",
    ),
    "bugfix-no-equal-block": (
        WORKER_UTILS,
        "if kernel_block_size == spec.block_size or (",
        "if (",
        "a block the kernel reads whole is judged as a split",
    ),
    "bugfix-no-split-predicate": (
        WORKER_UTILS,
        "splits_into_kernel_blocks(spec)\n        and ",
        "",
        "a cache of one token per state may split",
    ),
    "bugfix-no-stride": (
        WORKER_UTILS,
        "\n        and block_stride_alignment % kernel_page_bytes == 0",
        "",
        "the block stride is not asked",
    ),
    "bugfix-own-alignment": (
        WORKER_UTILS,
        "for b, s in packed_with)]",
        "for b, s in ())]",
        "only the cache's own alignment, not the packed caches'",
    ),
    "selection-no-gpu-check": (
        MODEL,
        "@_refuse_without_kernel_for_this_gpu\n",
        "",
        "the model builds a class on a GPU its backend has no kernel for",
    ),
    "report-no-block-check": (
        REPORT,
        "check_block_size(layer_cls, specs, block_size, hf_config)",
        "None",
        "the plan report skips the layers' --block-size check",
    ),
    "report-refusal-exits-0": (
        REPORT,
        "return 1 if report.error else 0",
        "return 0",
        "a refused plan exits 0, as if it served",
    ),
    "wheel-without-report": (
        BUILD_WHEEL,
        "paths = [*common.new_module_files(), *common.fork_package_files()]\n",
        "paths = common.new_module_files()\n",
        "the fork wheel ships without the plan report",
    ),
}


def _run_pytest(venv: Path, pytest_args: list[str], overlay: str | None) -> int:
    env = dict(os.environ)
    if overlay:
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [overlay, env.get("PYTHONPATH")])
        )
    return subprocess.run(
        [common.venv_python(venv), "-m", "pytest", "-q", *pytest_args],
        cwd=common.REPO,
        env=env,
    ).returncode


def plant(name: str, pytest_args: list[str]) -> int:
    file, old, new, _ = FAULTS[name]
    venv = common.venv_dir(".venv")
    with tempfile.TemporaryDirectory(prefix="fault-") as overlay:
        if file.startswith("vllm/"):
            # The venv's edited vLLM, copied ahead of it on PYTHONPATH.
            installed = next(venv.glob("lib/python*/site-packages/vllm"))
            shutil.copytree(installed, Path(overlay) / "vllm", symlinks=True)
            target = Path(overlay) / file
        else:
            # The fork's own package and tools are imported from the
            # checkout, which comes first on sys.path: change them there and
            # put them back.
            target = common.REPO / file
        text = target.read_text()
        if text.count(old) != 1:
            print(f"{name}: {file} holds its anchor {text.count(old)} times")
            return 2
        target.unlink()  # a linked new module: replace the link, not its target
        try:
            target.write_text(text.replace(old, new))
            status = _run_pytest(venv, pytest_args, overlay)
        finally:
            target.write_text(text)
    caught = status == 1
    print(f"{name}: {'caught' if caught else 'NOT caught'} (pytest exit {status})")
    return 0 if caught else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fault", nargs="?", choices=sorted(FAULTS))
    common.add_base_argument(parser)
    parser.add_argument("--list", action="store_true")
    args, pytest_args = parser.parse_known_args()
    if args.list or not args.fault:
        for name, (file, _, _, breaks) in FAULTS.items():
            print(f"{name}: {file}: {breaks}")
        return 0 if args.list else 2
    if pytest_args[:1] == ["--"]:
        pytest_args = pytest_args[1:]
    common.select_base(args.base)
    return plant(args.fault, pytest_args)


if __name__ == "__main__":
    sys.exit(main())
