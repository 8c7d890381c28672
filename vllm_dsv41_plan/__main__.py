# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""``python -m vllm_dsv41_plan``: the plan report's command line."""

import sys

from vllm_dsv41_plan.report import main

if __name__ == "__main__":
    sys.exit(main())
