# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Hundreds of steps of DeepSeek V4.1's two-segment layers on a GPU: vLLM's
block tables, slot mappings and metadata builders drive the Triton kernel
(and FlashInfer's SM120 kernel on SM12x), decode steps replayed from CUDA
graphs, every step checked against dense float64 attention
(tests/v1/attention/dsv41/many_step_decode.py)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.v1.attention.dsv41 import many_step_decode as msd
from tests.v1.attention.dsv41.many_step_decode import PLANS, check
from vllm.models.deepseek_v41.nvidia.flashinfer_sparse import (
    DeepseekV4FlashInferSM120Attention,
)
from vllm.models.deepseek_v41.nvidia.sparse_mla_kernel import (
    TRITON_MIN_CAPABILITY,
    SparseMLAKernel,
)
from vllm.platforms.interface import DeviceCapability

# GPU kernels accumulate in FP32 in their own order and round the output to
# BF16; measured on the H200 well below this.
GPU_TOLERANCE = 1e-2


def _gpu_runs() -> list[tuple[str, str]]:
    """(page plan, kernel) pairs this GPU runs; none without one."""
    if not torch.cuda.is_available():
        return []
    capability = DeviceCapability(*torch.cuda.get_device_capability())
    if capability.major == 10:
        return []  # SM10x layers run the TRTLLM-gen class, not this one
    if capability.to_int() < TRITON_MIN_CAPABILITY:
        return []
    runs = [(plan, SparseMLAKernel.TRITON) for plan in PLANS]
    if capability.major == 12:
        # FlashInfer's kernel on the SWA page the layer builds here.
        plan = msd.plan_for(DeepseekV4FlashInferSM120Attention.swa_backend_cls)
        runs.append((plan, SparseMLAKernel.FLASHINFER_SM120))
    return runs


@pytest.mark.skipif(
    not _gpu_runs(),
    reason="needs a CUDA GPU the two-segment class runs on (SM90+, not SM10x); "
    "runs in the Buildkite H100, RTX PRO 6000 and DGX Spark steps",
)
@pytest.mark.parametrize(
    "plan,kernel", _gpu_runs() or [("sm12x", SparseMLAKernel.TRITON)]
)
def test_many_step_decode_on_gpu(plan: str, kernel: str) -> None:
    result = msd.run(plan, "full", kernel, "cuda", seed=1)
    print(json.dumps(result))
    check(result, GPU_TOLERANCE, msd.SCHEDULES["full"])
    # Most steps are decode-only at a batch size seen before: graph replays.
    assert result["graph_replays"] > result["steps"] // 2
