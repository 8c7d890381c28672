# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""DeepSeek V4.1 sparse MLA on the portable Triton kernel.

``TRITON_MLA_SPARSE_DSV41`` is the two-segment layer of FlashInfer's SM120
backend (the same caches, metadata and index builders) with the Triton
kernel in place of FlashInfer's. It serves Hopper, where FlashMLA pads fewer
than 64 local heads to 64, and SM12x, where a user may want it instead of
FlashInfer's SM120 kernels.
"""

import torch

from vllm.config.cache import CacheDType
from vllm.models.deepseek_v41.nvidia.flashinfer_sparse import (
    DeepseekV4FlashInferMLASparseBackend,
    DeepseekV4FlashInferSM120Attention,
)
from vllm.models.deepseek_v41.nvidia.sparse_mla_kernel import SparseMLAKernel
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backend import MultipleOf


class DeepseekV4TritonMLASparseBackend(DeepseekV4FlashInferMLASparseBackend):
    """The two-segment sparse-MLA backend, run by the Triton kernel."""

    @staticmethod
    def get_name() -> str:
        return "TRITON_MLA_SPARSE_DSV41"

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        # The kernel finds every record through the pool's own strides.
        return [MultipleOf(1)]

    @classmethod
    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
        # DeepSeek V4.1's indexer runs DeepGEMM, which leaves out SM8x, and
        # SM10x has FlashInfer's and FlashMLA's own kernels.
        return capability.to_int() == 90 or capability.major == 12

    @classmethod
    def supports_combination(
        cls,
        head_size: int,
        dtype: torch.dtype,
        kv_cache_dtype: CacheDType | None,
        block_size: int | None,
        use_mla: bool,
        has_sink: bool,
        use_sparse: bool,
        use_mm_prefix: bool,
        device_capability: DeviceCapability,
    ) -> str | None:
        # The GPU is validate_configuration's own check, not a combination.
        if kv_cache_dtype not in ("fp8", "fp8_e4m3", "fp8_ds_mla"):
            return "kv_cache_dtype not supported"
        return None


class DeepseekV4TritonMLAAttention(DeepseekV4FlashInferSM120Attention):
    """The two-segment sparse-MLA layer on the Triton kernel."""

    backend_cls = DeepseekV4TritonMLASparseBackend

    @classmethod
    def choose_sparse_mla_kernel(cls, num_q_heads: int, top_k: int) -> SparseMLAKernel:
        # The Triton kernel takes every head count up to 128 and any top-k.
        return SparseMLAKernel.TRITON
