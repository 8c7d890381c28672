# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Which layer and kernel DeepSeek V4.1 builds for TRITON_MLA_SPARSE_DSV41
and FLASHINFER_MLA_SPARSE_DSV41 on each GPU, and what it refuses.

Every decoder layer of a small model is built as the model builds it (on the
meta device, the GPU mocked at the platform boundary), and a configuration it
accepts goes through vLLM's KV-cache planning, metadata builders and KV
binding.
"""

import pytest

from tests.models.deepseek_v41.small_model import (
    HF_CONFIG,
    bind_kv_caches,
    build_layers,
    mock_gpu,
    one_gloo_rank,
)
from vllm.config import get_layers_from_vllm_config
from vllm.models.deepseek_v41.attention import DeepseekV4Attention
from vllm.models.deepseek_v41.nvidia.flashinfer_sparse import (
    DeepseekV4FlashInferSM120Attention,
)
from vllm.models.deepseek_v41.nvidia.sparse_mla_kernel import SparseMLAKernel
from vllm.models.deepseek_v41.nvidia.triton_sparse import (
    DeepseekV4TritonMLAAttention,
)
from vllm.utils import flashinfer as flashinfer_utils
from vllm.v1.attention.backends.registry import AttentionBackendEnum

pytestmark = pytest.mark.cpu_test


@pytest.fixture(scope="module", autouse=True)
def single_rank(tmp_path_factory):
    with one_gloo_rank(tmp_path_factory.mktemp("gloo")):
        yield


@pytest.fixture
def on_gpu(monkeypatch):
    """Mock the GPU: ``on_gpu((major, minor))``."""
    return lambda capability: mock_gpu(monkeypatch, *capability)


TRITON = "TRITON_MLA_SPARSE_DSV41"
FLASHINFER = "FLASHINFER_MLA_SPARSE_DSV41"
SM12X = [(12, 0), (12, 1)]
HOPPER_AND_SM12X = [(9, 0), *SM12X]


def attention_layers(config) -> list[DeepseekV4Attention]:
    layers = get_layers_from_vllm_config(config, DeepseekV4Attention)
    assert len(layers) == HF_CONFIG.num_hidden_layers
    return list(layers.values())


def test_the_name_resolves_to_the_triton_layers_backend():
    backend = AttentionBackendEnum[TRITON].get_class()
    assert backend is DeepseekV4TritonMLAAttention.backend_cls
    assert backend.get_name() == TRITON


TRITON_LAYER = (DeepseekV4TritonMLAAttention, SparseMLAKernel.TRITON)
FLASHINFER_LAYER = (
    DeepseekV4FlashInferSM120Attention,
    SparseMLAKernel.FLASHINFER_SM120,
)
BUILDS = [
    *(
        (gpu, TRITON, size, TRITON_LAYER)
        for gpu in HOPPER_AND_SM12X
        for size in (None, 64)
    ),
    *(
        (gpu, name, None, FLASHINFER_LAYER)
        for gpu in SM12X
        for name in (None, FLASHINFER)
    ),
]


@pytest.mark.parametrize("gpu,backend,block_size,built", BUILDS)
def test_each_backend_builds_its_layer_and_kernel_and_binds(
    on_gpu, gpu, backend, block_size, built
):
    on_gpu(gpu)
    config = build_layers(backend, block_size)
    for layer in attention_layers(config):
        assert (type(layer), layer.sparse_mla_kernel) == built
    bind_kv_caches(config)


@pytest.mark.parametrize("gpu", HOPPER_AND_SM12X)
def test_triton_backend_needs_no_flashinfer_kernel(on_gpu, monkeypatch, gpu):
    monkeypatch.setattr(
        flashinfer_utils, "has_flashinfer_sparse_mla_sm120_config", lambda h, k: False
    )
    on_gpu(gpu)
    bind_kv_caches(build_layers(TRITON))


FLASHMLA = "FLASHMLA_SPARSE_DSV41"
MEGA = "FLASHMLA_MEGA_ATTN_DSV41"


@pytest.mark.parametrize(
    "gpu,backend,refused,usable",
    [
        # Named with --attention-backend on a GPU it has no kernel for.
        ((8, 9), TRITON, TRITON, []),
        ((10, 0), TRITON, TRITON, [FLASHMLA, MEGA, FLASHINFER]),
        ((10, 3), TRITON, TRITON, [FLASHMLA, MEGA, FLASHINFER]),
        ((11, 0), TRITON, TRITON, []),
        ((8, 9), FLASHINFER, FLASHINFER, []),
        ((9, 0), FLASHINFER, FLASHINFER, [FLASHMLA, TRITON]),
        ((12, 0), FLASHMLA, FLASHMLA, [FLASHINFER, TRITON]),
        ((12, 1), FLASHMLA, FLASHMLA, [FLASHINFER, TRITON]),
        ((8, 9), FLASHMLA, FLASHMLA, []),
        # The class vLLM picks by default, on a GPU it has no kernel for.
        ((8, 9), None, FLASHMLA, []),
    ],
)
def test_a_class_is_refused_on_a_gpu_it_has_no_kernel_for(
    on_gpu, gpu, backend, refused, usable
):
    on_gpu(gpu)
    sm = f"SM{gpu[0]}{gpu[1]}"
    with pytest.raises(ValueError) as raised:
        build_layers(backend)
    advice = (
        f"Use --attention-backend {' or '.join(usable)}."
        if usable
        else f"No DeepSeek V4.1 attention backend runs on {sm}."
    )
    assert str(raised.value) == (
        f"{refused} has no DeepSeek V4.1 kernel for {sm} GPUs. {advice}"
    )


def test_a_shape_flashinfer_lacks_is_refused_naming_the_triton_backend(
    on_gpu, monkeypatch
):
    asked = []

    def has_config(num_heads: int, top_k: int) -> bool:
        asked.append((num_heads, top_k))
        return False

    monkeypatch.setattr(
        flashinfer_utils, "has_flashinfer_sparse_mla_sm120_config", has_config
    )
    on_gpu((12, 1))
    with pytest.raises(RuntimeError) as refused:
        build_layers(None)
    # DeepSeek V4.1 Flash on one GPU: 64 heads, and the sliding window of 128.
    assert asked == [(64, 128)]
    assert str(refused.value) == (
        "FLASHINFER_MLA_SPARSE_DSV41 needs a FlashInfer SM120 sparse-MLA decode "
        "kernel for 64 heads at top-k 128, which the installed FlashInfer lacks. "
        "Install a FlashInfer that has it (flashinfer-ai/flashinfer#4380), or use "
        "--attention-backend TRITON_MLA_SPARSE_DSV41."
    )
