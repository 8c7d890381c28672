# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""mypy on every file the series touches: the edits add no error to an
upstream file (compared with the pristine file, messages without line
numbers) and the new modules have none."""

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tools.fork.build_wheel import fork_files
from tools.fork.patch_series import _concern_of

# mypy's own line format: "path:line: error: message  [code]".
ERROR = re.compile(r"^(?P<path>[^:]+):\d+: error: (?P<message>.*)$")


def _mypy_errors(tree: Path, paths: list[str]) -> set[tuple[str, str]]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--follow-imports=skip",
            "--ignore-missing-imports",
            "--python-version=3.10",
            "--no-incremental",
            *paths,
        ],
        cwd=tree,
        capture_output=True,
        text=True,
    )
    assert result.returncode in (0, 1), result.stdout + result.stderr
    return {
        (m["path"], m["message"])
        for line in result.stdout.splitlines()
        if (m := ERROR.match(line))
    }


def _write(tree: Path, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_bytes(data)


@pytest.mark.slow
def test_the_series_adds_no_mypy_error(upstream_wheel_path, tmp_path):
    edited, new = fork_files(upstream_wheel_path)
    # The series' new modules (not the fork's own report or old import path).
    new = {
        p: data
        for p, data in new.items()
        if p.endswith(".py") and _concern_of(p) is not None
    }
    assert new, "the series adds modules"
    with zipfile.ZipFile(upstream_wheel_path) as zf:
        pristine = {p: zf.read(p) for p in edited}
    _write(tmp_path / "pristine", pristine)
    _write(tmp_path / "edited", {**edited, **new})
    before = _mypy_errors(tmp_path / "pristine", sorted(pristine))
    after = _mypy_errors(tmp_path / "edited", sorted(edited) + sorted(new))
    print(f"pristine: {len(before)} errors; edited and new: {len(after)}")
    assert after - before == set()
    # The check is live: a typed mistake in a new module is an error.
    broken = {**new, next(iter(new)): b"def f() -> int:\n    return 'a'\n"}
    _write(tmp_path / "broken", broken)
    assert _mypy_errors(tmp_path / "broken", sorted(broken))
