# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The plan report: what start-up will do, printed without a GPU."""

import json

import pytest

from tests.plan_report.start_up import two_segment_backend, vllms_default_block_size
from tests.v1.attention.dsv41.flashinfer_release import FIXED_SM120_PAGE, fixed_pages
from vllm_dsv41_plan import report


# The two-segment layers' plans; the default classes have tests of their own.
def _plan(capsys, *args: str) -> tuple[int, dict]:
    """The report's JSON for the two-segment layer on the GPU ``args`` name."""
    major = int(args[args.index("--capability") + 1].split(".")[0])
    backend = ["--attention-backend", two_segment_backend(major)]
    code = report.main(["plan", *backend, *args, "--json"])
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
        # FlashInfer takes any page: upstream's 32-token SWA page and the
        # default 64-token (--block-size) compressed pages stay.
        expected = [("swa", 32, 32), ("compressed r=1", 64, 64)]
        expected.append(("compressed r=2", 64, 32))
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
            "top-k 384",
            marks=fixed_pages,
        ),
    ],
)
def test_triton_path_is_reported(capsys, args, note):
    code, plan = _plan(capsys, *args)
    assert code == 0
    assert "Triton" in plan["kernel_path"]
    assert plan["attention_class"].endswith(
        ("DeepseekV4FlashInferSM120Attention", "DeepseekV4TritonMLAAttention")
    )
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


def _sm90_pages(capsys, *block_size: str) -> dict[str, dict]:
    code, plan = _plan(capsys, "--capability", "9.0", *block_size)
    assert code == 0, plan["error"]
    return {c["cache"]: c for c in plan["caches"]}


def _assert_sm90_pages(caches, compressed_tokens: int) -> None:
    """Upstream's pages for the compressed caches (--block-size); the indexer
    K caches' 64-state pages of their own where the indexer backend pages
    them, else --block-size too."""
    from vllm.v1.attention.backends.mla.indexer import DeepseekV41IndexerBackend

    own_pages = hasattr(DeepseekV41IndexerBackend, "get_indexer_block_size")
    assert (caches["swa"]["page_tokens"], caches["swa"]["states_per_page"]) == (32, 32)
    for ratio in (1, 2):
        cache = caches[f"compressed r={ratio}"]
        assert cache["page_tokens"] == compressed_tokens
        assert cache["states_per_page"] == compressed_tokens // ratio
        indexer = caches[f"indexer r={ratio}"]
        tokens = 64 * ratio if own_pages else compressed_tokens
        assert (indexer["page_tokens"], indexer["states_per_page"]) == (
            tokens,
            tokens // ratio,
        )


def test_sm90_default_pages_are_the_h200s_on_any_host(capsys, set_capability):
    """Unset --block-size: the size vLLM picks for the model's backends on an
    SM90 GPU (asked of vLLM after the report ran), whatever GPU, or none,
    the report runs on."""
    caches = _sm90_pages(capsys)
    _assert_sm90_pages(caches, vllms_default_block_size(set_capability(9, 0)))


@pytest.mark.parametrize("block_size", [64])
def test_sm90_pages_of_a_block_size_on_the_h200(capsys, set_capability, block_size):
    """--block-size on an SM90 host (mocked) gets the same pages."""
    set_capability(9, 0)
    _assert_sm90_pages(_sm90_pages(capsys, "--block-size", str(block_size)), block_size)


def test_sm90_block_size_64_on_a_gpu_less_host(capsys, monkeypatch):
    """The capability given, not the host's GPU, answers every hook."""
    from vllm.platforms import current_platform

    monkeypatch.setattr(
        type(current_platform),
        "get_device_capability",
        classmethod(lambda cls, device_id=0: None),
    )
    _assert_sm90_pages(_sm90_pages(capsys, "--block-size", "64"), 64)


def test_sm90_refuses_pages_its_indexer_cannot_split(capsys, set_capability):
    code, plan = _plan(capsys, "--capability", "9.0", "--block-size", "32")
    assert code == 1
    # Each base's full answer is the README's table (test_readme_block_sizes).
    assert "--block-size 32" in plan["error"] and "64" in plan["error"]


@pytest.mark.parametrize(
    "capability, backend, layer",
    [
        ("9.0", None, "flashmla.DeepseekV4FlashMLAAttention"),
        ("12.0", None, "flashinfer_sparse.DeepseekV4FlashInferSM120Attention"),
        ("12.1", None, "flashinfer_sparse.DeepseekV4FlashInferSM120Attention"),
        ("10.0", "FLASHMLA_SPARSE_DSV41", "flashmla.DeepseekV4FlashMLAAttention"),
        ("10.0", "FLASHINFER_MLA_SPARSE_DSV41", "DeepseekV4FlashInferMLAAttention"),
    ],
)
def test_the_class_start_up_builds(capsys, capability, backend, layer):
    """Without --attention-backend the report plans vLLM's own choice."""
    named = ["--attention-backend", backend] if backend else []
    code = report.main(["plan", "--capability", capability, *named, "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0 and plan["attention_class"].endswith(layer)


@pytest.mark.default_base_only  # mega attention is newer than the backport
def test_sm100_default_says_where_mega_attention_runs(capsys):
    """A host that cannot run SM100's mega attention kernel plans FlashMLA,
    and says that start-up on a B200 with the kernel builds mega attention."""
    assert report.main(["plan", "--capability", "10.0", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    from vllm.models.deepseek_v41.nvidia.flash_mla_mega_attn import (
        is_flashmla_mega_attn_supported,
    )

    if is_flashmla_mega_attn_supported()[0]:
        assert plan["attention_class"].endswith("DeepseekV4MegaAttnAttention")
    else:
        assert plan["attention_class"].endswith("DeepseekV4FlashMLAAttention")
        assert "DeepseekV4MegaAttnAttention" in plan["note"]
