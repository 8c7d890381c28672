# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""KV-cache pages and kernel of DeepSeek V4.1's sparse MLA on NVIDIA GPUs.

Every kernel that reads a page has its own rule: FlashInfer's SM120 kernels
(one page size, or any, by release), SM10x's TRTLLM-gen kernels (any page) and
DeepGEMM's paged MQA logits over the indexer K cache (``indexer_pages``). The
backends' hooks and start-up ask this module.
"""

import ast
import dataclasses
import functools
import importlib.metadata
import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.logger import init_logger
from vllm.models.deepseek_v41.nvidia.sparse_mla_kernel import (
    TRITON_MIN_CAPABILITY,
    SparseMLAKernel,
)
from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backend import AttentionBackend, MultipleOf
from vllm.v1.attention.backends.mla import indexer_pages
from vllm.v1.attention.backends.mla.compressor_utils import (
    get_dspark_swa_index_width,
)
from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWABackend

logger = init_logger(__name__)

BACKEND_NAME = "FLASHINFER_MLA_SPARSE_DSV41"
# SM10x reads plain BF16 or per-tensor FP8 rows; every other GPU runs the
# two-segment layer over the packed fp8_ds_mla record ("auto" resolves to it).
PLAIN_ROW_KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3")
PACKED_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_ds_mla")
# --block-size values a refusal checks and names as the ones that work.
BLOCK_SIZE_CHOICES = (16, 32, 64, 128, 256)


class UnsupportedSparseMLAConfig(ValueError):
    """A DeepSeek V4.1 configuration no sparse-MLA kernel here serves."""


@dataclass(frozen=True)
class SM120Envelope:
    """What FlashInfer's SM120 sparse-MLA decode kernels serve: ``page`` is
    the one page size they are built for (None: any, at run time) and
    ``serves(num_heads, topk)`` answers for a decode shape."""

    source: str
    page: int | None
    serves: Callable[[int, int], bool] = field(compare=False)


def _fixed_page_envelope(version: str) -> SM120Envelope | None:
    # A FlashInfer built for one page keeps its tables as module constants.
    # Read them from source: importing it touches CUDA, and hosts without a
    # GPU (the plan report) need the answer too.
    spec = importlib.util.find_spec("flashinfer")
    locations = spec.submodule_search_locations if spec else None
    source = Path(locations[0], "mla", "_sparse_mla_sm120.py") if locations else None
    text = source.read_text() if source and source.is_file() else ""
    page = re.search(r"^_DECODE_DSV4_PAGE_BLOCK_SIZE = (\d+)", text, re.M)
    table = re.search(
        r"^_DECODE_DSV4_DISPATCH = frozenset\((.*?)\)$", text, re.M | re.S
    )
    if not (page and table):
        return None
    pairs = frozenset(ast.literal_eval(table[1].strip()))
    return SM120Envelope(
        f"flashinfer {version}", int(page[1]), lambda h, k: (h, k) in pairs
    )


@functools.cache
def installed_sm120_envelope() -> SM120Envelope | str:
    """The installed FlashInfer's SM120 envelope, or why it has none."""
    from vllm.utils import flashinfer as fi

    try:
        version = importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        return "FlashInfer is not installed (flashinfer-python)"
    if envelope := _fixed_page_envelope(version):
        return envelope
    if not fi.has_flashinfer_sparse_mla_sm120():
        return f"flashinfer {version} has no SM120 sparse-MLA kernels"
    return SM120Envelope(
        f"flashinfer {version}", None, fi.has_flashinfer_sparse_mla_sm120_config
    )


@dataclass(frozen=True)
class SparseMLAPlan:
    """The KV-cache pages and kernel of DeepSeek V4.1 on one GPU.

    ``fixed_page`` is set when the kernel is built for one page size: the
    sliding-window cache then has pages of that many tokens and the compressed
    KV and indexer K caches that many states a page.
    """

    capability: DeviceCapability
    kernel: SparseMLAKernel
    fixed_page: int | None = None
    envelope: SM120Envelope | None = None
    padded_heads: int | None = None
    # Why the kernel is not the GPU's usual one, logged once at start-up.
    note: str | None = None

    @property
    def swa_block_size(self) -> int:
        return self.fixed_page or DeepseekSparseSWABackend.get_swa_block_size()

    def compressed_block_size(self, compress_ratio: int) -> int | None:
        """Tokens per compressed-KV page; None pages it with ``--block-size``."""
        if compress_ratio <= 0 or self.fixed_page is None:
            return None
        return self.fixed_page * compress_ratio

    def kernel_block_sizes(self) -> list[int | MultipleOf]:
        """The compressed-KV kernels' token pages, largest first; empty keeps
        the backend's own answer."""
        if self.fixed_page is not None:
            return indexer_pages.kernel_block_sizes(self.fixed_page)
        if self.kernel is SparseMLAKernel.TRITON:
            # Any page works, but the compressed caches share their groups'
            # kernel page with the indexer K caches: offer the indexer's.
            return indexer_pages.kernel_block_sizes()
        return []

    def serves(self, padded_heads: int, topk: int) -> bool:
        if self.kernel is not SparseMLAKernel.FLASHINFER_SM120 or not self.envelope:
            return True
        return self.envelope.serves(padded_heads, topk)


def plan_pages(
    capability: DeviceCapability, envelope: SM120Envelope | None = None
) -> SparseMLAPlan:
    """Return the pages and kernel for ``capability``; raise if no kernel runs
    there. ``envelope`` defaults to the installed FlashInfer's (SM12x only)."""
    if capability.major == 10:
        return SparseMLAPlan(capability, SparseMLAKernel.TRTLLM_GEN)
    if capability.major == 12:
        found = envelope or installed_sm120_envelope()
        if not isinstance(found, SM120Envelope):
            return _triton_plan(capability, found)
        kernel = SparseMLAKernel.FLASHINFER_SM120
        return SparseMLAPlan(capability, kernel, found.page, found)
    if capability.to_int() >= TRITON_MIN_CAPABILITY:
        return _triton_plan(capability)
    served = "SM10x (B200, GB200) and SM12x (RTX 50xx, RTX PRO 6000, GB10)"
    served += (
        f", and from SM{TRITON_MIN_CAPABILITY} on (H100, H200) through the "
        "portable Triton kernel"
    )
    raise UnsupportedSparseMLAConfig(
        f"{BACKEND_NAME} runs on {served}; this GPU is SM{capability.to_int()}. "
        "Choose another --attention-backend (FLASHMLA_SPARSE_DSV41 where "
        "FlashMLA runs)."
    )


def _triton_plan(capability: DeviceCapability, why: str | None = None) -> SparseMLAPlan:
    """The portable Triton kernel; on SM12x (``why``: FlashInfer has no SM120
    kernels here) the plan's note says so."""
    note = why and (
        f"{why}, so the portable Triton kernel runs DeepSeek V4.1's sparse MLA "
        f"on this SM{capability.to_int()} GPU. For FlashInfer's kernels install "
        "the flashinfer-python release this vLLM pins."
    )
    return SparseMLAPlan(capability, SparseMLAKernel.TRITON, note=note)


def current_plan() -> SparseMLAPlan | None:
    """The plan for this process's GPU; None with no GPU or one the backend
    refuses (start-up says why)."""
    capability = current_platform.get_device_capability()
    try:
        return plan_pages(capability) if capability else None
    except UnsupportedSparseMLAConfig:
        return None


def _refuse(message: str) -> None:
    raise UnsupportedSparseMLAConfig(f"DeepSeek V4.1 on {BACKEND_NAME}: {message}")


def check_kv_cache_dtype(capability: DeviceCapability, kv_cache_dtype: str) -> None:
    if capability.major == 10:
        allowed, why = PLAIN_ROW_KV_CACHE_DTYPES, "plain BF16 or per-tensor FP8 rows"
    else:
        allowed, why = PACKED_KV_CACHE_DTYPES, "the packed fp8_ds_mla record"
    if kv_cache_dtype not in allowed:
        _refuse(
            f"SM{capability.to_int()} reads {why}; --kv-cache-dtype "
            f"{kv_cache_dtype} is not served. Use one of: {', '.join(allowed)}."
        )


def swa_topk(
    window_size: int, use_non_causal: bool, num_speculative_tokens: int | None
) -> int:
    """The SWA index width the decode kernels see."""
    if use_non_causal and num_speculative_tokens:
        # Non-causal DSpark verification widens every SWA row.
        return get_dspark_swa_index_width(window_size, num_speculative_tokens)
    return window_size


def _triton_for_unserved_shape(plan: SparseMLAPlan, swa_topk: int) -> SparseMLAPlan:
    """Move a layer to the Triton kernel when FlashInfer's SM120 kernels lack
    its decode shape."""
    assert plan.padded_heads is not None
    if plan.serves(plan.padded_heads, swa_topk):
        return plan
    source = plan.envelope.source if plan.envelope else "FlashInfer"
    return dataclasses.replace(
        plan,
        kernel=SparseMLAKernel.TRITON,
        note=(
            f"{source} has no SM120 decode kernel for {plan.padded_heads} heads "
            f"with top-k {swa_topk}, so the Triton kernel runs this model. For "
            "FlashInfer's kernel, change the speculative token count or "
            "upgrade FlashInfer."
        ),
    )


@dataclass(frozen=True)
class PagedBackends:
    """The backends whose kernel pages a ``--block-size`` must suit (the
    sparse-MLA and the indexer backend), and the layer's head padding."""

    attention: type[AttentionBackend]
    indexer: type[AttentionBackend]
    pad_heads: Callable[[int], int] | None = None


def negotiate(
    capability: DeviceCapability,
    backends: PagedBackends,
    *,
    num_local_heads: int,
    kv_cache_dtype: str,
    swa_topk: int,
    block_size: int | None = None,
    envelope: SM120Envelope | None = None,
) -> SparseMLAPlan:
    """Every check start-up makes for a layer of these shapes (``block_size``:
    a --block-size the user set); return the plan or raise one error naming
    the fix."""
    assert backends.pad_heads is not None, "negotiation pads the layer's heads"
    plan = plan_pages(capability, envelope)
    check_kv_cache_dtype(capability, kv_cache_dtype)
    try:
        heads = backends.pad_heads(num_local_heads)
    except ValueError as e:
        _refuse(
            f"cannot run {num_local_heads} attention heads per GPU after "
            f"tensor parallelism: {e} Increase --tensor-parallel-size."
        )
    plan = dataclasses.replace(plan, padded_heads=heads)
    plan = _triton_for_unserved_shape(plan, swa_topk)
    if block_size is not None:
        check_block_size(block_size, plan, backends)
    return plan


def _block_size_refusal(
    block_size: int, plan: SparseMLAPlan, backends: PagedBackends
) -> str | None:
    """Why ``--block-size`` cannot page this model's caches (None: it can).

    vLLM groups caches of one page size and gives each group a kernel page
    every backend in it takes; an indexer cache whose page is ``--block-size``
    shares the compressed caches' group.
    """
    from vllm.v1.worker.utils import select_common_block_size

    backend = backends.attention
    if block_size < 1:
        return "it is not a positive page size"
    if plan.fixed_page is not None:
        return None  # every cache has the plan's pages; --block-size pages none
    if not backend.supports_block_size(block_size):
        sizes = [
            s.base if isinstance(s, MultipleOf) else s
            for s in backend.get_supported_kernel_block_sizes()
        ]
        return f"the attention kernels take pages of {sizes} tokens"
    # Binding never splits a block of a ratio-1 cache (one token a state)
    # into kernel pages, whatever its record: its kernels must take
    # --block-size itself.
    try:
        own_page = select_common_block_size(block_size, [backend])
        joined = [
            r
            for r in indexer_pages.DSV41_COMPRESS_RATIOS
            if indexer_pages.block_size(r) == block_size
        ]
        group = [backend, backends.indexer] if joined else [backend]
        kernel_page = select_common_block_size(block_size, group)
    except ValueError:
        return f"no kernel page of the compressed KV caches divides {block_size}"
    if own_page != block_size:
        return (
            f"the compressed KV caches' {block_size}-token blocks cannot be "
            f"split into the kernels' {own_page}-token pages"
        )
    if joined and kernel_page != block_size:
        return (
            f"the ratio-{joined[0]} indexer K cache would get kernel pages of "
            f"{kernel_page // joined[0]} states; DeepGEMM's paged MQA logits "
            f"read {indexer_pages.INDEXER_STATES}"
        )
    return None


def check_block_size(
    block_size: int, plan: SparseMLAPlan, backends: PagedBackends
) -> None:
    """Refuse a ``--block-size`` some kernel of the model cannot read, naming
    the sizes that work."""
    why = _block_size_refusal(block_size, plan, backends)
    if why is None:
        return
    working = [
        s for s in BLOCK_SIZE_CHOICES if _block_size_refusal(s, plan, backends) is None
    ]
    raise UnsupportedSparseMLAConfig(
        f"--block-size {block_size} cannot page DeepSeek V4.1's KV caches on "
        f"this GPU: {why}. Use one of {working} (or leave --block-size unset)."
    )


def negotiate_layer(vllm_config: VllmConfig, backends: PagedBackends) -> SparseMLAPlan:
    """Negotiate for a layer about to be built; log once why a fallback runs."""
    capability = current_platform.get_device_capability()
    if capability is None:
        _refuse("it needs a CUDA GPU; none was found.")
    hf_config = vllm_config.model_config.hf_config
    speculative = vllm_config.speculative_config
    cache_config = vllm_config.cache_config
    plan = negotiate(
        capability,
        backends,
        num_local_heads=hf_config.num_attention_heads
        // get_tensor_model_parallel_world_size(),
        kv_cache_dtype=cache_config.cache_dtype,
        swa_topk=swa_topk(
            hf_config.sliding_window,
            vllm_config.attention_config.use_non_causal,
            speculative.num_speculative_tokens if speculative else None,
        ),
        block_size=(
            cache_config.block_size if cache_config.user_specified_block_size else None
        ),
    )
    if plan.note:
        logger.warning_once(plan.note)
    fixed = plan.fixed_page
    logger.info_once(
        "DeepSeek V4.1 sparse MLA on %s: %s kernel on SM%d; pages: sliding "
        "window %d tokens, compressed KV %s, indexer K %d states",
        BACKEND_NAME,
        plan.kernel.value,
        capability.to_int(),
        plan.swa_block_size,
        f"{fixed} states" if fixed else "--block-size tokens",
        indexer_pages.INDEXER_STATES,
    )
    return plan


def unsupported_reason(
    capability: DeviceCapability,
    kv_cache_dtype: str | None,
    block_size: int | None,
    backends: PagedBackends,
) -> str | None:
    """Why the backend cannot run on ``capability`` with this cache dtype and
    ``--block-size`` (None: it can): the start-up checks that need no model."""
    try:
        plan = plan_pages(capability)
        check_kv_cache_dtype(capability, kv_cache_dtype or "auto")
        if block_size is not None:
            check_block_size(block_size, plan, backends)
    except UnsupportedSparseMLAConfig as e:
        return str(e)
    return None
