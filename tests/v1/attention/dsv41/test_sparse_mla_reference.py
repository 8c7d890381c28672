# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""CPU checks of the FlashInfer DSV4 sparse-MLA reference and the index references.

The attention reference is compared against ``dense_attention_oracle``: plain
float64 masked attention over the *logical* rows of every request, with a mask
built from positions and chosen compressed entries.  The paged pools, block
tables, slot/row arithmetic and index tables are built here, separately, so a
mistake in the reference's paging, record decoding or masking shows up as a
mismatch.
"""

from __future__ import annotations

import functools
import math
import random
from types import SimpleNamespace

import pytest
import torch

from tests.v1.attention.dsv41.fp8_ds_mla_pool import (
    alloc_fp8_ds_mla_pool,
    alloc_plain_pool,
    fp8_ds_mla_round_trip,
    read_fp8_ds_mla,
    write_fp8_ds_mla,
    write_plain_pool,
)
from tests.v1.attention.dsv41.index_reference import (
    reference_build_flashinfer_mixed_sparse_indices,
    reference_compute_global_topk_indices_and_lens,
    reference_sparse_swa_metadata,
)
from tests.v1.attention.dsv41.sparse_mla_reference import (
    dense_attention_oracle,
    reference_sparse_mla_dsv4,
)

WINDOW = 128
D = 512
# float32 accumulation over <= ~200 slots of 512-dim rows stays far below this.
F32_RTOL = 1e-5


@pytest.fixture(autouse=True)
def _single_thread():
    """These small matmuls run faster on one thread, and OpenMP workers that
    spin on a loaded 2-core CI box made the file ~10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def seed(request) -> int:
    """Fresh random inputs every run; the seed is printed for reproduction."""
    value = random.SystemRandom().randrange(2**31)
    request.node.user_properties.append(("seed", value))
    print(f"seed={value}")
    return value


def _rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    scale = expected.abs().max().item()
    return (actual.double() - expected).abs().max().item() / max(scale, 1e-30)


# ---------------------------------------------------------------------------
# A paged world: requests with logical SWA rows and compressed rows
# ---------------------------------------------------------------------------


def _build_world(
    gen: torch.Generator,
    seq_lens: list[int],
    q_lens: list[int],
    swa_page: int,
    comp_page: int,
    ratio: int,
) -> SimpleNamespace:
    """Logical rows per request and out-of-order block tables for both pools."""
    rng = random.Random(int(torch.randint(0, 2**31, (1,), generator=gen)))
    num_comp = [s // ratio for s in seq_lens]
    swa_pages_needed = [-(-s // swa_page) for s in seq_lens]
    comp_pages_needed = [max(1, -(-c // comp_page)) for c in num_comp]

    def tables(needed: list[int]) -> tuple[torch.Tensor, int]:
        total = sum(needed) + 3  # spare pages that nothing should read
        pages = list(range(total))
        rng.shuffle(pages)
        table = torch.full((len(needed), max(needed) + 1), 10**6, dtype=torch.int32)
        cursor = 0
        for r, n in enumerate(needed):
            table[r, :n] = torch.tensor(pages[cursor : cursor + n])
            cursor += n
        return table, total

    swa_table, swa_pages = tables(swa_pages_needed)
    comp_table, comp_pages = tables(comp_pages_needed)
    swa_rows = [torch.randn(s, D, generator=gen) for s in seq_lens]
    comp_rows = [torch.randn(c, D, generator=gen) for c in num_comp]
    swa_base = [sum(seq_lens[:r]) for r in range(len(seq_lens))]
    comp_base = [sum(num_comp[:r]) + sum(seq_lens) for r in range(len(seq_lens))]
    tokens = []  # (request, position)
    for r, (s, q) in enumerate(zip(seq_lens, q_lens, strict=True)):
        tokens += [(r, p) for p in range(s - q, s)]
    return SimpleNamespace(
        rng=rng,
        seq_lens=seq_lens,
        q_lens=q_lens,
        num_comp=num_comp,
        swa_page=swa_page,
        comp_page=comp_page,
        ratio=ratio,
        swa_table=swa_table,
        comp_table=comp_table,
        swa_pages=swa_pages,
        comp_pages=comp_pages,
        swa_rows=swa_rows,
        comp_rows=comp_rows,
        swa_base=swa_base,
        comp_base=comp_base,
        tokens=tokens,
        num_logical=sum(seq_lens) + sum(num_comp),
    )


def _swa_slot(w: SimpleNamespace, r: int, pos: int) -> int:
    return int(w.swa_table[r, pos // w.swa_page]) * w.swa_page + pos % w.swa_page


def _comp_slot(w: SimpleNamespace, r: int, i: int) -> int:
    return int(w.comp_table[r, i // w.comp_page]) * w.comp_page + i % w.comp_page


def _fill(w: SimpleNamespace, swa_pool, comp_pool, kind: str, layout: str):
    """Write every logical row into the pools; return the stored values."""
    swa_all = torch.cat(w.swa_rows)
    comp_all = torch.cat(w.comp_rows)
    swa_slots = torch.tensor(
        [_swa_slot(w, r, p) for r, s in enumerate(w.seq_lens) for p in range(s)]
    )
    comp_slots = torch.tensor(
        [_comp_slot(w, r, i) for r, c in enumerate(w.num_comp) for i in range(c)]
    )
    pool_layout = "HND" if layout == "3D" else layout
    if kind == "packed":
        write_fp8_ds_mla(swa_pool, swa_slots, swa_all)
        write_fp8_ds_mla(comp_pool, comp_slots, comp_all)
        stored = [fp8_ds_mla_round_trip(swa_all), fp8_ds_mla_round_trip(comp_all)]
    else:
        dtype = torch.bfloat16 if kind == "bf16" else torch.float8_e4m3fn
        write_plain_pool(swa_pool, swa_slots, swa_all, pool_layout)
        write_plain_pool(comp_pool, comp_slots, comp_all, pool_layout)
        stored = [swa_all.to(dtype).float(), comp_all.to(dtype).float()]
    return torch.cat(stored).double()


def _choose(w: SimpleNamespace, r: int, pos: int, max_comp: int):
    """Window positions and a random subset of visible compressed entries."""
    window = list(range(max(0, pos - WINDOW + 1), pos + 1))
    visible = min((pos + 1) // w.ratio, w.num_comp[r])
    picked = w.rng.sample(range(visible), w.rng.randint(0, min(visible, max_comp)))
    return window, picked


def _trap_rows(w: SimpleNamespace, r: int, pos: int) -> tuple[list[int], list[int]]:
    """SWA positions / compressed entries that exist but are *not* visible."""
    swa = [p for p in range(w.seq_lens[r]) if p > pos or p <= pos - WINDOW]
    comp = list(range((pos + 1) // w.ratio, w.num_comp[r]))
    return swa or [0], comp or [0]


def _random_query(gen, num_tokens: int, heads: int, qdtype: torch.dtype):
    q = torch.randn(num_tokens, heads, D, generator=gen)
    return q.to(qdtype)


# ---------------------------------------------------------------------------
# SM10x combined form
# ---------------------------------------------------------------------------


def _sm10x_tables(w: SimpleNamespace, swa_span: int, comp_span: int, comp_width: int):
    """Combined table, lens and the dense mask, built column by column."""
    num_tokens = len(w.tokens)
    table = torch.full((num_tokens, WINDOW + comp_width), -1, dtype=torch.int32)
    lens = torch.zeros(num_tokens, dtype=torch.int32)
    mask = torch.zeros(num_tokens, w.num_logical, dtype=torch.bool)

    def swa_row(r: int, p: int) -> int:
        slot = _swa_slot(w, r, p)
        return slot // w.swa_page * swa_span + slot % w.swa_page

    def comp_row(r: int, i: int) -> int:
        slot = _comp_slot(w, r, i)
        return slot // w.comp_page * comp_span + slot % w.comp_page

    empty_token = w.rng.randrange(num_tokens)
    for t, (r, pos) in enumerate(w.tokens):
        window, picked = _choose(w, r, pos, max_comp=comp_width // 2)
        trap_swa, trap_comp = _trap_rows(w, r, pos)
        if t == empty_token:
            lens[t] = WINDOW + w.rng.randint(0, comp_width)
            continue  # every column stays -1: the row must come out as zeros
        # SWA columns: the window oldest first with a few holes (-1), then
        # rows of positions outside the window, which the seq_lens bound of
        # min(pos + 1, 128) columns must hide.
        for c, p in enumerate(window):
            if w.rng.random() < 0.1:
                continue
            table[t, c] = swa_row(r, p)
            mask[t, w.swa_base[r] + p] = True
        for c in range(len(window), WINDOW):
            table[t, c] = swa_row(r, w.rng.choice(trap_swa))
        # Compressed columns: picked entries with holes, then past-length traps.
        col = WINDOW
        for i in picked:
            if w.rng.random() < 0.2:
                col += 1  # a -1 inside the active range
            table[t, col] = comp_row(r, i)
            mask[t, w.comp_base[r] + i] = True
            col += 1
        lens[t] = col
        for c in range(col, WINDOW + comp_width):
            table[t, c] = comp_row(r, w.rng.choice(trap_comp))
    return table, lens, mask


# (pool layout, packed pages, sinks): every value of each axis appears.
_SM10X_VARIANTS = [
    ("NHD", True, True),
    ("HND", False, False),
    ("3D", True, False),
    ("NHD", False, True),
]


@pytest.mark.parametrize("heads", [16, 24, 64])
@pytest.mark.parametrize("kind", ["bf16", "fp8"])
@pytest.mark.parametrize("layout, packed, with_sinks", _SM10X_VARIANTS)
def test_sm10x_combined_form_matches_dense(
    seed: int, heads: int, kind: str, layout: str, packed: bool, with_sinks: bool
) -> None:
    gen = torch.Generator().manual_seed(seed)
    # A request shorter than the window, one crossing several pages, decode
    # and multi-token rows; varlen query.
    w = _build_world(gen, [5, 70, 200, 301], [1, 3, 9, 12], 64, 64, 2)
    dtype = torch.bfloat16 if kind == "bf16" else torch.float8_e4m3fn
    swa_span = 64 + (16 if packed else 0)
    comp_span = 64 + (16 if packed else 0)
    pool_layout = "HND" if layout == "3D" else layout
    swa_pool = alloc_plain_pool(
        w.swa_pages, 64, dtype=dtype, layout=layout, page_span=swa_span, generator=gen
    )
    comp_pool = alloc_plain_pool(
        w.comp_pages,
        64,
        dtype=dtype,
        layout=layout,
        page_span=comp_span,
        generator=gen,
    )
    stored = _fill(w, swa_pool, comp_pool, kind, layout)
    table, lens, mask = _sm10x_tables(w, swa_span, comp_span, comp_width=48)

    padded = 32 if heads == 24 else heads
    query = _random_query(gen, len(w.tokens), padded, dtype)
    if heads != padded:
        query[:, heads:] = 0  # padded heads: zero queries, sliced off afterwards
    sinks = torch.randn(padded, generator=gen) * 2 if with_sinks else None
    scale = 2.0 / math.sqrt(D)
    # FP8 callers pass folded scalar scales; exercise the tensor form and a
    # non-unit output scale there.
    bmm1 = torch.tensor([scale]) if kind == "fp8" else scale
    bmm2 = 0.75 if kind == "fp8" else 1.0
    cu = torch.tensor([0, 1, 4, 13, 25], dtype=torch.int32)
    out = torch.full((len(w.tokens), padded, D), float("nan"))

    returned = reference_sparse_mla_dsv4(
        query=query,
        swa_kv_cache=swa_pool,
        workspace_buffer=torch.empty(0, dtype=torch.uint8),
        sparse_indices=table,
        compressed_kv_cache=comp_pool,
        sparse_topk_lens=lens,
        seq_lens=torch.tensor(w.seq_lens, dtype=torch.int32),
        out=out,
        bmm1_scale=bmm1,
        bmm2_scale=bmm2,
        sinks=sinks,
        kv_layout=pool_layout,
        cum_seq_lens_q=cu,
        max_q_len=12,
    )
    assert returned is out
    expected = dense_attention_oracle(
        query.float(), stored, mask, scale, sinks, output_scale=bmm2
    )
    assert not out.isnan().any()
    err = _rel_err(out[:, :heads], expected[:, :heads])
    print(f"max rel err {err:.3g}")
    assert err < F32_RTOL, f"max rel err {err:.3g}"
    empty = ~mask.any(dim=1)
    assert empty.any() and (out[empty] == 0).all()


def test_sm10x_dense_query_and_bf16_out(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    w = _build_world(gen, [130, 9], [4, 4], 64, 64, 1)
    swa_pool = alloc_plain_pool(w.swa_pages, 64, generator=gen)
    comp_pool = alloc_plain_pool(w.comp_pages, 64, generator=gen)
    stored = _fill(w, swa_pool, comp_pool, "bf16", "HND")
    table, lens, mask = _sm10x_tables(w, 64, 64, comp_width=16)
    query = _random_query(gen, 8, 64, torch.bfloat16)
    out = torch.full((2, 4, 64, D), float("nan"), dtype=torch.bfloat16)
    reference_sparse_mla_dsv4(
        query=query.reshape(2, 4, 64, D),
        swa_kv_cache=swa_pool,
        workspace_buffer=None,
        sparse_indices=table,
        compressed_kv_cache=comp_pool,
        sparse_topk_lens=lens,
        seq_lens=torch.tensor(w.seq_lens, dtype=torch.int32),
        out=out,
        bmm1_scale=0.05,
    )
    expected = dense_attention_oracle(query.float(), stored, mask, 0.05)
    # Only the final BF16 rounding separates the two (2^-8 relative).
    assert _rel_err(out.reshape(8, 64, D), expected) < 2**-8


def test_sm10x_rejects_packed_index_that_ignores_the_span(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    pool = alloc_plain_pool(4, 64, page_span=96, generator=gen)
    table = torch.full((1, 128), -1, dtype=torch.int32)
    # Slot-style index of (page 1, offset 10) = 74: read as a token row it is
    # row 74 of page 0, inside that page's 32 padding rows.
    table[0, 0] = 74
    with pytest.raises(IndexError):
        reference_sparse_mla_dsv4(
            query=torch.zeros(1, 1, 16, D, dtype=torch.bfloat16),
            swa_kv_cache=pool,
            sparse_indices=table,
            compressed_kv_cache=pool,
            sparse_topk_lens=torch.tensor([128], dtype=torch.int32),
            seq_lens=torch.tensor([200], dtype=torch.int32),
        )


@pytest.mark.parametrize(
    "change, error",
    [
        ("heads24", ValueError),
        ("packed_pool", ValueError),
        ("lens_below_128", ValueError),
        ("seq_shorter_than_q", ValueError),
        ("swa_args", ValueError),
        ("int64_indices", ValueError),
    ],
)
def test_sm10x_rejects_what_flashinfer_rejects(change: str, error: type) -> None:
    heads = 24 if change == "heads24" else 16
    pool = alloc_plain_pool(2, 64)
    kwargs = dict(
        query=torch.zeros(1, 1, heads, D, dtype=torch.bfloat16),
        swa_kv_cache=pool,
        sparse_indices=torch.full((1, 128), -1, dtype=torch.int32),
        compressed_kv_cache=pool,
        sparse_topk_lens=torch.tensor([128], dtype=torch.int32),
        seq_lens=torch.tensor([1], dtype=torch.int32),
        backend="trtllm-gen",
    )
    if change == "packed_pool":
        kwargs["swa_kv_cache"] = alloc_fp8_ds_mla_pool(2, 64, layout="HND")
    elif change == "lens_below_128":
        kwargs["sparse_topk_lens"] = torch.tensor([100], dtype=torch.int32)
    elif change == "seq_shorter_than_q":
        kwargs["query"] = torch.zeros(1, 2, heads, D, dtype=torch.bfloat16)
        kwargs["sparse_indices"] = torch.full((2, 128), -1, dtype=torch.int32)
        kwargs["sparse_topk_lens"] = torch.tensor([128, 128], dtype=torch.int32)
    elif change == "swa_args":
        kwargs["swa_topk_lens"] = torch.tensor([1], dtype=torch.int32)
    elif change == "int64_indices":
        kwargs["sparse_indices"] = torch.full((1, 128), -1, dtype=torch.int64)
    with pytest.raises(error):
        reference_sparse_mla_dsv4(**kwargs)


# ---------------------------------------------------------------------------
# SM120 two-segment form
# ---------------------------------------------------------------------------


def _sm120_tables(w: SimpleNamespace, swa_width: int, comp_width: int):
    num_tokens = len(w.tokens)
    swa_ids = torch.full((num_tokens, swa_width), -1, dtype=torch.int32)
    comp_ids = torch.full((num_tokens, comp_width), -1, dtype=torch.int32)
    swa_lens = torch.zeros(num_tokens, dtype=torch.int32)
    comp_lens = torch.zeros(num_tokens, dtype=torch.int32)
    mask = torch.zeros(num_tokens, w.num_logical, dtype=torch.bool)
    empty_token = w.rng.randrange(num_tokens)
    for t, (r, pos) in enumerate(w.tokens):
        window, picked = _choose(w, r, pos, max_comp=comp_width - 8)
        trap_swa, trap_comp = _trap_rows(w, r, pos)
        if t == empty_token:
            # Zero lengths hide even valid-looking slots.
            swa_ids[t] = _swa_slot(w, r, trap_swa[0])
            continue
        # The SM120 kernel has no notion of position: any order works.
        order = window[:]
        w.rng.shuffle(order)
        swa_lens[t] = _fill_segment(
            w,
            swa_ids[t],
            mask[t],
            order,
            0.1,
            w.swa_base[r],
            trap_swa,
            functools.partial(_swa_slot, w, r),
        )
        comp_lens[t] = _fill_segment(
            w,
            comp_ids[t],
            mask[t],
            picked,
            0.2,
            w.comp_base[r],
            trap_comp,
            functools.partial(_comp_slot, w, r),
        )
    return swa_ids, swa_lens, comp_ids, comp_lens, mask


def _fill_segment(w, ids, mask, rows, hole_p, base, traps, slot) -> int:
    """Write one token's segment: ``rows`` in order with random ``-1``
    holes inside the live length, then trap slots past it. Returns the live
    length."""
    col = 0
    for row in rows:
        if w.rng.random() < hole_p:
            col += 1  # -1 hole inside the active length
        if col >= ids.shape[0]:
            break
        ids[col] = slot(row)
        mask[base + row] = True
        col += 1
    for c in range(col, ids.shape[0]):
        ids[c] = slot(w.rng.choice(traps))
    return col


# (pool layout, padded page stride, compressed segment, sinks).
_SM120_VARIANTS = [
    ("NHD", True, True, True),
    ("HND", False, True, False),
    ("3D", True, False, True),
    ("NHD", False, False, False),
]


@pytest.mark.parametrize("heads", [16, 24, 64])
@pytest.mark.parametrize(
    "layout, padded_stride, with_extra, with_sinks", _SM120_VARIANTS
)
def test_sm120_two_segment_form_matches_dense(
    seed: int,
    heads: int,
    layout: str,
    padded_stride: bool,
    with_extra: bool,
    with_sinks: bool,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    # V4.1 geometry on SM12x: 64-token SWA pages, 64 compressed entries/page.
    w = _build_world(gen, [5, 64, 200, 301], [1, 2, 6, 12], 64, 64, 2)
    # vLLM pads packed pages to a multiple of 576 B; model a bigger gap too.
    page_stride = 64 * 584 + (576 if padded_stride else 0)
    swa_pool = alloc_fp8_ds_mla_pool(
        w.swa_pages, 64, layout=layout, page_stride_bytes=page_stride, generator=gen
    )
    comp_pool = alloc_fp8_ds_mla_pool(
        w.comp_pages, 64, layout=layout, page_stride_bytes=page_stride, generator=gen
    )
    stored = _fill(w, swa_pool, comp_pool, "packed", layout)
    swa_ids, swa_lens, comp_ids, comp_lens, mask = _sm120_tables(w, 128, 40)
    if not with_extra:
        mask[:, sum(w.seq_lens) :] = False
    padded = 32 if heads == 24 else heads
    query = _random_query(gen, len(w.tokens), padded, torch.bfloat16)
    query[:, heads:] = 0
    sinks = torch.randn(padded, generator=gen) * 2 if with_sinks else None
    out = torch.full((len(w.tokens), padded, D), float("nan"))
    scale = 2.0 / math.sqrt(D)
    returned = reference_sparse_mla_dsv4(
        query=query,
        swa_kv_cache=swa_pool,
        workspace_buffer=torch.empty(0, dtype=torch.uint8),
        sparse_indices=swa_ids.view(-1, 1, 128),  # vLLM passes [T, 1, K]
        compressed_kv_cache=comp_pool if with_extra else None,
        out=out,
        bmm1_scale=scale,
        sinks=sinks,
        kv_layout="HND" if layout == "3D" else layout,
        swa_topk_lens=swa_lens,
        extra_sparse_indices=comp_ids if with_extra else None,
        extra_sparse_topk_lens=comp_lens if with_extra else None,
    )
    assert returned is out
    expected = dense_attention_oracle(query.float(), stored, mask, scale, sinks)
    assert not out.isnan().any()
    err = _rel_err(out[:, :heads], expected[:, :heads])
    print(f"max rel err {err:.3g}")
    assert err < F32_RTOL
    empty = ~mask.any(dim=1)
    assert empty.any() and (out[empty] == 0).all()


def test_sm120_prefill_sized_batch_and_4d_query(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    # > 64 tokens reaches FlashInfer's prefill kernels (no decode table check).
    w = _build_world(gen, [90], [90], 64, 64, 1)
    swa_pool = alloc_fp8_ds_mla_pool(w.swa_pages, 64, generator=gen)
    comp_pool = alloc_fp8_ds_mla_pool(w.comp_pages, 64, generator=gen)
    stored = _fill(w, swa_pool, comp_pool, "packed", "NHD")
    swa_ids, swa_lens, comp_ids, comp_lens, mask = _sm120_tables(w, 128, 64)
    query = _random_query(gen, 90, 16, torch.bfloat16)
    out = torch.full((90, 1, 16, D), float("nan"), dtype=torch.bfloat16)
    reference_sparse_mla_dsv4(
        query=query.unsqueeze(1),
        swa_kv_cache=swa_pool,
        sparse_indices=swa_ids.view(90, 1, 128),
        compressed_kv_cache=comp_pool,
        out=out,
        bmm1_scale=0.04,
        kv_layout="NHD",
        swa_topk_lens=swa_lens.view(90, 1),
        extra_sparse_indices=comp_ids,
        extra_sparse_topk_lens=comp_lens,
    )
    expected = dense_attention_oracle(query.float(), stored, mask, 0.04)
    assert _rel_err(out.squeeze(1), expected) < 2**-8


@pytest.mark.parametrize(
    "change",
    [
        "bmm2",
        "tensor_bmm1",
        "bf16_pool",
        "heads24",
        "fp8_query",
        "extra_without_lens",
    ],
)
def test_sm120_rejects_what_flashinfer_rejects(change: str) -> None:
    page = 64
    heads = 24 if change == "heads24" else 16
    pool = alloc_fp8_ds_mla_pool(4, page)
    kwargs = dict(
        query=torch.zeros(2, heads, D, dtype=torch.bfloat16),
        swa_kv_cache=pool,
        sparse_indices=torch.full((2, 128), -1, dtype=torch.int32),
        swa_topk_lens=torch.zeros(2, dtype=torch.int32),
        kv_layout="NHD",
    )
    if change == "bmm2":
        kwargs["bmm2_scale"] = 0.5
    elif change == "tensor_bmm1":
        kwargs["bmm1_scale"] = torch.tensor([0.1])
    elif change == "bf16_pool":
        kwargs["swa_kv_cache"] = alloc_plain_pool(4, 64, layout="NHD")
    elif change == "fp8_query":
        kwargs["query"] = kwargs["query"].to(torch.float8_e4m3fn)
    elif change == "extra_without_lens":
        kwargs["compressed_kv_cache"] = pool
        kwargs["extra_sparse_indices"] = torch.full((2, 8), -1, dtype=torch.int32)
    with pytest.raises(ValueError):
        reference_sparse_mla_dsv4(**kwargs)


# ---------------------------------------------------------------------------
# The packed fp8_ds_mla record
# ---------------------------------------------------------------------------


def test_fp8_ds_mla_byte_layout_by_hand() -> None:
    """Token at slot (page 1, offset 3) of 4-token pages, 584*4+100 B apart."""
    page_stride = 4 * 584 + 100
    pool = alloc_fp8_ds_mla_pool(3, 4, layout="3D", page_stride_bytes=page_stride)
    before = pool.as_strided((3 * page_stride,), (1,)).clone()
    row = torch.zeros(D)
    for block in range(7):
        # amax = 1.5 * 2**b -> scale 2**(b - 8) (rounded up), value 384 = 0x7C.
        row[block * 64 : (block + 1) * 64] = 1.5 * 2.0**block
        row[block * 64 + 1] = -1.5 * 2.0**block  # sign bit: 0xFC
    row[448:] = 1.0  # BF16 1.0 = 0x3F80, little endian 80 3F
    row[449] = -2.0  # BF16 -2.0 = 0xC000
    write_fp8_ds_mla(pool, torch.tensor([1 * 4 + 3]), row[None])
    after = pool.as_strided((3 * page_stride,), (1,))

    data = page_stride + 3 * 576
    nope = after[data : data + 448].reshape(7, 64)
    assert (nope[:, 0] == 0x7C).all() and (nope[:, 1] == 0xFC).all()
    assert (nope[:, 2:] == 0x7C).all()
    rope = after[data + 448 : data + 576].reshape(64, 2)
    assert rope[0].tolist() == [0x80, 0x3F] and rope[1].tolist() == [0x00, 0xC0]
    assert (rope[2:] == torch.tensor([0x80, 0x3F], dtype=torch.uint8)).all()
    footer = page_stride + 4 * 576 + 3 * 8
    assert after[footer : footer + 8].tolist() == [119, 120, 121, 122, 123, 124, 125, 0]
    changed = (after != before).nonzero().flatten()
    touched = set(range(data, data + 576)) | set(range(footer, footer + 8))
    assert set(changed.tolist()) <= touched
    back = read_fp8_ds_mla(pool, torch.tensor([7]))[0]
    assert torch.equal(back, row)


def test_fp8_ds_mla_round_trip_error_bound(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    kv = torch.randn(300, D, generator=gen) * torch.logspace(-3, 3, 300)[:, None]
    kv = kv.to(torch.bfloat16).float()
    got = fp8_ds_mla_round_trip(kv)
    # RoPE dims are stored as BF16: exact for BF16 input.
    assert torch.equal(got[:, 448:], kv[:, 448:])
    # E4M3 keeps 3 mantissa bits; the power-of-two scale keeps amax in
    # (224, 448] x scale, so the error is at most amax / 14 per block and at
    # most 1/16 relative for values in the normal range.
    blocks = kv[:, :448].reshape(300, 7, 64)
    err = (got[:, :448].reshape(300, 7, 64) - blocks).abs()
    amax = blocks.abs().amax(-1, keepdim=True)
    assert (err <= amax / 14 + 1e-12).all()
    normal = blocks.abs() >= amax / 32
    assert (err[normal] <= blocks.abs()[normal] / 16 + 1e-12).all()


@pytest.mark.parametrize("layout", ["NHD", "HND", "3D"])
def test_fp8_ds_mla_pool_write_read_any_layout(seed: int, layout: str) -> None:
    gen = torch.Generator().manual_seed(seed)
    pool = alloc_fp8_ds_mla_pool(
        5, 64, layout=layout, page_stride_bytes=64 * 584 + 576, generator=gen
    )
    slots = torch.randperm(5 * 64, generator=gen)[:100]
    kv = torch.randn(100, D, generator=gen)
    write_fp8_ds_mla(pool, slots, kv)
    assert torch.equal(read_fp8_ds_mla(pool, slots), fp8_ds_mla_round_trip(kv))


# ---------------------------------------------------------------------------
# Index references: hand-built expectations
# ---------------------------------------------------------------------------


def test_swa_metadata_by_hand() -> None:
    """Decode request of 5 tokens, a decode crossing pages, a 3-token prefill.

    window 4, 4-token pages.  Request 0: seq 5, block table [7, 2]: position 4
    sees positions 1..4 -> slots 29, 30, 31, 8.  Request 1: seq 7, table [3, 1]:
    position 6 sees 3..6 -> slots 15, 4, 5, 6.  Request 2 (prefill, seq 3,
    table [5]): positions 0, 1, 2 -> [20], [20, 21], [20, 21, 22].  A padding
    token (slot -1) closes the batch.
    """
    meta = reference_sparse_swa_metadata(
        query_start_loc=torch.tensor([0, 1, 2, 5], dtype=torch.int32),
        seq_lens=torch.tensor([5, 7, 3], dtype=torch.int32),
        block_table=torch.tensor([[7, 2], [3, 1], [5, 0]], dtype=torch.int32),
        slot_mapping=torch.tensor([8, 6, 20, 21, 22, -1]),
        block_size=4,
        window_size=4,
        num_decode_tokens=2,
    )
    assert meta.token_to_req_indices.tolist()[:5] == [0, 1, 2, 2, 2]
    assert meta.decode_swa_indices.shape == (2, 1, 4)
    assert meta.decode_swa_indices[:, 0].tolist() == [[29, 30, 31, 8], [15, 4, 5, 6]]
    assert meta.decode_swa_lens.tolist() == [4, 4]
    assert meta.prefill_swa_indices[:, 0].tolist() == [
        [20, -1, -1, -1],
        [20, 21, -1, -1],
        [20, 21, 22, -1],
        [-1, -1, -1, -1],
    ]
    assert meta.prefill_swa_lens.tolist() == [1, 2, 3, 0]
    assert meta.decode_swa_indices.dtype == torch.int32


def test_swa_metadata_request_shorter_than_window() -> None:
    """Window 128, seq 5 in 64-token page 9: slots 576..580 then 123 x -1."""
    meta = reference_sparse_swa_metadata(
        query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
        seq_lens=torch.tensor([5], dtype=torch.int32),
        block_table=torch.tensor([[9, 3]], dtype=torch.int32),
        slot_mapping=torch.tensor([580]),
        block_size=64,
        window_size=128,
        num_decode_tokens=1,
    )
    row = meta.decode_swa_indices[0, 0].tolist()
    assert row == [576, 577, 578, 579, 580] + [-1] * 123
    assert meta.decode_swa_lens.tolist() == [5]
    assert meta.prefill_swa_indices is None


def test_global_topk_indices_by_hand() -> None:
    """Block size 2, table [4, 9, 1]: local 0 -> 8, 3 -> 19, 5 -> 3."""
    global_ids, lens = reference_compute_global_topk_indices_and_lens(
        topk_indices=torch.tensor([[0, 3, -1, 5], [5, -1, -1, -1]], dtype=torch.int32),
        token_to_req_indices=torch.tensor([0, 0], dtype=torch.int32),
        block_table=torch.tensor([[4, 9, 1]], dtype=torch.int32),
        block_size=2,
        is_valid_token=torch.tensor([True, False]),
    )
    assert global_ids.tolist() == [[8, 19, -1, 3], [3, -1, -1, -1]]
    assert lens.tolist() == [3, 0]  # padding token: length 0, indices kept
    assert global_ids.dtype == torch.int32 and lens.dtype == torch.int32


def test_mixed_sparse_indices_by_hand() -> None:
    """One decode token and two prefill tokens; packed SWA pages (span 6).

    Window 4, 4-token SWA pages, ratio 2, compressed pages of 2, topk 3.
    Decode token: given SWA slots [15, 4, 5, -1] -> rows 3*6+3=21, 1*6+0=6, 7,
    -1; local compressed [1, -1, 2] with compressed table [3, 0] -> slots 7, -1,
    0 (two valid) -> lens 4 + 2.  Prefill request (seq 5, q 2, SWA table
    [2, 6], compressed table [1, 4, 0]): position 3 sees positions 0..3 ->
    slots 8..11 -> rows 12..15 and (3+1)//2 = 2 compressed entries; position 4
    sees 1..4 -> rows 13, 14, 15, 36 and 5//2 = 2 entries.  Local [2, 0, 1]
    maps to slots 8, 2 (the third is beyond the visible count).
    """
    table, lens = reference_build_flashinfer_mixed_sparse_indices(
        decode_swa_indices=torch.tensor([[15, 4, 5, -1]], dtype=torch.int32),
        decode_compressed_indices=torch.tensor([[1, -1, 2]], dtype=torch.int32),
        decode_compressed_topk_lens=None,
        prefill_topk_indices=torch.tensor([[2, 0, 1], [2, 0, 1]], dtype=torch.int32),
        query_start_loc=torch.tensor([0, 1, 3], dtype=torch.int32),
        seq_lens=torch.tensor([9, 5], dtype=torch.int32),
        token_to_req_indices=torch.tensor([0, 1, 1], dtype=torch.int32),
        swa_block_table=torch.tensor([[3, 1, 0], [2, 6, 0]], dtype=torch.int32),
        swa_block_size=4,
        compressed_block_table=torch.tensor([[3, 0, 0], [1, 4, 0]], dtype=torch.int32),
        compressed_block_size=2,
        window_size=4,
        compress_ratio=2,
        topk=3,
        decode_compressed_indices_are_local=True,
        decode_is_valid_token=torch.tensor([True]),
        swa_block_span=6,
        compressed_block_span=2,
    )
    assert table.shape == (3, 4 + 4) and table.dtype == torch.int32
    assert table.tolist() == [
        [21, 6, 7, -1, 7, -1, 0, -1],
        [12, 13, 14, 15, 8, 2, -1, -1],
        [13, 14, 15, 36, 8, 2, -1, -1],
    ]
    assert lens.tolist() == [6, 6, 6]


def test_index_references_drive_attention_end_to_end(seed: int) -> None:
    """SWA metadata + global top-k feed the SM120 reference; compare to a dense
    mask built only from positions (causal window of 128 and the chosen
    compressed entries)."""
    gen = torch.Generator().manual_seed(seed)
    w = _build_world(gen, [3, 150, 260], [1, 1, 70], 64, 64, 2)
    swa_pool = alloc_fp8_ds_mla_pool(w.swa_pages, 64, generator=gen)
    comp_pool = alloc_fp8_ds_mla_pool(w.comp_pages, 64, generator=gen)
    stored = _fill(w, swa_pool, comp_pool, "packed", "NHD")
    num_tokens = len(w.tokens)
    qsl = torch.tensor([0, 1, 2, 72], dtype=torch.int32)
    slot_mapping = torch.tensor([_swa_slot(w, r, p) for r, p in w.tokens])
    meta = reference_sparse_swa_metadata(
        query_start_loc=qsl,
        seq_lens=torch.tensor(w.seq_lens, dtype=torch.int32),
        block_table=w.swa_table,
        slot_mapping=slot_mapping,
        block_size=64,
        window_size=WINDOW,
        num_decode_tokens=2,
    )
    local = torch.full((num_tokens, 24), -1, dtype=torch.int32)
    mask = torch.zeros(num_tokens, w.num_logical, dtype=torch.bool)
    for t, (r, pos) in enumerate(w.tokens):
        for p in range(max(0, pos - WINDOW + 1), pos + 1):
            mask[t, w.swa_base[r] + p] = True
        _, picked = _choose(w, r, pos, max_comp=24)
        for c, i in enumerate(picked):
            local[t, c] = i
            mask[t, w.comp_base[r] + i] = True
    global_ids, comp_lens = reference_compute_global_topk_indices_and_lens(
        local, meta.token_to_req_indices, w.comp_table, 64, meta.is_valid_token
    )
    query = _random_query(gen, num_tokens, 16, torch.bfloat16)
    out = torch.full((num_tokens, 16, D), float("nan"))
    for rows, swa_ids, swa_lens in (
        (slice(0, 2), meta.decode_swa_indices, meta.decode_swa_lens),
        (slice(2, num_tokens), meta.prefill_swa_indices, meta.prefill_swa_lens),
    ):
        reference_sparse_mla_dsv4(
            query=query[rows],
            swa_kv_cache=swa_pool,
            sparse_indices=swa_ids,
            compressed_kv_cache=comp_pool,
            out=out[rows],
            bmm1_scale=0.06,
            kv_layout="NHD",
            swa_topk_lens=swa_lens,
            extra_sparse_indices=global_ids[rows],
            extra_sparse_topk_lens=comp_lens[rows],
        )
    expected = dense_attention_oracle(query.float(), stored, mask, 0.06)
    err = _rel_err(out, expected)
    print(f"max rel err {err:.3g}")
    assert err < F32_RTOL
