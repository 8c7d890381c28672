# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The page-size policy against the installed FlashInfer: 0.6.18.post1's
fixed tables on vLLM 0.30.0, 0.7.2.post1's runtime configuration on 0.33.0."""

import importlib.util
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.v1.attention.dsv41.flashinfer_release import (
    RUNTIME_MAX_HEADS,
    RUNTIME_MIN_TOPK,
    fixed_pages,
    runtime_pages,
)
from tests.v1.attention.dsv41.sm12x_pages import force_sm12x_pages
from vllm.models.deepseek_v41.nvidia import sparse_mla_pages as policy
from vllm.models.deepseek_v41.nvidia.flashinfer_sparse import (
    _SPARSE_MLA_SUPPORTED_Q_HEADS as Q_HEADS,
)
from vllm.platforms.interface import DeviceCapability

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
    assert envelope is not None
    assert envelope.page_sizes == {page} == {64}
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
    assert plan.swa_block_size == 32  # what upstream vLLM 0.30.0 builds
    assert plan.compressed_block_size(1) is None
    assert plan.compressed_block_size(2) is None


@pytest.mark.parametrize("capability", [SM90, DeviceCapability(8, 9)])
def test_gpus_without_flashinfer_kernels_run_triton(capability):
    plan = policy.plan_pages(capability)
    assert plan.kernel == policy.SparseMLAKernel.TRITON
    assert plan.swa_block_size == 32  # the Triton kernel takes any page
    assert plan.compressed_block_size(2) is None


@pytest.fixture
def fresh_flashinfer_probe():
    policy._installed_sm120.cache_clear()
    yield
    policy._installed_sm120.cache_clear()


def test_sm12x_without_flashinfer_runs_triton_and_says_why(
    monkeypatch, fresh_flashinfer_probe
):
    monkeypatch.setattr(policy, "_flashinfer_version", lambda: None)
    geometry = policy.negotiate(
        SM120,
        supported_heads=Q_HEADS,
        num_local_heads=64,
        kv_cache_dtype="fp8",
        swa_topks=[128],
    )
    assert geometry.kernel == policy.SparseMLAKernel.TRITON
    assert geometry.note.startswith("FlashInfer is not installed")
    assert "portable Triton kernel" in geometry.note


def test_flashinfer_without_sm120_configs_is_said_with_its_error(
    monkeypatch, fresh_flashinfer_probe
):
    """A FlashInfer with neither fixed tables nor the configuration API runs
    the Triton kernel and the note names why."""
    monkeypatch.setattr(policy, "_flashinfer_version", lambda: "0.7.9")
    monkeypatch.setattr(policy, "_read_dispatch_table", lambda version: None)
    monkeypatch.setitem(sys.modules, "flashinfer.mla", None)  # import fails
    plan = policy.plan_pages(SM121)
    assert plan.kernel is policy.SparseMLAKernel.TRITON
    assert "flashinfer 0.7.9 offers no SM120 sparse-MLA configuration" in plan.note
    assert "ModuleNotFoundError" in plan.note
    # Off SM12x nothing about FlashInfer's SM120 kernels is said.
    assert policy.plan_pages(SM90).note is None


def test_broken_flashinfer_configuration_is_not_a_silent_fallback(
    monkeypatch, fresh_flashinfer_probe
):
    """FlashInfer's configuration API failing is an installation fault start-up
    reports, not a reason to switch kernels."""

    def broken():
        raise RuntimeError("libflashinfer.so: cannot open shared object file")

    monkeypatch.setattr(policy, "_read_dispatch_table", lambda version: None)
    monkeypatch.setitem(
        sys.modules,
        "flashinfer.mla",
        SimpleNamespace(supported_sparse_mla_sm120_configs=broken),
    )
    with pytest.raises(RuntimeError, match="libflashinfer.so"):
        policy.plan_pages(SM120)


@pytest.mark.parametrize("capability", [DeviceCapability(8, 0), DeviceCapability(7, 5)])
def test_older_architectures_are_refused(capability):
    with pytest.raises(policy.UnsupportedSparseMLAConfig) as e:
        policy.plan_pages(capability)
    message = str(e.value)
    assert "SM10x" in message and "SM12x" in message and "SM89" in message
    assert f"SM{capability.to_int()}" in message
    assert "FLASHMLA_SPARSE_DSV41" in message


def _decode_config(**overrides):
    """A stand-in for FlashInfer 0.7's SparseMLASm120DecodeConfig with its
    documented fields and its supports_decode rule."""
    fields = dict(
        page_block_size=64,
        page_block_sizes=frozenset(),
        page_block_size_is_runtime=True,
        topks=frozenset({128, 256, 512}),
        topk_is_runtime=True,
        min_topk=1,
        max_num_heads=128,
        head_counts=None,
    )
    fields.update(overrides)
    config = SimpleNamespace(**fields)

    def supports_decode(num_heads, topk, *, num_tokens=1, page_block_size=None):
        page = config.page_block_size if page_block_size is None else page_block_size
        pages = config.page_block_sizes or {config.page_block_size}
        heads_ok = 1 <= num_heads <= config.max_num_heads
        topk_ok = (
            topk >= config.min_topk if config.topk_is_runtime else topk in config.topks
        )
        page_ok = page > 0 if config.page_block_size_is_runtime else page in pages
        return heads_ok and topk_ok and page_ok

    config.supports_decode = supports_decode
    config.supported_num_heads = lambda: tuple(range(1, config.max_num_heads + 1))
    return config


@runtime_pages
@pytest.mark.parametrize("capability", [SM120, SM121])
def test_installed_runtime_page_flashinfer_keeps_upstream_pages(capability):
    """FlashInfer 0.7's own configuration API, no stand-in."""
    envelope = policy.installed_sm120_envelope()
    assert envelope is not None and envelope.page_sizes is None
    assert "supported_sparse_mla_sm120_configs" in envelope.source
    plan = policy.plan_pages(capability)
    assert plan.kernel == policy.SparseMLAKernel.FLASHINFER_SM120
    assert plan.swa_block_size == 32  # upstream's page, which the kernels take
    assert plan.compressed_block_size(1) is None
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
    assert envelope is not None
    assert envelope.serves(heads, topk) is served


@runtime_pages
def test_shapes_the_fixed_tables_lacked_run_flashinfer():
    for topks in ([1152], [384], [128, 160]):
        geometry = policy.negotiate(
            SM120,
            supported_heads=Q_HEADS,
            num_local_heads=64,
            kv_cache_dtype="fp8",
            swa_topks=topks,
        )
        assert geometry.kernel == policy.SparseMLAKernel.FLASHINFER_SM120, topks
        assert geometry.note is None


def test_runtime_page_flashinfer_keeps_upstream_pages():
    envelope = policy.SM120Envelope.from_decode_config("0.7.2", _decode_config())
    plan = policy.plan_pages(SM120, envelope)
    assert envelope.page_sizes is None
    assert plan.swa_block_size == 32
    assert plan.compressed_block_size(1) is None
    assert plan.compressed_block_size(2) is None
    # Runtime top-k: anything >= 1 is FlashInfer's.
    negotiated = policy.negotiate(
        SM120,
        supported_heads=Q_HEADS,
        num_local_heads=64,
        kv_cache_dtype="fp8",
        swa_topks=[128, 200],
        envelope=envelope,
    )
    assert negotiated.kernel is policy.SparseMLAKernel.FLASHINFER_SM120
    assert negotiated.note is None


def test_fixed_page_decode_config_sets_pages():
    config = _decode_config(
        page_block_size_is_runtime=False, page_block_sizes=frozenset({64, 128})
    )
    plan = policy.plan_pages(
        SM120, policy.SM120Envelope.from_decode_config("0.7", config)
    )
    assert plan.swa_block_size == 64
    assert plan.compressed_block_size(2) == 128


@pytest.mark.parametrize(
    "total_heads, tp",
    [(h, tp) for h in (8, 16, 24, 32, 48, 64, 96, 128) for tp in (1, 2, 4, 8)],
)
def test_heads_pad_to_the_next_supported_count(total_heads, tp):
    local = total_heads // tp
    expected = max(8, 1 << (local - 1).bit_length())  # next power of two >= 8
    geometry = policy.negotiate(
        SM120,
        supported_heads=Q_HEADS,
        num_local_heads=local,
        kv_cache_dtype="fp8_ds_mla",
        swa_topks=[128],
    )
    assert geometry.padded_heads == expected
    assert expected in (8, 16, 32, 64, 128)


@pytest.mark.parametrize("heads", [129, 192, 256])
def test_more_than_128_local_heads_are_refused(heads):
    with pytest.raises(policy.UnsupportedSparseMLAConfig) as e:
        policy.negotiate(
            SM100,
            supported_heads=Q_HEADS,
            num_local_heads=heads,
            kv_cache_dtype="auto",
            swa_topks=[128],
        )
    message = str(e.value)
    assert str(heads) in message
    assert "[8, 16, 32, 64, 128]" in message
    assert "--tensor-parallel-size" in message


@fixed_pages
def test_unserved_topk_falls_back_to_triton_naming_the_supported_values():
    geometry = policy.negotiate(
        SM120,
        supported_heads=Q_HEADS,
        num_local_heads=64,
        kv_cache_dtype="fp8",
        swa_topks=[128, 160],
    )
    assert geometry.kernel == policy.SparseMLAKernel.TRITON
    # Pages stay FlashInfer's, so the cache geometry does not depend on it.
    assert geometry.swa_block_size == 64
    reason = geometry.note
    assert "top-k [160]" in reason
    assert "[128, 192, 256, 512, 1024]" in reason
    assert "0.6.18" in reason


def test_served_topk_runs_flashinfer():
    geometry = policy.negotiate(
        SM121,
        supported_heads=Q_HEADS,
        num_local_heads=16,
        kv_cache_dtype="fp8",
        swa_topks=[128],
    )
    assert (geometry.kernel, geometry.note) == (
        policy.SparseMLAKernel.FLASHINFER_SM120,
        None,
    )


@pytest.mark.parametrize(
    "capability, dtype, accepted",
    [
        (SM100, "auto", True),
        (SM100, "bfloat16", True),
        (SM100, "fp8", True),
        (SM100, "fp8_e4m3", True),
        (SM100, "fp8_ds_mla", False),
        (SM120, "fp8", True),
        (SM120, "fp8_e4m3", True),
        (SM120, "fp8_ds_mla", True),
        (SM120, "auto", True),  # the packed layout resolves auto to fp8_ds_mla
        (SM120, "bfloat16", False),
        (SM121, "fp8_ds_mla", True),
        (SM121, "bfloat16", False),
        (SM90, "fp8_ds_mla", True),  # the Triton path reads packed records
        (SM90, "bfloat16", False),
    ],
)
def test_kv_cache_dtypes_per_architecture(capability, dtype, accepted):
    if accepted:
        policy.check_kv_cache_dtype(capability, dtype)
        return
    with pytest.raises(policy.UnsupportedSparseMLAConfig) as e:
        policy.check_kv_cache_dtype(capability, dtype)
    assert f"--kv-cache-dtype {dtype}" in str(e.value)


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
