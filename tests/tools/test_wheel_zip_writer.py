# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The fork wheel's zip writer copies stored entries unchanged and writes new
ones that each Python vLLM supports reads back, checked by that Python's own
zipfile."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYTHONS = ("3.10", "3.11", "3.12", "3.13")

# Runs under the Python being checked: a source zip made by its zipfile, then
# copied and extended by the writer, then read back by its zipfile.
SCRIPT = r"""
import io, json, sys, zipfile
sys.path.insert(0, sys.argv[1])
from tools.fork.build_wheel import _copied, _deflated, stored_entries, write_zip
from pathlib import Path
tmp = Path(sys.argv[2])
members = {
    "pkg/__init__.py": (b"x = 1\n" * 500, zipfile.ZIP_DEFLATED, 0o644),
    "pkg/_ext.abi3.so": (bytes(range(256)) * 40, zipfile.ZIP_STORED, 0o755),
    "pkg/d\u00e4ta.txt": ("\u00e4\n".encode() * 10, zipfile.ZIP_DEFLATED, 0o644),
}
src = tmp / "src.zip"
with zipfile.ZipFile(src, "w") as zf:
    for name, (data, method, mode) in members.items():
        info = zipfile.ZipInfo(name, (2024, 5, 6, 7, 8, 10))
        info.compress_type, info.external_attr = method, mode << 16
        zf.writestr(info, data)
out = tmp / "out.zip"
added = {"pkg/new.py": b"y = 2\n" * 300}
with out.open("wb") as f:
    write_zip(f, [*(_copied(i, s) for i, s in stored_entries(src)),
                  *(_deflated(n, d) for n, d in added.items())])
source_stored = {i.filename: s for i, s in stored_entries(src)}
with zipfile.ZipFile(out) as zf:
    result = {
        "testzip": zf.testzip(),
        "names": zf.namelist(),
        "contents": all(zf.read(n) == d for n, (d, _, _) in members.items())
        and all(zf.read(n) == d for n, d in added.items()),
        "modes": {i.filename: i.external_attr >> 16 for i in zf.infolist()},
        "times": {i.filename: list(i.date_time) for i in zf.infolist()},
    }
result["stored_unchanged"] = all(
    source_stored[i.filename] == s
    for i, s in stored_entries(out) if i.filename in members
)
print(json.dumps(result))
"""


def _interpreter(version: str) -> str | None:
    """An installed CPython ``version`` (pyenv's shims answer only for the
    selected one, so its versions are looked up directly)."""
    for path in sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python3")):
        return str(path)
    found = shutil.which(f"python{version}")
    ok = (
        found and subprocess.run([found, "-c", ""], capture_output=True).returncode == 0
    )
    return found if ok else None


@pytest.mark.parametrize("version", PYTHONS)
def test_the_writer_on_each_python(version: str, tmp_path: Path) -> None:
    python = _interpreter(version)
    if python is None:
        pytest.skip(f"no python{version} on this machine")
    out = subprocess.run(
        [python, "-c", SCRIPT, REPO, tmp_path], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["testzip"] is None
    assert result["names"] == [
        "pkg/__init__.py",
        "pkg/_ext.abi3.so",
        "pkg/d\u00e4ta.txt",
        "pkg/new.py",
    ]
    assert result["contents"] and result["stored_unchanged"]
    assert result["modes"] == {
        "pkg/__init__.py": 0o644,
        "pkg/_ext.abi3.so": 0o755,
        "pkg/d\u00e4ta.txt": 0o644,
        "pkg/new.py": 0o644,
    }
    # DOS times keep even seconds; the new entry gets the fixed timestamp.
    assert result["times"]["pkg/__init__.py"] == [2024, 5, 6, 7, 8, 10]
    assert result["times"]["pkg/new.py"] == [2026, 1, 1, 0, 0, 0]
