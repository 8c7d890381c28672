# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Make ``.venv``: the pinned upstream vLLM, edited in place, with the fork's
new modules live in it.

    python3 tools/fork/dev_env.py [--base 0.33.0]

The default base gets ``.venv``, another base ``.venv-<version>``.

The upstream files the edit list changes are rewritten in the installed
``vllm`` package from the pinned wheel's pristine copies, so running this
again is how a changed edit takes effect (seconds). The fork's new modules
are symlinked (the topmost path upstream lacks), and so are the fork's own
packages beside ``vllm`` (the plan report), so changes to them and new
files under a linked folder take effect at once. A venv that already matches
the pin and the dev requirements is reused.
"""

import argparse
import hashlib
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.fork.common import (  # noqa: E402
    DEV_REQUIREMENTS,
    FORK_PACKAGES,
    NEW_MODULES,
    PIN_FILE,
    REPO,
    add_base_argument,
    load_pin,
    log,
    provision_venv,
    run_pip,
    select_base,
    site_packages,
    upstream_wheel,
    venv_dir,
    venv_python,
)

STAMP = ".fork-stamp"
# The upstream files the last run edited, so that a file no edit touches any
# more gets its pristine text back.
EDITED_LIST = ".fork-edited-files"
# The development distribution earlier layouts installed (it declared a
# plugin entry point that no longer exists).
OLD_DEV_DISTRIBUTION = "vllm-dsv41-blackwell-overlay"


def _wanted_stamp() -> str:
    # What decides the venv's contents; the new modules are linked, not
    # installed, so it is not part of this.
    digest = hashlib.sha256(load_pin().VLLM_VERSION.encode())
    for path in (PIN_FILE, DEV_REQUIREMENTS, REPO / "pyproject.toml"):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def link_new_modules(upstream_root: Path) -> list[Path]:
    """Symlink each new-module path that upstream lacks into ``upstream_root``.

    Raises if a new module would shadow an upstream file (upstream files
    change only through the edit list). Returns the links.
    """
    links: list[Path] = []

    def visit(src_dir: Path, dst_dir: Path) -> None:
        for src in sorted(src_dir.iterdir()):
            if src.name == "__pycache__":
                continue
            dst = dst_dir / src.name
            if dst.is_symlink():
                dst.unlink()
            if not dst.exists():
                dst.symlink_to(src, target_is_directory=src.is_dir())
                links.append(dst)
            elif src.is_dir() and dst.is_dir():
                visit(src, dst)
            else:
                raise SystemExit(
                    f"{src.relative_to(REPO)} would replace upstream "
                    f"{dst}; change upstream files through tools/fork/edits.py instead."
                )

    visit(NEW_MODULES, upstream_root)
    # Links left by an earlier layout of the new modules.
    for dirpath, dirnames, filenames in os.walk(upstream_root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            if path.is_symlink() and not path.exists():
                path.unlink()
    return links


def link_fork_packages(site: Path) -> list[Path]:
    """Symlink each of the fork's own top-level packages into ``site``
    (site-packages), so they import from any folder. Returns the links."""
    links = []
    for src in FORK_PACKAGES:
        dst = site / src.name
        if dst.is_symlink():
            dst.unlink()
        if dst.exists():
            raise SystemExit(f"{dst} exists and is not the fork's link to {src}")
        dst.symlink_to(src, target_is_directory=True)
        links.append(dst)
    return links


def apply_edits_in_place(upstream_root: Path, wheel: Path, venv: Path) -> list[str]:
    """Write the edited upstream files into the installed package; restore
    the pristine text of files an earlier edit list changed. Returns the
    edited paths."""
    import zipfile

    from tools.fork.fork_tree import edited_upstream_files

    edited = edited_upstream_files(wheel)
    listing = venv / EDITED_LIST
    before = listing.read_text().split() if listing.exists() else []
    site = upstream_root.parent
    with zipfile.ZipFile(wheel) as src:
        for path in sorted(set(before) - set(edited)):
            (site / path).write_bytes(src.read(path))
    for path, data in edited.items():
        (site / path).write_bytes(data)
    listing.write_text("\n".join(sorted(edited)) + "\n")
    return sorted(edited)


def make(venv: Path) -> None:
    stamp = _wanted_stamp()
    wheel = upstream_wheel()
    stamp_file = venv / STAMP
    if venv_python(venv).exists() and stamp_file.exists():
        current = stamp_file.read_text() == stamp
    else:
        current = False
    if current:
        log(f"reusing {venv.relative_to(REPO)} (pin and requirements unchanged)")
    else:
        (venv / EDITED_LIST).unlink(missing_ok=True)
        provision_venv(venv, wheel, ("-r", DEV_REQUIREMENTS))
        run_pip(
            venv_python(venv), "uninstall", "-q", "-y", OLD_DEV_DISTRIBUTION,
            env=dict(os.environ),
        )  # fmt: skip
        stamp_file.write_text(stamp)
    upstream_root = site_packages(venv) / "vllm"
    edited = apply_edits_in_place(upstream_root, wheel, venv)
    links = link_new_modules(upstream_root)
    links += link_fork_packages(upstream_root.parent)
    log(
        f"vLLM {load_pin().VLLM_VERSION} edited in place ({len(edited)} files), "
        f"new modules linked ({len(links)} paths); "
        f"activate with: source {venv.relative_to(REPO)}/bin/activate"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_base_argument(parser)
    select_base(parser.parse_args().base)
    make(venv_dir(".venv"))


if __name__ == "__main__":
    main()
