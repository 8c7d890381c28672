# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Where vLLM ships the seed's SM12x sliding-window backend, the seed's
import path names it, with its 64-token pages."""

from vllm.models.deepseek_v4_1.nvidia import flashinfer_sparse as seed_path
from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fi
from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability


def test_seed_path_names_the_sm120_sliding_window_backend(monkeypatch):
    monkeypatch.setattr(
        type(current_platform),
        "get_device_capability",
        classmethod(lambda cls, device_id=0: DeviceCapability(12, 0)),
    )
    backend = seed_path.DeepseekSparseSWAFlashInferSM120Backend
    assert backend is fi.DeepseekSparseSWAFlashInferSM120Backend
    assert fi.DeepseekV4FlashInferSM120Attention.swa_backend_cls is backend
    assert backend.get_swa_block_size() == 64
    assert backend.get_supported_kernel_block_sizes() == [64]
