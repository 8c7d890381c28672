# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The kernels that can run DeepSeek V4.1's sparse MLA on NVIDIA GPUs."""

import enum

# The Triton kernel reads FP8 E4M3 records, which Triton lowers from SM89 on.
TRITON_MIN_CAPABILITY = 89


class SparseMLAKernel(enum.Enum):
    TRTLLM_GEN = "flashinfer-trtllm-gen"
    FLASHINFER_SM120 = "flashinfer-sm120"
    TRITON = "triton"
    FLASHMLA = "flashmla"
