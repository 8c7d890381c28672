# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""--block-size against vLLM's own KV binding, for DeepSeek V4.1 Flash's
published layout on every GPU family and every attention class start-up can
build there: a value the layers accept binds; a value they refuse fails in
vLLM's grouping, kernel-block selection or map to kernel blocks.

The GPU is mocked at the platform boundary and the caches are allocated on
the meta device, so binding runs its real shape and stride checks.
"""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from vllm.config import CacheConfig, DeviceConfig, VllmConfig, set_current_vllm_config
from vllm.models.deepseek_v41 import attention
from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache

pytestmark = pytest.mark.default_base_only

LAYOUT = SimpleNamespace(
    **json.loads(
        (Path(__file__).parent / "configs" / "dsv41_flash_layout.json").read_text()
    ),
    o_groups=16,
)
CAPABILITIES = [(9, 0), (10, 0), (12, 0), (12, 1)]
BACKENDS = [
    None,  # what start-up picks without --attention-backend
    "FLASHMLA_SPARSE_DSV41",
    "FLASHMLA_MEGA_ATTN_DSV41",
    "FLASHINFER_MLA_SPARSE_DSV41",
]
BLOCK_SIZES = [None, 16, 32, 64, 128, 256]
# DeepseekV4Attention.__init__ builds its sliding-window cache in 32-token
# pages, whatever --block-size is.
SWA_BLOCK_SIZE = 32


def layer_class(backend: str | None, tp: int) -> type:
    """The attention class vLLM's model builds for ``backend``."""
    from vllm.models.deepseek_v41.nvidia.model import _select_dsv4_attn_cls
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    config = SimpleNamespace(
        attention_config=SimpleNamespace(
            backend=AttentionBackendEnum[backend] if backend else None
        ),
        parallel_config=SimpleNamespace(
            prefill_context_parallel_size=1, tensor_parallel_size=tp
        ),
        model_config=SimpleNamespace(hf_config=LAYOUT),
        lora_config=None,
    )
    return _select_dsv4_attn_cls(config)


def layer_classes(capability, tp: int) -> list[type]:
    """Each class start-up can build on this GPU, once."""
    classes = []
    for backend in BACKENDS:
        try:
            cls = layer_class(backend, tp)
        except ValueError:
            continue
        supported = cls.backend_cls.supports_compute_capability(capability)
        if supported and cls not in classes:
            classes.append(cls)
    return classes


def engine_config(layer_cls: type, block_size: int | None) -> VllmConfig:
    """The engine's config for ``--block-size`` (None: unset, so vLLM's
    platform picks one for the layers' backends)."""
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.mla.indexer import DeepseekV41IndexerBackend

    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    config.cache_config = CacheConfig(block_size=block_size, cache_dtype="auto")
    if block_size is None:
        backends = [layer_cls.backend_cls, layer_cls.swa_backend_cls]
        config.cache_config.block_size = type(
            current_platform
        )._preferred_block_size_for_backends(
            [*backends, DeepseekV41IndexerBackend],
            CacheConfig.DEFAULT_BLOCK_SIZE,
            config,
        )
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    # DeepSeek V4.1 declares no grouping of its own: vLLM's default runs.
    object.__setattr__(
        config,
        "model_config",
        SimpleNamespace(
            original_max_model_len=8192,
            max_model_len=8192,
            supports_kv_cache_grouping=False,
        ),
    )
    return config


def build_caches(layer_cls: type, config: VllmConfig) -> dict[str, tuple]:
    """Per layer name, (backend, spec) of each cache the layers register, built
    by the layers' own spec code with what their ``__init__`` sets."""
    cache_config = config.cache_config
    kv_dtype, torch_dtype = attention._resolve_dsv4_kv_cache_dtype(
        layer_cls.use_fp8_ds_mla_layout,
        cache_config.cache_dtype,
        cache_config,
        layer_cls.packed_kv_cache_dtype.fget(None),
    )
    mxfp8 = attention._use_v41_mxfp8_kv_record()
    record = 528 if mxfp8 else 584
    compressed_record = 288 if kv_dtype == "nvfp4_ds_mla" else record
    alignment = 512 if mxfp8 else 576
    caches: dict[str, tuple] = {}
    with set_current_vllm_config(config):
        for layer, ratio in enumerate(LAYOUT.compress_ratios):
            prefix = f"model.layers.{layer}.attn"
            swa = DeepseekV4SWACache(
                head_dim=LAYOUT.head_dim,
                window_size=LAYOUT.sliding_window,
                dtype=torch_dtype,
                prefix=f"{prefix}.swa_cache",
                cache_config=cache_config,
                backend_cls=layer_cls.swa_backend_cls,
                block_size=SWA_BLOCK_SIZE,
                packed_bytes_per_token=record,
                packed_page_alignment=alignment,
                packed_block_stride_alignment=(
                    math.lcm(record, compressed_record) if mxfp8 else None
                ),
            )
            caches[swa.prefix] = (swa.get_attn_backend(), swa.get_kv_cache_spec(config))
            if layer not in LAYOUT.kv_source_layer_ids or ratio == 0:
                continue
            stand_in = SimpleNamespace(
                is_kv_source=True,
                backend_cls=layer_cls.backend_cls,
                compress_ratio=ratio,
                head_dim=LAYOUT.head_dim,
                kv_cache_dtype=kv_dtype,
                kv_cache_torch_dtype=torch_dtype,
                kv_page_alignment=alignment,
                compressed_bytes_per_token=compressed_record,
            )
            spec = attention.DeepseekV4Attention.get_kv_cache_spec(stand_in, config)
            caches[prefix] = (layer_cls.backend_cls, spec)
            if layer in LAYOUT.index_source_layer_ids:
                k_cache = attention.DeepseekV4IndexerCache(
                    head_dim=attention._indexer_k_cache_head_dim(
                        LAYOUT.index_head_dim, False
                    ),
                    dtype=torch.uint8,
                    prefix=f"{prefix}.indexer.k_cache",
                    cache_config=cache_config,
                    compress_ratio=ratio,
                )
                caches[k_cache.prefix] = (
                    k_cache.get_attn_backend(),
                    k_cache.get_kv_cache_spec(config),
                )
    return caches


def start_up_refusal(caches: dict[str, tuple], config: VllmConfig) -> str | None:
    """What the kv-source layers raise as the model is built (None: builds)."""
    cache_config = config.cache_config
    if not cache_config.user_specified_block_size:
        return None
    try:
        for name, (backend, spec) in caches.items():
            if name.count(".") == 3:  # a kv-source layer's compressed KV
                own = [(backend, spec)]
                if (k_cache := caches.get(f"{name}.indexer.k_cache")) is not None:
                    own.append(k_cache)
                attention.check_kv_cache_block_size(cache_config.block_size, own)
    except ValueError as e:
        return str(e)
    return None


def bind(caches: dict[str, tuple], config: VllmConfig) -> None:
    """vLLM's KV-cache path from the specs to the kernel-block views the layers
    bind; raises where vLLM raises."""
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )
    from vllm.v1.core import kv_cache_planning as planning
    from vllm.v1.worker import utils as worker

    specs = {name: spec for name, (_, spec) in caches.items()}
    backends = {backend for backend, _ in caches.values()}
    layout = resolve_kv_cache_layout(
        config,
        [[m.name for m in get_supported_kv_cache_layouts(backends)]],
        list(specs.values()),
    )
    groups = planning.get_global_kv_cache_groups(config, [specs])
    (kv_config,) = planning.get_kv_cache_configs(config, [specs], [4 << 30], groups)
    # Attention groups as the GPU worker forms them (init_attn_backend): by
    # backend, per-layer spec and query-head count (0 for these layers).
    attn_groups = []
    for gid, group in enumerate(kv_config.kv_cache_groups):
        by_key: dict[tuple, worker.AttentionGroup] = {}
        for name in group.layer_names:
            backend, spec = caches[name]
            key = (backend.full_cls_name(), spec, 0)
            if key in by_key:
                by_key[key].layer_names.append(name)
            else:
                by_key[key] = worker.AttentionGroup(backend, [name], spec, gid)
        attn_groups.append(list(by_key.values()))
    kernel_block_sizes = worker.prepare_kernel_block_sizes(kv_config, attn_groups)
    for gid, group_list in enumerate(attn_groups):
        for group in group_list:
            # What AttentionGroup.create_metadata_builders selects first.
            kernel = worker.select_common_block_size(
                kernel_block_sizes[gid], [group.backend], [group.kv_cache_spec]
            )
            if kernel != group.kv_cache_spec.block_size:
                group.kernel_block_size = kernel
    tensors = worker.allocate_kv_cache(
        kv_config, torch.device("meta"), layout, kernel_block_sizes
    )
    flat = [g for group_list in attn_groups for g in group_list]
    worker.map_kv_caches_to_kernel_blocks(tensors, flat)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: f"sm{c[0]}{c[1]}")
def test_start_up_refuses_exactly_what_binding_cannot_serve(
    set_capability, capability, tp, block_size
):
    capability = set_capability(*capability)
    for layer_cls in layer_classes(capability, tp):
        config = engine_config(layer_cls, block_size)
        caches = build_caches(layer_cls, config)
        refusal = start_up_refusal(caches, config)
        try:
            bind(caches, config)
            failure = None
        except ValueError as e:
            failure = str(e)
        where = f"{layer_cls.__name__} --block-size {block_size}"
        if refusal is None:
            assert failure is None, f"{where}: accepted, then binding fails: {failure}"
            continue
        assert failure is not None, f"{where}: refused what binds: {refusal}"
        assert "\n" not in refusal
        # Every --block-size the message names binds.
        named = refusal.split("Use --block-size ")[1].split(",")[0].split(" or ")
        for working in map(int, named):
            config = engine_config(layer_cls, working)
            bind(build_caches(layer_cls, config), config)


def test_flashinfer_on_sm100_refuses_256(set_capability):
    """The ratio-1 compressed cache needs 128-token kernel blocks, and vLLM
    never splits a block of one token per state."""
    set_capability(10, 0)
    layer_cls = layer_class("FLASHINFER_MLA_SPARSE_DSV41", 1)
    config = engine_config(layer_cls, 256)
    caches = build_caches(layer_cls, config)
    refusal = start_up_refusal(caches, config)
    assert refusal is not None and "Use --block-size 128," in refusal
    with pytest.raises(ValueError, match="cannot be split into"):
        bind(caches, config)
