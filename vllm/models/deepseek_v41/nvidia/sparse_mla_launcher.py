# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The sparse-MLA kernel call of DeepSeek V4.1's two-segment layers.

The two-segment attention layers call :func:`launch` with FlashInfer's
``trtllm_batch_decode_sparse_mla_dsv4`` keywords and the kernel chosen for
the layer when it was built: FlashInfer's SM120 kernel, or the portable
Triton kernel with the same contract.
"""

from typing import Any

import torch

from vllm.models.deepseek_v41.nvidia.sparse_mla_kernel import SparseMLAKernel
from vllm.utils import flashinfer as flashinfer_utils
from vllm.v1.attention.ops.triton_dsv41_sparse_mla import triton_sparse_mla_dsv41


def run_triton(
    *,
    query: torch.Tensor,
    swa_kv_cache: torch.Tensor,
    sparse_indices: torch.Tensor,
    out: torch.Tensor,
    bmm1_scale: float,
    swa_topk_lens: torch.Tensor,
    sinks: torch.Tensor | None = None,
    compressed_kv_cache: torch.Tensor | None = None,
    extra_sparse_indices: torch.Tensor | None = None,
    extra_sparse_topk_lens: torch.Tensor | None = None,
    kv_layout: str = "NHD",
    workspace_buffer: torch.Tensor | None = None,
    bmm2_scale: float = 1.0,
) -> torch.Tensor:
    """FlashInfer's two-segment keywords, run by the Triton kernel.

    The Triton kernel needs no workspace and reads BF16 queries against
    packed or BF16 pools, so it serves the two-segment form only (output
    scale 1, as the SM120 layer passes).
    """
    if bmm2_scale != 1.0:
        raise ValueError("the Triton sparse-MLA kernel has no output scale")
    return triton_sparse_mla_dsv41(
        query,
        swa_kv_cache,
        sparse_indices,
        swa_topk_lens,
        out,
        float(bmm1_scale),
        sinks=sinks,
        compressed_kv_cache=compressed_kv_cache,
        extra_sparse_indices=extra_sparse_indices,
        extra_sparse_topk_lens=extra_sparse_topk_lens,
        kv_layout=kv_layout,
    )


def launch(kernel: SparseMLAKernel, **kwargs: Any) -> Any:
    """Run ``kernel`` with FlashInfer's two-segment keywords."""
    if kernel is SparseMLAKernel.TRITON:
        return run_triton(**kwargs)
    return flashinfer_utils.flashinfer_trtllm_batch_decode_sparse_mla_dsv4(**kwargs)
