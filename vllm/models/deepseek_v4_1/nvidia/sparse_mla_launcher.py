# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The sparse-MLA kernel call of DeepSeek V4.1's two-segment layers.

Upstream's layers call FlashInfer's ``trtllm_batch_decode_sparse_mla_dsv4``
wrapper by name. The fork binds that name to a launcher made here, which runs
FlashInfer or, when the page policy chose it for this model, the fork's Triton
kernel with the same contract, so upstream's forward code runs unchanged.

The choice is per process: every DeepSeek V4.1 layer of a process belongs to
one model on one GPU, and the layers record the policy's answer as they are
built, before any forward.
"""

from collections.abc import Callable
from typing import Any

import torch

from vllm.v1.attention.backends.mla import sparse_mla_page_policy as policy

_kernel_path: str | None = None


def use_kernel(kernel_path: str) -> None:
    """Record the kernel the page policy chose for this process's model."""
    global _kernel_path
    _kernel_path = kernel_path


def selected_kernel() -> str | None:
    return _kernel_path


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
    from vllm.v1.attention.ops.triton_dsv41_sparse_mla import (
        triton_sparse_mla_dsv41,
    )

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


def make_launcher(flashinfer_launcher: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap upstream's FlashInfer launcher so the policy's choice runs."""

    def launch(**kwargs: Any) -> Any:
        if _kernel_path == policy.TRITON:
            return run_triton(**kwargs)
        return flashinfer_launcher(**kwargs)

    launch.flashinfer_launcher = flashinfer_launcher  # type: ignore[attr-defined]
    return launch
