# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""--block-size against vLLM's own KV binding for DeepSeek V4.1: its layers,
built as the model builds them, refuse exactly the values that binding cannot
serve, for DeepSeek V4.1 Flash's layer pattern and for one whose kv sources
all have ratio 2.

The GPU is mocked at the platform boundary and the layers and caches live on
the meta device, so vLLM's spec, layout, planning, attention-group, metadata
builder, allocation and binding code runs as it does on the GPU.
"""

import json
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from vllm.config import (
    CacheConfig,
    DeviceConfig,
    VllmConfig,
    get_layers_from_vllm_config,
    set_current_vllm_config,
)
from vllm.distributed import (
    cleanup_dist_env_and_memory,
    init_distributed_environment,
    initialize_model_parallel,
)
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.backends.utils import (
    get_supported_kv_cache_layouts,
    resolve_kv_cache_layout,
)
from vllm.v1.core.kv_cache_planning import (
    get_global_kv_cache_groups,
    get_kv_cache_configs,
)
from vllm.v1.worker.gpu.attn_utils import (
    get_kv_cache_spec,
    init_attn_backend,
    init_kv_cache,
)

pytestmark = pytest.mark.cpu_test

# The attention topology of DeepSeek V4.1 Flash's published checkpoint
# (config.json, text_config): 40 layers, kv sources 2/8/14 (ratio 2) and 20
# (ratio 1).
LAYOUT = json.loads(
    (Path(__file__).parent / "configs" / "dsv41_flash_layout.json").read_text()
)
# Projection sizes no KV cache depends on (the layers are built on the meta
# device) and the RoPE the layers build.
PROJECTIONS = dict(
    hidden_size=512,
    q_lora_rank=128,
    o_lora_rank=128,
    o_groups=8,
    index_n_heads=64,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    compress_rope_theta=160000.0,
    max_position_embeddings=4096,
    rope_parameters={
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 1024,
        "beta_fast": 32,
        "beta_slow": 1,
    },
)
# The layer patterns: the published one, and the same with every ratio-1
# layer at ratio 2 (no kv source then has one token per compressed state).
PATTERNS = {
    "published": LAYOUT,
    "no-ratio-1": {
        **LAYOUT,
        "compress_ratios": [2 if r == 1 else r for r in LAYOUT["compress_ratios"]],
    },
}


def hf_config(pattern: str = "published") -> SimpleNamespace:
    """The model config of a layer pattern."""
    return SimpleNamespace(**PATTERNS[pattern], **PROJECTIONS)


# Big enough that memory is never why binding fails.
KV_CACHE_BYTES = 64 << 30
ROCM = "rocm"
# Each GPU with each attention class start-up builds there: its default (None)
# and each --attention-backend whose kernels run on it. FlashMLA's mega
# attention layer is left out: it is built only over FP8 weights, whose
# kernels are chosen for a real GPU.
GPU_BACKENDS = [
    pytest.param((9, 0), None, id="sm90"),
    pytest.param((10, 0), None, id="sm100"),
    pytest.param((10, 0), "FLASHINFER_MLA_SPARSE_DSV41", id="sm100-flashinfer"),
    pytest.param((12, 0), None, id="sm120"),
    pytest.param((12, 1), None, id="sm121"),
    pytest.param(ROCM, None, id="rocm"),
]
BLOCK_SIZES = [None, 16, 32, 64, 96, 128, 256]


@pytest.fixture(scope="module", autouse=True)
def single_rank(tmp_path_factory):
    """One gloo rank: the layers ask the tensor-parallel group its size."""
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig("cpu"))):
        init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"file://{tmp_path_factory.mktemp('gloo')}/init",
            local_rank=0,
            backend="gloo",
        )
        initialize_model_parallel(1, 1)
    yield
    cleanup_dist_env_and_memory()


@pytest.fixture
def on_gpu(monkeypatch):
    """Make vLLM's platform report ``gpu``, a compute capability or ROCm."""
    platform = type(current_platform)

    def set_to(gpu) -> None:
        major, minor = (9, 4) if gpu == ROCM else gpu
        capability = DeviceCapability(major, minor)
        monkeypatch.setattr(
            platform,
            "get_device_capability",
            classmethod(lambda cls, device_id=0: capability),
        )
        monkeypatch.setattr(
            platform, "num_compute_units", lambda self, device_id=0: 132
        )
        monkeypatch.setattr(platform, "is_rocm", lambda self: gpu == ROCM)

    return set_to


def layer_class(gpu, backend: str | None) -> type:
    """The attention class vLLM's model builds on ``gpu`` for ``backend``."""
    if gpu == ROCM:
        # Importing ROCm's module reads the GPU's architecture name.
        properties = SimpleNamespace(gcnArchName="gfx942", name="AMD Instinct MI300X")
        with mock.patch("torch.cuda.get_device_properties", lambda *a: properties):
            from vllm.models.deepseek_v41.amd.rocm import (
                DeepseekV41ROCMAiterMLAAttention,
            )
        return DeepseekV41ROCMAiterMLAAttention
    from vllm.models.deepseek_v41.nvidia.model import _select_dsv4_attn_cls

    return _select_dsv4_attn_cls(
        SimpleNamespace(
            attention_config=SimpleNamespace(
                backend=AttentionBackendEnum[backend] if backend else None
            ),
            parallel_config=SimpleNamespace(prefill_context_parallel_size=1),
            lora_config=None,
        )
    )


def build_model(
    gpu, backend: str | None, block_size: int | None, pattern: str = "published"
) -> VllmConfig:
    """Build every decoder layer's attention as the model does, for
    ``--block-size block_size`` (None: unset) and the layer pattern
    ``pattern``, and return the engine config they registered in. Raises what
    the layers raise."""
    text_config = hf_config(pattern)
    config = VllmConfig(device_config=DeviceConfig("cpu"))
    config.cache_config = CacheConfig(block_size=block_size)
    config.attention_config.sparse_mla_prefill_workspace_factor = 5
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    object.__setattr__(
        config,
        "model_config",
        SimpleNamespace(
            hf_config=text_config,
            hf_text_config=text_config,
            dtype=torch.bfloat16,
            max_model_len=8192,
            original_max_model_len=8192,
            is_hybrid=False,
            supports_kv_cache_grouping=False,
        ),
    )
    layer_cls = layer_class(gpu, backend)
    with set_current_vllm_config(config), torch.device("meta"):
        for layer in range(text_config.num_hidden_layers):
            layer_cls(config, prefix=f"model.layers.{layer}.self_attn")
    # After the model loads, vLLM picks the block size the user left unset.
    current_platform.update_block_size_for_backend(config)
    return config


def bind(config: VllmConfig) -> None:
    """vLLM's path from the built layers to their bound KV caches; raises
    where vLLM raises."""
    with set_current_vllm_config(config):
        specs = get_kv_cache_spec(config)
        layers = get_layers_from_vllm_config(config, AttentionLayerBase)
        backends = {layer.get_attn_backend() for layer in layers.values()}
        resolve_kv_cache_layout(
            config,
            [[layout.name for layout in get_supported_kv_cache_layouts(backends)]],
            specs.values(),
        )
        groups = get_global_kv_cache_groups(config, [specs])
        (kv_cache_config,) = get_kv_cache_configs(
            config, [specs], [KV_CACHE_BYTES], groups
        )
        attn_groups, _, kernel_block_sizes = init_attn_backend(
            kv_cache_config, config, torch.device("cpu")
        )
        init_kv_cache(
            config.compilation_config.static_forward_context,
            kv_cache_config,
            torch.device("meta"),
            kernel_block_sizes,
            config,
            attn_groups=[group for groups in attn_groups for group in groups],
        )


def refusal(
    gpu, backend: str | None, block_size: int | None, pattern: str = "published"
) -> str | None:
    """What building the model raises (None: it builds)."""
    try:
        build_model(gpu, backend, block_size, pattern)
    except ValueError as e:
        return str(e)
    return None


# What vLLM raises where binding cannot serve a block size: a block the
# kernel blocks do not divide, or a packed block it would have to split.
BINDING_ERRORS = r"No common block size|cannot be split into"


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("gpu,backend", GPU_BACKENDS)
def test_layers_refuse_what_binding_cannot_serve(
    on_gpu, gpu, backend, block_size, pattern
):
    on_gpu(gpu)
    message = refusal(gpu, backend, block_size, pattern)
    if message is None:
        bind(build_model(gpu, backend, block_size, pattern))
        return
    # The same caches, had vLLM rather than the user picked this size: the
    # layers do not check it, and binding fails.
    config = build_model(gpu, backend, None, pattern)
    config.cache_config.block_size = block_size
    with pytest.raises(ValueError, match=BINDING_ERRORS):
        bind(config)


def message(block_size: int, cause: str, advice: str) -> str:
    return f"--block-size {block_size} cannot serve DeepSeek V4.1: {cause}. {advice}"


def kernel_blocks(backend: str, kernel: int, block_size: int) -> str:
    return (
        f"{backend} reads {kernel}-token kernel blocks, which packed "
        f"{block_size}-token blocks cannot be split into"
    )


def not_a_multiple(block_size: int, kernels: str, backend: str) -> str:
    return (
        f"{block_size}-token blocks are not a multiple of the {kernels}-token "
        f"kernel blocks {backend} reads"
    )


FLASHMLA, FLASHINFER = "FLASHMLA_SPARSE_DSV41", "FLASHINFER_MLA_SPARSE_DSV41"
ROCM_FLASHMLA = "ROCM_FLASHMLA_SPARSE_DSV41"
USE_64 = "Use --block-size 64, or leave it unset."
USE_128 = "Use --block-size 128, or leave it unset."


@pytest.mark.parametrize(
    "gpu,backend,block_size,expected,serves",
    [
        pytest.param(
            (10, 0),
            None,
            64,
            message(64, not_a_multiple(64, "128", FLASHMLA), USE_128),
            [128],
            id="below",
        ),
        pytest.param(
            (9, 0),
            None,
            96,
            message(96, not_a_multiple(96, "64", FLASHMLA), USE_64),
            [64],
            id="between",
        ),
        pytest.param(
            (10, 0),
            FLASHINFER,
            256,
            # With a ratio-1 kv source FlashInfer's blocks are the first that
            # cannot split; without one, those of the indexer.
            {
                "published": message(256, kernel_blocks(FLASHINFER, 128, 256), USE_128),
                "no-ratio-1": message(
                    256, kernel_blocks("DEEPSEEK_V41_INDEXER", 128, 256), USE_128
                ),
            },
            [128],
            id="above",
        ),
        # ROCm's attention reads 64- and 128-token blocks, its indexer 64 only:
        # the advice is what serves every cache of the model.
        *(
            pytest.param(
                ROCM,
                None,
                size,
                message(
                    size, not_a_multiple(size, "64- or 128", ROCM_FLASHMLA), USE_64
                ),
                [64],
                id=f"rocm-{size}",
            )
            for size in (16, 32, 96)
        ),
        pytest.param(
            ROCM,
            None,
            256,
            message(256, kernel_blocks(ROCM_FLASHMLA, 128, 256), USE_64),
            [64],
            id="rocm-above",
        ),
    ],
)
def test_message_names_the_cause_and_what_serves(
    on_gpu, gpu, backend, block_size, expected, serves
):
    on_gpu(gpu)
    for pattern in PATTERNS:
        wanted = expected if isinstance(expected, str) else expected[pattern]
        assert refusal(gpu, backend, block_size, pattern) == wanted
    for size in serves:
        bind(build_model(gpu, backend, size))


def test_message_when_no_size_serves(on_gpu, monkeypatch):
    """FlashMLA's layer on SM120, as the model built it where nothing refused
    the backend first: its caches and its indexer's read kernel blocks no
    single --block-size serves."""
    from vllm.models.deepseek_v41.nvidia import model
    from vllm.models.deepseek_v41.nvidia.flashmla import DeepseekV4FlashMLAAttention

    monkeypatch.setattr(
        model, "_select_dsv4_attn_cls", lambda config: DeepseekV4FlashMLAAttention
    )
    on_gpu((12, 0))
    assert refusal((12, 0), None, 128) == message(
        128,
        kernel_blocks("DEEPSEEK_V41_INDEXER", 64, 128),
        "Choose another --attention-backend.",
    )
