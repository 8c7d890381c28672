# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""SM12x's fixed pages on a GPU the Triton kernel serves.

FlashInfer's fixed-page SM120 kernels need 64-token sliding-window pages and
64 compressed states per page. The Triton kernel takes any page, so an H100 or
H200 can run that geometry through vLLM's engine once the page policy plans
it there; this installs such a plan in the calling process only.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

from tests.v1.attention.dsv41.many_step_decode import SM12X_PAGE


def force_sm12x_pages(setattr_: Callable[[Any, str, Any], None]) -> None:
    """Make the page policy plan SM12x's fixed pages wherever its plan is the
    Triton kernel. ``setattr_``: ``monkeypatch.setattr`` in a test, or
    ``setattr`` in a benchmark process. Needs a vLLM with the page policy."""
    from vllm.models.deepseek_v41.nvidia import sparse_mla_pages

    plan_pages = sparse_mla_pages.plan_pages

    def plan_sm12x_pages(capability, envelope=None):
        plan = plan_pages(capability, envelope)
        if plan.kernel is not sparse_mla_pages.SparseMLAKernel.TRITON:
            return plan
        return dataclasses.replace(plan, fixed_page=SM12X_PAGE)

    setattr_(sparse_mla_pages, "plan_pages", plan_sm12x_pages)
