# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""``vllm serve`` with SM12x's fixed pages planned wherever the page policy
plans the Triton kernel (tests/v1/attention/dsv41/sm12x_pages.py), so that a
Hopper GPU serves that page geometry.

    python benchmarks/dsv41_serve_sm12x_pages.py serve MODEL [vllm serve args]

The plan is installed when this file is imported, not under the main guard:
a process that multiprocessing spawns imports the parent's main module, so
vLLM's engine core gets the plan whether it is forked or spawned.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.v1.attention.dsv41.sm12x_pages import force_sm12x_pages  # noqa: E402

force_sm12x_pages(setattr)

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    main()
