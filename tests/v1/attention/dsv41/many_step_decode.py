# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Hundreds of decode steps of DeepSeek V4.1's two-segment attention layers,
driven by a model runner's block tables and slot mappings and by vLLM's own
metadata builders.

A small scheduler admits requests of different prompt lengths, prefills each
in one step, decodes every running request one token per step and retires
requests when their budget is spent; new requests take the retired ones'
pages (a shuffled free list), so stale KV of finished requests sits in
reused pages. Three layers share each step, as in the model: sliding window
only (ratio 0), and compressed KV at ratios 1 and 2, each compressed ratio in
its own cache group, all layers over one SWA group.

Per step, the page table (``PageTable``) gives the SWA slots, the compressed-KV
builder computes the compressed slots (its own slot-mapping kernel for
ratio 2), and the SWA builder computes the window indices; the KV rows of
the step's tokens are written at those slots, the indexer's top-k is drawn
at random among the visible compressed entries, and each layer's
``forward_mqa`` runs. Its output is compared with dense attention in float64
over the request's true history: the last ``WINDOW`` positions plus the
picked compressed entries, as stored (fp8_ds_mla rounding included), with
the sinks. On CUDA, decode-only steps are captured once per batch size in a
CUDA graph and replayed with each later step's inputs.

On CPU run it with ``TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES=`` so that
vLLM's Triton metadata kernels run in Triton's interpreter (vLLM keeps Triton
enabled when ``CUDA_VISIBLE_DEVICES`` is set and empty):

    python -m tests.v1.attention.dsv41.many_step_decode --pages sm12x
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch

from tests.v1.attention.dsv41 import sparse_mla_reference as reference
from tests.v1.attention.dsv41.fp8_ds_mla_pool import (
    alloc_fp8_ds_mla_pool,
    fp8_ds_mla_round_trip,
    write_fp8_ds_mla,
)

if TYPE_CHECKING:
    from vllm.models.deepseek_v41.nvidia.sparse_mla_kernel import SparseMLAKernel

WINDOW = 128
D = 512
HEADS = 16  # local heads; a supported count, so no padding
TOPK = 64  # indexer width
RATIOS = (0, 1, 2)
MAX_BATCHED_TOKENS = 512
MAX_REQS = 8
# fp8_ds_mla records are 584 B; vLLM pads each page to a multiple of 576 B.
PACKED_RECORD, PACKED_ALIGN = 584, 576
SWA_PREFIX = "model.layers.0.attn.swa_cache"


@dataclass(frozen=True)
class Schedule:
    """Requests as (prompt length, decode steps), in admission order. The
    first ``running`` start together and decode for over 200 steps; each
    later one starts when a request retires, on the pages it gave back, and
    retires before the longest first request does."""

    running: int
    requests: tuple[tuple[int, int], ...]


SCHEDULES = {
    # Two at a time: the CPU run interprets vLLM's Triton kernels per program.
    "small": Schedule(2, ((37, 200), (300, 230), (90, 20), (20, 6))),
    "full": Schedule(
        4, ((37, 200), (150, 236), (5, 214), (300, 248), (90, 30), (20, 20))
    ),
}


def _compressed_prefix(ratio: int) -> str:
    return f"model.layers.{ratio}.attn"


def _group_prefix(group: int) -> str:
    """The layer prefix whose metadata a cache group's builder makes."""
    return SWA_PREFIX if group == 0 else _compressed_prefix(group)


@dataclass(frozen=True)
class Pages:
    """Page sizes of one plan: tokens per SWA page, and compressed states per
    compressed page for each ratio."""

    name: str
    swa: int
    states: dict[int, int]

    def entries(self, group: int) -> int:
        """Entries per page of a cache group: 0 is the SWA cache, r the
        compressed cache of ratio r."""
        return self.swa if group == 0 else self.states[group]

    def tokens(self, group: int) -> int:
        """Tokens per page of a cache group (a compressed entry covers
        ``ratio`` tokens)."""
        return self.swa if group == 0 else self.states[group] * group


# The page FlashInfer's fixed-page SM120 kernels (before 0.7.1) are built
# for: SWA tokens per page, and compressed states per page.
SM12X_PAGE = 64


def swa_page(swa_backend: type) -> int:
    """Tokens per sliding-window page ``swa_backend``'s kernels read: the
    first kernel block size it reports."""
    from vllm.v1.attention.backend import MultipleOf

    size = swa_backend.get_supported_kernel_block_sizes()[0]
    return size.base if isinstance(size, MultipleOf) else size


def plan_for(swa_backend: type) -> str:
    """The page plan whose sliding-window page ``swa_backend`` reads."""
    return next(name for name in PLANS if page_plan(name).swa == swa_page(swa_backend))


def page_plan(name: str) -> Pages:
    """``sm12x``: 64-token SWA pages and 64-state compressed pages.
    ``upstream``: vLLM's own, from its backends (32-token SWA pages; the
    compressed page its sparse-MLA backend asks for on this device, in
    tokens)."""
    if name == "sm12x":
        # FlashInfer 0.7.1 and later take any page, so vLLM's own are kept
        # there; both plans run wherever the test does.
        return Pages(name, SM12X_PAGE, {1: SM12X_PAGE, 2: SM12X_PAGE})
    if name == "upstream":
        from vllm.models.deepseek_v41.sparse_mla import DeepseekV4SparseMLABackend
        from vllm.v1.attention.backends.mla.sparse_swa import (
            DeepseekSparseSWABackend,
        )

        tokens = DeepseekV4SparseMLABackend.get_supported_kernel_block_sizes()[0]
        assert isinstance(tokens, int)
        return Pages(
            name,
            swa_page(DeepseekSparseSWABackend),
            {r: tokens // r for r in RATIOS if r},
        )
    raise ValueError(f"unknown page plan {name!r}; use sm12x or upstream")


@dataclass
class Request:
    rid: int
    prompt: int
    decode: int
    kv: torch.Tensor  # [prompt + decode, D] float32, what the model writes
    compressed: dict[int, torch.Tensor]  # ratio -> [entries, D]
    stored: dict[int, torch.Tensor]  # 0 = SWA, r = ratio r: as cached, float64
    computed: int = 0  # positions whose KV is in the cache
    row: int = -1
    pages: dict[int, list[int]] = field(default_factory=dict)  # group -> pages

    @property
    def done(self) -> bool:
        return self.computed == self.prompt + self.decode


class PagePool:
    """A shuffled free list of page ids for one cache group; freed pages go
    to the back and are handed out again."""

    def __init__(self, num_pages: int, rng: random.Random) -> None:
        self.free = list(range(num_pages))
        rng.shuffle(self.free)
        self.num_pages = num_pages
        self.retired: set[int] = set()
        self.reused = 0

    def take(self) -> int:
        page = self.free.pop(0)
        if page in self.retired:
            self.reused += 1
            self.retired.discard(page)
        return page

    def give_back(self, pages: list[int]) -> None:
        self.free.extend(pages)
        self.retired.update(pages)


def _vllm_config(pages: Pages) -> SimpleNamespace:
    """The parts of ``VllmConfig`` the metadata builders read."""
    hf_config = SimpleNamespace(
        sliding_window=WINDOW, compress_ratios=list(RATIOS), index_topk=TOPK
    )
    return SimpleNamespace(
        model_config=SimpleNamespace(hf_config=hf_config, max_model_len=4096),
        scheduler_config=SimpleNamespace(
            max_num_batched_tokens=MAX_BATCHED_TOKENS, max_num_seqs=MAX_REQS
        ),
        speculative_config=None,
        parallel_config=SimpleNamespace(
            decode_context_parallel_size=1,
            prefill_context_parallel_size=1,
        ),
        cache_config=SimpleNamespace(block_size=pages.swa),
    )


class PageTable:
    """The block table and slot mapping of one KV-cache group, as the model
    runner hands them to the builders: a row of page ids per request, dense
    rows, and each scheduled token's slot (page id * page tokens + offset)."""

    def __init__(self, tokens_per_page: int, max_len: int, device: torch.device):
        self.tokens_per_page, self.device = tokens_per_page, device
        max_pages = -(-max_len // tokens_per_page) + 1
        self.rows = torch.zeros((MAX_REQS, max_pages), dtype=torch.int32)
        self.lengths = [0] * MAX_REQS
        # Persistent device buffers: captured CUDA graphs read them in place.
        self.device_rows = torch.zeros_like(self.rows, device=device)
        self.slot_mapping = torch.zeros(
            MAX_BATCHED_TOKENS, dtype=torch.int64, device=device
        )

    def append_row(self, pages: list[int], row: int) -> None:
        start = self.lengths[row]
        self.rows[row, start : start + len(pages)] = torch.tensor(pages)
        self.lengths[row] += len(pages)

    def move_row(self, src: int, dst: int) -> None:
        self.rows[dst] = self.rows[src]
        self.lengths[dst] = self.lengths[src]
        self.clear_row(src)

    def clear_row(self, row: int) -> None:
        self.rows[row] = 0
        self.lengths[row] = 0

    def get_device_tensor(self, num_reqs: int) -> torch.Tensor:
        self.device_rows[:num_reqs].copy_(self.rows[:num_reqs])
        return self.device_rows[:num_reqs]

    def compute_slot_mapping(
        self, num_reqs: int, query_start_loc: torch.Tensor, positions: torch.Tensor
    ) -> None:
        starts = query_start_loc.cpu().tolist()
        request = torch.repeat_interleave(
            torch.arange(num_reqs), torch.tensor(starts[1:]) - torch.tensor(starts[:-1])
        )
        pos = positions.cpu().long()
        pages = self.rows[request, pos // self.tokens_per_page].long()
        slots = pages * self.tokens_per_page + pos % self.tokens_per_page
        self.slot_mapping[: len(slots)] = slots.to(self.device)


class World:
    """The caches, block tables, builders and layers of one run."""

    def __init__(
        self,
        pages: Pages,
        schedule: Schedule,
        kernel: SparseMLAKernel,
        device: torch.device,
        seed: int,
    ) -> None:
        from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fi
        from vllm.models.deepseek_v41.sparse_mla import (
            DeepseekV4SparseMLABackend,
        )
        from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowMLASpec

        self.pages, self.schedule = pages, schedule
        self.kernel, self.device = kernel, device
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        max_len = max(p + d for p, d in schedule.requests)
        config = _vllm_config(pages)
        # Group 0 is the SWA cache; group r the compressed cache of ratio r.
        self.groups = [0, *(r for r in RATIOS if r)]
        self.tables, self.pools, self.caches, self.builders = {}, {}, {}, {}
        for group in self.groups:
            per_page, tokens = pages.entries(group), pages.tokens(group)
            # What the first requests hold at their longest, and one page
            # more: later requests must take pages retired ones gave back.
            first = schedule.requests[: schedule.running]
            num_pages = sum(-(-(p + d) // tokens) for p, d in first) + 1
            self.tables[group] = PageTable(tokens, max_len, device)
            self.pools[group] = PagePool(num_pages, self.rng)
            stride = -(-per_page * PACKED_RECORD // PACKED_ALIGN) * PACKED_ALIGN
            self.caches[group] = alloc_fp8_ds_mla_pool(
                num_pages,
                per_page,
                layout="3D",
                page_stride_bytes=stride,
                generator=self.gen,
            ).to(device)
            packed = dict(
                block_size=tokens,
                num_kv_heads=1,
                head_size=D,
                dtype=torch.uint8,
                cache_dtype_str="fp8_ds_mla",
            )
            if group == 0:
                spec = SlidingWindowMLASpec(**packed, sliding_window=WINDOW)
                swa_backend = fi.DeepseekV4FlashInferSM120Attention.swa_backend_cls
                builder_cls = swa_backend.get_builder_cls()
            else:
                spec = MLAAttentionSpec(**packed, tokens_per_state=group)
                builder_cls = DeepseekV4SparseMLABackend.get_builder_cls()
            self.builders[group] = builder_cls(
                spec, [_group_prefix(group)], config, device
            )
        self.layers = {r: self._layer(fi, r) for r in RATIOS}
        # Persistent per-step inputs, so CUDA-graph replays see new values.
        self.qsl = torch.zeros(MAX_REQS + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(MAX_REQS, dtype=torch.int32, device=device)
        self.positions = torch.zeros(
            MAX_BATCHED_TOKENS, dtype=torch.int64, device=device
        )
        self.q = torch.zeros(
            MAX_BATCHED_TOKENS, HEADS, D, dtype=torch.bfloat16, device=device
        )
        self.out = {
            r: torch.zeros(
                MAX_BATCHED_TOKENS, HEADS, D, dtype=torch.bfloat16, device=device
            )
            for r in RATIOS
        }
        # What the model runner's forward context holds during a step.
        self.context = SimpleNamespace(attn_metadata=None)

    def _layer(self, fi, ratio: int):
        layer = object.__new__(fi.DeepseekV4FlashInferSM120Attention)
        torch.nn.Module.__init__(layer)
        layer.sparse_mla_kernel = self.kernel
        layer.compress_ratio = ratio
        layer.window_size = WINDOW
        layer.max_image_tokens = 0
        layer.scale = D**-0.5
        sinks = torch.randn(HEADS, generator=self.gen)
        layer.attn_sink = sinks.to(self.device)
        layer.n_local_heads = HEADS
        layer.padded_heads = HEADS
        layer.kv_cache_torch_dtype = torch.uint8
        layer.topk_indices_buffer = torch.full(
            (MAX_BATCHED_TOKENS, TOPK), -1, dtype=torch.int32, device=self.device
        )
        layer.swa_cache_layer = SimpleNamespace(
            prefix=SWA_PREFIX, kv_cache=self.caches[0]
        )
        layer.compressed_cache_prefix = _compressed_prefix(ratio) if ratio else None
        layer.is_kv_source = bool(ratio)
        if ratio:
            layer.kv_cache = self.caches[ratio]
        return layer


@dataclass
class StepResult:
    step: int
    num_decodes: int
    num_prefills: int
    errors: dict[int, float]  # ratio -> max relative error this step
    graph: bool


def _new_request(world: World, rid: int) -> Request:
    prompt, decode = world.schedule.requests[rid]
    length = prompt + decode
    kv = torch.randn(length, D, generator=world.gen)
    compressed = {
        r: torch.randn(length // r, D, generator=world.gen) for r in RATIOS if r
    }
    stored = {0: fp8_ds_mla_round_trip(kv).double()}
    for r, rows in compressed.items():
        stored[r] = fp8_ds_mla_round_trip(rows).double()
    return Request(rid, prompt, decode, kv, compressed, stored)


def _grow(world: World, req: Request, new_len: int) -> None:
    """Give ``req`` the pages ``new_len`` positions need in every group and
    append them to its block-table rows."""
    for group in world.groups:
        tokens = world.pages.tokens(group)
        have = req.pages.setdefault(group, [])
        need = -(-new_len // tokens)
        added = [world.pools[group].take() for _ in range(need - len(have))]
        have.extend(added)
        world.tables[group].append_row(added, req.row)


def _retire(world: World, running: list[Request], req: Request) -> None:
    """Free ``req``'s pages and keep the rows dense, as vLLM's input batch
    does: the last row moves into the freed one."""
    last = len(running) - 1
    for group in world.groups:
        world.pools[group].give_back(req.pages[group])
        table = world.tables[group]
        if req.row != last:
            table.move_row(last, req.row)
        else:
            table.clear_row(last)
    if req.row != last:
        running[last].row = req.row
    running.remove(req)
    running.sort(key=lambda r: r.row)


def _common_metadata(world: World, group: int, batch, num_tokens: int):
    from vllm.v1.attention.backend import CommonAttentionMetadata

    num_reqs = len(batch)
    q_lens = [q for _, q in batch]
    seqs = [r.computed + q for r, q in batch]
    qsl_cpu = torch.tensor(
        [0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32
    )
    table = world.tables[group]
    table.compute_slot_mapping(
        num_reqs, world.qsl[: num_reqs + 1], world.positions[:num_tokens]
    )
    return CommonAttentionMetadata(
        query_start_loc=world.qsl[: num_reqs + 1],
        query_start_loc_cpu=qsl_cpu,
        seq_lens=world.seq_lens[:num_reqs],
        num_reqs=num_reqs,
        num_actual_tokens=num_tokens,
        max_query_len=max(q_lens),
        max_seq_len=max(seqs),
        block_table_tensor=table.get_device_tensor(num_reqs),
        slot_mapping=table.slot_mapping[:num_tokens],
        seq_lens_cpu_upper_bound=torch.tensor(seqs, dtype=torch.int32),
    )


def _write_kv(world: World, batch, num_tokens: int, metadata: dict) -> None:
    """Write each scheduled token's KV where vLLM's slot mappings say: its
    SWA row, and the compressed entry it completes in each compressed group."""
    swa_slots = world.tables[0].slot_mapping[:num_tokens].cpu()
    rows = torch.cat([r.kv[r.computed : r.computed + q] for r, q in batch])
    write_fp8_ds_mla(world.caches[0], swa_slots.to(world.device), rows.to(world.device))
    for ratio in RATIOS[1:]:
        slots = metadata[_compressed_prefix(ratio)].slot_mapping[:num_tokens].cpu()
        entries, keep = [], []
        t = 0
        for req, q in batch:
            for pos in range(req.computed, req.computed + q):
                if (pos + 1) % ratio == 0:
                    entries.append(req.compressed[ratio][(pos + 1) // ratio - 1])
                    keep.append(t)
                t += 1
        assert set(torch.nonzero(slots >= 0).flatten().tolist()) == set(keep), (
            f"ratio {ratio}: the compressed slot mapping marks other tokens than "
            "those completing an entry"
        )
        if keep:
            write_fp8_ds_mla(
                world.caches[ratio],
                slots[keep].to(world.device),
                torch.stack(entries).to(world.device),
            )


def _pick_topk(world: World, batch) -> dict[int, list[list[int]]]:
    """The indexer's picks per ratio and token (local entry indices), written
    to each layer's top-k buffer (-1 past the picks)."""
    picks: dict[int, list[list[int]]] = {}
    for ratio in RATIOS[1:]:
        rows = []
        for req, q in batch:
            for pos in range(req.computed, req.computed + q):
                visible = (pos + 1) // ratio
                rows.append(world.rng.sample(range(visible), min(visible, TOPK)))
        buffer = torch.full((len(rows), TOPK), -1, dtype=torch.int32)
        for t, picked in enumerate(rows):
            buffer[t, : len(picked)] = torch.tensor(picked, dtype=torch.int32)
        world.layers[ratio].topk_indices_buffer[: len(rows)].copy_(buffer)
        picks[ratio] = rows
    return picks


def _expected(world: World, batch, q: torch.Tensor, ratio: int, picks) -> torch.Tensor:
    """Dense attention in float64 over each token's true history: softmax of
    ``scale * q.k`` over the visible rows and the head's sink, times the rows
    (keys and values are the same latent rows in MLA)."""
    layer = world.layers[ratio]
    sinks = layer.attn_sink.double().cpu()
    outs, t = [], 0
    for req, qlen in batch:
        seq = req.computed + qlen
        swa = req.stored[0][:seq]
        comp = req.stored[ratio][: seq // ratio] if ratio else swa[:0]
        history = torch.cat([swa, comp])
        visible = torch.zeros(qlen, history.shape[0], dtype=torch.bool)
        for i, pos in enumerate(range(req.computed, seq)):
            visible[i, max(0, pos - WINDOW + 1) : pos + 1] = True
            if ratio:
                visible[i, [seq + e for e in picks[ratio][t + i]]] = True
        logits = torch.einsum("thd,nd->thn", q[t : t + qlen].double(), history)
        logits = (logits * layer.scale).masked_fill(~visible[:, None, :], -torch.inf)
        top = torch.maximum(logits.amax(-1), sinks[None, :])
        weights = (logits - top[..., None]).exp()
        total = weights.sum(-1) + (sinks[None, :] - top).exp()
        outs.append(torch.einsum("thn,nd->thd", weights, history) / total[..., None])
        t += qlen
    return torch.cat(outs)


@contextlib.contextmanager
def _stand_ins(world: World) -> Iterator[None]:
    """The forward context (the model runner's), and on CPU the Triton
    sparse-MLA kernel by the reference of its contract (any page size)."""
    from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fi
    from vllm.models.deepseek_v41.nvidia import sparse_mla_launcher

    saved: list[tuple[object, str, object]] = []

    def put(module, name: str, value) -> None:
        saved.append((module, name, getattr(module, name)))
        setattr(module, name, value)

    context = world.context
    for klass in type(world.layers[0]).__mro__:
        module = sys.modules.get(klass.__module__)
        if module is not None and hasattr(module, "get_forward_context"):
            put(module, "get_forward_context", lambda: context)
    # The SWA builder makes empty FlashMLA planner holders for SM90/SM10x
    # decodes; the two-segment kernels never read them, and FlashMLA's
    # compiled part is absent on CPU and in the offline GPU payload.
    from vllm.v1.attention.backends.mla import sparse_swa

    make_holders = sparse_swa.get_mla_metadata

    def holders_or_none(*args, **kwargs):
        try:
            return make_holders(*args, **kwargs)
        except RuntimeError:
            return (None, None)

    put(sparse_swa, "get_mla_metadata", holders_or_none)
    if world.device.type == "cpu":
        from vllm.v1 import utils as v1_utils

        # CPU tensors cannot be pinned without an accelerator.
        if getattr(v1_utils, "PIN_MEMORY", False):
            put(v1_utils, "PIN_MEMORY", False)

        def triton_on_cpu(**kwargs):
            return reference.reference_sparse_mla_dsv4(**kwargs, backend="sparse")

        put(sparse_mla_launcher, "run_triton", triton_on_cpu)
        if hasattr(fi, "_get_flashinfer_dsv4_workspace"):
            put(
                fi,
                "_get_flashinfer_dsv4_workspace",
                functools.lru_cache(lambda device: torch.empty(16, dtype=torch.uint8)),
            )
    try:
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)


def _forward_all(world: World, num_tokens: int) -> None:
    kv = torch.empty(0, device=world.device)
    for ratio, layer in world.layers.items():
        layer.forward_mqa(
            world.q[:num_tokens],
            kv,
            world.positions[:num_tokens],
            world.out[ratio][:num_tokens],
        )


def run(
    pages_name: str,
    schedule_name: str,
    kernel: SparseMLAKernel | str,
    device: str,
    seed: int,
) -> dict:
    """Run the whole schedule; returns the largest errors and what happened.
    ``kernel``: a SparseMLAKernel or its value."""
    from vllm.models.deepseek_v41.nvidia.sparse_mla_kernel import SparseMLAKernel

    kernel = SparseMLAKernel(kernel)
    dev = torch.device(device)
    pages = page_plan(pages_name)
    schedule = SCHEDULES[schedule_name]
    world = World(pages, schedule, kernel, dev, seed)
    waiting = list(range(len(schedule.requests)))
    running: list[Request] = []
    results: list[StepResult] = []
    graphs: dict[int, torch.cuda.CUDAGraph] = {}
    warmed: set[int] = set()
    use_graphs = dev.type == "cuda"
    step = 0
    with _stand_ins(world):
        while waiting or running:
            admitted = []
            while waiting and len(running) + len(admitted) < schedule.running:
                req = _new_request(world, waiting.pop(0))
                req.row = len(running) + len(admitted)
                admitted.append(req)
            # Decodes first (rows 0..), then this step's prefills.
            batch = [(r, 1) for r in running] + [(r, r.prompt) for r in admitted]
            for req, q in batch:
                _grow(world, req, req.computed + q)
            num_tokens = sum(q for _, q in batch)
            num_reqs = len(batch)
            qsl = [0]
            for _, q in batch:
                qsl.append(qsl[-1] + q)
            world.qsl[: num_reqs + 1].copy_(torch.tensor(qsl, dtype=torch.int32))
            world.seq_lens[:num_reqs].copy_(
                torch.tensor([r.computed + q for r, q in batch], dtype=torch.int32)
            )
            world.positions[:num_tokens].copy_(
                torch.tensor(
                    [p for r, q in batch for p in range(r.computed, r.computed + q)]
                )
            )
            metadata = {}
            for group in world.groups:
                common = _common_metadata(world, group, batch, num_tokens)
                metadata[_group_prefix(group)] = world.builders[group].build(0, common)
            _write_kv(world, batch, num_tokens, metadata)
            picks = _pick_topk(world, batch)
            q = torch.randn(num_tokens, HEADS, D, generator=world.gen).bfloat16()
            world.q[:num_tokens].copy_(q)
            world.context.attn_metadata = metadata
            decode_only = not admitted
            graphed = False
            if use_graphs and decode_only and num_tokens in graphs:
                graphs[num_tokens].replay()
                graphed = True
            elif use_graphs and decode_only and num_tokens in warmed:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    _forward_all(world, num_tokens)
                graph.replay()
                graphs[num_tokens] = graph
                graphed = True
            else:
                _forward_all(world, num_tokens)
                if decode_only:
                    warmed.add(num_tokens)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            errors = {}
            for ratio in RATIOS:
                expected = _expected(world, batch, q, ratio, picks)
                real = world.out[ratio][:num_tokens].double().cpu()
                if not real.isfinite().all():
                    errors[ratio] = float("inf")
                    continue
                scale = expected.abs().max().item()
                errors[ratio] = (real - expected).abs().max().item() / scale
            results.append(
                StepResult(step, len(running), len(admitted), errors, graphed)
            )
            for req, q in batch:
                req.computed += q
            running = running + admitted
            for req in [r for r in running if r.done]:
                _retire(world, running, req)
            step += 1
    return {
        "pages": {"swa": pages.swa, "states": pages.states},
        "kernel": kernel.value,
        "device": str(dev),
        "seed": seed,
        "steps": len(results),
        "decode_steps_per_request": [d for _, d in schedule.requests],
        "max_error": {str(r): max(s.errors[r] for s in results) for r in RATIOS},
        "graph_replays": sum(s.graph for s in results),
        "reused_pages": {str(g): world.pools[g].reused for g in world.groups},
        "mixed_steps": sum(1 for s in results if s.num_decodes and s.num_prefills),
        "worst_step": max(results, key=lambda s: max(s.errors.values())).step,
    }


PLANS = ("sm12x", "upstream")


def check(result: dict, tolerance: float, schedule: Schedule) -> None:
    """What every run must show, whatever the kernel."""
    first = schedule.requests[: schedule.running]
    assert min(d for _, d in first) >= 200
    assert result["steps"] >= 200
    for ratio, error in result["max_error"].items():
        assert error < tolerance, f"ratio {ratio}: max relative error {error:.3g}"
    # Retired requests' pages were handed out again in every cache group.
    assert all(n > 0 for n in result["reused_pages"].values()), result
    # A newcomer's prefill shared a step with running decodes.
    assert result["mixed_steps"] > 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", choices=("sm12x", "upstream"), required=True)
    parser.add_argument("--schedule", choices=tuple(SCHEDULES), default="small")
    parser.add_argument("--kernel", default="triton", help="a SparseMLAKernel value")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    result = run(args.pages, args.schedule, args.kernel, args.device, args.seed)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
