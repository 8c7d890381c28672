# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Every FlashInfer name vLLM's DeepSeek V4 / V4.1 code paths and its
FlashInfer utilities reach exists in the FlashInfer the dev venv installs
(for vLLM 0.34.0 a newer release than the one it pins, which the package
index lacks), and every keyword they pass it is one it takes.

The names are read from vLLM's installed sources: ``from flashinfer... import``
statements, and the module and attribute strings handed to vLLM's lazy
importers (``_lazy_import_wrapper``, ``_get_submodule``). An import inside a
``try`` that catches ``ImportError`` is optional and may be absent.
"""

import ast
import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import vllm
from tools.fork.common import load_pin

# Only where the dev venv replaces the FlashInfer vLLM pins is there a second
# release to hold vLLM's names against; the pinned one is vLLM's own (and
# FlashInfer 0.6 does not import on a CPU-only torch).
pytestmark = pytest.mark.skipif(
    getattr(load_pin(), "UPSTREAM_FLASHINFER_VERSION", None) is None,
    reason="this base installs the FlashInfer vLLM pins",
)

ROOT = Path(vllm.__file__).parent
SOURCES = [
    *sorted((ROOT / "models" / "deepseek_v4").rglob("*.py")),
    *sorted((ROOT / "models" / "deepseek_v41").rglob("*.py")),
    *sorted((ROOT / "v1" / "attention" / "backends" / "mla").glob("*.py")),
    ROOT / "utils" / "flashinfer.py",
]


@dataclass
class Use:
    where: str
    module: str
    name: str | None  # None: the module itself
    optional: bool
    keywords: set[str] = field(default_factory=set)


def _guarded_by_import_error(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                caught = ast.unparse(handler.type) if handler.type else "Exception"
                if "ImportError" in caught or caught in ("Exception", "BaseException"):
                    return True
    return False


def flashinfer_uses(path: Path) -> list[Use]:
    tree = ast.parse(path.read_text())
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    where = str(path.relative_to(ROOT.parent))
    uses: list[Use] = []
    imported: dict[str, Use] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and ((node.module or "").split(".")[0] == "flashinfer")
        ):
            optional = _guarded_by_import_error(node, parents)
            for alias in node.names:
                use = Use(where, node.module or "", alias.name, optional)
                uses.append(use)
                imported[alias.asname or alias.name] = use
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            strings = [
                a.value
                for a in node.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str)
            ]
            if not strings or strings[0].split(".")[0] != "flashinfer":
                continue
            if node.func.id == "_lazy_import_wrapper" and len(strings) >= 2:
                uses.append(Use(where, strings[0], strings[1], False))
            elif node.func.id == "_get_submodule":
                # vLLM's probe returns None for a missing module.
                uses.append(Use(where, strings[0], None, True))
    # Keywords passed to what was imported by name.
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in imported
        ):
            imported[node.func.id].keywords |= {k.arg for k in node.keywords if k.arg}
    return uses


def _resolve(module: str, name: str | None):
    target = importlib.import_module(module)
    return target if name is None else getattr(target, name)


USES = [use for path in SOURCES for use in flashinfer_uses(path)]


def test_the_sources_name_flashinfer():
    """The reading finds the names the DeepSeek V4.1 paths are known to use."""
    names = {name for _, name in ((u.module, u.name) for u in USES)}
    assert "trtllm_batch_decode_sparse_mla_dsv4" in names, sorted(names, key=str)
    assert len(USES) >= 10


@pytest.mark.parametrize(
    "use",
    [u for u in USES if not u.optional],
    ids=lambda u: f"{u.module}.{u.name or ''}@{u.where}",
)
def test_every_name_vllm_calls_exists_with_its_keywords(use: Use):
    try:
        target = _resolve(use.module, use.name)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"{use.where}: {use.module}.{use.name} is not there: {e}")
    if not use.keywords or not callable(target):
        return
    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return  # a compiled callable without a signature
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    missing = use.keywords - set(parameters)
    assert not missing, f"{use.where}: {use.module}.{use.name} takes no {missing}"


@pytest.mark.parametrize(
    "use, message",
    [
        (Use("planted", "flashinfer.decode", "no_such_kernel", False), "not there"),
        (
            Use(
                "planted",
                "flashinfer.decode",
                "trtllm_batch_decode_sparse_mla_dsv4",
                False,
                {"no_such_keyword"},
            ),
            "takes no",
        ),
    ],
)
def test_a_missing_name_or_keyword_fails(use: Use, message: str):
    with pytest.raises((AssertionError, pytest.fail.Exception), match=message):
        test_every_name_vllm_calls_exists_with_its_keywords(use)
