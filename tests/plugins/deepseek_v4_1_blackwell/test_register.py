# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""register(): idempotent, and inert with a logged reason on another vLLM."""

import logging
import subprocess
import sys

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


# Run in a fresh interpreter: this test session imports the model long before.
DEFERRED_BINDINGS = """
import sys
from vllm.plugins.deepseek_v4_1_blackwell import register
assert register()
loaded = sorted(m for m in sys.modules if m.startswith("vllm.models.deepseek_v4"))
assert loaded == [], loaded
from vllm.models.deepseek_v41.nvidia import flashinfer_sparse, model
from vllm.plugins.deepseek_v4_1_blackwell.hooks import _WRAPPED
launcher = flashinfer_sparse.flashinfer_trtllm_batch_decode_sparse_mla_dsv4
assert getattr(model._select_dsv4_attn_cls, _WRAPPED, False)
assert getattr(launcher, _WRAPPED, False)
print("deferred bindings applied")
"""


def test_register_defers_the_model_bindings_to_the_model_import():
    """A process that never builds DeepSeek V4.1 never imports it; one that
    does gets every binding as the model's modules load."""
    result = subprocess.run(
        [sys.executable, "-c", DEFERRED_BINDINGS], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "deferred bindings applied" in result.stdout
