# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The engine run's checkpoint is what vLLM builds and loads for DeepSeek
V4.1: its own loader (in a subprocess, an H200 stood in for) takes every
tensor it reads and leaves no parameter unloaded, and its logits are not
flat. The same holds for ``--layout published`` (the published DeepSeek V4.1
Flash pattern), whose layers vLLM wires to the sources the layout names."""

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WRITE = REPO / "benchmarks" / "dsv41_engine_checkpoint.py"
LOAD = Path(__file__).with_name("load_engine_checkpoint.py")

# The tensor names and the CPU stand-in for an H200 are vLLM 0.30.0's (the
# base the engine runs used); a later vLLM's model build reaches compiled
# parts the stand-in does not provide.
pytestmark = pytest.mark.skipif(
    version("vllm").split("+")[0] != "0.30.0",
    reason="the checkpoint loader's CPU stand-in is written for vLLM 0.30.0",
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dsv41") / "ckpt"
    subprocess.run([sys.executable, WRITE, "--out", out], check=True)
    return out


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dsv41") / "published"
    subprocess.run(
        [sys.executable, WRITE, "--out", out, "--layout", "published"], check=True
    )
    return out


@pytest.fixture(scope="module")
def broken(checkpoint: Path, tmp_path_factory) -> Path:
    """The checkpoint without one parameter's tensor."""
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("dsv41") / "broken"
    out.mkdir()
    for f in checkpoint.iterdir():
        if f.name != "model.safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    tensors = load_file(checkpoint / "model.safetensors")
    del tensors["layers.3.attn.indexer.k_norm.weight"]
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def loaded(checkpoint: Path, published: Path, broken: Path) -> dict[str, dict]:
    """vLLM's answer for each checkpoint, from one process (imports are most
    of its time)."""
    result = subprocess.run(
        [sys.executable, LOAD, checkpoint, published, broken],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # vLLM logs to stdout too: the script's lines are its JSON objects.
    reports = [
        json.loads(line)
        for line in result.stdout.splitlines()
        if line.startswith('{"checkpoint"')
    ]
    return {Path(r["checkpoint"]).name: r for r in reports}


def test_vllm_builds_and_loads_it(loaded: dict[str, dict]) -> None:
    report = loaded["ckpt"]
    assert "error" not in report, report
    assert report["architecture"] == "DeepseekV41ForCausalLM"
    assert report["tokenizer_mode"] == "deepseek_v41"
    assert report["quantization"] is None
    assert report["compress_ratios"] == [0, 1, 1, 2, 2, 0]
    # Head rows ~ N(0, 9 / hidden) against unit-size states: logits ~ N(0, 9).
    assert 2.5 < report["logit_std"] < 3.5
    # A flat distribution over 1,024 tokens would put 0.001 on the top one.
    assert 0.05 < report["top_probability"] < 0.9


def test_vllm_builds_and_loads_the_published_layout(
    loaded: dict[str, dict], published: Path
) -> None:
    report = loaded["published"]
    assert "error" not in report, report
    assert report["architecture"] == "DeepseekV41ForCausalLM"
    assert report["compress_ratios"] == [0, 2, 2, 2, 2, 1, 1, 1, 1, 0]
    assert 2.5 < report["logit_std"] < 3.5
    assert (published / "model.safetensors").stat().st_size < 60e6


def test_the_published_layout_wires_each_layer_to_its_sources(
    loaded: dict[str, dict],
) -> None:
    """As vLLM built it: ratio-2 layers read ratio-2 sources (1, 3) and
    ratio-1 layers the ratio-1 source (5); layers 2 and 7 index without
    owning keys, scoring their kv source's K cache; 4, 6 and 8 reuse the
    last indexer's top-k (8 a non-owning reader's)."""
    layers = loaded["published"]["layers"]
    assert [layer["layer"] for layer in layers] == list(range(10))
    kv = [1, 1, 3, 3, 5, 5, 5, 5]
    index = [1, 2, 3, 3, 5, 5, 7, 7]
    indexer = ["owns keys", "reads keys", "owns keys", None,
               "owns keys", None, "reads keys", None]  # fmt: skip
    for layer in (layers[0], layers[9]):
        assert layer["ratio"] == 0 and layer["kv_source"] is None
        assert layer["indexer"] is None and not layer["compressor"]
    for layer, kv_i, index_i, kind in zip(layers[1:9], kv, index, indexer, strict=True):
        i = layer["layer"]
        assert (layer["kv_source"], layer["index_source"]) == (kv_i, index_i), i
        assert layers[kv_i]["ratio"] == layers[index_i]["ratio"] == layer["ratio"]
        assert layer["compressor"] == (i == kv_i)
        assert layer["indexer"] == kind, i
        if kind is not None:
            assert layer["index_k_cache"].endswith(
                f".layers.{kv_i}.attn.indexer.k_cache"
            )


@pytest.mark.parametrize(
    ("name", "layers", "experts"), [("ckpt", 6, 8), ("published", 10, 4)]
)
def test_each_layer_always_selects_the_same_experts(
    loaded: dict, name: str, layers: int, experts: int
) -> None:
    """DeepSeek V4 routing selects the top 2 of sqrt(softplus(logit)) + bias
    (the bias steers selection only). With the bias vLLM loaded, no router
    logit a unit-size state can produce changes a layer's choice, and the
    layers between them use every routed expert."""
    import torch

    bias = torch.tensor(loaded[name]["selection_bias"])
    assert bias.shape == (layers, experts)
    # Router rows are fan-in scaled: logits ~ N(0, 1); allow 4x that.
    gen = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn(10_000, experts, generator=gen)
    scores = torch.nn.functional.softplus(logits).sqrt()
    chosen = []
    for layer_bias in bias:
        picks = (scores + layer_bias).topk(2, dim=-1).indices.sort(-1).values
        assert (picks == picks[0]).all()
        chosen.append(tuple(picks[0].tolist()))
    assert len(set(chosen)) > 1
    assert {e for pair in chosen for e in pair} == set(range(experts))


def test_a_missing_tensor_fails_the_load(loaded: dict[str, dict]) -> None:
    """The check above fails for a parameter the checkpoint lacks (vLLM
    tracks whole parameters: a missing shard of a fused one goes unseen)."""
    assert "k_norm" in loaded["broken"]["error"]


def test_the_tokenizer_is_byte_level(checkpoint: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    text = "Page 64, héllo"
    ids = tokenizer.encode(text).ids
    assert len(ids) == len(text.encode())  # one token per byte
    assert tokenizer.decode(ids) == text
    assert tokenizer.get_vocab_size() == 1024
    assert tokenizer.token_to_id("<｜end▁of▁sentence｜>") == 1


@pytest.mark.parametrize(
    ("ratios", "why"),
    [
        ("0,1,2,2,2,0", "layer 2 (ratio 2) reads kv source 1 (ratio 1)"),
        ("0,1,1,0,2,0", "source layer 3 has ratio 0"),
    ],
)
def test_layers_vllm_would_misread_are_refused(
    tmp_path: Path, ratios: str, why: str
) -> None:
    """vLLM checks no source's ratio: a layer of ratio 2 would read a ratio-1
    source's cache as if it were its own. The writer refuses such layers."""
    out = tmp_path / "ckpt"
    result = subprocess.run(
        [sys.executable, WRITE, "--out", out, "--compress-ratios", ratios],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and why in result.stderr
    assert not out.exists()
