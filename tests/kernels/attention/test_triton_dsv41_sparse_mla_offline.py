# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""What the compiler makes of the Triton sparse-MLA launcher's tiles,
compiled without a GPU for each family the kernel runs on (the real compiler
is the reference).

Shared memory: a tile whose shared memory exceeds the GPU's per-block limit
compiles, then fails when Triton loads it, at the first request. The tiles
tuned on the H200 need up to 176 KB; L40S, the RTX 50xx/PRO 6000 and GB10
give a block 99 KB. Each default tile's shared memory is checked against its
family's published limit and against the launcher's own estimate, which must
stay an upper bound.

Layout: the score tile of a 64-head block must be split between the two
warpgroups, not computed whole by each.
"""

import functools
import itertools
import re

import pytest

triton = pytest.importorskip("triton")

from tests.kernels.attention.dsv41_offline_compile import (  # noqa: E402
    SHARED_BYTES_PER_BLOCK,
    compile_tile,
    load_kernel_module,
)

# Head counts of DeepSeek V4.1 under tensor parallelism (128 / TP), plus
# counts that are not powers of two; token counts from decode to prefill.
HEADS = (1, 8, 16, 24, 32, 48, 64, 96, 128)
TOKENS = (1, 8, 32, 128, 4096)


@functools.cache
def kernel_module():
    return load_kernel_module()


@functools.cache
def compiled(capability: int, tile: tuple, packed: bool, split: bool = False):
    return compile_tile(kernel_module(), capability, tile, packed, split)


def compiled_shared_bytes(
    capability: int, tile: tuple, packed: bool, split: bool = False
) -> int:
    return compiled(capability, tile, packed, split).metadata.shared


def default_tiles(capability: int, packed: bool) -> set[tuple]:
    limit = SHARED_BYTES_PER_BLOCK[capability]
    return {
        kernel_module()._default_tile(tokens, heads, packed, limit)
        for tokens, heads in itertools.product(TOKENS, HEADS)
    }


@pytest.mark.parametrize("packed", [True, False], ids=["fp8_ds_mla", "bf16"])
@pytest.mark.parametrize("capability", sorted(SHARED_BYTES_PER_BLOCK))
def test_default_tiles_fit_the_gpu(capability, packed):
    limit = SHARED_BYTES_PER_BLOCK[capability]
    for tile in sorted(default_tiles(capability, packed)):
        block_h, _, block_n = tile[:3]
        used = compiled_shared_bytes(capability, tile, packed)
        assert used <= limit, (capability, tile, used)
        estimate = kernel_module()._tile_shared_bytes(block_h, block_n)
        assert used <= estimate, (capability, tile, used, estimate)
        # Decode with few tokens runs the variant that writes partial results
        # for the merge kernel. On SM90 the compiler lays its float32 store
        # out through shared memory (128 KB for a 64-head block, within
        # 227 KB); the 99 KB GPUs must not do the same.
        if limit < 128 * 1024:
            used = compiled_shared_bytes(capability, tile, packed, split=True)
            assert used <= limit, (capability, tile, "split", used)


def test_tuned_tiles_that_would_not_fit_are_replaced():
    """The 99 KB GPUs get other tiles than the H200 for wide head blocks, and
    the H200's tile for them really would not fit there."""
    kernels = kernel_module()
    small = SHARED_BYTES_PER_BLOCK[120]
    big = SHARED_BYTES_PER_BLOCK[90]
    for tokens, heads in ((128, 128), (8, 64)):
        tuned = kernels._default_tile(tokens, heads, True, big)
        assert compiled_shared_bytes(120, tuned, True) > small
        chosen = kernels._default_tile(tokens, heads, True, small)
        assert chosen != tuned
        assert compiled_shared_bytes(120, chosen, True) <= small


def test_a_gpu_too_small_for_any_tile_is_refused():
    kernels = kernel_module()
    with pytest.raises(ValueError, match="shared memory per program"):
        kernels._default_tile(1, 16, True, 48 * 1024)


def _dot_warps(ttgir: str) -> list[tuple[str, list[int]]]:
    """(result type, warpsPerCTA of its MMA layout) of each Hopper dot."""
    layouts = {
        name: [int(w) for w in warps.split(",")]
        for name, warps in re.findall(
            r"^(#mma\d*) = #ttg\.nvidia_mma<\{[^}]*warpsPerCTA = \[([\d, ]+)\]",
            ttgir,
            re.M,
        )
    }
    return [
        (shape, layouts[layout])
        for shape, layout in re.findall(
            r"ttng\.warp_group_dot .*-> tensor<(\d+x\d+)xf32, (#mma\d*)>", ttgir
        )
    ]


@pytest.mark.parametrize("packed", [True, False], ids=["fp8_ds_mla", "bf16"])
def test_64_head_scores_are_split_between_warpgroups(packed):
    """Triton gives a dot that feeds another dot all its warps along M, so a
    64-row score tile would be computed whole by both warpgroups of the
    8-warp tile; the kernel hides that edge, and each computes half."""
    tile = kernel_module()._default_tile(128, 64, packed, SHARED_BYTES_PER_BLOCK[90])
    block_h, num_warps, block_n = tile[:3]
    assert (block_h, num_warps) == (64, 8)
    dots = dict(_dot_warps(compiled(90, tile, packed).asm["ttgir"]))
    # The score tile [heads, candidates] and the output tile [heads, 512].
    assert dots[f"{block_h}x{block_n}"] == [4, 2]
    assert dots[f"{block_h}x512"] == [4, 2]
