# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
import pytest


@pytest.fixture(scope="session")
def upstream_wheel_path():
    """The pinned upstream vLLM wheel, checked against its sha256."""
    from tools.fork.common import upstream_wheel

    return upstream_wheel()
