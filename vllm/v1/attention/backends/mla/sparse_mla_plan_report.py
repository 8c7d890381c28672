# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""What DeepSeek V4.1 attention will do on a GPU, before loading any weights.

    python -m vllm.v1.attention.backends.mla.sparse_mla_plan_report plan \
        --capability 12.0 [--config config.json] [--tp N] \
        [--kv-cache-dtype fp8] [--num-speculative-tokens N --non-causal] [--json]

Prints, for each KV cache (sliding window; compressed KV per ratio), the page
size in tokens and bytes, the attention class and kernel that will run, the
padded head count, and the error start-up would raise, if any. It needs no GPU:
the architecture is given, the page policy reads FlashInfer's tables, the
checks are the ones start-up makes, and the page bytes come from vLLM's own
KV-cache spec classes.

Exit status: 0 served, 1 refused (the start-up error is printed), 2 usage
error (bad arguments, or a config file that is not a readable DeepSeek V4.1
config). The report goes to stdout (``--json``: JSON only); vLLM's log lines
go to stderr. The model modules are imported only after that, which is why
this lives outside the model package (importing it loads the model).
"""

import argparse
import functools
import json
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch

import vllm
from vllm.logger import init_logger
from vllm.platforms.interface import DeviceCapability

if TYPE_CHECKING:
    from vllm.models.deepseek_v41.nvidia import sparse_mla_pages as pages

# Configures vLLM's log handler now, so main() can point it at stderr before
# the model modules (which log as they load) are imported.
logger = init_logger(__name__)

DEFAULT_CONFIG = (
    Path(vllm.__file__).parent
    / "models"
    / "deepseek_v41"
    / "configs"
    / "dsv41_small.json"
)
# What each kernel (SparseMLAKernel value) calls, for the reader of the report.
KERNEL_PATHS = {
    "flashinfer-trtllm-gen": "FlashInfer TRTLLM-gen trtllm_batch_decode_sparse_mla_dsv4"
    " (SWA + compressed in one index table)",
    "flashinfer-sm120": "FlashInfer SM120 trtllm_batch_decode_sparse_mla_dsv4"
    " (two segments: SWA, then compressed)",
    "triton": "the portable Triton kernel triton_sparse_mla_dsv41"
    " (two segments: SWA, then compressed)",
}
INDEXER_KERNEL = "DeepGEMM fp8_fp4_paged_mqa_logits (the sparse indexer)"
# model_type of DeepSeek V4.1 checkpoints (vLLM's DeepseekV41Config).
DSV41_MODEL_TYPE = "deepseek_v41"
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


def cache_specs(
    capability: DeviceCapability,
    hf_config: Any,
    plan: "pages.SparseMLAPlan",
    kv_cache_dtype: str,
    uses_fp8_ds_mla_layout: bool,
    block_size: int | None = None,
) -> dict[str, Any]:
    """The KV-cache specs a model's attention layers report, by layer name.

    Built by upstream's own ``get_kv_cache_spec`` methods on stand-ins that
    hold just the fields those methods read, with the negotiated page sizes.
    ``block_size``: the user's --block-size; unset, the backend's preferred
    size, as vLLM picks it. Compressed caches without pages of the plan's
    own take it.
    """
    from vllm.models.deepseek_v41.attention import (
        DeepseekV4Attention,
        _resolve_dsv4_kv_cache_dtype,
    )
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache

    cache_dtype, torch_dtype = _resolve_dsv4_kv_cache_dtype(
        uses_fp8_ds_mla_layout, kv_cache_dtype, None
    )
    if block_size is None:
        block_size = default_block_size(plan)
    cache_config = SimpleNamespace(cache_dtype=cache_dtype, block_size=block_size)
    vllm_config = SimpleNamespace(cache_config=cache_config)
    # SM10x stores the 528-byte MXFP8 record, others the 584-byte one.
    mxfp8 = capability.major == 10
    record_bytes = 528 if mxfp8 else 584
    # What the layers' own ``get_kv_cache_spec`` read: the record's width
    # under its vLLM 0.30 name and its 0.33 names (the SWA and compressed
    # records are the same but for nvfp4_ds_mla, which no kernel here reads).
    record = dict(
        head_dim=hf_config.head_dim,
        kv_cache_dtype=cache_dtype,
        kv_cache_torch_dtype=torch_dtype,
        kv_bytes_per_token=record_bytes,
        swa_bytes_per_token=record_bytes,
        compressed_bytes_per_token=record_bytes,
        kv_page_alignment=512 if mxfp8 else 576,
    )
    specs: dict[str, Any] = {}
    for layer, ratio in enumerate(hf_config.compress_ratios):
        prefix = f"model.layers.{layer}.attn"
        swa = SimpleNamespace(
            block_size=plan.swa_block_size,
            head_dim=hf_config.head_dim,
            window_size=hf_config.sliding_window,
            dtype=torch_dtype,
            cache_config=cache_config,
            packed_bytes_per_token=record_bytes,
            packed_page_alignment=record["kv_page_alignment"],
            # From vLLM 0.33: MXFP8 blocks hold whole records of both caches;
            # bounded replay is off unless the user asks for it.
            packed_block_stride_alignment=record_bytes if mxfp8 else None,
            bounded_replay=False,
        )
        specs[f"{prefix}.swa_cache"] = DeepseekV4SWACache.get_kv_cache_spec(
            swa, vllm_config
        )
        if layer in hf_config.kv_source_layer_ids and ratio > 0:
            # The layer's backend answers with the plan being reported.
            backend = SimpleNamespace(
                get_compressed_block_size=plan.compressed_block_size
            )
            source = SimpleNamespace(
                is_kv_source=True, compress_ratio=ratio, backend_cls=backend, **record
            )
            specs[prefix] = DeepseekV4Attention.get_kv_cache_spec(source, vllm_config)
    return specs


def indexer_cache_specs(
    hf_config: Any, block_size: int, cache_dtype: str
) -> dict[str, Any]:
    """The indexer K-cache specs of the kv-source layers that own one, by
    layer name, from upstream's ``get_kv_cache_spec`` (FP8 keys)."""
    from vllm.models.deepseek_v41.attention import (
        DeepseekV4IndexerCache,
        _indexer_k_cache_head_dim,
    )

    cache_config = SimpleNamespace(cache_dtype=cache_dtype, block_size=block_size)
    vllm_config = SimpleNamespace(cache_config=cache_config)
    head_dim = _indexer_k_cache_head_dim(hf_config.index_head_dim, False)
    specs = {}
    for layer in owning_indexer_layers(hf_config):
        cache = SimpleNamespace(
            cache_config=cache_config,
            head_dim=head_dim,
            dtype=torch.uint8,
            compress_ratio=hf_config.compress_ratios[layer],
            sparse_logits=False,
            rocm_mxfp4=False,
        )
        name = f"model.layers.{layer}.attn.indexer.k_cache"
        specs[name] = DeepseekV4IndexerCache.get_kv_cache_spec(cache, vllm_config)
    return specs


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


def _as_the_reported_gpu(make: Callable[..., Plan]) -> Callable[..., Plan]:
    """``make(capability, ...)`` run with vLLM's platform answering as a GPU
    of ``capability``, not as this host. Upstream's backends ask it which GPU
    they serve (the indexer K caches' kernels take 64-token pages on SM90,
    128 elsewhere), as they would on that GPU at start-up."""

    @functools.wraps(make)
    def wrapper(capability: DeviceCapability, *args: Any, **kwargs: Any) -> Plan:
        from vllm.platforms import current_platform

        platform_cls = type(current_platform)
        own = platform_cls.__dict__.get("get_device_capability")
        platform_cls.get_device_capability = classmethod(  # type: ignore[method-assign]
            lambda cls, device_id=0: capability
        )
        try:
            return make(capability, *args, **kwargs)
        finally:
            if own is None:
                del platform_cls.get_device_capability
            else:
                platform_cls.get_device_capability = own  # type: ignore[method-assign]

    return wrapper


@_as_the_reported_gpu
def make_plan(
    capability: DeviceCapability,
    hf_config: Any,
    *,
    tensor_parallel_size: int = 1,
    kv_cache_dtype: str = "auto",
    num_speculative_tokens: int | None = None,
    use_non_causal: bool = False,
    block_size: int | None = None,
    envelope: "pages.SM120Envelope | None" = None,
) -> Plan:
    """The plan start-up makes on a GPU of ``capability``."""
    from vllm.models.deepseek_v41.attention import _resolve_dsv4_kv_cache_dtype
    from vllm.models.deepseek_v41.nvidia import sparse_mla_pages as pages
    from vllm.models.deepseek_v41.nvidia.flashinfer_sparse import (
        DeepseekV4FlashInferMLASparseBackend as backend,
    )

    report = Plan(
        capability=f"{capability.major}.{capability.minor}",
        local_heads=hf_config.num_attention_heads // max(tensor_parallel_size, 1),
    )
    try:
        attention_cls = attention_class_for(capability)
        plan = pages.negotiate_for_model(
            capability,
            hf_config,
            backend.paged_backends(),
            tensor_parallel_size=tensor_parallel_size,
            kv_cache_dtype=kv_cache_dtype,
            use_non_causal=use_non_causal,
            num_speculative_tokens=num_speculative_tokens,
            block_size=block_size,
            envelope=envelope,
        )
        cache_dtype, _ = _resolve_dsv4_kv_cache_dtype(
            attention_cls.use_fp8_ds_mla_layout, kv_cache_dtype, None
        )
    except (pages.UnsupportedSparseMLAConfig, ValueError) as e:
        report.error = str(e)
        return report

    report.attention_class = f"{attention_cls.__module__}.{attention_cls.__name__}"
    report.kernel_path = KERNEL_PATHS[plan.kernel.value]
    report.note = plan.note
    report.flashinfer = plan.envelope.source if plan.envelope else None
    report.padded_heads = plan.padded_heads
    report.kv_cache_dtype = cache_dtype
    report.swa_topks = list(plan.swa_topks)
    specs = cache_specs(
        capability,
        hf_config,
        plan,
        kv_cache_dtype,
        attention_cls.use_fp8_ds_mla_layout,
        block_size,
    )
    swa = [s for name, s in specs.items() if name.endswith(".swa_cache")]
    report.caches.append(
        CachePlan(
            "swa",
            list(range(len(hf_config.compress_ratios))),
            swa[0].block_size,
            swa[0].block_size,
            swa[0].page_size_bytes,
        )
    )
    for ratio in sorted({r for r in hf_config.compress_ratios if r > 0}):
        layers = [
            i
            for i, r in enumerate(hf_config.compress_ratios)
            if r == ratio and f"model.layers.{i}.attn" in specs
        ]
        if not layers:
            continue
        spec = specs[f"model.layers.{layers[0]}.attn"]
        report.caches.append(
            CachePlan(
                f"compressed r={ratio}",
                layers,
                spec.block_size,
                spec.block_size // ratio,
                spec.page_size_bytes,
            )
        )
    indexer = plan.indexer
    indexer_specs = indexer_cache_specs(
        hf_config, block_size or default_block_size(plan), cache_dtype
    )
    for ratio in sorted({s.tokens_per_state for s in indexer_specs.values()}):
        named = {n: s for n, s in indexer_specs.items() if s.tokens_per_state == ratio}
        spec = next(iter(named.values()))
        report.caches.append(
            CachePlan(
                f"indexer r={ratio}",
                [int(n.split(".")[2]) for n in named],
                spec.block_size,
                spec.block_size // ratio,
                spec.page_size_bytes,
                kernel=INDEXER_KERNEL,
                trusted=indexer.deepgemm,
            )
        )
    return report


def attention_class_for(capability: DeviceCapability) -> type:
    """The layer ``FLASHINFER_MLA_SPARSE_DSV41`` builds on ``capability``
    (``_select_dsv4_attn_cls``): TRTLLM-gen's on SM10x, the two-segment layer
    everywhere else."""
    from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fi

    if capability.major == 10:
        return fi.DeepseekV4FlashInferMLAAttention
    return fi.DeepseekV4FlashInferSM120Attention


def default_block_size(plan: "pages.SparseMLAPlan") -> int:
    """The --block-size vLLM picks when the user sets none: the backend's
    preferred size for the plan's kernel pages (upstream's without a plan of
    its own, as on a GPU-less host)."""
    from vllm.config.cache import CacheConfig
    from vllm.models.deepseek_v41.nvidia import sparse_mla_pages as pages
    from vllm.models.deepseek_v41.nvidia.flashinfer_sparse import (
        DeepseekV4FlashInferMLASparseBackend,
    )

    kernel_sizes = plan.kernel_block_sizes() or (
        DeepseekV4FlashInferMLASparseBackend.get_supported_kernel_block_sizes()
    )
    return pages.preferred_block_size(CacheConfig.DEFAULT_BLOCK_SIZE, kernel_sizes)


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
        prog="python -m vllm.v1.attention.backends.mla.sparse_mla_plan_report",
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
    )
    print(json.dumps(asdict(report), indent=2) if args.json else render(report))
    return 1 if report.error else 0


if __name__ == "__main__":
    sys.exit(main())
