# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The README's --block-size table says what the plan report says, for
DeepSeek V4.1 Flash's published layout at every TP of 1-8, on this base."""

import json
import re
from types import SimpleNamespace

import pytest

from tools.fork.common import REPO, load_pin
from vllm.platforms.interface import DeviceCapability
from vllm_dsv41_plan import report

README = (REPO / "README.md").read_text()
LAYOUT = (
    REPO / "tests" / "models" / "deepseek_v41" / "configs" / "dsv41_flash_layout.json"
)
# DeepSeek V4.1 Flash's attention layout; eight heads a wo_a group.
HF_CONFIG = SimpleNamespace(**json.loads(LAYOUT.read_text()), o_groups=8)
BLOCK_SIZES = [16, 32, 64, 96, 128, 256]
GPUS = {"SM90": (9, 0), "SM10x": (10, 0), "SM12x": (12, 0)}
ROW = re.compile(r"^\| `(\w+)`[^|]*\| (SM\w+)[^|]*\| ([^|]+) \| ([^|]+) \|$", re.M)


def _rows():
    table = README.split("| layer | GPU | vLLM 0.34.0 | vLLM 0.30.0 |", 1)[1]
    table = table.split("\n\n", 1)[0]
    column = 2 if load_pin().VLLM_VERSION == "0.34.0" else 3
    return [(m[0], m[1], m[column]) for m in ROW.findall(table)]


def _checked_rows():
    """Rows whose cell on this base names --block-size values (0.30.0's
    SM12x pages leave none to it; some classes are 0.34.0's only)."""
    return [r for r in _rows() if re.match(r"\d", r[2])]


def test_the_table_has_its_rows():
    assert len(_rows()) == 8
    assert len(_checked_rows()) >= 3


@pytest.mark.parametrize("backend, gpu, cell", _checked_rows())
def test_a_row_is_what_the_report_says(backend, gpu, cell):
    capability = DeviceCapability(*GPUS[gpu])
    sizes = [int(s) for s in cell.split("(")[0].split(",")]
    default = int(re.search(r"default (\d+)", cell)[1])
    for tp in (1, 2, 4, 8):
        served = [
            size
            for size in BLOCK_SIZES
            if report.make_plan(
                capability,
                HF_CONFIG,
                tensor_parallel_size=tp,
                block_size=size,
                attention_backend=backend,
            ).error
            is None
        ]
        assert served == sizes, (backend, gpu, tp)
    layer_cls = report.layer_class(capability, backend, HF_CONFIG)
    assert report.default_block_size(layer_cls, capability) == default
