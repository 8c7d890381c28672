# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""KV-cache page sizes for DeepSeek V4.1 sparse MLA through FlashInfer.

The one place that decides, for a GPU architecture, the installed FlashInfer,
a KV-cache dtype and a layer kind, how many tokens a KV-cache page holds and
whether the attention shape is served at all. Backends, attention layers and
the plan report ask this module; nothing else decides page sizes.

What FlashInfer serves is read from FlashInfer itself:

* 0.6.14 - 0.6.18: the SM120 DSV4 decode kernels are instantiated for one page
  size (``_DECODE_DSV4_PAGE_BLOCK_SIZE``) and a fixed set of
  ``(num_heads, topk)`` pairs (``_DECODE_DSV4_DISPATCH``). Importing FlashInfer
  touches CUDA in these releases, so the two tables are read from the module's
  source without executing it, which also works on GPU-less hosts.
* 0.7 and later: ``flashinfer.mla.supported_sparse_mla_sm120_configs()``
  describes each kernel family, page sizes chosen at run time included.

Where FlashInfer has no kernel (SM90, an SM12x FlashInfer without SM120
kernels, or a shape its SM120 tables lack) the portable Triton kernel, which has
the same two-segment contract and takes any page size, runs instead.
"""

import ast
import functools
import importlib.metadata
import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm import envs
from vllm.platforms.interface import DeviceCapability

# KV-cache dtypes each kernel family reads (the SM120 kernels read the packed
# fp8_ds_mla record; TRTLLM-gen reads plain BF16 or per-tensor FP8 rows).
SM100_KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3")
SM120_KV_CACHE_DTYPES = ("fp8", "fp8_e4m3", "fp8_ds_mla")
BACKEND_NAME = "FLASHINFER_MLA_SPARSE_DSV41"
# DeepSeek V4.1 layers: 0 = sliding window only, 1 and 2 = compressed KV.
DSV41_COMPRESS_RATIOS = (1, 2)

# The kernels a plan can choose.
TRTLLM_GEN = "flashinfer-trtllm-gen"
FLASHINFER_SM120 = "flashinfer-sm120"
TRITON = "triton"
# The Triton kernel reads FP8 E4M3 records, which Triton lowers from SM89 on;
# it is tested on SM90.
TRITON_MIN_CAPABILITY = 89

# Test-only: "1" makes a GPU whose plan is the Triton kernel on upstream's
# pages take the SM12x pages of FlashInfer 0.6.14-0.6.18 instead (64-token
# SWA pages, 64 compressed states per page), so that geometry can run through
# vLLM's whole engine on an H100/H200, where the Triton kernel takes any page.
# No production path sets it; the plan's start-up note says it is on. vLLM
# reads it (vllm/envs.py), which also keeps start-up from calling it unknown.
FORCE_SM12X_PAGES_ENV = "VLLM_DSV41_TEST_FORCE_SM12X_PAGES"
SM12X_FIXED_PAGE = 64


@dataclass(frozen=True)
class SM120Envelope:
    """What the installed FlashInfer's SM120 sparse-MLA decode kernels serve.

    ``page_sizes`` is None when any positive page size is accepted at run
    time. ``serves(num_heads, topk)`` answers for the DSV4 family.
    """

    source: str
    page_sizes: frozenset[int] | None
    serves: Callable[[int, int], bool] = field(compare=False)
    # What it serves, in words, for messages ("heads [...] and top-k [...]").
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
        """From a FlashInfer 0.7+ ``SparseMLASm120DecodeConfig``-like object."""
        if config.page_block_size_is_runtime:
            page_sizes = None
        else:
            page_sizes = frozenset(config.page_block_sizes) or frozenset(
                {config.page_block_size}
            )
        return cls(
            source=f"flashinfer {version} (supported_sparse_mla_sm120_configs)",
            page_sizes=page_sizes,
            serves=lambda heads, topk: bool(
                config.supports_decode(
                    heads,
                    topk,
                    page_block_size=None if page_sizes is None else min(page_sizes),
                )
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


def _read_static_tables(version: str) -> SM120Envelope | None:
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(spec.submodule_search_locations[0], "mla", "_sparse_mla_sm120.py")
    if not source.is_file():
        return None
    values: dict[str, Any] = {}
    wanted = ("_DECODE_DSV4_DISPATCH", "_DECODE_DSV4_PAGE_BLOCK_SIZE")
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            name = getattr(node.targets[0], "id", None)
            if name in wanted:
                value = node.value
                # frozenset({...}) literal: evaluate the set inside.
                if isinstance(value, ast.Call) and value.args:
                    value = value.args[0]
                values[name] = ast.literal_eval(value)
    if set(values) != set(wanted):
        return None
    return SM120Envelope.from_dispatch_table(
        version, values[wanted[1]], values[wanted[0]]
    )


def _family_for_record(bytes_per_token: int) -> str:
    # FlashInfer names the 584-byte record's family dsv4 and the 528-byte
    # MXFP8 record's family dsv4_1.
    return "dsv4_1" if bytes_per_token == 528 else "dsv4"


@functools.cache
def _installed_sm120(bytes_per_token: int) -> tuple[SM120Envelope | None, str | None]:
    """The installed FlashInfer's SM120 envelope, or None and why not."""
    version = _flashinfer_version()
    if version is None:
        return None, "FlashInfer is not installed (flashinfer-python)"
    major_minor = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if major_minor >= (0, 7):
        try:
            from flashinfer.mla import supported_sparse_mla_sm120_configs

            configs = supported_sparse_mla_sm120_configs()
        except Exception as e:  # any failure means: no usable SM120 kernels
            return None, (
                f"flashinfer {version} is installed but its SM120 sparse-MLA "
                f"configuration failed to load ({type(e).__name__}: {e})"
            )
        family = _family_for_record(bytes_per_token)
        config = configs.get(family)
        if config is None:
            return None, f"flashinfer {version} has no SM120 {family} kernels"
        return SM120Envelope.from_decode_config(version, config), None
    envelope = _read_static_tables(version)
    if envelope is None:
        return None, f"flashinfer {version} has no SM120 sparse-MLA decode kernels"
    return envelope, None


def installed_sm120_envelope(bytes_per_token: int = 584) -> SM120Envelope | None:
    """The SM120 envelope of the installed FlashInfer; None if it has none."""
    return _installed_sm120(bytes_per_token)[0]


def sm120_unavailable_reason(bytes_per_token: int = 584) -> str | None:
    """Why the installed FlashInfer serves no SM120 kernel (None if it does)."""
    return _installed_sm120(bytes_per_token)[1]


class UnsupportedSparseMLAConfig(ValueError):
    """A DeepSeek V4.1 configuration no sparse-MLA kernel here serves."""


# The sparse indexer's paged-MQA kernels (DeepGEMM) read its K cache in pages
# of a fixed number of compressed states, FP8 keys. Counts each release's
# host check takes, by GPU major (read from the library; tests hold this
# table against the shipped one). Any other release is planned at
# INDEXER_STATES and confirmed by DeepGEMM itself at start-up.
DEEPGEMM_INDEXER_STATES: dict[str, dict[int, frozenset[int]]] = {
    # deepseek-ai's release, as built from its sources.
    "2.6.1": {9: frozenset({64})},
    "2.8.0": {
        9: frozenset({32, 64}),
        10: frozenset({32, 64, 128}),
        12: frozenset({64}),
    },
    "2.8.1": {
        9: frozenset({32, 64}),
        10: frozenset({32, 64, 128}),
        12: frozenset({32, 64}),
    },
}
# Taken by every release above on every GPU it serves.
INDEXER_STATES = 64
# The states-per-page counts start-up asks DeepGEMM about when refusing.
INDEXER_STATE_CANDIDATES = (32, 64, 128)


def _installed_deepgemm() -> tuple[str, str] | None:
    """The DeepGEMM vLLM will use (a standalone ``deep_gemm`` before the
    vendored copy, as ``vllm.utils.import_utils.has_deep_gemm`` prefers it):
    its version and which one it is. Read without importing it (that loads
    its compiled part, which needs the GPU's torch)."""
    for module, where in (
        ("deep_gemm", "standalone"),
        ("vllm.third_party.deep_gemm", "vendored"),
    ):
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            spec = None
        if spec is None or spec.origin is None:
            continue
        version = "unknown"
        for node in ast.parse(Path(spec.origin).read_text()).body:
            if (
                isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", None) == "__version__"
                and isinstance(node.value, ast.Constant)
            ):
                version = str(node.value.value)
        return version, where
    return None


@dataclass(frozen=True)
class IndexerPages:
    """The indexer K caches' pages on one GPU: ``states_per_page`` compressed
    states, so a layer of compress ratio r gets pages of that many times r
    tokens, like the compressed KV it indexes."""

    states_per_page: int
    # What DeepGEMM takes here (None: not known without asking it) and which
    # DeepGEMM was trusted, in words.
    accepted: frozenset[int] | None
    deepgemm: str

    def block_size(self, compress_ratio: int) -> int:
        """Tokens per indexer K-cache page of a layer of ``compress_ratio``."""
        return self.states_per_page * max(compress_ratio, 1)

    def kernel_block_sizes(self, compress_ratios: Iterable[int]) -> list[int]:
        """Token pages of the indexer kernels for these ratios, largest first."""
        return sorted({self.block_size(r) for r in compress_ratios}, reverse=True)


@functools.cache
def plan_indexer_pages(capability: DeviceCapability) -> IndexerPages:
    """The indexer K-cache pages for ``capability`` and the installed DeepGEMM."""
    installed = _installed_deepgemm()
    if installed is None:
        return IndexerPages(INDEXER_STATES, None, "no DeepGEMM installed")
    version, where = installed
    accepted = DEEPGEMM_INDEXER_STATES.get(version, {}).get(capability.major)
    states = INDEXER_STATES
    if accepted is not None and INDEXER_STATES not in accepted:
        states = max(accepted)
    return IndexerPages(states, accepted, f"DeepGEMM {version} ({where})")


def _deepgemm_takes(states_per_page: int) -> bool:
    """Ask the installed DeepGEMM whether its paged-MQA planner takes pages of
    ``states_per_page`` on this GPU (a one-request metadata call)."""
    import torch

    from vllm.utils.deep_gemm import get_paged_mqa_logits_metadata

    lens = torch.ones((1, 1), dtype=torch.int32, device="cuda")
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    try:
        get_paged_mqa_logits_metadata(lens, states_per_page, num_sms)
    except RuntimeError:  # DeepGEMM's host assertion
        return False
    return True


def current_indexer_pages() -> IndexerPages | None:
    """The indexer K-cache pages for this process's GPU (None: no GPU)."""
    from vllm.platforms import current_platform

    capability = current_platform.get_device_capability()
    return None if capability is None else plan_indexer_pages(capability)


@functools.cache
def confirm_indexer_pages(capability: DeviceCapability) -> IndexerPages:
    """``plan_indexer_pages(capability)``, confirmed by DeepGEMM on this GPU;
    raises naming the pages it does take. On a host without the GPU or
    without DeepGEMM the plan is returned as it is."""
    pages = plan_indexer_pages(capability)
    from vllm.platforms import current_platform
    from vllm.utils.import_utils import has_deep_gemm

    if not (current_platform.is_cuda() and has_deep_gemm()):
        return pages
    if _deepgemm_takes(pages.states_per_page):
        return pages
    taken = [n for n in INDEXER_STATE_CANDIDATES if _deepgemm_takes(n)]
    raise UnsupportedSparseMLAConfig(
        f"{pages.deepgemm} does not take DeepSeek V4.1's indexer K-cache pages "
        f"of {pages.states_per_page} states on this SM{capability.to_int()} GPU "
        f"(it takes {taken or 'none of ' + str(list(INDEXER_STATE_CANDIDATES))}). "
        "Install the DeepGEMM this vLLM ships (remove a standalone deep_gemm) "
        "or one whose paged MQA logits take 64-state pages."
    )


@dataclass(frozen=True)
class PagePlan:
    """The negotiated KV-cache geometry for one architecture.

    ``kernel_path``: TRTLLM_GEN, FLASHINFER_SM120 or TRITON.
    ``swa_block_size``: tokens per sliding-window page.
    ``compressed_states``: compressed states per compressed-KV page, or None
    to keep the cache config's block size (upstream's behaviour).
    """

    capability: DeviceCapability
    kernel_path: str
    swa_block_size: int
    compressed_states: int | None
    envelope: SM120Envelope | None = None
    # Why the plan is not the GPU's usual kernel (shown once, at start-up).
    note: str | None = None

    def compressed_block_size(self, compress_ratio: int) -> int | None:
        """Tokens per compressed-KV page for a layer of ``compress_ratio``."""
        if compress_ratio <= 0 or self.compressed_states is None:
            return None
        return self.compressed_states * compress_ratio

    def kernel_block_sizes(self, compress_ratios: Iterable[int]) -> list[int]:
        """Token page sizes the compressed-KV kernels take, largest first."""
        sizes = {self.compressed_block_size(r) for r in compress_ratios if r > 0}
        return sorted((s for s in sizes if s is not None), reverse=True)


def upstream_swa_block_size() -> int:
    """The sliding-window page of kernels that take the page size at run
    time (the SWA backend's own answer)."""
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWABackend

    return DeepseekSparseSWABackend.get_swa_block_size()


def is_sm100(capability: DeviceCapability) -> bool:
    return capability.major == 10


def is_sm120(capability: DeviceCapability) -> bool:
    return capability.major == 12


def plan_pages(
    capability: DeviceCapability, envelope: SM120Envelope | None = None
) -> PagePlan:
    """Page sizes for ``capability``; raises if the backend cannot run there.

    ``envelope`` defaults to the installed FlashInfer's (SM12x only).
    """
    if is_sm100(capability):
        # TRTLLM-gen takes the page size at run time: keep upstream's pages.
        return PagePlan(capability, TRTLLM_GEN, upstream_swa_block_size(), None)
    if is_sm120(capability):
        if envelope is None:
            envelope = installed_sm120_envelope()
        if envelope is not None and envelope.page_sizes is not None:
            page = min(envelope.page_sizes)
            return PagePlan(capability, FLASHINFER_SM120, page, page, envelope)
        if envelope is not None:
            # Runtime page sizes: upstream's geometry already works.
            return PagePlan(
                capability, FLASHINFER_SM120, upstream_swa_block_size(), None, envelope
            )
    note = None
    if is_sm120(capability):
        note = (
            f"{sm120_unavailable_reason() or 'no FlashInfer SM120 kernels'}, so "
            "the portable Triton kernel runs DeepSeek V4.1's sparse MLA on this "
            f"SM{capability.to_int()} GPU. For FlashInfer's kernels install "
            "the flashinfer-python release this vLLM pins."
        )
    if capability.to_int() >= TRITON_MIN_CAPABILITY:
        # No FlashInfer kernel for this GPU: the Triton kernel takes any page.
        if getattr(envs, FORCE_SM12X_PAGES_ENV):
            forced = (
                f"{FORCE_SM12X_PAGES_ENV}=1 (test-only): SM12x pages "
                f"({SM12X_FIXED_PAGE}-token SWA, {SM12X_FIXED_PAGE} compressed "
                "states per page) on the Triton kernel"
            )
            page = SM12X_FIXED_PAGE
            note = f"{note} {forced}" if note else forced
            return PagePlan(capability, TRITON, page, page, note=note)
        return PagePlan(capability, TRITON, upstream_swa_block_size(), None, note=note)
    raise UnsupportedSparseMLAConfig(
        f"{BACKEND_NAME} runs on SM10x (B200, GB200) and SM12x (RTX 50xx, RTX "
        "PRO 6000, GB10) through FlashInfer, and on other GPUs from SM89 on "
        "(L40S, H100, H200) through the portable Triton kernel; this GPU is "
        f"SM{capability.to_int()}. Choose "
        "another --attention-backend (FLASHMLA_SPARSE_DSV41 where FlashMLA runs)."
    )


def pad_q_heads(num_local_heads: int) -> int:
    """The head count the kernels run at for ``num_local_heads``."""
    # Upstream's list of the head counts the sparse-MLA kernels take. Imported
    # here: that module imports this one through the layers' negotiation.
    from vllm.models.deepseek_v41.nvidia.flashinfer_sparse import (
        _SPARSE_MLA_SUPPORTED_Q_HEADS as SUPPORTED_Q_HEADS,
    )

    for heads in SUPPORTED_Q_HEADS:
        if num_local_heads <= heads:
            return heads
    raise UnsupportedSparseMLAConfig(
        f"{BACKEND_NAME} serves at most {SUPPORTED_Q_HEADS[-1]} attention heads "
        f"per GPU, but this model has {num_local_heads} after tensor "
        f"parallelism (kernels take {list(SUPPORTED_Q_HEADS)}). Increase "
        "--tensor-parallel-size."
    )


def check_kv_cache_dtype(capability: DeviceCapability, kv_cache_dtype: str) -> None:
    """Raise unless the kernels for ``capability`` read ``kv_cache_dtype``."""
    # SM10x builds the TRTLLM-gen layer (plain rows); every other GPU builds
    # the two-segment layer (packed records), whichever kernel runs it.
    if is_sm100(capability):
        allowed, why = SM100_KV_CACHE_DTYPES, "plain BF16 or per-tensor FP8 rows"
    else:
        allowed, why = SM120_KV_CACHE_DTYPES, "the packed fp8_ds_mla record"
    if kv_cache_dtype not in allowed:
        raise UnsupportedSparseMLAConfig(
            f"{BACKEND_NAME} on SM{capability.to_int()} reads {why}; "
            f"--kv-cache-dtype {kv_cache_dtype} is not served. Use one of: "
            f"{', '.join(allowed)}."
        )


def choose_kernel(
    plan: PagePlan, padded_heads: int, topks: Iterable[int]
) -> tuple[str, str | None]:
    """The kernel that runs ``(padded_heads, topk)`` decode shapes under
    ``plan``, and why it is not the plan's FlashInfer kernel (None if it is).
    """
    envelope = plan.envelope
    if plan.kernel_path != FLASHINFER_SM120 or envelope is None:
        return plan.kernel_path, None
    missing = sorted({k for k in topks if not envelope.serves(padded_heads, k)})
    if not missing:
        return plan.kernel_path, None
    return TRITON, (
        f"{envelope.source} has no SM120 decode kernel for {padded_heads} heads "
        f"with top-k {missing} (it serves {envelope.served}), so the Triton "
        "kernel runs this model. For FlashInfer's kernel, change the "
        "speculative token count or upgrade FlashInfer."
    )


@dataclass(frozen=True)
class LayerGeometry:
    """The negotiated answer for a whole model on one architecture."""

    plan: PagePlan
    padded_heads: int
    kv_cache_dtype: str
    swa_topks: tuple[int, ...]
    # The kernel every layer of the model runs, and why it is not the plan's
    # FlashInfer kernel (None when it is).
    kernel_path: str
    fallback_reason: str | None = None

    def serves(self, padded_heads: int, topk: int) -> bool:
        """Whether the kernel chosen for the model runs this decode shape."""
        if self.kernel_path != FLASHINFER_SM120 or self.plan.envelope is None:
            return True
        return self.plan.envelope.serves(padded_heads, topk)


def negotiate(
    capability: DeviceCapability,
    *,
    num_local_heads: int,
    kv_cache_dtype: str,
    swa_topks: Iterable[int],
    envelope: SM120Envelope | None = None,
) -> LayerGeometry:
    """Everything start-up must know, or one error naming the fix."""
    plan = plan_pages(capability, envelope)
    check_kv_cache_dtype(capability, kv_cache_dtype)
    padded = pad_q_heads(num_local_heads)
    topks = tuple(sorted(set(swa_topks)))
    kernel, reason = choose_kernel(plan, padded, topks)
    return LayerGeometry(
        plan, padded, kv_cache_dtype, topks, kernel, reason or plan.note
    )
