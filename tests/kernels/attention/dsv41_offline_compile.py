# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Compile the Triton DSV4.1 sparse-MLA kernel for any NVIDIA GPU family on a
machine without one, with the installed Triton and its bundled ptxas.

The resource report in ``benchmarks/kernels`` and the shared-memory tests use
it to see what the launcher's tiles cost on GPUs this machine does not have.
"""

import importlib.util
import sys
from types import ModuleType

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, CompiledKernel

import vllm.triton_utils

KERNEL_MODULE = "vllm.v1.attention.ops.triton_dsv41_sparse_mla"

# The most shared memory one thread block may opt into, per GPU family the
# Triton kernel runs on (CUDA C++ Programming Guide, "Technical Specifications
# per Compute Capability"): L40S; H100/H200; Thor; RTX 50xx/PRO 6000; GB10.
SHARED_BYTES_PER_BLOCK = {
    89: 99 * 1024,
    90: 227 * 1024,
    110: 227 * 1024,
    120: 99 * 1024,
    121: 99 * 1024,
}

# Integer arguments that the launcher's specialisation sees as multiples of 16
# (pointers, strides, page sizes) are marked so here too: without that hint
# every gather compiles to byte loads and the resources mean nothing.
_DIV16_INTS = {
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


def load_kernel_module(path: str | None = None) -> ModuleType:
    """A private copy of the kernel module (or of the kernel source at
    ``path``, a variant) bound to the real Triton.

    Without a GPU driver vLLM hands out a placeholder Triton whose ``jit``
    keeps nothing to compile; the copy leaves the imported module as it is.
    """
    if path is None:
        spec = importlib.util.find_spec(KERNEL_MODULE)
        assert spec is not None and spec.origin is not None
        path, name = spec.origin, KERNEL_MODULE + "_offline"
    else:
        name = "dsv41_kernel_variant"
    copy_spec = importlib.util.spec_from_file_location(name, path)
    assert copy_spec is not None and copy_spec.loader is not None
    module = importlib.util.module_from_spec(copy_spec)
    saved = vllm.triton_utils.triton, vllm.triton_utils.tl
    vllm.triton_utils.triton, vllm.triton_utils.tl = triton, triton.language
    try:
        sys.modules[copy_spec.name] = module
        copy_spec.loader.exec_module(module)
    finally:
        vllm.triton_utils.triton, vllm.triton_utils.tl = saved
    return module


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
        if sig[name].startswith("*") or name in _DIV16_INTS:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def compile_tile(
    kernel_module: ModuleType,
    capability: int,
    tile: tuple,
    packed: bool,
    split: bool = False,
) -> CompiledKernel:
    """The forward kernel of ``tile`` (the module's ``_Tile``, or a tuple
    block_h, num_warps, block_n, dv_splits[, max_regs]) compiled for SM
    ``capability`` (90, 120, ...), both segments present, with FP8
    (``packed``) or BF16 pools."""
    block_h, num_warps, block_n, dv_splits = tile[:4]
    max_regs = tile[4] if len(tile) > 4 else None
    fn = kernel_module._sparse_mla_fwd_kernel
    consts = dict(
        SWA_REC=1 if packed else 0,
        CMP_REC=1 if packed else 0,
        HAS_CMP=True,
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
    options = {"num_warps": num_warps, "num_stages": 1}
    if max_regs is not None:
        options["maxnreg"] = max_regs
    return triton.compile(
        src, target=GPUTarget("cuda", capability, 32), options=options
    )
