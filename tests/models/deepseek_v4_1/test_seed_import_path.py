# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The seed's import path (vLLM's package name before 0.30.0) names the
backend's classes."""

from vllm.models.deepseek_v4_1.nvidia import flashinfer_sparse as seed_path
from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fi

SEED_NAMES = (
    "DeepseekV4FlashInferMLASparseBackend",
    "DeepseekV4FlashInferSparseMLAMetadataBuilder",
    "DeepseekSparseSWAFlashInferMetadataBuilder",
    "DeepseekSparseSWAFlashInferBackend",
    "DeepseekV4FlashInferMLAAttention",
    "DeepseekV4FlashInferSM120Attention",
)


def test_seed_names_are_the_backends_classes():
    for name in SEED_NAMES:
        assert getattr(seed_path, name) is getattr(fi, name), name
    backend = seed_path.DeepseekV4FlashInferMLASparseBackend
    assert backend.get_name() == "FLASHINFER_MLA_SPARSE_DSV41"
    for hook in (
        "get_supported_kernel_block_sizes",
        "get_preferred_block_size",
    ):
        assert callable(getattr(backend, hook)), hook
