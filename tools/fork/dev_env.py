# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Make the dev venv: the pinned vLLM, edited in place, the new modules live.

    python3 tools/fork/dev_env.py [--base 0.34.0]

The default base gets ``.venv``, another ``.venv-<version>``. A venv matching
the pin and dev requirements is reused, only its edited files rewritten, so a
changed edit applies in seconds; new modules and fork packages are symlinked.
A new one starts from the main job's venv of the base where there is one
(``.venv-wheel``, as hard links), so nothing is downloaded twice.
"""

import argparse
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.fork import common  # noqa: E402
from tools.fork.build_wheel import edited_upstream_files  # noqa: E402
from tools.fork.common import REPO, log  # noqa: E402

# What the last run edited: a file no edit touches any more gets its pristine text.
EDITED_LIST = ".fork-edited-files"


def link_fork(site: Path) -> list[Path]:
    """Symlink into ``site`` the topmost path of each new module that upstream
    lacks (so new files under it show at once) and the fork's own packages."""
    links: list[Path] = []

    def link(src: Path, dst: Path) -> bool:
        if dst.is_symlink():
            dst.unlink()
        elif dst.exists():
            return False
        dst.symlink_to(src, target_is_directory=src.is_dir())
        links.append(dst)
        return True

    def visit(src_dir: Path, dst_dir: Path) -> None:
        for src in sorted(src_dir.iterdir()):
            dst = dst_dir / src.name
            if src.is_file() and not common.on_base(src.relative_to(REPO)):
                if dst.is_symlink():
                    dst.unlink()  # linked while the venv had another base
                continue
            if src.name == "__pycache__" or link(src, dst):
                continue
            if not (src.is_dir() and dst.is_dir()):
                raise SystemExit(
                    f"{src.relative_to(REPO)} would replace upstream "
                    f"{dst}; change upstream files through tools/fork/edits.py instead."
                )
            visit(src, dst)

    visit(common.NEW_MODULES, site / "vllm")
    for src in common.FORK_PACKAGES:
        if not link(src, dst := site / src.name):
            raise SystemExit(f"{dst} exists and is not the fork's link to {src}")
    return links


def _replace(path: Path, data: bytes) -> None:
    """A new file at ``path``: the old one may be a hard link into another venv."""
    path.unlink(missing_ok=True)
    path.write_bytes(data)


def apply_edits_in_place(site: Path, wheel: Path, venv: Path) -> list[str]:
    """Write the edited files into ``site``; restore those no edit changes now."""
    edited, listing = edited_upstream_files(wheel), venv / EDITED_LIST
    before = listing.read_text().split() if listing.exists() else []
    with zipfile.ZipFile(wheel) as src:
        for path in sorted(set(before) - set(edited)):
            _replace(site / path, src.read(path))
    for path, data in edited.items():
        _replace(site / path, data)
    # The installed vLLM requires what the fork wheel requires (the pin's
    # FlashInfer), so pip and the GPU-host bundle see the fork's metadata.
    (metadata,) = site.glob(f"vllm-{common.load_pin().VLLM_VERSION}.dist-info/METADATA")
    _replace(metadata, common.fork_metadata(metadata.read_text()).encode())
    listing.write_text("\n".join(sorted(edited)) + "\n")
    return sorted(edited)


def make(venv: Path) -> None:
    pin, wheel = common.load_pin(), common.upstream_wheel()
    python = common.venv_python(venv)
    # What decides the venv's contents (the new modules are linked, not in it).
    inputs = (common.PIN_FILE, common.DEV_REQUIREMENTS, REPO / "pyproject.toml")
    data = pin.VLLM_VERSION.encode() + b"".join(p.read_bytes() for p in inputs)
    stamp, stamp_file = hashlib.sha256(data).hexdigest(), venv / ".fork-stamp"
    if python.exists() and stamp_file.is_file() and stamp_file.read_text() == stamp:
        log(f"reusing {os.path.relpath(venv, REPO)} (pin and requirements unchanged)")
    else:
        (venv / EDITED_LIST).unlink(missing_ok=True)
        # The main job's venv of this base holds the same pinned packages:
        # start from its files rather than download them again. pip then
        # swaps the fork wheel's vLLM for upstream's and adds the dev tools.
        wheel_venv = common.venv_dir(".venv-wheel")
        if (wheel_venv / common.WHEEL_VENV_STAMP).is_file():
            common.clone_venv(wheel_venv, venv)
            (venv / common.WHEEL_VENV_STAMP).unlink()
        common.provision_venv(venv, wheel, ("-r", common.DEV_REQUIREMENTS))
        stamp_file.write_text(stamp)
    query = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(subprocess.check_output([python, "-c", query], text=True).strip())
    edited, links = apply_edits_in_place(site, wheel, venv), link_fork(site)
    log(
        f"vLLM {pin.VLLM_VERSION} edited in place ({len(edited)} files), "
        f"new modules linked ({len(links)} paths); "
        f"activate with: source {os.path.relpath(venv, REPO)}/bin/activate"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_base_argument(parser)
    common.select_base(parser.parse_args().base)
    make(common.venv_dir(".venv"))


if __name__ == "__main__":
    main()
