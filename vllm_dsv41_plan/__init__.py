# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The DeepSeek V4.1 plan report: what start-up will do on a GPU, before any
weights are loaded.

    python -m vllm_dsv41_plan plan --capability 12.0 [--config config.json] ...

The fork's own command, shipped in the fork wheel beside ``vllm`` and not part
of the upstream patch series. Importing this package imports no vLLM module.
"""
