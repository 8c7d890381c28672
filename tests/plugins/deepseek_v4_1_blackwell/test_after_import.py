# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""after_import: a callback runs once its module has been executed, never
before, and a failing callback fails the import."""

import importlib
import sys

import pytest

from vllm.plugins.deepseek_v4_1_blackwell.after_import import after_import


@pytest.fixture
def module_on_path(tmp_path, monkeypatch):
    """A fresh importable module whose name no other test uses."""
    names = []

    def make(name: str, body: str) -> str:
        (tmp_path / f"{name}.py").write_text(body)
        names.append(name)
        return name

    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield make
    for name in names:
        sys.modules.pop(name, None)


def test_callback_runs_after_the_first_import(module_on_path):
    name = module_on_path("dsv41_after_import_a", "VALUE = 41\n")
    seen = []
    after_import(name, lambda: seen.append(sys.modules[name].VALUE))
    assert seen == []
    module = importlib.import_module(name)
    assert seen == [41]
    # Importing again, or reloading, does not run it again.
    importlib.import_module(name)
    importlib.reload(module)
    assert seen == [41]
    # The module keeps working as its own loader made it.
    assert module.__spec__.origin.endswith(f"{name}.py")


def test_callback_for_an_imported_module_runs_now(module_on_path):
    name = module_on_path("dsv41_after_import_b", "VALUE = 1\n")
    importlib.import_module(name)
    seen = []
    after_import(name, lambda: seen.append(True))
    assert seen == [True]


def test_a_failing_callback_fails_the_import(module_on_path):
    name = module_on_path("dsv41_after_import_c", "VALUE = 1\n")

    def refuse():
        raise RuntimeError("upstream changed")

    after_import(name, refuse)
    with pytest.raises(RuntimeError, match="upstream changed"):
        importlib.import_module(name)
