# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Every indexer K cache of DeepSeek V4.1 Flash's published layout gets a
page the installed DeepGEMM reads, on every GPU family and TP size.

The reference for DeepGEMM's page rule is the library's own host check: the
assertion of its paged MQA logits, read from the shipped ``_C`` library's
strings and evaluated here, not the page policy's table.
"""

import json
import re
from pathlib import Path

import pytest

import vllm
from tests.models.deepseek_v41.test_kv_cache_planning import _engine_config
from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fi
from vllm.models.deepseek_v41.nvidia import sparse_mla_pages as policy
from vllm.v1.attention.backends.mla import indexer_pages
from vllm.v1.attention.backends.mla.indexer import DeepseekV41IndexerBackend
from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs
from vllm.v1.worker.utils import select_common_block_size
from vllm_dsv41_plan import report

try:
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

    def _kv_cache_config(config, specs):
        (kv_config,) = get_kv_cache_configs(config, [specs], [2 << 30])
        return kv_config
except ImportError:  # the planner moved to its own module
    from vllm.v1.core.kv_cache_planning import (
        get_kv_cache_configs,
        get_kv_cache_groups,
    )

    def _kv_cache_config(config, specs):
        groups = get_kv_cache_groups(config, specs)
        (kv_config,) = get_kv_cache_configs(config, [specs], [2 << 30], groups)
        return kv_config


# DeepSeek V4.1 Flash as published: 40 layers and 3 MTP layers; ratio 2 on
# layers 2-19, 1 on 20-39, 0 on the rest.
RATIOS = [0, 0] + [2] * 18 + [1] * 20 + [0] * 3
PUBLISHED = {
    "architectures": ["DeepseekV41ForConditionalGeneration"],
    "model_type": "deepseek_v41",
    "text_config": {
        "model_type": "deepseek_v41",
        "num_hidden_layers": 40,
        "num_nextn_predict_layers": 3,
        "num_attention_heads": 64,
        "head_dim": 512,
        "qk_rope_head_dim": 64,
        "sliding_window": 128,
        "index_head_dim": 128,
        "index_topk": 512,
        "compress_ratios": RATIOS,
        "kv_source_layer_ids": [2, 8, 14, 20],
        "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
        "candidate_source_layer_id": 20,
        "dspark_block_size": 5,
    },
    "vision_config": {"model_type": "deepseek_v41_vision", "hidden_size": 1024},
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"},
}
# Kv sources that are index sources own an indexer K cache.
OWNERS = {2: 2, 8: 2, 14: 2, 20: 1}
FAMILIES = [(9, 0), (10, 0), (12, 0), (12, 1)]


def _deepgemm_library() -> Path:
    found = sorted(Path(vllm.__file__).parent.glob("third_party/deep_gemm/_C*.so"))
    assert found, "the vLLM wheel ships DeepGEMM's compiled part"
    return found[0]


def _host_check() -> str:
    """The boolean expression DeepGEMM asserts on ``block_kv`` for its paged
    MQA logits (one per GPU major), as the library carries it."""
    text = _deepgemm_library().read_bytes().decode("latin-1")
    checks = {
        m.group(0)
        for m in re.finditer(
            r"\(arch_major == 10 and [ -~]*?arch_major == 12[ -~]*", text
        )
    }
    assert len(checks) == 1, checks
    return checks.pop()


def deepgemm_takes(major: int, states: int) -> bool:
    """Evaluate the library's own assertion for FP8 keys."""
    expression = _host_check()
    assert re.fullmatch(r"[\w\s()=]+", expression), expression
    names = {"arch_major": major, "block_kv": states, "is_fp4": False}
    return bool(eval(expression, {"__builtins__": {}}, names))  # noqa: S307


@pytest.fixture
def published(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(PUBLISHED))
    return path


@pytest.mark.parametrize("major", [9, 10, 12])
def test_the_shipped_deepgemm_reads_the_planned_pages(major):
    assert deepgemm_takes(major, indexer_pages.INDEXER_STATES)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("family", FAMILIES, ids=lambda c: f"sm{c[0]}{c[1]}")
def test_published_layout_plan_gives_pages_deepgemm_reads(
    capsys, published, family, tp
):
    args = ["plan", "--capability", f"{family[0]}.{family[1]}"]
    args += ["--config", str(published), "--tp", str(tp)]
    assert report.main([*args, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["local_heads"] == 64 // tp
    indexers = {c["cache"]: c for c in plan["caches"] if c["kernel"]}
    assert sorted(indexers) == ["indexer r=1", "indexer r=2"]
    for ratio in (1, 2):
        cache = indexers[f"indexer r={ratio}"]
        assert cache["layers"] == [n for n, r in OWNERS.items() if r == ratio]
        assert cache["page_tokens"] == cache["states_per_page"] * ratio
        assert deepgemm_takes(family[0], cache["states_per_page"])
        assert "DeepGEMM" in cache["trusted"]
    # The text names the same caches, layers as ranges.
    assert report.main(args) == 0
    text = capsys.readouterr().out
    assert re.search(r"^indexer r=2\s+2,8,14\s", text, re.M)
    assert re.search(r"^swa\s+0-42\s", text, re.M)


def _kernel_states(capability, hf, block_size) -> dict[str, int]:
    """States per kernel page of each indexer K cache after vLLM's own
    grouping and the worker's choice of one kernel page per group."""
    config = _engine_config(block_size)
    layer_cls = report.layer_class(capability, "FLASHINFER_MLA_SPARSE_DSV41")
    specs = report.cache_specs(layer_cls, capability, hf, "fp8", block_size)
    indexer_specs = {n: s for n, s in specs.items() if n.endswith("indexer.k_cache")}
    backends = {n: fi.DeepseekV4FlashInferMLASparseBackend for n in specs}
    for name in specs:
        if name.endswith("swa_cache"):
            backends[name] = layer_cls.swa_backend_cls
    backends.update({n: DeepseekV41IndexerBackend for n in indexer_specs})
    kv_config = _kv_cache_config(config, specs)
    states = {}
    for group in kv_config.kv_cache_groups:
        spec = group.kv_cache_spec
        inner = (
            spec.kv_cache_specs
            if isinstance(spec, UniformTypeKVCacheSpecs)
            else dict.fromkeys(group.layer_names, spec)
        )
        kernel = select_common_block_size(
            spec.block_size, list(dict.fromkeys(backends[n] for n in group.layer_names))
        )
        for name in group.layer_names:
            if name in indexer_specs:
                states[name] = kernel // inner[name].tokens_per_state
    assert len(states) == len(OWNERS)
    return states


@pytest.mark.parametrize("family", FAMILIES, ids=lambda c: f"sm{c[0]}{c[1]}")
def test_every_accepted_block_size_pages_every_kernel(
    set_capability, published, family
):
    """Each --block-size start-up accepts reaches vLLM's planner with
    indexer pages DeepGEMM reads; each one it refuses names those that work."""
    capability = set_capability(*family)
    hf = report.load_config(published)
    plan = policy.plan_pages(capability)
    accepted = []
    for block_size in (16, 32, 64, 128, 256):
        try:
            policy.check_block_size(
                block_size,
                plan,
                fi.DeepseekV4FlashInferMLASparseBackend.paged_backends(),
            )
        except policy.UnsupportedSparseMLAConfig as e:
            assert "Use one of [" in str(e)
            continue
        accepted.append(block_size)
        for name, states in _kernel_states(capability, hf, block_size).items():
            assert deepgemm_takes(family[0], states), (block_size, name, states)
    # The default --block-size is among them.
    default = report.default_block_size(
        report.layer_class(capability, "FLASHINFER_MLA_SPARSE_DSV41"), capability
    )
    assert default in accepted


def test_indexer_pages_refused_by_deepgemm_fail_at_start_up(monkeypatch):
    """On the GPU host start-up asks DeepGEMM; a page it refuses stops the
    model build with the counts it takes."""
    from vllm.platforms import current_platform

    capability = policy.DeviceCapability(9, 0)
    monkeypatch.setattr(type(current_platform), "is_cuda", lambda self: True)
    monkeypatch.setattr("vllm.utils.import_utils.has_deep_gemm", lambda: True)
    monkeypatch.setattr(indexer_pages, "deepgemm_takes", lambda n: n == 32)
    indexer_pages.confirm_indexer_pages.cache_clear()
    with pytest.raises(ValueError, match=r"64 states.*takes \[32\]"):
        indexer_pages.confirm_indexer_pages(capability)
    monkeypatch.setattr(indexer_pages, "deepgemm_takes", lambda n: n == 64)
    indexer_pages.confirm_indexer_pages.cache_clear()
    indexer_pages.confirm_indexer_pages(capability)  # taken: no error
    indexer_pages.confirm_indexer_pages.cache_clear()
