# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""What vLLM itself decides at start-up, asked the way start-up asks: through
the backends' hooks and the platform, with the GPU mocked at the platform
boundary (``set_capability``). The plan report's answers are held against
these."""

from vllm.config import DeviceConfig, VllmConfig
from vllm.config.cache import CacheConfig
from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fi
from vllm.platforms import current_platform
from vllm.v1.attention.backends.mla.indexer import DeepseekV41IndexerBackend


def two_segment_backend(major: int) -> str:
    """The --attention-backend that builds a two-segment sparse-MLA layer on
    a GPU of ``major``: the Triton backend's off Blackwell where vLLM has it
    (elsewhere FlashInfer's name runs the Triton kernel off Blackwell)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    triton = "TRITON_MLA_SPARSE_DSV41"
    if major not in (10, 12) and triton in AttentionBackendEnum.__members__:
        return triton
    return "FLASHINFER_MLA_SPARSE_DSV41"


def layer_class(capability):
    """The attention class the model builds with ``two_segment_backend`` on
    the (mocked) GPU: upstream's ``_select_dsv4_attn_cls``."""
    from types import SimpleNamespace

    from vllm.models.deepseek_v41.nvidia.model import _select_dsv4_attn_cls
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    assert current_platform.get_device_capability() == capability
    config = SimpleNamespace(
        attention_config=SimpleNamespace(
            backend=AttentionBackendEnum[two_segment_backend(capability.major)]
        ),
        parallel_config=SimpleNamespace(prefill_context_parallel_size=1),
    )
    return _select_dsv4_attn_cls(config)


def vllms_default_block_size(capability) -> int:
    """The --block-size vLLM picks when none is given, on the mocked GPU of
    ``capability``: from vLLM 0.33 the platform's choice over the backends of
    the model's layers, before it the sparse-MLA backend's preference."""
    assert current_platform.get_device_capability() == capability
    platform = type(current_platform)
    layer = layer_class(capability)
    backends = [layer.backend_cls, layer.swa_backend_cls, DeepseekV41IndexerBackend]
    default = CacheConfig.DEFAULT_BLOCK_SIZE
    if hasattr(platform, "_preferred_block_size_for_backends"):
        config = VllmConfig(device_config=DeviceConfig(device="cpu"))
        return platform._preferred_block_size_for_backends(backends, default, config)
    assert layer.backend_cls is fi.DeepseekV4FlashInferMLASparseBackend
    return layer.backend_cls.get_preferred_block_size(default)
