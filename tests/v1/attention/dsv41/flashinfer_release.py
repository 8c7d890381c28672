# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""What the installed FlashInfer's SM120 sparse-MLA decode kernels take, read
from its source independently of the page policy:

* a FlashInfer that builds them for one page size keeps that size and its
  ``(num_heads, topk)`` pairs as module constants
  (``_DECODE_DSV4_PAGE_BLOCK_SIZE``, ``_DECODE_DSV4_DISPATCH`` in
  ``flashinfer/mla/_sparse_mla_sm120.py``);
* one that takes the page at run time has none and answers through
  ``supported_sparse_mla_sm120_configs()``: its DSV4 family takes 1 to 128
  heads and any top-k from 1.
"""

import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import pytest


def _fixed_sm120_page() -> int | None:
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(spec.submodule_search_locations[0], "mla", "_sparse_mla_sm120.py")
    if not source.is_file():
        return None
    match = re.search(
        r"^_DECODE_DSV4_PAGE_BLOCK_SIZE = (\d+)", source.read_text(), re.M
    )
    return int(match[1]) if match else None


# Tokens per page the SM120 kernels are built for; None: chosen at run time.
FIXED_SM120_PAGE = _fixed_sm120_page()
# The run-time DSV4 decode envelope.
RUNTIME_MAX_HEADS = 128
RUNTIME_MIN_TOPK = 1

fixed_pages = pytest.mark.skipif(
    FIXED_SM120_PAGE is None,
    reason="the installed FlashInfer takes the SM120 page size at run time",
)
runtime_pages = pytest.mark.skipif(
    FIXED_SM120_PAGE is not None,
    reason="the installed FlashInfer builds its SM120 kernels for fixed pages",
)


def decode_config_stand_in(**overrides):
    """A stand-in for FlashInfer 0.7's SparseMLASm120DecodeConfig with its
    documented fields and its supports_decode rule."""
    fields = dict(
        page_block_size=64,
        page_block_sizes=frozenset(),
        page_block_size_is_runtime=True,
        topks=frozenset({128, 256, 512}),
        topk_is_runtime=True,
        min_topk=1,
        max_num_heads=128,
        head_counts=None,
    )
    fields.update(overrides)
    config = SimpleNamespace(**fields)

    def supports_decode(num_heads, topk, *, num_tokens=1, page_block_size=None):
        page = config.page_block_size if page_block_size is None else page_block_size
        pages = config.page_block_sizes or {config.page_block_size}
        heads_ok = 1 <= num_heads <= config.max_num_heads
        topk_ok = (
            topk >= config.min_topk if config.topk_is_runtime else topk in config.topks
        )
        page_ok = page > 0 if config.page_block_size_is_runtime else page in pages
        return heads_ok and topk_ok and page_ok

    config.supports_decode = supports_decode
    config.supported_num_heads = lambda: tuple(range(1, config.max_num_heads + 1))
    return config
