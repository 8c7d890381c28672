# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""What DeepSeek V4.1's FlashInfer sparse-MLA layers and backends ask the
page policy.

The backends in ``flashinfer_sparse.py`` answer vLLM's static questions
(kernel page sizes, preferred ``--block-size``, the sliding-window and
compressed-KV pages) from here, and every attention layer negotiates here
before it builds a cache, so a configuration no kernel serves fails at
start-up with the policy's message instead of at the first request.

Nothing here imports ``flashinfer_sparse``: that module imports this one.
"""

from typing import Any

from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.logger import init_logger
from vllm.models.deepseek_v41.attention import _resolve_dsv4_kv_cache_dtype
from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backend import MultipleOf
from vllm.v1.attention.backends.mla import sparse_mla_page_policy as policy
from vllm.v1.attention.backends.mla.compressor_utils import (
    get_dspark_swa_index_width,
)
from vllm.v1.attention.backends.mla.sparse_mla_page_policy import LayerGeometry

logger = init_logger(__name__)

DSV41_COMPRESS_RATIOS = policy.DSV41_COMPRESS_RATIOS


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


def attention_class_for(capability: DeviceCapability) -> type:
    """The layer ``FLASHINFER_MLA_SPARSE_DSV41`` builds on ``capability``
    (``_select_dsv4_attn_cls``): TRTLLM-gen's on SM10x, the two-segment layer
    everywhere else."""
    from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fi

    if policy.is_sm100(capability):
        return fi.DeepseekV4FlashInferMLAAttention
    return fi.DeepseekV4FlashInferSM120Attention


def resolve_kv_cache_dtype(
    capability: DeviceCapability, kv_cache_dtype: str | None, attention_cls=None
) -> str:
    """``--kv-cache-dtype`` as the layer on ``capability`` resolves it
    (``auto``/``fp8``/unset to the packed record on the two-segment layer)."""
    cls = attention_cls or attention_class_for(capability)
    try:
        resolved, _ = _resolve_dsv4_kv_cache_dtype(
            cls.use_fp8_ds_mla_layout, kv_cache_dtype or "auto", None
        )
    except ValueError:
        # The policy's dtype check names what the layer reads instead.
        resolved = kv_cache_dtype or "auto"
    return str(resolved)


def _refuse(message: str) -> None:
    raise policy.UnsupportedSparseMLAConfig(
        f"DeepSeek V4.1 on {policy.BACKEND_NAME}: {message}"
    )


def _check_model_shape(hf_config: Any, tensor_parallel_size: int) -> int:
    """Refuse model values no DeepSeek V4.1 layer can be built with; returns
    the attention heads per GPU."""
    heads = hf_config.num_attention_heads
    if heads <= 0:
        _refuse(f"the model has {heads} attention heads; it needs at least one.")
    if hf_config.sliding_window <= 0:
        _refuse(f"sliding_window is {hf_config.sliding_window}; it must be positive.")
    ratios = sorted(set(hf_config.compress_ratios))
    unknown = [r for r in ratios if r != 0 and r not in DSV41_COMPRESS_RATIOS]
    if unknown:
        _refuse(
            f"compress ratios {unknown} are not DeepSeek V4.1's: its layers "
            f"are sliding-window only (0) or compressed with ratio "
            f"{' or '.join(map(str, DSV41_COMPRESS_RATIOS))}."
        )
    if tensor_parallel_size < 1:
        _refuse(f"--tensor-parallel-size {tensor_parallel_size} must be at least 1.")
    if heads % tensor_parallel_size:
        sizes = [tp for tp in range(1, heads + 1) if heads % tp == 0 and tp <= 64]
        _refuse(
            f"{heads} attention heads cannot be split evenly over "
            f"--tensor-parallel-size {tensor_parallel_size}. Use one of {sizes}."
        )
    return heads // tensor_parallel_size


def negotiate_for_model(
    capability: DeviceCapability,
    hf_config: Any,
    *,
    tensor_parallel_size: int,
    kv_cache_dtype: str | None,
    use_non_causal: bool = False,
    num_speculative_tokens: int | None = None,
    block_size: int | None = None,
    attention_cls: type | None = None,
    envelope: policy.SM120Envelope | None = None,
) -> LayerGeometry:
    """Every check start-up makes for a DeepSeek V4.1 model on ``capability``,
    and the geometry it negotiates; raises the one error start-up would.

    The layers (at construction), ``supports_combination`` (the part it can
    see) and the plan report all call this, so they cannot disagree.
    """
    local_heads = _check_model_shape(hf_config, tensor_parallel_size)
    if num_speculative_tokens is not None and num_speculative_tokens < 0:
        _refuse(f"{num_speculative_tokens} speculative tokens is not a count.")
    geometry = policy.negotiate(
        capability,
        num_local_heads=local_heads,
        kv_cache_dtype=resolve_kv_cache_dtype(
            capability, kv_cache_dtype, attention_cls
        ),
        swa_topks=swa_topks(
            hf_config.sliding_window, use_non_causal, num_speculative_tokens
        ),
        envelope=envelope,
    )
    if block_size is not None:
        check_block_size(block_size, geometry.plan)
    return geometry


# --block-size values a refusal checks and names as the ones that work.
BLOCK_SIZE_CHOICES = (16, 32, 64, 128, 256)


def _block_size_refusal(block_size: int, plan: policy.PagePlan) -> str | None:
    """Why ``--block-size`` cannot page this model's caches (None: it can).

    The sliding-window caches and the indexer K caches have pages of their
    own; the compressed-KV caches take ``--block-size`` unless the plan fixes
    their pages. vLLM groups caches of one page size and gives each group one
    kernel page that every backend in it takes, so an indexer cache whose
    page equals ``--block-size`` shares the compressed caches' kernel page.
    """
    from vllm.models.deepseek_v41.nvidia.flashinfer_sparse import (
        DeepseekV4FlashInferMLASparseBackend as backend,
    )
    from vllm.v1.attention.backends.mla.indexer import DeepseekV41IndexerBackend
    from vllm.v1.worker.utils import select_common_block_size

    if block_size < 1:
        return "it is not a positive page size"
    if not backend.supports_block_size(block_size):
        return f"the attention kernels take pages of {_sizes(backend)} tokens"
    if plan.compressed_states is not None:
        return None
    indexer = policy.plan_indexer_pages(plan.capability)
    joined = [r for r in DSV41_COMPRESS_RATIOS if indexer.block_size(r) == block_size]
    group = [backend, DeepseekV41IndexerBackend] if joined else [backend]
    try:
        kernel_page = select_common_block_size(block_size, group)
    except ValueError:
        return f"no kernel page of the compressed KV caches divides {block_size}"
    if joined and kernel_page != block_size:
        return (
            f"the ratio-{joined[0]} indexer K cache would get kernel pages of "
            f"{kernel_page // joined[0]} states; {indexer.deepgemm} reads "
            f"{indexer.states_per_page}"
        )
    return None


def _sizes(backend: type) -> list[int]:
    return [
        s.base if isinstance(s, MultipleOf) else s
        for s in backend.get_supported_kernel_block_sizes()
    ]


def check_block_size(block_size: int, plan: policy.PagePlan) -> None:
    """Refuse a ``--block-size`` some kernel of the model cannot read,
    naming the sizes that work."""
    why = _block_size_refusal(block_size, plan)
    if why is None:
        return
    working = [s for s in BLOCK_SIZE_CHOICES if _block_size_refusal(s, plan) is None]
    raise policy.UnsupportedSparseMLAConfig(
        f"--block-size {block_size} cannot page DeepSeek V4.1's KV caches on "
        f"this GPU: {why}. Use one of {working} (or leave --block-size unset)."
    )


def negotiate_layer(vllm_config: VllmConfig, attention_cls: type) -> LayerGeometry:
    """Negotiate for a layer of ``attention_cls`` about to be built; raises
    the policy's error for a configuration no kernel serves."""
    capability = current_platform.get_device_capability()
    if capability is None:
        raise policy.UnsupportedSparseMLAConfig(
            f"{policy.BACKEND_NAME} needs a CUDA GPU; none was found."
        )
    speculative = vllm_config.speculative_config
    cache_config = vllm_config.cache_config
    geometry = negotiate_for_model(
        capability,
        vllm_config.model_config.hf_config,
        tensor_parallel_size=get_tensor_model_parallel_world_size(),
        kv_cache_dtype=cache_config.cache_dtype,
        use_non_causal=vllm_config.attention_config.use_non_causal,
        num_speculative_tokens=(
            speculative.num_speculative_tokens if speculative else None
        ),
        # Until the backend's preferred size replaces it (after the model is
        # built), an unset --block-size reads as vLLM's generic default.
        block_size=(
            cache_config.block_size if cache_config.user_specified_block_size else None
        ),
        attention_cls=attention_cls,
    )
    if geometry.fallback_reason:
        logger.warning_once(geometry.fallback_reason)
    return geometry


def compressed_kernel_block_sizes() -> list[int | MultipleOf]:
    """Compressed-KV page sizes (tokens) this GPU's kernels take, largest
    first; empty when the plan keeps upstream's pages."""
    plan = current_page_plan()
    if plan is None:
        return []
    if sizes := plan.kernel_block_sizes(DSV41_COMPRESS_RATIOS):
        return list(sizes)
    if plan.kernel_path == policy.TRITON:
        # The Triton kernel takes any page, and the indexer K caches share
        # the compressed-KV groups: offer the pages their kernels take (64
        # tokens on SM90), or no kernel page would serve both.
        from vllm.v1.attention.backends.mla.indexer import DeepseekV41IndexerBackend

        return list(DeepseekV41IndexerBackend.get_supported_kernel_block_sizes())
    return []


def preferred_block_size(
    default_block_size: int, kernel_block_sizes: list[int | MultipleOf]
) -> int:
    """The ``--block-size`` to use when the user set none.

    ``--block-size`` also sizes the indexer K caches, whose kernels take
    128-token pages on Blackwell, so the default stays when a compressed-KV
    kernel takes it, else the largest page one does.
    """
    sizes = [s.base if isinstance(s, MultipleOf) else s for s in kernel_block_sizes]
    return default_block_size if default_block_size in sizes else max(sizes)


def compressed_block_size(compress_ratio: int) -> int | None:
    """Tokens per compressed-KV page for a layer of ``compress_ratio`` on
    this GPU; None keeps ``--block-size``."""
    plan = current_page_plan()
    return plan.compressed_block_size(compress_ratio) if plan else None


def swa_block_size() -> int | None:
    """Tokens per sliding-window page the plan fixes; None: the kernels take
    upstream's page."""
    plan = current_page_plan()
    if plan is None or plan.compressed_states is None:
        return None
    return plan.swa_block_size


def supports_compute_capability(capability: DeviceCapability) -> bool:
    try:
        policy.plan_pages(capability)
    except policy.UnsupportedSparseMLAConfig:
        return False
    return True


def unsupported_reason(
    capability: DeviceCapability,
    kv_cache_dtype: str | None,
    block_size: int | None = None,
) -> str | None:
    """Why the backend cannot run on ``capability`` with this cache dtype and
    ``--block-size`` (None: it can); the checks start-up makes that need no
    model."""
    try:
        plan = policy.plan_pages(capability)
        policy.check_kv_cache_dtype(
            capability, resolve_kv_cache_dtype(capability, kv_cache_dtype)
        )
        if block_size is not None:
            check_block_size(block_size, plan)
    except policy.UnsupportedSparseMLAConfig as e:
        return str(e)
    return None
