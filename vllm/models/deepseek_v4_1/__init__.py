# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The package name vLLM used for DeepSeek V4.1 before 0.30.0 (now
``vllm.models.deepseek_v41``); kept so that imports written for it work."""
