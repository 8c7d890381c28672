# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The set-up scripts retry a failed pip and, when it keeps failing, say why.

A stand-in interpreter plays pip: it fails a chosen number of times, printing
warnings and an error the way pip does, and records every call it gets.
"""

import os
import stat
from pathlib import Path

import pytest

from tools.fork import common

FAKE_PIP = """#!/bin/sh
calls="$(dirname "$0")/calls"
echo "$@" >> "$calls"
n=$(wc -l < "$calls")
if [ "$n" -le {failures} ]; then
  echo "Collecting something"
  echo "WARNING: Location 'file:///nowhere' is ignored" >&2
  echo "ERROR: attempt $n could not fetch a wheel" >&2
  exit 3
fi
echo "Successfully installed something"
"""


def fake_python(tmp_path: Path, failures: int) -> Path:
    python = tmp_path / "python"
    python.write_text(FAKE_PIP.format(failures=failures))
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return python


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls").read_text().splitlines()


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch):
    monkeypatch.setattr(common, "PIP_RETRY_WAITS_S", (0, 0))


def test_a_pip_that_fails_twice_is_retried_until_it_succeeds(tmp_path):
    python = fake_python(tmp_path, failures=2)
    common.run_pip(python, "install", "pkg==1", env=dict(os.environ))
    expected = "-m pip --disable-pip-version-check install pkg==1"
    assert calls(tmp_path) == [expected] * 3


def test_a_pip_that_keeps_failing_raises_with_its_last_error(tmp_path):
    python = fake_python(tmp_path, failures=99)
    with pytest.raises(RuntimeError) as info:
        common.run_pip(python, "install", "pkg==1", env=dict(os.environ))
    message = str(info.value)
    assert len(calls(tmp_path)) == 3
    first_line = message.splitlines()[0]
    assert "failed 3 times (exit 3): install pkg==1" in first_line
    assert "ERROR: attempt 3 could not fetch a wheel" in first_line
    # The last attempt's error is shown; pip's warnings are left out.
    assert "ERROR: attempt 3 could not fetch a wheel" in message
    assert "WARNING" not in message


def test_a_pip_that_succeeds_runs_once(tmp_path):
    python = fake_python(tmp_path, failures=0)
    common.run_pip(python, "uninstall", "-y", "x", env=dict(os.environ))
    assert len(calls(tmp_path)) == 1
