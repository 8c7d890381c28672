# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Host cost of the Triton DSV4.1 sparse-MLA launcher: the Python a layer
call spends before its kernel launches, with the two kernels replaced by
no-ops, so the figure is the launcher's own and not Triton's launch path.

Eager steps (prefill, and decode outside CUDA graphs) pay it once per
layer. Each shape is timed over repeated calls with the same tensors, as the
layers of one step call it; the first (planning) call is reported apart.
``--baseline PATH`` times another copy of the kernel module (the launcher
before a change, say) in the same run, for a ratio.

    python benchmarks/kernels/benchmark_dsv41_sparse_mla_launcher.py \\
        [--device cpu|cuda] [--workspace-manager] [--baseline OLD.py] \\
        [--out results.json]

``--workspace-manager`` runs the calls inside vLLM's workspace manager, as a
worker does, so the lookup of the partial-result buffer is timed too.

No GPU is needed: on the CPU the device queries are answered with an H200's
figures.
"""

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.kernels.attention.dsv41_offline_compile import (  # noqa: E402
    load_kernel_module,
)

TOKENS = (1, 8, 256, 4096)
HEADS = (8, 16, 32, 64, 128)
RECORD = 584
TARGET_US = 10.0


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _module(path: str | None, device: str):
    module = load_kernel_module(path)
    module._sparse_mla_fwd_kernel = _NoLaunch()
    module._sparse_mla_combine_kernel = _NoLaunch()
    if device == "cpu":
        # Older copies (--baseline) name the device queries differently.
        module.num_compute_units = module._num_sms = lambda index: 132
        module.get_max_shared_memory_bytes = module._max_shared_bytes = lambda index: (
            227 * 1024
        )
    return module


def _pool(pages: int, device: str) -> torch.Tensor:
    page = 64 * RECORD
    flat = torch.zeros(pages, page, dtype=torch.uint8, device=device)
    return flat.as_strided((pages, 64, 1, RECORD), (page, RECORD, RECORD, 1))


def _args(tokens: int, heads: int, device: str) -> tuple:
    """The positional arguments of one layer call (both segments, sinks)."""
    query = torch.zeros(tokens, heads, 512, dtype=torch.bfloat16, device=device)
    lens = torch.ones(tokens, dtype=torch.int32, device=device)
    return (
        query,
        _pool(8, device),
        torch.zeros(tokens, 1, 128, dtype=torch.int32, device=device),
        lens,
        torch.empty_like(query),
        512**-0.5,
        torch.zeros(heads, device=device),
        _pool(16, device),
        torch.zeros(tokens, 1, 512, dtype=torch.int32, device=device),
        lens,
    )


def _time(module, args: tuple, calls: int, repeats: int) -> tuple[float, float]:
    """(first call, median of later calls), microseconds per call."""
    launch = module.triton_sparse_mla_dsv41
    start = time.perf_counter()
    launch(*args)
    first = (time.perf_counter() - start) * 1e6
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            launch(*args)
        runs.append((time.perf_counter() - start) * 1e6 / calls)
    return first, statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--baseline", help="another copy of the kernel module to time")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", help="write the rows and versions as JSON here")
    ap.add_argument(
        "--workspace-manager",
        action="store_true",
        help="call inside vLLM's workspace manager, as a worker does",
    )
    args = ap.parse_args()
    if args.workspace_manager:
        from vllm.v1.worker.workspace import init_workspace_manager

        init_workspace_manager(torch.device(args.device))
    ours = _module(None, args.device)
    base = _module(args.baseline, args.device) if args.baseline else None
    rows = []
    for tokens in TOKENS:
        for heads in HEADS:
            call = _args(tokens, heads, args.device)
            first, per_call = _time(ours, call, args.calls, args.repeats)
            row = dict(tokens=tokens, heads=heads, first_us=first, per_call_us=per_call)
            if base is not None:
                row["baseline_us"] = _time(base, call, args.calls, args.repeats)[1]
                row["baseline_ratio"] = row["baseline_us"] / per_call
            rows.append(row)
    print(
        "| tokens | heads | per call (us) | first call (us) |"
        + (" baseline (us) | baseline / ours |" if base else "")
    )
    print("|---:|---:|---:|---:|" + ("---:|---:|" if base else ""))
    for r in rows:
        line = (
            f"| {r['tokens']} | {r['heads']} | {r['per_call_us']:.2f} "
            f"| {r['first_us']:.0f} |"
        )
        if base is not None:
            line += f" {r['baseline_us']:.2f} | {r['baseline_ratio']:.1f} |"
        print(line)
    worst = max(r["per_call_us"] for r in rows)
    print(f"worst per call: {worst:.2f} us (target <= {TARGET_US:.0f} us)")
    if args.out:
        meta = dict(
            device=args.device,
            cpu=platform.processor() or platform.machine(),
            python=platform.python_version(),
            torch=torch.__version__,
            baseline=args.baseline,
            workspace_manager=args.workspace_manager,
            command=" ".join(sys.argv),
        )
        Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    sys.exit(0 if worst <= TARGET_US else 1)


if __name__ == "__main__":
    main()
