# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Apply declarative in-place edits to upstream Python sources.

An edit names an upstream file, a scope inside it (``Class.method``, a
function, a class, or ``""`` for the module) and an anchor: the smallest text
that occurs exactly once in that scope. The scope is found by its syntax
(Python's ``ast`` line spans), never by line numbers, so an edit survives
unrelated upstream changes and fails loudly, naming file, scope and anchor,
when its target moved or became ambiguous.

Edits carry only the fork's own lines; the upstream text they sit in is read
from the pinned wheel at build time and never stored in this repository.
"""

import ast
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

# What an edit does at its anchor.
REPLACE = "replace"  # the anchor text itself becomes ``text``
# ``text`` goes before / after the anchor's statement, or, where the anchor
# starts a key of a dict display, before / after that key's entry.
INSERT_BEFORE = "insert_before"
INSERT_AFTER = "insert_after"
ADD_TO_CLASS = "add_to_class"  # ``text`` is appended to the class body
REPLACE_BODY = "replace_body"  # the function body (not its docstring)
ACTIONS = (REPLACE, INSERT_BEFORE, INSERT_AFTER, ADD_TO_CLASS, REPLACE_BODY)


class EditError(RuntimeError):
    """An edit cannot be applied to this upstream file."""


@dataclass(frozen=True)
class Edit:
    """One in-place change of an upstream file.

    ``anchor`` is the same text on every base, or a mapping from base version
    to that base's anchor. ``bases`` limits the edit to some bases (None: all).
    ``concern`` names the patch of the upstream series the edit belongs to.
    """

    file: str
    scope: str
    action: str
    text: str
    concern: str
    why: str
    anchor: str | Mapping[str, str] | None = None
    bases: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown edit action {self.action!r}")
        needs_anchor = self.action in (REPLACE, INSERT_BEFORE, INSERT_AFTER)
        if needs_anchor != (self.anchor is not None):
            raise ValueError(
                f"{self.file}: {self.scope}: {self.action} "
                + ("needs an anchor" if needs_anchor else "takes no anchor")
            )

    def applies_to(self, base: str) -> bool:
        return self.bases is None or base in self.bases

    def anchor_for(self, base: str) -> str | None:
        if self.anchor is None or isinstance(self.anchor, str):
            return self.anchor
        if base not in self.anchor:
            raise EditError(
                f"{self.file}: {self.where}: no anchor for vLLM {base} "
                f"(has {sorted(self.anchor)})"
            )
        return self.anchor[base]

    @property
    def where(self) -> str:
        return self.scope or "<module>"


def _scope_node(tree: ast.Module, edit: Edit) -> ast.AST:
    """The unique class/function named by ``edit.scope``."""
    if not edit.scope:
        return tree
    node: ast.AST = tree
    for part in edit.scope.split("."):
        matches = [
            child
            for child in ast.iter_child_nodes(node)
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and child.name == part
        ]
        if len(matches) != 1:
            found = "not found" if not matches else f"defined {len(matches)} times"
            raise EditError(
                f"{edit.file}: {edit.where}: scope {part!r} {found}; "
                "expected exactly one definition"
            )
        node = matches[0]
    return node


def _span(node: ast.AST, lines: list[str]) -> tuple[int, int]:
    """0-based [first, last] line of ``node``, decorators included."""
    if isinstance(node, ast.Module):
        return 0, len(lines) - 1
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return first - 1, node.end_lineno - 1  # type: ignore[attr-defined]


def _find_anchor(source: str, lines: list[str], node: ast.AST, edit: Edit, anchor: str):
    """(line, column) of the only occurrence of ``anchor`` in the scope."""
    first, last = _span(node, lines)
    offsets = [sum(len(line) for line in lines[:first])]
    scope_text = "".join(lines[first : last + 1])
    hits = []
    start = scope_text.find(anchor)
    while start != -1:
        hits.append(start)
        start = scope_text.find(anchor, start + 1)
    if len(hits) != 1:
        found = "not found" if not hits else f"found {len(hits)} times"
        raise EditError(
            f"{edit.file}: {edit.where}: anchor {anchor!r} {found}; "
            "it must occur exactly once there"
        )
    absolute = offsets[0] + hits[0]
    line = source.count("\n", 0, absolute)
    column = absolute - (source.rfind("\n", 0, absolute) + 1)
    return line, column


def _innermost_statement(node: ast.AST, line: int) -> ast.stmt:
    """The innermost statement of ``node`` whose lines hold 0-based ``line``."""
    holding = [
        child
        for child in ast.walk(node)
        if isinstance(child, ast.stmt)
        and child is not node
        and child.lineno - 1 <= line <= child.end_lineno - 1  # type: ignore[operator]
    ]
    if not holding:
        raise EditError(f"line {line + 1} is not inside a statement")
    return min(holding, key=lambda s: s.end_lineno - s.lineno)  # type: ignore[operator]


def _insertion_span(stmt: ast.stmt, line: int, column: int) -> tuple[int, int, int]:
    """(first line, last line, column) that an insertion at the anchor on
    0-based ``line`` and ``column`` goes around: the dict entry whose key
    starts there (upstream's registries are dict displays), else ``stmt``."""
    for child in ast.walk(stmt):
        if not isinstance(child, ast.Dict):
            continue
        for key, value in zip(child.keys, child.values, strict=True):
            if key is not None and (key.lineno - 1, key.col_offset) == (line, column):
                return key.lineno, value.end_lineno, key.col_offset  # type: ignore[return-value]
    return stmt.lineno, stmt.end_lineno, stmt.col_offset  # type: ignore[return-value]


def _indented(text: str, indent: str) -> list[str]:
    body = textwrap.dedent(text).strip("\n")
    return [(indent + ln if ln.strip() else "") + "\n" for ln in body.split("\n")]


def _body_indent(node: ast.AST, lines: list[str]) -> str:
    first = node.body[0]  # type: ignore[attr-defined]
    line = lines[first.lineno - 1]
    return line[: len(line) - len(line.lstrip())]


def apply_edit(source: str, edit: Edit, base: str) -> str:
    """``source`` with ``edit`` applied; raises EditError naming the target."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    node = _scope_node(tree, edit)
    anchor = edit.anchor_for(base)

    if edit.action == ADD_TO_CLASS:
        if not isinstance(node, ast.ClassDef):
            raise EditError(f"{edit.file}: {edit.where}: is not a class")
        new = ["\n", *_indented(edit.text, _body_indent(node, lines))]
        end = node.end_lineno  # type: ignore[attr-defined]
        lines[end:end] = new
    elif edit.action == REPLACE_BODY:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            raise EditError(f"{edit.file}: {edit.where}: is not a function")
        body = node.body
        has_doc = (
            isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        )
        kept = body[1:] if has_doc else body
        if not kept:
            raise EditError(f"{edit.file}: {edit.where}: has no body to replace")
        start, end = kept[0].lineno - 1, node.end_lineno  # type: ignore[attr-defined]
        lines[start:end] = _indented(edit.text, _body_indent(node, lines))
    else:
        assert anchor is not None
        line, column = _find_anchor(source, lines, node, edit, anchor)
        if edit.action == REPLACE:
            text = lines[line]
            indent = text[: len(text) - len(text.lstrip())]
            replacement = (
                textwrap.dedent(edit.text).strip("\n").replace("\n", "\n" + indent)
            )
            joined = "".join(lines[line:])
            joined = joined[:column] + replacement + joined[column + len(anchor) :]
            rest = joined.splitlines(keepends=True)
            if not replacement and not rest[0].strip():
                rest = rest[1:]  # a deleted statement leaves no blank line
            lines[line:] = rest
        else:
            first, last, col = _insertion_span(
                _innermost_statement(node, line), line, column
            )
            new = _indented(edit.text, " " * col)
            if new[0].lstrip().startswith(("class ", "def ", "@")):
                # PEP 8 spacing around a definition: two lines at module
                # level, one inside a class.
                gap = ["\n"] * (2 if col == 0 else 1)
                new = gap + new if edit.action == INSERT_AFTER else new + gap
            before = edit.action == INSERT_BEFORE
            at = first - 1 if before else last
            lines[at:at] = new  # type: ignore[misc]
    edited = "".join(lines)
    try:
        ast.parse(edited)
    except SyntaxError as e:
        raise EditError(
            f"{edit.file}: {edit.where}: the edit leaves invalid Python ({e})"
        ) from e
    return edited


def apply_edits(
    read: Callable[[str], str], edits: Iterable[Edit], base: str
) -> dict[str, str]:
    """Every file the edits touch, edited, in the edits' order.

    ``read(path)`` returns the pristine upstream text of ``path``.
    """
    edited: dict[str, str] = {}
    for edit in edits:
        if not edit.applies_to(base):
            continue
        if edit.file not in edited:
            edited[edit.file] = read(edit.file)
        edited[edit.file] = apply_edit(edited[edit.file], edit, base)
    return edited
