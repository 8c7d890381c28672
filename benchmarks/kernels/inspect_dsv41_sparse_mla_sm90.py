# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Compile the Triton DSV4 sparse-MLA kernel for sm_90a without a GPU and
report what decides its speed: registers, stack (spills), and, inside the
main loop, local-memory traffic and the wgmma shapes.

    python benchmarks/kernels/inspect_dsv41_sparse_mla_sm90.py [--bf16]

Uses the installed Triton's ptxas and cuobjdump. Integer arguments that the
launcher's specialisation sees as multiples of 16 (pointers, strides, page
sizes) are marked so here too: without that hint every gather compiles to
byte loads and the spill counts mean nothing.
"""

import argparse
import collections
import importlib
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import vllm.triton_utils

# Without a GPU driver vLLM hands out a placeholder Triton whose jit does
# nothing; compiling for another machine only needs the real one.
vllm.triton_utils.triton = triton
vllm.triton_utils.tl = triton.language
kmod = importlib.import_module("vllm.v1.attention.ops.triton_dsv41_sparse_mla")

DIV16_INTS = {
    "q_stride_t",
    "q_stride_h",
    "out_stride_t",
    "out_stride_h",
    "swa_page_size",
    "swa_page_stride",
    "swa_token_stride",
    "swa_idx_stride_t",
    "swa_cap",
    "cmp_page_size",
    "cmp_page_stride",
    "cmp_token_stride",
    "cmp_idx_stride_t",
    "cmp_cap",
}


def _signature(fn, packed: bool, consts: dict) -> tuple[dict, dict]:
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
            continue
        if name in ("q_ptr", "out_ptr"):
            sig[name] = "*bf16"
        elif name in ("part_out_ptr", "part_lse_ptr", "sinks_ptr"):
            sig[name] = "*fp32"
        elif name.endswith("_pool_ptr"):
            sig[name] = "*u8" if packed else "*bf16"
        elif name.endswith("_ptr"):
            sig[name] = "*i32"
        else:
            sig[name] = "fp32" if name == "qk_scale" else "i32"
        if sig[name].startswith("*") or name in DIV16_INTS:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


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
        m = re.search(r"BRA (0x[0-9a-f]+)", text)
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


def inspect(tile: tuple[int, int, int, int], packed: bool, split: bool) -> str:
    block_h, num_warps, block_n, dv_splits = tile
    fn = kmod._sparse_mla_fwd_kernel
    consts = dict(
        SWA_FP8=packed,
        HAS_CMP=True,
        CMP_FP8=packed,
        HAS_SINKS=True,
        SPLIT=split,
        BLOCK_H=block_h,
        BLOCK_N=block_n,
        DV_SPLITS=dv_splits,
        # Triton specialises integer arguments equal to 1 as constants.
        swa_idx_stride_k=1,
        cmp_idx_stride_k=1,
    )
    sig, attrs = _signature(fn, packed, consts)
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    compiled = triton.compile(
        src,
        target=GPUTarget("cuda", 90, 64),
        options={"num_warps": num_warps, "num_stages": 1},
    )
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        res, sass = (_cuobjdump(flag, f.name) for flag in ("-res-usage", "-sass"))
    regs, stack = re.search(r"REG:(\d+) STACK:(\d+)", res).groups()
    ops = _loop_profile(sass)
    local = sum(n for op, n in ops.items() if op.startswith(("LDL", "STL")))
    wgmma = ", ".join(
        f"{n}x {op.split('.')[1]}" for op, n in sorted(ops.items()) if "HGMMA" in op
    )
    return (
        f"| bh{block_h} w{num_warps} bn{block_n} dv/{dv_splits} "
        f"| {'split' if split else 'whole'} | {regs} | {stack} | {local} "
        f"| {sum(ops.values())} | {wgmma} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bf16", action="store_true", help="BF16 pools, not FP8")
    ap.add_argument("--split", action="store_true", help="the split-K variant")
    args = ap.parse_args()
    print(f"Triton {triton.__version__}, sm_90a, {'BF16' if args.bf16 else 'FP8'}")
    print(
        "| tile | variant | registers | stack (B) | local ld/st per chunk "
        "| instructions per chunk | wgmma per chunk |"
    )
    print("|---|---|---:|---:|---:|---:|---|")
    packed = not args.bf16
    # The launcher's default tiles, from its own choice over the shapes.
    tiles = {
        kmod._default_tile(tokens, heads, packed)
        for tokens in (1, 128)
        for heads in (16, 32, 64, 128)
    }
    for tile in sorted(tiles):
        print(inspect(tile, packed, args.split), flush=True)


if __name__ == "__main__":
    main()
