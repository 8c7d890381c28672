# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
import pytest


@pytest.fixture(scope="session")
def upstream_wheel_path():
    """The pinned upstream vLLM wheel, checked against its sha256."""
    from tools.fork.common import upstream_wheel

    return upstream_wheel()


def pytest_ignore_collect(collection_path, config):
    """Files of a concern the base's series lacks (tools/fork/series.toml)
    test modules its wheel does not ship: not collected on that base."""
    from tools.fork.common import REPO, on_base

    if collection_path.is_file() and collection_path.is_relative_to(REPO):
        return None if on_base(collection_path.relative_to(REPO)) else True
    return None
