# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Fixtures of the page policy's tests."""

import pytest


@pytest.fixture
def fresh_flashinfer_probe():
    """The page policy asks the installed FlashInfer afresh inside the test."""
    from vllm.models.deepseek_v41.nvidia import sparse_mla_pages

    sparse_mla_pages.installed_sm120_envelope.cache_clear()
    yield
    sparse_mla_pages.installed_sm120_envelope.cache_clear()
