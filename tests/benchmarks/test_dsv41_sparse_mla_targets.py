# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The sparse-MLA kernel benchmark's check of its targets against FlashMLA,
on rows whose ratios are written out here: it passes a run that meets every
target and names each row that misses one (or has no FlashMLA time)."""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("triton")

SCRIPT = (
    Path(__file__).resolve().parents[2]
    / "benchmarks"
    / "kernels"
    / "benchmark_dsv41_sparse_mla.py"
)


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_sparse_mla", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The targets, written out: FlashMLA time / ours at least this.
WANTED = {8: 1.3, 16: 1.3, 32: 1.1, 64: 1.0, 128: 0.9}


def _rows(ratio_by_heads: dict[int, float], dspark: float) -> list[dict]:
    rows = [
        dict(kind="decode", tokens=t, heads=h, speed_vs_flashmla=r)
        for t in (1, 128, 256)
        for h, r in ratio_by_heads.items()
    ]
    rows += [
        dict(kind="dspark", tokens=5 * n, heads=h, speed_vs_flashmla=dspark)
        for n in (1, 32)
        for h in (8, 64)
    ]
    # Prefill has no target, whatever its ratio.
    rows.append(dict(kind="prefill", tokens=4096, heads=128, speed_vs_flashmla=0.1))
    return rows


def test_a_run_at_the_targets_passes(bench):
    assert bench.missed_targets(_rows(WANTED, 1.0)) == []


@pytest.mark.parametrize("heads", sorted(WANTED))
def test_a_decode_row_just_below_its_target_fails(bench, heads):
    rows = _rows(WANTED, 1.0)
    rows[1 * len(WANTED) + sorted(WANTED).index(heads)]["speed_vs_flashmla"] = (
        WANTED[heads] - 0.01
    )
    missed = bench.missed_targets(rows)
    assert len(missed) == 1
    assert missed[0].startswith(f"decode 128 tokens x {heads} heads")


def test_dspark_rows_need_one(bench):
    missed = bench.missed_targets(_rows(WANTED, 0.99))
    assert len(missed) == 4 and all(m.startswith("dspark") for m in missed)


def test_a_row_without_flashmla_misses(bench):
    rows = _rows(WANTED, 1.0)
    del rows[0]["speed_vs_flashmla"]
    assert bench.missed_targets(rows) == [
        "decode 1 tokens x 8 heads: no FlashMLA time < 1.3"
    ]
