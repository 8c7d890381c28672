# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A stand-in for vLLM's command line (``serve`` and ``bench serve``), put
first on ``PYTHONPATH`` to run benchmarks/dsv41_serve.py without a GPU."""
