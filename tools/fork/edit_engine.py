# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Apply declarative in-place edits to upstream Python sources.

An edit names a file, a scope (``Class.method``, a function, a class, or
``""`` for the module) and an anchor, the smallest text occurring exactly once
in that scope. Scopes are found by ``ast`` spans, not line numbers, so edits
survive unrelated upstream changes and fail loudly when their target moves or
becomes ambiguous. Edits hold only the fork's lines; the upstream text is read
from the pinned wheel at build time and never stored here.
"""

import ast
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

REPLACE = "replace"  # the anchor text becomes ``text``
# Before / after the anchor's statement, or its dict entry if it starts a key.
INSERT_BEFORE = "insert_before"
INSERT_AFTER = "insert_after"
ADD_TO_CLASS = "add_to_class"  # appended to the class body
REPLACE_BODY = "replace_body"  # the function body, docstring kept
# The anchor's innermost statement (a whole ``if`` block, say) becomes ``text``.
REPLACE_STATEMENT = "replace_statement"
ACTIONS = (
    REPLACE,
    INSERT_BEFORE,
    INSERT_AFTER,
    ADD_TO_CLASS,
    REPLACE_BODY,
    REPLACE_STATEMENT,
)


class EditError(RuntimeError):
    """An edit cannot be applied to this upstream file."""


@dataclass(frozen=True)
class Edit:
    """One in-place change of an upstream file; ``anchor`` may differ per base
    (a mapping), ``bases`` limits it to some, ``concern`` names its patch."""

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
        needs_anchor = self.action in (
            REPLACE,
            INSERT_BEFORE,
            INSERT_AFTER,
            REPLACE_STATEMENT,
        )
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
    node: ast.AST = tree
    for part in edit.scope.split(".") if edit.scope else ():
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


def _find_anchor(source: str, lines: list[str], node: ast.AST, edit: Edit, anchor: str):
    """0-based (line, column) of the only occurrence of ``anchor`` in ``node``,
    its decorators included; overlapping occurrences count."""
    first, end = 0, len(lines)
    if not isinstance(node, ast.Module):
        decorators = node.decorator_list  # type: ignore[attr-defined]
        first = min(d.lineno for d in [node, *decorators]) - 1
        end = node.end_lineno  # type: ignore[attr-defined]
    scope_text = "".join(lines[first:end])
    hits = [m.start() for m in re.finditer(f"(?={re.escape(anchor)})", scope_text)]
    if len(hits) != 1:
        found = "not found" if not hits else f"found {len(hits)} times"
        raise EditError(
            f"{edit.file}: {edit.where}: anchor {anchor!r} {found}; "
            "it must occur exactly once there"
        )
    at = len("".join(lines[:first])) + hits[0]
    return source.count("\n", 0, at), at - (source.rfind("\n", 0, at) + 1)


def _insertion_span(node: ast.AST, line: int, column: int) -> tuple[int, int, int]:
    """1-based first and last line and column of the dict entry whose key starts
    at the anchor (upstream's registries), else of its innermost statement."""
    holding = [
        child
        for child in ast.walk(node)
        if isinstance(child, ast.stmt)
        and child is not node
        and child.lineno - 1 <= line <= child.end_lineno - 1  # type: ignore[operator]
    ]
    if not holding:
        raise EditError(f"line {line + 1} is not inside a statement")
    stmt = min(holding, key=lambda s: s.end_lineno - s.lineno)  # type: ignore[operator]
    entries = (
        (key.lineno, value.end_lineno, key.col_offset)
        for d in ast.walk(stmt)
        if isinstance(d, ast.Dict)
        for key, value in zip(d.keys, d.values, strict=True)
        if key is not None and (key.lineno - 1, key.col_offset) == (line, column)
    )
    return next(entries, (stmt.lineno, stmt.end_lineno, stmt.col_offset))  # type: ignore[arg-type]


def _lead(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _indented(text: str, like: str) -> list[str]:
    """``text``'s lines, indented as the line ``like``."""
    body, indent = textwrap.dedent(text).strip("\n"), _lead(like)
    return [(indent + ln if ln.strip() else "") + "\n" for ln in body.split("\n")]


def apply_edit(source: str, edit: Edit, base: str) -> str:
    """``source`` with ``edit`` applied; raises EditError naming the target."""
    lines = source.splitlines(keepends=True)
    node = _scope_node(ast.parse(source), edit)
    if edit.action == ADD_TO_CLASS:
        if not isinstance(node, ast.ClassDef):
            raise EditError(f"{edit.file}: {edit.where}: is not a class")
        end = node.end_lineno  # type: ignore[attr-defined]
        lines[end:end] = ["\n", *_indented(edit.text, lines[node.body[0].lineno - 1])]
    elif edit.action == REPLACE_BODY:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            raise EditError(f"{edit.file}: {edit.where}: is not a function")
        has_doc = ast.get_docstring(node, clean=False) is not None
        kept = node.body[1:] if has_doc else node.body
        if not kept:
            raise EditError(f"{edit.file}: {edit.where}: has no body to replace")
        start, end = kept[0].lineno - 1, node.end_lineno  # type: ignore[attr-defined]
        lines[start:end] = _indented(edit.text, lines[node.body[0].lineno - 1])
    else:
        anchor = edit.anchor_for(base)
        assert anchor is not None
        line, column = _find_anchor(source, lines, node, edit, anchor)
        if edit.action == REPLACE:
            new = textwrap.dedent(edit.text).strip("\n")
            new = new.replace("\n", "\n" + _lead(lines[line]))
            joined = "".join(lines[line:])
            joined = joined[:column] + new + joined[column + len(anchor) :]
            rest = joined.splitlines(keepends=True)
            if not new and not rest[0].strip():
                rest = rest[1:]  # a deleted statement leaves no blank line
            lines[line:] = rest
        else:
            first, last, col = _insertion_span(node, line, column)
            new_lines = _indented(edit.text, " " * col) if edit.text.strip() else []
            if edit.action == REPLACE_STATEMENT:
                lines[first - 1 : last] = new_lines
                return _parsed("".join(lines), edit)
            if new_lines and new_lines[0].lstrip().startswith(("class ", "def ", "@")):
                # PEP 8 blank lines: two at module level, one in a class.
                gap = ["\n"] * (2 if col == 0 else 1)
                after = edit.action == INSERT_AFTER
                new_lines = gap + new_lines if after else new_lines + gap
            at = first - 1 if edit.action == INSERT_BEFORE else last
            lines[at:at] = new_lines
    return _parsed("".join(lines), edit)


def _parsed(edited: str, edit: Edit) -> str:
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
    """Every file the edits touch, edited in order from ``read(path)``."""
    edited: dict[str, str] = {}
    for edit in (e for e in edits if e.applies_to(base)):
        text = edited[edit.file] if edit.file in edited else read(edit.file)
        edited[edit.file] = apply_edit(text, edit, base)
    return edited
