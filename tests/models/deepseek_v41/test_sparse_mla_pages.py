# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""DeepSeek V4.1 KV-cache pages on NVIDIA: the page policy against the
installed FlashInfer, and the backends and caches that take its pages."""

import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.models.deepseek_v41.page_policy import fresh_flashinfer_probe  # noqa: F401
from tests.v1.attention.dsv41.flashinfer_release import (
    FIXED_SM120_PAGE,
    RUNTIME_MAX_HEADS,
    RUNTIME_MIN_TOPK,
    fixed_pages,
    runtime_pages,
)
from vllm.models.deepseek_v41 import attention as dsv41_attention
from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fi
from vllm.models.deepseek_v41.nvidia import sparse_mla_pages as policy
from vllm.models.deepseek_v41.nvidia.flashmla import DeepseekV4FlashMLAAttention
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backend import MultipleOf
from vllm.v1.kv_cache_interface import MLAAttentionSpec

MLA = fi.DeepseekV4FlashInferMLASparseBackend
SWA120 = fi.DeepseekSparseSWAFlashInferSM120Backend
SM90, SM100, SM103 = DeviceCapability(9, 0), DeviceCapability(10, 0), (10, 3)
SM120, SM121 = DeviceCapability(12, 0), DeviceCapability(12, 1)


def _flashinfer_source() -> str:
    spec = importlib.util.find_spec("flashinfer")
    assert spec is not None and spec.submodule_search_locations
    root = Path(spec.submodule_search_locations[0])
    return (root / "mla" / "_sparse_mla_sm120.py").read_text()


@fixed_pages
def test_envelope_matches_flashinfer_tables():
    # Read the two tables with a regex, independently of the policy's AST.
    text = _flashinfer_source()
    page = int(re.search(r"^_DECODE_DSV4_PAGE_BLOCK_SIZE = (\d+)", text, re.M)[1])
    table = re.search(
        r"^_DECODE_DSV4_DISPATCH = frozenset\((.*?)\n\)", text, re.M | re.S
    )
    pairs = {(int(h), int(k)) for h, k in re.findall(r"\((\d+), (\d+)\)", table[1])}
    envelope = policy.installed_sm120_envelope()
    assert isinstance(envelope, policy.SM120Envelope)
    assert envelope.page == page == 64
    for heads in range(1, 140):
        for topk in (64, 128, 192, 200, 256, 512, 1024, 2048):
            assert envelope.serves(heads, topk) == ((heads, topk) in pairs)


@fixed_pages
@pytest.mark.parametrize("capability", [SM120, SM121])
def test_sm12x_pages_with_fixed_64_page_flashinfer(capability):
    plan = policy.plan_pages(capability)
    assert plan.kernel is policy.SparseMLAKernel.FLASHINFER_SM120
    assert plan.swa_block_size == 64
    # 64 compressed states per page: ratio r covers 64 * r tokens.
    assert plan.compressed_block_size(1) == 64
    assert plan.compressed_block_size(2) == 128
    assert plan.compressed_block_size(0) is None
    assert plan.kernel_block_sizes() == [128, 64]


@pytest.mark.parametrize("capability", [SM100, DeviceCapability(*SM103)])
def test_sm10x_keeps_upstream_pages(capability):
    plan = policy.plan_pages(capability)
    assert plan.kernel is policy.SparseMLAKernel.TRTLLM_GEN
    assert plan.swa_block_size == 32  # vLLM's own SWA page
    assert plan.compressed_block_size(1) is None
    assert plan.compressed_block_size(2) is None


@pytest.mark.usefixtures("fresh_flashinfer_probe")
def test_broken_flashinfer_configuration_is_not_a_silent_fallback(monkeypatch):
    """FlashInfer's configuration API failing is an installation fault start-up
    reports, not a reason to switch kernels."""

    def broken():
        raise RuntimeError("libflashinfer.so: cannot open shared object file")

    monkeypatch.setattr(policy, "_fixed_page_envelope", lambda version: None)
    monkeypatch.setattr("vllm.utils.flashinfer.has_flashinfer_sparse_mla_sm120", broken)
    with pytest.raises(RuntimeError, match="libflashinfer.so"):
        policy.plan_pages(SM120)


@pytest.mark.parametrize("capability", [DeviceCapability(8, 0), DeviceCapability(7, 5)])
def test_older_architectures_are_refused(capability):
    with pytest.raises(policy.UnsupportedSparseMLAConfig) as e:
        policy.plan_pages(capability)
    message = str(e.value)
    assert "SM10x" in message and "SM12x" in message
    assert f"SM{capability.to_int()}" in message
    assert "FLASHMLA_SPARSE_DSV41" in message


@runtime_pages
@pytest.mark.parametrize("capability", [SM120, SM121])
def test_installed_runtime_page_flashinfer_keeps_upstream_pages(capability):
    """FlashInfer 0.7's own configuration API, no stand-in."""
    envelope = policy.installed_sm120_envelope()
    assert isinstance(envelope, policy.SM120Envelope) and envelope.page is None
    plan = policy.plan_pages(capability)
    assert plan.kernel == policy.SparseMLAKernel.FLASHINFER_SM120
    assert plan.swa_block_size == 32  # upstream's page, which the kernels take
    assert plan.compressed_block_size(1) is None
    # --block-size pages the compressed KV; the backend's own kernel pages.
    assert plan.kernel_block_sizes() == []


@runtime_pages
@pytest.mark.parametrize(
    "heads, topk, served",
    [
        (1, 128, True),
        (RUNTIME_MAX_HEADS, 128, True),
        (RUNTIME_MAX_HEADS + 1, 128, False),
        (0, 128, False),
        (64, RUNTIME_MIN_TOPK, True),
        (64, RUNTIME_MIN_TOPK - 1, False),
        # Missing from 0.6.18.post1's table (reported upstream); served now.
        (64, 1152, True),
        (64, 384, True),
    ],
)
def test_installed_runtime_envelope_limits(heads, topk, served):
    envelope = policy.installed_sm120_envelope()
    assert isinstance(envelope, policy.SM120Envelope)
    assert envelope.serves(heads, topk) is served


def test_runtime_page_flashinfer_keeps_upstream_pages():
    envelope = policy.SM120Envelope("0.7.2", None, lambda heads, topk: True)
    plan = policy.plan_pages(SM120, envelope)
    assert plan.kernel is policy.SparseMLAKernel.FLASHINFER_SM120
    assert plan.swa_block_size == 32
    assert plan.compressed_block_size(1) is None
    assert plan.compressed_block_size(2) is None


def test_fixed_page_envelope_sets_pages():
    plan = policy.plan_pages(
        SM120, policy.SM120Envelope("0.6", 64, lambda heads, topk: True)
    )
    assert plan.swa_block_size == 64
    assert plan.compressed_block_size(2) == 128


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
    # FlashInfer's SM120 kernels run 64-token sparse-MLA blocks (#59203).
    page = 128 if capability[0] == 10 else 64
    assert MLA.get_supported_kernel_block_sizes() == [page]
    assert MLA.get_preferred_block_size(16) == page
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
