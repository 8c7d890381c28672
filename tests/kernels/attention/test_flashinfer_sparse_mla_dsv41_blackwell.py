# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""FlashInfer's DeepSeek V4.1 sparse-MLA kernels on real Blackwell GPUs.

Every test here runs a real kernel and checks it against the CPU reference of
FlashInfer's contract (``tests/v1/attention/dsv41/sparse_mla_reference.py``),
whose pool writers also lay out the KV bytes the kernels read:

* SM10x (B200, GB200): ``trtllm_batch_decode_sparse_mla_dsv4`` in its combined
  form (one index table, SWA columns first) over BF16 and per-tensor FP8 pools;
* SM12x (RTX PRO 6000, RTX 5090, GB10): the two-segment form over packed
  ``fp8_ds_mla`` pools;
* the model-free forward of the DeepSeek V4.1 attention classes with the real
  launcher and vLLM's real Triton index builders (the approach of
  ``tests/v1/attention/dsv41/test_attention_forward_cpu.py``, on the GPU),
  through the sparse-MLA launcher, so the test also checks which kernel
  ran: FlashInfer's where it has the shape, else the Triton kernel, and the
  Triton kernel on SM90;
* any CUDA GPU (the H100/H200 step): vLLM's Triton index builders against
  their first-principles references.

Page sizes come from the page plans of
``tests/v1/attention/dsv41/many_step_decode.py``: the one whose sliding-window
page the GPU's layer class reads, never constants here. Each test skips with a
reason where its GPU or FlashInfer is missing, so CPU CI collects this file
and reports why nothing ran.
FlashInfer is imported only inside the tests: importing it with a CPU-only
torch fails.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import random
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.v1.attention.dsv41 import many_step_decode as msd
from tests.v1.attention.dsv41.fp8_ds_mla_pool import (
    alloc_fp8_ds_mla_pool,
    alloc_plain_pool,
    write_fp8_ds_mla,
    write_plain_pool,
)
from tests.v1.attention.dsv41.index_reference import (
    reference_build_flashinfer_mixed_sparse_indices,
    reference_compute_global_topk_indices_and_lens,
    reference_sparse_swa_metadata,
)
from tests.v1.attention.dsv41.sparse_mla_reference import (
    SWA_COLUMNS,
    dense_attention_oracle,
    reference_sparse_mla_dsv4,
)
from tests.v1.attention.dsv41.test_attention_forward_cpu import (
    CASES as FORWARD_CASES,
)
from tests.v1.attention.dsv41.test_attention_forward_cpu import (
    _build as build_forward_world,
)
from tests.v1.attention.dsv41.test_attention_forward_cpu import (
    _make_layer as make_forward_layer,
)
from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fi
from vllm.models.deepseek_v41.nvidia.sparse_mla_kernel import (
    TRITON_MIN_CAPABILITY,
    SparseMLAKernel,
)
from vllm.platforms.interface import DeviceCapability

D = 512
WINDOW = SWA_COLUMNS  # DeepSeek V4.1 slides a 128-token window
SCALE = D**-0.5
# Tolerances on max|real - ref| / max|ref|. The reference works in float32 and
# rounds once; the kernels keep P in BF16 (or FP8 on the TRTLLM-gen FP8 path),
# which costs up to a few 1e-3 (BF16) or 1e-2 (FP8). A wrong slot, page or
# sink moves the error by far more. Not yet calibrated on hardware.
TOL = {"bf16": 2e-2, "packed": 2e-2, "fp8": 5e-2}
WORKSPACE_BYTES = 128 << 20  # what vLLM hands FlashInfer's DSV4 launcher
# Where the kernels run. A module global so the harness itself can be dry-run
# on CPU (reference launcher, Triton interpreter) when no GPU is at hand.
DEVICE = torch.device("cuda")
# The name upstream's attention module calls FlashInfer's launcher by.
LAUNCHER_NAME = "flashinfer_trtllm_batch_decode_sparse_mla_dsv4"


# ---------------------------------------------------------------------------
# Gating: skip with a reason that says what is missing and where it runs
# ---------------------------------------------------------------------------


def _capability() -> DeviceCapability | None:
    if not torch.cuda.is_available():
        return None
    return DeviceCapability(*torch.cuda.get_device_capability())


def _skip_reason(family: int | None, what: str, needs_flashinfer: bool) -> str | None:
    capability = _capability()
    if capability is None:
        return f"{what}: no CUDA GPU here (runs in the Buildkite GPU steps)"
    if family is not None and capability.major != family:
        return (
            f"{what}: needs SM{family}x, this GPU is SM{capability.to_int()} "
            "(runs in its own Buildkite step)"
        )
    if needs_flashinfer and importlib.util.find_spec("flashinfer") is None:
        return f"{what}: flashinfer-python is not installed"
    return None


def requires_gpu(
    family: int | None, what: str, needs_flashinfer: bool = True
) -> pytest.MarkDecorator:
    """Skip unless a CUDA GPU of compute-capability major ``family`` (any if
    None) and, if asked, FlashInfer are present."""
    reason = _skip_reason(family, what, needs_flashinfer)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


SM10X = requires_gpu(10, "FlashInfer TRTLLM-gen sparse MLA (B200/GB200)")
SM12X = requires_gpu(12, "FlashInfer SM120 sparse MLA (RTX PRO 6000/RTX 5090/GB10)")
ANY_CUDA = requires_gpu(None, "upstream Triton index builders", needs_flashinfer=False)


def _layer_class() -> type:
    """The attention class DeepSeek V4.1 builds on this GPU: TRTLLM-gen's on
    SM10x, else the two-segment class (FlashInfer's SM120 kernel or the
    Triton kernel)."""
    capability = _capability()
    assert capability is not None
    if capability.major == 10:
        return fi.DeepseekV4FlashInferMLAAttention
    return fi.DeepseekV4FlashInferSM120Attention


def _kernel(num_heads: int = 64, swa_topk: int = WINDOW) -> str:
    """The sparse-MLA kernel that serves ``num_heads`` local heads on this
    GPU: TRTLLM-gen on SM10x; on SM12x FlashInfer's SM120 kernel where the
    installed FlashInfer has one for the shape, else the Triton kernel; the
    Triton kernel elsewhere."""
    from vllm.utils.flashinfer import has_flashinfer_sparse_mla_sm120_config

    capability = _capability()
    assert capability is not None
    if capability.major == 10:
        return SparseMLAKernel.TRTLLM_GEN
    layer = fi.DeepseekV4FlashInferSM120Attention
    padded = layer.get_padded_num_q_heads(num_heads)
    if capability.major == 12 and has_flashinfer_sparse_mla_sm120_config(
        padded, swa_topk
    ):
        return SparseMLAKernel.FLASHINFER_SM120
    return SparseMLAKernel.TRITON


def _pages() -> msd.Pages:
    """The page plan whose sliding-window page this GPU's layer class reads."""
    return msd.page_plan(msd.plan_for(_layer_class().swa_backend_cls))


def _flashinfer_decode() -> Callable[..., torch.Tensor]:
    from flashinfer.decode import trtllm_batch_decode_sparse_mla_dsv4

    return trtllm_batch_decode_sparse_mla_dsv4


@pytest.fixture(scope="module")
def workspace() -> torch.Tensor:
    return torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=DEVICE)


def _to_gpu(value: Any) -> Any:
    """Tensors to the GPU with their strides (page padding stays padding);
    anything else unchanged."""
    if not isinstance(value, torch.Tensor):
        return value
    dst = torch.empty_strided(
        value.shape, value.stride(), dtype=value.dtype, device=DEVICE
    )
    dst.copy_(value)
    return dst


def _seed(name: str) -> int:
    # Stable across processes (str hashes are salted), so a failure reproduces.
    return zlib.crc32(name.encode())


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def _rel_err(real: torch.Tensor, expected: torch.Tensor) -> float:
    real, expected = real.double().cpu(), expected.double().cpu()
    return ((real - expected).abs().max() / expected.abs().max()).item()


# ---------------------------------------------------------------------------
# Kernel-level worlds: logical rows -> paged pools -> kernel arguments
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelCase:
    requests: tuple[tuple[int, int], ...]  # (seq_len, query_len), decodes first
    heads: int  # local heads before padding
    ratio: int  # compress ratio; 0 = sliding window only
    kv: str  # "bf16" / "fp8" (SM10x) or "packed" (SM12x)
    sinks: bool = True
    comp_topk: int = 128  # compressed entries the indexer picks at most
    packed_block: bool = False  # SM10x: compressed pages share a larger block
    tensor_scale: bool = False  # SM10x: bmm1_scale as a float32 tensor


def _shuffled_table(
    rng: random.Random, pages_needed: list[int]
) -> tuple[torch.Tensor, int]:
    total = sum(pages_needed) + 3  # spare pages hold garbage nobody may read
    order = list(range(total))
    rng.shuffle(order)
    table = torch.zeros(len(pages_needed), max(pages_needed) + 1, dtype=torch.int32)
    cursor = 0
    for r, n in enumerate(pages_needed):
        table[r, :n] = torch.tensor(order[cursor : cursor + n], dtype=torch.int32)
        cursor += n
    return table, total


def _slot(table: torch.Tensor, req: int, local: int, page: int) -> int:
    return int(table[req, local // page]) * page + local % page


def _kernel_world(
    case: KernelCase, swa_page: int, comp_states: int, seed: int
) -> SimpleNamespace:
    """Random rows written into shuffled pages, each token's window and picked
    compressed entries, and the float64 dense answer over the logical rows."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [s for s, _ in case.requests]
    q_lens = [q for _, q in case.requests]
    ratio = case.ratio
    num_comp = [s // ratio if ratio else 0 for s in seq_lens]
    swa_table, swa_pages = _shuffled_table(rng, [-(-s // swa_page) for s in seq_lens])
    comp_table, comp_pages = _shuffled_table(
        rng, [max(1, -(-c // comp_states)) for c in num_comp]
    )
    swa_rows = torch.randn(sum(seq_lens), D, generator=gen)
    comp_rows = torch.randn(max(sum(num_comp), 1), D, generator=gen)
    swa_base = [sum(seq_lens[:r]) for r in range(len(seq_lens))]
    comp_base = [sum(num_comp[:r]) for r in range(len(seq_lens))]
    swa_slots = [
        _slot(swa_table, r, p, swa_page)
        for r, s in enumerate(seq_lens)
        for p in range(s)
    ]
    comp_slots = [
        _slot(comp_table, r, i, comp_states)
        for r, c in enumerate(num_comp)
        for i in range(c)
    ]

    tokens: list[tuple[int, int]] = []  # (request, position)
    picks: list[list[int]] = []  # request-local compressed entries per token
    for r, (s, q) in enumerate(case.requests):
        for pos in range(s - q, s):
            tokens.append((r, pos))
            visible = (pos + 1) // ratio if ratio else 0
            picks.append(rng.sample(range(visible), min(visible, case.comp_topk)))
    num_tokens = len(tokens)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    swa_meta = reference_sparse_swa_metadata(
        query_start_loc=qsl,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_table=swa_table,
        slot_mapping=torch.tensor(
            [_slot(swa_table, r, p, swa_page) for r, p in tokens]
        ),
        block_size=swa_page,
        window_size=WINDOW,
        num_decode_tokens=num_tokens,  # one table for every token
    )
    # The logical answer: each token sees its causal window and its picks.
    num_swa = sum(seq_lens)
    mask = torch.zeros(num_tokens, num_swa + comp_rows.shape[0], dtype=torch.bool)
    for t, (r, pos) in enumerate(tokens):
        mask[t, swa_base[r] + max(0, pos - WINDOW + 1) : swa_base[r] + pos + 1] = True
        for i in picks[t]:
            mask[t, num_swa + comp_base[r] + i] = True

    padded = fi.DeepseekV4FlashInferSM120Attention.get_padded_num_q_heads(case.heads)
    qdtype = torch.float8_e4m3fn if case.kv == "fp8" else torch.bfloat16
    q = torch.zeros(num_tokens, padded, D, dtype=qdtype)
    q[:, : case.heads] = torch.randn(num_tokens, case.heads, D, generator=gen).to(
        qdtype
    )
    sinks = None
    if case.sinks:
        # Padded heads carry no sink, as the layer's padded attn_sink does.
        sinks = torch.full((padded,), float("-inf"))
        sinks[: case.heads] = torch.randn(case.heads, generator=gen)
    return SimpleNamespace(
        case=case,
        swa_page=swa_page,
        comp_states=comp_states,
        swa_pages=swa_pages,
        comp_pages=comp_pages,
        swa_rows=swa_rows,
        comp_rows=comp_rows,
        swa_slots=torch.tensor(swa_slots, dtype=torch.int64),
        comp_slots=torch.tensor(comp_slots, dtype=torch.int64),
        comp_table=comp_table,
        seq_lens=seq_lens,
        qsl=qsl,
        tokens=tokens,
        picks=picks,
        swa_meta=swa_meta,
        mask=mask,
        q=q,
        sinks=sinks,
        padded=padded,
        gen=gen,
    )


def _sm12x_arguments(w: SimpleNamespace) -> dict[str, Any]:
    """Two-segment arguments over packed pools, and what the pools hold."""
    swa_pool = alloc_fp8_ds_mla_pool(w.swa_pages, w.swa_page, generator=w.gen)
    write_fp8_ds_mla(swa_pool, w.swa_slots, w.swa_rows)
    kwargs: dict[str, Any] = dict(
        query=w.q,
        swa_kv_cache=swa_pool,
        sparse_indices=w.swa_meta.decode_swa_indices.reshape(len(w.tokens), -1),
        swa_topk_lens=w.swa_meta.decode_swa_lens,
        bmm1_scale=SCALE,
        sinks=w.sinks,
        kv_layout="NHD",
    )
    if w.case.ratio:
        comp_pool = alloc_fp8_ds_mla_pool(w.comp_pages, w.comp_states, generator=w.gen)
        write_fp8_ds_mla(comp_pool, w.comp_slots, w.comp_rows[: len(w.comp_slots)])
        local = torch.full((len(w.tokens), w.case.comp_topk), -1, dtype=torch.int32)
        for t, picked in enumerate(w.picks):
            local[t, : len(picked)] = torch.tensor(picked, dtype=torch.int32)
        token_to_req = torch.tensor([r for r, _ in w.tokens], dtype=torch.int32)
        extra, extra_lens = reference_compute_global_topk_indices_and_lens(
            local,
            token_to_req,
            w.comp_table,
            w.comp_states,
            torch.ones(len(w.tokens), dtype=torch.bool),
        )
        kwargs.update(
            compressed_kv_cache=comp_pool,
            extra_sparse_indices=extra,
            extra_sparse_topk_lens=extra_lens,
        )
    return kwargs


def _sm10x_arguments(w: SimpleNamespace) -> dict[str, Any]:
    """Combined-table arguments over plain BF16 / FP8 pools (HND)."""
    dtype = torch.float8_e4m3fn if w.case.kv == "fp8" else torch.bfloat16
    swa_pool = alloc_plain_pool(w.swa_pages, w.swa_page, dtype=dtype, generator=w.gen)
    write_plain_pool(swa_pool, w.swa_slots, w.swa_rows)
    # A block shared with an indexer page makes the page stride exceed the
    # records; indices must then count rows of the whole block.
    span = w.comp_states + (16 if w.case.packed_block else 0)
    comp_pool = alloc_plain_pool(
        w.comp_pages, w.comp_states, dtype=dtype, page_span=span, generator=w.gen
    )
    write_plain_pool(comp_pool, w.comp_slots, w.comp_rows[: len(w.comp_slots)])
    num_tokens = len(w.tokens)
    width = SWA_COLUMNS + -(-w.case.comp_topk // 4) * 4
    table = torch.full((num_tokens, width), -1, dtype=torch.int32)
    table[:, :SWA_COLUMNS] = w.swa_meta.decode_swa_indices.reshape(num_tokens, -1)
    lens = torch.full((num_tokens,), SWA_COLUMNS, dtype=torch.int32)
    for t, (r, _) in enumerate(w.tokens):
        for c, i in enumerate(w.picks[t]):
            slot = _slot(w.comp_table, r, i, w.comp_states)
            page, offset = divmod(slot, w.comp_states)
            table[t, SWA_COLUMNS + c] = page * span + offset
        lens[t] += len(w.picks[t])
        # Valid-looking rows past the live length: the kernel must ignore them.
        tail = table[t, int(lens[t]) :]
        tail.copy_(
            torch.randint(0, w.comp_pages * w.comp_states, tail.shape, generator=w.gen)
        )
    scale: float | torch.Tensor = SCALE
    if w.case.tensor_scale:
        scale = torch.tensor([SCALE], dtype=torch.float32)
    return dict(
        query=w.q,
        swa_kv_cache=swa_pool,
        compressed_kv_cache=comp_pool,
        sparse_indices=table,
        sparse_topk_lens=lens,
        seq_lens=torch.tensor(w.seq_lens, dtype=torch.int32),
        cum_seq_lens_q=w.qsl,
        max_q_len=max(q for _, q in w.case.requests),
        bmm1_scale=scale,
        bmm2_scale=1.0,
        sinks=w.sinks,
        kv_layout="HND",
    )


def _run_and_compare(
    kwargs: dict[str, Any], w: SimpleNamespace, backend: str, workspace: torch.Tensor
) -> None:
    """The real kernel against the CPU reference on identical bytes."""
    heads = w.case.heads
    expected = torch.empty(len(w.tokens), w.padded, D, dtype=torch.float32)
    reference_sparse_mla_dsv4(**kwargs, out=expected, backend=backend)
    gpu_kwargs = {k: _to_gpu(v) for k, v in kwargs.items()}
    out = torch.full(
        (len(w.tokens), w.padded, D), float("nan"), dtype=torch.bfloat16, device=DEVICE
    )
    _flashinfer_decode()(**gpu_kwargs, workspace_buffer=workspace, out=out)
    _sync()
    real = out.cpu()
    assert real[:, :heads].isfinite().all(), "a real token/head was never written"
    err = _rel_err(real[:, :heads], expected[:, :heads])
    print(f"max rel err {err:.3g}")
    assert err < TOL[w.case.kv]
    # Zero-query padded heads attend too; they are sliced off, but must not be
    # NaN/inf (they share the output buffer with the real heads).
    assert real[:, heads:].isfinite().all()


# Decode (one token or an MTP pair per request), prefill over the 64-token
# decode/prefill cut-off, mixed batches, both caches or the window alone,
# with and without sinks, head counts that need padding.
SM10X_CASES = {
    "decode-bf16-r1-h64": KernelCase(
        ((5, 1), (129, 1), (300, 1), (1000, 1)), 64, 1, "bf16"
    ),
    "decode-mtp-fp8-r2-h128": KernelCase(
        ((40, 2), (257, 2)), 128, 2, "fp8", tensor_scale=True
    ),
    "prefill-bf16-r2-h24-padded": KernelCase(((90, 90), (200, 40)), 24, 2, "bf16"),
    "mixed-bf16-r1-h16-packed-block": KernelCase(
        ((7, 1), (260, 1), (100, 30), (70, 70)), 16, 1, "bf16", packed_block=True
    ),
    "mixed-fp8-r2-h100-padded-no-sinks": KernelCase(
        ((12, 1), (300, 1), (77, 77)), 100, 2, "fp8", sinks=False
    ),
}
SM12X_CASES = {
    "decode-r2-h16": KernelCase(((5, 1), (130, 1), (300, 1)), 16, 2, "packed"),
    "decode-mtp-r1-h64": KernelCase(((64, 2), (200, 2)), 64, 1, "packed"),
    "decode-swa-only-h8": KernelCase(((50, 1), (129, 1)), 8, 0, "packed"),
    "decode-r2-h24-padded-no-sinks": KernelCase(
        ((33, 1), (500, 1)), 24, 2, "packed", sinks=False
    ),
    "prefill-r2-h32": KernelCase(((100, 70), (90, 30)), 32, 2, "packed"),
    "mixed-r1-h128": KernelCase(
        ((7, 1), (260, 1), (100, 40), (70, 70)), 128, 1, "packed"
    ),
    "prefill-swa-only-h100-padded": KernelCase(((150, 80),), 100, 0, "packed"),
}


def _layer_world(case: KernelCase, name: str) -> SimpleNamespace:
    """The kernel world of ``case`` on the pages of this GPU's layer class."""
    pages = _pages()
    states = pages.states.get(case.ratio, 64)
    return _kernel_world(case, pages.swa, states, seed=_seed(name))


@SM10X
@pytest.mark.parametrize("name", list(SM10X_CASES))
def test_sm10x_trtllm_gen_matches_reference(name: str, workspace: torch.Tensor) -> None:
    assert _kernel() == SparseMLAKernel.TRTLLM_GEN
    w = _layer_world(SM10X_CASES[name], name)
    _run_and_compare(_sm10x_arguments(w), w, "trtllm-gen", workspace)


@SM12X
@pytest.mark.parametrize("name", list(SM12X_CASES))
def test_sm12x_two_segment_matches_reference(
    name: str, workspace: torch.Tensor
) -> None:
    assert _kernel() == SparseMLAKernel.FLASHINFER_SM120
    w = _layer_world(SM12X_CASES[name], name)
    _run_and_compare(_sm12x_arguments(w), w, "sparse", workspace)


# ---------------------------------------------------------------------------
# The forward through the attention classes, real launcher
# ---------------------------------------------------------------------------


def _forward_on_gpu(
    name: str, monkeypatch: pytest.MonkeyPatch, force_kernel: str | None = None
) -> None:
    """``forward_mqa`` of the layer class with the kernel that serves this GPU
    and shape (or ``force_kernel``), on the layer's page plan, the real
    launcher and vLLM's Triton index builders. Only the forward context is a
    stand-in."""
    from vllm.models.deepseek_v41.nvidia import sparse_mla_launcher
    from vllm.utils import flashinfer as flashinfer_utils

    case = FORWARD_CASES[name]
    capability = _capability()
    assert capability is not None
    pages = _pages()
    if case.ratio:
        # The forward world pages compressed KV in 64 states on the
        # two-segment class and in a 128-token block on the TRTLLM-gen class.
        world_states = 64 if case.cls == "sm120" else 128 // case.ratio
        if pages.states[case.ratio] != world_states:
            pytest.skip(
                f"the layer pages ratio-{case.ratio} compressed KV in "
                f"{pages.states[case.ratio]} states on "
                f"SM{capability.to_int()}; this forward world uses {world_states}"
            )
    case = dataclasses.replace(case, swa_page=pages.swa)
    layer_cls = (
        fi.DeepseekV4FlashInferSM120Attention
        if case.cls == "sm120"
        else fi.DeepseekV4FlashInferMLAAttention
    )
    kernel = force_kernel or _kernel(case.heads)
    seed = random.SystemRandom().randrange(2**31)
    print(f"seed={seed} swa_page={pages.swa} kernel={kernel}")
    world = build_forward_world(case, seed)
    q_cpu = world.q
    for key in ("q", "positions", "sinks", "swa_pool", "comp_pool", "topk_buffer"):
        setattr(world, key, _to_gpu(getattr(world, key)))
    for metadata in world.attn_metadata.values():
        for key, value in vars(metadata).items():
            # *_cpu tensors are host-side by contract (slicing bounds).
            if isinstance(value, torch.Tensor) and not key.endswith("_cpu"):
                setattr(metadata, key, _to_gpu(value))
    layer = make_forward_layer(world)
    assert type(layer) is layer_cls
    layer.sparse_mla_kernel = kernel

    for klass in type(layer).__mro__:
        module = sys.modules.get(klass.__module__)
        if module is not None and hasattr(module, "get_forward_context"):
            monkeypatch.setattr(
                module,
                "get_forward_context",
                lambda: SimpleNamespace(attn_metadata=world.attn_metadata),
            )
    # Which kernel ran, and on which SWA page.
    calls: list[tuple[str, int]] = []
    flashinfer = getattr(flashinfer_utils, LAUNCHER_NAME)
    run_triton = sparse_mla_launcher.run_triton

    def flashinfer_counting(**kwargs: Any) -> Any:
        calls.append(("flashinfer", int(kwargs["swa_kv_cache"].shape[1])))
        return flashinfer(**kwargs)

    def triton_counting(**kwargs: Any) -> Any:
        calls.append(("triton", int(kwargs["swa_kv_cache"].shape[1])))
        return run_triton(**kwargs)

    monkeypatch.setattr(sparse_mla_launcher, "run_triton", triton_counting)
    # The SM120 layer reaches FlashInfer through the launcher, the SM10x layer
    # through its module's own import.
    for module in (flashinfer_utils, fi):
        monkeypatch.setattr(module, LAUNCHER_NAME, flashinfer_counting)

    output = torch.full(
        (world.q.shape[0], world.padded_heads, D),
        float("nan"),
        dtype=torch.bfloat16,
        device=DEVICE,
    )
    layer.forward_mqa(world.q, torch.empty(0, device=DEVICE), world.positions, output)
    _sync()

    ran = "triton" if kernel == SparseMLAKernel.TRITON else "flashinfer"
    assert calls, "the sparse-MLA launcher was never called"
    assert {k for k, _ in calls} == {ran}
    assert {page for _, page in calls} == {pages.swa}
    expected = dense_attention_oracle(
        q_cpu[: world.num_tokens].float(),
        world.stored,
        world.mask,
        layer.scale,
        world.sinks[: case.heads].cpu(),
    )
    real = output[: world.num_tokens, : case.heads].cpu()
    assert real.isfinite().all(), "a real token/head was never written"
    err = _rel_err(real, expected)
    print(f"max rel err {err:.3g}")
    assert err < TOL[case.kv]
    assert output[: world.num_tokens].isfinite().all()


SM120_FORWARD = [n for n, c in FORWARD_CASES.items() if c.cls == "sm120"]
SM10X_FORWARD = [n for n, c in FORWARD_CASES.items() if c.cls == "sm10x"]


@SM12X
@pytest.mark.parametrize("name", SM120_FORWARD)
def test_sm12x_forward_through_layer_class(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FlashInfer's SM120 kernels under the two-segment layer class, on its
    page plan."""
    assert _kernel() == SparseMLAKernel.FLASHINFER_SM120
    _forward_on_gpu(name, monkeypatch)


@SM10X
@pytest.mark.parametrize("name", SM10X_FORWARD)
def test_sm10x_forward_through_layer_class(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _forward_on_gpu(name, monkeypatch)


def _triton_forward_skip_reason() -> str | None:
    reason = _skip_reason(None, "the Triton kernel path", needs_flashinfer=False)
    capability = _capability()
    if reason is None and capability is not None:
        if capability.major == 10:
            reason = "SM10x runs the TRTLLM-gen class, never the Triton kernel"
        elif capability.to_int() < TRITON_MIN_CAPABILITY:
            reason = f"the Triton kernel needs SM{TRITON_MIN_CAPABILITY}+"
    return reason


@pytest.mark.skipif(
    _triton_forward_skip_reason() is not None,
    reason=_triton_forward_skip_reason() or "",
)
@pytest.mark.parametrize("name", SM120_FORWARD)
def test_two_segment_forward_on_triton(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two-segment class on the Triton sparse-MLA kernel: SM90's kernel,
    and on SM12x the kernel for shapes FlashInfer lacks (on FlashInfer's
    pages there)."""
    _forward_on_gpu(name, monkeypatch, force_kernel=SparseMLAKernel.TRITON)


# ---------------------------------------------------------------------------
# Upstream's Triton index builders on any CUDA GPU (H100/H200 step)
# ---------------------------------------------------------------------------


@dataclass
class IndexWorld:
    qsl: torch.Tensor
    seq_lens: torch.Tensor
    swa_table: torch.Tensor
    comp_table: torch.Tensor
    swa_meta: SimpleNamespace
    local: torch.Tensor  # [T, topk] request-local compressed picks, -1 = none
    num_decode_tokens: int


def _index_world(seed: int, ratio: int, swa_page: int, comp_states: int) -> IndexWorld:
    rng = random.Random(seed)
    requests = [(rng.randint(1, 400), 1) for _ in range(3)]
    for _ in range(3):
        s = rng.randint(1, 400)
        requests.append((s, rng.randint(1, s)))
    seq_lens = [s for s, _ in requests]
    swa_table, _ = _shuffled_table(rng, [-(-s // swa_page) for s in seq_lens])
    comp_table, _ = _shuffled_table(
        rng, [max(1, -(-(s // ratio) // comp_states)) for s in seq_lens]
    )
    qsl = torch.tensor(
        [0, *torch.tensor([q for _, q in requests]).cumsum(0).tolist()],
        dtype=torch.int32,
    )
    tokens = [(r, p) for r, (s, q) in enumerate(requests) for p in range(s - q, s)]
    slot_mapping = [_slot(swa_table, r, p, swa_page) for r, p in tokens]
    slot_mapping += [-1, -1]  # CUDA-graph padding rows
    swa_meta = reference_sparse_swa_metadata(
        query_start_loc=qsl,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_table=swa_table,
        slot_mapping=torch.tensor(slot_mapping),
        block_size=swa_page,
        window_size=WINDOW,
        num_decode_tokens=3,
    )
    topk = 64
    local = torch.full((len(slot_mapping), topk), -1, dtype=torch.int32)
    for t, (_, pos) in enumerate(tokens):
        visible = (pos + 1) // ratio
        picked = rng.sample(range(visible), min(visible, topk))
        local[t, : len(picked)] = torch.tensor(picked, dtype=torch.int32)
        if picked and rng.random() < 0.3:
            local[t, rng.randrange(len(picked))] = -1  # a hole inside the row
    return IndexWorld(
        qsl,
        torch.tensor(seq_lens, dtype=torch.int32),
        swa_table,
        comp_table,
        swa_meta,
        local,
        3,
    )


@ANY_CUDA
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_index_builders_global_topk_on_cuda(seed: int) -> None:
    from vllm.models.deepseek_v41.common.ops.cache_utils import (
        compute_global_topk_indices_and_lens,
    )

    w = _index_world(seed, ratio=2, swa_page=64, comp_states=64)
    args = (w.local, w.swa_meta.token_to_req_indices, w.comp_table, 64)
    expected_ids, expected_lens = reference_compute_global_topk_indices_and_lens(
        *args, w.swa_meta.is_valid_token
    )
    ids, lens = compute_global_topk_indices_and_lens(
        *(_to_gpu(a) for a in args), _to_gpu(w.swa_meta.is_valid_token)
    )
    assert torch.equal(lens.cpu(), expected_lens)
    valid = expected_ids >= 0
    assert torch.equal(ids.cpu()[valid], expected_ids[valid])


@ANY_CUDA
@pytest.mark.parametrize(
    "seed, ratio, swa_span_pad, comp_span_pad",
    [(0, 1, 0, 0), (1, 2, 0, 0), (2, 2, 0, 8), (3, 1, 16, 4)],
)
def test_index_builders_mixed_table_on_cuda(
    seed: int, ratio: int, swa_span_pad: int, comp_span_pad: int
) -> None:
    """The SM10x combined table: decode rows from the SWA metadata and local
    decode picks, prefill rows from positions; packed block spans included."""
    from vllm.models.deepseek_v41.common.ops.cache_utils import (
        build_flashinfer_mixed_sparse_indices,
    )

    swa_page, comp_states = 32, 128 // ratio
    w = _index_world(seed, ratio, swa_page, comp_states)
    nd = w.num_decode_tokens
    num_tokens = int(w.qsl[-1])
    kwargs: dict[str, Any] = dict(
        decode_swa_indices=w.swa_meta.decode_swa_indices.reshape(nd, -1),
        decode_compressed_indices=w.local[:nd].contiguous(),
        decode_compressed_topk_lens=None,
        prefill_topk_indices=w.local[nd:num_tokens].contiguous(),
        query_start_loc=w.qsl,
        seq_lens=w.seq_lens,
        token_to_req_indices=w.swa_meta.token_to_req_indices,
        swa_block_table=w.swa_table,
        swa_block_size=swa_page,
        compressed_block_table=w.comp_table,
        compressed_block_size=comp_states,
        window_size=WINDOW,
        compress_ratio=ratio,
        topk=w.local.shape[1],
        decode_compressed_indices_are_local=True,
        decode_is_valid_token=w.swa_meta.is_valid_token,
        swa_block_span=swa_page + swa_span_pad,
        compressed_block_span=comp_states + comp_span_pad,
    )
    expected_table, expected_lens = reference_build_flashinfer_mixed_sparse_indices(
        **kwargs
    )
    gpu_kwargs = {k: _to_gpu(v) for k, v in kwargs.items()}
    builder_args = inspect.signature(build_flashinfer_mixed_sparse_indices).parameters
    if "replay_start" in builder_args:
        # Builders with bounded SWA replay take each request's first window
        # position; 0 bounds nothing, which is what the reference models.
        gpu_kwargs["replay_start"] = torch.zeros(
            w.seq_lens.shape[0], dtype=torch.int32, device="cuda"
        )
    table, lens = build_flashinfer_mixed_sparse_indices(**gpu_kwargs)
    assert torch.equal(lens.cpu(), expected_lens)
    assert table.shape == expected_table.shape
    # Columns inside each row's live length must agree exactly; the kernels
    # skip the rest, so their content is free.
    live = torch.arange(expected_table.shape[1])[None, :] < expected_lens[:, None]
    assert torch.equal(table.cpu()[live], expected_table[live])
