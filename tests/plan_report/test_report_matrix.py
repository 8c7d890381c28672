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


@pytest.mark.parametrize("block_size", binding.BLOCK_SIZES)
@pytest.mark.parametrize("gpu,backend", NVIDIA)
def test_the_report_says_what_start_up_does(on_gpu, gpu, backend, block_size):  # noqa: F811
    on_gpu(gpu)
    ours = report.make_plan(
        DeviceCapability(*gpu),
        binding.HF_CONFIG,
        block_size=block_size,
        attention_backend=backend,
    )
    layer_cls = binding.layer_class(gpu, backend)
    assert ours.attention_class.endswith(f".{layer_cls.__name__}")
    assert ours.error == binding.refusal(gpu, backend, block_size)
