# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Time the Triton DSV4 sparse-MLA kernel against its roofline floor and the
FlashMLA sparse FP8 decode vLLM ships (where it loads: SM90, SM100), on the
same pages.

Decode: tokens {1, 2, 4, 8, 32, 128, 256} x heads {8, 16, 32, 64, 128}
(DeepSeek V4.1 Flash's 64 heads at TP 8/4/2/1, and 128), each token with an
SWA segment of 128 and a compressed top-k segment of 512 candidates, packed
FP8 (584-byte fp8_ds_mla) records, sinks on. DSpark decode: requests of
``DSPARK_QUERY_TOKENS`` query tokens that all see one SWA index row (the
non-causal window: the trailing 128 slots plus the request's query tokens,
padded to the width ``get_dspark_swa_index_width`` gives), SWA only, as the
DSpark draft layer calls the kernel. Prefill: one larger token count.
Accuracy of every kernel is against a float64 reference over the
dequantised rows.

    python benchmarks/kernels/benchmark_dsv41_sparse_mla.py \
        --out-dir benchmarks/results [--check-targets]

FlashMLA (flashmla_peer.py) is timed in the same run on the same pools, slot
ids, lengths and sinks, each token as its own batch entry as vLLM calls it;
its per-step planning, its output buffer and the padding of fewer than 64
heads to 64 are made once, outside the timed region. ``--check-targets``
fails the run where a row's ratio to FlashMLA misses ``TARGETS``.

Peers beside FlashMLA's decode, in the same process on the same inputs:
vLLM's small-head Triton decode (``--small-head PATH``: a copy of an upstream
branch's file kept outside the repository, loaded by path, its sha256
recorded; absent without it; small_head_peer.py), and, for the prefill rows
(1K/4K/16K query tokens of one request after 8,192 earlier ones), FlashMLA's
sparse prefill as vLLM's FlashMLA layer runs it: vLLM's dequantize-and-gather
into a BF16 workspace plus ``flash_mla_sparse_fwd``, timed together and the
kernel alone. Every kernel's error against float64 and its share of the
memory floor (this GPU's measured copy bandwidth) are in each row.

Writes dsv41_sparse_mla_<gpu>.json (after every row) and .md.
"""

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys

import torch
import triton

import vllm.v1.attention.ops.triton_dsv41_sparse_mla as kernel_module

# The kernel module under test; --kernel swaps in another copy of it (a
# variant file) for side-by-side timing of versions in one run.
K = kernel_module

# Ceilings measured on this workplace's H200 (device copy and dense BF16 GEMM).
# A run measures the copy bandwidth of its own GPU first (--peak-bw 0) and
# uses that for the memory floor.
PEAK_BW = 4.3e12
PEAK_FLOPS = 790e12
SWA_CAP = 128
CMP_CAP = 512
WINDOW = 128
DSPARK_QUERY_TOKENS = 5
PAGE = 64
RECORD = 584
# The least FlashMLA time / ours each decode row must reach, by heads
# (FlashMLA pads fewer than 64 heads to 64), and each DSpark row.
TARGETS = {8: 1.3, 16: 1.3, 32: 1.1, 64: 1.0, 128: 0.9}
DSPARK_TARGET = 1.0
# The least small-head decode time / ours (decode rows at 8 and 16 heads),
# and FlashMLA sparse prefill kernel time / ours (prefill rows at 8-32 heads).
SMALL_HEAD_TARGET = 1.2
PREFILL_TARGETS = {8: 1.0, 16: 1.0, 32: 1.0}
# Prefill rows: one request whose query tokens follow this many earlier
# tokens; its compressed cache holds one entry per COMPRESS_RATIO tokens.
PREFILL_CONTEXT = 8192
COMPRESS_RATIO = 4


def make_pool(num_pages: int, g: torch.Generator) -> torch.Tensor:
    """Random, valid packed pool: FP8 values in range, UE8M0 scales near 1,
    finite BF16 RoPE values."""
    page_bytes = PAGE * RECORD
    buf = torch.empty((num_pages, page_bytes), dtype=torch.uint8, device="cuda")
    vals = buf[:, : PAGE * 576].view(num_pages, PAGE, 576)
    fp8 = torch.randn(num_pages, PAGE, 448, device="cuda", generator=g) * 40
    vals[:, :, :448] = fp8.to(torch.float8_e4m3fn).view(torch.uint8)
    rope = torch.randn(num_pages, PAGE, 64, device="cuda", generator=g)
    vals[:, :, 448:] = rope.to(torch.bfloat16).view(torch.uint8)
    scales = buf[:, PAGE * 576 :].view(num_pages, PAGE, 8)
    scales[:] = torch.randint(
        120, 124, (num_pages, PAGE, 8), device="cuda", generator=g
    ).to(torch.uint8)
    scales[:, :, 7] = 0
    return buf.as_strided((num_pages, PAGE, 1, RECORD), (page_bytes, RECORD, RECORD, 1))


# --dspark-swa-width: where vLLM's module cannot be imported (a bare host
# with vLLM's Python files only), the width it gives, read elsewhere.
_DSPARK_SWA_WIDTH: int | None = None


def dspark_swa_width() -> int:
    """The SWA index width of DSpark's non-causal decode, from vLLM."""
    if _DSPARK_SWA_WIDTH is not None:
        return _DSPARK_SWA_WIDTH
    from vllm.v1.attention.backends.mla.compressor_utils import (
        get_dspark_swa_index_width,
    )

    return get_dspark_swa_index_width(WINDOW, DSPARK_QUERY_TOKENS)


def make_inputs(tokens: int, heads: int, seed: int = 0, dspark: bool = False):
    """One step's inputs. ``dspark``: ``tokens`` is a multiple of
    DSPARK_QUERY_TOKENS; each request's tokens share their SWA row (window
    plus the request's queries live, the rest of the padded width -1) and
    there is no compressed segment."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    swa_cap = dspark_swa_width() if dspark else SWA_CAP
    # Pools far larger than the 60 MB L2, so rows come from HBM.
    swa_pages = max(64, tokens * swa_cap // PAGE * 4)
    cmp_pages = 4096
    swa = make_pool(swa_pages, g)
    q = torch.randn(tokens, heads, 512, device="cuda", generator=g)
    q = q.to(torch.bfloat16)
    rows = tokens // DSPARK_QUERY_TOKENS if dspark else tokens
    swa_idx = torch.randint(
        0, swa_pages * PAGE, (rows, 1, swa_cap), device="cuda", generator=g
    ).to(torch.int32)
    live = min(WINDOW + DSPARK_QUERY_TOKENS, swa_cap) if dspark else SWA_CAP
    swa_idx[:, :, live:] = -1
    if dspark:
        swa_idx = swa_idx.repeat_interleave(DSPARK_QUERY_TOKENS, 0)
    swa_lens = torch.full((tokens,), live, dtype=torch.int32, device="cuda")
    x = dict(
        query=q,
        swa=swa,
        swa_idx=swa_idx,
        swa_lens=swa_lens,
        cmp=None,
        cmp_idx=None,
        cmp_lens=None,
        sinks=torch.randn(heads, device="cuda", generator=g),
        out=torch.empty_like(q),
        scale=512**-0.5,
    )
    if not dspark:
        x["cmp"] = make_pool(cmp_pages, g)
        x["cmp_idx"] = torch.randint(
            0, cmp_pages * PAGE, (tokens, 1, CMP_CAP), device="cuda", generator=g
        ).to(torch.int32)
        x["cmp_lens"] = torch.full((tokens,), CMP_CAP, dtype=torch.int32, device="cuda")
    return x


def make_prefill_inputs(tokens: int, heads: int, seed: int = 0) -> dict:
    """One request's prefill chunk: ``tokens`` query tokens at positions
    PREFILL_CONTEXT.. of one sequence. Each token sees the WINDOW SWA slots
    ending at itself and CMP_CAP distinct compressed entries among those its
    position has completed (a random top-k). Pages of both caches are a random
    permutation of larger pools. Besides the op's inputs (global slot ids),
    ``prefill`` holds what vLLM's FlashMLA layer works from: block tables and
    each token's positions in the BF16 workspace its gathers fill (the
    compressed rows first, then the SWA rows from the first one any token
    sees)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = torch.device("cuda")
    seq_len = PREFILL_CONTEXT + tokens
    n_cmp = seq_len // COMPRESS_RATIO
    swa_used, cmp_used = -(-seq_len // PAGE), -(-n_cmp // PAGE)
    swa_pool, cmp_pool = 2 * swa_used, max(2 * cmp_used, 64)
    swa, cmp = make_pool(swa_pool, g), make_pool(cmp_pool, g)

    def table(pool_pages: int, used: int) -> torch.Tensor:
        perm = torch.randperm(pool_pages, generator=g, device=dev)
        return perm[:used].to(torch.int32)[None]

    swa_table, cmp_table = table(swa_pool, swa_used), table(cmp_pool, cmp_used)

    def slots(tab: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return (tab[0, pos // PAGE].long() * PAGE + pos % PAGE).to(torch.int32)

    pos = PREFILL_CONTEXT + torch.arange(tokens, device=dev)
    swa_pos = pos[:, None] - (WINDOW - 1) + torch.arange(WINDOW, device=dev)
    visible = (pos + 1) // COMPRESS_RATIO
    entries = torch.empty(tokens, CMP_CAP, dtype=torch.long, device=dev)
    col = torch.arange(n_cmp, device=dev)
    for t0 in range(0, tokens, 1024):
        v = visible[t0 : t0 + 1024]
        r = torch.rand(v.shape[0], n_cmp, generator=g, device=dev)
        r.masked_fill_(col[None] >= v[:, None], 2.0)
        entries[t0 : t0 + 1024] = r.topk(CMP_CAP, dim=1, largest=False).indices
    swa_gather = tokens + WINDOW - 1
    ws_idx = torch.cat([entries, n_cmp + swa_pos - (seq_len - swa_gather)], 1)
    q = torch.randn(tokens, heads, 512, device=dev, generator=g).to(torch.bfloat16)
    full = lambda n: torch.full((tokens,), n, dtype=torch.int32, device=dev)  # noqa: E731
    return dict(
        query=q,
        swa=swa,
        swa_idx=slots(swa_table, swa_pos)[:, None],
        swa_lens=full(WINDOW),
        cmp=cmp,
        cmp_idx=slots(cmp_table, entries)[:, None],
        cmp_lens=full(CMP_CAP),
        sinks=torch.randn(heads, device=dev, generator=g),
        out=torch.empty_like(q),
        scale=512**-0.5,
        prefill=dict(
            seq_len=seq_len,
            n_cmp=n_cmp,
            swa_gather=swa_gather,
            page=PAGE,
            swa_table=swa_table,
            cmp_table=cmp_table,
            ws_idx=ws_idx.to(torch.int32),
            ws_lens=full(CMP_CAP + WINDOW),
        ),
    )


def segments(x) -> list[tuple]:
    """(pool, [T, N] slot ids, live lengths) of each segment present."""
    segs = [(x["swa"], x["swa_idx"][:, 0], x["swa_lens"])]
    if x["cmp"] is not None:
        segs.append((x["cmp"], x["cmp_idx"][:, 0], x["cmp_lens"]))
    return segs


def run_triton(x, tile: tuple | None = None, num_splits: int | None = None):
    """The public op, or a plan made for ``tile`` / ``num_splits`` (sweeps)."""
    tensors = (x["sinks"], x["cmp"], x["cmp_idx"], x["cmp_lens"])
    if tile is None and num_splits is None:
        return K._launch(
            x["query"], x["swa"], x["swa_idx"], x["swa_lens"], x["out"],
            x["scale"], *tensors, "NHD",
        )  # fmt: skip
    geometry = K._geometry(
        x["query"], x["swa"], x["swa_idx"], x["out"], *tensors, "NHD"
    )
    default = K._default_plan(geometry)
    plan = K._make_plan(
        geometry,
        default.tile if tile is None else K._Tile(*tile),
        default.num_splits if num_splits is None else num_splits,
    )
    return K._run(
        plan, x["query"], x["swa"], x["swa_idx"], x["swa_lens"], x["out"],
        x["scale"], *tensors,
    )  # fmt: skip


def default_config(tokens: int, heads: int, swa_cap: int, cmp_cap: int) -> str:
    """The launch configuration the kernel picks by itself, for the table."""
    tile = K._default_tile(
        tokens,
        heads,
        True,
        K.get_max_shared_memory_bytes(torch.cuda.current_device()),
    )
    chunks = -(-swa_cap // tile.block_n) - (-cmp_cap // tile.block_n)
    base = tokens * -(-heads // tile.block_h) * tile.dv_splits
    splits = K._default_splits(
        base, chunks, torch.device("cuda"), K._programs_per_sm(tile)
    )
    splits, _ = K._even_splits(chunks, splits)
    return _tile_name(tile, splits)


def _tile_name(tile: tuple, splits: int) -> str:
    regs = f" r{tile[4]}" if len(tile) > 4 and tile[4] else ""
    return f"bh{tile[0]} w{tile[1]} bn{tile[2]} dv/{tile[3]}{regs} s{splits}"


def cost(tokens: int, heads: int, n: int = SWA_CAP + CMP_CAP) -> tuple[float, float]:
    """FLOPs and bytes of a step whose tokens each attend to ``n`` rows."""
    flops = 2.0 * heads * n * (512 + 512) * tokens
    # Each candidate record once, its index, the query and the output.
    bytes_ = tokens * (n * (RECORD + 4) + 2 * heads * 512 * 2 + 8)
    return flops, bytes_


def bench(fn, rep_ms: int = 200) -> float:
    """Median milliseconds of one call replayed from a CUDA graph.

    Graph replay keeps Python launch overhead (larger than the kernel itself
    at small sizes) out of the number, as in vLLM's captured decode. do_bench
    clears L2 before every timed replay, so rows come from HBM.
    """
    fn()  # compile and allocate outside the capture
    if not GRAPHS:
        return triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError as e:
        # Timed eagerly instead; the row's "eager" list names it.
        print(f"graph capture failed ({str(e)[:120]}); timing eager calls")
        EAGER.append(getattr(fn, "__qualname__", str(fn)))
        torch.cuda.synchronize()
        return triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")
    return triton.testing.do_bench(
        graph.replay, warmup=25, rep=rep_ms, return_mode="median"
    )


# --no-graphs: time eager calls instead of graph replays.
GRAPHS = True
# Calls that could not be captured and were timed eagerly.
EAGER: list[str] = []


def measure_copy_bw() -> float:
    """Device-to-device copy bandwidth of this GPU (bytes read + written per
    second), median over a 1 GiB copy."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), return_mode="median")
    return 2 * (1 << 30) / (ms * 1e-3)


def _dequant_f64(pool: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """[T, N] slot ids -> [T, N, 512] float64 rows, independent of both
    kernels: FP8 through torch's float8 cast, scales as float64 powers of 2."""
    flat = pool.as_strided((pool.shape[0], PAGE * RECORD), (pool.stride(0), 1))
    page = (idx // PAGE).long()
    off = (idx % PAGE).long()
    vals = flat[:, : PAGE * 576].reshape(-1, PAGE, 576)[page, off]
    scl = flat[:, PAGE * 576 :].reshape(-1, PAGE, 8)[page, off, :7]
    nope = vals[..., :448].view(torch.float8_e4m3fn).double()
    nope = nope.unflatten(-1, (7, 64)) * torch.exp2(scl.double() - 127)[..., None]
    rope = vals[..., 448:].contiguous().view(torch.bfloat16).double()
    return torch.cat([nope.flatten(-2), rope], dim=-1)


def reference_f64(x, chunk: int = 128) -> torch.Tensor:
    """Sparse attention with sinks in float64 (live prefixes, -1 holes),
    computed ``chunk`` tokens at a time to bound its memory."""
    q = x["query"].double()
    out = torch.empty_like(q)
    for t0 in range(0, q.shape[0], chunk):
        sl = slice(t0, t0 + chunk)
        segs = []
        for pool, idx, lens in segments(x):
            idx, lens = idx[sl], lens[sl]
            pos = torch.arange(idx.shape[1], device=idx.device)
            live = (pos[None] < lens[:, None]) & (idx >= 0)
            segs.append((_dequant_f64(pool, idx.clamp_min(0)), live))
        kv = torch.cat([s[0] for s in segs], 1)
        live = torch.cat([s[1] for s in segs], 1)
        logits = torch.einsum("thd,tnd->thn", q[sl], kv) * x["scale"]
        logits = logits.masked_fill(~live[:, None], float("-inf"))
        sink = x["sinks"].double()[None, :, None].expand(logits.shape[0], -1, 1)
        p = torch.softmax(torch.cat([logits, sink], -1), -1)[..., :-1]
        out[sl] = torch.einsum("thn,tnd->thd", p, kv)
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double()
    if torch.isnan(out).any():
        return float("nan")
    return ((out - ref).norm() / ref.norm()).item()


def check(x, ref: torch.Tensor, **cfg) -> float:
    x["out"].fill_(float("nan"))
    return rel_err(run_triton(x, **cfg), ref)


def point(
    tokens: int,
    heads: int,
    kind: str,
    rep_ms: int = 200,
    peer=None,
    small_head=None,
    prefill_peer=None,
    **cfg,
) -> dict:
    if kind == "prefill" and prefill_peer is not None:
        x = make_prefill_inputs(tokens, heads)
    else:
        x = make_inputs(tokens, heads, dspark=kind == "dspark")
    swa_cap = x["swa_idx"].shape[-1]
    cmp_cap = 0 if x["cmp"] is None else x["cmp_idx"].shape[-1]
    ref = reference_f64(x)
    err = check(x, ref, **cfg)
    t_ms = bench(lambda: run_triton(x, **cfg), rep_ms)
    # Live rows per token (DSpark's padding past them is skipped unread).
    live = int(x["swa_lens"][0]) + (0 if x["cmp"] is None else int(x["cmp_lens"][0]))
    flops, bytes_ = cost(tokens, heads, live)
    floor_s = max(bytes_ / PEAK_BW, flops / PEAK_FLOPS)
    row = dict(
        kind=kind,
        tokens=tokens,
        heads=heads,
        candidates=live,
        config=(
            _tile_name(cfg["tile"], cfg["num_splits"])
            if cfg
            else default_config(tokens, heads, swa_cap, cmp_cap)
        ),
        time_us=t_ms * 1e3,
        tflops=flops / (t_ms * 1e-3) / 1e12,
        bytes=bytes_,
        gbps=bytes_ / (t_ms * 1e-3) / 1e9,
        floor_us=floor_s * 1e6,
        bound="memory" if bytes_ / PEAK_BW >= flops / PEAK_FLOPS else "compute",
        pct_of_floor=100.0 * floor_s / (t_ms * 1e-3),
        rel_err_f64=err,
    )
    if small_head is not None and kind != "prefill" and small_head.supports(heads):
        run_small = small_head.prepare(x)
        row["small_head_rel_err_f64"] = rel_err(run_small(), ref)
        t_small = bench(run_small, rep_ms)
        row["small_head_us"] = t_small * 1e3
        row["small_head_pct_of_floor"] = 100.0 * floor_s / (t_small * 1e-3)
        row["speed_vs_small_head"] = t_small / t_ms
        if kind == "decode":
            row["small_head_target"] = SMALL_HEAD_TARGET
    if prefill_peer is not None and kind == "prefill":
        both, kernel_only = prefill_peer.prepare(x)
        row["flashmla_prefill_rel_err_f64"] = rel_err(both(), ref)
        t_both = bench(both, rep_ms)
        t_kernel = bench(kernel_only, rep_ms)
        row["flashmla_prefill_us"] = t_kernel * 1e3
        row["flashmla_gather_prefill_us"] = t_both * 1e3
        row["flashmla_prefill_pct_of_floor"] = 100.0 * floor_s / (t_kernel * 1e-3)
        row["flashmla_prefill_tflops"] = flops / (t_kernel * 1e-3) / 1e12
        row["speed_vs_flashmla_prefill"] = t_kernel / t_ms
        row["speed_vs_flashmla_gather_prefill"] = t_both / t_ms
        row["prefill_target"] = PREFILL_TARGETS.get(heads)
    if peer is not None and heads <= 128 and kind != "prefill":
        run_peer = peer.prepare(x)
        row["flashmla_rel_err_f64"] = rel_err(run_peer(), ref)
        t_peer = bench(run_peer, rep_ms)
        row["flashmla_us"] = t_peer * 1e3
        row["flashmla_heads"] = 64 if heads <= 64 else 128
        row["flashmla_pct_of_floor"] = 100.0 * floor_s / (t_peer * 1e-3)
        # > 1: ours is faster.
        row["speed_vs_flashmla"] = t_peer / t_ms
        row["target"] = target(kind, heads)
    if EAGER:
        row["eager"] = list(EAGER)
        EAGER.clear()
    x.clear()
    torch.cuda.empty_cache()
    return row


def target(kind: str, heads: int) -> float | None:
    """The ratio to FlashMLA a row must reach (None: no target)."""
    if kind == "dspark":
        return DSPARK_TARGET
    return TARGETS.get(heads) if kind == "decode" else None


def missed_targets(rows: list[dict]) -> list[str]:
    """Each row with a target that it misses or has no FlashMLA time for."""
    missed = []
    for r in rows:
        want = target(r["kind"], r["heads"])
        got = r.get("speed_vs_flashmla")
        if want is not None and (got is None or not got >= want):
            have = "no FlashMLA time" if got is None else f"{got:.2f}"
            missed.append(
                f"{r['kind']} {r['tokens']} tokens x {r['heads']} heads: "
                f"{have} < {want}"
            )
    return missed


def missed_peer_targets(rows: list[dict]) -> list[str]:
    """Rows that miss their ratio to the small-head decode (decode rows at 8
    or 16 heads, when it was given) or to FlashMLA's sparse prefill kernel
    alone (prefill rows at 8-32 heads, when it loaded), or that exceed the
    error budget."""
    missed = []
    for r in rows:
        name = f"{r['kind']} {r['tokens']} tokens x {r['heads']} heads"
        for key, want_key, peer in (
            ("speed_vs_small_head", "small_head_target", "small-head decode"),
            ("speed_vs_flashmla_prefill", "prefill_target", "FlashMLA prefill"),
        ):
            want, got = r.get(want_key), r.get(key)
            if want is not None and got is not None and not got >= want:
                missed.append(f"{name}: {got:.2f} < {want} vs {peer}")
        for key in [k for k in r if k.endswith("rel_err_f64")]:
            if not r[key] < ERR_BUDGET:
                missed.append(f"{name}: {key} {r[key]:.1e} >= {ERR_BUDGET}")
    return missed


# A row counts only where every kernel is this close to float64.
ERR_BUDGET = 1e-2


def _f(r: dict, key: str, fmt: str) -> str:
    v = r.get(key)
    return "-" if v is None else format(v, fmt)


def markdown(meta: dict, rows: list[dict]) -> str:
    peer = any("flashmla_us" in r for r in rows)
    lines = [
        "# DeepSeek V4.1 sparse MLA: Triton kernel on " + meta["gpu"],
        "",
        (
            f"{meta['date']}; {meta['gpu']}, driver {meta['driver']}; torch "
            f"{meta['torch']}, Triton {meta['triton']}; commit {meta['commit']}"
            + (f"; peer: FlashMLA of vLLM {meta['flashmla']}" if peer else "")
            + f". FP8 fp8_ds_mla records, SWA {SWA_CAP} + compressed top-k "
            f"{CMP_CAP} candidates per token, sinks on. Floor = max(bytes / "
            f"{PEAK_BW / 1e12:.1f} TB/s, flops / {PEAK_FLOPS / 1e12:.0f} TFLOP/s); "
            "times are medians of triton.testing.do_bench over CUDA-graph replays "
            "(L2 cleared before each). Errors: ||out - ref|| / ||ref|| against a "
            "float64 reference over the dequantised rows. dspark rows: "
            f"requests of {DSPARK_QUERY_TOKENS} query tokens sharing one "
            f"non-causal SWA row ({WINDOW + DSPARK_QUERY_TOKENS} live slots "
            f"of the padded width {dspark_swa_width()}), no compressed segment."
        ),
    ]
    if peer:
        lines += [
            "",
            (
                "FlashMLA: the sparse FP8 decode vLLM ships (flash_mla_with_kvcache"
                "), timed in this run on the same pools, slot ids, lengths and "
                "sinks, each token its own batch entry (s_q = 1, DSpark's too) as "
                "vLLM's FlashMLA layer calls it. Its per-step planning, output "
                "buffer and the padding of fewer than 64 heads to 64 are made once, "
                "outside the timed region. vs FlashMLA = FlashMLA time / ours (> 1: "
                "ours faster); target: the least it must be."
            ),
        ]
    lines += [
        "",
        (
            "| kind | tokens | heads | ours (us) | FlashMLA (us) | vs FlashMLA "
            "| target | ours err | FlashMLA err | TFLOP/s | % of floor "
            "| launch config |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['kind']} | {r['tokens']} | {r['heads']} | {r['time_us']:.1f} "
            f"| {_f(r, 'flashmla_us', '.1f')} "
            f"| {_f(r, 'speed_vs_flashmla', '.2f')} | {_f(r, 'target', '.1f')} "
            f"| {r['rel_err_f64']:.1e} | {_f(r, 'flashmla_rel_err_f64', '.1e')} "
            f"| {r['tflops']:.1f} | {r['pct_of_floor']:.1f} | {r['config']} |"
        )
    missed = missed_targets(rows)
    lines += ["", "Targets: " + ("; ".join(missed) if missed else "all met") + "."]
    if any("small_head_us" in r for r in rows):
        lines += [
            "",
            (
                "Small-head decode: vLLM's `small_head_sparse_decode` from an "
                f"upstream branch, file sha256 {meta.get('small_head_sha256')}, "
                "loaded from a copy outside the repository and called on the same "
                "inputs (8 or 16 heads only; in vLLM its own gate sends it at most "
                "16 tokens). vs small-head = its time / ours."
            ),
            "",
            (
                "| kind | tokens | heads | ours (us) | small-head (us) "
                "| vs small-head | target | small-head err | ours % of floor "
                "| small-head % of floor |"
            ),
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            if "small_head_us" in r:
                lines.append(
                    f"| {r['kind']} | {r['tokens']} | {r['heads']} "
                    f"| {r['time_us']:.1f} | {r['small_head_us']:.1f} "
                    f"| {r['speed_vs_small_head']:.2f} "
                    f"| {_f(r, 'small_head_target', '.1f')} "
                    f"| {r['small_head_rel_err_f64']:.1e} "
                    f"| {r['pct_of_floor']:.1f} | {r['small_head_pct_of_floor']:.1f} |"
                )
    else:
        lines += ["", "Small-head decode: absent (no --small-head file given)."]
    if any("flashmla_prefill_us" in r for r in rows):
        lines += [
            "",
            (
                f"Prefill: one request, {PREFILL_CONTEXT} earlier tokens, the "
                "query tokens after them; each token sees its "
                f"{WINDOW} SWA slots and {CMP_CAP} of the compressed entries "
                f"(one per {COMPRESS_RATIO} tokens) its position has completed. "
                "FlashMLA as vLLM's FlashMLA layer runs it: "
                f"dequantize_and_gather_k_cache ({meta.get('gather')} path) of the "
                "request's compressed rows and SWA rows into a BF16 workspace, "
                "then flash_mla_sparse_fwd at the local heads (workspace positions "
                "made outside the timed region). gather+kernel and kernel alone "
                "are timed separately; vs = FlashMLA time / ours."
            ),
            "",
            (
                "| tokens | heads | ours (us) | FlashMLA kernel (us) "
                "| gather+kernel (us) | vs kernel | vs gather+kernel | target "
                "| ours err | FlashMLA err | ours TFLOP/s | FlashMLA TFLOP/s |"
            ),
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            if "flashmla_prefill_us" in r:
                lines.append(
                    f"| {r['tokens']} | {r['heads']} | {r['time_us']:.1f} "
                    f"| {r['flashmla_prefill_us']:.1f} "
                    f"| {r['flashmla_gather_prefill_us']:.1f} "
                    f"| {r['speed_vs_flashmla_prefill']:.2f} "
                    f"| {r['speed_vs_flashmla_gather_prefill']:.2f} "
                    f"| {_f(r, 'prefill_target', '.1f')} "
                    f"| {r['rel_err_f64']:.1e} "
                    f"| {r['flashmla_prefill_rel_err_f64']:.1e} "
                    f"| {r['tflops']:.0f} | {r['flashmla_prefill_tflops']:.0f} |"
                )
    peer_missed = missed_peer_targets(rows)
    lines += [
        "",
        "Peer targets and error budget: "
        + ("; ".join(peer_missed) if peer_missed else "all met")
        + ".",
    ]
    return "\n".join(lines) + "\n"


def _load_peer():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import flashmla_peer

    interface, why = flashmla_peer.load()
    if interface is None:
        print(f"FlashMLA not available: {why}")
        return None, None
    from importlib.metadata import version

    return flashmla_peer.FlashMLAPeer(interface), version("vllm")


def _load_prefill_peer():
    """FlashMLA's sparse prefill with vLLM's gather, and the gather's path."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import flashmla_peer

    interface, why = flashmla_peer.load()
    gather, path = flashmla_peer.load_gather()
    if interface is None or gather is None:
        print(f"FlashMLA prefill not available: {why if interface is None else path}")
        return None, None
    return flashmla_peer.FlashMLAPrefillPeer(interface, gather), path


def _load_small_head(path: str | None):
    if not path:
        return None, None
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import small_head_peer

    module, sha = small_head_peer.load(path)
    return small_head_peer.SmallHeadPeer(module), sha


def _driver() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return out.stdout.split()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown"


DECODE_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DECODE_HEADS = (8, 16, 32, 64, 128)
# DSpark decode: requests per step (x DSPARK_QUERY_TOKENS tokens) x heads.
DSPARK_REQUESTS = (1, 8, 32)
DSPARK_HEADS = (8, 16, 32, 64)


def _parse_points(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in p.split("x")) for p in text.split(",")]


def main() -> None:
    global _DSPARK_SWA_WIDTH
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default="benchmarks/results")
    ap.add_argument(
        "--prefill-tokens",
        default="1024,4096,16384",
        help="comma-separated query-token counts of the prefill rows",
    )
    ap.add_argument(
        "--prefill-heads",
        default="8,16,32,64,128",
        help="comma-separated head counts of the prefill rows",
    )
    ap.add_argument(
        "--small-head",
        default=None,
        help="path of a copy of vLLM's small_head_sparse_decode.py (an upstream "
        "branch's file, kept outside the repository): times it as a peer",
    )
    ap.add_argument(
        "--peak-bw",
        type=float,
        default=0.0,
        help="bytes/s of the memory floor (0: measure this GPU's copy bandwidth)",
    )
    ap.add_argument("--no-graphs", action="store_true", help="time eager calls")
    ap.add_argument("--no-prefill", action="store_true")
    ap.add_argument("--no-dspark", action="store_true", help="skip the DSpark rows")
    ap.add_argument(
        "--dspark-swa-width",
        type=int,
        default=None,
        help="get_dspark_swa_index_width(128, 5), where vLLM cannot be imported",
    )
    ap.add_argument("--no-flashmla", action="store_true", help="skip the peer")
    ap.add_argument(
        "--check-targets",
        action="store_true",
        help="exit 1 where a row misses its ratio to FlashMLA (TARGETS)",
    )
    ap.add_argument("--commit", default="unknown", help="the kernel's commit")
    ap.add_argument("--tag", default="", help="suffix of the output file names")
    ap.add_argument(
        "--points",
        default=None,
        help="comma-separated TOKENSxHEADS decode points (default: all)",
    )
    ap.add_argument("--rep-ms", type=int, default=200)
    args = ap.parse_args()
    global PEAK_BW, GRAPHS
    _DSPARK_SWA_WIDTH = args.dspark_swa_width
    GRAPHS = not args.no_graphs
    peer, peer_version = (None, None) if args.no_flashmla else _load_peer()
    prefill_peer, gather_path = (
        (None, None) if args.no_flashmla or args.no_prefill else _load_prefill_peer()
    )
    small_head, small_head_sha = _load_small_head(args.small_head)
    PEAK_BW = args.peak_bw or measure_copy_bw()

    props = torch.cuda.get_device_properties(0)
    meta = dict(
        gpu=props.name,
        sms=props.multi_processor_count,
        driver=_driver(),
        torch=torch.__version__,
        triton=triton.__version__,
        commit=args.commit,
        python=platform.python_version(),
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        peak_bw=PEAK_BW,
        peak_flops=PEAK_FLOPS,
        command=" ".join([os.path.basename(sys.executable)] + sys.argv),
        kernel=K.__name__,
        flashmla=peer_version,
        dspark_swa_width_given=args.dspark_swa_width,
        peak_bw_measured=not args.peak_bw,
        small_head_path=args.small_head,
        small_head_sha256=small_head_sha,
        gather=gather_path,
        graphs=GRAPHS,
    )
    os.makedirs(args.out_dir, exist_ok=True)
    if args.points:
        points = _parse_points(args.points)
    else:
        points = [(t, h) for t in DECODE_TOKENS for h in DECODE_HEADS]
    rows = []
    tag = meta["gpu"].replace(" ", "_").lower() + args.tag
    base = os.path.join(args.out_dir, f"dsv41_sparse_mla_{tag}")

    def save() -> None:
        # After every row, so a run cut short keeps what it measured.
        with open(base + ".json", "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1, default=str)

    for tokens, heads in points:
        r = point(tokens, heads, "decode", args.rep_ms, peer, small_head)
        rows.append(r)
        save()
        print(
            f"decode T={tokens:4d} H={heads:3d} {r['time_us']:8.1f} us "
            f"{r['pct_of_floor']:5.1f}% of floor err {r['rel_err_f64']:.1e}"
            + (
                f" | FlashMLA {r['flashmla_us']:7.1f} us "
                f"err {r['flashmla_rel_err_f64']:.1e} "
                f"ours {r['speed_vs_flashmla']:.2f}x"
                if "flashmla_us" in r
                else ""
            )
            + (
                f" | small-head {r['small_head_us']:7.1f} us "
                f"err {r['small_head_rel_err_f64']:.1e} "
                f"ours {r['speed_vs_small_head']:.2f}x"
                if "small_head_us" in r
                else ""
            ),
            flush=True,
        )
    dspark = [] if args.no_dspark else DSPARK_REQUESTS
    for requests in dspark:
        for heads in DSPARK_HEADS:
            tokens = requests * DSPARK_QUERY_TOKENS
            r = point(tokens, heads, "dspark", args.rep_ms, peer, small_head)
            rows.append(r)
            save()
            print(
                f"dspark T={tokens:4d} H={heads:3d} {r['time_us']:8.1f} us"
                + (
                    f" | FlashMLA {r['flashmla_us']:7.1f} us "
                    f"ours {r['speed_vs_flashmla']:.2f}x"
                    if "flashmla_us" in r
                    else ""
                ),
                flush=True,
            )
    if not args.no_prefill:
        for tokens in [int(v) for v in args.prefill_tokens.split(",")]:
            for heads in [int(v) for v in args.prefill_heads.split(",")]:
                r = point(
                    tokens, heads, "prefill", args.rep_ms,
                    prefill_peer=prefill_peer,
                )  # fmt: skip
                rows.append(r)
                save()
                print(
                    f"prefill T={tokens:5d} H={heads:3d} {r['time_us']:9.1f} us "
                    f"err {r['rel_err_f64']:.1e}"
                    + (
                        f" | FlashMLA kernel {r['flashmla_prefill_us']:9.1f} us "
                        f"+gather {r['flashmla_gather_prefill_us']:9.1f} us "
                        f"err {r['flashmla_prefill_rel_err_f64']:.1e} "
                        f"ours {r['speed_vs_flashmla_prefill']:.2f}x"
                        if "flashmla_prefill_us" in r
                        else ""
                    ),
                    flush=True,
                )
    save()
    md = markdown(meta, rows)
    with open(base + ".md", "w") as f:
        f.write(md)
    print(md)
    assert all(not math.isnan(r["rel_err_f64"]) for r in rows)
    if args.check_targets and (
        missed := missed_targets(rows) + missed_peer_targets(rows)
    ):
        sys.exit("targets missed:\n  " + "\n  ".join(missed))


if __name__ == "__main__":
    main()
