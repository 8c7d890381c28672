# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Portable Triton sparse-MLA attention for DeepSeek V4 / V4.1.

Same two-segment contract as FlashInfer's SM120 DSV4 sparse decode
(``trtllm_batch_decode_sparse_mla_dsv4`` with ``backend="sparse"``): every query
token attends to the rows of a sliding-window (SWA) pool named by
``sparse_indices`` and, optionally, to the rows of a compressed pool named by
``extra_sparse_indices``. K and V are the same 512-wide latent row (DSV4 uses
``d_qk == d_v == 512``: 448 NoPE dims and 64 RoPE dims, and the RoPE dims are
part of V too), and all query heads share it (MQA).

It exists for GPUs and shapes FlashInfer's DSV4 kernels do not instantiate. It
only needs Triton, so it also runs on Hopper, which is where it is measured.

Packed ``fp8_ds_mla`` pools (uint8, 584 bytes per token) follow the layout
written by ``_rope_quant_insert_kernel`` in
``vllm/models/deepseek_v41/common/ops/fused_compress_quant_cache.py`` (and
``quantize_and_insert_k_kernel`` in ``.../common/ops/cache_utils.py``): inside
one page of ``page_size`` tokens, the first ``page_size * 576`` bytes hold the
token records back to back (448 FP8 E4M3 NoPE values, then 64 BF16 RoPE
values), and the next ``page_size * 8`` bytes hold each token's 8 UE8M0 scale
bytes (scale = 2 ** (byte - 127) for the 7 NoPE blocks of 64 dims; byte 7 is
padding). The page's start is ``kv_cache.stride(0)`` bytes after the previous
one, which may be more than ``page_size * 584`` (padded pages).
"""

import functools
from dataclasses import dataclass

import torch

from vllm.triton_utils import tl, triton
from vllm.v1.worker.workspace import (
    current_workspace_manager,
    is_workspace_manager_initialized,
)

_HEAD_DIM = 512
_NOPE_DIM = 448
_QUANT_BLOCK = 64
_RECORD_BYTES = 584
_VALUE_BYTES = 576  # 448 FP8 bytes + 64 BF16 RoPE values
_SCALE_BYTES = 8
_LOG2E = 1.4426950408889634


@triton.jit
def _gather_rows(
    pool_ptr,
    slots,
    page_size,
    page_stride,
    token_stride,
    RECORD: tl.constexpr,
):
    """Issue the loads of ``BLOCK_N`` latent rows, as eight raw 64-column
    pieces plus (FP8 records) each row's eight scale bytes as one int64.
    RECORD is 0 (BF16 rows), 1 or 2 (FP8 records); with 2 each piece is a
    [BLOCK_N, 16] tensor of words (FP8 blocks: 32-bit, four values; the
    RoPE block: 64-bit, four BF16 values), see ``_dequant``.

    Nothing here waits for the data: the caller consumes the pieces one loop
    iteration later, so the gather overlaps the previous chunk's math. Rows
    of dead slots (-1) are masked to zeros, so bytes of unused slots (NaN
    included) never reach P @ V.
    """
    if RECORD != 0:
        # Packed pools arrive as uint8 or float8_e4m3fn; both are bytes here.
        pool_ptr = pool_ptr.to(tl.pointer_type(tl.uint8))
    valid = slots >= 0
    page = (slots // page_size).to(tl.int64)
    in_page = (slots % page_size).to(tl.int64)
    page_base = pool_ptr + page * page_stride
    c = tl.arange(0, 64)[None, :]
    m = valid[:, None]
    if RECORD == 2:
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
        # The BF16 RoPE block as [N, 16] 64-bit words (four values each),
        # so that it goes through the same [N, 16] -> [N, 64] joins as the FP8
        # pieces and the tile is joined without layout conversions.
        r7 = tl.load((rec + 448).to(tl.pointer_type(tl.uint64)) + c4, mask=m, other=0)
        sc_ptr = (page_base + page_size * 576 + in_page * 8).to(
            tl.pointer_type(tl.int64)
        )
        sc = tl.load(sc_ptr, mask=valid, other=0)
    elif RECORD == 1:
        rec = (page_base + in_page * 576)[:, None]
        r0 = tl.load(rec + c, mask=m, other=0)
        r1 = tl.load(rec + (64 + c), mask=m, other=0)
        r2 = tl.load(rec + (128 + c), mask=m, other=0)
        r3 = tl.load(rec + (192 + c), mask=m, other=0)
        r4 = tl.load(rec + (256 + c), mask=m, other=0)
        r5 = tl.load(rec + (320 + c), mask=m, other=0)
        r6 = tl.load(rec + (384 + c), mask=m, other=0)
        r7 = tl.load((rec + 448).to(tl.pointer_type(tl.bfloat16)) + c, mask=m, other=0)
        # The 8 scale bytes of a row are 8-byte aligned (the launcher checks
        # the page stride): one 64-bit load instead of seven byte loads.
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
    """The low and high 16-bit halves of each 32-bit word of ``x``, as BF16."""
    lo = x.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    hi = (x >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return lo, hi


@triton.jit
def _quad(c0, c1, c2, c3):
    """Four [N, 16] tensors holding columns 4k, 4k + 1, 4k + 2 and 4k + 3 ->
    [N, 64] in column order. ``join(a, b)`` stacks along a new last dim, so
    x[n, k, i, j] holds column 4k + 2i + j; join and reshape only (no
    permute), which lower to register renaming."""
    x = tl.join(tl.join(c0, c2), tl.join(c1, c3))
    return tl.reshape(x, (x.shape[0], 64))


@triton.jit
def _dequant(raw, sc, j: tl.constexpr, RECORD: tl.constexpr):
    """Piece ``j`` (columns 64j..64j+63) of a gathered tile as BF16.

    RECORD 1 dequantises FP8 pieces through Triton's cast, RECORD 2 by
    moving bits (below); both give the same BF16 values.
    """
    out = raw
    if RECORD == 1 and j < 7:
        # UE8M0 byte e encodes 2 ** (e - 127): exactly the float32 whose
        # exponent field is e. A power of two keeps the BF16 product exact.
        e = ((sc >> (8 * j)) & 0xFF).to(tl.int32)
        scale = (e << 23).to(tl.float32, bitcast=True).to(tl.bfloat16)
        out = raw.to(tl.float8e4nv, bitcast=True).to(tl.bfloat16) * scale[:, None]
    elif RECORD == 2 and j < 7:
        # E4M3 -> BF16 by moving bits. Triton's cast lowers on SM90 to an
        # FP8 -> FP16 unpack plus one FP16 -> BF16 convert per value, on the
        # slow conversion pipe (~1.5 conversions a value). An E4M3 byte
        # s.eeee.mmm placed as the BF16 bits s.0000eeee.mmm0000 is exactly its
        # value times 2 ** -120, zeros and subnormals included (the exponent
        # fields line up and BF16 keeps subnormals). A word holds columns
        # 4k..4k+3, byte 0 first; shifts and masks on whole words (full-rate
        # integer ops) make two words of two BF16 each. Measured on the H200
        # (Triton 3.6): 128 tokens x 64 heads 83.1 -> 72.8 us, x 128 heads
        # 134.6 -> 119.7 us against the cast (RECORD 1).
        ev = ((raw << 8) & 0x80008000) | ((raw << 4) & 0x07F007F0)  # 4k, 4k+2
        od = (raw & 0x80008000) | ((raw >> 4) & 0x07F007F0)  # 4k+1, 4k+3
        c0, c2 = _lanes(ev)
        c1, c3 = _lanes(od)
        x = _quad(c0, c1, c2, c3)
        # UE8M0 byte e encodes 2 ** (e - 127); with the 2 ** 120 above the
        # factor is 2 ** (e - 7), a BF16 power of two (exact products) for
        # e <= 134. Larger scales (valid, though vLLM's quantiser does not
        # write them for normalised latents) take a second exact factor.
        e = ((sc >> (8 * j)) & 0xFF).to(tl.int32)
        f1 = ((tl.minimum(e, 134) + 120) << 23).to(tl.float32, bitcast=True)
        f2 = ((tl.maximum(e, 134) - 7) << 23).to(tl.float32, bitcast=True)
        out = x * f2.to(tl.bfloat16)[:, None] * f1.to(tl.bfloat16)[:, None]
    elif RECORD == 2:
        # The RoPE block: 64-bit words of four BF16 values each.
        c0 = raw.to(tl.uint16).to(tl.bfloat16, bitcast=True)
        c1 = (raw >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        c2 = (raw >> 32).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        c3 = (raw >> 48).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        out = _quad(c0, c1, c2, c3)
    return out


@triton.jit
def _cat(a, b):
    """[R, W] ++ [R, W] -> [R, 2W] along columns. join/permute/reshape lower
    to a register renaming (no shared-memory round trip)."""
    R: tl.constexpr = a.shape[0]
    W: tl.constexpr = a.shape[1]
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), (R, 2 * W))


@triton.jit
def _kv_tiles(raw, dv_part, RECORD: tl.constexpr, DV_SPLITS: tl.constexpr):
    """The [BLOCK_N, 512] BF16 K tile of one chunk from its raw pieces
    (``_gather_rows``), and the V tile: the same rows, restricted to this
    program's output dims (half of them, picked by ``dv_part``, when
    DV_SPLITS is 2)."""
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


# A segment, as the kernel walks it: (slot-id row pointer, slot-id stride,
# live length, first chunk of this program, pool pointer, page size, page
# stride, token stride).


@triton.jit
def _chunk_slots(i, n_a, n_total, seg_a, seg_b, BLOCK_N: tl.constexpr):
    """Slot ids of the ``i``-th chunk this program walks: chunks [0, n_a)
    come from segment A starting at its first chunk, the rest from segment
    B. Past ``n_total`` (a prefetch beyond the end) every entry is -1.
    Entries past a row's length read as -1."""
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
    """Online-softmax accumulation over ``n_total`` chunks of candidates: the
    first ``n_a`` from segment A, the rest from segment B (same record
    format). Scores are kept in the base-2 domain (qk_scale has log2 e).

    One loop walks both segments, so the prefetch below runs across the
    segment boundary and there is one loop body for ptxas to allocate.
    A chunk's rows are gathered as eight raw 64-column pieces (seven FP8
    blocks, each with one scale per row, and the BF16 RoPE block) and joined
    into one BF16 tile only when they are consumed, so a chunk costs one
    Q.K and one P.V wgmma.
    Software pipelining by hand: chunk i+1's rows are gathered while chunk i
    is multiplied, and chunk i+2's slot ids are read one step before that
    (Triton's own pipeliner does not touch gathers that are dequantised in
    registers before the dot).
    """
    slots = _chunk_slots(0, n_a, n_total, seg_a, seg_b, BLOCK_N)
    raw = _chunk_rows(0, n_a, slots, seg_a, seg_b, RECORD)
    slots_next = _chunk_slots(1, n_a, n_total, seg_a, seg_b, BLOCK_N)
    for i in range(0, n_total):
        valid = slots >= 0
        k, v = _kv_tiles(raw, dv_part, RECORD, DV_SPLITS)
        # Chunk i's raw rows are now consumed: issue chunk i+1's gather at
        # once, so it overlaps Q.K, the softmax and P.V.
        slots = slots_next
        raw = _chunk_rows(i + 1, n_a, slots, seg_a, seg_b, RECORD)
        slots_next = _chunk_slots(i + 2, n_a, n_total, seg_a, seg_b, BLOCK_N)
        s = tl.dot(q, tl.trans(k))
        # The two branches are the same; the branch is there for Triton's
        # layout pass, which cannot see through it. A dot whose result feeds
        # another dot gets all its warps along M, so with one 64-row block
        # both warpgroups would compute the whole score tile; seen as a
        # plain dot it is split between them (sm_90a, 64 heads: 32 instead
        # of 64 wgmmas per chunk, and no register spill). The condition only
        # has to be unknown when compiling: qk_scale is always positive.
        if qk_scale > 0:
            s = _masked_scores(s, valid, qk_scale)
        else:
            s = _masked_scores(s, valid, qk_scale)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row whose candidates so far are all masked keeps m = -inf; shift
        # by 0 instead so exp2 sees -inf - 0 rather than -inf - -inf = NaN.
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
    # The programs of one token (head blocks x output-dim parts) are adjacent
    # in launch order, so they run together and share its rows through L2.
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

    # The two segments form one virtual candidate list, cut into chunks of
    # BLOCK_N; this program owns chunks [lo, hi) of it. Chunks past a row's
    # length are skipped without touching memory.
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
        # Partial results are normalised per split so the combine kernel only
        # needs each split's log-sum-exp to weight them.
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
            # The sink is one more logit in the softmax denominator with no
            # value row: it only rescales the output.
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
    """One program per (token, head, BLOCK_D output dims): all splits' partial
    rows are read in one [SPLITS_POW2, BLOCK_D] load (no loop of dependent
    round trips). The launcher narrows BLOCK_D only when there are too few
    (token, head) rows to fill the GPU: each program costs about one memory
    round trip, so extra waves of programs cost more than they save."""
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


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _pool_geometry(
    pool: torch.Tensor, kv_layout: str, name: str
) -> tuple[bool, int, int, int]:
    """Return (is_fp8_record, page_size, page_stride, token_stride).

    Strides are in bytes for packed records (uint8 or float8_e4m3fn, which
    the kernel reads as bytes alike) and in BF16 elements otherwise.
    """
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
    """(token stride, entry stride, width) of ``[tokens, 1, k]`` or
    ``[tokens, k]`` slot ids, read in place."""
    if indices.dtype != torch.int32:
        raise ValueError(f"{name} must be int32, got {indices.dtype}")
    if indices.ndim == 3 and indices.shape[1] != 1:
        raise ValueError(f"{name} must be [tokens, 1, k], got {indices.shape}")
    if indices.ndim not in (2, 3) or indices.shape[0] != num_tokens:
        raise ValueError(
            f"{name} must be [{num_tokens}, 1, k], got {tuple(indices.shape)}"
        )
    return indices.stride(0), indices.stride(-1), indices.shape[-1]


def _tile_shared_bytes(block_h: int, block_n: int) -> int:
    """Shared memory one program of a tile needs, at most: the query block
    and one chunk of rows as BF16 MMA operands, up to 128 B per head for the
    compiler's layout conversions and 1 KB for its barriers. Tests compile
    every default tile for each GPU family the kernel runs on and check that
    the compiler stays within this bound."""
    return 2 * _HEAD_DIM * (block_h + block_n) + 128 * block_h + 1024


@functools.cache
def _max_shared_bytes(device_index: int) -> int:
    # The same opt-in limit vllm.utils.mem_utils.get_max_shared_memory_bytes
    # reads, but through torch: this module needs only Triton, not vLLM's
    # compiled extensions.
    props = torch.cuda.get_device_properties(device_index)
    return props.shared_memory_per_block_optin


# Tiles for GPUs with 99 KB of shared memory per program (SM89, SM12x), in
# order of preference: the query blocks of the tuned tiles do not fit there.
_SMALL_SHARED_TILES = ((64, 8, 16, 1), (32, 8, 32, 1), (16, 4, 32, 1))


def _tuned_tile(
    num_tokens: int, num_heads: int, packed: bool
) -> tuple[int, int, int, int]:
    """(block_h, num_warps, block_n, dv_splits): tiles that compile for
    sm_90 with no or few register spills, picked by timing on an H200.

    The [block_h, 512 / dv_splits] float32 accumulator bounds the tile: 64
    heads by 512 dims take 128 registers per thread with 8 warps. The next
    chunk's raw rows wait in registers too, and BF16 rows take twice the
    registers of packed FP8 ones, hence the smaller chunk for them.

    FP8 with few (token, head) rows: 16-head blocks, so that more programs
    (two per multiprocessor) share each token's candidate list (H200, same
    run: 1 x 64 heads 16.7 -> 14.3 us, 1 x 128 17.6 -> 16.7, 4 x 64
    20.4 -> 19.3 against the 64-head blocks; with 8 tokens the 64-head block
    is faster again).

    FP8 with many tokens: 64-head blocks (128 heads as two) of 64-candidate
    chunks, which spread the loop's fixed cost over twice the candidates
    (H200, 128 tokens x 64 / 128 heads: 63.9 -> 59.5 us / 118.8 -> 107.1
    against 32-candidate chunks and, for 128 heads, the 128-head block
    below; 32 tokens x 128 heads: 49.3 -> 40.1). With fewer tokens and 64
    heads the candidate list is cut over more programs, and smaller chunks
    keep them busy (32 x 64: 30.7 against 31.5 us).

    FP8 with 17 to 32 heads and many tokens: the 64-head tile, its upper
    rows masked. A 32-head block lowers to the warp-level MMA, the 64-head
    one to the warpgroup MMA; the masked rows cost less than that (H200,
    same run: 128 tokens x 32 heads 73.3 us with bh32 w8 bn32, 68.7 with
    bh32 bn64, against 59.2 us for 64 heads on the 64-head tile).

    BF16 rows with more than 64 heads: one 128-head block per output half
    (timed on FP8 before the 64-head score tile was split between
    warpgroups, where it beat two 64-head blocks from 32 tokens on); with
    fewer tokens the 64-head blocks give more programs to spread the
    candidate list over. No 16-warp tile is used: at 128 registers per
    thread they spill (H200, 128 x 128: 131 us for bh64 bn64).
    """
    if num_heads <= 16:
        return 16, 4, 32, 1
    if num_heads <= 32 and not (packed and num_tokens >= 128):
        return 32, 8, 32, 1
    if packed and num_tokens * num_heads <= 256:
        return 16, 4, 32, 1
    if packed and (num_tokens >= 128 or (num_heads > 64 and num_tokens >= 32)):
        return 64, 8, 64, 1
    if num_heads > 64 and num_tokens >= 32:
        return 128, 8, 32, 2
    return 64, 8, 32 if packed else 16, 1


def _default_tile(
    num_tokens: int, num_heads: int, packed: bool, max_shared: int
) -> tuple[int, int, int, int]:
    """The tuned tile if its shared memory fits in ``max_shared`` bytes, else
    the first smaller one that fits (a tile that does not fit would only fail
    when Triton loads it, at the first request)."""
    # Fallbacks no taller than the heads need: without the warpgroup MMA of
    # the H200 (SM12x has none) masked head rows are only cost.
    tallest = max(16, 1 << (num_heads - 1).bit_length())
    fallbacks = [tile for tile in _SMALL_SHARED_TILES if tile[0] <= tallest]
    for tile in (_tuned_tile(num_tokens, num_heads, packed), *fallbacks):
        block_h, _, block_n, _ = tile
        if _tile_shared_bytes(block_h, block_n) <= max_shared:
            return tile
    raise ValueError(
        f"the Triton sparse-MLA kernel needs {_tile_shared_bytes(16, 32)} B of "
        f"shared memory per program; this GPU has {max_shared} B"
    )


def _default_splits(
    base_programs: int, num_chunks: int, device: torch.device, per_sm: int = 1
) -> int:
    """Cut the candidate list only while the (token, head block, output-dim
    part) grid alone leaves multiprocessors idle; about one wave in all, of
    ``per_sm`` programs per multiprocessor."""
    sms = _num_sms(device.index if device.index is not None else 0)
    return max(1, min(num_chunks, per_sm * sms // base_programs))


def _even_splits(num_chunks: int, num_splits: int) -> tuple[int, int]:
    """(splits, chunks per split) that run for ``num_splits`` asked: every
    split gets the same number of chunks, so none is left with an empty range
    by the rounding (20 chunks over 16 splits run as 10 splits of 2)."""
    chunks_per_split = _cdiv(num_chunks, max(1, min(num_splits, num_chunks)))
    return _cdiv(num_chunks, chunks_per_split), chunks_per_split


def _programs_per_sm(block_h: int, num_warps: int) -> int:
    """Programs of a tile that share a multiprocessor. The 16-head 4-warp
    tile holds a [16, 512] accumulator in 64 registers per thread, so two
    programs fit and one alone leaves it mostly idle (H200, 128 tokens x 16
    heads: 64.0 us with one program per token, 55.9 us with two splits);
    the wider tiles use all registers or most shared memory."""
    return 2 if block_h <= 16 and num_warps <= 4 else 1


def _cdiv(a: int, b: int) -> int:
    # Host arithmetic in plain Python: triton.cdiv is a JIT function, and
    # calling one from Python costs microseconds.
    return -(-a // b)


# A split plan has at most programs-per-SM x SMs programs of up to 64
# (token, head) rows each (the splits are cut only while the grid leaves SMs
# idle), so 64 rows per SM bound its partial results: 17 MB on a 132-SM H200.
_WORKSPACE_ROWS_PER_SM = 64


class _Partials:
    """A partial-result buffer (float32: 512 values and a log-sum-exp per
    (token, head, split) row) and its views by (tokens, heads, splits), kept
    so that a call makes no tensor."""

    def __init__(self, device: torch.device) -> None:
        index = device.index if device.index is not None else 0
        self.device = device
        self.rows = _WORKSPACE_ROWS_PER_SM * _num_sms(index)
        self._retired: list[torch.Tensor] = []
        self._alloc()

    def _alloc(self) -> None:
        self.buffer = torch.empty(
            self.rows * (_HEAD_DIM + 1), dtype=torch.float32, device=self.device
        )
        self._views: dict[tuple[int, int, int], tuple[torch.Tensor, ...]] = {}

    def views(self, shape: tuple[int, int, int]) -> tuple[torch.Tensor, ...]:
        views = self._views.get(shape)
        if views is None:
            rows = shape[0] * shape[1] * shape[2]
            if rows > self.rows:  # a split count set by hand (tests)
                # A graph captured earlier may still address the old buffer.
                self._retired.append(self.buffer)
                self.rows = rows
                self._alloc()
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
    manager each micro-batch and lane owns one, so concurrent micro-batches
    never share it; calls of one owner are ordered on one stream, as a
    model's layers are. The first call there (vLLM's profiling run, before
    any CUDA graph is captured) makes it. Without the manager's keyed
    resources (kernel tests, benchmarks) there is one per device."""
    if is_workspace_manager_initialized():
        manager = current_workspace_manager()
        if hasattr(manager, "get_persistent_resource"):
            return manager.get_persistent_resource(
                (_PARTIALS_KEY, device), lambda: _Partials(device)
            )
    partials = _own_partials.get(device)
    if partials is None:
        partials = _own_partials[device] = _Partials(device)
    return partials


@dataclass(frozen=True)
class _LaunchPlan:
    """What a call derives from its tensors' geometry alone: the launch
    grids, the scalar arguments that are not tensors, the compile-time
    constants and views of the partial-result buffer. One is made per
    geometry, so within a step only the first layer's call plans."""

    grid: tuple[int, int]
    q_strides: tuple[int, int]
    out_strides: tuple[int, int]
    num_heads: int
    swa: tuple[int, ...]  # page size, page stride, token stride
    swa_index: tuple[int, int, int]  # token stride, entry stride, width
    cmp: tuple[int, ...]
    cmp_index: tuple[int, int, int]
    chunks_per_split: int
    num_splits: int
    device: torch.device
    partials: tuple[int, int, int] | None  # (tokens, heads, splits)
    constants: dict
    combine_grid: tuple[int, int, int] | None
    combine_constants: dict


def _plan(
    query: torch.Tensor,
    swa_kv_cache: torch.Tensor,
    sparse_indices: torch.Tensor,
    out: torch.Tensor,
    sinks: torch.Tensor | None,
    compressed_kv_cache: torch.Tensor | None,
    extra_sparse_indices: torch.Tensor | None,
    extra_sparse_topk_lens: torch.Tensor | None,
    kv_layout: str,
    block_n: int | None = None,
    block_h: int | None = None,
    num_splits: int | None = None,
    num_warps: int | None = None,
    num_stages: int = 1,
    dv_splits: int | None = None,
    bit_dequant: bool | None = None,
) -> _LaunchPlan | None:
    """Check the arguments' geometry and plan the launch (None: no tokens)."""
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

    swa_fp8, *swa = _pool_geometry(swa_kv_cache, kv_layout, "swa_kv_cache")
    swa_index = _index_geometry(sparse_indices, num_tokens, "sparse_indices")
    swa_cap = swa_index[2]
    if has_cmp:
        assert compressed_kv_cache is not None and extra_sparse_indices is not None
        cmp_fp8, *cmp = _pool_geometry(
            compressed_kv_cache, kv_layout, "compressed_kv_cache"
        )
        cmp_index = _index_geometry(
            extra_sparse_indices, num_tokens, "extra_sparse_indices"
        )
    else:
        # Never dereferenced: HAS_CMP is a compile-time False.
        cmp_fp8, cmp, cmp_index = False, [1, 0, 0], (0, 0, 0)
    cmp_cap = cmp_index[2]

    # Record handling per segment: 0 BF16 rows, 1 FP8 through Triton's cast,
    # 2 FP8 through the bit-level dequantisation (``_dequant``).
    fp8_rec = 2 if bit_dequant is None or bit_dequant else 1
    device = query.device
    device_index = device.index if device.index is not None else 0
    default_bh, default_warps, default_bn, default_dv = _default_tile(
        num_tokens,
        num_heads,
        swa_fp8 and (cmp_fp8 or not has_cmp),
        _max_shared_bytes(device_index),
    )
    block_h = block_h or default_bh
    num_warps = num_warps or default_warps
    block_n = block_n or default_bn
    dv_splits = dv_splits or default_dv
    if dv_splits not in (1, 2):
        raise ValueError(f"dv_splits must be 1 or 2, got {dv_splits}")
    num_chunks = max(_cdiv(swa_cap, block_n) + _cdiv(cmp_cap, block_n), 1)
    base = num_tokens * _cdiv(num_heads, block_h) * dv_splits
    num_splits = num_splits or _default_splits(
        base, num_chunks, device, _programs_per_sm(block_h, num_warps)
    )
    num_splits, chunks_per_split = _even_splits(num_chunks, num_splits)

    # Made here even for a plan that does not split, so that the first call
    # (the profiling run's) makes it.
    _partials(device)
    combine_grid, combine_constants = None, {}
    if num_splits > 1:
        sms = _num_sms(device_index)
        combine_bd = (
            128
            if num_tokens * num_heads < sms
            else 256
            if num_tokens * num_heads < 2 * sms
            else 512
        )
        splits_pow2 = 1 << (num_splits - 1).bit_length()
        combine_grid = (num_tokens, num_heads, _HEAD_DIM // combine_bd)
        combine_constants = dict(
            HAS_SINKS=sinks is not None,
            SPLITS_POW2=splits_pow2,
            BLOCK_D=combine_bd,
            num_warps=8 if splits_pow2 * combine_bd >= 8192 else 4,
        )
    return _LaunchPlan(
        grid=(base, num_splits),
        q_strides=(query.stride(0), query.stride(1)),
        out_strides=(out.stride(0), out.stride(1)),
        num_heads=num_heads,
        swa=tuple(swa),
        swa_index=swa_index,
        cmp=tuple(cmp),
        cmp_index=cmp_index,
        chunks_per_split=chunks_per_split,
        num_splits=num_splits,
        device=device,
        partials=(num_tokens, num_heads, num_splits) if num_splits > 1 else None,
        constants=dict(
            SWA_REC=fp8_rec if swa_fp8 else 0,
            HAS_CMP=has_cmp,
            CMP_REC=fp8_rec if cmp_fp8 else 0,
            HAS_SINKS=sinks is not None,
            SPLIT=num_splits > 1,
            BLOCK_H=block_h,
            BLOCK_N=block_n,
            DV_SPLITS=dv_splits,
            num_warps=num_warps,
            num_stages=num_stages,
        ),
        combine_grid=combine_grid,
        combine_constants=combine_constants,
    )


# Plans by the geometry of a call's tensors. A model has a few geometries
# per token count (one per kind of layer); the bound only keeps a process
# that sees many shapes (tests, benchmarks) from growing without end.
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
    **config,
) -> torch.Tensor:
    """Run the kernels. ``config`` overrides the planned tile (block_n,
    block_h, num_splits, num_warps, num_stages, dv_splits, bit_dequant), for
    tests and benchmarks. A geometry seen before costs a dictionary lookup:
    no checks, no allocation, no tensor operation before the launches."""
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
        tuple(sorted(config.items())) if config else None,
    )
    try:
        plan = _plans[key]
    except KeyError:
        plan = _plan(
            query,
            swa_kv_cache,
            sparse_indices,
            out,
            sinks,
            compressed_kv_cache,
            extra_sparse_indices,
            extra_sparse_topk_lens,
            kv_layout,
            **config,
        )
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[key] = plan
    if plan is None:
        return out
    if extra_sparse_indices is None:
        cmp_pool, extra_sparse_indices = swa_kv_cache, sparse_indices
        extra_sparse_topk_lens = swa_topk_lens
    sinks_arg = query if sinks is None else sinks
    part_out = part_lse = out  # never read unless the plan splits
    if plan.partials is not None:
        part_out, part_lse = _partials(plan.device).views(plan.partials)
    swa_index, cmp_index = plan.swa_index, plan.cmp_index
    _sparse_mla_fwd_kernel[plan.grid](
        query,
        *plan.q_strides,
        out,
        *plan.out_strides,
        part_out,
        part_lse,
        sinks_arg,
        plan.num_heads,
        float(sm_scale) * _LOG2E,
        swa_kv_cache,
        *plan.swa,
        sparse_indices,
        swa_index[0],
        swa_index[1],
        swa_topk_lens,
        swa_index[2],
        cmp_pool,
        *plan.cmp,
        extra_sparse_indices,
        cmp_index[0],
        cmp_index[1],
        extra_sparse_topk_lens,
        cmp_index[2],
        plan.chunks_per_split,
        plan.num_splits,
        **plan.constants,
    )
    if plan.combine_grid is not None:
        _sparse_mla_combine_kernel[plan.combine_grid](
            part_out,
            part_lse,
            out,
            *plan.out_strides,
            sinks_arg,
            plan.num_heads,
            plan.num_splits,
            **plan.combine_constants,
        )
    return out


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
