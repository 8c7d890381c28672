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
