# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""What DeepSeek V4.1 attention will do on a GPU, before loading any weights.

    python -m vllm_dsv41_plan plan --capability 12.0 [--config config.json] \
        [--tp N] [--kv-cache-dtype fp8] [--block-size N] \
        [--num-speculative-tokens N --non-causal] \
        [--attention-backend NAME] [--json]

Prints, for each KV cache (sliding window; compressed KV per ratio; the
indexer K caches), the page size in tokens and bytes, the attention class and
kernel that will run, the padded head count, and the error start-up would
raise, if any. It needs no GPU: with the capability given at the platform
boundary it asks what start-up asks: vLLM's choice of attention class for
``--attention-backend`` (unset: the one vLLM picks on that GPU), the
backend's negotiation, the pages from the hooks the layers ask, and the
layers' own --block-size check; the page bytes come from vLLM's KV-cache
spec classes built with the values the layers give them.

Exit status: 0 served, 1 refused (the start-up error is printed), 2 usage
error (bad arguments, or a config file that is not a readable DeepSeek V4.1
config). The report goes to stdout (``--json``: JSON only); vLLM's log lines
go to stderr. The model modules are imported only after that.
"""

import argparse
import contextlib
import dataclasses
import importlib
import json
import logging
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from vllm.logger import init_logger
from vllm.platforms.interface import DeviceCapability

if TYPE_CHECKING:
    from vllm.v1.kv_cache_interface import KVCacheSpec

# Configures vLLM's log handler now, so main() can point it at stderr before
# the model modules (which log as they load) are imported.
logger = init_logger(__name__)

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "dsv41_small.json"
# What each kernel (SparseMLAKernel value) calls, for the reader of the report.
KERNEL_PATHS = {
    "flashinfer-trtllm-gen": "FlashInfer TRTLLM-gen trtllm_batch_decode_sparse_mla_dsv4"
    " (SWA + compressed in one index table)",
    "flashinfer-sm120": "FlashInfer SM120 trtllm_batch_decode_sparse_mla_dsv4"
    " (two segments: SWA, then compressed)",
    "triton": "the portable Triton kernel triton_sparse_mla_dsv41"
    " (two segments: SWA, then compressed)",
    "FLASHMLA_SPARSE_DSV41": "FlashMLA sparse decode flash_mla_with_kvcache",
    "FLASHMLA_MEGA_ATTN_DSV41": "FlashMLA mega attention (RoPE, attention and"
    " output cast in one launch)",
}
INDEXER_KERNEL = "DeepGEMM fp8_fp4_paged_mqa_logits (the sparse indexer)"
# model_type of DeepSeek V4.1 checkpoints (vLLM's DeepseekV41Config).
DSV41_MODEL_TYPE = "deepseek_v41"
# The compress ratios of DeepSeek V4.1's compressed layers (0: sliding window only).
DSV41_COMPRESS_RATIOS = (1, 2)
# Tokens per sliding-window page where the backend has no page hook: the
# page the layer builds its sliding-window cache with.
SWA_BLOCK_SIZE = 32
# The fields the report reads, and their JSON types.
REQUIRED_FIELDS = {
    "num_attention_heads": int,
    "head_dim": int,
    "sliding_window": int,
    "compress_ratios": list,
    "kv_source_layer_ids": list,
    "index_source_layer_ids": list,
    "index_head_dim": int,
}
# The packed records DeepseekV4Attention.__init__ gives its caches (bytes per
# token, page alignment): the V4.1 MXFP8 record where the layer's
# _use_v41_mxfp8_kv_record says so, the V4 record elsewhere. The layer inlines
# these numbers, so they are restated here; tests/plan_report holds them
# against the layers.
MXFP8_RECORD = (528, 512)
V4_RECORD = (584, 576)
# Bytes per token of the NVFP4 compressed record (nvfp4_ds_mla).
NVFP4_COMPRESSED_RECORD = 288


class UsageError(ValueError):
    """Bad input to the report itself (exit status 2)."""


@dataclass
class CachePlan:
    cache: str
    layers: list[int]
    page_tokens: int
    states_per_page: int
    page_bytes: int
    # Indexer K caches: the kernel that reads the page and the library whose
    # page rule the plan trusted.
    kernel: str | None = None
    trusted: str | None = None


@dataclass
class Plan:
    capability: str
    attention_class: str | None = None
    kernel_path: str | None = None
    flashinfer: str | None = None
    local_heads: int = 0
    padded_heads: int | None = None
    kv_cache_dtype: str | None = None
    swa_topks: list[int] = field(default_factory=list)
    caches: list[CachePlan] = field(default_factory=list)
    note: str | None = None
    error: str | None = None


def layer_class(
    capability: DeviceCapability,
    attention_backend: str | None = None,
    hf_config: Any = None,
    tensor_parallel_size: int = 1,
) -> type:
    """The attention class start-up builds on ``capability`` for
    ``--attention-backend`` (None: the one vLLM picks), as vLLM's model chooses
    it (``_select_dsv4_attn_cls``). Raises UsageError for a name vLLM does not
    know, ValueError where vLLM refuses the backend for DeepSeek V4.1."""
    from vllm.models.deepseek_v41.nvidia.model import _select_dsv4_attn_cls
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    try:
        backend = AttentionBackendEnum[attention_backend] if attention_backend else None
    except KeyError:
        raise UsageError(
            f"--attention-backend {attention_backend!r} is not a vLLM attention backend"
        ) from None
    config = SimpleNamespace(
        attention_config=SimpleNamespace(backend=backend),
        parallel_config=SimpleNamespace(
            prefill_context_parallel_size=1, tensor_parallel_size=tensor_parallel_size
        ),
        model_config=SimpleNamespace(hf_config=hf_config),
        lora_config=None,
    )
    with capability_at_platform(capability):
        return _select_dsv4_attn_cls(config)  # type: ignore[arg-type]


def resolve_kv_cache_dtype(layer_cls: type, kv_cache_dtype: str) -> tuple[str, Any]:
    """(cache dtype string, torch dtype) ``layer_cls`` resolves
    ``--kv-cache-dtype`` to: the layer's own ``_resolve_dsv4_kv_cache_dtype``
    with its layout and packed record. Raises ValueError as the layer does."""
    from vllm.models.deepseek_v41.attention import _resolve_dsv4_kv_cache_dtype

    layout = layer_cls.use_fp8_ds_mla_layout
    # The record an unspecific dtype resolves to, where the layer names one
    # (vLLM 0.30's layers resolve to fp8_ds_mla alone).
    packed = getattr(layer_cls, "packed_kv_cache_dtype", None)
    if packed is None:
        return _resolve_dsv4_kv_cache_dtype(layout, kv_cache_dtype, None)
    return _resolve_dsv4_kv_cache_dtype(layout, kv_cache_dtype, None, packed.fget(None))


def packed_record(capability: DeviceCapability) -> tuple[int, int]:
    """(bytes per token, page alignment) of the packed KV record the layer
    writes on ``capability``, chosen as the layer chooses it."""
    from vllm.models.deepseek_v41.attention import _use_v41_mxfp8_kv_record

    with capability_at_platform(capability):
        return MXFP8_RECORD if _use_v41_mxfp8_kv_record() else V4_RECORD


@contextlib.contextmanager
def capability_at_platform(capability: DeviceCapability) -> Iterator[None]:
    """vLLM's platform answers ``capability`` for the GPU while inside, so
    the backends' hooks answer for it and not for the host's GPU."""
    from vllm.platforms import current_platform

    platform = type(current_platform)
    saved = platform.__dict__.get("get_device_capability")
    platform.get_device_capability = classmethod(  # type: ignore[method-assign]
        lambda cls, device_id=0: capability
    )
    try:
        yield
    finally:
        if saved is None:
            del platform.get_device_capability
        else:
            platform.get_device_capability = saved  # type: ignore[method-assign]


def default_block_size(layer_cls: type, capability: DeviceCapability) -> int:
    """The --block-size vLLM picks when the user sets none, for ``layer_cls``.

    vLLM 0.30 takes the sparse-MLA backend's preferred size; from 0.33 the
    platform takes the smallest size every backend of the model's layers
    supports (``Platform._preferred_block_size_for_backends``). Both ask the
    backends, here with the GPU at the platform boundary. Raises ValueError
    as vLLM does when the backends share no size."""
    from vllm.config import DeviceConfig, VllmConfig
    from vllm.config.cache import CacheConfig
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.mla.indexer import DeepseekV41IndexerBackend

    default = CacheConfig.DEFAULT_BLOCK_SIZE
    platform = type(current_platform)
    with capability_at_platform(capability):
        if not hasattr(platform, "_preferred_block_size_for_backends"):
            return layer_cls.backend_cls.get_preferred_block_size(default)
        backends = [layer_cls.backend_cls, layer_cls.swa_backend_cls]
        config = VllmConfig(device_config=DeviceConfig(device="cpu"))
        return platform._preferred_block_size_for_backends(
            [*backends, DeepseekV41IndexerBackend], default, config
        )


def owning_indexer_layers(hf_config: Any) -> list[int]:
    """Backbone layers that own an indexer K cache: compressed kv sources
    that are index sources too (the other index sources read theirs)."""
    backbone = getattr(hf_config, "num_hidden_layers", len(hf_config.compress_ratios))
    return sorted(
        layer
        for layer in set(hf_config.kv_source_layer_ids)
        & set(hf_config.index_source_layer_ids)
        if layer < backbone and hf_config.compress_ratios[layer] > 0
    )


def _spec(spec_cls: type, **values: Any) -> "KVCacheSpec":
    """``spec_cls`` built with those of ``values`` that this vLLM's class
    has (0.33 added fields 0.30's layers do not pass)."""
    names = {f.name for f in dataclasses.fields(spec_cls)}
    return spec_cls(**{k: v for k, v in values.items() if k in names})


def _config_default(config_cls: type, name: str, missing: Any = None) -> Any:
    """The default of a vLLM config field (``missing`` where this vLLM has
    no such field)."""
    for f in dataclasses.fields(config_cls):
        if f.name == name:
            return f.default
    return missing


def cache_specs(
    layer_cls: type,
    capability: DeviceCapability,
    hf_config: Any,
    kv_cache_dtype: str = "auto",
    block_size: int | None = None,
) -> "dict[str, KVCacheSpec]":
    """The KV-cache specs the model's layers of ``layer_cls`` report on
    ``capability``, by layer name: the sliding-window cache of every layer,
    the compressed KV of each compressed kv source, the indexer K cache of
    each one that owns one.

    vLLM's spec classes, built with the values the layers pass them; every
    page from the hooks the layers ask. ``block_size``: the user's
    --block-size; unset, vLLM's default. Raises ValueError where the layer
    would.
    """
    import torch

    from vllm.config import AttentionConfig
    from vllm.models.deepseek_v41.attention import _indexer_k_cache_head_dim
    from vllm.v1.attention.backends.mla.indexer import DeepseekV41IndexerBackend
    from vllm.v1.kv_cache_interface import (
        MLAAttentionSpec,
        SlidingWindowMLASpec,
        get_kv_quant_mode,
    )

    cache_dtype, torch_dtype = resolve_kv_cache_dtype(layer_cls, kv_cache_dtype)
    if block_size is None:
        block_size = default_block_size(layer_cls, capability)
    mxfp8 = packed_record(capability) == MXFP8_RECORD
    record, alignment = packed_record(capability)
    compressed_record = (
        NVFP4_COMPRESSED_RECORD if cache_dtype == "nvfp4_ds_mla" else record
    )
    packed = cache_dtype in ("fp8_ds_mla", "nvfp4_ds_mla")
    quant_mode = get_kv_quant_mode(cache_dtype)
    # The page hooks of a vLLM whose caches ask their backends for pages
    # (none: the sliding-window page, else --block-size).
    swa_hook = getattr(layer_cls.swa_backend_cls, "get_swa_block_size", None)
    compressed_hook = getattr(layer_cls.backend_cls, "get_compressed_block_size", None)
    indexer_hook = getattr(DeepseekV41IndexerBackend, "get_indexer_block_size", None)
    ratios = set(hf_config.compress_ratios)
    with capability_at_platform(capability):
        swa_block_size = swa_hook() if swa_hook else SWA_BLOCK_SIZE
        compressed_pages = {r: compressed_hook and compressed_hook(r) for r in ratios}
        indexer_pages = {r: indexer_hook and indexer_hook(r) for r in ratios}
    swa = _spec(
        SlidingWindowMLASpec,
        block_size=swa_block_size,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=hf_config.head_dim,
        dtype=torch_dtype,
        sliding_window=hf_config.sliding_window,
        cache_dtype_str=cache_dtype,
        state_content_bytes=record if packed else None,
        alignment=alignment if packed else 512,
        # From vLLM 0.33: MXFP8 blocks hold whole records of both caches.
        block_stride_alignment=(
            math.lcm(record, compressed_record) if packed and mxfp8 else None
        ),
        model_version="deepseek_v4",
        kv_quant_mode=quant_mode,
        # bounded_replay keeps its default: it changes prefix caching, not
        # a page, and the layer decides it from the model runner.
    )
    specs: dict[str, KVCacheSpec] = {}
    for layer, ratio in enumerate(hf_config.compress_ratios):
        prefix = f"model.layers.{layer}.attn"
        specs[f"{prefix}.swa_cache"] = swa
        if layer in hf_config.kv_source_layer_ids and ratio > 0:
            specs[prefix] = _spec(
                MLAAttentionSpec,
                block_size=compressed_pages[ratio] or block_size,
                num_kv_heads=1,
                head_size=hf_config.head_dim,
                dtype=torch.uint8 if packed else torch_dtype,
                tokens_per_state=ratio,
                cache_dtype_str=cache_dtype,
                alignment=alignment if packed else 512,
                model_version="deepseek_v4",
                kv_quant_mode=quant_mode,
                state_content_bytes=compressed_record if packed else None,
            )
    # The indexer K caches: FP8 keys (AttentionConfig's default
    # indexer_kv_dtype; MXFP4 keys are SM10x-only and asked for).
    index_alignment = 576 if packed and not mxfp8 else 512
    sparse_logits = _config_default(AttentionConfig, "indexer_sparse_logits", False)
    for layer in owning_indexer_layers(hf_config):
        ratio = hf_config.compress_ratios[layer]
        specs[f"model.layers.{layer}.attn.indexer.k_cache"] = _spec(
            MLAAttentionSpec,
            block_size=indexer_pages[ratio] or block_size,
            num_kv_heads=1,
            head_size=_indexer_k_cache_head_dim(hf_config.index_head_dim, False),
            dtype=torch.uint8,
            tokens_per_state=ratio,
            alignment=index_alignment,
            block_stride_alignment=(
                math.lcm(256, 1 if packed and mxfp8 else index_alignment)
                if sparse_logits
                else None
            ),
        )
    return specs


def check_block_size(
    layer_cls: type,
    specs: "dict[str, KVCacheSpec]",
    block_size: int | None,
    hf_config: Any,
) -> None:
    """What each kv-source layer checks of a --block-size the user set, where
    this vLLM's layers check it: their own method, over the report's specs."""
    from vllm.v1.attention.backends.mla.indexer import DeepseekV41IndexerBackend

    check = getattr(layer_cls, "_check_kv_cache_block_size", None)
    if check is None or block_size is None:
        return
    config = SimpleNamespace(
        cache_config=SimpleNamespace(
            block_size=block_size, user_specified_block_size=True
        ),
        model_config=SimpleNamespace(hf_config=hf_config),
    )
    for name, spec in specs.items():
        if not name.endswith(".attn"):
            continue
        k_cache = specs.get(f"{name}.indexer.k_cache")
        indexer = k_cache and SimpleNamespace(
            k_cache=SimpleNamespace(
                get_attn_backend=lambda: DeepseekV41IndexerBackend,
                get_kv_cache_spec=lambda _, spec=k_cache: spec,
            )
        )
        # The layer's fields its check reads, from the report's specs.
        layer = SimpleNamespace(
            backend_cls=layer_cls.backend_cls,
            indexer=indexer,
            kv_source_layers=tuple(hf_config.kv_source_layer_ids),
            get_kv_cache_spec=lambda _, spec=spec: spec,
        )
        check(layer, config)


def check_model_shape(hf_config: Any, tensor_parallel_size: int) -> int:
    """Refuse, as vLLM's config checks and layers do, values no DeepSeek V4.1
    model is built with; return the attention heads per GPU."""
    heads = hf_config.num_attention_heads
    problem = None
    if heads <= 0:
        problem = f"the model has {heads} attention heads; it needs at least one."
    elif hf_config.sliding_window <= 0:
        problem = f"sliding_window is {hf_config.sliding_window}; it must be positive."
    elif unknown := sorted(
        {r for r in hf_config.compress_ratios if r and r not in DSV41_COMPRESS_RATIOS}
    ):
        problem = (
            f"compress ratios {unknown} are not DeepSeek V4.1's: its layers are "
            "sliding-window only (0) or compressed with ratio "
            f"{' or '.join(map(str, DSV41_COMPRESS_RATIOS))}."
        )
    elif tensor_parallel_size < 1:
        problem = f"--tensor-parallel-size {tensor_parallel_size} must be at least 1."
    elif heads % tensor_parallel_size:
        sizes = [tp for tp in range(1, min(heads, 64) + 1) if heads % tp == 0]
        problem = (
            f"{heads} attention heads cannot be split evenly over "
            f"--tensor-parallel-size {tensor_parallel_size}. Use one of {sizes}."
        )
    if problem:
        raise ValueError(f"DeepSeek V4.1: {problem}")
    return heads // tensor_parallel_size


def make_plan(
    capability: DeviceCapability,
    hf_config: Any,
    *,
    tensor_parallel_size: int = 1,
    kv_cache_dtype: str = "auto",
    num_speculative_tokens: int | None = None,
    use_non_causal: bool = False,
    block_size: int | None = None,
    attention_backend: str | None = None,
    envelope: Any = None,
) -> Plan:
    """The plan start-up makes on a GPU of ``capability`` with the attention
    class it builds for ``attention_backend`` (None: vLLM's choice).
    ``envelope``: the FlashInfer SM120 kernels the page policy plans for,
    where this vLLM has one (default: the installed FlashInfer's)."""
    from vllm.models.deepseek_v41.nvidia.flashinfer_sparse import (
        DeepseekV4FlashInferMLASparseBackend as flashinfer,
    )

    report = Plan(
        capability=f"{capability.major}.{capability.minor}",
        local_heads=hf_config.num_attention_heads // max(tensor_parallel_size, 1),
    )
    swa_topk = sm120_swa_topk(
        hf_config.sliding_window, use_non_causal, num_speculative_tokens
    )
    try:
        with capability_at_platform(capability):
            local_heads = check_model_shape(hf_config, tensor_parallel_size)
            layer_cls = layer_class(
                capability, attention_backend, hf_config, tensor_parallel_size
            )
            report.attention_class = f"{layer_cls.__module__}.{layer_cls.__name__}"
            backend = layer_cls.backend_cls
            if backend is flashinfer and hasattr(backend, "paged_backends"):
                # A vLLM whose backend pages its caches by the page policy.
                pages = importlib.import_module(
                    "vllm.models.deepseek_v41.nvidia.sparse_mla_pages"
                )
                plan = pages.negotiate(
                    capability,
                    backend.paged_backends(),
                    num_local_heads=local_heads,
                    kv_cache_dtype=kv_cache_dtype,
                    swa_topk=swa_topk,
                    block_size=block_size,
                    envelope=envelope,
                )
                kernel_path = KERNEL_PATHS[plan.kernel.value]
                padded_heads = plan.padded_heads
            else:
                plan = None
                padded_heads = layer_cls.get_padded_num_q_heads(local_heads)
                if negotiate := getattr(backend, "negotiate", None):
                    # The layer's own negotiation, as its __init__ calls it.
                    negotiate(_layer_config(kv_cache_dtype, block_size))
                kernel_path = None
            cache_dtype, _ = resolve_kv_cache_dtype(layer_cls, kv_cache_dtype)
            specs = cache_specs(
                layer_cls, capability, hf_config, kv_cache_dtype, block_size
            )
            check_block_size(layer_cls, specs, block_size, hf_config)
            # The two-segment layer chooses its kernel once its caches exist.
            kernel_path = (
                kernel_path
                or KERNEL_PATHS[
                    layer_kernel(layer_cls, capability, padded_heads, swa_topk)
                ]
            )
    except (ValueError, RuntimeError) as e:
        report.error = str(e)
        return report

    report.kernel_path = kernel_path
    report.note = (
        plan.note
        if plan
        else _default_class_note(capability, attention_backend, layer_cls)
    )
    report.flashinfer = plan.envelope.source if plan and plan.envelope else None
    report.padded_heads = padded_heads
    report.kv_cache_dtype = cache_dtype
    report.swa_topks = [swa_topk]
    swa = specs["model.layers.0.attn.swa_cache"]
    report.caches.append(
        CachePlan(
            "swa",
            list(range(len(hf_config.compress_ratios))),
            swa.block_size,
            swa.block_size,
            swa.page_size_bytes,
        )
    )
    for kind, suffix in (("compressed", ""), ("indexer", ".indexer.k_cache")):
        by_ratio: dict[int, list[int]] = {}
        for layer, ratio in enumerate(hf_config.compress_ratios):
            if f"model.layers.{layer}.attn{suffix}" in specs:
                by_ratio.setdefault(ratio, []).append(layer)
        for ratio, layers in sorted(by_ratio.items()):
            spec = specs[f"model.layers.{layers[0]}.attn{suffix}"]
            report.caches.append(
                CachePlan(
                    f"{kind} r={ratio}",
                    layers,
                    spec.block_size,
                    spec.block_size // ratio,
                    spec.page_size_bytes,
                    kernel=INDEXER_KERNEL if kind == "indexer" else None,
                    trusted="DeepGEMM" if kind == "indexer" else None,
                )
            )
    return report


def sm120_swa_topk(
    window_size: int, use_non_causal: bool, num_speculative_tokens: int | None
) -> int:
    """The sliding-window top-k the two-segment layer's kernels are asked
    for: vLLM's own answer for this speculative setup."""
    from vllm.models.deepseek_v41.nvidia import flashinfer_sparse

    ask = getattr(flashinfer_sparse, "required_sm120_sparse_topk", None)
    if ask is None:  # vLLM 0.30 keeps it private
        ask = flashinfer_sparse._required_sm120_sparse_topk  # type: ignore[attr-defined]
    speculative = (
        SimpleNamespace(num_speculative_tokens=num_speculative_tokens)
        if num_speculative_tokens
        else None
    )
    config = SimpleNamespace(
        attention_config=SimpleNamespace(use_non_causal=use_non_causal),
        speculative_config=speculative,
    )
    return ask(config, window_size)


def layer_kernel(
    layer_cls: type, capability: DeviceCapability, padded_heads: int, swa_topk: int
) -> str:
    """What ``layer_cls`` runs on ``capability``: the kernel (SparseMLAKernel
    value) a two-segment layer chooses as it is built, or the backend's name;
    raises as the layer does."""
    choose = getattr(layer_cls, "choose_sparse_mla_kernel", None)
    if choose is not None:
        with capability_at_platform(capability):
            return choose(padded_heads, swa_topk).value
    from vllm.models.deepseek_v41.nvidia.flashinfer_sparse import (
        DeepseekV4FlashInferMLAAttention,
    )

    if issubclass(layer_cls, DeepseekV4FlashInferMLAAttention):
        return "flashinfer-trtllm-gen"
    return layer_cls.backend_cls.get_name()


def _default_class_note(
    capability: DeviceCapability, attention_backend: str | None, layer_cls: type
) -> str | None:
    """Why vLLM's default class here is not the one it builds on hosts whose
    vLLM has SM100's mega attention kernel (a check of this host's build)."""
    try:  # a vLLM without mega attention has no such module
        mega = importlib.import_module(
            "vllm.models.deepseek_v41.nvidia.flash_mla_mega_attn"
        )
    except ImportError:
        return None
    if attention_backend or capability.major != 10:
        return None
    if layer_cls is mega.DeepseekV4MegaAttnAttention:
        return None
    with capability_at_platform(capability):
        _, why = mega.is_flashmla_mega_attn_supported()
    return (
        f"this host's vLLM cannot run mega attention ({(why or '').rstrip('.')}); "
        "where it can, "
        "start-up builds DeepseekV4MegaAttnAttention instead "
        "(--attention-backend FLASHMLA_MEGA_ATTN_DSV41 plans it)."
    )


def _layer_config(kv_cache_dtype: str, block_size: int | None) -> Any:
    """What a backend's ``negotiate`` reads of the engine's config."""
    return SimpleNamespace(
        cache_config=SimpleNamespace(
            cache_dtype=kv_cache_dtype,
            block_size=block_size,
            user_specified_block_size=block_size is not None,
        )
    )


def render(report: Plan) -> str:
    lines = [
        f"DeepSeek V4.1 sparse MLA plan for SM{report.capability.replace('.', '')}"
    ]
    if report.error:
        lines.append(f"start-up error: {report.error}")
        return "\n".join(lines)
    lines += [
        f"attention class: {report.attention_class}",
        f"kernel path:     {report.kernel_path}",
        f"flashinfer:      {report.flashinfer or 'no fixed-page tables to obey'}",
        f"heads:           {report.local_heads} local -> {report.padded_heads} padded",
        f"kv-cache dtype:  {report.kv_cache_dtype}",
        f"SWA top-k:       {', '.join(map(str, report.swa_topks))}",
        (
            f"{'cache':<16}{'layers':<18}{'page tokens':>12}{'states/page':>13}"
            f"{'page bytes':>12}"
        ),
    ]
    for c in report.caches:
        lines.append(
            f"{c.cache:<16}{layer_ranges(c.layers):<18}{c.page_tokens:>12}"
            f"{c.states_per_page:>13}{c.page_bytes:>12}"
        )
    readers = {(c.kernel, c.trusted) for c in report.caches if c.kernel}
    for kernel, trusted in sorted(readers, key=str):
        lines.append(f"indexer kernel:  {kernel}, pages as {trusted} reads them")
    if report.note:
        lines.append(f"note: {report.note}")
    lines.append("status: served")
    return "\n".join(lines)


def layer_ranges(layers: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``0-2,5,7-8``."""
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return ",".join(
        str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs
    )


def parse_capability(text: str) -> DeviceCapability:
    """``12.0``, ``12``, ``120``, ``sm_120``, ``sm120`` (and ``9.0``, ``90``,
    ``sm_90``) -> the compute capability; raises UsageError otherwise."""
    spelled = text.strip().lower()
    m = re.fullmatch(r"(?:sm_?)?(\d+)(?:\.(\d+))?", spelled)
    if m is None:
        raise UsageError(
            f"--capability {text!r}: give a compute capability such as 12.0, "
            "12, 120 or sm_120"
        )
    digits, minor = m.group(1), m.group(2)
    if minor is not None:
        major, minor_value = int(digits), int(minor)  # 12.0
    elif len(digits) == 3:
        major, minor_value = int(digits[:2]), int(digits[2])  # 120, sm_120
    elif len(digits) == 2 and int(digits) >= 20:
        major, minor_value = int(digits[0]), int(digits[1])  # 90, sm_89
    elif len(digits) <= 2:
        major, minor_value = int(digits), 0  # 12, 9
    else:
        raise UsageError(f"--capability {text!r} is not a compute capability")
    if not 1 <= major <= 20 or minor_value > 9:
        raise UsageError(f"--capability {text!r} is not a compute capability")
    return DeviceCapability(major, minor_value)


def load_config(path: Path) -> Any:
    """A DeepSeek V4.1 ``config.json`` (flat, or nested under ``text_config``)
    as start-up would read it; raises UsageError saying what is wrong."""
    try:
        raw = json.loads(path.read_text())
    except OSError as e:
        raise UsageError(f"--config {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"--config {path} is not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"--config {path} is not a JSON object")
    text = raw.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise UsageError(f"--config {path}: text_config is not an object")
    architectures = raw.get("architectures") or []
    model_types = {raw.get("model_type"), (text or {}).get("model_type")}
    if DSV41_MODEL_TYPE not in model_types and not any(
        str(a).startswith("DeepseekV41") for a in architectures
    ):
        found = raw.get("model_type") or "none"
        raise UsageError(
            f"--config {path} is not a DeepSeek V4.1 config (model_type "
            f"{found!r}; expected {DSV41_MODEL_TYPE!r})"
        )
    # The text model's fields, flattened over the top level the way vLLM's
    # DeepseekV41Config does.
    fields = {**{k: v for k, v in (text or {}).items() if k != "model_type"}}
    fields.update({k: v for k, v in raw.items() if k not in ("text_config",)})
    for name, kind in REQUIRED_FIELDS.items():
        if name not in fields:
            raise UsageError(f"--config {path}: the field {name!r} is missing")
        value = fields[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise UsageError(
                f"--config {path}: {name} is {value!r}; expected "
                f"{'a list' if kind is list else 'an integer'}"
            )
        if kind is list and not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise UsageError(f"--config {path}: {name} must list integers")
    _check_layers(path, fields)
    return SimpleNamespace(**fields)


def _check_layers(path: Path, fields: dict[str, Any]) -> None:
    """Refuse layer lists no DeepSeek V4.1 model can be built from."""
    ratios = fields["compress_ratios"]
    if not ratios:
        raise UsageError(f"--config {path}: compress_ratios is empty")
    # compress_ratios covers the MTP layers too; they come after the backbone.
    backbone = fields.get("num_hidden_layers", len(ratios))
    mtp = fields.get("num_nextn_predict_layers", 0)
    if not isinstance(backbone, int) or not isinstance(mtp, int) or mtp < 0:
        raise UsageError(f"--config {path}: layer counts must be integers")
    if not 0 < backbone <= len(ratios):
        raise UsageError(
            f"--config {path}: num_hidden_layers is {backbone} but "
            f"compress_ratios has {len(ratios)} entries"
        )
    for name in ("kv_source_layer_ids", "index_source_layer_ids"):
        layers = fields.get(name, [])
        if not isinstance(layers, list) or not all(
            isinstance(v, int) and 0 <= v < backbone for v in layers
        ):
            raise UsageError(
                f"--config {path}: {name} must list backbone layers "
                f"(0 to {backbone - 1})"
            )
        first = min(layers, default=backbone)
        compressed = [i for i in range(backbone) if ratios[i] > 0]
        if compressed and compressed[0] < first:
            raise UsageError(
                f"--config {path}: compressed layer {compressed[0]} has no "
                f"source layer at or below it in {name}"
            )


def _int_at_least(minimum: int):
    """An argparse type: an integer no smaller than ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            what = "a positive integer" if minimum == 1 else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"{value} is not {what}")
        return value

    return parse


def _attention_backend(text: str) -> str:
    """An argparse type: a name of vLLM's ``AttentionBackendEnum``."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    if text not in AttentionBackendEnum.__members__:
        raise argparse.ArgumentTypeError(f"{text!r} is not a vLLM attention backend")
    return text


def _logs_to_stderr() -> None:
    """vLLM logs to stdout by default; the report owns stdout."""
    for handler in logging.getLogger("vllm").handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream in (
            sys.stdout,
            sys.__stdout__,
        ):
            handler.setStream(sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_dsv41_plan",
        description=__doc__.split("\n\n")[0],
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="page sizes and kernels for one GPU")
    p.add_argument(
        "--capability", required=True, help="e.g. 10.0, 12.0, 12.1, 120, sm_120"
    )
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument(
        "--tp", type=_int_at_least(1), default=1, help="tensor parallel size"
    )
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument(
        "--attention-backend",
        type=_attention_backend,
        default=None,
        help="as vllm serve takes it (default: the one vLLM picks on that GPU)",
    )
    p.add_argument("--block-size", type=_int_at_least(1), default=None)
    p.add_argument("--num-speculative-tokens", type=_int_at_least(0), default=None)
    p.add_argument("--non-causal", action="store_true", help="DSpark non-causal")
    p.add_argument("--json", action="store_true", help="JSON on stdout, nothing else")
    args = parser.parse_args(argv)
    _logs_to_stderr()
    try:
        capability = parse_capability(args.capability)
        hf_config = load_config(args.config)
    except UsageError as e:
        p.error(str(e))
    report = make_plan(
        capability,
        hf_config,
        tensor_parallel_size=args.tp,
        kv_cache_dtype=args.kv_cache_dtype,
        num_speculative_tokens=args.num_speculative_tokens,
        use_non_causal=args.non_causal,
        block_size=args.block_size,
        attention_backend=args.attention_backend,
    )
    print(json.dumps(asdict(report), indent=2) if args.json else render(report))
    return 1 if report.error else 0


if __name__ == "__main__":
    sys.exit(main())
