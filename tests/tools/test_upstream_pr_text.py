# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""docs/upstream-pr.md is a page a maintainer reads, and its evidence table is
what the binding test finds."""

import re

import pytest

from tools.fork.common import REPO

DOC = (REPO / "docs" / "upstream-pr.md").read_text()
MAX_WORDS = 700


def test_the_pull_request_text_is_short():
    assert len(DOC.split()) <= MAX_WORDS


@pytest.mark.default_base_only
def test_the_evidence_table_is_what_the_binding_test_finds(monkeypatch):
    from tests.models.deepseek_v41 import test_block_size_binding as binding
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    table = DOC.split("<!-- block-sizes:begin -->\n", 1)[1].split("<!--")[0]
    rows = re.findall(r"^\| SM(\d+) \| (\w+)[^|]*\| ([\d, ]+) \|$", table, re.M)
    assert len(rows) == 6
    for sm, backend, serves in rows:
        capability = DeviceCapability(int(sm[:-1]), int(sm[-1]))
        monkeypatch.setattr(
            type(current_platform),
            "get_device_capability",
            classmethod(lambda cls, device_id=0, c=capability: c),
        )
        (layer_cls,) = [
            c
            for c in binding.layer_classes(capability, 1)
            if c.backend_cls.get_name() == backend
        ]
        found = []
        for size in binding.BLOCK_SIZES[1:]:
            config = binding.engine_config(layer_cls, size)
            caches = binding.build_caches(layer_cls, config)
            if binding.start_up_refusal(caches, config) is None:
                found.append(size)
        assert found == [int(s) for s in serves.split(",")], (sm, backend)
