# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A new module as an earlier patch of the series adds it.

The repository holds each module in its final form; the earlier copy drops
the definitions a later patch owns (``"negotiate"``, ``"SparseMLAPlan.note"``)
with their decorators and comments, the innermost statements using them (a
member by attribute name), blocks that only did so, then unused imports,
spacing what stays as ruff would. A block left empty is an error: the final
module must be written so each stage stands alone.
"""

import ast
from collections.abc import Iterable


def _defined_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _span(node: ast.stmt, lines: list[str]) -> tuple[int, int]:
    """0-based first and last line of ``node``, decorators and the comments
    right above it included."""
    start = min(d.lineno for d in [node, *getattr(node, "decorator_list", [])]) - 1
    indent = _indent(lines[start])
    while (
        start > 0
        and lines[start - 1].strip().startswith("#")
        and _indent(lines[start - 1]) == indent
    ):
        start -= 1
    assert node.end_lineno is not None
    return start, node.end_lineno - 1


def _cut(lines: list[str], spans: list[tuple[int, int, list[str]]]) -> list[str]:
    """Replace each 0-based inclusive line span with its lines, setting the
    blank lines around a span taken out whole as ruff would."""
    out: list[str] = []
    position = 0
    for start, end, replacement in sorted(spans):
        out += lines[position:start]
        position = end + 1
        if replacement:
            out += replacement
            continue
        before = 0
        while out and not out[-1].strip():
            out.pop()
            before += 1
        while position < len(lines) and not lines[position].strip():
            position += 1
        if not out or position >= len(lines):
            continue
        prev, nxt = out[-1], lines[position]
        opens_def = nxt.lstrip().startswith(("def ", "async def ", "class ", "@"))
        if prev.rstrip().endswith(":") and not prev.lstrip().startswith("#"):
            gap = 0
        elif _indent(nxt) == 0 and (opens_def or prev[:1].isspace()):
            gap = 2
        else:
            gap = 1 if opens_def else before
        out += [""] * gap
    return out + lines[position:]


def _unused_imports(source: str) -> list[tuple[int, int, list[str]]]:
    """Spans of the top-level imports binding a name nothing uses, each with
    what stays of it."""
    tree = ast.parse(source)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    # Names in string annotations ("PagedBackends") count as uses too.
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            used.update(node.value.replace("|", " ").replace("[", " ").split())
    spans: list[tuple[int, int, list[str]]] = []
    for node in tree.body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        kept = [a for a in node.names if (a.asname or a.name).split(".")[0] in used]
        if len(kept) == len(node.names):
            continue
        names = [f"{a.name} as {a.asname}" if a.asname else a.name for a in kept]
        text = [f"import {', '.join(a.name for a in kept)}"] if kept else []
        if kept and isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            text = [f"from {module} import {', '.join(names)}"]
            if len(text[0]) > 88:  # ruff's line length
                text = [f"from {module} import (", *(f"    {n}," for n in names), ")"]
        assert node.end_lineno is not None
        spans.append((node.lineno - 1, node.end_lineno - 1, text))
    return spans


def earlier_stage(source: str, removed: Iterable[str]) -> str:
    """``source`` without the definitions ``removed`` names and everything
    that uses them (see the module docstring)."""
    qualified = set(removed)
    if not qualified:
        return source
    names = {n for n in qualified if "." not in n}
    members = {n.split(".", 1)[1] for n in qualified if "." in n}

    def uses(node: ast.AST) -> bool:
        return any(
            (isinstance(sub, ast.Name) and sub.id in names)
            or (isinstance(sub, ast.Attribute) and sub.attr in members)
            for sub in ast.walk(node)
        )

    def doomed(body: list[ast.stmt], scope: str) -> list[ast.stmt]:
        """The statements of ``body`` and its blocks that go; ``scope`` prefixes
        the names ``body`` defines ("Class."), matching none in a function."""
        out: list[ast.stmt] = []
        for node in body:
            defines = qualified & {scope + n for n in _defined_names(node)}
            if isinstance(node, ast.ClassDef) and not defines:
                out += doomed(node.body, f"{node.name}.")
                continue
            blocks = [
                block
                for field in ("body", "orelse", "finalbody", "handlers")
                if isinstance(block := getattr(node, field, None), list)
            ]
            inside = {id(s) for block in blocks for s in block}
            outer = [c for c in ast.iter_child_nodes(node) if id(c) not in inside]
            if defines or any(map(uses, outer)):
                out.append(node)
                continue
            # Handlers are no statements: their bodies are left as they are.
            inner = [
                stmt
                for block in blocks
                for stmt in doomed([s for s in block if isinstance(s, ast.stmt)], "\0")
            ]
            # A branch that only did what went goes with its condition.
            if (
                isinstance(node, (ast.If, ast.For, ast.While, ast.With))
                and not getattr(node, "orelse", None)
                and {id(s) for s in node.body} <= {id(s) for s in inner}
            ):
                inner = [node]
            out += inner
        return out

    tree = ast.parse(source)
    found = {n for s in tree.body for n in _defined_names(s)}
    for c in (c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)):
        found |= {f"{c.name}.{n}" for s in c.body for n in _defined_names(s)}
    if missing := qualified - found:
        raise ValueError(f"no definition of {sorted(missing)} to remove")
    gone = doomed(tree.body, "")
    gone_ids = {id(n) for n in gone}
    for node in ast.walk(tree):
        for block in (getattr(node, f, None) for f in ("body", "orelse", "finalbody")):
            if isinstance(block, list) and block and {id(s) for s in block} <= gone_ids:
                raise ValueError(
                    f"line {getattr(node, 'lineno', 0)}: removing later definitions"
                    " empties this block; write the final module so each stage"
                    " stands alone"
                )
    lines = source.splitlines()
    staged = _cut(lines, [(*_span(n, lines), []) for n in gone])
    return "\n".join(_cut(staged, _unused_imports("\n".join(staged)))) + "\n"
