# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The fork builds through its PEP 517 backend (pyproject.toml):

    pip wheel --no-deps .        # or: python -m build --wheel

``python setup.py`` builds the same wheel into dist/.
"""

from pathlib import Path

from tools.fork.build_wheel import build

if __name__ == "__main__":
    print(build(Path(__file__).resolve().parent / "dist"))
