# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The kernels that can run DeepSeek V4.1's sparse MLA on NVIDIA GPUs."""

import enum

# Triton lowers the kernel's FP8 E4M3 reads from SM89 on, but DeepSeek V4.1's
# indexer runs DeepGEMM, which starts at SM90.
TRITON_MIN_CAPABILITY = 90


class SparseMLAKernel(enum.Enum):
    TRTLLM_GEN = "flashinfer-trtllm-gen"
    FLASHINFER_SM120 = "flashinfer-sm120"
    TRITON = "triton"
    FLASHMLA = "flashmla"
