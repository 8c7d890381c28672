# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Make ``.venv``: the pinned upstream vLLM with the overlay live in it.

    python3 tools/fork/dev_env.py

The overlay is linked into the installed ``vllm`` package (the topmost path
that upstream lacks is symlinked, so edits and new files under it take effect
at once). A venv that already matches the pin and the dev requirements is
reused: the second run only re-checks the links.
"""

import hashlib
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.fork.common import (  # noqa: E402
    DEV_REQUIREMENTS,
    OVERLAY,
    PIN_FILE,
    REPO,
    log,
    provision_venv,
    run_pip,
    site_packages,
    upstream_wheel,
    venv_python,
)

VENV = REPO / ".venv"
STAMP = VENV / ".fork-stamp"


def _wanted_stamp() -> str:
    # What decides the venv's contents; the overlay itself is linked, not
    # installed, so it is not part of this.
    digest = hashlib.sha256()
    for path in (PIN_FILE, DEV_REQUIREMENTS, REPO / "pyproject.toml"):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def link_overlay(upstream_root: Path) -> list[Path]:
    """Symlink each overlay path that upstream lacks into ``upstream_root``.

    Raises if an overlay file would shadow an upstream file. Returns the links.
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
                    f"overlay {src.relative_to(REPO)} would replace upstream "
                    f"{dst}; the fork adds files and subclasses upstream instead."
                )

    visit(OVERLAY, upstream_root)
    # Links left by an earlier layout of the overlay.
    for dirpath, dirnames, filenames in os.walk(upstream_root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            if path.is_symlink() and not path.exists():
                path.unlink()
    return links


def main() -> None:
    stamp = _wanted_stamp()
    if venv_python(VENV).exists() and STAMP.exists() and STAMP.read_text() == stamp:
        log(f"reusing {VENV.relative_to(REPO)} (pin and requirements unchanged)")
    else:
        provision_venv(VENV, upstream_wheel(), ("-r", DEV_REQUIREMENTS))
        # The dev distribution carries only the vllm.general_plugins entry
        # point; vLLM's own plugin loader finds the fork through it.
        run_pip(
            venv_python(VENV), "install", "-q", "--no-deps", "--no-build-isolation",
            REPO, env=dict(os.environ),
        )  # fmt: skip
        STAMP.write_text(stamp)
    links = link_overlay(site_packages(VENV) / "vllm")
    log(
        f"overlay linked ({len(links)} paths); activate with: source .venv/bin/activate"
    )


if __name__ == "__main__":
    main()
