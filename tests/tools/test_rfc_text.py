# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""docs/rfc.md, the [Kernel] pull request's RFC: at most 1,000 words, and its
evidence table is the committed H100 run's raw JSON, cell for cell."""

import json
import re

from tools.fork.common import REPO

RFC = (REPO / "docs" / "rfc.md").read_text()
RUN = REPO / "benchmarks" / "results" / "dsv41_sparse_mla_h100" / "2026-12-06b"


def test_the_rfc_is_at_most_1000_words():
    assert len(RFC.split()) <= 1000


def test_the_evidence_table_is_the_committed_run():
    (raw,) = (RUN / "table").glob("*.json")
    ratios = {
        (row["tokens"], row["heads"]): row["speed_vs_flashmla"]
        for row in json.loads(raw.read_text())["rows"]
        if row["kind"] == "decode"
    }
    table = RFC.split("| tokens | 8 heads |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| (\d+) \|(.*)\|$", table, re.M)
    assert [int(tokens) for tokens, _ in rows] == [1, 8, 32, 128, 256]
    for tokens, cells in rows:
        values = [float(v) for v in cells.split("|")]
        expected = [ratios[(int(tokens), h)] for h in (8, 16, 32, 64, 128)]
        assert values == [round(v, 2) for v in expected], tokens
