# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""PEP 517 backend: ``pip wheel .`` at the repository root builds the fork wheel.

``python -m build --wheel`` too, byte for byte what the main job builds
(tools/fork/build_wheel.py; nothing is compiled). The base is
``VLLM_FORK_BASE`` or the config setting ``base`` (``--config-settings base=0.34.0``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.fork.build_wheel import build  # noqa: E402
from tools.fork.common import select_base  # noqa: E402


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None) -> str:
    select_base((config_settings or {}).get("base"))
    return build(Path(wheel_directory)).name
