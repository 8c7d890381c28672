# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Start-up's check against what vLLM then does with DeepSeek V4.1 Flash's
published layout: every configuration start-up accepts gets through vLLM's
own KV-cache layout resolution, grouping, planning, allocation and the map
to kernel blocks at binding, with pages each kernel reads; every one it
refuses fails there (or gives a kernel a page it cannot read), and is
refused with one message naming the --block-size values that work.

The GPU is mocked at the platform boundary; the allocation is on the meta
device, so binding runs its real stride checks without memory.
"""

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.plan_report.start_up import layer_class
from vllm.config import DeviceConfig, VllmConfig
from vllm.config.cache import CacheConfig
from vllm.models.deepseek_v41.nvidia import sparse_mla_pages as policy
from vllm.models.deepseek_v41.nvidia.flashmla import DeepseekV4FlashMLAAttention
from vllm.platforms import current_platform
from vllm.v1.attention.backends.mla.indexer import DeepseekV41IndexerBackend
from vllm_dsv41_plan import report

LAYOUT = SimpleNamespace(
    **json.loads(
        (Path(__file__).parent / "configs" / "dsv41_flash_layout.json").read_text()
    )
)
# (way, GPU): FLASHINFER_MLA_SPARSE_DSV41 everywhere, and FlashMLA, vLLM's
# default on SM90 (SM12x's default is the FlashInfer layer; SM100's, mega
# attention, reads MXFP8 records the report's specs do not model).
WAYS = [("flashinfer", c) for c in [(9, 0), (10, 0), (12, 0), (12, 1)]]
WAYS.append(("flashmla", (9, 0)))
BLOCK_SIZES = [None, 16, 32, 64, 128, 256]
# Compressed states per indexer page DeepGEMM's paged MQA logits read (FP8
# keys), by GPU family, as the host check of the DeepGEMM vLLM vendors reads
# (strings of vllm/third_party/deep_gemm/_C*.so): written here, not asked.
DEEPGEMM_STATES = {9: {32, 64}, 10: {32, 64, 128}, 12: {32, 64}}


def _engine_config(block_size: int) -> VllmConfig:
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    config.cache_config.block_size = block_size
    config.cache_config.cache_dtype = "fp8_ds_mla"
    object.__setattr__(
        config,
        "model_config",
        # DeepSeek V4.1 declares no grouping of its own (no
        # SupportsKVCacheGrouping): vLLM's default grouping runs.
        SimpleNamespace(
            original_max_model_len=8192,
            max_model_len=8192,
            supports_kv_cache_grouping=False,
        ),
    )
    return config


def _backend_of(name: str, layer_cls: type) -> type:
    if name.endswith("swa_cache"):
        return layer_cls.swa_backend_cls
    if name.endswith("indexer.k_cache"):
        return DeepseekV41IndexerBackend
    return layer_cls.backend_cls


def _layer_class(way: str, capability) -> type:
    if way == "flashmla":
        return DeepseekV4FlashMLAAttention
    return layer_class(capability)


def _default_block_size(layer_cls: type) -> int:
    """The --block-size vLLM picks when none is given, over the layer's backends."""
    backends = [layer_cls.backend_cls, layer_cls.swa_backend_cls]
    backends.append(DeepseekV41IndexerBackend)
    platform, default = type(current_platform), CacheConfig.DEFAULT_BLOCK_SIZE
    if not hasattr(platform, "_preferred_block_size_for_backends"):
        # Before vLLM asked every backend: the attention backend's preference.
        return layer_cls.backend_cls.get_preferred_block_size(default)
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    return platform._preferred_block_size_for_backends(backends, default, config)


def _start_up_refusal(
    monkeypatch, layer_cls, capability, tp: int, block_size
) -> str | None:
    """What the layers raise as the model is built (None: builds): the
    backend's negotiation, then the kv-source layers' --block-size check where
    this vLLM's layers make it."""
    monkeypatch.setattr(policy, "get_tensor_model_parallel_world_size", lambda: tp)
    config = SimpleNamespace(
        model_config=SimpleNamespace(hf_config=LAYOUT),
        cache_config=SimpleNamespace(
            cache_dtype="fp8",
            block_size=block_size or CacheConfig.DEFAULT_BLOCK_SIZE,
            user_specified_block_size=block_size is not None,
        ),
        speculative_config=None,
        attention_config=SimpleNamespace(use_non_causal=False),
    )
    try:
        layer_cls.backend_cls.negotiate(config)
        size = block_size or _default_block_size(layer_cls)
        specs = report.cache_specs(layer_cls, capability, LAYOUT, "fp8", size)
        report.check_block_size(layer_cls, specs, block_size, LAYOUT)
    except ValueError as e:  # UnsupportedSparseMLAConfig is one
        return str(e)
    return None


def _plan_kv_caches(config: VllmConfig, specs: dict) -> list:
    """vLLM's KV-cache configs for one worker holding ``specs``."""
    try:
        from vllm.v1.core import kv_cache_planning as planning
    except ImportError:  # the planner still lives in kv_cache_utils
        from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

        return get_kv_cache_configs(config, [specs], [4 << 30])
    groups = planning.get_global_kv_cache_groups(config, [specs])
    return planning.get_kv_cache_configs(config, [specs], [4 << 30], groups)


def _bind(layer_cls, capability, block_size: int | None) -> dict[str, tuple]:
    """Run vLLM's KV-cache path for the layout; return, per bound cache, its
    tokens per state and the states of one kernel page. Raises as vLLM does."""
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )
    from vllm.v1.worker import utils as worker

    size = block_size or _default_block_size(layer_cls)
    config = _engine_config(size)
    specs = report.cache_specs(layer_cls, capability, LAYOUT, "fp8", size)
    backends = {name: _backend_of(name, layer_cls) for name in specs}
    layout = resolve_kv_cache_layout(
        config,
        [[m.name for m in get_supported_kv_cache_layouts(set(backends.values()))]],
        list(specs.values()),
    )
    (kv_config,) = _plan_kv_caches(config, specs)
    # Attention groups as vLLM's GPU worker forms them: by backend, per-layer
    # spec and query-head count (none of these layers has one).
    attn_groups = []
    for gid, group in enumerate(kv_config.kv_cache_groups):
        by_key: dict[tuple, list[str]] = {}
        for name in group.layer_names:
            by_key.setdefault((backends[name], specs[name]), []).append(name)
        attn_groups.append(
            [
                worker.AttentionGroup(b, names, spec, gid)
                for (b, spec), names in by_key.items()
            ]
        )
    kernel_block_sizes = worker.prepare_kernel_block_sizes(kv_config, attn_groups)
    # On the meta device the allocation holds no memory; binding still runs
    # its stride checks.
    caches = worker.allocate_kv_cache(
        kv_config, torch.device("meta"), layout, kernel_block_sizes
    )
    if not hasattr(worker, "map_kv_caches_to_kernel_blocks"):
        bound = caches  # the layers bind the allocation's views as they are
    else:
        # As AttentionGroup.create_metadata_builders narrows a group's kernel
        # block to what its own backend takes (the builders need a GPU).
        for gid, group_list in enumerate(attn_groups):
            for group in group_list:
                kernel = worker.select_common_block_size(
                    kernel_block_sizes[gid], [group.backend], [group.kv_cache_spec]
                )
                if kernel != group.kv_cache_spec.block_size:
                    group.kernel_block_size = kernel
        groups = [g for group_list in attn_groups for g in group_list]
        bound = worker.map_kv_caches_to_kernel_blocks(caches, groups)
    return {
        name: (specs[name].tokens_per_state, tensor.shape[-2])
        for name, tensor in bound.items()
    }


def _kernels_take(capability, plan, bound: dict[str, tuple]) -> list[str]:
    """Pages no kernel of the layer reads: the indexer's against DeepGEMM's
    rule; the SM120 kernels' against a FlashInfer built for one page."""
    wrong = []
    for name, (_, states) in bound.items():
        if name.endswith("indexer.k_cache"):
            if states not in DEEPGEMM_STATES[capability[0]]:
                wrong.append(f"{name}: {states} states for DeepGEMM")
        elif (
            plan.fixed_page
            and plan.kernel is policy.SparseMLAKernel.FLASHINFER_SM120
            and states != plan.fixed_page
        ):
            wrong.append(f"{name}: {states} entries, kernel takes {plan.fixed_page}")
    return wrong


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize(
    "way, capability", WAYS, ids=[f"{w}-sm{c[0]}{c[1]}" for w, c in WAYS]
)
def test_start_up_refuses_exactly_what_vllm_cannot_serve(
    monkeypatch, set_capability, way, capability, tp, block_size
):
    capability = set_capability(*capability)
    layer_cls = _layer_class(way, capability)
    plan = policy.plan_pages(capability)
    refusal = _start_up_refusal(monkeypatch, layer_cls, capability, tp, block_size)

    try:
        bound = _bind(layer_cls, capability, block_size)
        failure = "; ".join(_kernels_take(capability, plan, bound)) or None
    except (ValueError, NotImplementedError, AssertionError) as e:
        failure = f"{type(e).__name__}: {e}"

    if refusal is None:
        assert failure is None, f"start-up accepted what fails later: {failure}"
        return
    assert failure is not None, f"start-up refused what vLLM serves: {refusal}"
    assert refusal.count("\n") == 0
    if block_size is not None:
        # The page policy's words, or the layers' own --block-size check's.
        named = re.search(r"Use one of \[([\d, ]*)\]", refusal) or re.search(
            r"Use --block-size ([\d or]+),", refusal
        )
        assert named, refusal
        for working in map(int, re.findall(r"\d+", named[1])):
            bound = _bind(layer_cls, capability, working)
            assert not _kernels_take(capability, plan, bound), working
