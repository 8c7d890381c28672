# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The report's verdict is start-up's for DeepSeek V4.1 Flash on each NVIDIA
GPU and attention class of the binding test and each --block-size: the
model's layers built as vLLM builds them, which
tests/models/deepseek_v41/test_block_size_binding.py holds to vLLM's KV
binding."""

import pytest

from tests.models.deepseek_v41 import test_block_size_binding as binding
from tests.models.deepseek_v41.test_block_size_binding import (  # noqa: F401
    on_gpu,
    single_rank,
)
from vllm.platforms.interface import DeviceCapability
from vllm_dsv41_plan import report

pytestmark = pytest.mark.default_base_only

NVIDIA = [case for case in binding.GPU_BACKENDS if case.values[0] != binding.ROCM]


def _plan(
    gpu, backend: str | None, block_size: int | None, pattern: str = "published"
) -> report.Plan:
    return report.make_plan(
        DeviceCapability(*gpu),
        binding.hf_config(pattern),
        block_size=block_size,
        attention_backend=backend,
    )


@pytest.mark.parametrize("pattern", binding.PATTERNS)
@pytest.mark.parametrize("block_size", binding.BLOCK_SIZES)
@pytest.mark.parametrize("gpu,backend", NVIDIA)
def test_the_report_says_what_start_up_does(
    on_gpu,  # noqa: F811
    gpu,
    backend,
    block_size,
    pattern,
):
    on_gpu(gpu)
    ours = _plan(gpu, backend, block_size, pattern)
    layer_cls = binding.layer_class(gpu, backend)
    assert ours.attention_class.endswith(f".{layer_cls.__name__}")
    assert ours.error == binding.refusal(gpu, backend, block_size, pattern)


# Each --attention-backend on a GPU it runs on and on GPUs it has no kernel for,
# and the default class where it has none.
BACKEND_CHOICES = [
    pytest.param((12, 0), "FLASHMLA_SPARSE_DSV41", id="sm120-flashmla"),
    pytest.param((12, 1), "FLASHMLA_SPARSE_DSV41", id="sm121-flashmla"),
    pytest.param((8, 9), "FLASHMLA_SPARSE_DSV41", id="sm89-flashmla"),
    pytest.param((8, 9), None, id="sm89-default"),
    pytest.param((8, 9), "FLASHINFER_MLA_SPARSE_DSV41", id="sm89-flashinfer"),
    pytest.param((9, 0), "TRITON_MLA_SPARSE_DSV41", id="sm90-triton"),
    pytest.param((12, 1), "TRITON_MLA_SPARSE_DSV41", id="sm121-triton"),
    pytest.param((8, 9), "TRITON_MLA_SPARSE_DSV41", id="sm89-triton"),
    pytest.param((10, 0), "TRITON_MLA_SPARSE_DSV41", id="sm100-triton"),
    pytest.param((9, 0), "FLASHINFER_MLA_SPARSE_DSV41", id="sm90-flashinfer"),
]


@pytest.mark.parametrize("block_size", [None, 128])
@pytest.mark.parametrize("gpu,backend", BACKEND_CHOICES)
def test_the_report_refuses_a_backend_where_start_up_does(
    on_gpu,  # noqa: F811
    gpu,
    backend,
    block_size,
):
    on_gpu(gpu)
    ours = _plan(gpu, backend, block_size)
    assert ours.error == binding.refusal(gpu, backend, block_size)
    if ours.error is None and backend == "TRITON_MLA_SPARSE_DSV41":
        assert ours.kernel_path == report.KERNEL_PATHS["triton"]
