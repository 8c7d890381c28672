# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Hundreds of steps of DeepSeek V4.1's two-segment layers (sliding window,
compressed ratios 1 and 2), driven by a page table and vLLM's metadata
builders, match dense float64 attention at every step, on the SM12x
pages and on upstream's (``many_step_decode``), on CPU.

The sparse-MLA kernel is the reference of its contract and vLLM's Triton
metadata kernels run in Triton's interpreter, so the run is a subprocess (the
interpreter is chosen when the kernels are defined). The GPU form is
tests/kernels/attention/test_dsv41_many_step_decode.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.v1.attention.dsv41 import many_step_decode as msd
from tests.v1.attention.dsv41.many_step_decode import PLANS, check

REPO = Path(__file__).resolve().parents[4]
# The reference is exact up to its BF16 output (unit roundoff 2^-8).
CPU_TOLERANCE = 2**-8 + 1e-4


# Minutes of Triton's interpreter per base: the default base only, to keep
# .ci/run within its 20 minutes. Every base runs the same layer step by step
# in test_attention_forward_cpu.py.
@pytest.mark.default_base_only
def test_many_step_decode_on_cpu() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    runs = {
        plan: subprocess.Popen(
            [sys.executable, "-m", msd.__name__, "--pages", plan],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for plan in PLANS  # both at once: one per core
    }
    for plan, proc in runs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{plan}: {err[-3000:]}"
        result = json.loads(out.strip().splitlines()[-1])
        print(plan, json.dumps(result))
        expected = msd.page_plan(plan)
        assert result["pages"]["swa"] == expected.swa
        check(result, CPU_TOLERANCE, msd.SCHEDULES["small"])
