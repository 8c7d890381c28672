# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The page policy against FlashInfer's fixed-page SM120 kernels on an SM12x
GPU: the 32-token sliding-window page vLLM's layers used to build is refused
by FlashInfer, and the page the policy plans is served.

The kernel worlds, launch arguments and reference are those of
``test_flashinfer_sparse_mla_dsv41_blackwell.py``.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.attention import test_flashinfer_sparse_mla_dsv41_blackwell as bw
from tests.kernels.attention.test_flashinfer_sparse_mla_dsv41_blackwell import (
    workspace,  # noqa: F401 (a fixture)
)
from vllm.models.deepseek_v41.nvidia import sparse_mla_pages

# The sliding-window page vLLM's layers build without the page policy.
UNPLANNED_SWA_PAGE = 32


@bw.SM12X
def test_sm12x_unplanned_swa_page_refused_planned_page_served(
    workspace: torch.Tensor,  # noqa: F811
) -> None:
    plan = sparse_mla_pages.plan_pages(bw._capability())
    if plan.fixed_page is None:
        pytest.skip(
            f"{plan.envelope.source if plan.envelope else 'FlashInfer'} takes "
            f"page sizes at run time: a {UNPLANNED_SWA_PAGE}-token page is not "
            "refused"
        )
    assert plan.swa_block_size != UNPLANNED_SWA_PAGE
    case = bw.KernelCase(((40, 1), (100, 1), (300, 1)), 16, 2, "packed")
    comp_states = plan.compressed_block_size(case.ratio) // case.ratio

    unplanned = bw._kernel_world(case, UNPLANNED_SWA_PAGE, comp_states, 7)
    arguments = {k: bw._to_gpu(v) for k, v in bw._sm12x_arguments(unplanned).items()}
    with pytest.raises(
        (ValueError, RuntimeError),
        match=rf"no decode kernel for this shape.*page_block_size={UNPLANNED_SWA_PAGE}",
    ):
        bw._flashinfer_decode()(**arguments, workspace_buffer=workspace)
        bw._sync()

    planned = bw._kernel_world(case, plan.swa_block_size, comp_states, 7)
    bw._run_and_compare(bw._sm12x_arguments(planned), planned, "sparse", workspace)
