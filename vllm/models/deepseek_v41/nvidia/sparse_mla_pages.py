# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""KV-cache pages and kernel choice for DeepSeek V4.1 sparse MLA on NVIDIA.

Every kernel that reads a DeepSeek V4.1 KV-cache page has its own rule:
FlashInfer's SM120 sparse-MLA kernels (one page size, or any, by release), the
TRTLLM-gen kernels on SM10x (any page) and DeepGEMM's paged MQA logits, which
read the indexer's K cache in pages of a fixed number of compressed states
(``indexer_pages``). This module answers, for a GPU and the installed
libraries, the page of each cache and the kernel that reads it; the backends'
hooks ask it and nothing else decides a page size.
"""

import ast
import dataclasses
import enum
import functools
import importlib.metadata
import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backend import AttentionBackend, MultipleOf
from vllm.v1.attention.backends.mla.compressor_utils import (
    get_dspark_swa_index_width,
)
from vllm.v1.attention.backends.mla.indexer_pages import (
    DSV41_COMPRESS_RATIOS,
    IndexerPages,
    indexer_pages,
)
from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWABackend

logger = init_logger(__name__)

BACKEND_NAME = "FLASHINFER_MLA_SPARSE_DSV41"
# SM10x reads plain BF16 or per-tensor FP8 rows; every other GPU runs the
# two-segment layer over the packed fp8_ds_mla record ("auto" resolves to it).
PLAIN_ROW_KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3")
PACKED_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_ds_mla")
# The Triton kernel reads FP8 E4M3 records, which Triton lowers from SM89 on.
TRITON_MIN_CAPABILITY = 89
# --block-size values a refusal checks and names as the ones that work.
BLOCK_SIZE_CHOICES = (16, 32, 64, 128, 256)
# Compressed-KV kernel page of FlashInfer's SM120 kernels that take the page
# size at run time.
SM120_RUNTIME_KERNEL_PAGE = 64


class SparseMLAKernel(enum.Enum):
    """The kernels that run DeepSeek V4.1's sparse-MLA decode."""

    TRTLLM_GEN = "flashinfer-trtllm-gen"
    FLASHINFER_SM120 = "flashinfer-sm120"
    TRITON = "triton"
    FLASHMLA = "flashmla"


class UnsupportedSparseMLAConfig(ValueError):
    """A DeepSeek V4.1 configuration no sparse-MLA kernel here serves."""


@dataclass(frozen=True)
class SM120Envelope:
    """What the installed FlashInfer's SM120 sparse-MLA decode kernels serve.

    ``page_sizes`` is None when any positive page size is taken at run time;
    ``serves(num_heads, topk)`` answers for the DSV4 kernel family and
    ``served`` says the same in words, for messages.
    """

    source: str
    page_sizes: frozenset[int] | None
    serves: Callable[[int, int], bool] = field(compare=False)
    served: str

    @classmethod
    def from_dispatch_table(
        cls, version: str, page_size: int, dispatch: Iterable[tuple[int, int]]
    ) -> "SM120Envelope":
        pairs = frozenset((int(h), int(k)) for h, k in dispatch)
        return cls(
            source=f"flashinfer {version} (fixed dispatch table)",
            page_sizes=frozenset({int(page_size)}),
            serves=lambda heads, topk: (heads, topk) in pairs,
            served=(
                f"heads {sorted({h for h, _ in pairs})} and "
                f"top-k {sorted({k for _, k in pairs})}"
            ),
        )

    @classmethod
    def from_decode_config(cls, version: str, config: Any) -> "SM120Envelope":
        """From a ``flashinfer.mla.supported_sparse_mla_sm120_configs()`` entry."""
        page_sizes: frozenset[int] | None = None
        if not getattr(config, "page_block_size_is_runtime", False):
            page_sizes = frozenset(config.page_block_sizes) or frozenset(
                {config.page_block_size}
            )
        page = None if page_sizes is None else min(page_sizes)
        return cls(
            source=f"flashinfer {version} (supported_sparse_mla_sm120_configs)",
            page_sizes=page_sizes,
            serves=lambda heads, topk: bool(
                config.supports_decode(heads, topk, page_block_size=page)
            ),
            served=_describe_decode_config(config),
        )


def _describe_decode_config(config: Any) -> str:
    heads = list(config.supported_num_heads())
    if heads == list(range(heads[0], heads[-1] + 1)):
        head_text = f"heads {heads[0]}-{heads[-1]}"
    else:
        head_text = f"heads {heads}"
    if config.topk_is_runtime:
        return f"{head_text} and any top-k from {config.min_topk}"
    return f"{head_text} and top-k {sorted(config.topks)}"


def _flashinfer_version() -> str | None:
    try:
        return importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        return None


def _read_dispatch_table(version: str) -> SM120Envelope | None:
    """The fixed-page tables of a FlashInfer that keeps them as module
    constants, read from its source: importing FlashInfer there touches CUDA,
    and the answer is needed on hosts without a GPU too."""
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(spec.submodule_search_locations[0], "mla", "_sparse_mla_sm120.py")
    if not source.is_file():
        return None
    wanted = ("_DECODE_DSV4_DISPATCH", "_DECODE_DSV4_PAGE_BLOCK_SIZE")
    values: dict[str, Any] = {}
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            name = getattr(node.targets[0], "id", None)
            if name in wanted:
                value = node.value
                # frozenset({...}): evaluate the literal inside.
                if isinstance(value, ast.Call) and value.args:
                    value = value.args[0]
                values[name] = ast.literal_eval(value)
    if set(values) != set(wanted):
        return None
    return SM120Envelope.from_dispatch_table(
        version, values[wanted[1]], values[wanted[0]]
    )


def _family_for_record(bytes_per_token: int) -> str:
    # FlashInfer names the 584-byte record's family dsv4, the 528-byte one dsv4_1.
    return "dsv4_1" if bytes_per_token == 528 else "dsv4"


@functools.cache
def _installed_sm120(bytes_per_token: int) -> tuple[SM120Envelope | None, str | None]:
    """The installed FlashInfer's SM120 envelope, or None and why not."""
    version = _flashinfer_version()
    if version is None:
        return None, "FlashInfer is not installed (flashinfer-python)"
    if envelope := _read_dispatch_table(version):
        return envelope, None
    try:
        from flashinfer.mla import supported_sparse_mla_sm120_configs
    except ImportError as e:
        return None, (
            f"flashinfer {version} offers no SM120 sparse-MLA configuration "
            f"({type(e).__name__}: {e})"
        )
    family = _family_for_record(bytes_per_token)
    config = supported_sparse_mla_sm120_configs().get(family)
    if config is None:
        return None, f"flashinfer {version} has no SM120 {family} kernels"
    return SM120Envelope.from_decode_config(version, config), None


def installed_sm120_envelope(bytes_per_token: int = 584) -> SM120Envelope | None:
    """The SM120 envelope of the installed FlashInfer; None if it has none."""
    return _installed_sm120(bytes_per_token)[0]


def sm120_unavailable_reason(bytes_per_token: int = 584) -> str | None:
    """Why the installed FlashInfer serves no SM120 kernel (None if it does)."""
    return _installed_sm120(bytes_per_token)[1]


@dataclass(frozen=True)
class SparseMLAPlan:
    """The KV-cache pages and kernel of DeepSeek V4.1 on one GPU.

    ``fixed_page`` is set when the kernel is built for one page size: then the
    sliding-window cache has pages of that many tokens and the compressed KV
    that many states per page; None keeps vLLM's pages.
    """

    capability: DeviceCapability
    kernel: SparseMLAKernel
    fixed_page: int | None
    indexer: IndexerPages
    envelope: SM120Envelope | None = None
    # The model's shapes, once negotiate() has checked them.
    padded_heads: int | None = None
    swa_topks: tuple[int, ...] = ()
    kv_cache_dtype: str | None = None
    # Why the kernel is not the GPU's usual one, logged once at start-up.
    note: str | None = None

    @property
    def packed(self) -> bool:
        """Whether the layer reads packed fp8_ds_mla records (every kernel but
        SM10x's TRTLLM-gen, which reads plain rows)."""
        return self.kernel is not SparseMLAKernel.TRTLLM_GEN

    @property
    def swa_block_size(self) -> int:
        """Tokens per sliding-window page."""
        return self.fixed_page or DeepseekSparseSWABackend.get_swa_block_size()

    def compressed_block_size(self, compress_ratio: int) -> int | None:
        """Tokens per compressed-KV page of a layer of ``compress_ratio``;
        None pages it with ``--block-size``."""
        if compress_ratio <= 0 or self.fixed_page is None:
            return None
        return self.fixed_page * compress_ratio

    def kernel_block_sizes(self) -> list[int | MultipleOf]:
        """Token pages the compressed-KV kernels take, largest first; empty
        when the kernels take vLLM's pages as they are."""
        if self.fixed_page is not None:
            return [self.fixed_page * r for r in sorted(DSV41_COMPRESS_RATIOS)[::-1]]
        if self.kernel is SparseMLAKernel.FLASHINFER_SM120:
            # Pages of any size reach the kernels at run time, but their
            # sparse-MLA blocks are 64 tokens (128 trips block_kv, #59203).
            return [SM120_RUNTIME_KERNEL_PAGE]
        if self.kernel is SparseMLAKernel.TRITON:
            # The Triton kernel takes any page, but the compressed caches share
            # their page groups with the indexer K caches: offer the pages
            # the indexer's kernels read, so one kernel page serves both.
            return list(self.indexer.kernel_block_sizes())
        return []

    def serves(self, padded_heads: int, topk: int) -> bool:
        """Whether the plan's kernel runs this decode shape."""
        if self.kernel is not SparseMLAKernel.FLASHINFER_SM120 or not self.envelope:
            return True
        return self.envelope.serves(padded_heads, topk)


def plan_pages(
    capability: DeviceCapability, envelope: SM120Envelope | None = None
) -> SparseMLAPlan:
    """Return the pages and kernel for ``capability``; raise if no kernel runs
    there. ``envelope`` defaults to the installed FlashInfer's (SM12x only)."""
    indexer = indexer_pages(capability)
    if capability.major == 10:
        # TRTLLM-gen takes the page size at run time.
        return SparseMLAPlan(capability, SparseMLAKernel.TRTLLM_GEN, None, indexer)
    if capability.major == 12:
        envelope = envelope or installed_sm120_envelope()
        if envelope is None:
            return _triton_plan(capability, indexer)
        page = min(envelope.page_sizes) if envelope and envelope.page_sizes else None
        return SparseMLAPlan(
            capability, SparseMLAKernel.FLASHINFER_SM120, page, indexer, envelope
        )
    if capability.to_int() >= TRITON_MIN_CAPABILITY:
        return _triton_plan(capability, indexer)
    served = (
        "SM10x (B200, GB200) and SM12x (RTX 50xx, RTX PRO 6000, GB10) through "
        "FlashInfer"
    )
    served += (
        f", and on other GPUs from SM{TRITON_MIN_CAPABILITY} on (L40S, H100, "
        "H200) through the portable Triton kernel"
    )
    raise UnsupportedSparseMLAConfig(
        f"{BACKEND_NAME} runs on {served}; this GPU is SM{capability.to_int()}. "
        "Choose another --attention-backend (FLASHMLA_SPARSE_DSV41 where "
        "FlashMLA runs)."
    )


def _triton_plan(capability: DeviceCapability, indexer: IndexerPages) -> SparseMLAPlan:
    """The portable Triton kernel, which reads any page; on SM12x it stands in
    for FlashInfer's SM120 kernels, and the plan's note says why."""
    note = None
    if capability.major == 12:
        note = (
            f"{sm120_unavailable_reason() or 'no FlashInfer SM120 kernels'}, so "
            "the portable Triton kernel runs DeepSeek V4.1's sparse MLA on this "
            f"SM{capability.to_int()} GPU. For FlashInfer's kernels install "
            "the flashinfer-python release this vLLM pins."
        )
    return SparseMLAPlan(capability, SparseMLAKernel.TRITON, None, indexer, note=note)


def current_plan() -> SparseMLAPlan | None:
    """The plan for this process's GPU; None with no GPU or one the backend
    refuses (start-up says why)."""
    capability = current_platform.get_device_capability()
    if capability is None:
        return None
    try:
        return plan_pages(capability)
    except UnsupportedSparseMLAConfig:
        return None


def _refuse(message: str) -> None:
    raise UnsupportedSparseMLAConfig(f"DeepSeek V4.1 on {BACKEND_NAME}: {message}")


def pad_q_heads(num_local_heads: int, pad_heads: Callable[[int], int]) -> int:
    """The head count the kernels run ``num_local_heads`` at, as the layer's
    ``pad_heads`` (its ``get_padded_num_q_heads``) answers."""
    try:
        return pad_heads(num_local_heads)
    except ValueError as e:
        raise UnsupportedSparseMLAConfig(
            f"{BACKEND_NAME} cannot run {num_local_heads} attention heads per "
            f"GPU after tensor parallelism: {e} Increase --tensor-parallel-size."
        ) from None


def check_kv_cache_dtype(capability: DeviceCapability, kv_cache_dtype: str) -> None:
    """Raise unless the layer built on ``capability`` reads ``kv_cache_dtype``."""
    if capability.major == 10:
        allowed, why = PLAIN_ROW_KV_CACHE_DTYPES, "plain BF16 or per-tensor FP8 rows"
    else:
        allowed, why = PACKED_KV_CACHE_DTYPES, "the packed fp8_ds_mla record"
    if kv_cache_dtype not in allowed:
        raise UnsupportedSparseMLAConfig(
            f"{BACKEND_NAME} on SM{capability.to_int()} reads {why}; "
            f"--kv-cache-dtype {kv_cache_dtype} is not served. Use one of: "
            f"{', '.join(allowed)}."
        )


def swa_topks(
    window_size: int, use_non_causal: bool, num_speculative_tokens: int | None
) -> tuple[int, ...]:
    """The SWA index widths the decode kernels see for this model."""
    if use_non_causal and num_speculative_tokens:
        # Non-causal DSpark verification widens every SWA row.
        return (get_dspark_swa_index_width(window_size, num_speculative_tokens),)
    return (window_size,)


def negotiate(
    capability: DeviceCapability,
    *,
    num_local_heads: int,
    pad_heads: Callable[[int], int],
    kv_cache_dtype: str,
    swa_topks: Iterable[int],
    envelope: SM120Envelope | None = None,
) -> SparseMLAPlan:
    """Return the plan for a model of these attention shapes, or raise one
    error naming the fix."""
    plan = plan_pages(capability, envelope)
    check_kv_cache_dtype(capability, kv_cache_dtype)
    plan = dataclasses.replace(
        plan,
        padded_heads=pad_q_heads(num_local_heads, pad_heads),
        swa_topks=tuple(sorted(set(swa_topks))),
        kv_cache_dtype=kv_cache_dtype,
    )
    plan = _triton_for_unserved_shapes(plan)
    return plan


def _triton_for_unserved_shapes(plan: SparseMLAPlan) -> SparseMLAPlan:
    """Move a model to the Triton kernel when FlashInfer's SM120 kernels lack
    one of its decode shapes."""
    assert plan.padded_heads is not None
    heads = plan.padded_heads
    missing = [k for k in plan.swa_topks if not plan.serves(heads, k)]
    if not missing or plan.envelope is None:
        return plan
    return dataclasses.replace(
        plan,
        kernel=SparseMLAKernel.TRITON,
        note=(
            f"{plan.envelope.source} has no SM120 decode kernel for {heads} "
            f"heads with top-k {missing} (it serves {plan.envelope.served}), "
            "so the Triton kernel runs this model. For FlashInfer's kernel, "
            "change the speculative token count or upgrade FlashInfer."
        ),
    )


def _check_model_shape(hf_config: Any, tensor_parallel_size: int) -> int:
    """Refuse model values no DeepSeek V4.1 layer is built with; return the
    attention heads per GPU."""
    heads = hf_config.num_attention_heads
    if heads <= 0:
        _refuse(f"the model has {heads} attention heads; it needs at least one.")
    if hf_config.sliding_window <= 0:
        _refuse(f"sliding_window is {hf_config.sliding_window}; it must be positive.")
    unknown = sorted(
        {r for r in hf_config.compress_ratios if r and r not in DSV41_COMPRESS_RATIOS}
    )
    if unknown:
        _refuse(
            f"compress ratios {unknown} are not DeepSeek V4.1's: its layers are "
            "sliding-window only (0) or compressed with ratio "
            f"{' or '.join(map(str, DSV41_COMPRESS_RATIOS))}."
        )
    if tensor_parallel_size < 1:
        _refuse(f"--tensor-parallel-size {tensor_parallel_size} must be at least 1.")
    if heads % tensor_parallel_size:
        sizes = [tp for tp in range(1, min(heads, 64) + 1) if heads % tp == 0]
        _refuse(
            f"{heads} attention heads cannot be split evenly over "
            f"--tensor-parallel-size {tensor_parallel_size}. Use one of {sizes}."
        )
    return heads // tensor_parallel_size


def negotiate_for_model(
    capability: DeviceCapability,
    hf_config: Any,
    backends: "PagedBackends",
    *,
    tensor_parallel_size: int,
    kv_cache_dtype: str | None,
    use_non_causal: bool = False,
    num_speculative_tokens: int | None = None,
    block_size: int | None = None,
    envelope: SM120Envelope | None = None,
) -> SparseMLAPlan:
    """Every check start-up makes for a DeepSeek V4.1 model on ``capability``
    and the plan it negotiates; raises the one error start-up raises."""
    assert backends.pad_heads is not None, "negotiation pads the layer's heads"
    local_heads = _check_model_shape(hf_config, tensor_parallel_size)
    if num_speculative_tokens is not None and num_speculative_tokens < 0:
        _refuse(f"{num_speculative_tokens} speculative tokens is not a count.")
    plan = negotiate(
        capability,
        num_local_heads=local_heads,
        pad_heads=backends.pad_heads,
        kv_cache_dtype=kv_cache_dtype or "auto",
        swa_topks=swa_topks(
            hf_config.sliding_window, use_non_causal, num_speculative_tokens
        ),
        envelope=envelope,
    )
    if block_size is not None:
        check_block_size(block_size, plan, backends)
    return plan


@dataclass(frozen=True)
class PagedBackends:
    """The backends whose kernel pages a ``--block-size`` must suit: the
    sparse-MLA backend (its compressed-KV kernels) and the indexer backend,
    with the layer's padding of its heads to a count the kernels take."""

    attention: type[AttentionBackend]
    indexer: type[AttentionBackend]
    pad_heads: Callable[[int], int] | None = None


def _block_size_refusal(
    block_size: int, plan: SparseMLAPlan, backends: PagedBackends
) -> str | None:
    """Why ``--block-size`` cannot page this model's caches (None: it can).

    The compressed-KV caches take ``--block-size`` unless the plan fixes their
    pages. vLLM groups caches of one page size and gives each group a kernel
    page every backend in it takes, so an indexer cache whose page equals
    ``--block-size`` shares the compressed caches' kernel page.
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
    # Binding splits a block into kernel pages only where the block is one
    # dense page (never for these packed caches) or, where vLLM maps packed
    # blocks to kernel pages (AttentionGroup.map_kv_cache_to_kernel_blocks),
    # for caches of more than one token a state: a ratio-1 cache of packed
    # records is bound whole, so its kernels must take --block-size itself.
    from vllm.v1.worker.utils import AttentionGroup

    try:
        own_page = select_common_block_size(block_size, [backend])
    except ValueError:
        return f"no kernel page of the compressed KV caches divides {block_size}"
    maps_packed_blocks = hasattr(AttentionGroup, "map_kv_cache_to_kernel_blocks")
    if own_page != block_size and (plan.packed or not maps_packed_blocks):
        return (
            f"the compressed KV caches' packed {block_size}-token blocks cannot "
            f"be split into the kernels' {own_page}-token pages"
        )
    joined = [
        r for r in DSV41_COMPRESS_RATIOS if plan.indexer.block_size(r) == block_size
    ]
    group = [backend, backends.indexer] if joined else [backend]
    try:
        kernel_page = select_common_block_size(block_size, group)
    except ValueError:
        return f"no kernel page of the compressed KV caches divides {block_size}"
    if joined and kernel_page != block_size:
        return (
            f"the ratio-{joined[0]} indexer K cache would get kernel pages of "
            f"{kernel_page // joined[0]} states; {plan.indexer.deepgemm} reads "
            f"{plan.indexer.states_per_page}"
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


def check_flashmla_block_size(
    vllm_config: VllmConfig, backend: type[AttentionBackend]
) -> None:
    """Refuse, while a FlashMLA layer is built, a ``--block-size`` its packed
    caches cannot be bound with, rather than after the weights load."""
    from vllm.v1.attention.backends.mla.indexer import DeepseekV41IndexerBackend

    capability = current_platform.get_device_capability()
    cache_config = vllm_config.cache_config
    if capability is None or not cache_config.user_specified_block_size:
        return
    plan = SparseMLAPlan(
        capability, SparseMLAKernel.FLASHMLA, None, indexer_pages(capability)
    )
    backends = PagedBackends(backend, DeepseekV41IndexerBackend)
    check_block_size(cache_config.block_size, plan, backends)


def negotiate_layer(vllm_config: VllmConfig, backends: PagedBackends) -> SparseMLAPlan:
    """Negotiate for a layer about to be built; raises the error for a
    configuration no kernel serves and logs once why a fallback runs."""
    capability = current_platform.get_device_capability()
    if capability is None:
        raise UnsupportedSparseMLAConfig(
            f"{BACKEND_NAME} needs a CUDA GPU; none was found."
        )
    speculative = vllm_config.speculative_config
    cache_config = vllm_config.cache_config
    plan = negotiate_for_model(
        capability,
        vllm_config.model_config.hf_config,
        backends,
        tensor_parallel_size=get_tensor_model_parallel_world_size(),
        kv_cache_dtype=cache_config.cache_dtype,
        use_non_causal=vllm_config.attention_config.use_non_causal,
        num_speculative_tokens=(
            speculative.num_speculative_tokens if speculative else None
        ),
        # An unset --block-size is replaced by the backend's preferred size
        # only after the model is built.
        block_size=(
            cache_config.block_size if cache_config.user_specified_block_size else None
        ),
    )
    if plan.note:
        logger.warning_once(plan.note)
    return plan


def preferred_block_size(
    default_block_size: int, kernel_block_sizes: list[int | MultipleOf]
) -> int:
    """The ``--block-size`` to use when the user set none: the default when a
    compressed-KV kernel takes it, else the largest page one does."""
    sizes = [s.base if isinstance(s, MultipleOf) else s for s in kernel_block_sizes]
    return default_block_size if default_block_size in sizes else max(sizes)


def supports_compute_capability(capability: DeviceCapability) -> bool:
    try:
        plan_pages(capability)
    except UnsupportedSparseMLAConfig:
        return False
    return True


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
