# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Compile the Triton DSV4 sparse-MLA kernel's default tiles for one GPU
family without a GPU and report what decides their speed: registers, stack
(spills), shared memory and, inside the main loop, local-memory traffic and
the MMA instructions.

    python benchmarks/kernels/inspect_dsv41_sparse_mla.py [--capability 90] [--bf16] \
        [--split] [--kernel variant.py]

Uses the installed Triton's ptxas and cuobjdump.
"""

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.kernels.attention.dsv41_offline_compile import (  # noqa: E402
    SHARED_BYTES_PER_BLOCK,
    compile_tile,
    load_kernel_module,
)


def _cuobjdump(flag: str, cubin: str) -> str:
    tool = os.path.join(
        os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump"
    )
    return subprocess.run(
        [tool, flag, cubin], capture_output=True, text=True, check=True
    ).stdout


def _loop_profile(sass: str) -> collections.Counter:
    """Opcode counts inside the longest backward branch (the chunk loop)."""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    loops = []
    for addr, text in ins:
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            loops.append((int(m.group(1), 16), addr))
    if not loops:
        return collections.Counter()
    lo, hi = max(loops, key=lambda r: r[1] - r[0])
    ops = collections.Counter()
    for addr, text in ins:
        if lo <= addr <= hi:
            words = text.split()
            ops[words[1] if words[0].startswith("@") else words[0]] += 1
    return ops


def inspect(kmod, capability: int, tile: tuple, packed: bool, split: bool) -> str:
    compiled = compile_tile(kmod, capability, tile, packed, split)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        res, sass = (_cuobjdump(flag, f.name) for flag in ("-res-usage", "-sass"))
    regs, stack = re.search(r"REG:(\d+) STACK:(\d+)", res).groups()
    ops = _loop_profile(sass)
    local = sum(n for op, n in ops.items() if op.startswith(("LDL", "STL")))
    mma = ", ".join(f"{n}x {op}" for op, n in sorted(ops.items()) if "MMA" in op)
    block_h, num_warps, block_n, dv_splits = tile[:4]
    cap = f" r{tile[4]}" if len(tile) > 4 and tile[4] else ""
    return (
        f"| bh{block_h} w{num_warps} bn{block_n} dv/{dv_splits}{cap} "
        f"| {'split' if split else 'whole'} | {regs} | {stack} "
        f"| {compiled.metadata.shared} | {local} | {sum(ops.values())} | {mma} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--capability",
        type=int,
        default=90,
        choices=sorted(SHARED_BYTES_PER_BLOCK),
        help="GPU family, as SM major * 10 + minor",
    )
    ap.add_argument("--bf16", action="store_true", help="BF16 pools, not FP8")
    ap.add_argument("--split", action="store_true", help="the split-K variant")
    ap.add_argument("--kernel", default=None, help="a copy of the kernel module")
    args = ap.parse_args()
    packed = not args.bf16
    limit = SHARED_BYTES_PER_BLOCK[args.capability]
    print(
        f"Triton {triton.__version__}, SM{args.capability} ({limit} B of shared "
        f"memory per block), {'FP8' if packed else 'BF16'} pools"
    )
    print(
        "| tile | variant | registers | stack (B) | shared (B) "
        "| local ld/st per chunk | instructions per chunk | MMA per chunk |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---|")
    kmod = load_kernel_module(args.kernel)
    # The launcher's default tiles for this GPU, from its own choice.
    tiles = {
        kmod._default_tile(tokens, heads, packed, limit)
        for tokens in (1, 128)
        for heads in (16, 32, 64, 128)
    }
    for tile in sorted(tiles, key=lambda t: tuple(v or 0 for v in t)):
        print(inspect(kmod, args.capability, tile, packed, args.split), flush=True)


if __name__ == "__main__":
    main()
