# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Tune the Triton DSV4.1 sparse-MLA kernel's launch configurations: time
tiles and candidate splits around the launcher's defaults at chosen points,
with benchmark_dsv41_sparse_mla.py's inputs, timing and float64 check, on
the installed kernel or on a copy of its module (a variant).

    python benchmarks/kernels/tune_dsv41_sparse_mla.py --out sweep.json \
        [--points 128x16,256x64] [--kernel variant.py]

With ``--variants``, each ``--kernel`` copy runs its own launcher's default
plan beside the installed module's and vLLM's FlashMLA, on the same inputs
in the same process, several rounds in turn so that a drift of the card
shows as spread rather than as a difference between variants:

    python benchmarks/kernels/tune_dsv41_sparse_mla.py --out variants.json \
        --variants --kernel a.py --kernel b.py --points 128x8,256x128
"""

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import benchmark_dsv41_sparse_mla as bench  # noqa: E402

from tests.kernels.attention.dsv41_offline_compile import (  # noqa: E402
    load_kernel_module,
)

CMP_CAP, SWA_CAP = bench.CMP_CAP, bench.SWA_CAP


# (tokens, heads) points where launch configs are swept and variants compared.
TUNED_POINTS = (
    (8, 16),
    (32, 16),
    (128, 16),
    (256, 16),
    (1, 128),
    (4, 128),
    (8, 128),
    (8, 64),
    (32, 64),
    (32, 128),
    (128, 64),
    (256, 64),
    (128, 128),
    (256, 128),
)


def _sweep_configs(tokens: int, heads: int) -> list[dict]:
    """Launch configurations to time at one point: (block_h, num_warps,
    block_n, dv_splits[, max_regs]) tiles that compile for sm_90 with no or
    few register spills, times candidate splits around the launcher's
    default."""
    if heads <= 16:
        # The 4-warp tile, and register caps (fifth field) that fit three
        # (168 a thread) or four (128) programs on a multiprocessor.
        tiles = [
            (16, 4, 32, 1),
            (16, 4, 16, 1, 168),
            (16, 4, 32, 1, 168),
            (16, 4, 16, 1, 128),
        ]
        # A 4-warp program leaves most of an SM idle: cut the candidates
        # even when the tokens alone fill the machine.
        splits = {
            1: (10, 20),
            8: (8, 16),
            16: (4, 8, 10),
            32: (4, 8),
            64: (2, 3, 4, 5),
            128: (1, 2, 3, 4, 5),
            256: (1, 2),
        }
    elif heads <= 32:
        tiles = [(32, 8, 32, 1), (32, 8, 64, 1), (16, 4, 32, 1), (16, 8, 32, 1)]
        splits = {1: (10, 20), 8: (4, 8, 16), 32: (2, 4, 8), 128: (1, 2), 256: (1,)}
    elif tokens < 32:
        # Few tokens: narrower head blocks give more programs to spread each
        # token's candidates over (every block re-reads the rows, from L2).
        tiles = [(64, 8, 32, 1), (32, 8, 32, 1), (16, 4, 32, 1), (16, 4, 16, 1)]
        if heads > 64:
            tiles.append((64, 8, 64, 1))
        splits = {
            1: (10, 20, 40),
            2: (5, 10, 20),
            4: (4, 8, 20),
            8: (2, 4, 8),
            16: (2, 4, 8),
        }
    elif heads <= 64:
        # 16 warps: half the per-thread dequantisation and twice the warps
        # to hide latency, at 128 registers per thread.
        tiles = [(64, 8, 32, 1), (64, 8, 64, 1), (64, 16, 32, 1), (64, 16, 64, 1)]
        splits = {32: (2, 4)}
    else:
        tiles = [
            (128, 8, 32, 2),
            (64, 8, 64, 1),
            (64, 16, 32, 1),
            (64, 16, 64, 1),
            (128, 16, 32, 2),
        ]
        splits = {32: (2, 4)}
    chunks = -(-SWA_CAP // 32) - (-CMP_CAP // 32)
    configs = {
        (tile, min(sp, chunks * 32 // tile[2]))
        for tile in tiles
        for sp in splits.get(tokens, (1,))
    }
    return [
        dict(tile=tile, num_splits=sp)
        for tile, sp in sorted(configs, key=lambda c: (str(c[0]), c[1]))
    ]


def sweep(points: list[tuple[int, int]]) -> list[dict]:
    """Time launch configurations (no torch baseline)."""
    rows = []
    for tokens, heads in points:
        for cfg in _sweep_configs(tokens, heads):
            try:
                r = bench.point(tokens, heads, "sweep", rep_ms=40, **cfg)
            except Exception as e:  # resource limits of a config
                print(f"  {tokens} {heads} {cfg}: {type(e).__name__} {str(e)[:80]}")
                continue
            rows.append(r)
            print(
                f"  T={tokens:4d} H={heads:3d} {r['config']} "
                f"{r['time_us']:8.1f} us {r['pct_of_floor']:5.1f}% "
                f"err {r['rel_err_f64']:.1e}"
            )
    return rows


def variants(points: list[tuple[int, int]], paths: list[str], rounds: int) -> list:
    """Each module's default plan and FlashMLA at each point, ``rounds``
    times in turn; every time with its float64 error."""
    modules = [("installed", bench.K)]
    modules += [(path, load_kernel_module(path)) for path in paths]
    peer = bench._load_peer()[0]
    rows = []
    for tokens, heads in points:
        x = bench.make_inputs(tokens, heads)
        ref = bench.reference_f64(x)
        runs = [(name, lambda m=m, x=x: _run_module(m, x)) for name, m in modules]
        if peer is not None:
            runs.append(("flashmla", peer.prepare(x)))
        errs = {name: bench.rel_err(fn(), ref) for name, fn in runs}
        times: dict[str, list[float]] = {name: [] for name, _ in runs}
        for _ in range(rounds):
            for name, fn in runs:
                times[name].append(bench.bench(fn, 40) * 1e3)
        for name, _ in runs:
            t = sorted(times[name])
            rows.append(
                dict(tokens=tokens, heads=heads, kernel=name, rel_err_f64=errs[name],
                     time_us=t[len(t) // 2], rounds_us=times[name])
            )  # fmt: skip
            print(
                f"  T={tokens:4d} H={heads:3d} {os.path.basename(name):>14} "
                f"{t[len(t) // 2]:8.1f} us (spread {t[-1] - t[0]:.1f}) "
                f"err {errs[name]:.1e}",
                flush=True,
            )
        x.clear()
    return rows


def _run_module(module, x):
    bench.K = module
    return bench.run_triton(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the sweep's JSON")
    ap.add_argument("--points", default=None, help="TOKENSxHEADS,... to sweep")
    ap.add_argument(
        "--kernel", action="append", default=[], help="a copy of the kernel module"
    )
    ap.add_argument(
        "--variants", action="store_true", help="compare default plans, see above"
    )
    ap.add_argument("--rounds", type=int, default=3, help="with --variants")
    args = ap.parse_args()
    points = bench._parse_points(args.points) if args.points else list(TUNED_POINTS)
    if args.variants:
        rows = variants(points, args.kernel, args.rounds)
        with open(args.out, "w") as f:
            json.dump(dict(variants=rows), f, indent=1)
        return
    if args.kernel:
        # The benchmark runs whatever module its K names.
        bench.K = load_kernel_module(args.kernel[-1])
    with open(args.out, "w") as f:
        json.dump(dict(kernel=bench.K.__name__, sweep=sweep(points)), f, indent=1)


if __name__ == "__main__":
    main()
