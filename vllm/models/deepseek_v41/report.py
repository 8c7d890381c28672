# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""What DeepSeek V4.1 attention will do on a GPU, before loading any weights.

    python -m vllm.models.deepseek_v41.report plan --capability 12.0 \
        [--config config.json] [--tp N] [--kv-cache-dtype fp8_ds_mla] [--json]

Prints, for each KV cache (sliding window; compressed KV per ratio), the page
size in tokens and bytes, the attention class and FlashInfer path that will
run, the padded head count, and the error start-up would raise, if any. It
needs no GPU: the architecture is given, the page policy reads FlashInfer's
tables, and the page bytes come from vLLM's own KV-cache spec classes.
"""

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from vllm.models.deepseek_v41.attention import (
    DeepseekV4Attention,
    _resolve_dsv4_kv_cache_dtype,
)
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backends.mla import sparse_mla_page_policy as policy
from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache
from vllm.v1.kv_cache_interface import KVCacheSpec

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "dsv41_small.json"
# What each kernel path calls, for the reader of the report.
KERNEL_PATHS = {
    policy.TRTLLM_GEN: "FlashInfer TRTLLM-gen trtllm_batch_decode_sparse_mla_dsv4"
    " (SWA + compressed in one index table)",
    policy.FLASHINFER_SM120: "FlashInfer SM120 trtllm_batch_decode_sparse_mla_dsv4"
    " (two segments: SWA, then compressed)",
    policy.TRITON: "the portable Triton kernel triton_sparse_mla_dsv41"
    " (two segments: SWA, then compressed)",
}


@dataclass
class CachePlan:
    cache: str
    layers: list[int]
    page_tokens: int
    states_per_page: int
    page_bytes: int


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
    plan: policy.PagePlan,
    kv_cache_dtype: str,
    uses_fp8_ds_mla_layout: bool,
) -> dict[str, KVCacheSpec]:
    """The KV-cache specs a model's attention layers report, by layer name.

    Built by upstream's own ``get_kv_cache_spec`` methods on stand-ins that
    hold just the fields those methods read, with the negotiated page sizes.
    """
    from vllm.config.cache import CacheConfig
    from vllm.models.deepseek_v41.nvidia.flashinfer_sparse import (
        DeepseekV4FlashInferMLASparseBackend,
    )
    from vllm.models.deepseek_v41.nvidia.sparse_mla_negotiation import (
        DSV41_COMPRESS_RATIOS,
        preferred_block_size,
    )

    cache_dtype, torch_dtype = _resolve_dsv4_kv_cache_dtype(
        uses_fp8_ds_mla_layout, kv_cache_dtype, None
    )
    # A plan without pages of its own keeps the backend's (upstream's) pages;
    # on a GPU-less host that is the backend's answer with no plan.
    kernel_sizes = plan.kernel_block_sizes(DSV41_COMPRESS_RATIOS) or (
        DeepseekV4FlashInferMLASparseBackend.get_supported_kernel_block_sizes()
    )
    block_size = preferred_block_size(CacheConfig.DEFAULT_BLOCK_SIZE, kernel_sizes)
    cache_config = SimpleNamespace(cache_dtype=cache_dtype, block_size=block_size)
    vllm_config = SimpleNamespace(cache_config=cache_config)
    # SM10x stores the 528-byte MXFP8 record, others the 584-byte one.
    mxfp8 = policy.is_sm100(capability)
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
    specs: dict[str, KVCacheSpec] = {}
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


def attention_class_for(capability: DeviceCapability) -> type:
    """The layer ``--attention-backend FLASHINFER_MLA_SPARSE_DSV41`` builds on
    ``capability`` (``_select_dsv4_attn_cls``): TRTLLM-gen's on SM10x, the
    two-segment layer everywhere else."""
    from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fi

    if policy.is_sm100(capability):
        return fi.DeepseekV4FlashInferMLAAttention
    return fi.DeepseekV4FlashInferSM120Attention


def make_plan(
    capability: DeviceCapability,
    hf_config: Any,
    *,
    tensor_parallel_size: int = 1,
    kv_cache_dtype: str = "auto",
    num_speculative_tokens: int | None = None,
    use_non_causal: bool = False,
    envelope: policy.SM120Envelope | None = None,
) -> Plan:
    from vllm.models.deepseek_v41.nvidia import sparse_mla_negotiation

    report = Plan(
        capability=f"{capability.major}.{capability.minor}",
        local_heads=hf_config.num_attention_heads // tensor_parallel_size,
    )
    try:
        attention_cls = attention_class_for(capability)
        geometry = sparse_mla_negotiation.negotiate_for_model(
            capability,
            hf_config,
            tensor_parallel_size=tensor_parallel_size,
            kv_cache_dtype=kv_cache_dtype,
            uses_fp8_ds_mla_layout=attention_cls.use_fp8_ds_mla_layout,
            use_non_causal=use_non_causal,
            num_speculative_tokens=num_speculative_tokens,
            envelope=envelope,
        )
    except policy.UnsupportedSparseMLAConfig as e:
        report.error = str(e)
        return report

    plan = geometry.plan
    report.attention_class = f"{attention_cls.__module__}.{attention_cls.__name__}"
    report.kernel_path = KERNEL_PATHS[geometry.kernel_path]
    report.note = geometry.fallback_reason
    report.flashinfer = plan.envelope.source if plan.envelope else None
    report.padded_heads = geometry.padded_heads
    report.kv_cache_dtype = geometry.kv_cache_dtype
    report.swa_topks = list(geometry.swa_topks)
    specs = cache_specs(
        capability,
        hf_config,
        plan,
        kv_cache_dtype,
        attention_cls.use_fp8_ds_mla_layout,
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
    return report


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
            f"{'cache':<16}{'layers':<14}{'page tokens':>12}{'states/page':>13}"
            f"{'page bytes':>12}"
        ),
    ]
    for c in report.caches:
        layers = ",".join(map(str, c.layers))
        lines.append(
            f"{c.cache:<16}{layers:<14}{c.page_tokens:>12}{c.states_per_page:>13}"
            f"{c.page_bytes:>12}"
        )
    if report.note:
        lines.append(f"note: {report.note}")
    lines.append("status: served")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="page sizes and kernels for one GPU")
    p.add_argument("--capability", required=True, help="e.g. 10.0, 12.0, 12.1")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--tp", type=int, default=1, help="tensor parallel size")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--num-speculative-tokens", type=int, default=None)
    p.add_argument("--non-causal", action="store_true", help="DSpark non-causal")
    p.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    major, minor = (int(x) for x in args.capability.split("."))
    hf_config = SimpleNamespace(**json.loads(args.config.read_text()))
    report = make_plan(
        DeviceCapability(major, minor),
        hf_config,
        tensor_parallel_size=args.tp,
        kv_cache_dtype=args.kv_cache_dtype,
        num_speculative_tokens=args.num_speculative_tokens,
        use_non_causal=args.non_causal,
    )
    print(json.dumps(asdict(report), indent=2) if args.json else render(report))
    return 1 if report.error else 0


if __name__ == "__main__":
    sys.exit(main())
