# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Which sparse-MLA kernel a two-segment layer runs, and that it runs it."""

import pytest
import torch

from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fi
from vllm.models.deepseek_v41.nvidia import sparse_mla_launcher
from vllm.models.deepseek_v41.nvidia.sparse_mla_kernel import SparseMLAKernel
from vllm.utils import flashinfer as flashinfer_utils


def test_launcher_runs_the_layers_kernel(monkeypatch):

    ran = []
    monkeypatch.setattr(
        sparse_mla_launcher, "run_triton", lambda **kw: ran.append(("triton", kw))
    )
    monkeypatch.setattr(
        flashinfer_utils,
        "flashinfer_trtllm_batch_decode_sparse_mla_dsv4",
        lambda **kw: ran.append(("flashinfer", kw)),
    )
    layer = object.__new__(fi.DeepseekV4FlashInferSM120Attention)
    for kernel, expected in (
        (SparseMLAKernel.TRITON, "triton"),
        (SparseMLAKernel.FLASHINFER_SM120, "flashinfer"),
    ):
        layer.sparse_mla_kernel = kernel
        layer._sparse_mla_decode(query=kernel)
        assert ran[-1] == (expected, {"query": kernel})


@pytest.mark.parametrize(
    "flashinfer_has_shape, expected",
    [(True, SparseMLAKernel.FLASHINFER_SM120), (False, SparseMLAKernel.TRITON)],
)
def test_sm12x_runs_flashinfer_where_it_has_the_decode_shape(
    set_capability, monkeypatch, flashinfer_has_shape, expected
):

    asked = []

    def has_config(num_heads, top_k):
        asked.append((num_heads, top_k))
        return flashinfer_has_shape

    monkeypatch.setattr(
        flashinfer_utils, "has_flashinfer_sparse_mla_sm120_config", has_config
    )
    set_capability(12, 1)
    assert sparse_mla_launcher.choose_kernel(64, 1152) is expected
    assert asked == [(64, 1152)]


def test_hopper_runs_the_triton_kernel(set_capability, monkeypatch):

    # FlashInfer's SM120 kernels cannot run here even if the package has them.
    monkeypatch.setattr(
        flashinfer_utils, "has_flashinfer_sparse_mla_sm120_config", lambda h, k: True
    )
    set_capability(9, 0)
    assert sparse_mla_launcher.choose_kernel(16, 512) is SparseMLAKernel.TRITON


def test_a_gpu_below_sm89_is_refused_with_what_serves(set_capability):

    set_capability(8, 0)
    with pytest.raises(ValueError, match=r"SM89 on .*this GPU is SM80\. Choose"):
        sparse_mla_launcher.choose_kernel(16, 512)


def _supports(kv_cache_dtype: str, capability) -> str | None:
    return fi.DeepseekV4FlashInferMLASparseBackend.supports_combination(
        512, torch.bfloat16, kv_cache_dtype, None, True, True, True, False, capability
    )


def test_sm12x_without_flashinfer_sm120_kernels_is_served(set_capability, monkeypatch):

    monkeypatch.setattr(
        flashinfer_utils, "has_flashinfer_sparse_mla_sm120", lambda: False
    )
    sm121 = set_capability(12, 1)
    assert _supports("fp8", sm121) is None
    # Still an answer, not an exception, for what no kernel reads.
    assert isinstance(_supports("bfloat16", sm121), str)


def test_supports_combination_names_the_gpus_served_below_sm89(set_capability):
    assert "SM89" in _supports("fp8", set_capability(8, 0))
