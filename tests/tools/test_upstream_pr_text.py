# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""docs/upstream-pr.md is a page a maintainer reads, and its evidence table is
what the binding test finds."""

import pytest

from tests.models.deepseek_v41 import test_block_size_binding as binding
from tests.models.deepseek_v41.test_block_size_binding import (  # noqa: F401
    on_gpu,
    single_rank,
)
from tools.fork.common import REPO

DOC = (REPO / "docs" / "upstream-pr.md").read_text()
MAX_WORDS = 700


def test_the_pull_request_text_is_short():
    assert len(DOC.split()) <= MAX_WORDS


@pytest.mark.default_base_only
def test_the_evidence_table_is_what_the_binding_test_finds(on_gpu):  # noqa: F811
    rows = [
        "| GPU | attention class | "
        + " | ".join(f"{pattern} pattern" for pattern in binding.PATTERNS)
        + " |",
        "| --- | --- |" + " --- |" * len(binding.PATTERNS),
    ]
    for case in binding.GPU_BACKENDS:
        gpu, backend = case.values
        on_gpu(gpu)
        serves = [
            ", ".join(
                str(size)
                for size in binding.BLOCK_SIZES[1:]
                if binding.refusal(gpu, backend, size, pattern) is None
            )
            for pattern in binding.PATTERNS
        ]
        name = binding.layer_class(gpu, backend).__name__
        rows.append(f"| {case.id} | {name} | {' | '.join(serves)} |")
    table = "\n".join(rows) + "\n"
    written = DOC.split("<!-- block-sizes:begin -->\n", 1)[1].split("<!--")[0]
    assert written == table, f"docs/upstream-pr.md's table should read:\n{table}"
