# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A dev venv made after the main job starts from the main job's venv of its
base as hard links: the clone runs as a venv of its own, takes no disk, and
leaves the venv it came from as it was."""

import subprocess
import sys
from pathlib import Path

from tools.fork import common, dev_env

SITE = "import sysconfig; print(sysconfig.get_path('purelib'))"


def _venv_with_a_package(venv: Path) -> tuple[Path, Path]:
    """A bare venv holding module ``probe`` and a script that runs it; returns
    (its site-packages, the script)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.check_output([python, "-c", SITE], text=True).strip())
    (site / "probe.py").write_text("VALUE = 'from the package'\n")
    script = venv / "bin" / "probe"
    # As pip writes a console script: the venv's own interpreter by path.
    body = "import sys, probe\nprint(sys.prefix, probe.VALUE)\n"
    script.write_text(f"#!{python}\n{body}")
    script.chmod(0o755)
    return site, script


def _files(venv: Path) -> dict[Path, bytes]:
    return {
        p.relative_to(venv): p.read_bytes()
        for p in venv.rglob("*")
        if p.is_file() and not p.is_symlink()
    }


def test_a_clone_is_a_venv_of_its_own_and_its_source_is_unchanged(tmp_path):
    source, clone = tmp_path / "source", tmp_path / "clone"
    site, _ = _venv_with_a_package(source)
    before = _files(source)

    common.clone_venv(source, clone)

    # Its script runs its own interpreter, which imports the cloned package.
    ran = subprocess.run([clone / "bin" / "probe"], capture_output=True, text=True)
    assert ran.stdout.split(" ", 1) == [str(clone), "from the package\n"], ran.stderr
    assert f'VIRTUAL_ENV="{clone}"' in (clone / "bin" / "activate").read_text()
    # The package is the source's file, not a copy.
    cloned_site = Path(site.as_posix().replace(str(source), str(clone)))
    assert (cloned_site / "probe.py").samefile(site / "probe.py")
    # Nothing of the source was written through the links.
    assert _files(source) == before
    ran = subprocess.run([source / "bin" / "probe"], capture_output=True, text=True)
    assert ran.stdout.split(" ", 1)[0] == str(source)


def test_a_new_dev_venv_starts_from_the_main_jobs_venv(tmp_path, monkeypatch):
    """dev_env.make clones the base's ``.venv-wheel`` once the main job has
    finished it (its stamp is written), then has pip complete the clone."""
    wheel_venv, dev = tmp_path / ".venv-wheel", tmp_path / ".venv"
    site, _ = _venv_with_a_package(wheel_venv)
    (wheel_venv / common.WHEEL_VENV_STAMP).write_text("sha256 of the fork wheel")
    completed = []
    monkeypatch.setattr(common, "venv_dir", lambda name: tmp_path / name)
    monkeypatch.setattr(common, "provision_venv", lambda v, *a: completed.append(v))
    monkeypatch.setattr(dev_env, "apply_edits_in_place", lambda *a: [])
    monkeypatch.setattr(dev_env, "link_fork", lambda site: [])

    dev_env.make(dev)

    assert completed == [dev]
    dev_site = Path(site.as_posix().replace(str(wheel_venv), str(dev)))
    assert (dev_site / "probe.py").samefile(site / "probe.py")
    assert not (dev / common.WHEEL_VENV_STAMP).exists()
    assert (wheel_venv / common.WHEEL_VENV_STAMP).exists()


def test_an_unfinished_main_job_venv_is_not_cloned(tmp_path, monkeypatch):
    """Without the stamp the main job's venv may be half installed: the dev
    venv is made from the package index instead."""
    wheel_venv, dev = tmp_path / ".venv-wheel", tmp_path / ".venv"
    _venv_with_a_package(wheel_venv)

    def provision(venv, *args):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv])

    monkeypatch.setattr(common, "venv_dir", lambda name: tmp_path / name)
    monkeypatch.setattr(common, "provision_venv", provision)
    monkeypatch.setattr(dev_env, "apply_edits_in_place", lambda *a: [])
    monkeypatch.setattr(dev_env, "link_fork", lambda site: [])

    dev_env.make(dev)

    python = dev / "bin" / "python"
    dev_site = Path(subprocess.check_output([python, "-c", SITE], text=True).strip())
    assert not (dev_site / "probe.py").exists()
