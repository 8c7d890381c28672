# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A five-layer DeepSeek V4.1 model's attention, built as the model builds it
on a mocked GPU and bound as vLLM binds its KV caches, all on CPU.

The layers and caches live on the meta device; the GPU is mocked where vLLM's
platform answers for it, so the layer classes, specs, planning, metadata
builders and binding run vLLM's own code.
"""

import contextlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from vllm import distributed
from vllm.config import CacheConfig, DeviceConfig, VllmConfig, set_current_vllm_config
from vllm.config import get_layers_from_vllm_config as layers_of
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backends import utils as backend_utils
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.core import kv_cache_planning as planning
from vllm.v1.worker.gpu import attn_utils

# Every kind of layer DeepSeek V4.1 Flash has, with Flash's 64 heads: sliding
# window only (ratio 0), a ratio-2 kv source and a layer reading it, a ratio-1
# kv source and a layer with its own indexer reading it. The projections are
# as small as the layers allow, since no cache depends on them.
HF_CONFIG = SimpleNamespace(
    **json.loads(
        (Path(__file__).parent / "configs" / "dsv41_small_model.json").read_text()
    )
)
# Binding's KV budget: large enough that memory is never why it fails.
KV_BUDGET_BYTES = 64 << 30


@contextlib.contextmanager
def one_gloo_rank(workdir):
    """A one-rank tensor-parallel group, which the layers ask for its size."""
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig("cpu"))):
        distributed.init_distributed_environment(
            1, 0, f"file://{workdir}/rendezvous", 0, backend="gloo"
        )
        distributed.initialize_model_parallel(1, 1)
    try:
        yield
    finally:
        distributed.cleanup_dist_env_and_memory()


def mock_gpu(monkeypatch: pytest.MonkeyPatch, major: int, minor: int) -> None:
    """Have vLLM's platform report an NVIDIA GPU of capability major.minor."""
    platform = type(current_platform)
    answer = DeviceCapability(major, minor)
    monkeypatch.setattr(
        platform, "get_device_capability", classmethod(lambda *_, **__: answer)
    )
    monkeypatch.setattr(platform, "num_compute_units", lambda *_, **__: 132)


def build_layers(backend: str | None, block_size: int | None = None) -> VllmConfig:
    """Build each decoder layer's attention with the class vLLM's model picks
    for ``--attention-backend backend`` (None: unset) and ``--block-size
    block_size``; return the config they registered in. Raises what the
    layers raise."""
    from vllm.models.deepseek_v41.nvidia.model import _select_dsv4_attn_cls

    config = VllmConfig(device_config=DeviceConfig("cpu"))
    config.cache_config = CacheConfig(block_size=block_size)
    config.attention_config.sparse_mla_prefill_workspace_factor = 5
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    model = dict.fromkeys(("max_model_len", "original_max_model_len"), 8192)
    model.update(is_hybrid=False, supports_kv_cache_grouping=False)
    model.update(hf_config=HF_CONFIG, hf_text_config=HF_CONFIG, dtype=torch.bfloat16)
    object.__setattr__(config, "model_config", SimpleNamespace(**model))
    chosen = AttentionBackendEnum[backend] if backend else None
    layer_cls = _select_dsv4_attn_cls(
        SimpleNamespace(
            attention_config=SimpleNamespace(backend=chosen),
            parallel_config=SimpleNamespace(prefill_context_parallel_size=1),
            lora_config=None,
        )
    )
    with set_current_vllm_config(config), torch.device("meta"):
        for i in range(HF_CONFIG.num_hidden_layers):
            layer_cls(config, prefix=f"model.layers.{i}.self_attn")
    return config


def bind_kv_caches(config: VllmConfig) -> None:
    """Plan, allocate (on the meta device) and bind the built layers' KV
    caches as vLLM's engine and GPU worker do once the model is loaded;
    raises where vLLM raises."""
    # A --block-size the user left unset is vLLM's to choose now.
    current_platform.update_block_size_for_backend(config)
    with set_current_vllm_config(config):
        specs = attn_utils.get_kv_cache_spec(config)
        built = layers_of(config, AttentionLayerBase).values()
        backends = {layer.get_attn_backend() for layer in built}
        layouts = [
            x.name for x in backend_utils.get_supported_kv_cache_layouts(backends)
        ]
        backend_utils.resolve_kv_cache_layout(config, [layouts], specs.values())
        groups = planning.get_global_kv_cache_groups(config, [specs])
        (kv_cache_config,) = planning.get_kv_cache_configs(
            config, [specs], [KV_BUDGET_BYTES], groups
        )
        attn_groups, _, kernel_block_sizes = attn_utils.init_attn_backend(
            kv_cache_config, config, torch.device("cpu")
        )
        attn_utils.init_kv_cache(
            config.compilation_config.static_forward_context,
            kv_cache_config,
            torch.device("meta"),
            kernel_block_sizes,
            config,
            attn_groups=[group for per_spec in attn_groups for group in per_spec],
        )
