# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The fork wheel is upstream's wheel edited in place plus the new modules,
and a fresh interpreter of it is the fork."""

import base64
import csv
import hashlib
import io
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from tools.fork import build_wheel
from tools.fork.build_wheel import edited_upstream_files
from tools.fork.common import (
    REPO,
    clone_venv,
    fork_package_files,
    load_pin,
    new_module_files,
    venv_dir,
)
from tools.fork.edits import EDITS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fork_wheel():
    return build_wheel.build(REPO / "dist")


def _entries(path) -> dict[str, zipfile.ZipInfo]:
    with zipfile.ZipFile(path) as zf:
        return {i.filename: i for i in zf.infolist()}


def test_name_and_version(fork_wheel):
    pin = load_pin()
    assert fork_wheel.name.startswith(
        f"vllm-{pin.VLLM_VERSION}+{pin.LOCAL_VERSION_TAG}-"
    )
    with zipfile.ZipFile(fork_wheel) as zf:
        metadata = zf.read(
            f"vllm-{pin.VLLM_VERSION}+{pin.LOCAL_VERSION_TAG}.dist-info/METADATA"
        ).decode()
    assert f"\nVersion: {pin.VLLM_VERSION}+{pin.LOCAL_VERSION_TAG}\n" in metadata


def test_upstream_files_are_byte_identical_but_the_edited_ones(
    fork_wheel, upstream_wheel_path
):
    pin = load_pin()
    upstream_info = f"vllm-{pin.VLLM_VERSION}.dist-info/"
    edited = edited_upstream_files(upstream_wheel_path)
    # Every file an edit of this base names, and nothing else, is edited.
    assert set(edited) == {e.file for e in EDITS if e.applies_to(pin.VLLM_VERSION)}
    ours = _entries(fork_wheel)
    with zipfile.ZipFile(upstream_wheel_path) as up, zipfile.ZipFile(fork_wheel) as fw:
        for info in up.infolist():
            if info.filename.startswith(upstream_info):
                continue
            assert info.filename in ours, info.filename
            if info.filename in edited:
                assert fw.read(info.filename) == edited[info.filename]
                assert fw.read(info.filename) != up.read(info.filename)
                continue
            # Stream both and compare digests; the compiled parts are ~770 MB.
            digests = []
            for zf in (up, fw):
                h = hashlib.sha256()
                with zf.open(info.filename) as f:
                    for chunk in iter(lambda f=f: f.read(1 << 20), b""):
                        h.update(chunk)
                digests.append(h.digest())
            assert digests[0] == digests[1], info.filename
        assert fw.testzip() is None


def test_new_modules_and_upstreams_entry_points(fork_wheel, upstream_wheel_path):
    pin = load_pin()
    ours = f"vllm-{pin.VLLM_VERSION}+{pin.LOCAL_VERSION_TAG}.dist-info/"
    theirs = f"vllm-{pin.VLLM_VERSION}.dist-info/"
    with zipfile.ZipFile(fork_wheel) as zf, zipfile.ZipFile(upstream_wheel_path) as up:
        for path in new_module_files():
            assert zf.read(str(path)) == (REPO / path).read_bytes(), path
        # The plan report's own package beside vllm, its default config in it.
        names = set(zf.namelist())
        packaged = [str(p) for p in fork_package_files()]
        assert "vllm_dsv41_plan/__main__.py" in packaged
        assert "vllm_dsv41_plan/configs/dsv41_small.json" in packaged
        for path in packaged:
            assert zf.read(path) == (REPO / path).read_bytes(), path
        assert not any(n.startswith("vllm/") and "plan_report" in n for n in names)
        top_level = zf.read(ours + "top_level.txt").decode().split()
        assert top_level == ["vllm", "vllm_dsv41_plan"]
        # No plugin: the entry points are upstream's, byte for byte.
        assert zf.read(ours + "entry_points.txt") == up.read(
            theirs + "entry_points.txt"
        )


def test_pip_wheel_builds_the_same_bytes(fork_wheel, tmp_path):
    # No cache: pip would keep each run's wheel (330 MB) in the user's cache.
    pip_wheel = ["pip", "wheel", "--no-deps", "--no-cache-dir", "-q", "-w", tmp_path]
    result = subprocess.run(
        [sys.executable, "-m", *pip_wheel, REPO],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (built,) = tmp_path.glob("*.whl")
    assert built.name == fork_wheel.name
    assert built.read_bytes() == fork_wheel.read_bytes()


def test_record_matches_contents(fork_wheel):
    pin = load_pin()
    record_name = f"vllm-{pin.VLLM_VERSION}+{pin.LOCAL_VERSION_TAG}.dist-info/RECORD"
    with zipfile.ZipFile(fork_wheel) as zf:
        rows = list(csv.reader(io.StringIO(zf.read(record_name).decode())))
        listed = {row[0] for row in rows}
        assert listed == set(zf.namelist())
        # Check the rows of every small file (the large ones are covered by
        # the byte-identity test against upstream's own RECORD).
        for name, digest, size in rows:
            if name == record_name or int(size) > 1 << 20:
                continue
            data = zf.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
            assert digest == "sha256=" + expected.rstrip(b"=").decode(), name
            assert int(size) == len(data), name


@pytest.fixture(scope="module")
def fork_venv(fork_wheel):
    """A venv holding the fork wheel, installed by pip, beside the dev venv's
    other packages.

    The dev venv (the one running these tests) is cloned as hard links, which
    takes no disk, its vLLM is removed, and pip installs the fork wheel with
    no dependencies and no index. Resolving the wheel's dependencies from the
    package index is the main job's part (``tools/fork/main_job.py``); a
    full install per base here would take more disk than CI has. One install
    serves the module's tests; each base has its own, so the bases' suites can
    run side by side.
    """
    venv = venv_dir(".venv-wheel-test")
    clone_venv(Path(sys.prefix), venv)
    try:
        python = venv / "bin" / "python"
        # pip removes what vLLM's RECORD lists by unlinking it, so the dev
        # venv's copies stay; what is left is the dev venv's links to the
        # checkout's new modules, which rmtree unlinks without following.
        pip = [python, "-m", "pip", "--disable-pip-version-check", "-q"]
        subprocess.run([*pip, "uninstall", "-y", "vllm"], check=True)
        query = "import sysconfig; print(sysconfig.get_path('purelib'))"
        site = subprocess.run(
            [python, "-c", query], check=True, capture_output=True, text=True
        ).stdout.strip()
        shutil.rmtree(Path(site) / "vllm", ignore_errors=True)
        # The dev venv's link to the checkout's plan report package: pip must
        # install the wheel's copy, not write through the link.
        for package in fork_package_files():
            (Path(site) / package.parts[0]).unlink(missing_ok=True)
        install = [*pip, "install", "--no-deps", "--no-index", fork_wheel]
        subprocess.run(install, check=True)
        yield python
    finally:
        shutil.rmtree(venv, ignore_errors=True)


def test_installed_wheel_is_the_fork_with_no_plugin(fork_venv):
    with tempfile.TemporaryDirectory() as cwd:
        result = subprocess.run(
            [fork_venv, REPO / "tools" / "fork" / "smoke.py"],
            cwd=cwd,
            capture_output=True,
            text=True,
        )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the fork's classes load with no plugin" in result.stdout


def test_installed_wheel_runs_the_plan_report(fork_venv):
    """``python -m vllm_dsv41_plan`` from the installed wheel, outside the
    checkout, with the default config it ships."""
    with tempfile.TemporaryDirectory() as cwd:
        result = subprocess.run(
            [fork_venv, "-m", "vllm_dsv41_plan", "plan", "--capability", "12.0"],
            cwd=cwd,
            capture_output=True,
            text=True,
        )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "status: served" in result.stdout


def test_aarch64_wheel_carries_the_same_fork(fork_wheel):
    """The aarch64 wheel (GB200, GB10): upstream's aarch64 entries with the
    same edited files and new modules as the x86_64 wheel."""
    from tools.fork.common import upstream_wheel

    arm = build_wheel.build(REPO / "dist", "aarch64")
    assert arm.name.endswith("_aarch64.whl") and "+dsv41sm12x-" in arm.name
    edited = edited_upstream_files(upstream_wheel("aarch64"))
    with zipfile.ZipFile(arm) as a, zipfile.ZipFile(fork_wheel) as x:
        for name, data in edited.items():
            assert a.read(name) == data == x.read(name), name
        for path in new_module_files():
            assert a.read(str(path)) == (REPO / path).read_bytes(), path
        # Its compiled parts are upstream's aarch64 ones, not the x86_64 ones.
        compiled = [i for i in a.infolist() if i.filename.endswith(".so")]
        assert compiled
        x86 = {i.filename: i.CRC for i in x.infolist()}
        assert all(x86.get(i.filename) != i.CRC for i in compiled)


def test_unwritable_output_folder_is_one_clear_error(tmp_path):
    # A folder under a file cannot be made, by root either.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / "dist"
    result = subprocess.run(
        [sys.executable, REPO / "tools" / "fork" / "build_wheel.py", "--out", out],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"cannot write the fork wheel to {out}" in result.stderr
    assert "--out" in result.stderr


def test_a_failed_build_leaves_no_partial_wheel(tmp_path, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(build_wheel, "_write", full_disk)
    with pytest.raises(SystemExit, match="No space left on device"):
        build_wheel.build(tmp_path)
    assert list(tmp_path.iterdir()) == []
