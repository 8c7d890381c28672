# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Smoke check run by the interpreter of a venv the fork wheel was installed in.

    <venv>/bin/python tools/fork/smoke.py

Fails unless the installed vLLM is the fork wheel and a fresh interpreter with
plugins off (``VLLM_PLUGINS=``) builds the fork's classes: nothing binds late.
"""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.fork import common  # noqa: E402

CHECKS = """
import importlib, importlib.metadata, sys, vllm
from pathlib import Path
from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fi
from vllm.models.deepseek_v4_1.nvidia import flashinfer_sparse as seed_path

modules = sys.argv[1].split()
# Where the base ships the page policy, the layers page through its hooks.
pages = "vllm.models.deepseek_v41.nvidia.sparse_mla_pages" in modules
site = Path(vllm.__file__).resolve().parent
failures = [f"{m.__name__} imported from {m.__file__}"
    for m in [fi, seed_path, *map(importlib.import_module, modules)]
    if site not in Path(m.__file__).resolve().parents]
# The plan report ships beside vllm, with its default config.
import vllm_dsv41_plan.report as plan_report
if Path(plan_report.__file__).resolve().parents[1] != site.parent:
    failures.append(f"vllm_dsv41_plan imported from {plan_report.__file__}")
if not plan_report.DEFAULT_CONFIG.is_file():
    failures.append(f"the plan report's {plan_report.DEFAULT_CONFIG.name} is missing")
backend = fi.DeepseekV4FlashInferMLASparseBackend
swa_backend = getattr(fi, "DeepseekSparseSWAFlashInferSM120Backend", None)
if pages and fi.DeepseekV4FlashInferSM120Attention.swa_backend_cls is not swa_backend:
    failures.append("the SM120 layer does not page its SWA cache through the policy")
if pages and not hasattr(backend, "get_compressed_block_size"):
    failures.append("the FlashInfer backend has no get_compressed_block_size")
if seed_path.DeepseekV4FlashInferMLASparseBackend is not backend:
    failures.append("the seed import path names other classes")
group = importlib.metadata.entry_points(group="vllm.general_plugins")
if plugins := [e.value for e in group if "deepseek" in e.value]:
    failures.append(f"a DeepSeek plugin entry point is installed: {plugins}")
if modules := sorted(m for m in sys.modules if m.startswith("vllm.plugins.deepseek")):
    failures.append(f"plugin modules were imported: {modules}")
for failure in failures: print(f"SMOKE FAIL: {failure}", file=sys.stderr)
sys.exit(1 if failures else 0)
"""


def _new_modules(base: str) -> str:
    """The importable modules the fork adds to vLLM on ``base``."""
    paths = (p.with_suffix("") for p in common.new_module_files(base=base))
    return " ".join(".".join(p.parts) for p in paths if p.name != "__init__")


def main() -> None:
    installed = importlib.metadata.version("vllm")
    if "+" not in installed:
        print(f"SMOKE FAIL: installed vllm is {installed}, not a fork wheel")
        sys.exit(1)
    base = installed.split("+")[0]
    env = {**os.environ, "VLLM_PLUGINS": ""}
    argv = [sys.executable, "-c", CHECKS, _new_modules(base)]
    if returncode := subprocess.run(argv, env=env).returncode:
        sys.exit(returncode)
    print(f"smoke ok: vllm {installed}; the fork's classes load with no plugin")


if __name__ == "__main__":
    main()
