# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The FlashInfer sparse-MLA backend under its pre-0.30.0 import path: the
objects of ``vllm.models.deepseek_v41.nvidia.flashinfer_sparse`` themselves."""

from vllm.models.deepseek_v41.nvidia.flashinfer_sparse import (  # noqa: F401
    DeepseekSparseSWAFlashInferBackend,
    DeepseekSparseSWAFlashInferMetadataBuilder,
    DeepseekV4FlashInferMLAAttention,
    DeepseekV4FlashInferMLASparseBackend,
    DeepseekV4FlashInferSM120Attention,
    DeepseekV4FlashInferSparseMLAMetadataBuilder,
)
