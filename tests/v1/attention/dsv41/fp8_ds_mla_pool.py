# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""DeepSeek V4.1 KV-cache pools on the CPU: the packed ``fp8_ds_mla`` record
vLLM's SM90/SM12x writer stores, and plain BF16 or FP8 pools, in the page
layouts the sparse-MLA kernels read.

Packed ``fp8_ds_mla`` page of ``S`` tokens (``stride(0)`` bytes apart):

* bytes ``[0, 576 * S)``: token ``t`` at ``576 * t``: 448 FP8 E4M3 NoPE values,
  then 64 little-endian BF16 RoPE values;
* bytes ``[576 * S, 584 * S)``: token ``t`` at ``576 * S + 8 * t``: seven UE8M0
  exponents (dims ``64 * i`` .. ``64 * i + 63`` scale by ``2 ** (byte - 127)``),
  then one unused byte;
* bytes ``[584 * S, stride(0))``: padding.

So the ``[pages, S, 584]`` tensor shape is a byte count, not a per-token record:
a token's bytes are split between the data region and the page footer.  This
was checked against vLLM's writer ``quantize_and_insert_k_kernel`` and
reader ``_dequantize_and_gather_k_kernel`` in
``vllm/models/deepseek_v41/common/ops/cache_utils.py`` and against FlashInfer's
``KVCacheTraits<ModelType::DSV4>`` / ``io_gather_scales`` (sparse_mla_sm120).
"""

from typing import Literal

import torch

HEAD_DIM = 512
NOPE_DIM = 448
ROPE_DIM = 64
QUANT_BLOCK = 64
NUM_SCALES = NOPE_DIM // QUANT_BLOCK  # 7
FP8_DS_MLA_DATA_BYTES = NOPE_DIM + 2 * ROPE_DIM  # 576
FP8_DS_MLA_SCALE_BYTES = 8
FP8_DS_MLA_BYTES_PER_TOKEN = FP8_DS_MLA_DATA_BYTES + FP8_DS_MLA_SCALE_BYTES  # 584
_FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448
_UE8M0_BIAS = 127

KVLayout = Literal["HND", "NHD"]
PoolLayout = Literal["HND", "NHD", "3D"]


# ---------------------------------------------------------------------------
# Packed fp8_ds_mla record: quantization and byte layout
# ---------------------------------------------------------------------------


def _quantize_fp8_ds_mla(
    kv: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split 512-wide latents into the three parts the packed record stores.

    Args:
        kv: ``[N, 512]`` float/BF16 latent rows.

    Returns:
        ``(nope_bytes [N, 448] uint8, exponents [N, 8] uint8 incl. the zero pad
        byte, rope [N, 64] bfloat16)``.
    """
    if kv.ndim != 2 or kv.shape[1] != HEAD_DIM:
        raise ValueError(f"expected [N, {HEAD_DIM}] latents, got {tuple(kv.shape)}")
    # vLLM's writer quantizes the BF16 activations, so round to BF16 first.
    x = kv.to(torch.bfloat16).to(torch.float32)
    nope = x[:, :NOPE_DIM].reshape(-1, NUM_SCALES, QUANT_BLOCK)
    # A tiny floor keeps all-zero blocks from producing log2(0).
    amax = nope.abs().amax(dim=-1).clamp_min(1e-4)
    # UE8M0 stores only an exponent, so the scale is rounded *up* to a power
    # of two: amax / scale never exceeds the FP8 maximum.
    exponent = torch.ceil(torch.log2(amax / _FP8_MAX))
    scaled = (nope / torch.exp2(exponent).unsqueeze(-1)).clamp(-_FP8_MAX, _FP8_MAX)
    nope_bytes = scaled.to(torch.float8_e4m3fn).view(torch.uint8).reshape(-1, NOPE_DIM)
    exponents = torch.zeros(
        x.shape[0], FP8_DS_MLA_SCALE_BYTES, dtype=torch.uint8, device=kv.device
    )
    exponents[:, :NUM_SCALES] = (exponent + _UE8M0_BIAS).clamp(0, 255).to(torch.uint8)
    rope = x[:, NOPE_DIM:].to(torch.bfloat16)
    return nope_bytes, exponents, rope


def _dequantize_fp8_ds_mla(
    nope_bytes: torch.Tensor, exponents: torch.Tensor, rope: torch.Tensor
) -> torch.Tensor:
    """Inverse of :func:`_quantize_fp8_ds_mla`; returns ``[..., 512]`` float32."""
    lead = nope_bytes.shape[:-1]
    nope = nope_bytes.contiguous().view(torch.float8_e4m3fn).to(torch.float32)
    scale = torch.exp2(exponents[..., :NUM_SCALES].to(torch.float32) - _UE8M0_BIAS)
    nope = nope.reshape(*lead, NUM_SCALES, QUANT_BLOCK) * scale.unsqueeze(-1)
    return torch.cat([nope.reshape(*lead, NOPE_DIM), rope.to(torch.float32)], dim=-1)


def fp8_ds_mla_round_trip(kv: torch.Tensor) -> torch.Tensor:
    """Values an ``fp8_ds_mla`` cache holds after storing ``kv``.

    Args:
        kv: ``[N, 512]`` float/BF16 logical latent rows.

    Returns:
        ``[N, 512]`` float32: 448 dims FP8-quantized with one UE8M0 scale per 64
        dims, 64 RoPE dims rounded to BF16.
    """
    return _dequantize_fp8_ds_mla(*_quantize_fp8_ds_mla(kv))


def packed_pool_pages(pool: torch.Tensor) -> tuple[torch.Tensor, int]:
    """View a packed pool as ``[pages, page_size * 584]`` bytes.

    Accepts FlashInfer's forms: 2-D ``[pages, page_bytes]``, 3-D
    ``[pages, S, 584]``, HND ``[pages, 1, S, 584]``, NHD ``[pages, S, 1, 584]``.
    The page stride is taken from ``stride(0)`` exactly as the SM120 binding does;
    the token stride of the tensor is ignored because the kernel never uses it.
    """
    if pool.dtype != torch.uint8:
        raise ValueError(f"packed fp8_ds_mla pool must be uint8, got {pool.dtype}")
    if pool.ndim == 2:
        if pool.shape[1] % FP8_DS_MLA_BYTES_PER_TOKEN:
            raise ValueError(f"2-D page width {pool.shape[1]} is not a multiple of 584")
        page_size = pool.shape[1] // FP8_DS_MLA_BYTES_PER_TOKEN
    elif pool.ndim == 3:
        page_size = pool.shape[1]
    elif pool.ndim == 4:
        if pool.shape[1] == 1:
            page_size = pool.shape[2]
        elif pool.shape[2] == 1:
            page_size = pool.shape[1]
        else:
            raise ValueError(f"4-D pool needs a singleton head axis: {pool.shape}")
    else:
        raise ValueError(f"packed pool must have 2-4 dims, got {pool.ndim}")
    if pool.ndim > 2 and pool.shape[-1] != FP8_DS_MLA_BYTES_PER_TOKEN:
        raise ValueError(f"packed pool last dim must be 584, got {pool.shape[-1]}")
    page_bytes = page_size * FP8_DS_MLA_BYTES_PER_TOKEN
    if pool.stride(0) < page_bytes:
        raise ValueError(
            f"page stride {pool.stride(0)} B is smaller than {page_bytes} B of records"
        )
    pages = pool.as_strided((pool.shape[0], page_bytes), (pool.stride(0), 1))
    return pages, page_size


def _split_packed_pages(
    pages: torch.Tensor, page_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Byte views ``(nope [P,S,448], rope [P,S,128], exponents [P,S,8])``."""
    num_pages = pages.shape[0]
    data_end = page_size * FP8_DS_MLA_DATA_BYTES
    data = pages[:, :data_end].reshape(num_pages, page_size, FP8_DS_MLA_DATA_BYTES)
    exponents = pages[:, data_end:].reshape(
        num_pages, page_size, FP8_DS_MLA_SCALE_BYTES
    )
    return data[..., :NOPE_DIM], data[..., NOPE_DIM:], exponents


def _slots_to_page_offset(
    slots: torch.Tensor, page_size: int, num_pages: int
) -> tuple[torch.Tensor, torch.Tensor]:
    slots = slots.to(torch.int64).reshape(-1)
    if (slots < 0).any() or (slots >= num_pages * page_size).any():
        raise IndexError(f"slot outside a pool of {num_pages} x {page_size} tokens")
    return slots // page_size, slots % page_size


def write_fp8_ds_mla(pool: torch.Tensor, slots: torch.Tensor, kv: torch.Tensor) -> None:
    """Quantize ``kv`` and store it in a packed ``fp8_ds_mla`` pool.

    Args:
        pool: packed uint8 pool in any form :func:`packed_pool_pages` accepts,
            modified in place.
        slots: ``[N]`` integer slot ids ``page * page_size + offset``.
        kv: ``[N, 512]`` float/BF16 latent rows.
    """
    pages, page_size = packed_pool_pages(pool)
    page, offset = _slots_to_page_offset(slots, page_size, pages.shape[0])
    nope_bytes, exponents, rope = _quantize_fp8_ds_mla(kv)
    nope_view, rope_view, exp_view = _split_packed_pages(pages, page_size)
    nope_view[page, offset] = nope_bytes
    rope_view[page, offset] = rope.contiguous().view(torch.uint8)
    exp_view[page, offset] = exponents


def read_fp8_ds_mla(
    pool: torch.Tensor, slots: torch.Tensor | None = None
) -> torch.Tensor:
    """Dequantize a packed ``fp8_ds_mla`` pool.

    Args:
        pool: packed uint8 pool (any accepted form).
        slots: optional ``[N]`` slot ids; ``None`` reads every slot.

    Returns:
        ``[N, 512]`` float32 rows, or ``[pages, page_size, 512]`` for ``None``.
    """
    pages, page_size = packed_pool_pages(pool)
    nope_view, rope_view, exp_view = _split_packed_pages(pages, page_size)
    if slots is not None:
        page, offset = _slots_to_page_offset(slots, page_size, pages.shape[0])
        nope_view = nope_view[page, offset]
        rope_view = rope_view[page, offset]
        exp_view = exp_view[page, offset]
    rope = rope_view.contiguous().view(torch.bfloat16)
    return _dequantize_fp8_ds_mla(nope_view, exp_view, rope)


def _alloc_paged(
    num_pages: int,
    page_size: int,
    width: int,
    page_stride: int,
    dtype: torch.dtype,
    layout: PoolLayout,
    generator: torch.Generator | None,
) -> torch.Tensor:
    if page_stride < page_size * width:
        raise ValueError(f"page stride {page_stride} < {page_size} x {width}")
    # Random bytes everywhere (padding included) so a read of an unwritten
    # slot or of page padding produces garbage instead of a plausible zero.
    numel = num_pages * page_stride
    if dtype == torch.uint8:
        flat = torch.randint(0, 256, (numel,), dtype=torch.uint8, generator=generator)
    else:
        # Finite garbage: an unwanted read shows up as a wrong value, not NaN.
        flat = (torch.randn(numel, generator=generator) * 9.0).to(dtype)
    if layout == "3D":
        size, stride = (num_pages, page_size, width), (page_stride, width, 1)
    elif layout == "NHD":
        size = (num_pages, page_size, 1, width)
        stride = (page_stride, width, width, 1)
    elif layout == "HND":
        size = (num_pages, 1, page_size, width)
        stride = (page_stride, page_size * width, width, 1)
    else:
        raise ValueError(f"unknown layout {layout!r}")
    return flat.as_strided(size, stride)


def alloc_fp8_ds_mla_pool(
    num_pages: int,
    page_size: int,
    *,
    layout: PoolLayout = "NHD",
    page_stride_bytes: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Allocate a packed ``fp8_ds_mla`` pool filled with random bytes.

    Args:
        num_pages: number of pages.
        page_size: tokens per page.
        layout: ``"NHD"`` ``[P, S, 1, 584]``, ``"HND"`` ``[P, 1, S, 584]`` or
            ``"3D"`` ``[P, S, 584]``.
        page_stride_bytes: bytes between pages; defaults to ``584 * S``, larger
            values model pools whose pages share a block with other data.
        generator: RNG for the garbage fill.
    """
    stride = page_stride_bytes or page_size * FP8_DS_MLA_BYTES_PER_TOKEN
    return _alloc_paged(
        num_pages,
        page_size,
        FP8_DS_MLA_BYTES_PER_TOKEN,
        stride,
        torch.uint8,
        layout,
        generator,
    )


def alloc_plain_pool(
    num_pages: int,
    page_size: int,
    *,
    dtype: torch.dtype = torch.bfloat16,
    layout: PoolLayout = "HND",
    page_span: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Allocate a plain 512-wide (BF16 or per-tensor FP8) pool of random values.

    Args:
        num_pages: number of pages.
        page_size: tokens per page.
        dtype: ``torch.bfloat16`` or ``torch.float8_e4m3fn``.
        layout: ``"NHD"`` ``[P, S, 1, 512]``, ``"HND"`` ``[P, 1, S, 512]`` or
            ``"3D"`` ``[P, S, 512]``.
        page_span: page stride in token rows (``>= page_size``); larger values
            model packed blocks, where SM10x indices must use
            ``page * page_span + offset``.
        generator: RNG for the garbage fill.
    """
    span = page_span or page_size
    return _alloc_paged(
        num_pages, page_size, HEAD_DIM, span * HEAD_DIM, dtype, layout, generator
    )


def plain_pages(pool: torch.Tensor, kv_layout: KVLayout) -> torch.Tensor:
    """``[P, S, 512]`` view of a plain pool given FlashInfer's layout flag."""
    if pool.ndim == 3:
        if kv_layout == "NHD":
            raise ValueError("a 3-D pool is only valid with kv_layout='HND'")
        return pool
    if pool.ndim != 4:
        raise ValueError(f"plain pool must have 3 or 4 dims, got {pool.ndim}")
    if kv_layout == "HND":
        if pool.shape[1] != 1:
            raise ValueError(f"HND pool needs shape[1] == 1, got {tuple(pool.shape)}")
        return pool[:, 0]
    if kv_layout == "NHD":
        if pool.shape[2] != 1:
            raise ValueError(f"NHD pool needs shape[2] == 1, got {tuple(pool.shape)}")
        return pool[:, :, 0]
    raise ValueError(f"kv_layout must be 'HND' or 'NHD', got {kv_layout!r}")


def write_plain_pool(
    pool: torch.Tensor,
    slots: torch.Tensor,
    kv: torch.Tensor,
    kv_layout: KVLayout = "HND",
) -> None:
    """Store ``kv`` rows (cast to the pool dtype) at ``slots``.

    Args:
        pool: plain 512-wide pool, modified in place.
        slots: ``[N]`` slot ids ``page * page_size + offset``.
        kv: ``[N, 512]`` latent rows.
        kv_layout: layout flag of ``pool`` (a 3-D pool is HND).
    """
    pages = plain_pages(pool, kv_layout)
    page, offset = _slots_to_page_offset(slots, pages.shape[1], pages.shape[0])
    pages[page, offset] = kv.to(pool.dtype)
