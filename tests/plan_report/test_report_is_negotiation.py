# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Where the layers negotiate with the page policy, the plan report refuses
with the same words."""

import pytest

from tests.models.deepseek_v41.layer_config import vllm_config_stand_in
from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fi
from vllm.models.deepseek_v41.nvidia import sparse_mla_pages as policy
from vllm_dsv41_plan import report


@pytest.mark.parametrize(
    "gpu, tp, dtype, heads, match",
    [
        ((12, 0), 1, "fp8", 256, "cannot run 256 attention heads per GPU"),
        ((12, 0), 2, "bfloat16", 64, "--kv-cache-dtype bfloat16 is not served"),
    ],
)
def test_layers_refuse_what_the_report_refuses(
    set_capability, monkeypatch, gpu, tp, dtype, heads, match
):
    """The layer and the plan report share one validation: the same setups
    fail with the same message."""
    set_capability(*gpu)
    monkeypatch.setattr(policy, "get_tensor_model_parallel_world_size", lambda: tp)
    config = vllm_config_stand_in(heads=heads, cache_dtype=dtype)
    with pytest.raises(policy.UnsupportedSparseMLAConfig, match=match) as built:
        fi.DeepseekV4FlashInferSM120Attention(config, prefix="model.layers.1.attn")
    hf = config.model_config.hf_config
    hf.head_dim, hf.kv_source_layer_ids = 512, []
    plan = report.make_plan(
        policy.DeviceCapability(*gpu),
        hf,
        tensor_parallel_size=tp,
        kv_cache_dtype=dtype,
        block_size=config.cache_config.block_size,
        attention_backend="FLASHINFER_MLA_SPARSE_DSV41",
    )
    assert plan.error == str(built.value)


def test_the_selection_refuses_sm89_before_any_layer(set_capability):
    """On SM89 the model's choice of attention class refuses first (the page
    policy's Triton kernel would run there; DeepSeek V4.1's DeepGEMM indexer
    would not), and the report gives its words."""
    set_capability(8, 9)
    hf = vllm_config_stand_in(heads=64, cache_dtype="fp8").model_config.hf_config
    hf.head_dim, hf.kv_source_layer_ids = 512, []
    with pytest.raises(ValueError) as refused:
        report.layer_class(policy.DeviceCapability(8, 9), "FLASHINFER_MLA_SPARSE_DSV41")
    assert str(refused.value) == (
        "FLASHINFER_MLA_SPARSE_DSV41 has no DeepSeek V4.1 kernel for SM89 GPUs. "
        "No DeepSeek V4.1 attention backend runs on SM89."
    )
    plan = report.make_plan(
        policy.DeviceCapability(8, 9),
        hf,
        kv_cache_dtype="fp8",
        attention_backend="FLASHINFER_MLA_SPARSE_DSV41",
    )
    assert plan.error == str(refused.value)
