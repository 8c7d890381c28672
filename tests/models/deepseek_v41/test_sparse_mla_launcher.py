# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A two-segment layer runs the sparse-MLA kernel chosen for it."""

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
