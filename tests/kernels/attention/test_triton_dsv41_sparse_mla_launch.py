# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The Triton sparse-MLA launcher's host side, on the CPU with its two
kernels replaced by recorders.

A layer call repeats the geometry of the step's first call, so after that
one it must run no torch operator at all (no allocation, no view) before the
launches, and it must still launch with the geometry of the tensors it got.
The recorder of torch operators is torch's own dispatch mode, not the
launcher's bookkeeping.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("triton")

from tests.kernels.attention.dsv41_offline_compile import (  # noqa: E402
    load_kernel_module,
)

H200_SMS = 132
RECORD = 584


class Recorder:
    """Stands in for a JIT kernel: ``kernel[grid](*args, **constants)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, tuple, dict]] = []

    def __getitem__(self, grid):
        return lambda *args, **constants: self.calls.append((grid, args, constants))


class TorchOps(TorchDispatchMode):
    """Every torch operator run while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.fixture
def kernels(monkeypatch):
    module = load_kernel_module()
    monkeypatch.setattr(module, "_sparse_mla_fwd_kernel", Recorder())
    monkeypatch.setattr(module, "_sparse_mla_combine_kernel", Recorder())
    monkeypatch.setattr(module, "num_compute_units", lambda index: H200_SMS)
    monkeypatch.setattr(module, "get_max_shared_memory_bytes", lambda index: 227 * 1024)
    monkeypatch.setattr(module, "_own_partials", {})
    monkeypatch.setattr(module, "_plans", {})
    return module


def packed_pool(pages: int, page_size: int = 64) -> torch.Tensor:
    page = page_size * RECORD
    flat = torch.zeros(pages, page, dtype=torch.uint8)
    return flat.as_strided((pages, page_size, 1, RECORD), (page, RECORD, RECORD, 1))


def call_args(tokens: int, heads: int, swa_cap: int = 128, cmp_cap: int = 512):
    query = torch.zeros(tokens, heads, 512, dtype=torch.bfloat16)
    lens = torch.full((tokens,), 1, dtype=torch.int32)
    return dict(
        query=query,
        swa_kv_cache=packed_pool(8),
        sparse_indices=torch.zeros(tokens, 1, swa_cap, dtype=torch.int32),
        swa_topk_lens=lens,
        out=torch.empty_like(query),
        sm_scale=512**-0.5,
        sinks=torch.zeros(heads),
        compressed_kv_cache=packed_pool(16),
        extra_sparse_indices=torch.zeros(tokens, 1, cmp_cap, dtype=torch.int32),
        extra_sparse_topk_lens=lens,
    )


@pytest.mark.parametrize(
    "tokens,heads", [(1, 8), (4, 16), (8, 64), (2, 128), (4096, 128)]
)
def test_a_planned_call_runs_no_torch_operator(kernels, tokens, heads):
    args = call_args(tokens, heads)
    with TorchOps() as first:
        kernels.triton_sparse_mla_dsv41(**args)
    # The first call on the device makes the partial-result buffer: the
    # recorder sees an allocation when there is one.
    assert any("empty" in op for op in first.ops), first.ops
    for _ in range(3):
        with TorchOps() as later:
            kernels.triton_sparse_mla_dsv41(**args)
        assert later.ops == []
    launches = kernels._sparse_mla_fwd_kernel.calls
    assert len(launches) == 4 and all(c == launches[0] for c in launches)


def test_split_partials_share_one_buffer(kernels):
    """Decode shapes that cut the candidate list write their partial rows
    into the device's one buffer, not into memory of their own."""
    storages = set()
    for tokens, heads in ((1, 8), (1, 64), (2, 128), (8, 16)):
        args = call_args(tokens, heads)
        kernels.triton_sparse_mla_dsv41(**args)
        grid, fwd_args, constants = kernels._sparse_mla_fwd_kernel.calls[-1]
        assert constants["SPLIT"] and grid[1] > 1
        part_out, part_lse = fwd_args[6], fwd_args[7]
        assert part_out.shape == (tokens, heads, grid[1], 512)
        assert part_lse.shape == (tokens, heads, grid[1])
        # The two views do not overlap.
        assert part_lse.data_ptr() >= part_out.data_ptr() + part_out.numel() * 4
        storages.add(part_out.untyped_storage().data_ptr())
        storages.add(part_lse.untyped_storage().data_ptr())
    assert len(storages) == 1
    assert kernels._sparse_mla_combine_kernel.calls


def test_each_geometry_launches_with_its_own(kernels):
    """A plan is never reused for tensors of another geometry: other token
    counts, strides or pools reach the kernel as they are."""
    first = call_args(4, 16)
    kernels.triton_sparse_mla_dsv41(**first)
    wider = torch.zeros(8, 32, 512, dtype=torch.bfloat16)
    second = call_args(8, 16)
    second["query"] = wider[:, ::2]  # a head stride of 1024 elements
    second["swa_kv_cache"] = packed_pool(8, page_size=32)
    kernels.triton_sparse_mla_dsv41(**second)
    (grid1, args1, _), (grid2, args2, _) = kernels._sparse_mla_fwd_kernel.calls[:2]
    assert grid1[0] == 4 and grid2[0] == 8  # one 16-head block per token
    assert args1[0] is first["query"] and args2[0] is second["query"]
    assert args1[1:3] == (16 * 512, 512)
    assert args2[1:3] == (32 * 512, 1024)
    swa_page_size = args2[12]
    assert swa_page_size == 32 and args1[12] == 64


def test_bad_input_is_refused_after_a_good_call(kernels):
    kernels.triton_sparse_mla_dsv41(**call_args(4, 16))
    bad = call_args(4, 16)
    bad["sparse_indices"] = bad["sparse_indices"].to(torch.int64)
    with pytest.raises(ValueError, match="sparse_indices must be int32"):
        kernels.triton_sparse_mla_dsv41(**bad)
    bad = call_args(4, 16)
    bad["sinks"] = torch.zeros(8)
    with pytest.raises(ValueError, match=r"sinks must be float32 of shape \(16,\)"):
        kernels.triton_sparse_mla_dsv41(**bad)
    assert len(kernels._sparse_mla_fwd_kernel.calls) == 1


def test_float8_pools_go_to_the_kernel_unviewed(kernels):
    """FP8 pools reach the kernel as they are (it reads them as bytes), with
    the geometry of their uint8 twins."""
    as_bytes = call_args(2, 64)
    as_fp8 = dict(as_bytes)
    for name in ("swa_kv_cache", "compressed_kv_cache"):
        as_fp8[name] = as_bytes[name].view(torch.float8_e4m3fn)
    kernels.triton_sparse_mla_dsv41(**as_bytes)
    kernels.triton_sparse_mla_dsv41(**as_fp8)
    (_, bytes_args, bytes_consts), (_, fp8_args, fp8_consts) = (
        kernels._sparse_mla_fwd_kernel.calls
    )
    assert fp8_args[11] is as_fp8["swa_kv_cache"]
    assert fp8_args[11].dtype == torch.float8_e4m3fn
    assert fp8_args[12:15] == bytes_args[12:15] == (64, 64 * RECORD, 576)
    assert fp8_consts == bytes_consts and fp8_consts["SWA_REC"] == 1


@pytest.fixture
def workspace():
    """vLLM's workspace manager with two lanes (two owners of scratch, as
    two micro-batches are)."""
    from vllm.v1.worker import workspace

    if not hasattr(workspace.WorkspaceManager, "get_persistent_resource"):
        pytest.skip("this vLLM's workspace manager keeps no keyed resources")
    workspace.init_workspace_manager(torch.device("cpu"), num_lanes=2)
    yield workspace
    workspace.reset_workspace_manager()


def _partials_storage(kernels) -> int:
    _, fwd_args, constants = kernels._sparse_mla_fwd_kernel.calls[-1]
    assert constants["SPLIT"]
    return fwd_args[6].untyped_storage().data_ptr()


def test_partials_come_from_the_workspace_lane(kernels, workspace):
    """Inside vLLM's workspace manager each lane's calls write their partial
    rows into a buffer of that lane's, and a planned call still runs no
    torch operator."""
    args = call_args(1, 64)
    storages = {}
    for lane in (0, 1, 0, 1):
        with workspace.use_workspace_lane(lane):
            kernels.triton_sparse_mla_dsv41(**args)
            storages.setdefault(lane, set()).add(_partials_storage(kernels))
    assert all(len(s) == 1 for s in storages.values())
    assert storages[0] != storages[1]
    assert kernels._own_partials == {}
    with workspace.use_workspace_lane(1), TorchOps() as later:
        kernels.triton_sparse_mla_dsv41(**args)
    assert later.ops == []


def test_a_locked_workspace_refuses_a_new_lanes_partials(kernels, workspace):
    """The buffer is the manager's own resource: once the manager is locked
    (after warm-up), a lane that never ran the kernel gets the manager's
    refusal instead of a new allocation."""
    args = call_args(1, 64)
    kernels.triton_sparse_mla_dsv41(**args)
    workspace.lock_workspace()
    kernels.triton_sparse_mla_dsv41(**args)  # lane 0 has its buffer
    with workspace.use_workspace_lane(1), pytest.raises(AssertionError, match="lock"):
        kernels.triton_sparse_mla_dsv41(**args)
