# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""DeepSeek V4.1's indexer K caches are paged in the states DeepGEMM's paged
MQA logits read: 64 compressed states per page, so 64 * r tokens for a layer
of compress ratio r, whatever --block-size is."""

from types import SimpleNamespace

import pytest
import torch

from vllm.models.deepseek_v41.attention import DeepseekV4IndexerCache
from vllm.v1.attention.backends.mla import indexer_pages
from vllm.v1.attention.backends.mla.indexer import DeepseekV41IndexerBackend
from vllm.v1.kv_cache_interface import MLAAttentionSpec

STATES_PER_PAGE = 64


@pytest.mark.parametrize("capability", [(9, 0), (10, 0), (12, 0), (12, 1)])
def test_indexer_backend_reports_a_kernel_page_per_ratio(set_capability, capability):
    set_capability(*capability)
    assert DeepseekV41IndexerBackend.get_supported_kernel_block_sizes() == [
        2 * STATES_PER_PAGE,
        STATES_PER_PAGE,
    ]


@pytest.mark.parametrize("block_size", [64, 128, 256])
@pytest.mark.parametrize("ratio", [1, 2])
@pytest.mark.parametrize("major", [10, 12])
def test_indexer_cache_spec_holds_64_states_per_page(
    set_capability, major, ratio, block_size
):
    """Upstream's ``get_kv_cache_spec`` of the indexer cache (edited)."""
    set_capability(major, 0)
    cache = SimpleNamespace(
        compress_ratio=ratio,
        head_dim=132,
        dtype=torch.uint8,
        cache_config=SimpleNamespace(block_size=block_size),
        # Read by newer specs: the dense-logits CUDA indexer.
        sparse_logits=False,
        rocm_mxfp4=False,
    )
    vllm_config = SimpleNamespace(cache_config=SimpleNamespace(cache_dtype="fp8"))
    spec = DeepseekV4IndexerCache.get_kv_cache_spec(cache, vllm_config)
    assert isinstance(spec, MLAAttentionSpec)
    assert spec.block_size == STATES_PER_PAGE * ratio
    assert spec.block_size // spec.tokens_per_state == STATES_PER_PAGE


@pytest.fixture
def deepgemm_on_gpu(monkeypatch):
    from vllm.platforms import current_platform

    monkeypatch.setattr(type(current_platform), "is_cuda", lambda self: True)
    monkeypatch.setattr("vllm.utils.import_utils.has_deep_gemm", lambda: True)
    indexer_pages.confirm_indexer_pages.cache_clear()
    yield lambda takes: monkeypatch.setattr(indexer_pages, "deepgemm_takes", takes)
    indexer_pages.confirm_indexer_pages.cache_clear()


def test_pages_deepgemm_refuses_fail_while_the_model_is_built(deepgemm_on_gpu):
    deepgemm_on_gpu(lambda states: states == 32)
    with pytest.raises(ValueError, match=r"64 states .* SM120 GPU \(it takes \[32\]\)"):
        indexer_pages.confirm_indexer_pages(indexer_pages.DeviceCapability(12, 0))


def test_pages_deepgemm_takes_are_confirmed(deepgemm_on_gpu):
    deepgemm_on_gpu(lambda states: states == STATES_PER_PAGE)
    # No error: the model build goes on.
    indexer_pages.confirm_indexer_pages(indexer_pages.DeviceCapability(12, 0))
