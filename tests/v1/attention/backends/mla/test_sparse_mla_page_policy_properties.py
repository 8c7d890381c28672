# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Property: for any architecture, head count, tensor-parallel size, dtype,
top-k width and FlashInfer envelope, the policy answers with a plan whose
pages and shapes the chosen kernel serves, or with its own error; never with
another exception."""

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm.models.deepseek_v41.nvidia import sparse_mla_pages as policy
from vllm.models.deepseek_v41.nvidia.flashinfer_sparse import (
    DeepseekV4FlashInferMLASparseBackend as MLA,
)
from vllm.platforms.interface import DeviceCapability

# The kernels' head counts and what each layer kind reads, written out here
# so that the property does not restate the policy's own tables.
HEAD_COUNTS = (8, 16, 32, 64, 128)
PACKED = {"auto", "fp8", "fp8_e4m3", "fp8_ds_mla"}
PLAIN_ROWS = {"auto", "bfloat16", "fp8", "fp8_e4m3"}
DTYPES = sorted(PACKED | PLAIN_ROWS | {"fp8_e5m2", "nvfp4_ds_mla", "", "int8"})


@st.composite
def envelopes(draw):
    """None (the installed FlashInfer's), a fixed dispatch table, or a
    0.7-style runtime configuration with random limits."""
    kind = draw(st.sampled_from(["installed", "table", "runtime"]))
    if kind == "installed":
        return None
    if kind == "table":
        pairs = draw(
            st.sets(
                st.tuples(st.sampled_from(HEAD_COUNTS), st.integers(1, 2048)),
                max_size=12,
            )
        )
        page = draw(st.sampled_from([16, 32, 64, 128]))
        return policy.SM120Envelope("test", page, lambda h, k: (h, k) in pairs)
    max_heads = draw(st.integers(1, 256))
    min_topk = draw(st.integers(1, 512))
    return policy.SM120Envelope(
        "test", None, lambda h, k: 1 <= h <= max_heads and k >= min_topk
    )


@settings(max_examples=400, deadline=None)
@given(
    major=st.integers(5, 14),
    minor=st.integers(0, 9),
    heads=st.integers(1, 300),
    tp=st.sampled_from([1, 2, 3, 4, 8, 16]),
    dtype=st.sampled_from(DTYPES),
    topk=st.integers(1, 4096),
    envelope=envelopes(),
)
def test_plan_is_served_or_refused(major, minor, heads, tp, dtype, topk, envelope):
    capability = DeviceCapability(major, minor)
    local = max(1, heads // tp)
    try:
        geometry = policy.negotiate(
            capability,
            MLA.paged_backends(),
            num_local_heads=local,
            kv_cache_dtype=dtype,
            swa_topk=topk,
            envelope=envelope,
        )
    except policy.UnsupportedSparseMLAConfig as e:
        assert str(e)  # the policy's own error, with a message
        return
    plan = geometry
    if envelope is None and major == 12:
        installed = policy.installed_sm120_envelope()
        envelope = installed if isinstance(installed, policy.SM120Envelope) else None
    # Heads: padded to a count the kernels take, never fewer than the model's.
    assert geometry.padded_heads in HEAD_COUNTS
    assert geometry.padded_heads >= local
    # The kernel exists for this GPU.
    if major == 10:
        assert geometry.kernel == policy.SparseMLAKernel.TRTLLM_GEN
        assert dtype in PLAIN_ROWS
    else:
        assert dtype in PACKED
        assert geometry.kernel in (
            policy.SparseMLAKernel.FLASHINFER_SM120,
            policy.SparseMLAKernel.TRITON,
        )
    if geometry.kernel == policy.SparseMLAKernel.TRITON:
        assert capability.to_int() >= policy.TRITON_MIN_CAPABILITY
        if major == 12 and envelope is not None:
            # Only a shape FlashInfer lacks falls back, and it says why.
            assert geometry.note
    if geometry.kernel == policy.SparseMLAKernel.FLASHINFER_SM120:
        assert major == 12 and envelope is not None
        # Every decode shape of the model is FlashInfer's, on its pages.
        assert envelope.serves(geometry.padded_heads, topk)
        if envelope.page is not None:
            assert plan.swa_block_size == envelope.page
            for ratio in (1, 2):
                tokens = plan.compressed_block_size(ratio)
                assert tokens is not None and tokens // ratio == envelope.page
    # Pages are positive whole tokens; compressed pages hold whole states.
    assert plan.swa_block_size > 0
    for ratio in (1, 2):
        tokens = plan.compressed_block_size(ratio)
        assert tokens is None or (tokens > 0 and tokens % ratio == 0)
