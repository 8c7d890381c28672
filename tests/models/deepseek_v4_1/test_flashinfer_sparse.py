# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The fork's backends and attention layers answer from the page policy."""

from types import SimpleNamespace

import pytest
import torch

from vllm.models.deepseek_v4_1.nvidia import flashinfer_sparse as fork
from vllm.models.deepseek_v41 import attention as upstream_attention
from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as upstream
from vllm.v1.attention.backend import MultipleOf
from vllm.v1.attention.backends.mla import sparse_mla_page_policy as policy
from vllm.v1.kv_cache_interface import MLAAttentionSpec

MLA = fork.DeepseekV4FlashInferMLASparseBackend
SWA120 = fork.DeepseekSparseSWAFlashInferSM120Backend


def test_seed_surface_names():
    assert MLA.get_name() == "FLASHINFER_MLA_SPARSE_DSV41"
    assert issubclass(MLA, upstream.DeepseekV4FlashInferMLASparseBackend)
    assert issubclass(SWA120, upstream.DeepseekSparseSWAFlashInferBackend)
    assert issubclass(
        fork.DeepseekV4FlashInferSM120Attention,
        upstream.DeepseekV4FlashInferSM120Attention,
    )
    assert issubclass(
        fork.DeepseekV4FlashInferMLAAttention,
        upstream.DeepseekV4FlashInferMLAAttention,
    )
    assert fork.DeepseekV4FlashInferSM120Attention.swa_backend_cls is SWA120
    assert MLA.get_builder_cls() is fork.DeepseekV4FlashInferSparseMLAMetadataBuilder
    for name in (
        "DeepseekSparseSWAFlashInferMetadataBuilder",
        "DeepseekSparseSWAFlashInferBackend",
    ):
        assert getattr(fork, name) is getattr(upstream, name)


@pytest.mark.parametrize("minor", [0, 1])
def test_sm12x_backend_hooks(set_capability, minor):
    set_capability(12, minor)
    assert MLA.get_supported_kernel_block_sizes() == [128, 64]
    # --block-size stays 128: it also sizes the indexer K caches.
    assert MLA.get_preferred_block_size(16) == 128
    assert MLA.get_compressed_block_size(0) is None
    assert MLA.get_compressed_block_size(1) == 64
    assert MLA.get_compressed_block_size(2) == 128
    assert SWA120.get_supported_kernel_block_sizes() == [64]
    assert SWA120.get_preferred_block_size(16) == 64
    assert SWA120.get_swa_block_size() == 64


def test_sm100_backend_hooks_are_upstreams(set_capability):
    set_capability(10, 0)
    assert MLA.get_supported_kernel_block_sizes() == [128]
    assert MLA.get_preferred_block_size(16) == 128
    assert MLA.get_compressed_block_size(1) is None
    assert SWA120.get_swa_block_size() == 32
    sizes = SWA120.get_supported_kernel_block_sizes()
    assert len(sizes) == 1 and isinstance(sizes[0], MultipleOf)
    assert sizes[0].base == 32


@pytest.mark.parametrize(
    "capability, dtype, refused",
    [
        ((10, 0), "fp8_ds_mla", True),
        ((10, 0), "auto", False),
        ((12, 0), "fp8", False),
        ((12, 0), "bfloat16", True),
        ((9, 0), "fp8", False),
        ((8, 0), "fp8", True),
    ],
)
def test_supports_combination(capability, dtype, refused):
    reason = MLA.supports_combination(
        512,
        torch.bfloat16,
        dtype,
        None,
        True,
        True,
        True,
        False,
        policy.DeviceCapability(*capability),
    )
    assert (reason is not None) == refused


def _vllm_config(heads=64, block_size=128, cache_dtype="auto", spec_tokens=None):
    return SimpleNamespace(
        model_config=SimpleNamespace(
            hf_config=SimpleNamespace(num_attention_heads=heads, sliding_window=128)
        ),
        cache_config=SimpleNamespace(cache_dtype=cache_dtype, block_size=block_size),
        speculative_config=(
            SimpleNamespace(num_speculative_tokens=spec_tokens) if spec_tokens else None
        ),
        attention_config=SimpleNamespace(use_non_causal=spec_tokens is not None),
        kernel_config=SimpleNamespace(enable_jit_warmup=False),
    )


@pytest.fixture
def stub_upstream_init(monkeypatch):
    """Replace the upstream attention constructors (which build linear layers,
    need distributed state and probe FlashInfer on the GPU) by one that sets
    just what the cache geometry reads, with upstream's 32-token SWA cache."""
    calls = []

    def fake_init(self, vllm_config, prefix="", **kwargs):
        torch.nn.Module.__init__(self)
        calls.append(prefix)
        self.compress_ratio = int(prefix.rsplit("r", 1)[-1]) if "r" in prefix else 0
        self.is_kv_source = self.compress_ratio > 0
        self.head_dim = 512
        self.window_size = 128
        self.max_image_tokens = 0
        self.kv_cache_dtype, self.kv_cache_torch_dtype = (
            upstream_attention._resolve_dsv4_kv_cache_dtype(
                type(self).use_fp8_ds_mla_layout,
                vllm_config.cache_config.cache_dtype,
                None,
            )
        )
        self.kv_bytes_per_token, self.kv_page_alignment = 584, 576
        self.swa_cache_layer = SimpleNamespace(block_size=32)

    for cls in (
        upstream.DeepseekV4FlashInferSM120Attention,
        upstream.DeepseekV4FlashInferMLAAttention,
    ):
        monkeypatch.setattr(cls, "__init__", fake_init)
    monkeypatch.setattr(fork, "get_tensor_model_parallel_world_size", lambda: 1)
    return calls


@pytest.mark.parametrize("ratio", [1, 2])
def test_sm120_layer_gets_negotiated_caches(set_capability, stub_upstream_init, ratio):
    set_capability(12, 0)
    layer = fork.DeepseekV4FlashInferSM120Attention(
        _vllm_config(cache_dtype="fp8"), prefix=f"layer.r{ratio}"
    )
    assert stub_upstream_init == [f"layer.r{ratio}"]
    assert layer.swa_cache_layer.block_size == 64
    spec = layer.get_kv_cache_spec(
        SimpleNamespace(
            cache_config=SimpleNamespace(block_size=128, cache_dtype="fp8_ds_mla")
        )
    )
    assert isinstance(spec, MLAAttentionSpec)
    assert spec.block_size == 64 * ratio
    assert spec.tokens_per_state == ratio
    # 64 records of 584 bytes, padded to the 576-byte stride upstream uses.
    assert spec.page_size_bytes == -(-64 * 584 // 576) * 576


def test_unserved_shape_builds_a_layer_on_the_triton_kernel(
    set_capability, stub_upstream_init, monkeypatch
):
    set_capability(12, 0)
    monkeypatch.setattr(fork.sparse_mla_launcher, "_kernel_path", None)
    layer = fork.DeepseekV4FlashInferSM120Attention(
        _vllm_config(cache_dtype="fp8", spec_tokens=200), prefix="layer.r1"
    )
    assert layer.page_geometry.kernel_path == policy.TRITON
    assert "top-k [384]" in layer.page_geometry.fallback_reason
    assert fork.sparse_mla_launcher.selected_kernel() == policy.TRITON
    assert layer.swa_cache_layer.block_size == 64


def test_sm100_layer_keeps_upstream_caches(set_capability, stub_upstream_init):
    set_capability(10, 0)
    layer = fork.DeepseekV4FlashInferMLAAttention(_vllm_config(), prefix="layer.r1")
    assert layer.swa_cache_layer.block_size == 32
    spec = layer.get_kv_cache_spec(
        SimpleNamespace(cache_config=SimpleNamespace(block_size=128))
    )
    assert spec.block_size == 128


@pytest.mark.parametrize(
    "capability, config, match",
    [
        ((12, 0), _vllm_config(heads=256), "at most 128 attention heads"),
        ((12, 0), _vllm_config(cache_dtype="bfloat16"), "--kv-cache-dtype bfloat16"),
        ((10, 0), _vllm_config(cache_dtype="fp8_ds_mla"), "fp8_ds_mla"),
        # The indexer K caches keep --block-size and take 128-token pages.
        ((12, 0), _vllm_config(cache_dtype="fp8", block_size=64), "--block-size 64"),
        ((10, 0), _vllm_config(block_size=192), r"multiple of 128"),
    ],
)
def test_unserved_configs_fail_before_upstream_init(
    set_capability, stub_upstream_init, capability, config, match
):
    set_capability(*capability)
    cls = (
        fork.DeepseekV4FlashInferSM120Attention
        if capability[0] == 12
        else fork.DeepseekV4FlashInferMLAAttention
    )
    with pytest.raises(policy.UnsupportedSparseMLAConfig, match=match):
        cls(config, prefix="layer.r1")
    assert stub_upstream_init == []
