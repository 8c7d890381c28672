# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The fork's files, keyed by their path in the wheel: upstream files with the
in-place edits applied, the new modules and the fork's own packages. The wheel
and the dev venv are both made from this one answer, so they cannot differ.
"""

import zipfile
from pathlib import Path

from tools.fork.common import REPO, fork_package_files, load_pin, log, new_module_files
from tools.fork.edit_engine import apply_edits
from tools.fork.edits import EDITS


def edited_upstream_files(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as src:
        names = set(src.namelist())

        def read(path: str) -> str:
            if path not in names:
                raise SystemExit(f"{path}: not in {wheel.name}; the edit list names it")
            return src.read(path).decode()

        edited = apply_edits(read, EDITS, load_pin().VLLM_VERSION)
    return {path: text.encode() for path, text in edited.items()}


def fork_files(wheel: Path) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(edited upstream files, new files); logs which upstream files change."""
    edited = edited_upstream_files(wheel)
    log(f"in-place edits: {len(EDITS)} edits in {len(edited)} upstream files")
    for path in sorted(edited):
        log(f"  edited {path}")
    paths = [*new_module_files(), *fork_package_files()]
    return edited, {str(p): (REPO / p).read_bytes() for p in paths}
