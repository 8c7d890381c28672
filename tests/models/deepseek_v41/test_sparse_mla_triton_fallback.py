# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The portable Triton kernel runs DeepSeek V4.1's sparse MLA only where no
FlashInfer kernel serves the model, and the plan says why."""

import importlib.metadata

import pytest
import torch

from tests.models.deepseek_v41.layer_config import vllm_config_stand_in
from tests.models.deepseek_v41.page_policy import fresh_flashinfer_probe  # noqa: F401
from tests.v1.attention.dsv41.flashinfer_release import (
    FIXED_SM120_PAGE,
    decode_config_stand_in,
    fixed_pages,
    runtime_pages,
)
from tests.v1.attention.dsv41.sm12x_pages import force_sm12x_pages
from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fi
from vllm.models.deepseek_v41.nvidia import sparse_mla_pages as policy
from vllm.platforms.interface import DeviceCapability

MLA = fi.DeepseekV4FlashInferMLASparseBackend
SWA120 = fi.DeepseekSparseSWAFlashInferSM120Backend
SM90, SM100, SM103 = DeviceCapability(9, 0), DeviceCapability(10, 0), (10, 3)
SM120, SM121 = DeviceCapability(12, 0), DeviceCapability(12, 1)


def _negotiate_fp8(capability, swa_topk, heads=64, envelope=None):
    """The plan for a model of ``heads`` heads per GPU on an FP8 cache."""
    return policy.negotiate(
        capability,
        MLA.paged_backends(),
        num_local_heads=heads,
        kv_cache_dtype="fp8",
        swa_topk=swa_topk,
        envelope=envelope,
    )


def _flashinfer_version(monkeypatch, version):
    """Make the installed flashinfer-python read as ``version`` (None: absent)."""
    real = importlib.metadata.version

    def version_of(name):
        if name != "flashinfer-python":
            return real(name)
        if version is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(importlib.metadata, "version", version_of)


def test_gpus_without_flashinfer_kernels_run_triton():
    plan = policy.plan_pages(SM90)
    assert plan.kernel == policy.SparseMLAKernel.TRITON
    assert plan.swa_block_size == 32  # the Triton kernel takes any page
    assert plan.compressed_block_size(2) is None


@pytest.mark.usefixtures("fresh_flashinfer_probe")
def test_sm12x_without_flashinfer_runs_triton_and_says_why(monkeypatch):
    _flashinfer_version(monkeypatch, None)
    geometry = _negotiate_fp8(SM120, 128)
    assert geometry.kernel == policy.SparseMLAKernel.TRITON
    assert geometry.note.startswith("FlashInfer is not installed")
    assert "portable Triton kernel" in geometry.note


@pytest.mark.usefixtures("fresh_flashinfer_probe")
def test_flashinfer_without_sm120_kernels_is_said(monkeypatch):
    """A FlashInfer with neither fixed tables nor SM120 sparse-MLA kernels
    runs the Triton kernel and the note names why."""
    _flashinfer_version(monkeypatch, "0.7.9")
    monkeypatch.setattr(policy, "_fixed_page_envelope", lambda version: None)
    monkeypatch.setattr(
        "vllm.utils.flashinfer.has_flashinfer_sparse_mla_sm120", lambda: False
    )
    plan = policy.plan_pages(SM121)
    assert plan.kernel is policy.SparseMLAKernel.TRITON
    assert "flashinfer 0.7.9 has no SM120 sparse-MLA kernels" in plan.note
    # Off SM12x nothing about FlashInfer's SM120 kernels is said.
    assert policy.plan_pages(SM90).note is None


@pytest.mark.parametrize("major,minor", [(8, 0), (8, 9)])
def test_refusals_name_the_gpus_the_triton_kernel_runs_on(major, minor):
    # SM89 lowers the kernel's FP8 but not the indexer's DeepGEMM kernels.
    with pytest.raises(policy.UnsupportedSparseMLAConfig, match="from SM90 on"):
        policy.plan_pages(DeviceCapability(major, minor))


@runtime_pages
def test_shapes_the_fixed_tables_lacked_run_flashinfer():
    for topk in (1152, 384, 160):
        geometry = _negotiate_fp8(SM120, topk)
        assert geometry.kernel == policy.SparseMLAKernel.FLASHINFER_SM120, topk
        assert geometry.note is None


def test_runtime_topk_flashinfer_serves_any_topk():
    envelope = policy.SM120Envelope(
        "flashinfer 0.7.2", None, decode_config_stand_in().supports_decode
    )
    negotiated = _negotiate_fp8(SM120, 200, envelope=envelope)
    assert negotiated.kernel is policy.SparseMLAKernel.FLASHINFER_SM120
    assert negotiated.note is None


@fixed_pages
def test_unserved_topk_falls_back_to_triton_naming_the_shape():
    geometry = _negotiate_fp8(SM120, 160)
    assert geometry.kernel == policy.SparseMLAKernel.TRITON
    # Pages stay FlashInfer's, so the cache geometry does not depend on it.
    assert geometry.swa_block_size == 64
    reason = geometry.note
    assert "64 heads with top-k 160" in reason
    assert "0.6.18" in reason


def test_served_topk_runs_flashinfer():
    geometry = _negotiate_fp8(SM121, 128, heads=16)
    assert (geometry.kernel, geometry.note) == (
        policy.SparseMLAKernel.FLASHINFER_SM120,
        None,
    )


def test_forced_sm12x_pages_apply_to_the_triton_path_only(monkeypatch):
    """The tests' SM12x pages on an SM90 GPU; SM10x (TRTLLM-gen) keeps its own."""
    force_sm12x_pages(monkeypatch.setattr)
    plan = policy.plan_pages(SM90)
    assert plan.kernel is policy.SparseMLAKernel.TRITON
    assert plan.swa_block_size == 64
    assert [plan.compressed_block_size(r) for r in (1, 2)] == [64, 128]
    assert policy.plan_pages(SM100).swa_block_size == 32
    monkeypatch.undo()
    assert policy.plan_pages(SM90).swa_block_size == 32


@pytest.mark.parametrize(
    "dtype, refused",
    [("auto", False), (None, False), ("fp8", False), ("bfloat16", True)],
)
def test_supports_combination_on_sm90(dtype, refused):
    reason = MLA.supports_combination(
        512, torch.bfloat16, dtype, None, True, True, True, False, SM90
    )
    assert (reason is not None) == refused


@pytest.fixture
def single_gpu(monkeypatch):
    monkeypatch.setattr(policy, "get_tensor_model_parallel_world_size", lambda: 1)


@fixed_pages
def test_unserved_shape_negotiates_the_triton_kernel(set_capability, single_gpu):
    set_capability(12, 0)
    geometry = MLA.negotiate(vllm_config_stand_in(cache_dtype="fp8", spec_tokens=200))
    assert geometry.kernel == policy.SparseMLAKernel.TRITON
    assert "top-k 384" in geometry.note
    assert geometry.swa_block_size == 64
    # The SM120 layer's shape probe asks the geometry, which serves it.
    assert geometry.serves(64, 384)


def test_served_shape_negotiates_flashinfer(set_capability, single_gpu):
    set_capability(12, 0)
    geometry = MLA.negotiate(vllm_config_stand_in(cache_dtype="fp8", block_size=64))
    assert geometry.kernel == policy.SparseMLAKernel.FLASHINFER_SM120
    assert geometry.note is None
    assert geometry.serves(64, 128)
    # A shape FlashInfer lacks (0.6.x) is not the FlashInfer kernel's.
    assert geometry.serves(64, 384) is (FIXED_SM120_PAGE is None)


@runtime_pages
def test_reported_missing_shape_runs_flashinfer(set_capability, single_gpu):
    """64 heads at top-k 1152 (no 0.6.18 kernel) is FlashInfer's from 0.7."""
    set_capability(12, 0)
    config = vllm_config_stand_in(heads=64, cache_dtype="fp8", block_size=64)
    config.model_config.hf_config.sliding_window = 1152
    geometry = MLA.negotiate(config)
    assert geometry.kernel == policy.SparseMLAKernel.FLASHINFER_SM120
    assert geometry.swa_block_size == 32


def test_an_unset_block_size_is_not_refused_on_triton(set_capability, single_gpu):
    set_capability(9, 0)
    unset = vllm_config_stand_in(cache_dtype="fp8", block_size=16, user_block=False)
    assert MLA.negotiate(unset).kernel == policy.SparseMLAKernel.TRITON
    chosen = vllm_config_stand_in(cache_dtype="fp8", block_size=16)
    with pytest.raises(policy.UnsupportedSparseMLAConfig, match="--block-size 16"):
        MLA.negotiate(chosen)
