# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""DeepSeek V4.1 FlashInfer sparse MLA with negotiated KV-cache pages.

Upstream vLLM 0.30.0 already runs this attention through FlashInfer
(``vllm.models.deepseek_v41.nvidia.flashinfer_sparse``) but builds its caches
with fixed page sizes: 32-token sliding-window pages and compressed pages of
``--block-size`` tokens. FlashInfer 0.6.14 - 0.6.18 instantiate the SM120
kernels for 64-entry pages only, so SM12x fails at the first decode. The
classes here subclass upstream's and take their page sizes from
:mod:`vllm.v1.attention.backends.mla.sparse_mla_page_policy`, which also
refuses unserved configurations while the layers are built.
"""

import dataclasses
from typing import Any, ClassVar

from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.logger import init_logger
from vllm.models.deepseek_v4_1.nvidia import sparse_mla_launcher
from vllm.models.deepseek_v41.attention import _resolve_dsv4_kv_cache_dtype
from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as upstream
from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backend import MultipleOf
from vllm.v1.attention.backends.mla import sparse_mla_page_policy as policy
from vllm.v1.attention.backends.mla.compressor_utils import (
    get_dspark_swa_index_width,
)
from vllm.v1.kv_cache_interface import KVCacheSpec

logger = init_logger(__name__)

# DeepSeek V4.1 layers: 0 = sliding window only, 1 and 2 = compressed KV.
DSV41_COMPRESS_RATIOS = (1, 2)

# Unchanged upstream pieces, re-exported under the names this module keeps.
DeepseekV4FlashInferSparseMLAMetadataBuilder = (
    upstream.DeepseekV4FlashInferSparseMLAMetadataBuilder
)
DeepseekSparseSWAFlashInferMetadataBuilder = (
    upstream.DeepseekSparseSWAFlashInferMetadataBuilder
)
DeepseekSparseSWAFlashInferBackend = upstream.DeepseekSparseSWAFlashInferBackend


def current_page_plan() -> policy.PagePlan | None:
    """The page plan for this process's GPU; None when there is none to plan
    for (no GPU, or an architecture the backend refuses)."""
    capability = current_platform.get_device_capability()
    if capability is None:
        return None
    try:
        return policy.plan_pages(capability)
    except policy.UnsupportedSparseMLAConfig:
        return None


def swa_topks(
    window_size: int, use_non_causal: bool, num_speculative_tokens: int | None
) -> tuple[int, ...]:
    """SWA index widths the decode kernels will see for this model."""
    if use_non_causal and num_speculative_tokens:
        # Non-causal DSpark verification widens every SWA row.
        return (get_dspark_swa_index_width(window_size, num_speculative_tokens),)
    return (window_size,)


def negotiate_for_model(
    capability: DeviceCapability,
    hf_config: Any,
    *,
    tensor_parallel_size: int,
    kv_cache_dtype: str,
    uses_fp8_ds_mla_layout: bool,
    use_non_causal: bool = False,
    num_speculative_tokens: int | None = None,
    envelope: policy.SM120Envelope | None = None,
) -> policy.LayerGeometry:
    """The negotiated geometry of a DeepSeek V4.1 model on ``capability``."""
    # Resolve "auto"/"fp8" the way the attention layer will before checking.
    # The dtype check gives the clearer message for layouts that refuse it.
    try:
        resolved, _ = _resolve_dsv4_kv_cache_dtype(
            uses_fp8_ds_mla_layout, kv_cache_dtype, None
        )
    except ValueError:
        resolved = kv_cache_dtype
    return policy.negotiate(
        capability,
        num_local_heads=hf_config.num_attention_heads // tensor_parallel_size,
        kv_cache_dtype=resolved,
        swa_topks=swa_topks(
            hf_config.sliding_window, use_non_causal, num_speculative_tokens
        ),
        envelope=envelope,
    )


def check_block_size(block_size: int) -> None:
    """Refuse a ``--block-size`` the indexer K caches cannot be paged with.

    The compressed-KV and sliding-window caches get their own pages, but the
    indexer K caches keep ``--block-size``; its kernels take fixed pages, so
    a size they cannot split would only fail when the worker lays out the
    cache.
    """
    from vllm.v1.attention.backends.mla.indexer import DeepseekV41IndexerBackend

    if DeepseekV41IndexerBackend.supports_block_size(block_size):
        return
    sizes = [
        s.base if isinstance(s, MultipleOf) else s
        for s in DeepseekV41IndexerBackend.get_supported_kernel_block_sizes()
    ]
    raise policy.UnsupportedSparseMLAConfig(
        f"--block-size {block_size} cannot page DeepSeek V4.1's indexer K "
        f"caches, whose kernels take pages of {sizes} tokens on this GPU. Use a "
        f"multiple of {max(sizes)} (or leave --block-size unset)."
    )


def kernel_block_sizes(plan: policy.PagePlan | None) -> list[int | MultipleOf]:
    """Compressed-KV page sizes (tokens) the kernels take under ``plan``."""
    sizes = plan.kernel_block_sizes(DSV41_COMPRESS_RATIOS) if plan else []
    if not sizes:
        upstream_backend = upstream.DeepseekV4FlashInferMLASparseBackend
        return upstream_backend.get_supported_kernel_block_sizes()
    return list(sizes)


def preferred_block_size(plan: policy.PagePlan | None, default_block_size: int) -> int:
    """The ``--block-size`` to use when the user set none.

    The largest kernel page: --block-size also sizes the indexer K caches,
    whose kernels take 128-token pages on Blackwell, while each compressed-KV
    cache gets its own page from :func:`with_negotiated_block_size`.
    """
    sizes = [
        s.base if isinstance(s, MultipleOf) else s for s in kernel_block_sizes(plan)
    ]
    return default_block_size if default_block_size in sizes else max(sizes)


def with_negotiated_block_size(
    spec: KVCacheSpec | None, plan: policy.PagePlan, compress_ratio: int
) -> KVCacheSpec | None:
    """``spec`` with the compressed-KV page the plan asks for."""
    block_size = plan.compressed_block_size(compress_ratio)
    if spec is None or block_size is None:
        return spec
    return dataclasses.replace(spec, block_size=block_size)


class DeepseekV4FlashInferMLASparseBackend(
    upstream.DeepseekV4FlashInferMLASparseBackend
):
    """Upstream's backend whose block sizes come from the page policy."""

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[int | MultipleOf]:
        return kernel_block_sizes(current_page_plan())

    @classmethod
    def get_preferred_block_size(cls, default_block_size: int) -> int:
        return preferred_block_size(current_page_plan(), default_block_size)

    @classmethod
    def get_compressed_block_size(cls, compress_ratio: int) -> int | None:
        """Tokens per compressed-KV page for a layer of ``compress_ratio``;
        None keeps ``cache_config.block_size``."""
        plan = current_page_plan()
        return plan.compressed_block_size(compress_ratio) if plan else None

    @classmethod
    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
        try:
            policy.plan_pages(capability)
        except policy.UnsupportedSparseMLAConfig:
            return False
        return True

    @classmethod
    def supports_combination(
        cls,
        head_size,
        dtype,
        kv_cache_dtype,
        block_size,
        use_mla,
        has_sink,
        use_sparse,
        use_mm_prefix,
        device_capability: DeviceCapability,
    ) -> str | None:
        try:
            policy.plan_pages(device_capability)
            policy.check_kv_cache_dtype(device_capability, kv_cache_dtype or "auto")
        except policy.UnsupportedSparseMLAConfig as e:
            return str(e)
        return None

    @staticmethod
    def get_builder_cls() -> type[DeepseekV4FlashInferSparseMLAMetadataBuilder]:
        return DeepseekV4FlashInferSparseMLAMetadataBuilder


class DeepseekSparseSWAFlashInferSM120Backend(DeepseekSparseSWAFlashInferBackend):
    """Sliding-window cache backend for SM12x, paged as the policy says."""

    @classmethod
    def get_swa_block_size(cls) -> int:
        plan = current_page_plan()
        return plan.swa_block_size if plan else policy.UPSTREAM_SWA_BLOCK_SIZE

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[int | MultipleOf]:
        plan = current_page_plan()
        if plan is None or plan.compressed_states is None:
            return DeepseekSparseSWAFlashInferBackend.get_supported_kernel_block_sizes()
        return [plan.swa_block_size]

    @classmethod
    def get_preferred_block_size(cls, default_block_size: int) -> int:
        plan = current_page_plan()
        if plan is None or plan.compressed_states is None:
            return super().get_preferred_block_size(default_block_size)
        return plan.swa_block_size


class _NegotiatedPages:
    """Mixin for the attention layers: negotiate before building anything,
    then size the sliding-window and compressed-KV caches from the answer."""

    page_geometry: policy.LayerGeometry

    def __init__(self, vllm_config: VllmConfig, *args, **kwargs) -> None:
        capability = current_platform.get_device_capability()
        assert capability is not None, "DeepSeek V4.1 FlashInfer needs a GPU"
        speculative = vllm_config.speculative_config
        # Before the upstream constructor, so a refused configuration fails
        # with the policy's message instead of a kernel or dtype error.
        geometry = negotiate_for_model(
            capability,
            vllm_config.model_config.hf_config,
            tensor_parallel_size=get_tensor_model_parallel_world_size(),
            kv_cache_dtype=vllm_config.cache_config.cache_dtype,
            uses_fp8_ds_mla_layout=type(self).use_fp8_ds_mla_layout,  # type: ignore[attr-defined]
            use_non_causal=vllm_config.attention_config.use_non_causal,
            num_speculative_tokens=(
                speculative.num_speculative_tokens if speculative else None
            ),
        )
        check_block_size(vllm_config.cache_config.block_size)
        if geometry.fallback_reason:
            logger.warning_once(geometry.fallback_reason)
        sparse_mla_launcher.use_kernel(geometry.kernel_path)
        super().__init__(vllm_config, *args, **kwargs)  # type: ignore[call-arg]
        self.page_geometry = geometry
        self._resize_swa_cache(vllm_config, geometry.plan.swa_block_size)

    def _resize_swa_cache(self, vllm_config: VllmConfig, block_size: int) -> None:
        swa_cache = self.swa_cache_layer  # type: ignore[attr-defined]
        if swa_cache.block_size == block_size:
            return
        # The cache reads its page size when vLLM collects KV-cache specs,
        # which happens after the layers are built.
        swa_cache.block_size = block_size
        if vllm_config.kernel_config.enable_jit_warmup:
            # Warm the index kernel for the page the cache will really have.
            from vllm.v1.attention.backends.mla.sparse_swa import (
                _COMPUTE_SWA_INDICES_AND_LENS_KERNEL,
            )

            _COMPUTE_SWA_INDICES_AND_LENS_KERNEL.register_warmup(
                window_size=self.window_size,  # type: ignore[attr-defined]
                block_size=block_size,
                max_image_tokens=self.max_image_tokens,  # type: ignore[attr-defined]
            )

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> KVCacheSpec | None:
        spec = super().get_kv_cache_spec(vllm_config)  # type: ignore[misc]
        return with_negotiated_block_size(
            spec,
            self.page_geometry.plan,
            self.compress_ratio,  # type: ignore[attr-defined]
        )


class DeepseekV4FlashInferMLAAttention(
    _NegotiatedPages, upstream.DeepseekV4FlashInferMLAAttention
):
    """TRTLLM-gen sparse MLA attention (SM10x) with negotiated pages."""

    backend_cls: ClassVar = DeepseekV4FlashInferMLASparseBackend
    swa_backend_cls: ClassVar = DeepseekSparseSWAFlashInferBackend


class DeepseekV4FlashInferSM120Attention(
    _NegotiatedPages, upstream.DeepseekV4FlashInferSM120Attention
):
    """Two-segment sparse MLA attention with negotiated pages: FlashInfer's
    SM120 kernels on SM12x, the fork's Triton kernel where those do not run
    (SM90, or a shape FlashInfer does not instantiate)."""

    backend_cls: ClassVar = DeepseekV4FlashInferMLASparseBackend
    swa_backend_cls: ClassVar = DeepseekSparseSWAFlashInferSM120Backend


def attention_class_for(capability: DeviceCapability) -> type[_NegotiatedPages]:
    """The fork class that runs FLASHINFER_MLA_SPARSE_DSV41 on ``capability``:
    TRTLLM-gen's on SM10x, the two-segment class everywhere else."""
    if policy.is_sm100(capability):
        return DeepseekV4FlashInferMLAAttention
    return DeepseekV4FlashInferSM120Attention
