# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The plan report: what start-up will do, printed without a GPU."""

import json

import pytest

from tests.models.deepseek_v41.test_flashinfer_sparse import _vllm_config
from tests.v1.attention.dsv41.flashinfer_release import FIXED_SM120_PAGE, fixed_pages
from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fi
from vllm.models.deepseek_v41.nvidia import sparse_mla_pages as policy
from vllm.v1.attention.backends.mla import sparse_mla_plan_report as report


def _plan(capsys, *args: str) -> tuple[int, dict]:
    code = report.main(["plan", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("capability", ["12.0", "12.1"])
def test_sm12x_plan(capsys, capability):
    code, plan = _plan(capsys, "--capability", capability)
    assert code == 0 and plan["error"] is None
    assert plan["attention_class"].endswith(
        "deepseek_v41.nvidia.flashinfer_sparse.DeepseekV4FlashInferSM120Attention"
    )
    assert "SM120" in plan["kernel_path"]
    assert plan["kv_cache_dtype"] == "fp8_ds_mla"
    caches = {c["cache"]: c for c in plan["caches"]}
    assert set(caches) == {
        "swa",
        "compressed r=1",
        "compressed r=2",
        "indexer r=1",
        "indexer r=2",
    }
    if FIXED_SM120_PAGE is None:
        # FlashInfer takes any page: upstream's 32-token SWA page and
        # 128-token (--block-size) compressed pages stay.
        expected = [("swa", 32, 32), ("compressed r=1", 128, 128)]
        expected.append(("compressed r=2", 128, 64))
    else:
        expected = [("swa", 64, 64), ("compressed r=1", 64, 64)]
        expected.append(("compressed r=2", 128, 64))
    for name, tokens, states in expected:
        assert caches[name]["page_tokens"] == tokens
        assert caches[name]["states_per_page"] == states
        # Records of 584 bytes, the page padded to a multiple of 576.
        assert caches[name]["page_bytes"] == -(-states * 584 // 576) * 576


def test_sm100_plan(capsys):
    code, plan = _plan(capsys, "--capability", "10.0")
    assert code == 0
    assert plan["attention_class"].endswith("DeepseekV4FlashInferMLAAttention")
    caches = {c["cache"]: c for c in plan["caches"]}
    assert caches["swa"]["page_tokens"] == 32
    # BF16 rows of 512 values: 1024 bytes per state.
    assert caches["compressed r=1"]["page_bytes"] == 128 * 1024


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--capability", "8.0"], "SM80"),
        (["--capability", "12.0", "--kv-cache-dtype", "bfloat16"], "bfloat16"),
    ],
)
def test_refused_configs_report_the_start_up_error(capsys, args, needle):
    code, plan = _plan(capsys, *args)
    assert code == 1
    assert needle in plan["error"]
    assert plan["caches"] == []


@pytest.mark.parametrize(
    "args, note",
    [
        (["--capability", "9.0"], None),
        pytest.param(
            ["--capability", "12.0", "--num-speculative-tokens", "200", "--non-causal"],
            "top-k [384]",
            marks=fixed_pages,
        ),
    ],
)
def test_triton_path_is_reported(capsys, args, note):
    code, plan = _plan(capsys, *args)
    assert code == 0
    assert "Triton" in plan["kernel_path"]
    assert plan["attention_class"].endswith("DeepseekV4FlashInferSM120Attention")
    assert (note is None) == (plan["note"] is None)
    if note:
        assert note in plan["note"]


def test_tensor_parallel_pads_local_heads(capsys):
    code, plan = _plan(capsys, "--capability", "12.0", "--tp", "16")
    assert code == 0
    assert (plan["local_heads"], plan["padded_heads"]) == (8, 8)


def test_text_output_names_the_caches(capsys):
    assert report.main(["plan", "--capability", "12.0"]) == 0
    out = capsys.readouterr().out
    assert "compressed r=2" in out and "status: served" in out


@pytest.mark.parametrize(
    "block_size, compressed_tokens",
    [(None, 128), ("64", 64), ("256", 256)],
)
def test_sm90_pages_are_the_h200s_on_any_host(capsys, block_size, compressed_tokens):
    """On SM90 the compressed caches keep --block-size (upstream's pages,
    128 unset) and the indexer K caches have 64-state pages of their own,
    whatever GPU, or none, the report runs on."""
    args = ["--capability", "9.0"]
    if block_size is not None:
        args += ["--block-size", block_size]
    code, plan = _plan(capsys, *args)
    assert code == 0, plan["error"]
    caches = {c["cache"]: c for c in plan["caches"]}
    assert (caches["swa"]["page_tokens"], caches["swa"]["states_per_page"]) == (32, 32)
    for ratio in (1, 2):
        cache = caches[f"compressed r={ratio}"]
        assert cache["page_tokens"] == compressed_tokens
        assert cache["states_per_page"] == compressed_tokens // ratio
        indexer = caches[f"indexer r={ratio}"]
        assert (indexer["page_tokens"], indexer["states_per_page"]) == (64 * ratio, 64)


def test_sm90_refuses_pages_its_indexer_cannot_split(capsys):
    code, plan = _plan(capsys, "--capability", "9.0", "--block-size", "32")
    assert code == 1
    assert "Use one of [64, 128, 256]" in plan["error"]


def test_the_report_leaves_the_hosts_gpu_as_it_was(capsys):
    from vllm.platforms import current_platform

    before = current_platform.get_device_capability()
    _plan(capsys, "--capability", "9.0")
    assert current_platform.get_device_capability() == before


@pytest.mark.parametrize(
    "tp, ratios, match",
    [
        (3, [0, 1, 2], "cannot be split evenly over --tensor-parallel-size 3"),
        (1, [0, 4, 1], r"compress ratios \[4\] are not DeepSeek V4.1's"),
    ],
)
def test_layers_refuse_what_the_report_refuses(
    set_capability, monkeypatch, tp, ratios, match
):
    """The layer, the backend check and the plan report share one validation:
    the same setups fail with the same message."""
    set_capability(12, 0)
    monkeypatch.setattr(policy, "get_tensor_model_parallel_world_size", lambda: tp)
    config = _vllm_config(heads=128, cache_dtype="fp8")
    config.model_config.hf_config.compress_ratios = ratios
    with pytest.raises(policy.UnsupportedSparseMLAConfig, match=match) as built:
        fi.DeepseekV4FlashInferSM120Attention(config, prefix="model.layers.1.attn")
    hf = config.model_config.hf_config
    hf.head_dim, hf.kv_source_layer_ids = 512, []
    plan = report.make_plan(
        policy.DeviceCapability(12, 0),
        hf,
        tensor_parallel_size=tp,
        kv_cache_dtype="fp8",
    )
    assert plan.error == str(built.value)
