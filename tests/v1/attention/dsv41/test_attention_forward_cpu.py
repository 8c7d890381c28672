# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The DeepSeek V4.1 FlashInfer attention forward, run on CPU.

``forward_mqa`` of the TRTLLM-gen (SM10x) and SM120 attention classes runs
unchanged; only what cannot run without a Blackwell GPU is replaced:

* FlashInfer's ``trtllm_batch_decode_sparse_mla_dsv4`` by
  :func:`reference_sparse_mla_dsv4` (forced to the form the class's GPU uses);
* the Triton index builders ``build_flashinfer_mixed_sparse_indices`` and
  ``compute_global_topk_indices_and_lens`` by their first-principles references;
* the forward context and the 128 MiB workspace by small stand-ins.

The layer is ``object.__new__`` plus the attributes the forward reads, and the
metadata are ``SimpleNamespace`` objects shaped like upstream's.  The result is
compared with dense masked attention in float64 over the logical K/V of every
request: the causal window of 128 positions, the compressed entries the
"indexer" picked, the sinks and the softmax scale.

The classes are ``vllm.models.deepseek_v41.nvidia.flashinfer_sparse``'s; the
SM120 layer runs the kernel chosen for it when it was built through
``sparse_mla_launcher``, here FlashInfer's (the reference).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import random
import sys
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from tests.v1.attention.dsv41.fp8_ds_mla_pool import (
    alloc_fp8_ds_mla_pool,
    alloc_plain_pool,
    fp8_ds_mla_round_trip,
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
from vllm.models.deepseek_v41.common.ops import cache_utils
from vllm.models.deepseek_v41.nvidia.sparse_mla_kernel import SparseMLAKernel

ATTENTION_MODULE = "vllm.models.deepseek_v41.nvidia.flashinfer_sparse"
attention = importlib.import_module(ATTENTION_MODULE)

WINDOW = 128
D = 512
TOPK = 64  # indexer width; small to keep the CPU run short
SWA_PREFIX = "model.layers.3.attn.swa_cache"
COMPRESSED_PREFIX = "model.layers.2.attn"
# Packed fp8_ds_mla pages are padded to a multiple of 576 B, as vLLM's specs do.
PACKED_ALIGN = 576


@pytest.fixture(autouse=True)
def _single_thread():
    """Small matmuls: one thread is faster and immune to a loaded CI box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@dataclass
class Case:
    cls: str  # "sm120" or "sm10x"
    decodes: list[tuple[int, int]]  # (seq_len, query_len) per decode request
    prefills: list[tuple[int, int]]
    heads: int  # local heads (before padding)
    ratio: int  # compress ratio: 0 = sliding window only
    kv: str = "packed"  # sm120: packed fp8_ds_mla; sm10x: "bf16" or "fp8"
    graph_pad: int = 0  # extra CUDA-graph padding rows in q/output/buffers
    swa_page: int | None = None  # SWA page override (default: the class's)
    chunk: int | None = None  # PREFILL_CHUNK_SIZE override
    packed_compressed: bool = False  # sm10x: compressed page shares its block
    kv_source: bool = True  # the layer owns the compressed cache


CASES = {
    "sm120-decode-mtp-r2-h16": Case("sm120", [(5, 1), (130, 1), (300, 2)], [], 16, 2),
    "sm120-prefill-r1-h24": Case(
        "sm120", [], [(40, 40), (150, 90)], 24, 1, kv_source=False
    ),
    "sm120-mixed-r2-h64": Case(
        "sm120", [(7, 1), (260, 1)], [(100, 30), (70, 70)], 64, 2
    ),
    "sm120-chunked-prefill-graph-pad-r2-h16": Case(
        "sm120",
        [(3, 1), (200, 1)],
        [(9, 9), (140, 12), (33, 5), (64, 64), (250, 7), (20, 20), (129, 3)],
        16,
        2,
        graph_pad=5,  # 7 prefills: two chunks of the class's PREFILL_CHUNK_SIZE
    ),
    "sm120-chunk-size-2-r1-h64": Case(
        "sm120", [], [(10, 10), (70, 2), (129, 129), (5, 5), (66, 1)], 64, 1, chunk=2
    ),
    "sm120-mixed-swa-only-h24": Case(
        "sm120", [(90, 1), (301, 1)], [(60, 60), (180, 20)], 24, 0
    ),
    "sm10x-decode-bf16-r1-h16-packed": Case(
        "sm10x",
        [(5, 1), (129, 1), (260, 2)],
        [],
        16,
        1,
        kv="bf16",
        packed_compressed=True,
    ),
    "sm10x-prefill-fp8-r2-h64": Case(
        "sm10x", [], [(50, 50), (200, 40)], 64, 2, kv="fp8", kv_source=False
    ),
    "sm10x-mixed-bf16-r2-h24-graph-pad": Case(
        "sm10x",
        [(12, 1), (300, 1)],
        [(77, 77), (140, 9), (31, 4)],
        24,
        2,
        kv="bf16",
        graph_pad=3,
        packed_compressed=True,
    ),
    "sm10x-mixed-fp8-swa-only-h16": Case(
        "sm10x", [(64, 1), (190, 1)], [(100, 100), (20, 6)], 16, 0, kv="fp8"
    ),
}


def _padded_heads(heads: int) -> int:
    return next(h for h in (8, 16, 32, 64, 128) if h >= heads)


def _shuffled_table(rng: random.Random, pages_needed: list[int]):
    total = sum(pages_needed) + 2
    pages = list(range(total))
    rng.shuffle(pages)  # out-of-order physical pages
    width = max(pages_needed) + 1
    table = torch.zeros(len(pages_needed), width, dtype=torch.int32)
    cursor = 0
    for r, n in enumerate(pages_needed):
        table[r, :n] = torch.tensor(pages[cursor : cursor + n])
        cursor += n
    return table, total


def _build(case: Case, seed: int) -> SimpleNamespace:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    requests = case.decodes + case.prefills
    seq_lens = [s for s, _ in requests]
    q_lens = [q for _, q in requests]
    num_decodes, num_prefills = len(case.decodes), len(case.prefills)
    num_decode_tokens = sum(q for _, q in case.decodes)
    num_tokens = sum(q_lens)
    padded_tokens = num_tokens + case.graph_pad
    ratio = case.ratio

    if case.cls == "sm120":
        swa_page, comp_states = 64, 64  # SM12x: 64-entry pages for both pools
    else:
        swa_page, comp_states = 32, 128 // max(ratio, 1)
    swa_page = case.swa_page or swa_page
    comp_block_tokens = comp_states * max(ratio, 1)
    num_comp = [s // ratio if ratio else 0 for s in seq_lens]
    swa_table, swa_pages = _shuffled_table(rng, [-(-s // swa_page) for s in seq_lens])
    comp_table, comp_pages = _shuffled_table(
        rng, [max(1, -(-c // comp_states)) for c in num_comp]
    )

    swa_rows = [torch.randn(s, D, generator=gen) for s in seq_lens]
    comp_rows = [torch.randn(c, D, generator=gen) for c in num_comp]
    swa_slots = torch.tensor(
        [
            int(swa_table[r, p // swa_page]) * swa_page + p % swa_page
            for r, s in enumerate(seq_lens)
            for p in range(s)
        ]
    )
    comp_slots = torch.tensor(
        [
            int(comp_table[r, i // comp_states]) * comp_states + i % comp_states
            for r, c in enumerate(num_comp)
            for i in range(c)
        ],
        dtype=torch.int64,
    )
    swa_all = torch.cat(swa_rows)
    comp_all = torch.cat(comp_rows) if comp_rows else torch.zeros(0, D)
    if case.kv == "packed":

        def stride(tokens: int) -> int:
            return -(-tokens * 584 // PACKED_ALIGN) * PACKED_ALIGN

        swa_pool = alloc_fp8_ds_mla_pool(
            swa_pages,
            swa_page,
            layout="3D",
            page_stride_bytes=stride(swa_page),
            generator=gen,
        )
        comp_pool = alloc_fp8_ds_mla_pool(
            comp_pages,
            comp_states,
            layout="3D",
            page_stride_bytes=stride(comp_states),
            generator=gen,
        )
        write_fp8_ds_mla(swa_pool, swa_slots, swa_all)
        if len(comp_slots):
            write_fp8_ds_mla(comp_pool, comp_slots, comp_all)
        stored = torch.cat(
            [fp8_ds_mla_round_trip(swa_all), fp8_ds_mla_round_trip(comp_all)]
        )
        kv_dtype = torch.uint8
    else:
        kv_dtype = torch.bfloat16 if case.kv == "bf16" else torch.float8_e4m3fn
        swa_pool = alloc_plain_pool(
            swa_pages, swa_page, dtype=kv_dtype, layout="3D", generator=gen
        )
        # An indexer page sharing the block makes the page stride larger than
        # the compressed records (vLLM #44577).
        span = comp_states + (8 if case.packed_compressed else 0)
        comp_pool = alloc_plain_pool(
            comp_pages,
            comp_states,
            dtype=kv_dtype,
            layout="3D",
            page_span=span,
            generator=gen,
        )
        write_plain_pool(swa_pool, swa_slots, swa_all)
        if len(comp_slots):
            write_plain_pool(comp_pool, comp_slots, comp_all)
        stored = torch.cat([swa_all, comp_all]).to(kv_dtype).float()

    # Query tokens, the indexer's picks and the dense mask, from positions.
    swa_base = [sum(seq_lens[:r]) for r in range(len(requests))]
    comp_base = [sum(seq_lens) + sum(num_comp[:r]) for r in range(len(requests))]
    mask = torch.zeros(num_tokens, stored.shape[0], dtype=torch.bool)
    topk_buffer = torch.full((padded_tokens + 4, TOPK), -1, dtype=torch.int32)
    positions, slot_mapping = [], []
    t = 0
    for r, (s, q) in enumerate(requests):
        for pos in range(s - q, s):
            positions.append(pos)
            slot_mapping.append(
                int(swa_table[r, pos // swa_page]) * swa_page + pos % swa_page
            )
            for p in range(max(0, pos - WINDOW + 1), pos + 1):
                mask[t, swa_base[r] + p] = True
            if ratio:
                # A top-k indexer fills min(visible, TOPK) columns, then -1.
                visible = (pos + 1) // ratio
                picked = rng.sample(range(visible), min(visible, TOPK))
                for c, i in enumerate(picked):
                    topk_buffer[t, c] = i
                    mask[t, comp_base[r] + i] = True
            t += 1
    for row in range(num_tokens, topk_buffer.shape[0]):
        topk_buffer[row] = torch.randint(0, 3, (TOPK,), generator=gen)  # stale

    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    swa_meta_ref = reference_sparse_swa_metadata(
        query_start_loc=qsl,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_table=swa_table,
        slot_mapping=torch.tensor(slot_mapping),
        block_size=swa_page,
        window_size=WINDOW,
        num_decode_tokens=num_decode_tokens,
    )
    # Buffers sized for the padded (CUDA-graph) batch, as the builder's are.
    is_valid = torch.zeros(padded_tokens, dtype=torch.bool)
    is_valid[:num_tokens] = swa_meta_ref.is_valid_token
    token_to_req = torch.zeros(padded_tokens, dtype=torch.int32)
    token_to_req[:num_tokens] = swa_meta_ref.token_to_req_indices
    swa_metadata = SimpleNamespace(
        block_table=swa_table,
        slot_mapping=torch.tensor(slot_mapping + [-1] * case.graph_pad),
        block_size=swa_page,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_loc=qsl,
        query_start_loc_cpu=qsl.clone(),
        is_valid_token=is_valid,
        token_to_req_indices=token_to_req,
        decode_swa_indices=swa_meta_ref.decode_swa_indices,
        decode_swa_lens=swa_meta_ref.decode_swa_lens,
        decode_swa_width=WINDOW,
        prefill_swa_indices=swa_meta_ref.prefill_swa_indices,
        prefill_swa_lens=swa_meta_ref.prefill_swa_lens,
        prefill_left_visible=None,
        prefill_right_visible=None,
        num_decodes=num_decodes,
        num_prefills=num_prefills,
        num_decode_tokens=num_decode_tokens,
        num_prefill_tokens=num_tokens - num_decode_tokens,
        max_decode_query_len=max([q for _, q in case.decodes], default=1),
        flashinfer_sparse_index_cache={},
    )
    attn_metadata = {SWA_PREFIX: swa_metadata}
    if ratio:
        attn_metadata[COMPRESSED_PREFIX] = SimpleNamespace(
            block_table=comp_table, block_size=comp_block_tokens
        )

    padded = _padded_heads(case.heads)
    qdtype = torch.float8_e4m3fn if case.kv == "fp8" else torch.bfloat16
    q = torch.randn(padded_tokens, case.heads, D, generator=gen).to(qdtype)
    sinks = torch.full((padded,), float("-inf"))
    sinks[: case.heads] = torch.randn(case.heads, generator=gen)
    return SimpleNamespace(
        case=case,
        q=q,
        positions=torch.tensor(positions + [0] * case.graph_pad),
        sinks=sinks,
        padded_heads=padded,
        num_tokens=num_tokens,
        stored=stored.double(),
        mask=mask,
        swa_pool=swa_pool,
        comp_pool=comp_pool if ratio else None,
        kv_dtype=kv_dtype,
        topk_buffer=topk_buffer,
        attn_metadata=attn_metadata,
    )


def _make_layer(world: SimpleNamespace):
    case = world.case
    cls = (
        attention.DeepseekV4FlashInferSM120Attention
        if case.cls == "sm120"
        else attention.DeepseekV4FlashInferMLAAttention
    )
    layer = object.__new__(cls)
    torch.nn.Module.__init__(layer)
    # The kernel chosen when the layer was built: FlashInfer's.
    layer.sparse_mla_kernel = (
        SparseMLAKernel.FLASHINFER_SM120
        if case.cls == "sm120"
        else SparseMLAKernel.TRTLLM_GEN
    )
    layer.compress_ratio = case.ratio
    layer.window_size = WINDOW
    layer.max_image_tokens = 0
    layer.scale = D**-0.5
    layer.attn_sink = world.sinks
    layer.n_local_heads = case.heads
    layer.padded_heads = world.padded_heads
    layer.kv_cache_torch_dtype = world.kv_dtype
    layer.topk_indices_buffer = world.topk_buffer
    layer.swa_cache_layer = SimpleNamespace(prefix=SWA_PREFIX, kv_cache=world.swa_pool)
    if case.ratio:
        layer.compressed_cache_prefix = COMPRESSED_PREFIX
        layer.is_kv_source = case.kv_source
        if case.kv_source:
            layer.kv_cache = world.comp_pool
        else:
            # A consumer layer reads the kv-source layer's cache.
            layer._static_forward_context = {
                COMPRESSED_PREFIX: SimpleNamespace(kv_cache=world.comp_pool)
            }
    else:
        layer.compressed_cache_prefix = None
        layer.is_kv_source = False
    if case.chunk is not None:
        layer.PREFILL_CHUNK_SIZE = case.chunk
    if world.kv_dtype == torch.float8_e4m3fn:
        # Unit per-tensor scales, as upstream's constructor sets them.
        layer._flashinfer_fp8_bmm1_scale = layer.scale
        layer._flashinfer_fp8_bmm2_scale = 1.0
    return layer


@pytest.fixture
def patched(monkeypatch):
    """Install the CPU stand-ins in every module the forward looks them up in."""
    calls: list[dict] = []

    def install(layer, backend: str, attn_metadata: dict) -> list[dict]:
        def launcher(**kwargs):
            calls.append(kwargs)
            return reference_sparse_mla_dsv4(**kwargs, backend=backend)

        replacements = {
            "flashinfer_trtllm_batch_decode_sparse_mla_dsv4": launcher,
            "build_flashinfer_mixed_sparse_indices": (
                reference_build_flashinfer_mixed_sparse_indices
            ),
            "compute_global_topk_indices_and_lens": (
                reference_compute_global_topk_indices_and_lens
            ),
            "get_forward_context": lambda: SimpleNamespace(attn_metadata=attn_metadata),
            "_get_flashinfer_dsv4_workspace": functools.lru_cache(
                lambda device: torch.empty(16, dtype=torch.uint8)
            ),
        }
        modules = [sys.modules.get(k.__module__) for k in type(layer).__mro__]
        # The launcher calls FlashInfer through vLLM's FlashInfer utilities.
        modules.append(sys.modules["vllm.utils.flashinfer"])
        for module in modules:
            for name, value in replacements.items():
                if module is not None and hasattr(module, name):
                    monkeypatch.setattr(module, name, value)
        return calls

    return install


# A TRTLLM-gen forward whose mixed index builder bounds SWA replay
# (``replay_start``) builds KV storage-offset indices; the reference index
# builders model element indices only.
_SM10X_STORAGE_OFFSETS = pytest.mark.skipif(
    "replay_start"
    in inspect.signature(cache_utils.build_flashinfer_mixed_sparse_indices).parameters,
    reason="this TRTLLM-gen forward uses storage-offset indices the reference "
    "index builders do not model",
)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=_SM10X_STORAGE_OFFSETS) if c.cls == "sm10x" else n
        for n, c in CASES.items()
    ],
)
def test_attention_forward_matches_dense(name: str, patched) -> None:
    case = CASES[name]
    seed = random.SystemRandom().randrange(2**31)
    print(f"seed={seed} module={ATTENTION_MODULE}")
    world = _build(case, seed)
    layer = _make_layer(world)
    calls = patched(
        layer, "sparse" if case.cls == "sm120" else "trtllm-gen", world.attn_metadata
    )
    output = torch.full(
        (world.q.shape[0], world.padded_heads, D), float("nan"), dtype=torch.bfloat16
    )
    layer.forward_mqa(world.q, torch.empty(0), world.positions, output)

    expected = dense_attention_oracle(
        world.q[: world.num_tokens].float(),
        world.stored,
        world.mask,
        layer.scale,
        world.sinks[: case.heads],
    )
    real = output[: world.num_tokens, : case.heads].double()
    assert not real.isnan().any(), "some real token/head was never written"
    err = (real - expected).abs().max().item() / expected.abs().max().item()
    print(f"max rel err {err:.3g}")
    assert err < 2e-2
    # The only rounding on the way is the BF16 output (unit roundoff 2^-8), so
    # hold the run to that: a slightly wrong scale or one stray slot fails here.
    assert err < 2**-8 + 1e-4
    # Padded heads attend with zero queries; they must stay finite (and are
    # sliced off by the caller), while real heads above were unaffected.
    assert output[: world.num_tokens].isfinite().all()
    if case.cls == "sm120" and case.prefills:
        expected_calls = -(
            -len(case.prefills) // (case.chunk or layer.PREFILL_CHUNK_SIZE)
        )
        expected_calls += 1 if case.decodes else 0
        assert len(calls) == expected_calls
