# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""DeepSeek V4.1's FlashInfer backends and layers, edited in place, answer
from the page policy and negotiate before they build anything."""

from types import SimpleNamespace

import pytest
import torch

from tests.v1.attention.dsv41.flashinfer_release import (
    FIXED_SM120_PAGE,
    fixed_pages,
    runtime_pages,
)
from vllm.models.deepseek_v41 import attention as dsv41_attention
from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fi
from vllm.models.deepseek_v41.nvidia import sparse_mla_pages as policy
from vllm.models.deepseek_v41.nvidia.flashmla import DeepseekV4FlashMLAAttention
from vllm.v1.attention.backend import MultipleOf
from vllm.v1.kv_cache_interface import MLAAttentionSpec

MLA = fi.DeepseekV4FlashInferMLASparseBackend
SWA120 = fi.DeepseekSparseSWAFlashInferSM120Backend


def test_backend_and_layer_classes():
    assert MLA.get_name() == "FLASHINFER_MLA_SPARSE_DSV41"
    assert issubclass(SWA120, fi.DeepseekSparseSWAFlashInferBackend)
    assert fi.DeepseekV4FlashInferSM120Attention.swa_backend_cls is SWA120
    # SM10x keeps upstream's SWA backend.
    assert (
        fi.DeepseekV4FlashInferMLAAttention.swa_backend_cls
        is fi.DeepseekSparseSWAFlashInferBackend
    )
    assert MLA.get_builder_cls() is fi.DeepseekV4FlashInferSparseMLAMetadataBuilder


@fixed_pages
@pytest.mark.parametrize("minor", [0, 1])
def test_sm12x_backend_hooks(set_capability, minor):
    set_capability(12, minor)
    assert MLA.get_supported_kernel_block_sizes() == [128, 64]
    # --block-size stays 128: it also sizes the indexer K caches.
    assert MLA.get_preferred_block_size(16) == 128
    assert MLA.get_preferred_block_size(64) == 64
    assert MLA.get_compressed_block_size(0) is None
    assert MLA.get_compressed_block_size(1) == 64
    assert MLA.get_compressed_block_size(2) == 128
    assert SWA120.get_supported_kernel_block_sizes() == [64]
    assert SWA120.get_preferred_block_size(16) == 64
    assert SWA120.get_swa_block_size() == 64


@pytest.mark.parametrize(
    "capability",
    [(10, 0)] + ([(12, 0), (12, 1)] if FIXED_SM120_PAGE is None else []),
)
def test_backend_hooks_are_upstreams_where_kernels_take_any_page(
    set_capability, capability
):
    """SM10x, and SM12x with a FlashInfer that takes the page at run time."""
    set_capability(*capability)
    assert MLA.get_supported_kernel_block_sizes() == [128]
    assert MLA.get_preferred_block_size(16) == 128
    assert MLA.get_compressed_block_size(1) is None
    assert SWA120.get_swa_block_size() == 32
    sizes = SWA120.get_supported_kernel_block_sizes()
    assert len(sizes) == 1 and isinstance(sizes[0], MultipleOf)
    assert sizes[0].base == 32


def test_other_backends_keep_upstream_pages(set_capability):
    set_capability(12, 0)
    flashmla_swa = DeepseekV4FlashMLAAttention.swa_backend_cls
    assert flashmla_swa.get_swa_block_size() == 32
    assert DeepseekV4FlashMLAAttention.backend_cls.get_compressed_block_size(1) is None
    # Their layers negotiate nothing.
    assert DeepseekV4FlashMLAAttention.backend_cls.negotiate(None) is None


@pytest.mark.parametrize(
    "capability, dtype, refused",
    [
        ((10, 0), "fp8_ds_mla", True),
        ((10, 0), "auto", False),
        ((10, 0), None, False),
        ((12, 0), "fp8", False),
        ((12, 0), "bfloat16", True),
        # No flag, or auto: the two-segment layer stores the packed record,
        # as start-up resolves it; refusing it here would contradict start-up.
        ((12, 0), "auto", False),
        ((12, 1), None, False),
        ((9, 0), "auto", False),
        ((9, 0), None, False),
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


def _vllm_config(
    heads=64, block_size=128, cache_dtype="auto", spec_tokens=None, user_block=True
):
    """``user_block``: whether ``block_size`` came from --block-size (else it
    is vLLM's generic default, replaced after the model is built)."""
    return SimpleNamespace(
        model_config=SimpleNamespace(
            hf_config=SimpleNamespace(
                num_attention_heads=heads,
                sliding_window=128,
                compress_ratios=[0, 1, 2, 0],
            )
        ),
        cache_config=SimpleNamespace(
            cache_dtype=cache_dtype,
            block_size=block_size,
            user_specified_block_size=user_block,
        ),
        speculative_config=(
            SimpleNamespace(num_speculative_tokens=spec_tokens) if spec_tokens else None
        ),
        attention_config=SimpleNamespace(use_non_causal=spec_tokens is not None),
        kernel_config=SimpleNamespace(enable_jit_warmup=False),
    )


@pytest.fixture
def single_gpu(monkeypatch):
    monkeypatch.setattr(policy, "get_tensor_model_parallel_world_size", lambda: 1)


@pytest.mark.parametrize("ratio", [1, 2])
@pytest.mark.parametrize("major, expected_states", [(12, FIXED_SM120_PAGE), (10, None)])
def test_compressed_kv_spec_takes_the_negotiated_page(
    set_capability, ratio, major, expected_states
):
    """Upstream's own ``get_kv_cache_spec`` (edited) on a kv-source layer."""
    set_capability(major, 0)
    layer = SimpleNamespace(
        is_kv_source=True,
        backend_cls=MLA,
        compress_ratio=ratio,
        head_dim=512,
        kv_cache_dtype="fp8_ds_mla",
        kv_cache_torch_dtype=torch.uint8,
        kv_page_alignment=576,
        # The record's width: one name on vLLM 0.30, two from 0.33.
        kv_bytes_per_token=584,
        swa_bytes_per_token=584,
        compressed_bytes_per_token=584,
    )
    vllm_config = SimpleNamespace(cache_config=SimpleNamespace(block_size=128))
    spec = dsv41_attention.DeepseekV4Attention.get_kv_cache_spec(layer, vllm_config)
    assert isinstance(spec, MLAAttentionSpec)
    assert spec.tokens_per_state == ratio
    if expected_states is None:
        assert spec.block_size == 128  # upstream's --block-size page
        return
    assert spec.block_size == expected_states * ratio
    # 64 records of 584 bytes, padded to the 576-byte stride upstream uses.
    assert spec.page_size_bytes == -(-64 * 584 // 576) * 576


@fixed_pages
def test_unserved_shape_negotiates_the_triton_kernel(set_capability, single_gpu):
    set_capability(12, 0)
    geometry = MLA.negotiate(_vllm_config(cache_dtype="fp8", spec_tokens=200))
    assert geometry.kernel == policy.SparseMLAKernel.TRITON
    assert "top-k [384]" in geometry.note
    assert geometry.swa_block_size == 64
    # The SM120 layer's shape probe asks the geometry, which serves it.
    assert geometry.serves(64, 384)


def test_served_shape_negotiates_flashinfer(set_capability, single_gpu):
    set_capability(12, 0)
    geometry = MLA.negotiate(_vllm_config(cache_dtype="fp8"))
    assert geometry.kernel == policy.SparseMLAKernel.FLASHINFER_SM120
    assert geometry.note is None
    assert geometry.serves(64, 128)
    # A shape FlashInfer lacks (0.6.x) is not the FlashInfer kernel's.
    assert geometry.serves(64, 384) is (FIXED_SM120_PAGE is None)


@runtime_pages
def test_reported_missing_shape_runs_flashinfer(set_capability, single_gpu):
    """64 heads at top-k 1152 (no 0.6.18 kernel) is FlashInfer's from 0.7."""
    set_capability(12, 0)
    config = _vllm_config(heads=64, cache_dtype="fp8")
    config.model_config.hf_config.sliding_window = 1152
    geometry = MLA.negotiate(config)
    assert geometry.kernel == policy.SparseMLAKernel.FLASHINFER_SM120
    assert geometry.swa_topks == (1152,)
    assert geometry.swa_block_size == 32


def test_an_unset_block_size_is_not_refused(set_capability, single_gpu):
    """Without --block-size the layers are built while the cache config still
    holds vLLM's generic 16; the backend's preferred page replaces it later.
    (On the H200 the engine failed here, telling the user to leave
    --block-size unset, which they had.)"""
    set_capability(9, 0)
    unset = _vllm_config(cache_dtype="fp8", block_size=16, user_block=False)
    geometry = MLA.negotiate(unset)
    assert geometry.kernel == policy.SparseMLAKernel.TRITON
    chosen = _vllm_config(cache_dtype="fp8", block_size=16)
    with pytest.raises(policy.UnsupportedSparseMLAConfig, match="--block-size 16"):
        MLA.negotiate(chosen)


@pytest.mark.parametrize(
    "capability, config, match",
    [
        ((12, 0), _vllm_config(heads=256), "at most 128 attention heads"),
        ((12, 0), _vllm_config(cache_dtype="bfloat16"), "--kv-cache-dtype bfloat16"),
        ((10, 0), _vllm_config(cache_dtype="fp8_ds_mla"), "fp8_ds_mla"),
        # No attention kernel takes 32-token compressed pages on SM12x.
        ((12, 0), _vllm_config(cache_dtype="fp8", block_size=32), "--block-size 32"),
        ((10, 0), _vllm_config(block_size=192), r"Use one of \[128, 256\]"),
        ((8, 0), _vllm_config(cache_dtype="fp8"), "this GPU is SM80"),
        ((12, 0), _vllm_config(heads=0), "0 attention heads"),
    ],
)
def test_unserved_configs_fail_before_the_layer_builds_anything(
    set_capability, single_gpu, capability, config, match
):
    """Upstream's constructors (edited) negotiate right after
    ``nn.Module.__init__``: the stand-in config has nothing else a layer
    reads, so any other first step would fail with another error."""
    set_capability(*capability)
    cls = (
        fi.DeepseekV4FlashInferMLAAttention
        if capability[0] == 10
        else fi.DeepseekV4FlashInferSM120Attention
    )
    with pytest.raises(policy.UnsupportedSparseMLAConfig, match=match):
        cls(config, prefix="model.layers.1.attn")
