# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""GPU tests of the portable Triton DSV4 sparse-MLA kernel.

Each case draws seeded random inputs, writes the pools with the CPU record
writers (tests/v1/attention/dsv41/fp8_ds_mla_pool.py), poisons the output
with NaN, runs the kernel and compares with a float64 dense reference over
the dequantized rows. Wrong addressing, a missed slot, a missing sink or an
unwritten output all show up as errors.
"""

from dataclasses import dataclass

import pytest
import torch

import vllm.v1.attention.ops.triton_dsv41_sparse_mla as kernels
from tests.v1.attention.dsv41.fp8_ds_mla_pool import (
    alloc_fp8_ds_mla_pool,
    alloc_plain_pool,
    read_fp8_ds_mla,
    write_fp8_ds_mla,
    write_plain_pool,
)
from vllm.v1.attention.ops.triton_dsv41_sparse_mla import triton_sparse_mla_dsv41

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="the Triton sparse-MLA kernel needs a CUDA GPU",
)

DIM = 512
# Error budget: BF16 P and BF16 output against a float64 reference land near
# 3e-3; a single wrong row or a lost sink moves it by far more than this.
RTOL = 1e-2


def _device() -> torch.device:
    # CPU only matters for developing the helpers under TRITON_INTERPRET=1.
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class Pool:
    cache: torch.Tensor  # what the kernel gets (on the GPU)
    rows: torch.Tensor  # [pages * page_size, 512] float64, what the pool holds


def _to_device_keep_strides(t: torch.Tensor) -> torch.Tensor:
    # .to() would compact the tensor and drop the page padding under test.
    dst = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=_device())
    dst.copy_(t)
    return dst


def make_pool(
    num_pages: int,
    page_size: int,
    record: str,
    layout: str = "NHD",
    pad: int = 0,
    seed: int = 0,
    block_exponents: tuple[int, ...] | None = None,
) -> Pool:
    """A paged pool of random rows, written with the CPU record writers.
    ``pad`` adds bytes (FP8) or rows (BF16) after each page so the page
    stride exceeds one page's data; the padding holds random garbage.
    ``block_exponents`` scales each 64-column block of every row by 2 ** e
    (the quantiser's UE8M0 scales follow)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    n = num_pages * page_size
    rows = torch.randn(n, DIM, generator=g) * 2.0
    if block_exponents is not None:
        scale = torch.exp2(torch.tensor(block_exponents, dtype=torch.float32))
        rows = (rows.view(n, -1, 64) * scale[:, None]).view(n, DIM)
    slots = torch.arange(n)
    ref_layout = "3D" if layout == "3d" else layout
    if record == "bf16":
        cpu = alloc_plain_pool(
            num_pages,
            page_size,
            layout=ref_layout,
            page_span=page_size + pad,
            generator=g,
        )
        write_plain_pool(cpu, slots, rows, "NHD" if layout == "NHD" else "HND")
        held = rows.to(torch.bfloat16).double()
    else:
        cpu = alloc_fp8_ds_mla_pool(
            num_pages,
            page_size,
            layout=ref_layout,
            page_stride_bytes=page_size * 584 + pad,
            generator=g,
        )
        write_fp8_ds_mla(cpu, slots, rows)
        held = read_fp8_ds_mla(cpu, slots).double()
    return Pool(_to_device_keep_strides(cpu), held.to(_device()))


def make_indices(
    num_tokens: int,
    cap: int,
    num_pages: int,
    page_size: int,
    lens: torch.Tensor,
    g: torch.Generator,
    holes: bool = True,
) -> torch.Tensor:
    """Slot ids through a shuffled block table; ``-1`` holes inside the live
    prefix and random junk (valid slot ids) past it."""
    block_table = torch.randperm(num_pages, generator=g)
    logical = torch.randint(0, num_pages * page_size, (num_tokens, cap), generator=g)
    slots = block_table[logical // page_size] * page_size + logical % page_size
    if holes:
        slots[torch.rand(num_tokens, cap, generator=g) < 0.1] = -1
    # Past the live length: valid-looking slots that must still be ignored.
    return slots.to(torch.int32).view(num_tokens, 1, cap).to(_device())


def reference(
    q: torch.Tensor,
    segments: list[tuple[Pool, torch.Tensor, torch.Tensor]],
    sm_scale: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Dense float64 softmax over the live candidates of all segments."""
    qd = q.double()
    keys, masks = [], []
    for pool, idx, lens in segments:
        idx2 = idx[:, 0, :].long()
        pos = torch.arange(idx2.shape[1], device=idx2.device)
        live = (pos[None, :] < lens[:, None].long()) & (idx2 >= 0)
        keys.append(pool.rows[idx2.clamp_min(0)])
        masks.append(live)
    kv = torch.cat(keys, dim=1)  # [T, N, 512]
    live = torch.cat(masks, dim=1)  # [T, N]
    logits = torch.einsum("thd,tnd->thn", qd, kv) * sm_scale
    logits = logits.masked_fill(~live[:, None, :], float("-inf"))
    if sinks is not None:
        sink_col = sinks.double()[None, :, None].expand(q.shape[0], -1, 1)
        logits = torch.cat([logits, sink_col], dim=-1)
    m = logits.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(logits - m)
    denom = p.sum(-1, keepdim=True)
    if sinks is not None:
        p = p[..., :-1]
    out = torch.einsum("thn,tnd->thd", p, kv)
    return torch.where(denom > 0, out / denom.clamp_min(1e-300), 0.0)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def make_case(
    num_tokens: int,
    heads: int,
    record: str,
    both: bool,
    with_sinks: bool,
    seed: int,
    swa_cap: int = 128,
    cmp_cap: int = 512,
    layout: str = "NHD",
    pad: int = 0,
    cmp_record: str | None = None,
    block_exponents: tuple[int, ...] | None = None,
):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = (torch.randn(num_tokens, heads, DIM, generator=g)).to(torch.bfloat16)
    q = q.to(_device())
    swa = make_pool(24, 64, record, layout, pad, seed + 1, block_exponents)
    swa_lens = torch.randint(0, swa_cap + 1, (num_tokens,), generator=g)
    swa_lens[0] = swa_cap
    swa_idx = make_indices(num_tokens, swa_cap, 24, 64, swa_lens, g)
    segments = [(swa, swa_idx, swa_lens.to(torch.int32).to(_device()))]
    if both:
        cmp = make_pool(
            40, 32, cmp_record or record, layout, pad, seed + 2, block_exponents
        )
        cmp_lens = torch.randint(0, cmp_cap + 1, (num_tokens,), generator=g)
        cmp_lens[-1] = cmp_cap
        cmp_idx = make_indices(num_tokens, cmp_cap, 40, 32, cmp_lens, g)
        segments.append((cmp, cmp_idx, cmp_lens.to(torch.int32).to(_device())))
    sinks = None
    if with_sinks:
        sinks = torch.randn(heads, generator=g) * 3.0
        sinks[::5] = float("-inf")
        sinks = sinks.to(_device())
    return q, segments, sinks


def run_kernel(
    q: torch.Tensor,
    segments: list,
    sinks: torch.Tensor | None,
    sm_scale: float,
    layout: str = "NHD",
    out: torch.Tensor | None = None,
    tile: tuple | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """The public op, or with ``tile`` / ``num_splits`` a plan made for them
    (the launcher's default for whichever is not given)."""
    if out is None:
        out = torch.full_like(q, float("nan"))
    swa, swa_idx, swa_lens = segments[0]
    kwargs = {}
    if len(segments) > 1:
        cmp, cmp_idx, cmp_lens = segments[1]
        kwargs = dict(
            compressed_kv_cache=cmp.cache,
            extra_sparse_indices=cmp_idx,
            extra_sparse_topk_lens=cmp_lens,
        )
    if tile is None and num_splits is None:
        return triton_sparse_mla_dsv41(
            q,
            swa.cache,
            swa_idx,
            swa_lens,
            out,
            sm_scale,
            sinks=sinks,
            kv_layout=layout,
            **kwargs,
        )
    tensors = (
        sinks,
        kwargs.get("compressed_kv_cache"),
        kwargs.get("extra_sparse_indices"),
        kwargs.get("extra_sparse_topk_lens"),
    )
    geometry = kernels._geometry(q, swa.cache, swa_idx, out, *tensors, layout)
    default = kernels._default_plan(geometry)
    plan = kernels._make_plan(
        geometry,
        default.tile if tile is None else kernels._Tile(*tile),
        default.num_splits if num_splits is None else num_splits,
    )
    return kernels._run(plan, q, swa.cache, swa_idx, swa_lens, out, sm_scale, *tensors)


SM_SCALE = 512**-0.5


@pytest.mark.parametrize("heads", [16, 24, 64, 128])
@pytest.mark.parametrize("record", ["fp8", "bf16"])
@pytest.mark.parametrize("both", [False, True])
@pytest.mark.parametrize("num_tokens", [3, 160])
def test_matches_reference(heads: int, record: str, both: bool, num_tokens: int):
    seed = heads * 1000 + num_tokens * 10 + both * 2 + (record == "fp8")
    q, segments, sinks = make_case(num_tokens, heads, record, both, True, seed)
    out = run_kernel(q, segments, sinks, SM_SCALE)
    ref = reference(q, segments, SM_SCALE, sinks)
    assert not torch.isnan(out).any(), "unwritten or NaN outputs"
    assert rel_err(out, ref) < RTOL


# (block_h, num_warps, block_n, dv_splits[, max_regs]): every tile the launcher may
# pick, the smaller candidate chunk, and the output dims split over programs.
TILES = [
    (64, 8, 32, 1),
    (64, 8, 64, 1),
    (64, 8, 16, 1),
    (128, 8, 32, 2),
    (128, 8, 16, 2),
    (64, 4, 16, 2),
    (32, 8, 32, 1),
    (16, 4, 32, 1),
    (16, 4, 16, 1),
    # Register caps that fit three or four programs on a multiprocessor.
    (16, 4, 16, 1, 168),
    (16, 4, 32, 1, 168),
    (16, 4, 16, 1, 128),
]


@pytest.mark.parametrize("num_splits", [1, 3, 10])
@pytest.mark.parametrize("heads", [40, 128])
@pytest.mark.parametrize("tile", TILES)
def test_launch_configs_agree(num_splits: int, heads: int, tile):
    """Every way of cutting the heads and the candidate list must give the
    same answer, including head blocks that are partly past the last head and
    splits that straddle the segment boundary or hold no live candidate for
    some rows."""
    q, segments, sinks = make_case(4, heads, "fp8", True, True, seed=7)
    ref = reference(q, segments, SM_SCALE, sinks)
    out = run_kernel(q, segments, sinks, SM_SCALE, tile=tile, num_splits=num_splits)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < RTOL


# Per-block magnitudes whose UE8M0 scale bytes span 2 ** -40 .. 2 ** +40:
# above 134 (the bit-level path's second factor), far below 127, and blocks
# whose small values quantise to FP8 subnormals.
WIDE_EXPONENTS = (-40, -12, 0, 3, 9, 20, 40, 0)


@pytest.mark.parametrize("heads,num_splits", [(16, 1), (64, 3), (128, 1)])
def test_fp8_dequantisation_over_the_scale_range(heads: int, num_splits: int):
    """The bit-level E4M3 -> BF16 path with UE8M0 scales 2 ** -40 .. 2 ** 40:
    every 64-column block matches the float64 reference at its own
    magnitude (a scale off by one power of two misses it by far)."""
    q, segments, sinks = make_case(
        5, heads, "fp8", True, True, seed=43, block_exponents=WIDE_EXPONENTS
    )
    # Keep the logits moderate: the 2 ** 40 block dominates q.k.
    scale = 2.0**-44
    out = run_kernel(q, segments, sinks, scale, num_splits=num_splits)
    assert not torch.isnan(out).any()
    ref = reference(q, segments, scale, sinks)
    for block, e in enumerate(WIDE_EXPONENTS):
        cols = slice(64 * block, 64 * block + 64)
        assert rel_err(out[..., cols], ref[..., cols]) < RTOL, (block, e)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_empty_rows_give_zeros(num_splits: int):
    q, segments, sinks = make_case(6, 24, "fp8", True, True, seed=11)
    _, swa_idx, swa_lens = segments[0]
    _, cmp_idx, cmp_lens = segments[1]
    # Row 1: zero lengths. Row 2: all slots -1. Row 3: only the sink.
    swa_lens[1] = 0
    cmp_lens[1] = 0
    swa_idx[2] = -1
    cmp_idx[2] = -1
    swa_lens[3] = 0
    cmp_idx[3] = -1
    out = run_kernel(q, segments, sinks, SM_SCALE, num_splits=num_splits)
    assert not torch.isnan(out).any()
    assert (out[1:4] == 0).all()
    ref = reference(q, segments, SM_SCALE, sinks)
    assert rel_err(out, ref) < RTOL
    assert out[0].abs().sum() > 0


def test_past_length_slots_are_ignored():
    """Changing slots past a row's length must not change its output."""
    q, segments, sinks = make_case(5, 16, "fp8", True, False, seed=13)
    out_a = run_kernel(q, segments, sinks, SM_SCALE)
    for _, idx, lens in segments:
        for t in range(idx.shape[0]):
            n = int(lens[t])
            idx[t, 0, n:] = torch.flip(idx[t, 0, n:], dims=[0])
    out_b = run_kernel(q, segments, sinks, SM_SCALE)
    assert torch.equal(out_a, out_b)
    assert rel_err(out_a, reference(q, segments, SM_SCALE, sinks)) < RTOL


def test_sinks_change_the_result():
    """Without the sink the output differs; with it, it matches the reference."""
    q, segments, sinks = make_case(8, 32, "bf16", True, True, seed=17)
    sinks = torch.full_like(sinks, 10.0)
    out = run_kernel(q, segments, sinks, SM_SCALE)
    ref_sink = reference(q, segments, SM_SCALE, sinks)
    ref_none = reference(q, segments, SM_SCALE, None)
    # The sink must carry a visible share of the softmax mass for this to
    # test anything.
    assert rel_err(ref_sink, ref_none) > 0.2
    assert rel_err(out, ref_sink) < RTOL


@pytest.mark.parametrize("layout", ["NHD", "HND", "3d"])
@pytest.mark.parametrize("record", ["fp8", "bf16"])
def test_padded_pools_and_layouts(layout: str, record: str):
    pad = 4096 if record == "fp8" else 3
    q, segments, sinks = make_case(
        9, 64, record, True, True, seed=19, layout=layout, pad=pad
    )
    out = run_kernel(
        q, segments, sinks, SM_SCALE, layout="NHD" if layout == "3d" else layout
    )
    assert not torch.isnan(out).any()
    assert rel_err(out, reference(q, segments, SM_SCALE, sinks)) < RTOL


@pytest.mark.parametrize("tokens,heads", [(10, 64), (40, 128)])
def test_mixed_pool_formats(tokens: int, heads: int):
    q, segments, sinks = make_case(
        tokens, heads, "bf16", True, True, seed=23, cmp_record="fp8"
    )
    out = run_kernel(q, segments, sinks, SM_SCALE)
    assert rel_err(out, reference(q, segments, SM_SCALE, sinks)) < RTOL


@pytest.mark.parametrize("record", ["fp8", "bf16"])
@pytest.mark.parametrize("tokens,heads", [(3, 64), (40, 128)])
def test_tiles_for_99_kb_gpus(monkeypatch, tokens: int, heads: int, record: str):
    """The launcher's tiles for GPUs with 99 KB of shared memory per block
    (L40S, RTX 50xx, GB10), run here by making this GPU report that limit."""
    monkeypatch.setattr(kernels, "get_max_shared_memory_bytes", lambda index: 99 * 1024)
    # Plans made under this GPU's own limit would otherwise be reused.
    monkeypatch.setattr(kernels, "_plans", {})
    q, segments, sinks = make_case(tokens, heads, record, True, True, seed=31)
    out = run_kernel(q, segments, sinks, SM_SCALE)
    assert not torch.isnan(out).any()
    assert rel_err(out, reference(q, segments, SM_SCALE, sinks)) < RTOL


@pytest.mark.parametrize("num_tokens", [2, 64])
def test_cuda_graph_replay_sees_new_inputs(num_tokens: int):
    """Capture once, then replay with new queries, indices, lengths and
    sinks copied into the captured buffers."""
    q, segments, sinks = make_case(num_tokens, 64, "fp8", True, True, seed=29)
    (swa, swa_idx, swa_lens), (cmp, cmp_idx, cmp_lens) = segments
    out = torch.full_like(q, float("nan"))

    def call():
        triton_sparse_mla_dsv41(
            q,
            swa.cache,
            swa_idx,
            swa_lens,
            out,
            SM_SCALE,
            sinks=sinks,
            compressed_kv_cache=cmp.cache,
            extra_sparse_indices=cmp_idx,
            extra_sparse_topk_lens=cmp_lens,
        )

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()

    for seed in (31, 37):
        q2, seg2, sinks2 = make_case(num_tokens, 64, "fp8", True, True, seed=seed)
        # The pools stay (they are captured by address); new rows reach the
        # kernel only through new slot ids, as in serving.
        q.copy_(q2)
        swa_idx.copy_(seg2[0][1])
        swa_lens.copy_(seg2[0][2])
        cmp_idx.copy_(seg2[1][1])
        cmp_lens.copy_(seg2[1][2])
        sinks.copy_(sinks2)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference(q, segments, SM_SCALE, sinks)
        assert not torch.isnan(out).any()
        assert rel_err(out, ref) < RTOL


def test_float8_pools_read_as_their_bytes():
    """A packed pool handed over as float8_e4m3fn (how FP8 KV caches are
    typed) gives the output its uint8 view gives, bit for bit."""
    q, segments, sinks = make_case(5, 64, "fp8", True, True, seed=41)
    as_bytes = run_kernel(q, segments, sinks, SM_SCALE)
    typed = [
        (Pool(pool.cache.view(torch.float8_e4m3fn), pool.rows), i, n)
        for pool, i, n in segments
    ]
    as_fp8 = run_kernel(q, typed, sinks, SM_SCALE)
    assert torch.equal(as_fp8, as_bytes)
    assert rel_err(as_fp8, reference(q, segments, SM_SCALE, sinks)) < RTOL


@pytest.mark.parametrize("num_tokens,heads", [(1, 8), (4, 16), (3, 64), (160, 128)])
def test_repeated_calls_allocate_nothing(num_tokens: int, heads: int):
    """After a geometry's first call (which plans it), calls allocate no GPU
    memory, split decode shapes included, and stay correct."""
    q, segments, sinks = make_case(num_tokens, heads, "fp8", True, True, seed=43)
    out = run_kernel(q, segments, sinks, SM_SCALE)
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    for _ in range(3):
        run_kernel(q, segments, sinks, SM_SCALE, out=out)
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before
    assert rel_err(out, reference(q, segments, SM_SCALE, sinks)) < RTOL


@pytest.fixture
def two_lane_workspace():
    """vLLM's workspace manager with two lanes, as a worker running two
    micro-batches has two owners of scratch."""
    from vllm.v1.worker import workspace

    workspace.init_workspace_manager(_device(), num_lanes=2)
    yield workspace
    workspace.reset_workspace_manager()


def test_two_streams_at_once_keep_their_partials(two_lane_workspace):
    """Two split decode calls of different inputs run at the same time on
    two streams, each in its own workspace lane, many times over: each
    output matches its own reference every time (one shared partial-result
    buffer would mix the two calls' rows)."""
    cases = [make_case(2, 64, "fp8", True, True, seed=s) for s in (47, 53)]
    refs = [reference(q, seg, SM_SCALE, sinks) for q, seg, sinks in cases]
    outs = [torch.full_like(q, float("nan")) for q, _, _ in cases]
    streams = [torch.cuda.Stream() for _ in cases]
    worst = 0.0
    for _ in range(30):
        # Both streams wait behind this sleep until both calls are queued,
        # so the two calls' kernels start together.
        torch.cuda._sleep(1_000_000)
        for lane, ((q, seg, sinks), out, stream) in enumerate(
            zip(cases, outs, streams, strict=True)
        ):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), two_lane_workspace.use_workspace_lane(lane):
                # num_splits: the split path, whatever the GPU's size.
                run_kernel(q, seg, sinks, SM_SCALE, out=out, num_splits=10)
        torch.cuda.synchronize()
        worst = max(worst, *(rel_err(o, r) for o, r in zip(outs, refs, strict=True)))
    assert worst < RTOL
