# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The engine bundle's parts travel one per device call and the receiver
(run as the GPU host runs it, a subprocess) puts them back together: parts in
any order, a chain broken by a fresh machine, a corrupt part and a new bundle
over an old one."""

import hashlib
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.fork.engine_bundle import MANIFEST, write_bundle

REPO = Path(__file__).resolve().parents[2]
RECEIVE = REPO / "tools" / "fork" / "engine_bundle_receive.py"
WAITING = 3


def _members(seed: int) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {
        "payload/p.tar.gz": rng.randbytes(300_000),
        "compiled/vllm/_C.abi3.so.xz": rng.randbytes(123_457),
        "wheels/a-1.0-py3-none-any.whl": rng.randbytes(70_001),
        "bundle-contents.json": json.dumps({"seed": seed}).encode(),
    }


def _bundle(tmp_path: Path, seed: int) -> tuple[Path, dict, dict[str, bytes]]:
    out = tmp_path / f"bundle-{seed}"
    out.mkdir()
    files = _members(seed)
    manifest = write_bundle(out, {"seed": seed}, iter(files.items()), 200_000)
    return out, manifest, files


def _receive(parts: Path, state: Path, *names: str) -> subprocess.CompletedProcess:
    """One device call that carries ``bundle.json`` and the parts ``names``."""
    carried = parts.parent / "carried"
    shutil.rmtree(carried, ignore_errors=True)
    carried.mkdir()
    for name in (MANIFEST, *names):
        shutil.copyfile(parts / name, carried / name)
    return subprocess.run(
        [sys.executable, RECEIVE, carried, "--state", state, "--unpack-only"],
        capture_output=True,
        text=True,
    )


def test_parts_cover_the_bundle_within_the_size(tmp_path: Path) -> None:
    out, manifest, _ = _bundle(tmp_path, seed=1)
    parts = [out / p["file"] for p in manifest["parts"]]
    assert len(parts) == 3  # 490 kB of members plus tar headers, 200 kB parts
    assert all(p.stat().st_size <= 200_000 for p in parts)
    whole = b"".join(p.read_bytes() for p in parts)
    assert hashlib.sha256(whole).hexdigest() == manifest["sha256"]
    assert len(whole) == manifest["bytes"]


def test_receiver_joins_parts_sent_out_of_order(tmp_path: Path) -> None:
    out, manifest, files = _bundle(tmp_path, seed=2)
    state = tmp_path / "state"
    first = _receive(out, state, "part-02")
    assert first.returncode == WAITING, first.stderr
    assert "send next: part-00, part-01" in first.stderr
    second = _receive(out, state, "part-00")
    assert second.returncode == WAITING
    assert "send next: part-01" in second.stderr
    last = _receive(out, state, "part-01")
    assert last.returncode == 0, last.stderr
    for name, data in files.items():
        assert (state / "unpacked" / name).read_bytes() == data


def test_a_fresh_machine_asks_for_the_lost_parts(tmp_path: Path) -> None:
    out, _, _ = _bundle(tmp_path, seed=3)
    state = tmp_path / "state"
    assert _receive(out, state, "part-00").returncode == WAITING
    shutil.rmtree(state)  # the machine was given back between calls
    again = _receive(out, state, "part-01")
    assert again.returncode == WAITING
    assert "holding 1 of 3 parts; send next: part-00, part-02" in again.stderr


def test_a_corrupt_part_is_refused(tmp_path: Path) -> None:
    out, _, _ = _bundle(tmp_path, seed=4)
    data = bytearray((out / "part-01").read_bytes())
    data[1000] ^= 0xFF
    (out / "part-01").write_bytes(bytes(data))
    result = _receive(out, tmp_path / "state", "part-01")
    assert result.returncode == 1
    assert "part-01 does not match bundle.json" in result.stderr
    assert not (tmp_path / "state" / "part-01").exists()


def test_a_new_bundle_starts_over(tmp_path: Path) -> None:
    old, _, _ = _bundle(tmp_path, seed=5)
    new, _, files = _bundle(tmp_path, seed=6)
    state = tmp_path / "state"
    assert _receive(old, state, "part-00", "part-01").returncode == WAITING
    result = _receive(new, state, "part-00", "part-01", "part-02")
    assert result.returncode == 0, result.stderr
    assert "holds another bundle: starting over" in result.stderr
    contents = json.loads((state / "unpacked" / "bundle-contents.json").read_text())
    assert contents == {"seed": 6}
    assert (state / "unpacked" / "payload/p.tar.gz").read_bytes() == files[
        "payload/p.tar.gz"
    ]


@pytest.mark.parametrize("part_bytes", [0, -1])
def test_the_builder_refuses_empty_parts(tmp_path: Path, part_bytes: int) -> None:
    result = subprocess.run(
        [sys.executable, REPO / "tools/fork/engine_bundle.py", "--part-mib",
         str(part_bytes)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--part-mib must be at least 1" in result.stderr
