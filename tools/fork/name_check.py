# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Refuse a build whose edited files or new modules name what the base lacks.

Two checks, both before anything is written: ruff's undefined-name and
unused-import rules (F821, F401) on every edited file, counting only what the
edits add to the pristine file's own findings, and on every new module; and
each ``from vllm... import name`` resolved against the base's wheel and the
new modules, since a name upstream moved is an ImportError, not F821.
"""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from tools.fork.common import DEV_REQUIREMENTS, REPO, log, run_pip

RULES = "F821,F401"
RUFF_DIR = REPO / ".cache" / "ruff"


class NameCheckError(SystemExit):
    """An edited file or new module names something the base does not have."""


def _ruff() -> str:
    """The ruff of ``requirements/dev.txt``: installed, else fetched once."""
    pinned = re.search(r"(?m)^ruff==(\S+)", DEV_REQUIREMENTS.read_text())
    assert pinned, f"{DEV_REQUIREMENTS.name} pins no ruff"
    for candidate in (
        Path(sys.executable).with_name("ruff"),
        RUFF_DIR / "bin" / "ruff",
    ):
        if candidate.is_file():
            return str(candidate)
    if found := shutil.which("ruff"):
        return found
    # Into a folder of this process's own, then renamed: the bases' dev venvs
    # are made side by side, and each may get here.
    RUFF_DIR.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=RUFF_DIR.parent, prefix=".ruff-"))
    run_pip(
        Path(sys.executable), "install", "-q", "--target", staging,
        f"ruff=={pinned[1]}", env={**os.environ, "PIP_NO_CACHE_DIR": "1"},
    )  # fmt: skip
    try:
        staging.rename(RUFF_DIR)
    except OSError:  # another process's install got there first
        shutil.rmtree(staging)
    return str(RUFF_DIR / "bin" / "ruff")


def _findings(path: str, text: str) -> list[tuple[str, str]]:
    """(rule, message) of ruff's name rules on ``text`` as the file ``path``."""
    result = subprocess.run(
        [_ruff(), "check", "--isolated", "--no-cache", "--select", RULES,
         "--output-format", "json", "--stdin-filename", path, "-"],
        input=text, capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode not in (0, 1):
        raise NameCheckError(f"ruff failed on {path}: {result.stderr.strip()}")
    return [(f["code"], f["message"]) for f in json.loads(result.stdout)]


def _imports(text: str) -> list[tuple[int, str, str]]:
    """(line, module, name) of each absolute ``from vllm... import name``."""
    return [
        (node.lineno, node.module, alias.name)
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.ImportFrom) and node.level == 0
        if (node.module or "").startswith("vllm.")
        for alias in node.names
    ]


def _module_level(tree: ast.Module) -> Iterator[ast.AST]:
    """Nodes bound at module level: any branch of an if, try or with, no
    function or class body (a definition itself is yielded)."""
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            todo.extend(ast.iter_child_nodes(node))


def _defines(
    module: str, name: str, module_text: Callable[[str], str | None], depth: int = 0
) -> bool:
    """Whether ``module`` binds ``name`` at module level, through its star
    imports, or has it as a submodule."""
    if module_text(f"{module}.{name}") is not None:
        return True
    source = module_text(module)
    if source is None or depth > 4:
        return False
    for node in _module_level(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                return True
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            if node.id == name:
                return True
        elif isinstance(node, ast.Import | ast.ImportFrom):
            if any((a.asname or a.name).split(".")[0] == name for a in node.names):
                return True
            if isinstance(node, ast.ImportFrom) and node.names[0].name == "*":
                # A package's own level is 1; a module's is its package.
                level = node.level - (module_text(f"{module}.__init__") is not None)
                parent = module.rsplit(".", level)[0] if level else module
                parent = parent if node.level else ""
                target = ".".join(p for p in (parent, node.module) if p)
                if _defines(target, name, module_text, depth + 1):
                    return True
    return False


def _unresolved_imports(
    path: str,
    text: str,
    module_text: Callable[[str], str | None],
    known: set[tuple[str, str]],
) -> list[str]:
    problems = []
    for line, module, name in _imports(text):
        if (module, name) in known:
            continue
        if module_text(module) is None:
            problems.append(f"{path}:{line}: no module {module}")
        elif not _defines(module, name, module_text):
            problems.append(f"{path}:{line}: {module} has no {name}")
    return problems


def check(
    edited: Mapping[str, str],
    pristine: Callable[[str], str],
    new_modules: Mapping[str, str],
    module_text: Callable[[str], str | None],
    base: str,
) -> None:
    """Raise naming file and name for what the edits or new modules leave
    undefined, unused or unresolvable on ``base``."""
    problems: list[str] = []
    for path, text in sorted(edited.items()):
        before = _findings(path, pristine(path))
        problems += [
            f"{path}: {code} {message}"
            for code, message in _findings(path, text)
            if (code, message) not in before
        ]
    for path, text in sorted(new_modules.items()):
        if path.endswith(".py"):
            problems += [f"{path}: {c} {m}" for c, m in _findings(path, text)]
    # Upstream's own imports resolve on its base; only the fork's are checked.
    for path, text in sorted(edited.items()):
        known = {(m, n) for _, m, n in _imports(pristine(path))}
        problems += _unresolved_imports(path, text, module_text, known)
    for path, text in sorted(new_modules.items()):
        problems += _unresolved_imports(path, text, module_text, set())
    if problems:
        raise NameCheckError(
            f"the fork names what vLLM {base} does not have (fix tools/fork/"
            "edits.py or the new module):\n  " + "\n  ".join(problems)
        )
    log(f"names checked: {len(edited)} edited files, {len(new_modules)} new files")
