# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Greedy generation of a DeepSeek V4.1 checkpoint through vLLM's engine with
one sparse-MLA attention backend; one backend per process.

    python benchmarks/dsv41_engine_generate.py --model DIR \
        --backend FLASHMLA_SPARSE_DSV41 --out a.json
    python benchmarks/dsv41_engine_generate.py --model DIR \
        --backend FLASHINFER_MLA_SPARSE_DSV41 [--force-sm12x-pages] --out b.json

CUDA graphs are on (full graphs of the decode steps; no torch.compile, so the
run does not depend on Inductor matching the host's torch). For every prompt
it writes the generated tokens, each step's two most likely tokens with their
log-probabilities (their difference is the top-two logit gap), and the
throughput of the second of two identical passes (the first compiles what
start-up leaves to first use; the file says whether the second repeated it).
``--solo`` runs one prompt at a time: the reference run that way measures
how far its own numerical noise carries. ``benchmarks/dsv41_engine_compare.py``
compares the files.
"""

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

_PAGE_TEXT = (
    "Sliding windows and compressed caches page their entries in blocks; a "
    "request that runs long crosses many of them, and every page boundary is a "
    "place where an off-by-one would show. "
)
# The checkpoint's tokenizer is byte-level: one token per byte. The indexer
# selects among compressed entries only past index_topk (512) of them, so the
# two long prompts (about 700 and 1,400 tokens) run it on the ratio-1 and the
# ratio-2 layers; the short ones stay within the window.
PROMPTS = (
    "The quick brown fox",
    (
        "In the beginning the universe was created. This has made a lot of "
        "people very angry and been widely regarded as a bad move."
    ),
    " ".join(str(i) for i in range(1, 201)),
    _PAGE_TEXT * 7,
)


def _step_logprobs(step: dict) -> list[list[float]]:
    """A step's candidates as [token, logprob], most likely first."""
    ranked = sorted(step.items(), key=lambda kv: kv[1].rank)
    return [[token, lp.logprob] for token, lp in ranked]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument(
        "--backend", help="--attention-backend (default: vLLM's choice for the GPU)"
    )
    parser.add_argument(
        "--force-sm12x-pages",
        action="store_true",
        help="SM12x's fixed pages on the Triton path, planned in this process "
        "(tests/v1/attention/dsv41/sm12x_pages.py)",
    )
    parser.add_argument(
        "--solo",
        action="store_true",
        help="one prompt at a time (other batch shapes, so other roundings: "
        "the reference run this way measures its own numerical noise)",
    )
    parser.add_argument(
        "--prefix-caching",
        action="store_true",
        help="keep vLLM's prefix cache on (the second pass then reuses the "
        "first pass's KV instead of computing the same steps again)",
    )
    parser.add_argument("--block-size", type=int, help="--block-size (default: unset)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    # The engine core in this process: one traceback if it fails, and the
    # SM12x pages below reach the model it builds.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if args.force_sm12x_pages:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.v1.attention.dsv41.sm12x_pages import force_sm12x_pages

        force_sm12x_pages(setattr)
    # PyTorch's sampler in every run: the comparison is of attention
    # backends, and FlashInfer's sampling kernels compile at first use from
    # FlashInfer's CUDA sources, which an offline host may not carry.
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    import torch
    import triton

    import vllm
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(
        model=args.model,
        attention_backend=args.backend,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=len(PROMPTS),
        block_size=args.block_size,
        limit_mm_per_prompt={"image": 0},  # the text model only
        seed=0,
        enable_prefix_caching=args.prefix_caching,
        compilation_config={"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"},
    )
    load_s = time.perf_counter() - started
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=0.0, logprobs=2, ignore_eos=True
    )

    def generate() -> list:
        if args.solo:
            return [llm.generate([p], params)[0] for p in PROMPTS]
        return llm.generate(list(PROMPTS), params)

    # The first pass compiles what start-up left to first use (kernels keyed
    # by shapes the warm-up did not meet); the second is timed, and the file
    # records whether it repeated the first token for token.
    first = generate()
    started = time.perf_counter()
    outputs = generate()
    elapsed = time.perf_counter() - started
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    repeats = all(
        list(a.outputs[0].token_ids) == list(b.outputs[0].token_ids)
        for a, b in zip(first, outputs, strict=True)
    )
    result = {
        "backend": args.backend,
        "block_size": args.block_size,
        "force_sm12x_pages": args.force_sm12x_pages,
        "solo": args.solo,
        "prefix_caching": args.prefix_caching,
        "model": args.model,
        "gpu": torch.cuda.get_device_name(),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "vllm": vllm.__version__,
        },
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_s": round(load_s, 1),
        "generate_s": round(elapsed, 3),
        "tokens_per_s": round(generated / elapsed, 1),
        "second_pass_repeats_first": repeats,
        "prompts": [
            {
                "prompt": prompt,
                "prompt_token_ids": list(o.prompt_token_ids),
                "token_ids": list(o.outputs[0].token_ids),
                "top2": [_step_logprobs(step) for step in o.outputs[0].logprobs],
            }
            for prompt, o in zip(PROMPTS, outputs, strict=True)
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result) + "\n")
    print(
        f"{args.backend} force_sm12x_pages={args.force_sm12x_pages}: "
        f"{generated} tokens in {elapsed:.2f} s ({result['tokens_per_s']} tok/s; "
        f"second pass repeats the first: {repeats}); "
        f"engine start {load_s:.0f} s -> {args.out}"
    )


if __name__ == "__main__":
    main()
