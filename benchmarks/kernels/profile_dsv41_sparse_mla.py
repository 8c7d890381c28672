# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""One call of each kernel per point, on the benchmark's inputs, for Nsight
Compute to profile (no timing here: ncu replays each kernel itself).

    ncu --csv --page details --clock-control none [--section ...] \\
        --kernel-name regex:'_sparse_mla_fwd_kernel|flash' \\
        python benchmarks/kernels/profile_dsv41_sparse_mla.py \\
        --points 128x8,128x64,256x128 [--kernel OLD.py ...] [--flashmla]

Each ``--kernel`` copy of the kernel module runs after the installed one, in
the order given; the launch order is printed so that ncu's rows can be
matched to it.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchmark_dsv41_sparse_mla as bench  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", default="128x8,128x64,256x128")
    ap.add_argument("--kernel", action="append", default=[], help="a module copy")
    ap.add_argument("--flashmla", action="store_true", help="profile FlashMLA too")
    args = ap.parse_args()
    modules = [("installed", bench.kernel_module)]
    modules += [(path, bench._load_kernel(path)) for path in args.kernel]
    peer = bench._load_peer()[0] if args.flashmla else None
    for tokens, heads in bench._parse_points(args.points):
        x = bench.make_inputs(tokens, heads)
        ref = bench.reference_f64(x)
        for name, module in modules:
            bench.K = module
            x["out"].fill_(float("nan"))
            err = bench.rel_err(bench.run_triton(x), ref)
            torch.cuda.synchronize()
            print(f"{tokens}x{heads} {name}: err {err:.1e}", flush=True)
        if peer is not None:
            run_peer = peer.prepare(x)
            err = bench.rel_err(run_peer(), ref)
            torch.cuda.synchronize()
            print(f"{tokens}x{heads} FlashMLA: err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
