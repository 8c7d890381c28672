# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""What the installed FlashInfer's SM120 sparse-MLA decode kernels take, as
facts of the releases the tests run against (read from their sources):

* 0.6.14 - 0.6.18: kernels built for 64-token pages and a fixed set of
  ``(num_heads, topk)`` pairs (``_DECODE_DSV4_PAGE_BLOCK_SIZE``,
  ``_DECODE_DSV4_DISPATCH`` in ``flashinfer/mla/_sparse_mla_sm120.py``);
* 0.7.x: ``supported_sparse_mla_sm120_configs()``; the DSV4 family takes 1 to
  128 heads, any top-k from 1 and the page size at run time.
"""

import importlib.metadata

import pytest

FLASHINFER = importlib.metadata.version("flashinfer-python")
VLLM = importlib.metadata.version("vllm")
# Tokens per page the SM120 kernels are built for; None: chosen at run time.
FIXED_SM120_PAGE = 64 if FLASHINFER.startswith("0.6.") else None
# FlashInfer 0.7's DSV4 decode envelope.
RUNTIME_MAX_HEADS = 128
RUNTIME_MIN_TOPK = 1

fixed_pages = pytest.mark.skipif(
    FIXED_SM120_PAGE is None,
    reason=f"flashinfer {FLASHINFER} takes the SM120 page size at run time",
)
runtime_pages = pytest.mark.skipif(
    FIXED_SM120_PAGE is not None,
    reason=f"flashinfer {FLASHINFER} builds its SM120 kernels for fixed pages",
)
