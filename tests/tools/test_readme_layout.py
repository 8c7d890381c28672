# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The README's layout table names every tool under tools/fork/ with the job
its docstring states, and each command says the same in its ``--help``."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS = sorted(
    p for p in (REPO / "tools" / "fork").glob("*.py") if p.stem != "__init__"
)


def _layout_rows() -> dict[str, str]:
    text = (REPO / "README.md").read_text()
    table = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `([^`]+)` \| (.+) \|$", table, flags=re.M))


def _summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc, f"{path.name} has no docstring"
    return doc.split("\n", 1)[0]


def _has_cli(path: Path) -> bool:
    return "argparse.ArgumentParser(" in path.read_text()


def test_every_tool_has_one_row_with_its_summary() -> None:
    rows = _layout_rows()
    for path in TOOLS:
        rel = path.relative_to(REPO).as_posix()
        assert rows.get(rel) == _summary(path), rel
    listed = {r for r in rows if r.startswith("tools/fork/") and r.endswith(".py")}
    assert listed == {p.relative_to(REPO).as_posix() for p in TOOLS}


@pytest.mark.parametrize(
    "path", [p for p in TOOLS if _has_cli(p)], ids=lambda p: p.stem
)
def test_help_says_what_the_table_says(path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", f"tools.fork.{path.stem}", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert _summary(path) in " ".join(out.stdout.split()), out.stdout
