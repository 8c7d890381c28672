# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Triton sparse MLA for DeepSeek V4 / V4.1 with the two-segment contract of
FlashInfer's ``trtllm_batch_decode_sparse_mla_dsv4`` (``backend="sparse"``),
for GPUs and shapes FlashInfer's kernels do not serve.

Packed ``fp8_ds_mla`` pages (584 bytes a token) hold ``page_size`` records of
448 FP8 E4M3 NoPE values and 64 BF16 RoPE values, then each token's 8 UE8M0
scale bytes (one per 64 NoPE dims, the last unused); consecutive pages are
``stride(0)`` bytes apart.
"""

from dataclasses import dataclass
from typing import NamedTuple

import torch

from vllm.logger import init_logger
from vllm.triton_utils import tl, triton
from vllm.utils.math_utils import RCP_LN2, cdiv, next_power_of_2
from vllm.utils.mem_utils import get_max_shared_memory_bytes
from vllm.utils.platform_utils import num_compute_units
from vllm.v1.worker.workspace import (
    current_workspace_manager,
    is_workspace_manager_initialized,
)

logger = init_logger(__name__)

_HEAD_DIM = 512
_RECORD_BYTES = 584
_VALUE_BYTES = 576  # 448 FP8 bytes + 64 BF16 RoPE values


@triton.jit
def _gather_rows(
    pool_ptr,
    slots,
    page_size,
    page_stride,
    token_stride,
    RECORD: tl.constexpr,
):
    """Issue the loads of ``BLOCK_N`` latent rows as eight raw 64-column
    pieces and, for FP8 records (RECORD 1), each row's scale bytes as one
    int64. Rows of dead slots (-1) read as zeros."""
    if RECORD != 0:
        # Packed pools arrive as uint8 or float8_e4m3fn; both are bytes here.
        pool_ptr = pool_ptr.to(tl.pointer_type(tl.uint8))
    valid = slots >= 0
    page = (slots // page_size).to(tl.int64)
    in_page = (slots % page_size).to(tl.int64)
    page_base = pool_ptr + page * page_stride
    c = tl.arange(0, 64)[None, :]
    m = valid[:, None]
    if RECORD == 1:
        # FP8 pieces as 32-bit words of four values; the RoPE block as 64-bit
        # words of four BF16 values, so all pieces share one layout.
        rec = (page_base + in_page * 576)[:, None]
        w = rec.to(tl.pointer_type(tl.uint32))
        c4 = tl.arange(0, 16)[None, :]
        r0 = tl.load(w + c4, mask=m, other=0)
        r1 = tl.load(w + (16 + c4), mask=m, other=0)
        r2 = tl.load(w + (32 + c4), mask=m, other=0)
        r3 = tl.load(w + (48 + c4), mask=m, other=0)
        r4 = tl.load(w + (64 + c4), mask=m, other=0)
        r5 = tl.load(w + (80 + c4), mask=m, other=0)
        r6 = tl.load(w + (96 + c4), mask=m, other=0)
        r7 = tl.load((rec + 448).to(tl.pointer_type(tl.uint64)) + c4, mask=m, other=0)
        sc_ptr = (page_base + page_size * 576 + in_page * 8).to(
            tl.pointer_type(tl.int64)
        )
        sc = tl.load(sc_ptr, mask=valid, other=0)
    else:
        row = (page_base + in_page * token_stride)[:, None]
        r0 = tl.load(row + c, mask=m, other=0.0)
        r1 = tl.load(row + (64 + c), mask=m, other=0.0)
        r2 = tl.load(row + (128 + c), mask=m, other=0.0)
        r3 = tl.load(row + (192 + c), mask=m, other=0.0)
        r4 = tl.load(row + (256 + c), mask=m, other=0.0)
        r5 = tl.load(row + (320 + c), mask=m, other=0.0)
        r6 = tl.load(row + (384 + c), mask=m, other=0.0)
        r7 = tl.load(row + (448 + c), mask=m, other=0.0)
        sc = slots.to(tl.int64)  # unused
    return r0, r1, r2, r3, r4, r5, r6, r7, sc


@triton.jit
def _lanes(x):
    """The low and high 16-bit halves of 32-bit words, as BF16."""
    lo = x.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    hi = (x >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return lo, hi


@triton.jit
def _quad(c0, c1, c2, c3):
    """[N, 16] tensors of columns 4k, 4k+1, 4k+2, 4k+3 -> [N, 64] in order
    (x[n, k, i, j] is column 4k + 2i + j; no permute, so no data movement)."""
    x = tl.join(tl.join(c0, c2), tl.join(c1, c3))
    return tl.reshape(x, (x.shape[0], 64))


@triton.jit
def _dequant(raw, sc, j: tl.constexpr, RECORD: tl.constexpr):
    """Piece ``j`` (columns 64j..64j+63) of a gathered tile as BF16."""
    out = raw
    if RECORD == 1 and j < 7:
        # E4M3 -> BF16 by moving bits, which avoids the slow conversion
        # instructions: the byte s.eeee.mmm placed as BF16 bits
        # s.0000eeee.mmm0000 is its value times 2 ** -120 exactly, zeros and
        # subnormals included. A word holds columns 4k..4k+3, byte 0 first.
        ev = ((raw << 8) & 0x80008000) | ((raw << 4) & 0x07F007F0)  # 4k, 4k+2
        od = (raw & 0x80008000) | ((raw >> 4) & 0x07F007F0)  # 4k+1, 4k+3
        c0, c2 = _lanes(ev)
        c1, c3 = _lanes(od)
        x = _quad(c0, c1, c2, c3)
        # The UE8M0 byte e encodes 2 ** (e - 127), so the factor is
        # 2 ** (e - 7): one exact BF16 power of two up to e = 134, two above.
        e = ((sc >> (8 * j)) & 0xFF).to(tl.int32)
        f1 = ((tl.minimum(e, 134) + 120) << 23).to(tl.float32, bitcast=True)
        f2 = ((tl.maximum(e, 134) - 7) << 23).to(tl.float32, bitcast=True)
        out = x * f2.to(tl.bfloat16)[:, None] * f1.to(tl.bfloat16)[:, None]
    elif RECORD == 1:
        # The RoPE block: 64-bit words of four BF16 values each.
        c0 = raw.to(tl.uint16).to(tl.bfloat16, bitcast=True)
        c1 = (raw >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        c2 = (raw >> 32).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        c3 = (raw >> 48).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        out = _quad(c0, c1, c2, c3)
    return out


@triton.jit
def _cat(a, b):
    """[R, W] ++ [R, W] -> [R, 2W] along columns, in registers."""
    R: tl.constexpr = a.shape[0]
    W: tl.constexpr = a.shape[1]
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), (R, 2 * W))


@triton.jit
def _kv_tiles(raw, dv_part, RECORD: tl.constexpr, DV_SPLITS: tl.constexpr):
    """The [BLOCK_N, 512] BF16 K tile of a chunk and its V tile (the same
    rows; with DV_SPLITS 2, the half of the columns ``dv_part`` picks)."""
    sc = raw[8]
    lo = _cat(
        _cat(_dequant(raw[0], sc, 0, RECORD), _dequant(raw[1], sc, 1, RECORD)),
        _cat(_dequant(raw[2], sc, 2, RECORD), _dequant(raw[3], sc, 3, RECORD)),
    )
    hi = _cat(
        _cat(_dequant(raw[4], sc, 4, RECORD), _dequant(raw[5], sc, 5, RECORD)),
        _cat(_dequant(raw[6], sc, 6, RECORD), _dequant(raw[7], sc, 7, RECORD)),
    )
    k = _cat(lo, hi)
    v = k
    if DV_SPLITS == 2:
        v = tl.where(dv_part == 0, lo, hi)
    return k, v


# A segment as the kernel walks it: (slot-id row pointer, slot-id stride,
# live length, first chunk of this program, pool pointer, page size, page
# stride, token stride).


@triton.jit
def _chunk_slots(i, n_a, n_total, seg_a, seg_b, BLOCK_N: tl.constexpr):
    """Slot ids of this program's ``i``-th chunk: chunks [0, n_a) from
    segment A, the rest from B; -1 past a row's length and past n_total."""
    in_a = i < n_a
    chunk = tl.where(in_a, seg_a[3] + i, seg_b[3] + i - n_a)
    idx_ptr = tl.where(in_a, seg_a[0], seg_b[0])
    stride = tl.where(in_a, seg_a[1], seg_b[1])
    lim = tl.where(i < n_total, tl.where(in_a, seg_a[2], seg_b[2]), 0)
    pos = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    return tl.load(idx_ptr + pos * stride, mask=pos < lim, other=-1)


@triton.jit
def _chunk_rows(i, n_a, slots, seg_a, seg_b, RECORD: tl.constexpr):
    in_a = i < n_a
    return _gather_rows(
        tl.where(in_a, seg_a[4], seg_b[4]),
        slots,
        tl.where(in_a, seg_a[5], seg_b[5]),
        tl.where(in_a, seg_a[6], seg_b[6]),
        tl.where(in_a, seg_a[7], seg_b[7]),
        RECORD,
    )


@triton.jit
def _masked_scores(s, valid, qk_scale):
    return tl.where(valid[None, :], s * qk_scale, float("-inf"))


@triton.jit
def _attend_chunks(
    acc,
    m_i,
    l_i,
    q,
    dv_part,
    n_a,
    n_total,
    seg_a,
    seg_b,
    qk_scale,
    RECORD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DV_SPLITS: tl.constexpr,
):
    """Online softmax (base 2) over ``n_total`` chunks, the first ``n_a``
    from segment A and the rest from B, in one loop so that the prefetch
    crosses the boundary. Pipelined by hand: chunk i+1's rows are gathered
    while chunk i is multiplied, and chunk i+2's slot ids one step earlier
    (Triton's pipeliner leaves gathers that are dequantised in registers)."""
    slots = _chunk_slots(0, n_a, n_total, seg_a, seg_b, BLOCK_N)
    raw = _chunk_rows(0, n_a, slots, seg_a, seg_b, RECORD)
    slots_next = _chunk_slots(1, n_a, n_total, seg_a, seg_b, BLOCK_N)
    for i in range(0, n_total):
        valid = slots >= 0
        k, v = _kv_tiles(raw, dv_part, RECORD, DV_SPLITS)
        # Chunk i's raw rows are consumed: issue chunk i+1's gather now.
        slots = slots_next
        raw = _chunk_rows(i + 1, n_a, slots, seg_a, seg_b, RECORD)
        slots_next = _chunk_slots(i + 2, n_a, n_total, seg_a, seg_b, BLOCK_N)
        s = tl.dot(q, tl.trans(k))
        # Both branches are the same. Triton gives a dot that feeds another
        # dot all its warps along M, so both warpgroups of a 64-row block
        # would compute the whole score tile; the branch hides the second
        # dot from that layout pass, and the tile is split between them.
        if qk_scale > 0:
            s = _masked_scores(s, valid, qk_scale)
        else:
            s = _masked_scores(s, valid, qk_scale)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # Rows with no live candidate yet keep m = -inf: shift them by 0.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha_row = tl.exp2(m_i - m_shift)
        alpha = alpha_row[:, None]
        p = tl.exp2(s - m_shift[:, None])
        l_i = l_i * alpha_row + tl.sum(p, 1)
        m_i = m_new
        p = p.to(tl.bfloat16)
        acc = tl.dot(p, v, acc * alpha)
    return acc, m_i, l_i


@triton.jit
def _sparse_mla_fwd_kernel(
    q_ptr,
    q_stride_t,
    q_stride_h,
    out_ptr,
    out_stride_t,
    out_stride_h,
    part_out_ptr,  # [T, H, S, 512] fp32, split path only
    part_lse_ptr,  # [T, H, S] fp32 (base-2 log-sum-exp), split path only
    sinks_ptr,
    num_heads,
    qk_scale,
    # SWA segment
    swa_pool_ptr,
    swa_page_size,
    swa_page_stride,
    swa_token_stride,
    swa_idx_ptr,
    swa_idx_stride_t,
    swa_idx_stride_k,
    swa_lens_ptr,
    swa_cap,
    # compressed segment
    cmp_pool_ptr,
    cmp_page_size,
    cmp_page_stride,
    cmp_token_stride,
    cmp_idx_ptr,
    cmp_idx_stride_t,
    cmp_idx_stride_k,
    cmp_lens_ptr,
    cmp_cap,
    chunks_per_split,
    num_splits,
    SWA_REC: tl.constexpr,
    HAS_CMP: tl.constexpr,
    CMP_REC: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DV_SPLITS: tl.constexpr,
):
    DV: tl.constexpr = 512 // DV_SPLITS
    # A token's programs are adjacent in launch order: they share its rows
    # through L2.
    per_token = tl.cdiv(num_heads, BLOCK_H) * DV_SPLITS
    pid = tl.program_id(0)
    t = (pid // per_token).to(tl.int64)
    heads = (pid % per_token) // DV_SPLITS * BLOCK_H + tl.arange(0, BLOCK_H)
    dv_part = pid % DV_SPLITS
    hmask = heads < num_heads
    split = tl.program_id(1)

    d = tl.arange(0, 512)
    q = tl.load(
        q_ptr + t * q_stride_t + heads[:, None] * q_stride_h + d[None, :],
        mask=hmask[:, None],
        other=0.0,
    )
    acc = tl.zeros((BLOCK_H, DV), dtype=tl.float32)
    dv = dv_part * DV + tl.arange(0, DV)
    m_i = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)

    # Both segments form one candidate list in chunks of BLOCK_N; this
    # program owns chunks [lo, hi). Chunks past a row's length are skipped.
    lo = split * chunks_per_split
    hi = lo + chunks_per_split
    swa_chunks = tl.cdiv(swa_cap, BLOCK_N)
    swa_len = tl.minimum(tl.load(swa_lens_ptr + t), swa_cap)
    swa_lo = tl.minimum(lo, swa_chunks)
    n_swa = tl.maximum(tl.minimum(hi, tl.cdiv(swa_len, BLOCK_N)) - swa_lo, 0)
    swa = (
        swa_idx_ptr + t * swa_idx_stride_t,
        swa_idx_stride_k,
        swa_len,
        swa_lo,
        swa_pool_ptr,
        swa_page_size,
        swa_page_stride,
        swa_token_stride,
    )
    if HAS_CMP:
        cmp_len = tl.minimum(tl.load(cmp_lens_ptr + t), cmp_cap)
        cmp_lo = tl.maximum(lo - swa_chunks, 0)
        n_cmp = tl.maximum(
            tl.minimum(hi - swa_chunks, tl.cdiv(cmp_len, BLOCK_N)) - cmp_lo, 0
        )
        cmp = (
            cmp_idx_ptr + t * cmp_idx_stride_t,
            cmp_idx_stride_k,
            cmp_len,
            cmp_lo,
            cmp_pool_ptr,
            cmp_page_size,
            cmp_page_stride,
            cmp_token_stride,
        )
    if HAS_CMP and SWA_REC == CMP_REC:
        acc, m_i, l_i = _attend_chunks(
            acc,
            m_i,
            l_i,
            q,
            dv_part,
            n_swa,
            n_swa + n_cmp,
            swa,
            cmp,
            qk_scale,
            SWA_REC,
            BLOCK_N,
            DV_SPLITS,
        )
    else:
        # SWA alone, or pools of two record formats: one walk per segment.
        acc, m_i, l_i = _attend_chunks(
            acc,
            m_i,
            l_i,
            q,
            dv_part,
            n_swa,
            n_swa,
            swa,
            swa,
            qk_scale,
            SWA_REC,
            BLOCK_N,
            DV_SPLITS,
        )
        if HAS_CMP:
            acc, m_i, l_i = _attend_chunks(
                acc,
                m_i,
                l_i,
                q,
                dv_part,
                0,
                n_cmp,
                cmp,
                cmp,
                qk_scale,
                CMP_REC,
                BLOCK_N,
                DV_SPLITS,
            )

    if SPLIT:
        # Normalised per split; the combine kernel weights them by their
        # log-sum-exp.
        inv_l = tl.where(l_i > 0.0, 1.0 / l_i, 0.0)
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_i), float("-inf"))
        row = (t * num_heads + heads) * num_splits + split
        tl.store(
            part_out_ptr + row[:, None] * 512 + dv[None, :],
            acc * inv_l[:, None],
            mask=hmask[:, None],
        )
        tl.store(part_lse_ptr + row, lse, mask=hmask)
    else:
        denom = l_i
        if HAS_SINKS:
            # A sink is a logit without a value row: it only adds to the
            # denominator.
            sink = tl.load(sinks_ptr + heads, mask=hmask, other=float("-inf"))
            m_shift = tl.where(m_i == float("-inf"), 0.0, m_i)
            denom += tl.exp2(sink * 1.4426950408889634 - m_shift)
        inv = tl.where(denom > 0.0, 1.0 / denom, 0.0)
        tl.store(
            out_ptr + t * out_stride_t + heads[:, None] * out_stride_h + dv[None, :],
            (acc * inv[:, None]).to(tl.bfloat16),
            mask=hmask[:, None],
        )


@triton.jit
def _sparse_mla_combine_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    out_stride_t,
    out_stride_h,
    sinks_ptr,
    num_heads,
    num_splits,
    HAS_SINKS: tl.constexpr,
    SPLITS_POW2: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Merge the splits' partial rows of one (token, head, BLOCK_D output
    columns), all splits in one load."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    s = tl.arange(0, SPLITS_POW2)
    smask = s < num_splits
    row = (t * num_heads + h) * num_splits
    lse = tl.load(part_lse_ptr + row + s, mask=smask, other=float("-inf"))
    part = tl.load(
        part_out_ptr + (row + s)[:, None] * 512 + d[None, :],
        mask=smask[:, None],
        other=0.0,
    )
    m = tl.max(lse, 0)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + h) * 1.4426950408889634
        m = tl.maximum(m, sink)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)
    denom = tl.sum(w, 0)
    if HAS_SINKS:
        denom += tl.exp2(sink - m)
    inv = tl.where(denom > 0.0, 1.0 / denom, 0.0)
    acc = tl.sum(part * w[:, None], 0)
    tl.store(
        out_ptr + t * out_stride_t + h * out_stride_h + d,
        (acc * inv).to(tl.bfloat16),
    )


def _pool_geometry(
    pool: torch.Tensor, kv_layout: str, name: str
) -> tuple[bool, int, int, int]:
    """(is_fp8_record, page_size, page_stride, token_stride); strides in
    bytes for packed records, in elements for BF16 rows."""
    packed = pool.dtype in (torch.uint8, torch.float8_e4m3fn)
    if pool.ndim == 4:
        page_dim = 2 if kv_layout == "HND" else 1
        head_dim = 1 if kv_layout == "HND" else 2
        if kv_layout not in ("HND", "NHD"):
            raise ValueError(f"kv_layout must be 'NHD' or 'HND', got {kv_layout!r}")
        if pool.shape[head_dim] != 1:
            raise ValueError(
                f"{name} must have a single KV head in dim {head_dim} for "
                f"kv_layout={kv_layout!r}, got shape {tuple(pool.shape)}"
            )
    elif pool.ndim == 3:
        page_dim = 1
    else:
        raise ValueError(
            f"{name} must be [pages, page_size, width] or a 4-D NHD/HND pool, "
            f"got shape {tuple(pool.shape)}"
        )
    page_size = pool.shape[page_dim]
    if pool.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension")
    if packed:
        if pool.shape[-1] != _RECORD_BYTES:
            raise ValueError(
                f"packed {name} must have {_RECORD_BYTES}-byte fp8_ds_mla records, "
                f"got width {pool.shape[-1]}"
            )
        if pool.stride(0) < page_size * _RECORD_BYTES:
            raise ValueError(
                f"{name} page stride {pool.stride(0)} B is smaller than "
                f"page_size * {_RECORD_BYTES} B"
            )
        if pool.stride(0) % 8 or pool.data_ptr() % 8:
            # Each row's scale bytes are read as one aligned 64-bit word.
            raise ValueError(
                f"packed {name} must start on an 8-byte boundary and have a "
                f"page stride that is a multiple of 8 B, got stride "
                f"{pool.stride(0)} B"
            )
        return True, page_size, pool.stride(0), _VALUE_BYTES
    if pool.dtype != torch.bfloat16 or pool.shape[-1] != _HEAD_DIM:
        raise ValueError(
            f"{name} must be a packed uint8 pool (width {_RECORD_BYTES}) or a "
            f"BF16 pool (width {_HEAD_DIM}), got {pool.dtype} width {pool.shape[-1]}"
        )
    return False, page_size, pool.stride(0), pool.stride(page_dim)


def _index_geometry(
    indices: torch.Tensor, num_tokens: int, name: str
) -> tuple[int, int, int]:
    """(token stride, entry stride, width) of [tokens, 1, k] or [tokens, k]
    slot ids."""
    if indices.dtype != torch.int32:
        raise ValueError(f"{name} must be int32, got {indices.dtype}")
    if indices.ndim == 3 and indices.shape[1] != 1:
        raise ValueError(f"{name} must be [tokens, 1, k], got {indices.shape}")
    if indices.ndim not in (2, 3) or indices.shape[0] != num_tokens:
        raise ValueError(
            f"{name} must be [{num_tokens}, 1, k], got {tuple(indices.shape)}"
        )
    return indices.stride(0), indices.stride(-1), indices.shape[-1]


class _Tile(NamedTuple):
    """Heads, warps and candidates a program takes, how many parts the 512
    output columns are cut into, and an optional register cap per thread."""

    block_h: int
    num_warps: int
    block_n: int
    dv_splits: int
    max_regs: int | None = None


def _tile_shared_bytes(block_h: int, block_n: int) -> int:
    """An upper bound of one program's shared memory: the query block and a
    chunk of rows as BF16 MMA operands, layout conversions and barriers."""
    return 2 * _HEAD_DIM * (block_h + block_n) + 128 * block_h + 1024


# Tiles for GPUs with 99 KB of shared memory per block, in order of
# preference: the query blocks of the tuned tiles do not fit there.
_SMALL_SHARED_TILES = (
    _Tile(64, 8, 16, 1),
    _Tile(32, 8, 32, 1),
    _Tile(16, 4, 32, 1),
)


def _tuned_tile(num_tokens: int, num_heads: int, packed: bool) -> _Tile:
    """Tiles timed on an H200 (see the benchmark). The [block_h, 512]
    float32 accumulator and the next chunk's raw rows share the registers,
    which bounds block_h * block_n; BF16 rows take twice the registers."""
    if num_heads <= 16:
        return _Tile(16, 4, 32, 1)
    if num_heads <= 32 and not (packed and num_tokens >= 128):
        return _Tile(32, 8, 32, 1)
    if packed and num_tokens * num_heads <= 256:
        return _Tile(16, 4, 32, 1)
    if packed and (num_tokens >= 128 or (num_heads > 64 and num_tokens >= 32)):
        return _Tile(64, 8, 64, 1)
    if num_heads > 64 and num_tokens >= 32:
        return _Tile(128, 8, 32, 2)
    return _Tile(64, 8, 32 if packed else 16, 1)


def _default_tile(
    num_tokens: int, num_heads: int, packed: bool, max_shared: int
) -> _Tile:
    """The tile a call runs: the tuned one if it fits in ``max_shared``
    bytes, else the first smaller one that fits."""
    # No taller than the heads need: without the warpgroup MMA (SM12x has
    # none) masked head rows are only cost.
    tallest = max(16, next_power_of_2(num_heads))
    fallbacks = [tile for tile in _SMALL_SHARED_TILES if tile.block_h <= tallest]
    for tile in (_tuned_tile(num_tokens, num_heads, packed), *fallbacks):
        if _tile_shared_bytes(tile.block_h, tile.block_n) <= max_shared:
            return tile
    raise ValueError(
        f"the Triton sparse-MLA kernel needs {_tile_shared_bytes(16, 32)} B of "
        f"shared memory per program; this GPU has {max_shared} B"
    )


def _programs_per_sm(tile: _Tile) -> int:
    """Programs of a tile that fit a multiprocessor's registers together."""
    if tile.block_h > 16 or tile.num_warps > 4:
        return 1
    return 3 if tile.max_regs is not None and tile.max_regs <= 168 else 2


def _default_splits(
    base_programs: int, num_chunks: int, device: torch.device, per_sm: int = 1
) -> int:
    """Cut the candidate list only while the (token, head block, output
    part) grid leaves multiprocessors idle: about one wave in all."""
    sms = num_compute_units(device.index or 0)
    return max(1, min(num_chunks, per_sm * sms // base_programs))


def _even_splits(num_chunks: int, num_splits: int) -> tuple[int, int]:
    """(splits, chunks per split) that run for ``num_splits`` asked, every
    split with the same number of chunks (20 over 16 run as 10 of 2)."""
    chunks_per_split = cdiv(num_chunks, max(1, min(num_splits, num_chunks)))
    return cdiv(num_chunks, chunks_per_split), chunks_per_split


# A default plan has at most (programs per SM) x SMs programs of up to 64
# (token, head) rows each, so 64 rows per SM bound its partial results.
_PARTIAL_ROWS_PER_SM = 64


class _Partials:
    """The partial-result buffer (float32: 512 values and a log-sum-exp per
    (token, head, split) row), sized once, and its views by shape, kept so
    that a call makes no tensor. Its storage never changes, so a captured
    CUDA graph keeps addressing live memory."""

    def __init__(self, device: torch.device) -> None:
        self.rows = _PARTIAL_ROWS_PER_SM * num_compute_units(device.index or 0)
        self.buffer = torch.empty(
            self.rows * (_HEAD_DIM + 1), dtype=torch.float32, device=device
        )
        self._views: dict[tuple[int, int, int], tuple[torch.Tensor, ...]] = {}

    def views(self, shape: tuple[int, int, int]) -> tuple[torch.Tensor, ...]:
        views = self._views.get(shape)
        if views is None:
            rows = shape[0] * shape[1] * shape[2]
            assert rows <= self.rows, (shape, self.rows)
            views = (
                self.buffer[: rows * _HEAD_DIM].view(*shape, _HEAD_DIM),
                self.buffer[rows * _HEAD_DIM : rows * (_HEAD_DIM + 1)].view(shape),
            )
            self._views[shape] = views
        return views


_PARTIALS_KEY = "triton_dsv41_sparse_mla.partials"
_own_partials: dict[torch.device, _Partials] = {}


def _partials(device: torch.device) -> _Partials:
    """The partial-result buffer of this call. Inside vLLM's workspace
    manager each micro-batch and lane owns one, made by the first call (the
    profiling run, before any graph capture); elsewhere one per device."""
    if is_workspace_manager_initialized():
        manager = current_workspace_manager()
        # Managers without keyed resources fall through to the device's own.
        if hasattr(manager, "get_persistent_resource"):
            return manager.get_persistent_resource(
                (_PARTIALS_KEY, device), lambda: _Partials(device)
            )
    partials = _own_partials.get(device)
    if partials is None:
        partials = _own_partials[device] = _Partials(device)
    return partials


@dataclass(frozen=True)
class _Geometry:
    """What a call's tensors say about the launch, checked once."""

    num_tokens: int
    num_heads: int
    q_strides: tuple[int, int]
    out_strides: tuple[int, int]
    swa_rec: int  # 1: packed FP8 records, 0: BF16 rows
    swa: tuple[int, int, int]  # page size, page stride, token stride
    swa_index: tuple[int, int, int]  # token stride, entry stride, width
    has_cmp: bool
    cmp_rec: int
    cmp: tuple[int, int, int]
    cmp_index: tuple[int, int, int]
    has_sinks: bool
    device: torch.device


@dataclass(frozen=True)
class _LaunchPlan:
    """The grids, scalar arguments and compile-time constants of a call."""

    geometry: _Geometry
    tile: _Tile
    grid: tuple[int, int]
    chunks_per_split: int
    num_splits: int
    partials: tuple[int, int, int] | None  # (tokens, heads, splits)
    constants: dict
    combine_grid: tuple[int, int, int] | None
    combine_constants: dict


def _geometry(
    query: torch.Tensor,
    swa_kv_cache: torch.Tensor,
    sparse_indices: torch.Tensor,
    out: torch.Tensor,
    sinks: torch.Tensor | None,
    compressed_kv_cache: torch.Tensor | None,
    extra_sparse_indices: torch.Tensor | None,
    extra_sparse_topk_lens: torch.Tensor | None,
    kv_layout: str,
) -> _Geometry | None:
    """Check the arguments (None: no tokens)."""
    if query.ndim != 3 or query.shape[-1] != _HEAD_DIM:
        raise ValueError(f"query must be [tokens, heads, 512], got {query.shape}")
    if query.dtype != torch.bfloat16:
        raise ValueError(f"query must be BF16, got {query.dtype}")
    num_tokens, num_heads, _ = query.shape
    if not 1 <= num_heads <= 128:
        raise ValueError(f"num_heads must be in 1..128, got {num_heads}")
    if out.shape != query.shape or out.dtype != torch.bfloat16:
        raise ValueError(
            f"out must be BF16 {tuple(query.shape)}, got {out.dtype} {tuple(out.shape)}"
        )
    if query.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError("query and out must be contiguous in the head dim")
    if (extra_sparse_indices is None) != (extra_sparse_topk_lens is None):
        raise ValueError("extra_sparse_indices and extra_sparse_topk_lens go together")
    has_cmp = extra_sparse_indices is not None
    if has_cmp and compressed_kv_cache is None:
        raise ValueError("extra_sparse_indices needs compressed_kv_cache")
    if sinks is not None and (
        sinks.dtype != torch.float32 or tuple(sinks.shape) != (num_heads,)
    ):
        raise ValueError(f"sinks must be float32 of shape ({num_heads},)")
    if num_tokens == 0:
        return None
    swa_fp8, *swa_pages = _pool_geometry(swa_kv_cache, kv_layout, "swa_kv_cache")
    swa_index = _index_geometry(sparse_indices, num_tokens, "sparse_indices")
    if has_cmp:
        assert compressed_kv_cache is not None and extra_sparse_indices is not None
        cmp_fp8, *cmp_pages = _pool_geometry(
            compressed_kv_cache, kv_layout, "compressed_kv_cache"
        )
        cmp_index = _index_geometry(
            extra_sparse_indices, num_tokens, "extra_sparse_indices"
        )
    else:
        # Never dereferenced: HAS_CMP is a compile-time False.
        cmp_fp8, cmp_pages, cmp_index = False, [1, 0, 0], (0, 0, 0)
    return _Geometry(
        num_tokens=num_tokens,
        num_heads=num_heads,
        q_strides=(query.stride(0), query.stride(1)),
        out_strides=(out.stride(0), out.stride(1)),
        swa_rec=int(swa_fp8),
        swa=(swa_pages[0], swa_pages[1], swa_pages[2]),
        swa_index=swa_index,
        has_cmp=has_cmp,
        cmp_rec=int(cmp_fp8),
        cmp=(cmp_pages[0], cmp_pages[1], cmp_pages[2]),
        cmp_index=cmp_index,
        has_sinks=sinks is not None,
        device=query.device,
    )


def _make_plan(geometry: _Geometry, tile: _Tile, num_splits: int) -> _LaunchPlan:
    """The launch of ``geometry`` with ``tile``, its candidate list cut into
    (about) ``num_splits`` parts."""
    g = geometry
    if tile.dv_splits not in (1, 2):
        raise ValueError(f"dv_splits must be 1 or 2, got {tile.dv_splits}")
    num_chunks = max(
        cdiv(g.swa_index[2], tile.block_n) + cdiv(g.cmp_index[2], tile.block_n), 1
    )
    num_splits, chunks_per_split = _even_splits(num_chunks, num_splits)
    # Made here even for a plan that does not split, so that the first call
    # (the profiling run's) makes it.
    partials = _partials(g.device)
    if g.num_tokens * g.num_heads * num_splits > partials.rows and num_splits > 1:
        raise ValueError(
            f"{num_splits} splits of {g.num_tokens} x {g.num_heads} rows exceed "
            f"the {partials.rows} partial-result rows"
        )
    combine_grid, combine_constants = None, {}
    if num_splits > 1:
        rows, sms = g.num_tokens * g.num_heads, num_compute_units(g.device.index or 0)
        # Narrow column blocks only while the (token, head) rows alone leave
        # SMs idle: a combine program costs about one memory round trip.
        combine_bd = 128 if rows < sms else 256 if rows < 2 * sms else 512
        splits_pow2 = next_power_of_2(num_splits)
        combine_grid = (g.num_tokens, g.num_heads, _HEAD_DIM // combine_bd)
        combine_constants = dict(
            HAS_SINKS=g.has_sinks,
            SPLITS_POW2=splits_pow2,
            BLOCK_D=combine_bd,
            num_warps=8 if splits_pow2 * combine_bd >= 8192 else 4,
        )
    constants = dict(
        SWA_REC=g.swa_rec,
        HAS_CMP=g.has_cmp,
        CMP_REC=g.cmp_rec,
        HAS_SINKS=g.has_sinks,
        SPLIT=num_splits > 1,
        BLOCK_H=tile.block_h,
        BLOCK_N=tile.block_n,
        DV_SPLITS=tile.dv_splits,
        num_warps=tile.num_warps,
        num_stages=1,
    )
    if tile.max_regs is not None:
        constants["maxnreg"] = tile.max_regs
    base = g.num_tokens * cdiv(g.num_heads, tile.block_h) * tile.dv_splits
    return _LaunchPlan(
        geometry=g,
        tile=tile,
        grid=(base, num_splits),
        chunks_per_split=chunks_per_split,
        num_splits=num_splits,
        partials=(g.num_tokens, g.num_heads, num_splits) if num_splits > 1 else None,
        constants=constants,
        combine_grid=combine_grid,
        combine_constants=combine_constants,
    )


def _default_plan(geometry: _Geometry) -> _LaunchPlan:
    g = geometry
    index = g.device.index or 0
    packed = bool(g.swa_rec) and (bool(g.cmp_rec) or not g.has_cmp)
    tile = _default_tile(
        g.num_tokens, g.num_heads, packed, get_max_shared_memory_bytes(index)
    )
    num_chunks = max(
        cdiv(g.swa_index[2], tile.block_n) + cdiv(g.cmp_index[2], tile.block_n), 1
    )
    base = g.num_tokens * cdiv(g.num_heads, tile.block_h) * tile.dv_splits
    splits = _default_splits(base, num_chunks, g.device, _programs_per_sm(tile))
    logger.debug(
        "Triton sparse MLA: %d tokens x %d heads run %s, %d splits",
        g.num_tokens,
        g.num_heads,
        tile,
        splits,
    )
    return _make_plan(g, tile, splits)


def _run(
    plan: _LaunchPlan,
    query: torch.Tensor,
    swa_kv_cache: torch.Tensor,
    sparse_indices: torch.Tensor,
    swa_topk_lens: torch.Tensor,
    out: torch.Tensor,
    sm_scale: float,
    sinks: torch.Tensor | None,
    compressed_kv_cache: torch.Tensor | None,
    extra_sparse_indices: torch.Tensor | None,
    extra_sparse_topk_lens: torch.Tensor | None,
) -> torch.Tensor:
    """Launch ``plan`` on the call's tensors (their geometry is the plan's)."""
    g = plan.geometry
    if extra_sparse_indices is None:
        compressed_kv_cache, extra_sparse_indices = swa_kv_cache, sparse_indices
        extra_sparse_topk_lens = swa_topk_lens
    sinks_arg = query if sinks is None else sinks
    part_out = part_lse = out  # never read unless the plan splits
    if plan.partials is not None:
        part_out, part_lse = _partials(g.device).views(plan.partials)
    _sparse_mla_fwd_kernel[plan.grid](
        query,
        *g.q_strides,
        out,
        *g.out_strides,
        part_out,
        part_lse,
        sinks_arg,
        g.num_heads,
        float(sm_scale) * RCP_LN2,
        swa_kv_cache,
        *g.swa,
        sparse_indices,
        g.swa_index[0],
        g.swa_index[1],
        swa_topk_lens,
        g.swa_index[2],
        compressed_kv_cache,
        *g.cmp,
        extra_sparse_indices,
        g.cmp_index[0],
        g.cmp_index[1],
        extra_sparse_topk_lens,
        g.cmp_index[2],
        plan.chunks_per_split,
        plan.num_splits,
        **plan.constants,
    )
    if plan.combine_grid is not None:
        _sparse_mla_combine_kernel[plan.combine_grid](
            part_out,
            part_lse,
            out,
            *g.out_strides,
            sinks_arg,
            g.num_heads,
            plan.num_splits,
            **plan.combine_constants,
        )
    return out


# Plans by the geometry of a call's tensors: a model has a few per token
# count; the bound keeps processes that see many shapes from growing.
_MAX_PLANS = 4096
_plans: dict[tuple, _LaunchPlan | None] = {}


def _launch(
    query: torch.Tensor,
    swa_kv_cache: torch.Tensor,
    sparse_indices: torch.Tensor,
    swa_topk_lens: torch.Tensor,
    out: torch.Tensor,
    sm_scale: float,
    sinks: torch.Tensor | None,
    compressed_kv_cache: torch.Tensor | None,
    extra_sparse_indices: torch.Tensor | None,
    extra_sparse_topk_lens: torch.Tensor | None,
    kv_layout: str,
) -> torch.Tensor:
    """Plan on the first call of a geometry; later calls of it cost a
    dictionary lookup before the launches."""
    cmp_pool = compressed_kv_cache
    key = (
        query.shape,
        query.stride(),
        query.dtype,
        query.get_device(),
        out.shape,
        out.stride(),
        out.dtype,
        swa_kv_cache.shape,
        swa_kv_cache.stride(),
        swa_kv_cache.dtype,
        swa_kv_cache.data_ptr() & 7,
        sparse_indices.shape,
        sparse_indices.stride(),
        sparse_indices.dtype,
        None if sinks is None else (sinks.shape, sinks.dtype),
        None
        if cmp_pool is None
        else (
            cmp_pool.shape,
            cmp_pool.stride(),
            cmp_pool.dtype,
            cmp_pool.data_ptr() & 7,
        ),
        None
        if extra_sparse_indices is None
        else (
            extra_sparse_indices.shape,
            extra_sparse_indices.stride(),
            extra_sparse_indices.dtype,
        ),
        extra_sparse_topk_lens is None,
        kv_layout,
    )
    try:
        plan = _plans[key]
    except KeyError:
        geometry = _geometry(
            query,
            swa_kv_cache,
            sparse_indices,
            out,
            sinks,
            compressed_kv_cache,
            extra_sparse_indices,
            extra_sparse_topk_lens,
            kv_layout,
        )
        plan = None if geometry is None else _default_plan(geometry)
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[key] = plan
    if plan is None:
        return out
    return _run(
        plan,
        query,
        swa_kv_cache,
        sparse_indices,
        swa_topk_lens,
        out,
        sm_scale,
        sinks,
        compressed_kv_cache,
        extra_sparse_indices,
        extra_sparse_topk_lens,
    )


def triton_sparse_mla_dsv41(
    query: torch.Tensor,
    swa_kv_cache: torch.Tensor,
    sparse_indices: torch.Tensor,
    swa_topk_lens: torch.Tensor,
    out: torch.Tensor,
    sm_scale: float,
    sinks: torch.Tensor | None = None,
    compressed_kv_cache: torch.Tensor | None = None,
    extra_sparse_indices: torch.Tensor | None = None,
    extra_sparse_topk_lens: torch.Tensor | None = None,
    kv_layout: str = "NHD",
) -> torch.Tensor:
    """Sparse MLA over an SWA segment and an optional compressed segment.

    Decode (few tokens) splits each token's candidates across programs and
    merges the partial softmaxes with a second small kernel; prefill (many
    tokens) runs one program per (token, head block). Launch-only: no host
    synchronisation, safe to capture in a CUDA graph.

    Args:
        query: ``[tokens, heads, 512]`` BF16, ``heads`` in 1..128, contiguous
            in the last dim. Dims 0..447 are NoPE, 448..511 RoPE.
        swa_kv_cache: SWA pool, one latent row per slot. Either packed
            ``fp8_ds_mla`` records (uint8 or float8_e4m3fn, width 584; page
            layout in the module docstring) or BF16 rows of width 512. Shape
            ``[pages, page_size, 1, width]`` for ``kv_layout="NHD"``,
            ``[pages, 1, page_size, width]`` for ``"HND"``, or
            ``[pages, page_size, width]``. The page stride (``stride(0)``) may
            exceed one page's data (padded pools).
        sparse_indices: ``[tokens, 1, W]`` (or ``[tokens, W]``) int32 slot ids
            into ``swa_kv_cache``, slot = page * page_size + offset. ``-1``
            marks an unused entry.
        swa_topk_lens: ``[tokens]`` int32, how many leading entries of each
            row of ``sparse_indices`` are live; later entries are ignored.
        out: ``[tokens, heads, 512]`` BF16, written in place. A row with no
            live candidate gets zeros.
        sm_scale: softmax scale applied to q.k.
        sinks: optional ``[heads]`` float32 per-head sink logits (same scale
            as ``sm_scale * q.k``) that join the softmax denominator without a
            value row; ``-inf`` means no sink.
        compressed_kv_cache: optional compressed pool, same formats as
            ``swa_kv_cache`` (its own page size and stride).
        extra_sparse_indices: ``[tokens, 1, K]`` int32 slot ids into
            ``compressed_kv_cache``; ``-1`` marks an unused entry. Given
            together with ``extra_sparse_topk_lens``.
        extra_sparse_topk_lens: ``[tokens]`` int32 live lengths of the
            compressed segment.
        kv_layout: ``"NHD"`` or ``"HND"``: where the single KV-head axis of a
            4-D pool sits.

    Returns:
        ``out``. V is the same 512-wide row as K (``d_v == d_qk == 512``).
    """
    return _launch(
        query,
        swa_kv_cache,
        sparse_indices,
        swa_topk_lens,
        out,
        sm_scale,
        sinks,
        compressed_kv_cache,
        extra_sparse_indices,
        extra_sparse_topk_lens,
        kv_layout,
    )
