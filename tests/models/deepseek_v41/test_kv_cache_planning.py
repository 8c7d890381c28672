# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""vLLM 0.30.0's own KV-cache planning accepts the negotiated caches.

The specs of a small DeepSeek V4.1 model (layers of ratio 0, 1 and 2) go
through vLLM's grouping, page-size handling and KV-cache config, then the
worker's choice of kernel page per group, as at engine start-up.
"""

import json
from types import SimpleNamespace

import pytest
import torch

from tests.v1.attention.dsv41.flashinfer_release import fixed_pages
from tests.v1.attention.dsv41.sm12x_pages import force_sm12x_pages
from vllm.config import DeviceConfig, VllmConfig
from vllm.models.deepseek_v41.attention import (
    DeepseekV4IndexerCache,
    _indexer_k_cache_head_dim,
)
from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fork
from vllm.models.deepseek_v41.nvidia import sparse_mla_pages as policy
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backends.mla.indexer import DeepseekV41IndexerBackend
from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs
from vllm.v1.worker.utils import select_common_block_size
from vllm_dsv41_plan import report

# Only a FlashInfer with fixed SM120 pages makes the pages differ from
# upstream's; with runtime pages (0.7+) the plan is upstream's own.
pytestmark = fixed_pages

HF_CONFIG = SimpleNamespace(**json.loads(report.DEFAULT_CONFIG.read_text()))


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _engine_config(block_size: int) -> VllmConfig:
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    config.cache_config.block_size = block_size
    config.cache_config.cache_dtype = "fp8_ds_mla"
    # The DeepSeek V4 indexer backend packs its pages inside each block.
    config.cache_config.kv_cache_layout = "BLNHC"
    # Planning reads only the context length from the model config.
    object.__setattr__(
        config,
        "model_config",
        SimpleNamespace(original_max_model_len=8192, max_model_len=8192),
    )
    return config


def _model_specs(capability: DeviceCapability, config: VllmConfig):
    """Specs and backend per layer, as the built model would report them:
    the plan report's specs, its indexer K caches held against upstream's own
    ``get_kv_cache_spec`` on the mocked GPU."""
    plan = policy.plan_pages(capability)
    layer_cls = report.layer_class(capability, "FLASHINFER_MLA_SPARSE_DSV41")
    block_size = config.cache_config.block_size
    specs = report.cache_specs(layer_cls, capability, HF_CONFIG, "fp8", block_size)
    backends = {
        name: layer_cls.swa_backend_cls
        if name.endswith("swa_cache")
        else DeepseekV41IndexerBackend
        if name.endswith("indexer.k_cache")
        else layer_cls.backend_cls
        for name in specs
    }
    for layer in report.owning_indexer_layers(HF_CONFIG):
        cache = SimpleNamespace(
            cache_config=config.cache_config,
            head_dim=_indexer_k_cache_head_dim(HF_CONFIG.index_head_dim, False),
            dtype=torch.uint8,
            compress_ratio=HF_CONFIG.compress_ratios[layer],
            sparse_logits=False,
            rocm_mxfp4=False,
        )
        name = f"model.layers.{layer}.attn.indexer.k_cache"
        assert specs[name] == DeepseekV4IndexerCache.get_kv_cache_spec(cache, config)
    return plan, specs, backends


@pytest.mark.parametrize("minor", [0, 1])
def test_sm12x_plan_is_accepted_by_vllm(set_capability, minor):
    _check_sm12x_pages_in_vllms_planner(set_capability(12, minor), {1: 64, 2: 64})


def test_forced_sm12x_pages_on_sm90_are_accepted_by_vllm(set_capability, monkeypatch):
    """The test-only setting the engine comparison on an H200 uses: the
    SM12x pages, 64 states per kernel page for every ratio, as on SM12x."""
    force_sm12x_pages(monkeypatch.setattr)
    _check_sm12x_pages_in_vllms_planner(set_capability(9, 0), {1: 64, 2: 64})


def _check_sm12x_pages_in_vllms_planner(capability, kernel_states) -> None:
    """SM12x cache pages pass vLLM's planner; ``kernel_states``: compressed
    states per kernel page by compress ratio."""
    config = _engine_config(
        fork.DeepseekV4FlashInferMLASparseBackend.get_preferred_block_size(16)
    )
    assert config.cache_config.block_size == 128
    plan, specs, backends = _model_specs(capability, config)

    # Page sizes from first principles: 64 packed 584-byte records per page,
    # padded to the 576-byte stride (upstream's alignment rule).
    page_bytes = _round_up(64 * 584, 576)
    for layer, ratio in enumerate(HF_CONFIG.compress_ratios):
        swa = specs[f"model.layers.{layer}.attn.swa_cache"]
        assert (swa.block_size, swa.page_size_bytes) == (64, page_bytes)
        if layer in HF_CONFIG.kv_source_layer_ids:
            compressed = specs[f"model.layers.{layer}.attn"]
            assert compressed.block_size == 64 * ratio
            assert compressed.page_size_bytes == page_bytes

    # vLLM 0.30's planner (the base whose FlashInfer has fixed pages).
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

    memory = 2 << 30
    (kv_config,) = get_kv_cache_configs(config, [specs], [memory])
    grouped = [name for g in kv_config.kv_cache_groups for name in g.layer_names]
    assert sorted(grouped) == sorted(specs)
    for group in kv_config.kv_cache_groups:
        spec = group.kv_cache_spec
        inner = (
            next(iter(spec.kv_cache_specs.values()))
            if isinstance(spec, UniformTypeKVCacheSpecs)
            else spec
        )
        group_backends = list(dict.fromkeys(backends[n] for n in group.layer_names))
        # The worker picks one kernel page per group; it must exist and give
        # the FlashInfer caches 64 entries per kernel page.
        kernel_block = select_common_block_size(spec.block_size, group_backends)
        if fork.DeepseekV4FlashInferMLASparseBackend in group_backends:
            ratio = inner.tokens_per_state
            assert kernel_block // ratio == kernel_states[ratio]
        if fork.DeepseekSparseSWAFlashInferSM120Backend in group_backends:
            assert kernel_block == 64
    # Every cache tensor views one backing allocation that fits the memory.
    assert max(t.size for t in kv_config.kv_cache_tensors) <= memory
    assert kv_config.num_blocks > 0


def test_sm100_plan_is_upstreams(set_capability):
    capability = set_capability(10, 0)
    config = _engine_config(128)
    _, specs, _ = _model_specs(capability, config)
    assert {s.block_size for n, s in specs.items() if n.endswith("swa_cache")} == {32}
    assert {s.block_size for n, s in specs.items() if n.endswith(".attn")} == {128}


@pytest.mark.parametrize("block_size", [None, 64, 128])
def test_sm90_triton_plan_is_accepted_by_vllm(set_capability, block_size):
    """H100/H200 run the Triton kernel on upstream's pages. Each compressed-KV
    group also holds indexer K caches, whose SM90 kernels take 64-token pages
    only, so the group needs a kernel page both take: the H200's engine failed
    with "No common block size for 64" when the sparse-MLA backend offered
    upstream's 128 alone. ``None``: the block size vLLM picks by default."""
    capability = set_capability(9, 0)
    if block_size is None:
        block_size = fork.DeepseekV4FlashInferMLASparseBackend.get_preferred_block_size(
            16
        )
    config = _engine_config(block_size)
    _, specs, backends = _model_specs(capability, config)
    # Upstream's pages: the compressed caches take --block-size, as the
    # indexer K caches do.
    assert {s.block_size for n, s in specs.items() if n.endswith(".attn")} == {
        block_size
    }
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

    (kv_config,) = get_kv_cache_configs(config, [specs], [2 << 30])
    for group in kv_config.kv_cache_groups:
        group_backends = list(dict.fromkeys(backends[n] for n in group.layer_names))
        kernel_block = select_common_block_size(
            group.kv_cache_spec.block_size, group_backends
        )
        assert group.kv_cache_spec.block_size % kernel_block == 0
