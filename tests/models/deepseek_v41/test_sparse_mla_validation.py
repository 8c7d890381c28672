# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""DeepSeek V4.1 layers on the FlashInfer sparse-MLA backend negotiate before
they build anything: configurations no kernel serves fail at start-up with
one message, and supports_combination() answers the same."""

import pytest
import torch

from tests.models.deepseek_v41.layer_config import vllm_config_stand_in
from tests.models.deepseek_v41.page_policy import fresh_flashinfer_probe  # noqa: F401
from tests.v1.attention.dsv41.flashinfer_release import runtime_pages
from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fi
from vllm.models.deepseek_v41.nvidia import sparse_mla_pages as policy
from vllm.models.deepseek_v41.nvidia.flashmla import DeepseekV4FlashMLAAttention
from vllm.platforms.interface import DeviceCapability

MLA = fi.DeepseekV4FlashInferMLASparseBackend
SWA120 = fi.DeepseekSparseSWAFlashInferSM120Backend
SM90, SM100, SM103 = DeviceCapability(9, 0), DeviceCapability(10, 0), (10, 3)
SM120, SM121 = DeviceCapability(12, 0), DeviceCapability(12, 1)


@pytest.mark.parametrize(
    "total_heads, tp",
    [(h, tp) for h in (8, 16, 24, 32, 48, 64, 96, 128) for tp in (1, 2, 4, 8)],
)
def test_heads_pad_to_the_next_supported_count(total_heads, tp):
    local = total_heads // tp
    expected = max(8, 1 << (local - 1).bit_length())  # next power of two >= 8
    geometry = policy.negotiate(
        SM120,
        MLA.paged_backends(),
        num_local_heads=local,
        kv_cache_dtype="fp8_ds_mla",
        swa_topk=128,
    )
    assert geometry.padded_heads == expected
    assert expected in (8, 16, 32, 64, 128)


@pytest.mark.parametrize("heads", [129, 192, 256])
def test_more_than_128_local_heads_are_refused(heads):
    with pytest.raises(policy.UnsupportedSparseMLAConfig) as e:
        policy.negotiate(
            SM100,
            MLA.paged_backends(),
            num_local_heads=heads,
            kv_cache_dtype="auto",
            swa_topk=128,
        )
    message = str(e.value)
    assert str(heads) in message
    assert "8, 16, 32, 64, 128" in message
    assert "--tensor-parallel-size" in message


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
    ],
)
def test_kv_cache_dtypes_per_architecture(capability, dtype, accepted):
    if accepted:
        policy.check_kv_cache_dtype(capability, dtype)
        return
    with pytest.raises(policy.UnsupportedSparseMLAConfig) as e:
        policy.check_kv_cache_dtype(capability, dtype)
    assert f"--kv-cache-dtype {dtype}" in str(e.value)


def test_flashmla_negotiates_no_plan_but_refuses_an_unbindable_block_size(
    set_capability,
):
    """FlashMLA's layer keeps its kernel; a --block-size its packed caches
    cannot be bound with fails as it is built (SM90: 64-token kernel pages)."""
    set_capability(9, 0)
    negotiate = DeepseekV4FlashMLAAttention.backend_cls.negotiate
    assert negotiate(vllm_config_stand_in(block_size=128, user_block=False)) is None
    assert negotiate(vllm_config_stand_in(block_size=64)) is None
    with pytest.raises(policy.UnsupportedSparseMLAConfig, match=r"Use one of \[64\]"):
        negotiate(vllm_config_stand_in(block_size=128))


def _supports(capability, kv_cache_dtype):
    """supports_combination for a sparse MLA layer of DeepSeek V4.1's shape."""
    return MLA.supports_combination(
        512,
        torch.bfloat16,
        kv_cache_dtype,
        None,
        True,
        True,
        True,
        False,
        policy.DeviceCapability(*capability),
    )


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
        ((8, 0), "fp8", True),
    ],
)
def test_supports_combination(capability, dtype, refused):
    reason = _supports(capability, dtype)
    assert (reason is not None) == refused


@pytest.fixture
def single_gpu(monkeypatch):
    monkeypatch.setattr(policy, "get_tensor_model_parallel_world_size", lambda: 1)


def test_an_unset_block_size_is_not_refused(set_capability, single_gpu):
    """Without --block-size the layers are built while the cache config still
    holds vLLM's generic 16; the backend's preferred page replaces it later."""
    set_capability(10, 0)
    unset = vllm_config_stand_in(block_size=16, user_block=False)
    assert MLA.negotiate(unset).kernel == policy.SparseMLAKernel.TRTLLM_GEN
    chosen = vllm_config_stand_in(block_size=16)
    with pytest.raises(policy.UnsupportedSparseMLAConfig, match="--block-size 16"):
        MLA.negotiate(chosen)


@pytest.mark.parametrize(
    "capability, config, match",
    [
        (
            (12, 0),
            vllm_config_stand_in(heads=256),
            "cannot run 256 attention heads per GPU",
        ),
        (
            (12, 0),
            vllm_config_stand_in(cache_dtype="bfloat16"),
            "--kv-cache-dtype bfloat16",
        ),
        ((10, 0), vllm_config_stand_in(cache_dtype="fp8_ds_mla"), "fp8_ds_mla"),
        # No attention kernel takes 32-token compressed pages on SM12x (with
        # fixed pages --block-size pages no cache, so any is taken).
        pytest.param(
            (12, 0),
            vllm_config_stand_in(cache_dtype="fp8", block_size=32),
            "--block-size 32",
            marks=runtime_pages,
        ),
        # 256 too where vLLM maps packed blocks to kernel pages at binding.
        ((10, 0), vllm_config_stand_in(block_size=192), r"Use one of \[128(, 256)?\]"),
        ((8, 0), vllm_config_stand_in(cache_dtype="fp8"), "this GPU is SM80"),
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


def test_start_up_names_the_kernel_and_pages_once(
    set_capability, single_gpu, monkeypatch
):
    """One INFO line says what the layers run: the kernel and every page."""
    logged = []
    monkeypatch.setattr(
        policy.logger, "info_once", lambda msg, *args: logged.append(msg % args)
    )
    set_capability(10, 0)
    MLA.negotiate(vllm_config_stand_in(cache_dtype="fp8", block_size=128))
    expected = (
        "DeepSeek V4.1 sparse MLA on FLASHINFER_MLA_SPARSE_DSV41: "
        "flashinfer-trtllm-gen kernel on SM100; pages: sliding window 32 "
        "tokens, compressed KV --block-size tokens, indexer K 64 states"
    )
    assert logged == [expected]


@pytest.mark.usefixtures("fresh_flashinfer_probe")
@pytest.mark.parametrize("capability", [(12, 0), (12, 1)])
def test_supports_combination_without_flashinfer_sm120_kernels(monkeypatch, capability):
    """A FlashInfer without SM120 sparse-MLA kernels is an answer, not an
    error: the envelope probe gives its reason as a string, and the portable
    kernel serves the GPU."""
    monkeypatch.setattr(policy, "_fixed_page_envelope", lambda version: None)
    monkeypatch.setattr(
        "vllm.utils.flashinfer.has_flashinfer_sparse_mla_sm120", lambda: False
    )
    assert isinstance(policy.installed_sm120_envelope(), str)
    reason = _supports(capability, "fp8")
    assert reason is None
