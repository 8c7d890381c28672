# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A stand-in for the VllmConfig a DeepSeek V4.1 attention layer reads while
it negotiates, holding only those fields."""

from types import SimpleNamespace


def vllm_config_stand_in(
    heads=64, block_size=128, cache_dtype="auto", spec_tokens=None, user_block=True
):
    """``user_block``: whether ``block_size`` came from --block-size (else it
    is vLLM's generic default, replaced after the model is built)."""
    return SimpleNamespace(
        model_config=SimpleNamespace(
            hf_config=SimpleNamespace(
                num_attention_heads=heads,
                sliding_window=128,
                compress_ratios=[0, 1, 2, 0],
            )
        ),
        cache_config=SimpleNamespace(
            cache_dtype=cache_dtype,
            block_size=block_size,
            user_specified_block_size=user_block,
        ),
        speculative_config=(
            SimpleNamespace(num_speculative_tokens=spec_tokens) if spec_tokens else None
        ),
        attention_config=SimpleNamespace(use_non_causal=spec_tokens is not None),
        kernel_config=SimpleNamespace(enable_jit_warmup=False),
    )
