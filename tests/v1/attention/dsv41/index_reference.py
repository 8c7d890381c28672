# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""First-principles references of the DeepSeek-V4 sparse-MLA index builders.

vLLM builds the FlashInfer index tables with Triton kernels that cannot
run on a CPU-only machine:

* ``compute_global_topk_indices_and_lens`` and
  ``build_flashinfer_mixed_sparse_indices``
  (``vllm/models/deepseek_v41/common/ops/cache_utils.py``);
* the SWA window tables ``decode_swa_indices`` / ``decode_swa_lens`` /
  ``prefill_swa_indices`` / ``prefill_swa_lens`` of
  ``DeepseekSparseSWAMetadataBuilder.build``
  (``vllm/v1/attention/backends/mla/sparse_swa.py``).

The functions here take the same keywords and return the same shapes and
dtypes, but compute every entry token by token from the definitions: a token's
position is ``seq_len - query_len + (token - query_start)``, its sliding window
is the last ``window_size`` positions up to and including itself, a position
``p`` of a request lives in slot ``block_table[req, p // B] * B + p % B``, and a
compressed state ``i`` (covering positions ``i * ratio .. i * ratio + ratio - 1``)
is visible once ``(position + 1) // ratio > i``.  They are deliberately slow and
plain so that they can serve as an independent check.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch


def _slot(block_table: torch.Tensor, req: int, local: int, block_size: int) -> int:
    """Slot id of logical entry ``local`` of request ``req``."""
    page = int(block_table[req, local // block_size])
    return page * block_size + local % block_size


def _to_flashinfer_row(slot: int, block_size: int, block_span: int) -> int:
    """Token-row index of a slot in a pool whose pages are ``block_span`` rows apart.

    SM10x kernels address rows by ``row * token_stride`` from the pool base, so a
    slot must be re-expressed when the page stride exceeds ``block_size`` rows.
    """
    if slot < 0:
        return -1
    return (slot // block_size) * block_span + slot % block_size


def requests_of_tokens(query_start_loc: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Request index of each token (tokens past the last request map to it).

    Args:
        query_start_loc: ``[R + 1]`` int32 cumulative query lengths.
        num_tokens: number of (possibly padded) tokens.

    Returns:
        ``[num_tokens]`` int32.
    """
    starts = [int(x) for x in query_start_loc]
    out = []
    req = 0
    for token in range(num_tokens):
        while req + 1 < len(starts) - 1 and token >= starts[req + 1]:
            req += 1
        out.append(req)
    return torch.tensor(out, dtype=torch.int32)


def _position(
    token: int, req: int, query_start_loc: torch.Tensor, seq_lens: torch.Tensor
) -> int:
    query_start = int(query_start_loc[req])
    query_len = int(query_start_loc[req + 1]) - query_start
    return int(seq_lens[req]) - query_len + (token - query_start)


def reference_compute_global_topk_indices_and_lens(
    topk_indices: torch.Tensor,
    token_to_req_indices: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    is_valid_token: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of ``compute_global_topk_indices_and_lens``.

    Args:
        topk_indices: ``[T, K]`` int32 request-local compressed indices, ``-1``
            for none.
        token_to_req_indices: ``[>= T]`` int32 request of each token.
        block_table: ``[R, max_pages]`` int32 compressed-pool pages per request.
        block_size: compressed entries per page.
        is_valid_token: ``[>= T]`` bool, False for padding tokens.

    Returns:
        ``(global [T, K] int32 slot ids or -1, lens [T] int32)``; ``lens`` counts
        the non-negative local indices (wherever they sit in the row) and is 0
        for padding tokens.
    """
    num_tokens, width = topk_indices.shape
    global_ids = torch.full((num_tokens, width), -1, dtype=torch.int32)
    lens = torch.zeros(num_tokens, dtype=torch.int32)
    for t in range(num_tokens):
        req = int(token_to_req_indices[t])
        count = 0
        for c in range(width):
            local = int(topk_indices[t, c])
            if local < 0:
                continue
            global_ids[t, c] = _slot(block_table, req, local, block_size)
            count += 1
        lens[t] = count if bool(is_valid_token[t]) else 0
    return global_ids, lens


def reference_build_flashinfer_mixed_sparse_indices(
    decode_swa_indices: torch.Tensor,
    decode_compressed_indices: torch.Tensor | None,
    decode_compressed_topk_lens: torch.Tensor | None,
    prefill_topk_indices: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    token_to_req_indices: torch.Tensor,
    swa_block_table: torch.Tensor,
    swa_block_size: int,
    compressed_block_table: torch.Tensor | None,
    compressed_block_size: int,
    window_size: int,
    compress_ratio: int,
    topk: int,
    decode_compressed_indices_are_local: bool = False,
    decode_is_valid_token: torch.Tensor | None = None,
    swa_block_span: int | None = None,
    compressed_block_span: int | None = None,
    prefill_left_visible: torch.Tensor | None = None,
    prefill_right_visible: torch.Tensor | None = None,
    max_image_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of ``build_flashinfer_mixed_sparse_indices`` (SM10x table).

    Args:
        decode_swa_indices: ``[Td, W]`` int32 SWA slots of the decode tokens
            (``W >= window_size``).
        decode_compressed_indices: ``[Td, Kd]`` int32 compressed entries of the
            decode tokens (request-local when
            ``decode_compressed_indices_are_local``, else global slots), or None.
        decode_compressed_topk_lens: ``[>= Td]`` int32 compressed lengths used
            for global decode entries; None means ``Kd``.
        prefill_topk_indices: ``[Tp, Kp]`` int32 request-local compressed
            entries of the prefill tokens.
        query_start_loc: ``[R + 1]`` int32 cumulative query lengths
            (decode requests first).
        seq_lens: ``[R]`` int32 KV lengths.
        token_to_req_indices: ``[>= Td + Tp]`` int32.
        swa_block_table: ``[R, pages]`` int32 SWA pages.
        swa_block_size: tokens per SWA page.
        compressed_block_table: ``[R, pages]`` int32 compressed pages (None:
            the SWA table).
        compressed_block_size: compressed entries per page.
        window_size: sliding window length.
        compress_ratio: tokens per compressed entry (0: SWA-only layer).
        topk: compressed width of prefill rows.
        decode_compressed_indices_are_local: see ``decode_compressed_indices``.
        decode_is_valid_token: ``[>= Td]`` bool; needed with local decode entries.
        swa_block_span: SWA page stride in token rows (None: block size).
        compressed_block_span: compressed page stride in rows (None: block size).
        prefill_left_visible: ``[>= Td + Tp]`` int32 extra visible tokens on the
            left inside an image span (vision variant), by absolute token.
        prefill_right_visible: same, on the right.
        max_image_tokens: widening of the SWA region for the vision variant.

    Returns:
        ``(sparse_indices [Td + Tp, W + image + pad4(max(topk, Kd))] int32,
        sparse_topk_lens [Td + Tp] int32)``; SWA columns first.
    """
    num_decode = decode_swa_indices.shape[0]
    num_prefill = prefill_topk_indices.shape[0]
    swa_width = decode_swa_indices.shape[1]
    image_width = max_image_tokens if prefill_left_visible is not None else 0
    swa_total = swa_width + image_width
    decode_topk = (
        0 if decode_compressed_indices is None else (decode_compressed_indices.shape[1])
    )
    padded_topk = -(-max(topk, decode_topk) // 4) * 4
    comp_table = (
        swa_block_table if compressed_block_table is None else compressed_block_table
    )
    swa_span = swa_block_size if swa_block_span is None else swa_block_span
    comp_span = (
        compressed_block_size
        if compressed_block_span is None
        else compressed_block_span
    )

    num_tokens = num_decode + num_prefill
    table = torch.full((num_tokens, swa_total + padded_topk), -1, dtype=torch.int32)
    lens = torch.zeros(num_tokens, dtype=torch.int32)

    for t in range(num_decode):
        req = int(token_to_req_indices[t])
        for c in range(swa_width):
            slot = int(decode_swa_indices[t, c])
            table[t, c] = _to_flashinfer_row(slot, swa_block_size, swa_span)
        count = 0
        for c in range(decode_topk):
            entry = int(decode_compressed_indices[t, c])  # type: ignore[index]
            if entry < 0:
                continue
            if decode_compressed_indices_are_local:
                entry = _slot(comp_table, req, entry, compressed_block_size)
                count += 1
            table[t, swa_total + c] = _to_flashinfer_row(
                entry, compressed_block_size, comp_span
            )
        if decode_topk == 0:
            compressed_len = 0
        elif decode_compressed_indices_are_local:
            assert decode_is_valid_token is not None
            compressed_len = count if bool(decode_is_valid_token[t]) else 0
        elif decode_compressed_topk_lens is not None:
            compressed_len = int(decode_compressed_topk_lens[t])
        else:
            compressed_len = decode_topk
        lens[t] = swa_total + compressed_len

    for p in range(num_prefill):
        t = num_decode + p
        req = int(token_to_req_indices[t])
        pos = _position(t, req, query_start_loc, seq_lens)
        left = int(prefill_left_visible[t]) if image_width else 0
        right = int(prefill_right_visible[t]) if image_width else 0  # type: ignore[index]
        first = max(pos - (window_size - 1) - max(left - (window_size - 1), 0), 0)
        last = pos + right
        for c, position in enumerate(range(first, last + 1)):
            if c >= swa_total:
                break
            slot = _slot(swa_block_table, req, position, swa_block_size)
            table[t, c] = _to_flashinfer_row(slot, swa_block_size, swa_span)
        visible = min((pos + 1) // compress_ratio, topk) if compress_ratio > 0 else 0
        for c in range(min(visible, prefill_topk_indices.shape[1])):
            local = int(prefill_topk_indices[p, c])
            if local < 0:
                continue
            slot = _slot(comp_table, req, local, compressed_block_size)
            table[t, swa_total + c] = _to_flashinfer_row(
                slot, compressed_block_size, comp_span
            )
        lens[t] = swa_total + visible
    return table, lens


def reference_swa_indices_and_lens(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    token_to_req_indices: torch.Tensor,
    is_valid_token: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    window_size: int,
    index_width: int,
    num_tokens: int,
    token_offset: int = 0,
    left_visible: torch.Tensor | None = None,
    right_visible: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SWA slots of ``num_tokens`` tokens starting at absolute ``token_offset``.

    Args:
        query_start_loc: ``[R + 1]`` int32.
        seq_lens: ``[R]`` int32.
        token_to_req_indices: ``[>= token_offset + num_tokens]`` int32.
        is_valid_token: ``[>= token_offset + num_tokens]`` bool.
        block_table: ``[R, pages]`` int32 SWA pages.
        block_size: tokens per SWA page.
        window_size: sliding window length.
        index_width: columns per row (``window_size`` for text models).
        num_tokens: rows to produce.
        token_offset: absolute index of the first row's token.
        left_visible: optional ``[>= ...]`` int32 in-image left visibility.
        right_visible: optional ``[>= ...]`` int32 in-image right visibility.

    Returns:
        ``(indices [num_tokens, 1, index_width] int32, lens [num_tokens] int32)``:
        the window's slots oldest first, then ``-1``; padding tokens get an all
        ``-1`` row and length 0.
    """
    indices = torch.full((num_tokens, 1, index_width), -1, dtype=torch.int32)
    lens = torch.zeros(num_tokens, dtype=torch.int32)
    for row in range(num_tokens):
        t = token_offset + row
        if not bool(is_valid_token[t]):
            continue
        req = int(token_to_req_indices[t])
        pos = _position(t, req, query_start_loc, seq_lens)
        left = int(left_visible[t]) if left_visible is not None else 0
        right = int(right_visible[t]) if right_visible is not None else 0
        first = max(pos - (window_size - 1) - max(left - (window_size - 1), 0), 0)
        positions = range(first, pos + right + 1)
        lens[row] = len(positions)
        for c, position in enumerate(positions):
            if c < index_width:
                indices[row, 0, c] = _slot(block_table, req, position, block_size)
    return indices, lens


def reference_sparse_swa_metadata(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_size: int,
    window_size: int,
    num_decode_tokens: int,
    prefill_index_width: int | None = None,
) -> SimpleNamespace:
    """SWA index metadata as ``DeepseekSparseSWAMetadataBuilder.build`` fills it.

    Causal text-model case (no DSpark, no image spans).

    Args:
        query_start_loc: ``[R + 1]`` int32, decode requests first.
        seq_lens: ``[R]`` int32.
        block_table: ``[R, pages]`` int32 SWA pages.
        slot_mapping: ``[T]`` int64 write slots; ``-1`` marks padding tokens.
        block_size: tokens per SWA page.
        window_size: sliding window length.
        num_decode_tokens: tokens of the leading decode requests.
        prefill_index_width: prefill row width (default ``window_size``).

    Returns:
        Namespace with ``token_to_req_indices [T]``, ``is_valid_token [T]``,
        ``decode_swa_indices [Td, 1, window]``, ``decode_swa_lens [Td]``,
        ``prefill_swa_indices [Tp, 1, width]`` and ``prefill_swa_lens [Tp]``
        (the prefill ones None when there is no prefill token).
    """
    num_tokens = slot_mapping.shape[0]
    token_to_req = requests_of_tokens(query_start_loc, num_tokens)
    is_valid = slot_mapping >= 0
    common = dict(
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        token_to_req_indices=token_to_req,
        is_valid_token=is_valid,
        block_table=block_table,
        block_size=block_size,
        window_size=window_size,
    )
    decode_indices, decode_lens = reference_swa_indices_and_lens(
        index_width=window_size, num_tokens=num_decode_tokens, token_offset=0, **common
    )
    num_prefill_tokens = num_tokens - num_decode_tokens
    prefill_indices = prefill_lens = None
    if num_prefill_tokens > 0:
        prefill_indices, prefill_lens = reference_swa_indices_and_lens(
            index_width=prefill_index_width or window_size,
            num_tokens=num_prefill_tokens,
            token_offset=num_decode_tokens,
            **common,
        )
    return SimpleNamespace(
        token_to_req_indices=token_to_req,
        is_valid_token=is_valid,
        decode_swa_indices=decode_indices,
        decode_swa_lens=decode_lens,
        prefill_swa_indices=prefill_indices,
        prefill_swa_lens=prefill_lens,
    )
