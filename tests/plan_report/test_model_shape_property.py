# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Property: the report's check of a whole model answers with a plan or with
start-up's error for any values a config or a command line can hold; never
with another exception."""

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.plan_report.start_up import two_segment_backend
from vllm.platforms.interface import DeviceCapability
from vllm_dsv41_plan import report


# The older base's kernel comes from its page policy, whose properties
# tests/v1/attention/backends/mla/test_sparse_mla_page_policy_properties.py
# holds; the layers choose it themselves on the default base only.
@pytest.mark.default_base_only
@settings(max_examples=200, deadline=None)
@given(
    major=st.integers(5, 14),
    heads=st.integers(-4, 300),
    window=st.integers(-2, 5000),
    ratios=st.lists(st.integers(0, 5), min_size=1, max_size=6),
    tp=st.integers(-2, 64),
    spec=st.one_of(st.none(), st.integers(0, 300)),
    non_causal=st.booleans(),
)
def test_model_validation_answers_or_refuses(
    major, heads, window, ratios, tp, spec, non_causal
):
    hf_config = SimpleNamespace(
        num_attention_heads=heads, sliding_window=window, compress_ratios=ratios
    )
    capability = DeviceCapability(major, 0)
    try:
        local_heads = report.check_model_shape(hf_config, tp)
        layer = report.layer_class(capability, two_segment_backend(major))
        padded = layer.get_padded_num_q_heads(local_heads)
        topk = report.sm120_swa_topk(window, non_causal, spec)
        kernel = report.layer_kernel(layer, capability, padded, topk)
    except ValueError:
        return
    assert heads > 0 and window > 0 and tp >= 1 and heads % tp == 0
    assert set(ratios) <= {0, 1, 2}
    assert padded >= heads // tp
    assert topk >= window
    assert kernel in report.KERNEL_PATHS
