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

Writes dsv41_sparse_mla_<gpu>.json and .md.
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
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return triton.testing.do_bench(
        graph.replay, warmup=25, rep=rep_ms, return_mode="median"
    )


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
    **cfg,
) -> dict:
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
    if peer is not None and heads <= 128:
        run_peer = peer.prepare(x)
        row["flashmla_rel_err_f64"] = rel_err(run_peer(), ref)
        t_peer = bench(run_peer, rep_ms)
        row["flashmla_us"] = t_peer * 1e3
        row["flashmla_heads"] = 64 if heads <= 64 else 128
        # > 1: ours is faster.
        row["speed_vs_flashmla"] = t_peer / t_ms
        row["target"] = target(kind, heads)
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


def _driver() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return out.stdout.split()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown"


DECODE_TOKENS = (1, 2, 4, 8, 32, 128, 256)
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
    ap.add_argument("--prefill-tokens", type=int, default=4096)
    ap.add_argument("--prefill-heads", type=int, default=128)
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
    _DSPARK_SWA_WIDTH = args.dspark_swa_width
    peer, peer_version = (None, None) if args.no_flashmla else _load_peer()

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
    )
    os.makedirs(args.out_dir, exist_ok=True)
    result: dict = dict(meta=meta)
    if args.points:
        points = _parse_points(args.points)
    else:
        points = [(t, h) for t in DECODE_TOKENS for h in DECODE_HEADS]
    rows = []
    for tokens, heads in points:
        r = point(tokens, heads, "decode", args.rep_ms, peer)
        rows.append(r)
        print(
            f"decode T={tokens:4d} H={heads:3d} {r['time_us']:8.1f} us "
            f"{r['pct_of_floor']:5.1f}% of floor err {r['rel_err_f64']:.1e}"
            + (
                f" | FlashMLA {r['flashmla_us']:7.1f} us "
                f"err {r['flashmla_rel_err_f64']:.1e} "
                f"ours {r['speed_vs_flashmla']:.2f}x"
                if "flashmla_us" in r
                else ""
            ),
            flush=True,
        )
    dspark = [] if args.no_dspark else DSPARK_REQUESTS
    for requests in dspark:
        for heads in DSPARK_HEADS:
            tokens = requests * DSPARK_QUERY_TOKENS
            r = point(tokens, heads, "dspark", args.rep_ms, peer)
            rows.append(r)
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
        rows.append(
            point(args.prefill_tokens, args.prefill_heads, "prefill", args.rep_ms)
        )
    result["rows"] = rows
    tag = meta["gpu"].replace(" ", "_").lower() + args.tag
    base = os.path.join(args.out_dir, f"dsv41_sparse_mla_{tag}")
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1, default=str)
    md = markdown(meta, rows)
    with open(base + ".md", "w") as f:
        f.write(md)
    print(md)
    assert all(not math.isnan(r["rel_err_f64"]) for r in rows)
    if args.check_targets and (missed := missed_targets(rows)):
        sys.exit("targets missed:\n  " + "\n  ".join(missed))


if __name__ == "__main__":
    main()
