# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Build FlashMLA's SM90 sparse FP8 decode (DeepSeek V4 "MODEL1" records) as a
benchmark peer, and run it on the benchmark's pools.

FlashMLA is never committed here. Its sources sit in a git-ignored folder
(``.peers/src`` by default) holding, from github.com/deepseek-ai/FlashMLA,
``csrc/{params.h,utils.h,defines.h}``, ``csrc/kerutils/``,
``csrc/sm90/helpers.h``, ``csrc/sm90/decode/sparse_fp8/`` and
``csrc/smxx/decode/`` (scheduler and combine), and its CUTLASS submodule's
``include/`` and ``tools/util/include/`` under ``csrc/cutlass/`` at the commit
FlashMLA pins. Only the two MODEL1 instantiations (64 and 128 heads), the
scheduler and the combine kernel are compiled, for sm_90a, with this
directory's own binding (``flashmla_peer_binding.cpp``).

    python benchmarks/kernels/build_flashmla_peer.py --src .peers/src

builds (16 parallel jobs) and prints where the module landed.
"""

import argparse
import os
import time
from pathlib import Path

import torch

_SOURCES = (
    "csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu",
    "csrc/smxx/decode/combine/combine.cu",
    "csrc/sm90/decode/sparse_fp8/instantiations/model1_persistent_h64.cu",
    "csrc/sm90/decode/sparse_fp8/instantiations/model1_persistent_h128.cu",
)
_INCLUDES = (
    "csrc",
    "csrc/kerutils/include",
    "csrc/sm90",
    "csrc/cutlass/include",
    "csrc/cutlass/tools/util/include",
)
# The flags FlashMLA's own build uses for these kernels.
_NVCC_FLAGS = [
    "-O3",
    "-std=c++20",
    "-DNDEBUG",
    "-D_USE_MATH_DEFINES",
    "-Wno-deprecated-declarations",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "--use_fast_math",
    "-gencode=arch=compute_90a,code=sm_90a",
]


def build(src: str, build_dir: str | None = None, verbose: bool = False):
    """Compile and import the peer module (cached in ``build_dir``)."""
    from torch.utils.cpp_extension import load

    root = Path(src).resolve()
    missing = [s for s in _SOURCES if not (root / s).is_file()]
    if missing:
        raise FileNotFoundError(f"FlashMLA sources missing under {root}: {missing}")
    os.environ.setdefault("MAX_JOBS", "16")
    # Only sm_90a: torch's default arch list would add plain sm_90 passes,
    # which reject wgmma.
    os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"
    build_dir = build_dir or str(root.parent / "build")
    os.makedirs(build_dir, exist_ok=True)
    binding = Path(__file__).resolve().parent / "flashmla_peer_binding.cpp"
    return load(
        name="flashmla_peer",
        sources=[str(binding)] + [str(root / s) for s in _SOURCES],
        extra_include_paths=[str(root / i) for i in _INCLUDES],
        extra_cflags=["-O3", "-std=c++20", "-DNDEBUG"],
        extra_cuda_cflags=_NVCC_FLAGS,
        build_directory=build_dir,
        verbose=verbose,
    )


class FlashMLAPeer:
    """FlashMLA's decode on the benchmark's inputs: each query token is its
    own batch entry (s_q = 1) with its own top-k lengths; the SWA pool is
    FlashMLA's main cache and the compressed pool its extra cache. FlashMLA
    takes 64 or 128 heads only, so fewer heads run padded to 64 (zero
    queries, -inf sinks), as they would in a serving stack; the padding is
    made once, outside the timed region."""

    def __init__(self, module) -> None:
        self.mod = module

    def prepare(self, x: dict):
        """Plan (FlashMLA's get_mla_metadata step) and allocate once; return
        the per-step call, which is what gets timed, and its output view."""
        q = x["query"]
        tokens, heads, dim = q.shape
        padded = 64 if heads <= 64 else 128
        qp = torch.zeros(tokens, 1, padded, dim, dtype=q.dtype, device=q.device)
        qp[:, 0, :heads] = q
        sinks = torch.full((padded,), float("-inf"), device=q.device)
        sinks[:heads] = x["sinks"]
        meta, splits = self.mod.plan(
            x["swa_lens"],
            x["cmp_lens"],
            padded,
            x["swa_idx"].shape[-1],
            x["cmp_idx"].shape[-1],
        )
        parts = meta.shape[0]
        out = torch.empty_like(qp)
        lse = torch.empty(tokens, 1, padded, device=q.device)
        o_acc = torch.empty(tokens + parts, 1, padded, dim, device=q.device)
        lse_acc = torch.empty(tokens + parts, 1, padded, device=q.device)
        swa = x["swa"].view(torch.uint8)
        cmp = x["cmp"].view(torch.uint8)

        def run() -> torch.Tensor:
            self.mod.decode(
                qp,
                swa,
                x["swa_idx"],
                x["swa_lens"],
                sinks,
                cmp,
                x["cmp_idx"],
                x["cmp_lens"],
                meta,
                splits,
                out,
                lse,
                o_acc,
                lse_acc,
                x["scale"],
            )
            return out[:, 0, :heads]

        return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=".peers/src")
    ap.add_argument("--build-dir", default=None)
    args = ap.parse_args()
    t0 = time.time()
    mod = build(args.src, args.build_dir, verbose=True)
    print(f"built {mod.__file__} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
