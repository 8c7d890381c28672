# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""register(): idempotent, and inert with a logged reason on another vLLM."""

import logging

import pytest

import vllm
from vllm.plugins import deepseek_v4_1_blackwell as fork
from vllm.plugins.deepseek_v4_1_blackwell import hooks


@pytest.fixture
def fresh_plugin(monkeypatch):
    """A plugin that has not registered yet, with hook installs counted."""
    calls = []
    monkeypatch.setattr(fork, "_registered", False)
    monkeypatch.setattr(hooks, "install", lambda: calls.append(1))
    return calls


def test_register_is_idempotent(fresh_plugin):
    assert fork.register() is True
    assert fork.register() is True
    assert fresh_plugin == [1]


def test_register_refuses_other_vllm_versions(fresh_plugin, monkeypatch, caplog):
    monkeypatch.setattr(vllm, "__version__", "0.31.0")
    with caplog.at_level(logging.WARNING):
        assert fork.register() is False
    assert fresh_plugin == []
    assert fork._registered is False
    message = " ".join(r.getMessage() for r in caplog.records)
    assert "0.30.0" in message and "0.31.0" in message


def test_vllm_plugin_loader_finds_register():
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

    plugins = load_plugins_by_group(DEFAULT_PLUGINS_GROUP)
    assert plugins["deepseek_v4_1_blackwell"] is fork.register
