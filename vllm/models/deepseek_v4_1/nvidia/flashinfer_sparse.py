# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The FlashInfer sparse-MLA backend under its pre-0.30.0 import path: every
name of ``vllm.models.deepseek_v41.nvidia.flashinfer_sparse`` is that module's
own object, whichever classes the installed vLLM ships."""

from typing import Any

from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as _module


def __getattr__(name: str) -> Any:
    return getattr(_module, name)


def __dir__() -> list[str]:
    return dir(_module)
