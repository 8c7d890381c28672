# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The report's verdict is start-up's on every cell of the binding matrix:
each GPU family, the attention class start-up builds by default and for each
--attention-backend that runs there, TP 1-8 and --block-size unset/16-256.

Start-up's verdict is asked here the way the layers ask it as the model is
built (the class vLLM selects, its head padding, the kv-source layers'
--block-size check over the specs the layers' own code builds);
tests/models/deepseek_v41/test_block_size_binding.py holds that check against
vLLM's KV binding.
"""

import pytest

from tests.models.deepseek_v41 import test_block_size_binding as binding
from vllm_dsv41_plan import report

pytestmark = pytest.mark.default_base_only


def start_up_refusal(layer_cls, tp: int, block_size) -> str | None:
    """What building the model raises (None: it builds)."""
    try:
        layer_cls.get_padded_num_q_heads(binding.LAYOUT.num_attention_heads // tp)
        engine = binding.engine_config(layer_cls, block_size)
        return binding.start_up_refusal(binding.build_caches(layer_cls, engine), engine)
    except ValueError as e:
        return str(e)


@pytest.mark.parametrize("block_size", binding.BLOCK_SIZES)
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize(
    "capability", binding.CAPABILITIES, ids=lambda c: f"sm{c[0]}{c[1]}"
)
def test_the_report_says_what_start_up_does(set_capability, capability, tp, block_size):
    capability = set_capability(*capability)
    for name in binding.BACKENDS:
        try:
            layer_cls = binding.layer_class(name, tp)
        except ValueError:
            continue
        if not layer_cls.backend_cls.supports_compute_capability(capability):
            continue
        ours = report.make_plan(
            capability,
            binding.LAYOUT,
            tensor_parallel_size=tp,
            block_size=block_size,
            attention_backend=name,
        )
        where = f"{name or 'default'} ({layer_cls.__name__}) --block-size {block_size}"
        assert ours.attention_class.endswith(f".{layer_cls.__name__}"), where
        theirs = start_up_refusal(layer_cls, tp, block_size)
        assert (ours.error is None) == (theirs is None), (where, ours.error, theirs)
        if theirs is not None:
            assert ours.error == theirs, where
