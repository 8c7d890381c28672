# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The plan report's tests mock the GPU at the platform boundary the same way
the DeepSeek V4.1 model tests do (for the start-up side of a comparison)."""

from tests.models.deepseek_v41.conftest import set_capability  # noqa: F401
