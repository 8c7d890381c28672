# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The edit list applies to the pinned upstream, and the fork binds nothing
at run time."""

import ast
import fnmatch
import tomllib
import zipfile

import pytest

from tools.fork.common import REPO, load_pin, new_module_files
from tools.fork.edit_engine import EditError, apply_edit, apply_edits
from tools.fork.edits import CONCERNS, EDITS
from tools.fork.patch_series import FORK_ONLY, series_files


@pytest.fixture(scope="module")
def pristine(upstream_wheel_path):
    with zipfile.ZipFile(upstream_wheel_path) as zf:
        paths = {e.file for e in EDITS}
        return {p: zf.read(p).decode() for p in paths}


def test_every_edit_applies_once_and_changes_its_file(pristine):
    base = load_pin().VLLM_VERSION
    text = dict(pristine)
    for edit in (e for e in EDITS if e.applies_to(base)):
        edited = apply_edit(text[edit.file], edit, base)
        assert edited != text[edit.file], f"{edit.file}: {edit.where}: no change"
        text[edit.file] = edited
    # Applied again on the edited text, an anchored edit no longer finds its
    # target (or finds the fork's own lines) instead of silently doubling.
    assert apply_edits(pristine.__getitem__, EDITS, base) == {
        p: t for p, t in text.items() if t != pristine[p]
    }


def test_an_edit_fails_loudly_when_upstream_moves(pristine):
    """The same edit on a file where its anchor became ambiguous."""
    edit = next(e for e in EDITS if e.anchor == "block_size=32,")
    moved = pristine[edit.file].replace(
        "            backend_cls=self.swa_backend_cls,\n",
        "            backend_cls=self.swa_backend_cls,\n            block_size=32,\n",
    )
    with pytest.raises(EditError) as info:
        apply_edit(moved, edit, load_pin().VLLM_VERSION)
    assert str(info.value) == (
        "vllm/models/deepseek_v41/attention.py: DeepseekV4Attention.__init__: "
        "anchor 'block_size=32,' found 2 times; it must occur exactly once there"
    )


def test_every_edit_and_new_file_belongs_to_one_patch():
    assert {e.concern for e in EDITS} == set(CONCERNS)
    in_series = {p for files in series_files().values() for p in files}
    for path in new_module_files():
        name = str(path)
        if any(fnmatch.fnmatch(name, pattern) for pattern in FORK_ONLY):
            continue  # the old import path and the plan report are the fork's
        assert name in in_series, f"{name} is in no patch of the series"
    # The fork's own files stay out of every patch.
    for path in in_series:
        assert not any(fnmatch.fnmatch(path, p) for p in FORK_ONLY), path


def _fork_python_files():
    for path in new_module_files():
        if path.suffix == ".py":
            yield path, ast.parse((REPO / path).read_text())


def test_no_run_time_binding_in_the_fork():
    """No attribute of another module is replaced, no import hook is
    installed: a fresh interpreter of the edited tree is the fork."""
    for path, tree in _fork_python_files():
        imported = {
            (alias.asname or alias.name).split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in (
                "setattr",
                "delattr",
            ):
                pytest.fail(f"{path}:{node.lineno}: {node.func.id}() call")
            if isinstance(node, ast.Attribute) and node.attr in (
                "meta_path",
                "path_hooks",
            ):
                pytest.fail(f"{path}:{node.lineno}: sys.{node.attr}")
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AugAssign | ast.AnnAssign)
                else []
            )
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id in imported
                ):
                    pytest.fail(f"{path}:{node.lineno}: assigns {target.value.id}.*")


def test_no_plugin_entry_point_declared():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "entry-points" not in pyproject.get("project", {})
    assert not (REPO / "vllm" / "plugins").exists()
