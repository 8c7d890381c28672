# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Pure-PyTorch reference of FlashInfer's DeepSeek-V4 sparse-MLA decode contract.

``reference_sparse_mla_dsv4`` takes the keywords of
``flashinfer.decode.trtllm_batch_decode_sparse_mla_dsv4`` (flashinfer-python
0.6.18.post1) that vLLM's FlashInfer backends pass, and computes the same
attention on CPU in float32.  Two index forms exist:

* SM10x ("trtllm-gen"), one combined table.  The first 128 columns of
  ``sparse_indices`` address the SWA pool and the remaining columns the
  compressed pool.  An index is a *token row*: the kernel adds
  ``index * token_stride`` to the pool's base pointer, where ``token_stride`` is
  the compressed pool's ``stride(-2)`` (the launcher uses that one stride for
  both pools).  Pools whose page stride exceeds ``page_size * token_stride``
  therefore need ``page * (page_stride // token_stride) + offset`` indices.
  ``sparse_topk_lens`` counts the active columns including the 128 SWA ones;
  ``seq_lens`` with the query layout gives each query token its position so the
  SWA window never reaches past ``min(position + 1, 128)`` columns.  That last
  rule is a reading of the launcher (it passes ``seq_lens``, ``window_left=127``
  and ``is_causal=True`` to a closed cubin); it could not be confirmed from
  source.  vLLM's tables put the window oldest first and ``-1`` after it, so
  for them the rule never changes the result.
  Query and pools are BF16 or per-tensor FP8 E4M3 (512 values per token).
* SM12x ("sparse"), two segments.  ``sparse_indices`` + ``swa_topk_lens`` index
  the SWA pool, optional ``extra_sparse_indices`` + ``extra_sparse_topk_lens``
  index ``compressed_kv_cache``.  An index is a *slot*
  ``page * page_size + offset``; the page address comes from the pool's
  ``stride(0)`` so padded page strides need no index remapping.  The pools are
  the packed ``fp8_ds_mla`` layout (584 bytes per token, see below) and the
  query is BF16.

Both forms: an index ``< 0`` and any column at or past the row's active length
is skipped; ``sinks[h]`` (natural-log logit, not multiplied by ``bmm1_scale``)
joins the softmax denominator; a row with no usable slot yields zeros; the
value vector is the full 512-wide latent (448 NoPE + 64 RoPE dims), i.e. V = K.
Scores are ``bmm1_scale * q.k`` in natural-log units for both the float and the
one-element-tensor form (FlashInfer converts the tensor form to log2 units
itself); the output is multiplied by ``bmm2_scale``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from tests.v1.attention.dsv41.fp8_ds_mla_pool import (
    HEAD_DIM,
    KVLayout,
    packed_pool_pages,
    plain_pages,
    read_fp8_ds_mla,
)

SWA_COLUMNS = 128
SUPPORTED_NUM_HEADS = (8, 16, 32, 64, 128)
# Tokens handled per batched matmul; bounds the gathered [chunk, slots, 512]
# float32 working set.
_TOKEN_CHUNK = 64


# ---------------------------------------------------------------------------
# Dense oracle
# ---------------------------------------------------------------------------


def dense_attention_oracle(
    query: torch.Tensor,
    kv: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    sinks: torch.Tensor | None = None,
    output_scale: float = 1.0,
) -> torch.Tensor:
    """Dense masked MQA attention in float64 over logical (unpaged) rows.

    Args:
        query: ``[T, H, 512]`` query tokens.
        kv: ``[N, 512]`` logical latent rows, used as both key and value.
        mask: ``[T, N]`` bool, ``True`` where token ``t`` attends to row ``n``.
        scale: multiplier of ``q.k`` (natural-log logits).
        sinks: optional ``[H]`` sink logits added to each softmax denominator.
        output_scale: multiplier of the normalized output.

    Returns:
        ``[T, H, 512]`` float64; rows with an empty mask are zero.
    """
    q = query.to(torch.float64)
    k = kv.to(torch.float64)
    out = torch.zeros(q.shape, dtype=torch.float64)
    sink = None if sinks is None else sinks.to(torch.float64)
    # One token at a time over only its own rows: slow but transparent.
    for t in range(q.shape[0]):
        rows = k[mask[t]]
        if rows.shape[0] == 0:
            continue
        logits = q[t] @ rows.T * scale  # [H, n]
        row_max = logits.amax(dim=-1, keepdim=True)
        if sink is not None:
            row_max = torch.maximum(row_max, sink[:, None])
        weights = torch.exp(logits - row_max)
        denom = weights.sum(dim=-1, keepdim=True)
        if sink is not None:
            denom = denom + torch.exp(sink[:, None] - row_max)
        out[t] = weights @ rows / denom
    return out * output_scale


# ---------------------------------------------------------------------------
# The reference launcher
# ---------------------------------------------------------------------------


def _scale_value(scale: float | torch.Tensor, name: str, allow_tensor: bool) -> float:
    if isinstance(scale, torch.Tensor):
        if not allow_tensor:
            raise ValueError(f"SM120 DSv4 sparse MLA expects {name} to be a float")
        if scale.dtype != torch.float32:
            raise TypeError(f"{name} tensor must have dtype torch.float32")
        if scale.numel() != 1:
            raise ValueError(f"{name} tensor must hold one value")
        return float(scale.item())
    return float(scale)


def _check_int32(t: torch.Tensor | None, name: str) -> None:
    if t is not None and t.dtype != torch.int32:
        raise ValueError(f"{name} must be int32, got {t.dtype}")


def _attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    valid: torch.Tensor,
    scale: float,
    output_scale: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Masked MQA softmax in float32.

    Args:
        q: ``[T, H, 512]`` float32.
        keys: ``[T, K, 512]`` float32 gathered rows (garbage where invalid).
        valid: ``[T, K]`` bool.
    """
    keys = torch.where(valid[..., None], keys, torch.zeros((), dtype=keys.dtype))
    logits = torch.einsum("thd,tkd->thk", q, keys) * scale
    logits = logits.masked_fill(~valid[:, None, :], -math.inf)
    row_max = logits.amax(dim=-1, keepdim=True)
    if sinks is not None:
        row_max = torch.maximum(row_max, sinks[None, :, None])
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    weights = torch.exp(logits - row_max)
    denom = weights.sum(dim=-1, keepdim=True)
    if sinks is not None:
        denom = denom + torch.exp(sinks[None, :, None] - row_max)
    out = torch.einsum("thk,tkd->thd", weights, keys)
    has_slot = valid.any(dim=-1)[:, None, None]
    out = torch.where(has_slot, out / denom.clamp_min(1e-30), torch.zeros_like(out))
    return out * output_scale


def _run_attention(
    q_flat: torch.Tensor,
    segments: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    scale: float,
    output_scale: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Attend over one or more ``(rows [P*S, 512], flat_ids [T, K], valid)``.

    ``flat_ids`` index ``rows`` and must be in range even where ``valid`` is
    False (callers park those on row 0).
    """
    num_tokens = q_flat.shape[0]
    out = torch.empty(num_tokens, q_flat.shape[1], HEAD_DIM, dtype=torch.float32)
    sinks_f = sinks.to(torch.float32) if sinks is not None else None
    for start in range(0, num_tokens, _TOKEN_CHUNK):
        stop = min(start + _TOKEN_CHUNK, num_tokens)
        keys, valid = [], []
        for rows, ids, ok in segments:
            keys.append(rows[ids[start:stop]])
            valid.append(ok[start:stop])
        out[start:stop] = _attend(
            q_flat[start:stop],
            torch.cat(keys, dim=1),
            torch.cat(valid, dim=1),
            scale,
            output_scale,
            sinks_f,
        )
    return out


def _check_heads(num_heads: int, head_dim: int) -> None:
    if head_dim != HEAD_DIM:
        raise ValueError(f"Expected query head dim 512, got {head_dim}")
    if num_heads not in SUPPORTED_NUM_HEADS:
        raise ValueError(f"Expected 8, 16, 32, 64, or 128 query heads, got {num_heads}")


def _prepare_out(out: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=torch.bfloat16)
    # FlashInfer writes BF16; a float32 ``out`` is accepted here so tests can
    # see the reference's unrounded float32 result.
    if out.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(
            f"out must be bfloat16 (or float32 for tests), got {out.dtype}"
        )
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"Expected out.shape == {shape}, got {tuple(out.shape)}")
    return out


def _flat_rows_in_pool(
    ids: torch.Tensor, pages: torch.Tensor, span: int, name: str
) -> torch.Tensor:
    """Map SM10x token-row indices to flat ``page * page_size + offset`` ids."""
    page_size = pages.shape[1]
    page = ids // span
    offset = ids % span
    if (page >= pages.shape[0]).any():
        raise IndexError(f"{name} addresses a page past the pool ({pages.shape[0]})")
    if (offset >= page_size).any():
        raise IndexError(
            f"{name} addresses page padding (offset >= page size {page_size}); "
            "indices of a packed pool must use page * span + offset"
        )
    return page * page_size + offset


def _trtllm_gen_form(
    *,
    query: torch.Tensor,
    swa_kv_cache: torch.Tensor,
    sparse_indices: torch.Tensor | None,
    compressed_kv_cache: torch.Tensor | None,
    sparse_topk_lens: torch.Tensor | None,
    seq_lens: torch.Tensor | None,
    out: torch.Tensor | None,
    bmm1_scale: float | torch.Tensor,
    bmm2_scale: float | torch.Tensor,
    sinks: torch.Tensor | None,
    kv_layout: KVLayout,
    cum_seq_lens_q: torch.Tensor | None,
    max_q_len: int | None,
) -> torch.Tensor:
    scale = _scale_value(bmm1_scale, "bmm1_scale", allow_tensor=True)
    output_scale = _scale_value(bmm2_scale, "bmm2_scale", allow_tensor=True)
    if sparse_topk_lens is None or compressed_kv_cache is None or seq_lens is None:
        raise ValueError(
            "backend='trtllm-gen' requires compressed_kv_cache, sparse_topk_lens, "
            "and seq_lens"
        )
    if sparse_indices is None:
        raise ValueError("backend='trtllm-gen' requires sparse_indices")
    if query.dtype not in (torch.bfloat16, torch.float8_e4m3fn):
        raise ValueError(f"query must be BF16 or FP8 E4M3, got {query.dtype}")

    if cum_seq_lens_q is not None:
        if query.ndim != 3:
            raise ValueError("Expected query.ndim == 3 when cum_seq_lens_q is given")
        if max_q_len is None or max_q_len <= 0:
            raise ValueError("max_q_len > 0 is required with cum_seq_lens_q")
        _check_int32(cum_seq_lens_q, "cum_seq_lens_q")
        cu = cum_seq_lens_q.to(torch.int64)
        batch_size = cu.numel() - 1
        q_flat = query
        if batch_size <= 0 or int(cu[0]) != 0 or int(cu[-1]) != query.shape[0]:
            raise ValueError("cum_seq_lens_q must run from 0 to the query token count")
        q_lens = cu[1:] - cu[:-1]
        if int(q_lens.max()) > max_q_len:
            raise ValueError("a request is longer than max_q_len")
    else:
        if query.ndim != 4:
            raise ValueError(f"Expected query.ndim == 4, got {query.ndim}")
        batch_size, q_len = query.shape[:2]
        if max_q_len is not None and max_q_len != q_len:
            raise ValueError(f"Expected max_q_len == {q_len}, got {max_q_len}")
        q_flat = query.flatten(0, 1)
        q_lens = torch.full((batch_size,), q_len, dtype=torch.int64)
    num_tokens, num_heads, head_dim = q_flat.shape
    _check_heads(num_heads, head_dim)

    _check_int32(sparse_indices, "sparse_indices")
    _check_int32(sparse_topk_lens, "sparse_topk_lens")
    _check_int32(seq_lens, "seq_lens")
    if sparse_indices.ndim != 2 or sparse_indices.shape[0] != num_tokens:
        raise ValueError(
            f"Expected sparse_indices of shape [{num_tokens}, topk], "
            f"got {tuple(sparse_indices.shape)}"
        )
    width = sparse_indices.shape[1]
    if width < SWA_COLUMNS or width % 4:
        raise ValueError(
            f"sparse_indices needs >= 128 columns and a multiple of 4, got {width}"
        )
    if tuple(sparse_topk_lens.shape) != (num_tokens,):
        raise ValueError(f"Expected sparse_topk_lens of shape ({num_tokens},)")
    lens = sparse_topk_lens.to(torch.int64)
    if (lens < SWA_COLUMNS).any() or (lens > width).any():
        raise ValueError(
            "sparse_topk_lens must include the 128 SWA columns and fit the table"
        )
    if tuple(seq_lens.shape) != (batch_size,):
        raise ValueError(f"Expected seq_lens of shape ({batch_size},)")
    seq = seq_lens.to(torch.int64)
    if (seq < q_lens).any():
        raise ValueError("seq_lens must be >= the per-request query lengths")
    if sinks is not None and (
        sinks.dtype != torch.float32 or tuple(sinks.shape) != (num_heads,)
    ):
        raise ValueError(f"sinks must be float32 of shape ({num_heads},)")

    swa_pages = plain_pages(swa_kv_cache, kv_layout)
    comp_pages = plain_pages(compressed_kv_cache, kv_layout)
    for name, pages in (
        ("swa_kv_cache", swa_pages),
        ("compressed_kv_cache", comp_pages),
    ):
        if pages.dtype != query.dtype:
            raise ValueError(f"{name} dtype must match query dtype {query.dtype}")
        if pages.shape[-1] != HEAD_DIM or pages.stride(-1) != 1:
            raise ValueError(f"{name} must hold contiguous 512-wide rows")
    token_stride = comp_pages.stride(1)
    if swa_pages.stride(1) != token_stride:
        # The launcher applies the compressed pool's token stride to both.
        raise ValueError("both pools must share one token stride")
    spans = []
    for name, pages in (
        ("swa_kv_cache", swa_pages),
        ("compressed_kv_cache", comp_pages),
    ):
        if pages.stride(0) % token_stride:
            raise ValueError(f"{name} page stride is not a whole number of token rows")
        spans.append(pages.stride(0) // token_stride)

    # Position of each query token inside its request: the SWA window of a
    # token at position p holds at most p + 1 entries.
    req = torch.repeat_interleave(torch.arange(batch_size), q_lens)
    first_pos = (seq - q_lens)[req]
    starts = torch.cumsum(q_lens, 0) - q_lens
    positions = first_pos + torch.arange(num_tokens) - starts[req]
    swa_limit = torch.clamp(positions + 1, max=SWA_COLUMNS)

    ids = sparse_indices.to(torch.int64)
    cols = torch.arange(width)
    active = (cols[None, :] < lens[:, None]) & (ids >= 0)
    swa_ok = active[:, :SWA_COLUMNS] & (cols[None, :SWA_COLUMNS] < swa_limit[:, None])
    comp_ok = active[:, SWA_COLUMNS:]

    swa_ids = torch.where(swa_ok, ids[:, :SWA_COLUMNS], 0)
    comp_ids = torch.where(comp_ok, ids[:, SWA_COLUMNS:], 0)
    swa_flat = _flat_rows_in_pool(swa_ids, swa_pages, spans[0], "swa index")
    comp_flat = _flat_rows_in_pool(comp_ids, comp_pages, spans[1], "compressed index")

    result = _run_attention(
        q_flat.to(torch.float32),
        [
            (swa_pages.to(torch.float32).reshape(-1, HEAD_DIM), swa_flat, swa_ok),
            (comp_pages.to(torch.float32).reshape(-1, HEAD_DIM), comp_flat, comp_ok),
        ],
        scale,
        output_scale,
        sinks,
    )
    out = _prepare_out(out, tuple(query.shape[:-1]) + (HEAD_DIM,))
    out.copy_(result.reshape(out.shape))
    return out


def _segment(
    indices: torch.Tensor,
    lengths: torch.Tensor | None,
    batch_size: int,
    q_len: int,
    name: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten one SM120 segment; returns ``(ids [T, K] int64, valid [T, K])``."""
    _check_int32(indices, name)
    num_tokens = batch_size * q_len
    if indices.ndim == 3:
        if tuple(indices.shape[:2]) != (batch_size, q_len):
            raise ValueError(
                f"Expected {name}.shape == ({batch_size}, {q_len}, topk), "
                f"got {tuple(indices.shape)}"
            )
        indices = indices.reshape(num_tokens, -1)
    elif indices.ndim != 2 or indices.shape[0] != num_tokens:
        raise ValueError(
            f"Expected {name}.shape == ({num_tokens}, topk), got {tuple(indices.shape)}"
        )
    width = indices.shape[1]
    if width <= 0:
        raise ValueError(f"{name} requires top-k > 0")
    if lengths is None:
        count = torch.full((num_tokens,), width, dtype=torch.int64)
    else:
        _check_int32(lengths, f"{name} lengths")
        if lengths.numel() != num_tokens or lengths.ndim not in (1, 2):
            raise ValueError(f"{name} lengths must have {num_tokens} entries")
        # The kernel clamps the active length into [0, topk].
        count = lengths.reshape(-1).to(torch.int64).clamp(0, width)
    ids = indices.to(torch.int64)
    valid = (torch.arange(width)[None, :] < count[:, None]) & (ids >= 0)
    return ids, valid


def _sm120_form(
    *,
    query: torch.Tensor,
    swa_kv_cache: torch.Tensor,
    sparse_indices: torch.Tensor | None,
    compressed_kv_cache: torch.Tensor | None,
    swa_topk_lens: torch.Tensor | None,
    extra_sparse_indices: torch.Tensor | None,
    extra_sparse_topk_lens: torch.Tensor | None,
    out: torch.Tensor | None,
    bmm1_scale: float | torch.Tensor,
    bmm2_scale: float | torch.Tensor,
    sinks: torch.Tensor | None,
    kv_layout: KVLayout,
) -> torch.Tensor:
    scale = _scale_value(bmm1_scale, "bmm1_scale", allow_tensor=False)
    if _scale_value(bmm2_scale, "bmm2_scale", allow_tensor=False) != 1.0:
        raise ValueError("SM120 DSv4 sparse MLA does not support bmm2_scale")
    if sparse_indices is None:
        raise ValueError("backend='sparse' requires sparse_indices")
    if swa_topk_lens is None:
        raise ValueError("backend='sparse' requires swa_topk_lens")
    if query.dtype != torch.bfloat16:
        raise ValueError(
            f"SM120 DSv4 sparse MLA only supports BF16 query, got {query.dtype}"
        )
    if query.ndim == 3:
        batch_size, q_len = query.shape[0], 1
    elif query.ndim == 4:
        batch_size, q_len = query.shape[:2]
    else:
        raise ValueError(f"Expected query.ndim == 3 or 4, got {query.ndim}")
    num_heads, head_dim = query.shape[-2:]
    _check_heads(num_heads, head_dim)
    if (extra_sparse_indices is None) != (extra_sparse_topk_lens is None):
        raise ValueError(
            "extra_sparse_indices and extra_sparse_topk_lens must be provided together"
        )
    if extra_sparse_indices is not None and compressed_kv_cache is None:
        raise ValueError("compressed_kv_cache is required with extra_sparse_indices")
    if sinks is not None and (
        sinks.dtype != torch.float32 or tuple(sinks.shape) != (num_heads,)
    ):
        raise ValueError(f"sinks must be float32 of shape ({num_heads},)")

    segments = []
    pools = [(swa_kv_cache, sparse_indices, swa_topk_lens, "sparse_indices")]
    if extra_sparse_indices is not None:
        pools.append(
            (
                compressed_kv_cache,
                extra_sparse_indices,
                extra_sparse_topk_lens,
                "extra_sparse_indices",
            )
        )
    for pool, indices, lengths, name in pools:
        if pool.ndim == 4:
            singleton = 1 if kv_layout == "HND" else 2
            if pool.shape[singleton] != 1:
                raise ValueError(f"{kv_layout} pool needs shape[{singleton}] == 1")
        if pool.dtype != torch.uint8:
            # FlashInfer's Python check lets a BF16 pool through, but the SM120
            # binding requires the 584-byte packed record.
            raise ValueError("SM120 pools must be the packed uint8 fp8_ds_mla layout")
        pages, page_size = packed_pool_pages(pool)
        values = read_fp8_ds_mla(pool).reshape(-1, HEAD_DIM)
        ids, valid = _segment(indices, lengths, batch_size, q_len, name)
        if ((ids >= pages.shape[0] * page_size) & valid).any():
            raise IndexError(f"{name} addresses a slot past the pool")
        segments.append((values, torch.where(valid, ids, 0), valid))

    num_tokens = batch_size * q_len
    result = _run_attention(
        query.reshape(num_tokens, num_heads, HEAD_DIM).to(torch.float32),
        segments,
        scale,
        1.0,
        sinks,
    )
    out = _prepare_out(out, tuple(query.shape[:-1]) + (HEAD_DIM,))
    out.copy_(result.reshape(out.shape))
    return out


def reference_sparse_mla_dsv4(
    query: torch.Tensor,
    swa_kv_cache: torch.Tensor,
    workspace_buffer: torch.Tensor | None = None,
    sparse_indices: torch.Tensor | None = None,
    compressed_kv_cache: torch.Tensor | None = None,
    sparse_topk_lens: torch.Tensor | None = None,
    seq_lens: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    bmm1_scale: float | torch.Tensor = 1.0,
    bmm2_scale: float | torch.Tensor = 1.0,
    sinks: torch.Tensor | None = None,
    kv_layout: KVLayout = "HND",
    cum_seq_lens_q: torch.Tensor | None = None,
    max_q_len: int | None = None,
    enable_pdl: bool | None = None,
    swa_topk_lens: torch.Tensor | None = None,
    extra_sparse_indices: torch.Tensor | None = None,
    extra_sparse_topk_lens: torch.Tensor | None = None,
    backend: Literal["auto", "trtllm-gen", "sparse"] = "auto",
) -> torch.Tensor:
    """CPU reference of ``flashinfer.decode.trtllm_batch_decode_sparse_mla_dsv4``.

    ``backend="auto"`` picks the SM120 two-segment form when ``swa_topk_lens``
    is given and the SM10x combined form otherwise (FlashInfer picks by GPU
    architecture and then rejects the other form's arguments).

    Args:
        query: ``[sum_q, H, 512]`` (with ``cum_seq_lens_q``, or SM120) or
            ``[B, q_len, H, 512]``; BF16, or FP8 E4M3 on SM10x. ``H`` in
            {8, 16, 32, 64, 128}.
        swa_kv_cache: SWA pool. SM10x: plain ``[P, 1, S, 512]`` (HND),
            ``[P, S, 1, 512]`` (NHD) or ``[P, S, 512]`` of the query dtype.
            SM120: packed uint8 ``fp8_ds_mla`` pool (``[..., 584]`` forms).
        workspace_buffer: ignored (scratch of the real kernels).
        sparse_indices: int32. SM10x: ``[sum_q, 128 + topk]`` token rows, SWA
            columns first. SM120: ``[sum_q, K]`` or ``[B, q_len, K]`` SWA slots.
        compressed_kv_cache: compressed pool, same kind as ``swa_kv_cache``.
        sparse_topk_lens: SM10x ``[sum_q]`` int32 active columns incl. the 128
            SWA ones.
        seq_lens: SM10x ``[B]`` int32 KV length of each request; bounds the
            SWA columns by each token's position.
        out: ``query``-shaped output written in place (BF16; float32 accepted
            for tests).
        bmm1_scale: logit multiplier (float or one-element float32 tensor on
            SM10x; float on SM120).
        bmm2_scale: output multiplier (must be 1.0 on SM120).
        sinks: optional ``[H]`` float32 sink logits.
        kv_layout: ``"HND"`` or ``"NHD"`` layout of both pools.
        cum_seq_lens_q: SM10x ``[B + 1]`` int32 query offsets for varlen query.
        max_q_len: longest request in the varlen batch (required with it).
        enable_pdl: ignored.
        swa_topk_lens: SM120 ``[sum_q]`` int32 active SWA-segment lengths.
        extra_sparse_indices: SM120 compressed-segment slots, ``[sum_q, K2]``
            or ``[B, q_len, K2]`` int32.
        extra_sparse_topk_lens: SM120 ``[sum_q]`` int32 compressed lengths.
        backend: ``"auto"``, ``"trtllm-gen"`` (SM10x) or ``"sparse"`` (SM120).

    Returns:
        ``out``.
    """
    del workspace_buffer, enable_pdl
    if backend == "auto":
        backend = "sparse" if swa_topk_lens is not None else "trtllm-gen"
    if backend == "sparse":
        if sparse_topk_lens is not None or seq_lens is not None:
            raise ValueError("sparse_topk_lens/seq_lens belong to the SM10x form")
        return _sm120_form(
            query=query,
            swa_kv_cache=swa_kv_cache,
            sparse_indices=sparse_indices,
            compressed_kv_cache=compressed_kv_cache,
            swa_topk_lens=swa_topk_lens,
            extra_sparse_indices=extra_sparse_indices,
            extra_sparse_topk_lens=extra_sparse_topk_lens,
            out=out,
            bmm1_scale=bmm1_scale,
            bmm2_scale=bmm2_scale,
            sinks=sinks,
            kv_layout=kv_layout,
        )
    if backend != "trtllm-gen":
        raise ValueError(f"unsupported backend {backend!r}")
    if (
        swa_topk_lens is not None
        or extra_sparse_indices is not None
        or extra_sparse_topk_lens is not None
    ):
        raise ValueError(
            "swa_topk_lens, extra_sparse_indices, and extra_sparse_topk_lens "
            "are only supported on SM120/SM121"
        )
    return _trtllm_gen_form(
        query=query,
        swa_kv_cache=swa_kv_cache,
        sparse_indices=sparse_indices,
        compressed_kv_cache=compressed_kv_cache,
        sparse_topk_lens=sparse_topk_lens,
        seq_lens=seq_lens,
        out=out,
        bmm1_scale=bmm1_scale,
        bmm2_scale=bmm2_scale,
        sinks=sinks,
        kv_layout=kv_layout,
        cum_seq_lens_q=cum_seq_lens_q,
        max_q_len=max_q_len,
    )
