# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The per-step breakdown of a profiler trace, on a trace written by hand
whose figures are worked out below."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import dsv41_serve_profile as profile  # noqa: E402


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid}
    return {**event, "args": args} if args else event


DECODE = "execute_context_0(0)_generation_2(2)"
TRACE = [
    # Steps: decode at 100, prefill at 1000, decode at 2000, and one at 2600
    # that only ends the third.
    _x("user_annotation", DECODE, 100, 300),
    _x("user_annotation", "execute_context_1(50)_generation_0(0)", 1000, 800),
    _x("user_annotation", DECODE, 2000, 200),
    _x("user_annotation", DECODE, 2600, 100),
    # Launches by correlation id: 1 before any step, 2 a graph replay of two
    # kernels in the first step, 3 and 4 in the prefill, 5 in the third step,
    # 6 in the last (not counted).
    _x("cuda_runtime", "cudaLaunchKernel", 50, 5, correlation=1),
    _x("cuda_runtime", "cudaGraphLaunch", 150, 5, correlation=2),
    _x("cuda_runtime", "cudaLaunchKernel", 1100, 5, correlation=3),
    _x("cuda_runtime", "cudaMemcpyAsync", 1200, 5, correlation=4),
    _x("cuda_driver", "cuLaunchKernel", 2100, 5, correlation=5),
    _x("cuda_runtime", "cudaLaunchKernel", 2650, 5, correlation=6),
    _x("kernel", "warm_up_kernel", 60, 500, tid=7, correlation=1),
    _x("kernel", "_sparse_mla_fwd_kernel", 400, 40, tid=7, correlation=2),
    _x("kernel", "nvjet_sm90_tst_64x8", 440, 60, tid=7, correlation=2),
    _x("kernel", "fused_moe_kernel", 1300, 200, tid=7, correlation=3),
    _x("gpu_memcpy", "Memcpy HtoD", 1500, 10, tid=8, correlation=4),
    _x("kernel", "mhc_pre_big_fuse_tilelang_kernel", 2300, 30, tid=7, correlation=5),
    _x("kernel", "flash_fwd_splitkv_mla_fp8_sparse_kernel", 2330, 50, tid=7,
       correlation=5),
    _x("kernel", "late_kernel", 2700, 999, tid=7, correlation=6),
    # Torch operators: in the first step an outer one with a nested one
    # (counted once) and another, plus one on another thread; one in the
    # prefill.
    _x("cpu_op", "aten::copy_", 110, 100),
    _x("cpu_op", "aten::empty", 120, 50),
    _x("cpu_op", "aten::slice", 250, 40),
    _x("cpu_op", "aten::fill_", 120, 100, tid=2),
    _x("cpu_op", "aten::index", 1050, 500),
    {"ph": "s", "cat": "ac2g", "name": "flow", "ts": 150, "id": 2},
]  # fmt: skip


def test_breakdown_per_step_kind() -> None:
    got = profile.breakdown(TRACE)
    assert set(got) == {"decode", "prefill"}
    decode, prefill = got["decode"], got["prefill"]
    # Decode steps 1 and 3: periods 900 and 600, steps 300 and 200, torch
    # operators 100 + 40 and none; kernels 40 + 60 and 30 + 50.
    assert decode["steps"] == 2
    assert decode["period_us"] == pytest.approx(750)
    assert decode["step_us"] == pytest.approx(250)
    assert decode["torch_ops_us"] == pytest.approx(70)
    assert decode["kernels_us"] == pytest.approx(
        {"sparse attention": 45, "GEMM": 30, "mHC": 15}
    )
    assert decode["kernel_total_us"] == pytest.approx(90)
    assert decode["uncovered_us"] == pytest.approx(660)
    assert prefill["steps"] == 1
    assert prefill["period_us"] == pytest.approx(1000)
    assert prefill["torch_ops_us"] == pytest.approx(500)
    assert prefill["kernels_us"] == pytest.approx({"MoE": 200, "copies": 10})
    assert prefill["uncovered_us"] == pytest.approx(790)


def test_slim_keeps_what_the_breakdown_reads() -> None:
    slim = profile.slim(TRACE)
    assert all(e["cat"] != "ac2g" for e in slim)
    assert profile.breakdown(slim) == profile.breakdown(TRACE)
    kernel = next(e for e in slim if e["name"] == "fused_moe_kernel")
    assert kernel["args"] == {"correlation": 3}


@pytest.mark.parametrize(
    ("kernel", "expected"),
    [
        ("void smxx::decode::get_mla_metadata_kernel<true>", "sparse attention"),
        ("void smxx::decode::flash_fwd_mla_combine_kernel<bf16>", "sparse attention"),
        ("_sparse_mla_combine_kernel", "sparse attention"),
        ("void vllm::moe::topkGatingSoftplusSqrt<4, 4>", "MoE"),
        ("void vllm::cooperative::cooperative_topk_cs8<512u, float>", "indexer"),
        ("void deep_gemm::sm90_fp8_paged_mqa_logits<1u, 64u>", "indexer"),
        ("nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN", "GEMM"),
        ("mhc_fused_tilelang_kernel", "mHC"),
        ("Kernel", "other"),
    ],
)
def test_kernel_categories(kernel: str, expected: str) -> None:
    assert profile.category(kernel) == expected


def test_table_has_a_row_per_way_and_step_kind() -> None:
    text = profile.table({"a": profile.breakdown(TRACE)})
    rows = [line for line in text.splitlines() if line.startswith("| (a)")]
    assert rows[0].startswith("| (a) | 2 decode | 750.0 | 250.0 | 70.0 |")
    assert rows[1].startswith("| (a) | 1 prefill | 1000.0 | 800.0 | 500.0 |")
    assert rows[0].endswith("| 90.0 | 660.0 |")
