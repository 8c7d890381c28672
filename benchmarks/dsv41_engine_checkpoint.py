# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Write a small DeepSeek V4.1-shaped checkpoint (about 50 MB) that vLLM's
engine loads like the real one, for engine runs on one GPU.

    python benchmarks/dsv41_engine_checkpoint.py --out DIR [--seed 0] \
        [--layout small|published] [--heads 8]

Layer kinds as in the model: with the default ``--layout small``, 6 layers of
compress ratios 0/1/1/2/2/0, compressed-KV and indexer source layers 1 and 3,
attention sinks, every layer a mixture of experts (8 routed, 2 per token, one
shared), mHC hyper-connections; 8 heads of 512 (one GPU's share of a 64-head
model on 8 GPUs; ``--heads 16`` gives the share at TP 4). ``--layout
published`` follows the published DeepSeek V4.1 Flash pattern in 10 layers
(``PUBLISHED_LAYOUT``): sliding-window layers at both ends, ratio-2 layers,
then ratio-1 layers, each run with its own compressed-KV sources and
indexers that read a source's index keys without owning them (60 MB: 4
routed experts of half the width). Weights are BF16 (no quantization config),
random with fan-in scaling; the output head is scaled so logits spread by
about 3 after the final norm (not flat, so greedy decoding has clear winners
at most steps). Each layer's expert choice is
fixed by the router's selection bias (layer i takes experts 2i and 2i+1,
mod 8; the routing weights still follow the token): a token's choice of
experts is the one discrete decision inside the model, and random routers
put it near a tie often enough that last-bit differences between two
attention kernels turn into different tokens within a few steps, which is
noise, not a finding (``--free-routing`` keeps random selection to show
it). The tokenizer is byte-level, made
here (no download): 3 special tokens, 256 bytes, filler up to the vocabulary.
vLLM builds the vision wrapper around the text model, so its three
delimiter vectors are in the checkpoint; run with
``limit_mm_per_prompt={"image": 0}``.
"""

import argparse
import json
from pathlib import Path

import torch

TEXT_CONFIG = {
    "vocab_size": 1024,
    "hidden_size": 512,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 128,
    "o_lora_rank": 128,
    "o_groups": 2,
    "sliding_window": 128,
    "compress_ratios": [0, 1, 1, 2, 2, 0],
    "kv_source_layer_ids": [1, 3],
    "index_source_layer_ids": [1, 3],
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 512,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "n_shared_experts": 1,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "swiglu_limit": 10.0,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "max_position_embeddings": 4096,
    "rope_scaling": {
        "type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 1024,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
}
# The published DeepSeek V4.1 Flash pattern, 10 layers long. A layer of
# ratio r > 0 reads the compressed KV of the last kv source at or below it and
# the top-k of the last index source at or below it (vLLM 0.30.0's
# DeepseekV4Attention); an index source that is no kv source owns no index
# keys (no wk, k_norm) and scores the K cache of that same kv source
# (DeepseekV4Indexer, owns_k). vLLM checks none of the ratios, so
# ``topology_errors`` does: every compressed layer's kv source and index
# source have its ratio, and its index source scores its own kv source's keys.
#   layer:        0  1   2  3   4  5   6  7   8  9
#   ratio:        0  2   2  2   2  1   1  1   1  0
#   kv source:    -  1*  1  3*  3  5*  5  5   5  -   (* owns a compressor)
#   index source: -  1*  2  3*  3  5*  5  7   7  -   (* owns its index keys)
# So each ratio has owning indexers, a non-owning reader (2; 7) and a layer
# that reuses another's top-k (4; 6 and 8, 8 behind a non-owning reader). No
# two-level candidate filtering (candidate_source_layer_id stays unset).
PUBLISHED_LAYOUT = {
    "num_hidden_layers": 10,
    "compress_ratios": [0, 2, 2, 2, 2, 1, 1, 1, 1, 0],
    "kv_source_layer_ids": [1, 3, 5],
    "index_source_layer_ids": [1, 2, 3, 5, 7],
    # Half the experts, half as wide: 10 layers in 60 MB, not 86.
    "n_routed_experts": 4,
    "moe_intermediate_size": 64,
}
# --layout: changes to TEXT_CONFIG.
LAYOUTS = {"small": {}, "published": PUBLISHED_LAYOUT}
SPECIAL_TOKENS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>")
# Spread of the logits after the final RMS norm (unit-size hidden states).
LOGIT_SPREAD = 3.0
# Added to the chosen experts' selection scores: sqrt(softplus(logit)) of a
# unit-variance router logit stays far below it, so the choice never flips.
SELECTION_BIAS = 10.0


def topology_errors(t: dict) -> list[str]:
    """What vLLM would build wrongly or not at all from ``t``'s layers, one
    line per problem (empty: every layer has sources it can read)."""
    ratios, layers = t["compress_ratios"], t["num_hidden_layers"]
    kv, index = t["kv_source_layer_ids"], t["index_source_layer_ids"]
    if len(ratios) != layers or not set(ratios) <= {0, 1, 2}:
        return [f"compress_ratios: {layers} of 0, 1 or 2, not {ratios}"]
    errors = [
        f"source layer {i} has ratio 0"
        for i in sorted({*kv, *index})
        if not 0 <= i < layers or ratios[i] == 0
    ]
    if errors:
        return errors

    def last(sources: list[int], i: int) -> int | None:
        return max((s for s in sources if s <= i), default=None)

    for i, ratio in enumerate(ratios):
        if ratio == 0:
            continue
        kv_i, index_i = last(kv, i), last(index, i)
        if kv_i is None or index_i is None:
            errors.append(f"layer {i} has no kv or index source at or below it")
        elif ratios[kv_i] != ratio or ratios[index_i] != ratio:
            errors.append(
                f"layer {i} (ratio {ratio}) reads kv source {kv_i} (ratio "
                f"{ratios[kv_i]}) and index source {index_i} (ratio "
                f"{ratios[index_i]})"
            )
        elif last(kv, index_i) != kv_i:
            errors.append(
                f"layer {i}'s index source {index_i} scores kv source "
                f"{last(kv, index_i)}'s keys, not {kv_i}'s"
            )
    return errors


def tensor_shapes(t: dict) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Checkpoint name -> (shape, dtype), in the names the model's
    ``load_weights`` reads (it fuses and renames them itself)."""
    hidden, heads, head_dim = t["hidden_size"], t["num_attention_heads"], t["head_dim"]
    q_rank, groups, o_rank = t["q_lora_rank"], t["o_groups"], t["o_lora_rank"]
    hc, experts, inter = t["hc_mult"], t["n_routed_experts"], t["moe_intermediate_size"]
    shared = inter * t["n_shared_experts"]
    idx_heads, idx_dim = t["index_n_heads"], t["index_head_dim"]
    mix = (2 + hc) * hc
    bf16, f32 = torch.bfloat16, torch.float32
    shapes = {
        "embed.weight": ((t["vocab_size"], hidden), bf16),
        "head.weight": ((t["vocab_size"], hidden), bf16),
        "norm.weight": ((hidden,), bf16),
        **{f"image_{k}": ((hidden,), f32) for k in ("start", "end", "newline")},
    }
    for i, ratio in enumerate(t["compress_ratios"]):
        layer = f"layers.{i}."
        for part in ("attn", "ffn"):
            shapes[f"{layer}hc_{part}_fn"] = ((mix, hc * hidden), f32)
            shapes[f"{layer}hc_{part}_base"] = ((mix,), f32)
            shapes[f"{layer}hc_{part}_scale"] = ((3,), f32)
            shapes[f"{layer}{part}_norm.weight"] = ((hidden,), bf16)
        attn = f"{layer}attn."
        shapes[f"{attn}attn_sink"] = ((heads,), f32)
        shapes[f"{attn}wq_a.weight"] = ((q_rank, hidden), bf16)
        shapes[f"{attn}wkv.weight"] = ((head_dim, hidden), bf16)
        shapes[f"{attn}q_norm.weight"] = ((q_rank,), bf16)
        shapes[f"{attn}kv_norm.weight"] = ((head_dim,), bf16)
        shapes[f"{attn}wq_b.weight"] = ((heads * head_dim, q_rank), bf16)
        shapes[f"{attn}wo_a.weight"] = (
            (groups * o_rank, heads * head_dim // groups),
            bf16,
        )
        shapes[f"{attn}wo_b.weight"] = ((hidden, groups * o_rank), bf16)
        if i in t["kv_source_layer_ids"]:
            shapes[f"{attn}compressor.wkv.weight"] = ((head_dim, hidden), bf16)
            if ratio > 1:  # overlapping windows gate their two halves
                shapes[f"{attn}compressor.wgate.weight"] = ((head_dim, hidden), bf16)
            shapes[f"{attn}compressor.norm.weight"] = ((head_dim,), bf16)
        if i in t["index_source_layer_ids"]:
            shapes[f"{attn}indexer.wq_b.weight"] = ((idx_heads * idx_dim, q_rank), bf16)
            shapes[f"{attn}indexer.weights_proj.weight"] = ((idx_heads, hidden), bf16)
            if i in t["kv_source_layer_ids"]:
                shapes[f"{attn}indexer.wk.weight"] = ((idx_dim, head_dim), bf16)
                shapes[f"{attn}indexer.k_norm.weight"] = ((idx_dim,), bf16)
        ffn = f"{layer}ffn."
        shapes[f"{ffn}gate.weight"] = ((experts, hidden), bf16)
        shapes[f"{ffn}gate.bias"] = ((experts,), f32)
        for name, shape in (("w1", (shared, hidden)), ("w3", (shared, hidden)),
                            ("w2", (hidden, shared))):  # fmt: skip
            shapes[f"{ffn}shared_experts.{name}.weight"] = (shape, bf16)
        for e in range(experts):
            shapes[f"{ffn}experts.{e}.w1.weight"] = ((inter, hidden), bf16)
            shapes[f"{ffn}experts.{e}.w3.weight"] = ((inter, hidden), bf16)
            shapes[f"{ffn}experts.{e}.w2.weight"] = ((hidden, inter), bf16)
    return shapes


def initial_value(
    name: str, shape: tuple[int, ...], gen: torch.Generator
) -> torch.Tensor:
    if name.endswith(("norm.weight", "_scale")):
        return torch.ones(shape)
    if name.endswith(("_base", "gate.bias")) or name.startswith("image_"):
        return torch.zeros(shape)
    values = torch.randn(shape, generator=gen)
    if name == "head.weight":
        return values * LOGIT_SPREAD / shape[1] ** 0.5
    if name == "embed.weight" or name.endswith("attn_sink"):
        return values
    return values / shape[-1] ** 0.5  # fan-in


def fixed_selection_bias(layer: int, experts: int) -> torch.Tensor:
    """Layer ``layer``'s router bias: experts 2*layer and 2*layer+1 (mod
    ``experts``) always win the selection, so the layers use them all."""
    bias = torch.zeros(experts)
    bias[[(2 * layer) % experts, (2 * layer + 1) % experts]] = SELECTION_BIAS
    return bias


def write_tokenizer(out: Path, vocab_size: int) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[char] = len(vocab)
    while len(vocab) < vocab_size:
        vocab[f"<|unused_{len(vocab)}|>"] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    tokenizer.save(str(out / "tokenizer.json"))
    bos, eos, pad = SPECIAL_TOKENS
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": TEXT_CONFIG["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def write_checkpoint(
    out: Path,
    seed: int = 0,
    compress_ratios: list[int] | None = None,
    free_routing: bool = False,
    layout: str = "small",
    heads: int | None = None,
) -> int:
    """Write the checkpoint into ``out`` (``layout``: a ``LAYOUTS`` key;
    ``compress_ratios``: one per layer, default the layout's; ``heads``:
    attention heads, default 8); returns the weights' bytes. Raises
    ValueError for layers vLLM cannot serve."""
    text = dict(TEXT_CONFIG)
    text.update(LAYOUTS[layout])
    if heads is not None:
        if heads % text["o_groups"]:
            raise ValueError(f"{heads} heads do not split into {text['o_groups']}")
        text["num_attention_heads"] = heads
    if compress_ratios is not None:
        text["compress_ratios"] = compress_ratios
    if errors := topology_errors(text):
        raise ValueError("; ".join(errors))
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    ids = {"bos_token_id": 0, "eos_token_id": 1}
    config = {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "text_config": text,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        **ids,
    }
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps(ids))
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        name: initial_value(name, shape, gen).to(dtype).contiguous()
        for name, (shape, dtype) in tensor_shapes(text).items()
    }
    if not free_routing:
        for i in range(text["num_hidden_layers"]):
            tensors[f"layers.{i}.ffn.gate.bias"] = fixed_selection_bias(
                i, text["n_routed_experts"]
            )
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer(out, text["vocab_size"])
    return (out / "model.safetensors").stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--layout",
        choices=sorted(LAYOUTS),
        default="small",
        help="small (default): 6 layers, ratios "
        f"{','.join(map(str, TEXT_CONFIG['compress_ratios']))}, sources 1 and "
        "3; published: the published DeepSeek V4.1 Flash pattern in 10 "
        "layers, ratios "
        f"{','.join(map(str, PUBLISHED_LAYOUT['compress_ratios']))}, kv "
        f"sources {','.join(map(str, PUBLISHED_LAYOUT['kv_source_layer_ids']))}"
        ", index sources "
        f"{','.join(map(str, PUBLISHED_LAYOUT['index_source_layer_ids']))} "
        "(non-owning readers 2 and 7)",
    )
    parser.add_argument(
        "--compress-ratios",
        help="comma-separated ratio per layer (default: the layout's); the "
        "layout's source layers stay, and each compressed layer's sources "
        "need its ratio",
    )
    parser.add_argument(
        "--free-routing",
        action="store_true",
        help="random expert selection (zero selection bias), as before fixing it",
    )
    parser.add_argument(
        "--heads",
        type=int,
        help="attention heads (default 8; 16 is one GPU's share at TP 4)",
    )
    args = parser.parse_args()
    ratios = None
    if args.compress_ratios:
        ratios = [int(r) for r in args.compress_ratios.split(",")]
    try:
        size = write_checkpoint(
            args.out, args.seed, ratios, args.free_routing, args.layout, args.heads
        )
    except ValueError as e:
        parser.error(f"--layout {args.layout}: {e}")
    print(f"wrote {args.out} ({size / 2**20:.1f} MiB of weights)")


if __name__ == "__main__":
    main()
