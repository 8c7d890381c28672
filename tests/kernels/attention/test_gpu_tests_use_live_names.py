# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The GPU-gated test files only run on their GPUs, so on CPU nothing would
notice one of them reaching for a name a module no longer has. Every
``module.name`` they use, through a module they import, must exist."""

import ast
import importlib
from pathlib import Path

import pytest

HERE = Path(__file__).parent
GPU_TEST_FILES = [
    HERE / "test_flashinfer_sparse_mla_dsv41_blackwell.py",
    HERE / "test_triton_dsv41_sparse_mla.py",
]


def _module_aliases(tree: ast.Module) -> dict[str, str]:
    """alias -> module for ``import a.b as x`` and ``from a import b as x``
    where ``a.b`` is a module."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                try:
                    importlib.import_module(full)
                except ImportError:
                    continue  # a class or function, not a module
                except Exception:
                    # Needs a GPU to import (FlashInfer 0.6 on a CPU torch):
                    # its names cannot be checked here.
                    continue
                aliases[a.asname or a.name] = full
    return aliases


@pytest.mark.parametrize("path", GPU_TEST_FILES, ids=lambda p: p.name)
def test_every_module_attribute_exists(path: Path):
    tree = ast.parse(path.read_text())
    aliases = _module_aliases(tree)
    assert aliases, "found no imported modules to check"
    missing = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and isinstance(node.ctx, ast.Load)
        ):
            module = importlib.import_module(aliases[node.value.id])
            if not hasattr(module, node.attr):
                missing.append(
                    f"{path.name}:{node.lineno}: {module.__name__}.{node.attr}"
                )
    assert missing == []
