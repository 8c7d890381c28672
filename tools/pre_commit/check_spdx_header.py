# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Fail when a source file does not start with vLLM's two SPDX lines.

    python tools/pre_commit/check_spdx_header.py FILE...

A shebang line may come first.
"""

import sys

HEADER = (
    "# SPDX-License-Identifier: Apache-2.0",
    "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project",
)


def has_header(path: str) -> bool:
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f.readlines()[:3]]
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    return tuple(lines[:2]) == HEADER


def main(paths: list[str]) -> int:
    missing = [p for p in paths if not has_header(p)]
    for path in missing:
        print(f"{path}: missing SPDX header; start the file with:")
        print("\n".join(HEADER))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
