# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A new module as an earlier patch of the series adds it.

The repository holds each new module in its final form. A later patch that
extends a module (the Triton fallback growing the page policy) owns some of
its definitions; the earlier patches' copy is the module without them:

* the named top-level definitions (``"negotiate"``) and class members
  (``"SparseMLAPlan.note"``) go, with their decorators and the comment lines
  right above them;
* so does every statement that uses a name that went: a call of a removed
  function, ``SparseMLAKernel.TRITON`` after that member went, or ``x.note``
  (a member goes by its attribute name), the innermost statement holding it,
  and an ``if`` (without ``else``) whose body is left empty by that;
* imports nothing uses any more go, and blank lines are put back as ruff
  formats them.

A block left empty is an error: the final module has to be written so that
each earlier stage reads as a module of its own.
"""

import ast
from collections.abc import Iterable

LINE_LENGTH = 88


def _defined_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def _uses(node: ast.AST, names: set[str], members: set[str]) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id in names:
            return True
        if isinstance(sub, ast.Attribute) and sub.attr in members:
            return True
    return False


def _doomed(
    body: list[ast.stmt],
    qualified: set[str],
    names: set[str],
    members: set[str],
    scope: str | None,
) -> list[ast.stmt]:
    """The statements of ``body`` (and of the blocks inside it) that go;
    ``scope`` is "" for the module, "Class." for a class body, None inside a
    function, where no definition is matched by name."""
    out: list[ast.stmt] = []
    for node in body:
        if scope is not None and {f"{scope}{n}" for n in _defined_names(node)} & (
            qualified
        ):
            out.append(node)
            continue
        if isinstance(node, ast.ClassDef):
            out += _doomed(node.body, qualified, names, members, f"{node.name}.")
            continue
        blocks = [
            block
            for field in ("body", "orelse", "finalbody", "handlers")
            if isinstance(block := getattr(node, field, None), list)
        ]
        inside = {id(s) for block in blocks for s in block}
        heads = [c for c in ast.iter_child_nodes(node) if id(c) not in inside]
        if any(_uses(h, names, members) for h in heads):
            out.append(node)
            continue
        inner: list[ast.stmt] = []
        for block in blocks:
            stmts = [s for s in block if isinstance(s, ast.stmt)]
            inner += _doomed(stmts, qualified, names, members, None)
        # A branch that only did what went goes with its condition.
        body = {id(s) for s in getattr(node, "body", [])}
        if (
            isinstance(node, (ast.If, ast.For, ast.While, ast.With))
            and not getattr(node, "orelse", None)
            and body <= {id(s) for s in inner}
        ):
            inner = [node]
        out += inner
    return out


def _check_no_empty_block(tree: ast.AST, doomed: set[int]) -> None:
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if (
                isinstance(block, list)
                and block
                and all(id(s) in doomed for s in block)
            ):
                line = getattr(node, "lineno", 0)
                raise ValueError(
                    f"line {line}: removing later definitions empties this "
                    "block; write the final module so each stage stands alone"
                )


def _span(node: ast.stmt, lines: list[str]) -> tuple[int, int]:
    """0-based first and last line of ``node`` with its decorators and the
    comments right above it."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    start = first - 1
    indent = len(lines[start]) - len(lines[start].lstrip())
    while start > 0:
        above = lines[start - 1]
        if above.strip().startswith("#") and len(above) - len(above.lstrip()) == indent:
            start -= 1
        else:
            break
    assert node.end_lineno is not None
    return start, node.end_lineno - 1


def _render_import(node: ast.ImportFrom, kept: list[ast.alias], indent: str) -> str:
    def alias(a: ast.alias) -> str:
        return f"{a.name} as {a.asname}" if a.asname else a.name

    module = "." * node.level + (node.module or "")
    one_line = f"{indent}from {module} import {', '.join(map(alias, kept))}"
    if len(one_line) <= LINE_LENGTH:
        return one_line
    body = "".join(f"{indent}    {alias(a)},\n" for a in kept)
    return f"{indent}from {module} import (\n{body}{indent})"


def _cut(lines: list[str], spans: list[tuple[int, int, list[str]]]) -> list[str]:
    """Replace each 0-based inclusive line span with its lines; where a span
    is taken out whole, set the blank lines around it as ruff would."""
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
        after = 0
        while position < len(lines) and not lines[position].strip():
            position += 1
            after += 1
        if not out or position >= len(lines):
            continue
        prev, nxt = out[-1], lines[position]
        indent = len(nxt) - len(nxt.lstrip())
        opens_def = nxt.lstrip().startswith(("def ", "async def ", "class ", "@"))
        if prev.rstrip().endswith(":") and not prev.lstrip().startswith("#"):
            gap = 0
        elif indent == 0 and (opens_def or prev[:1].isspace()):
            gap = 2
        elif opens_def:
            gap = 1
        else:
            gap = before
        out += [""] * gap
    return out + lines[position:]


def _unused_imports(source: str) -> list[tuple[int, int, list[str]]]:
    """Spans of the top-level imports that bind a name nothing uses, with
    what stays of each."""
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
        assert node.end_lineno is not None
        text: list[str] = []
        if kept and isinstance(node, ast.ImportFrom):
            text = _render_import(node, kept, "").splitlines()
        elif kept:
            text = [f"import {', '.join(a.name for a in kept)}"]
        spans.append((node.lineno - 1, node.end_lineno - 1, text))
    return spans


def earlier_stage(source: str, removed: Iterable[str]) -> str:
    """``source`` without the definitions ``removed`` names (see the module
    docstring) and everything that uses them."""
    removed = tuple(removed)
    if not removed:
        return source
    names = {n for n in removed if "." not in n}
    members = {n.split(".", 1)[1] for n in removed if "." in n}
    qualified = set(removed)
    tree = ast.parse(source)
    lines = source.splitlines()
    found = {
        f"{scope}{name}"
        for node in ast.walk(tree)
        for scope, body in _scopes(node)
        for stmt in body
        for name in _defined_names(stmt)
    }
    if missing := qualified - found:
        raise ValueError(f"no definition of {sorted(missing)} to remove")
    doomed = _doomed(tree.body, qualified, names, members, "")
    _check_no_empty_block(tree, {id(n) for n in doomed})
    staged = _cut(lines, [(*_span(n, lines), []) for n in doomed])
    text = "\n".join(staged) + "\n"
    return "\n".join(_cut(staged, _unused_imports(text))) + "\n"


def _scopes(node: ast.AST) -> list[tuple[str, list[ast.stmt]]]:
    if isinstance(node, ast.Module):
        return [("", node.body)]
    if isinstance(node, ast.ClassDef):
        return [(f"{node.name}.", node.body)]
    return []
