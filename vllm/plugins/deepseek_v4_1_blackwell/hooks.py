# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The places where upstream vLLM 0.30.0 has no extension point.

Each binding here becomes a small in-place edit in the upstream pull request
(docs/upstream-pr.md lists them). Every binding is idempotent and checks that
the upstream object it replaces still has the shape it was written for.
"""

from vllm.logger import init_logger

logger = init_logger(__name__)


def install() -> None:
    """Apply every binding; safe to call more than once."""
