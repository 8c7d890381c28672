# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The build refuses edited files and new modules that name what the base
lacks, with file and name, before any wheel is written."""

import dataclasses
import textwrap

import pytest

from tools.fork import build_wheel, name_check
from tools.fork.edit_engine import ADD_TO_CLASS
from tools.fork.edits import EDITS

FI = "vllm/models/deepseek_v41/nvidia/flashinfer_sparse.py"
BACKEND = "DeepseekV4FlashInferMLASparseBackend"


def _planted_build_error(monkeypatch, upstream_wheel_path, body: str) -> str:
    """The build's error with a method of ``body`` planted in an edit of the
    FlashInfer backend."""
    host = next(e for e in EDITS if e.action == ADD_TO_CLASS and e.scope == BACKEND)
    method = "@classmethod\ndef planted(cls) -> int:\n" + textwrap.indent(body, "    ")
    planted = dataclasses.replace(host, text=method, bases=None)
    monkeypatch.setattr(build_wheel, "EDITS", (*EDITS, planted))
    with pytest.raises(name_check.NameCheckError) as info:
        build_wheel.edited_upstream_files(upstream_wheel_path)
    return str(info.value)


def test_the_real_build_passes(upstream_wheel_path):
    edited = build_wheel.edited_upstream_files(upstream_wheel_path)
    assert FI in edited


def test_an_undefined_name_in_an_edit_fails_the_build(monkeypatch, upstream_wheel_path):
    body = "return _NAME_UPSTREAM_NEVER_HAD\n"
    message = _planted_build_error(monkeypatch, upstream_wheel_path, body)
    assert f"{FI}: F821" in message
    assert "_NAME_UPSTREAM_NEVER_HAD" in message


def test_an_import_of_a_name_the_base_lacks_fails_the_build(
    monkeypatch, upstream_wheel_path
):
    body = (
        "from vllm.config.cache import NOT_A_NAME_OF_VLLM\n\n"
        "return NOT_A_NAME_OF_VLLM\n"
    )
    message = _planted_build_error(monkeypatch, upstream_wheel_path, body)
    assert f"{FI}:" in message
    assert "vllm.config.cache has no NOT_A_NAME_OF_VLLM" in message


def test_an_unused_import_in_a_new_module_is_named():
    with pytest.raises(name_check.NameCheckError) as info:
        name_check.check(
            {},
            lambda path: "",
            {"vllm/new.py": "import os\n"},
            lambda module: None,
            "x",
        )
    assert "vllm/new.py: F401" in str(info.value)


def test_names_through_star_imports_resolve():
    sources = {
        "vllm.pkg.__init__": "",
        "vllm.pkg": "from .inner import *\n",
        "vllm.pkg.inner": "def helper():\n    pass\n",
    }
    new = {"vllm/new.py": "from vllm.pkg import helper\n\nhelper()\n"}
    name_check.check({}, lambda path: "", new, sources.get, "x")
    new = {"vllm/new.py": "from vllm.pkg import gone\n\ngone()\n"}
    with pytest.raises(name_check.NameCheckError, match="vllm.pkg has no gone"):
        name_check.check({}, lambda path: "", new, sources.get, "x")
