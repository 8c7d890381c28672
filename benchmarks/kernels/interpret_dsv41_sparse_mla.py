# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Check the Triton DSV4.1 sparse-MLA op, or a copy of its module (a
variant), against the float64 reference of its GPU test file on a machine
without a GPU, in Triton's interpreter: a variant's numbers before it takes
GPU time.

    python benchmarks/kernels/interpret_dsv41_sparse_mla.py [--kernel COPY.py]

Exits 1 when a case misses the test file's tolerance. Triton 3.8's
interpreter stores BF16 as uint16 and does integer arithmetic on it, so this
script computes the interpreter's BF16 operations (the kernel's products and
dots) in float32 and rounds them back to BF16, as the GPU does. Minutes per
case: the interpreter runs each program in Python.
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tests.kernels.attention.test_triton_dsv41_sparse_mla as gpu_tests  # noqa: E402
from tests.kernels.attention.dsv41_offline_compile import (  # noqa: E402
    SHARED_BYTES_PER_BLOCK,
    load_kernel_module,
)


def _to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def _to_bf16_bits(x: np.ndarray) -> np.ndarray:
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def _bf16_as_float32() -> None:
    builder = interpreter.InterpreterBuilder
    binary_op, create_dot = builder.binary_op, builder.create_dot

    def bf16_binary_op(self, lhs, rhs, op):
        if lhs.dtype.scalar != tl.bfloat16:
            return binary_op(self, lhs, rhs, op)
        out = op(_to_f32(lhs.data), _to_f32(rhs.data))
        if out.dtype == np.bool_:  # a comparison
            return interpreter.TensorHandle(out, tl.int1)
        return interpreter.TensorHandle(_to_bf16_bits(out), tl.bfloat16)

    def bf16_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16:
            a = interpreter.TensorHandle(_to_f32(a.data), tl.float32)
            b = interpreter.TensorHandle(_to_f32(b.data), tl.float32)
        return create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    builder.binary_op = bf16_binary_op
    builder.create_dot = bf16_dot


def _error(t, tokens: int, heads: int, record: str, tile=None, **case) -> float:
    """The largest relative error of a 64-column block of one case of the
    GPU test file (inf for NaN)."""
    scale = case.pop("scale", t.SM_SCALE)
    q, segments, sinks = t.make_case(tokens, heads, record, True, True, **case)
    out = t.run_kernel(q, segments, sinks, scale, tile=tile)
    if torch.isnan(out).any():
        return float("inf")
    ref = t.reference(q, segments, scale, sinks)
    # Each 64-column block at its own magnitude (the scale-range case's
    # blocks differ by up to 2 ** 80).
    return max(
        t.rel_err(out[..., c : c + 64], ref[..., c : c + 64]) for c in range(0, 512, 64)
    )


# (name, make_case arguments): the GPU test file's cases that reach every
# dequantisation path and the 64-row tile.
CASES = [
    ("fp8", dict(tokens=3, heads=16, record="fp8", seed=1)),
    ("bf16", dict(tokens=3, heads=16, record="bf16", seed=2)),
    (
        "scale bytes 2^-40..2^40",
        dict(tokens=5, heads=16, record="fp8", seed=43, scale=2.0**-44,
             block_exponents=gpu_tests.WIDE_EXPONENTS),
    ),
    (
        "fp8 + bf16 pools",
        dict(tokens=3, heads=64, record="fp8", seed=3, cmp_record="bf16"),
    ),
    (
        "64-row tile",
        dict(tokens=3, heads=128, record="fp8", seed=4, tile=(64, 8, 64, 1)),
    ),
]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", default=None, help="a copy of the kernel module")
    args = ap.parse_args()
    _bf16_as_float32()
    module = load_kernel_module(args.kernel)
    # What the launcher asks of the GPU it runs on: an H100's figures.
    module.get_max_shared_memory_bytes = lambda index: SHARED_BYTES_PER_BLOCK[90]
    module.num_compute_units = lambda index: 132
    gpu_tests.kernels = module
    gpu_tests.triton_sparse_mla_dsv41 = module.triton_sparse_mla_dsv41
    missed = 0
    for name, case in CASES:
        start = time.monotonic()
        err = _error(gpu_tests, **case)
        missed += not err < gpu_tests.RTOL
        print(
            f"{name}: relative error {err:.1e} (tolerance {gpu_tests.RTOL:.0e}, "
            f"{time.monotonic() - start:.0f} s)",
            flush=True,
        )
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
