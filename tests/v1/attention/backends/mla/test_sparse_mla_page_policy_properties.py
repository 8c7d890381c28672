# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Property: for any architecture, head count, tensor-parallel size, dtype,
top-k widths and FlashInfer envelope, the policy answers with a plan whose
pages and shapes the chosen kernel serves, or with its own error; never with
another exception."""

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm.models.deepseek_v41.nvidia import sparse_mla_pages as policy
from vllm.models.deepseek_v41.nvidia.flashinfer_sparse import (
    DeepseekV4FlashInferSM120Attention,
)
from vllm.platforms.interface import DeviceCapability

# vLLM's own padding of a GPU's heads to a count the sparse-MLA kernels take.
PAD_HEADS = DeepseekV4FlashInferSM120Attention.get_padded_num_q_heads

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
        return policy.SM120Envelope.from_dispatch_table("test", page, pairs)
    max_heads = draw(st.integers(1, 256))
    min_topk = draw(st.integers(1, 512))
    config = SimpleNamespace(
        page_block_size=64,
        page_block_sizes=frozenset(),
        page_block_size_is_runtime=True,
        topks=frozenset({128}),
        topk_is_runtime=True,
        min_topk=min_topk,
        supports_decode=lambda h, k, page_block_size=None: (
            1 <= h <= max_heads and k >= min_topk
        ),
        supported_num_heads=lambda: tuple(range(1, max_heads + 1)),
    )
    return policy.SM120Envelope.from_decode_config("test", config)


@settings(max_examples=400, deadline=None)
@given(
    major=st.integers(5, 14),
    minor=st.integers(0, 9),
    heads=st.integers(1, 300),
    tp=st.sampled_from([1, 2, 3, 4, 8, 16]),
    dtype=st.sampled_from(DTYPES),
    topks=st.lists(st.integers(1, 4096), min_size=1, max_size=3),
    envelope=envelopes(),
)
def test_plan_is_served_or_refused(major, minor, heads, tp, dtype, topks, envelope):
    capability = DeviceCapability(major, minor)
    local = max(1, heads // tp)
    try:
        geometry = policy.negotiate(
            capability,
            pad_heads=PAD_HEADS,
            num_local_heads=local,
            kv_cache_dtype=dtype,
            swa_topks=topks,
            envelope=envelope,
        )
    except policy.UnsupportedSparseMLAConfig as e:
        assert str(e)  # the policy's own error, with a message
        return
    plan = geometry
    envelope = envelope or policy.installed_sm120_envelope()
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
        for topk in set(topks):
            assert envelope.serves(geometry.padded_heads, topk)
        if envelope.page_sizes is not None:
            assert plan.swa_block_size in envelope.page_sizes
            for ratio in (1, 2):
                tokens = plan.compressed_block_size(ratio)
                assert tokens is not None and tokens // ratio in envelope.page_sizes
    # Pages are positive whole tokens; compressed pages hold whole states.
    assert plan.swa_block_size > 0
    for ratio in (1, 2):
        tokens = plan.compressed_block_size(ratio)
        assert tokens is None or (tokens > 0 and tokens % ratio == 0)


@settings(max_examples=200, deadline=None)
@given(
    major=st.integers(5, 14),
    heads=st.integers(-4, 300),
    window=st.integers(-2, 5000),
    ratios=st.lists(st.integers(0, 5), min_size=1, max_size=6),
    tp=st.integers(-2, 64),
    spec=st.one_of(st.none(), st.integers(-2, 300)),
    non_causal=st.booleans(),
)
def test_model_validation_answers_or_refuses(
    major, heads, window, ratios, tp, spec, non_causal
):
    """The start-up validation of a whole model: a geometry or the policy's
    error for any values a config or a command line can hold."""
    from vllm.models.deepseek_v41.nvidia.flashinfer_sparse import (
        DeepseekV4FlashInferMLASparseBackend,
    )

    hf_config = SimpleNamespace(
        num_attention_heads=heads, sliding_window=window, compress_ratios=ratios
    )
    try:
        geometry = policy.negotiate_for_model(
            DeviceCapability(major, 0),
            hf_config,
            DeepseekV4FlashInferMLASparseBackend.paged_backends(),
            tensor_parallel_size=tp,
            kv_cache_dtype="auto",
            use_non_causal=non_causal,
            num_speculative_tokens=spec,
        )
    except policy.UnsupportedSparseMLAConfig:
        return
    assert heads > 0 and window > 0 and tp >= 1 and heads % tp == 0
    assert set(ratios) <= {0, 1, 2}
    assert geometry.padded_heads >= heads // tp
    assert all(k > 0 for k in geometry.swa_topks)
