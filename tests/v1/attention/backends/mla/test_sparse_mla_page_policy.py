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
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backends.mla import sparse_mla_page_policy as policy

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
    assert plan.kernel_path == "flashinfer-sm120"
    assert plan.swa_block_size == 64
    # 64 compressed states per page: ratio r covers 64 * r tokens.
    assert plan.compressed_block_size(1) == 64
    assert plan.compressed_block_size(2) == 128
    assert plan.compressed_block_size(0) is None
    assert plan.kernel_block_sizes([1, 2]) == [128, 64]


@pytest.mark.parametrize("capability", [SM100, DeviceCapability(*SM103)])
def test_sm10x_keeps_upstream_pages(capability):
    plan = policy.plan_pages(capability)
    assert plan.kernel_path == "flashinfer-trtllm-gen"
    assert plan.swa_block_size == 32  # what upstream vLLM 0.30.0 builds
    assert plan.compressed_block_size(1) is None
    assert plan.compressed_block_size(2) is None


@pytest.mark.parametrize("capability", [SM90, DeviceCapability(8, 9)])
def test_gpus_without_flashinfer_kernels_run_triton(capability):
    plan = policy.plan_pages(capability)
    assert plan.kernel_path == policy.TRITON
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
        SM120, num_local_heads=64, kv_cache_dtype="fp8", swa_topks=[128]
    )
    assert geometry.kernel_path == policy.TRITON
    assert geometry.fallback_reason.startswith("FlashInfer is not installed")
    assert "portable Triton kernel" in geometry.fallback_reason


def test_unusable_flashinfer_07_is_said_with_its_error(
    monkeypatch, fresh_flashinfer_probe
):
    """The 0.7 branch imports flashinfer.mla: a failing import is a reason,
    not a crash of the policy."""
    monkeypatch.setattr(policy, "_flashinfer_version", lambda: "0.7.9")
    monkeypatch.setitem(sys.modules, "flashinfer.mla", None)  # import fails
    plan = policy.plan_pages(SM121)
    assert plan.kernel_path == policy.TRITON
    assert "flashinfer 0.7.9 is installed but its SM120" in plan.note
    assert "ModuleNotFoundError" in plan.note
    # Off SM12x nothing about FlashInfer's SM120 kernels is said.
    assert policy.plan_pages(SM90).note is None


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
    assert plan.kernel_path == policy.FLASHINFER_SM120
    assert plan.swa_block_size == 32  # upstream's page, which the kernels take
    assert plan.compressed_block_size(1) is None
    assert plan.kernel_block_sizes([1, 2]) == []


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
            SM120, num_local_heads=64, kv_cache_dtype="fp8", swa_topks=topks
        )
        assert geometry.kernel_path == policy.FLASHINFER_SM120, topks
        assert geometry.fallback_reason is None


def test_runtime_page_flashinfer_keeps_upstream_pages():
    envelope = policy.SM120Envelope.from_decode_config("0.7.2", _decode_config())
    plan = policy.plan_pages(SM120, envelope)
    assert envelope.page_sizes is None
    assert plan.swa_block_size == 32
    assert plan.compressed_block_size(1) is None
    assert plan.compressed_block_size(2) is None
    # Runtime top-k: anything >= 1 is FlashInfer's.
    assert policy.choose_kernel(plan, 64, [128, 200]) == (policy.FLASHINFER_SM120, None)


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
        SM120, num_local_heads=local, kv_cache_dtype="fp8_ds_mla", swa_topks=[128]
    )
    assert geometry.padded_heads == expected
    assert expected in (8, 16, 32, 64, 128)


@pytest.mark.parametrize("heads", [129, 192, 256])
def test_more_than_128_local_heads_are_refused(heads):
    with pytest.raises(policy.UnsupportedSparseMLAConfig) as e:
        policy.negotiate(
            SM100, num_local_heads=heads, kv_cache_dtype="auto", swa_topks=[128]
        )
    message = str(e.value)
    assert str(heads) in message
    assert "[8, 16, 32, 64, 128]" in message
    assert "--tensor-parallel-size" in message


@fixed_pages
def test_unserved_topk_falls_back_to_triton_naming_the_supported_values():
    geometry = policy.negotiate(
        SM120, num_local_heads=64, kv_cache_dtype="fp8", swa_topks=[128, 160]
    )
    assert geometry.kernel_path == policy.TRITON
    # Pages stay FlashInfer's, so the cache geometry does not depend on it.
    assert geometry.plan.swa_block_size == 64
    reason = geometry.fallback_reason
    assert "top-k [160]" in reason
    assert "[128, 192, 256, 512, 1024]" in reason
    assert "0.6.18" in reason


def test_served_topk_runs_flashinfer():
    geometry = policy.negotiate(
        SM121, num_local_heads=16, kv_cache_dtype="fp8", swa_topks=[128]
    )
    assert (geometry.kernel_path, geometry.fallback_reason) == (
        policy.FLASHINFER_SM120,
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
        (SM120, "auto", False),
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
    """The test-only setting gives an SM90 GPU the SM12x pages and says so;
    SM10x (TRTLLM-gen) and a plan that is not the Triton kernel ignore it."""
    monkeypatch.setenv(policy.FORCE_SM12X_PAGES_ENV, "1")
    plan = policy.plan_pages(SM90)
    assert plan.kernel_path == policy.TRITON
    assert plan.swa_block_size == 64
    assert [plan.compressed_block_size(r) for r in (1, 2)] == [64, 128]
    assert "test-only" in plan.note
    assert policy.plan_pages(SM100).swa_block_size == 32
    monkeypatch.setenv(policy.FORCE_SM12X_PAGES_ENV, "0")
    assert policy.plan_pages(SM90).swa_block_size == 32
    assert policy.plan_pages(SM90).note is None


def _validate_environ(hard_fail: bool) -> None:
    """vLLM's start-up check of VLLM_* variables (in vllm.envs up to 0.30,
    on the platform from 0.33)."""
    from vllm import envs
    from vllm.platforms import current_platform

    check = getattr(envs, "validate_environ", None)
    (check or current_platform.validate_environ)(hard_fail)


def test_vllm_knows_the_test_only_setting(monkeypatch):
    """Start-up neither warns about the setting nor, under
    --fail-on-environ-validation, refuses it; vLLM reads it as the policy
    does."""
    import os

    from vllm import envs

    for name in [n for n in os.environ if n.startswith("VLLM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv(policy.FORCE_SM12X_PAGES_ENV, "1")
    _validate_environ(hard_fail=True)
    assert getattr(envs, policy.FORCE_SM12X_PAGES_ENV) is True
    monkeypatch.setenv(policy.FORCE_SM12X_PAGES_ENV, "0")
    assert getattr(envs, policy.FORCE_SM12X_PAGES_ENV) is False
    # The check is live: a setting vLLM does not know is refused.
    monkeypatch.setenv("VLLM_DSV41_NO_SUCH_SETTING", "1")
    with pytest.raises(ValueError, match="VLLM_DSV41_NO_SUCH_SETTING"):
        _validate_environ(hard_fail=True)
