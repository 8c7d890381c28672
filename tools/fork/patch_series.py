# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Generate the upstream patch series: one ``git am``-able patch per concern.

The patches apply to a pristine vLLM tree taken from the pinned wheel.

    python3 tools/fork/patch_series.py [--out DIR] [--base 0.34.0]

Each patch adds its concern's edits (tools/fork/edits.py) and files
(tools/fork/series.toml) on top of the previous one, to the pinned wheel's
Python package; the diffs are made at build time, never committed.
"""

import argparse
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.fork.common import (  # noqa: E402
    REPO,
    add_base_argument,
    load_pin,
    log,
    select_base,
    upstream_wheel,
)
from tools.fork.edit_engine import apply_edits  # noqa: E402
from tools.fork.edits import CONCERNS, EDITS, PAGES  # noqa: E402
from tools.fork.module_stages import earlier_stage  # noqa: E402

_SERIES = tomllib.loads(Path(__file__).with_name("series.toml").read_text())
FORK_ONLY: tuple[str, ...] = tuple(_SERIES["fork_only"])


def _message(concern: str, flashinfer: str) -> tuple[str, str]:
    message = _SERIES["messages"][concern]
    body = message["body"].strip()
    if concern == PAGES:
        # FlashInfer's SM120 kernels take run-time pages from 0.7.1 on.
        numbers = [int(p) for p in flashinfer.split(".")[:3] if p.isdigit()]
        pages = "fixed" if numbers < [0, 7, 1] else "runtime"
        body += "\n\n" + message[f"{pages}_sm120_pages"].strip()
    return message["title"], body


def _concern_of(path: str) -> str | None:
    if not any(fnmatch.fnmatch(path, p) for p in FORK_ONLY):
        for concern in CONCERNS:
            if any(fnmatch.fnmatch(path, p) for p in _SERIES["files"][concern]):
                return concern
    return None


def series_files() -> dict[str, list[str]]:
    """The repository's tracked files each patch adds."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.split()
    out: dict[str, list[str]] = {c: [] for c in CONCERNS}
    for path in tracked:
        concern = _concern_of(path)
        if concern is not None and (REPO / path).is_file():
            out[concern].append(path)
    return out


def staged_modules(concern: str) -> dict[str, str]:
    """The new modules later patches extend, as ``concern``'s patch leaves them."""
    done = CONCERNS.index(concern) + 1
    return {
        path: earlier_stage(
            (REPO / path).read_text(),
            [name for c in CONCERNS[done:] for name in added.get(c, ())],
        )
        for path, added in _SERIES["later_definitions"].items()
        if _concern_of(path) in CONCERNS[:done]
    }


def extract_pristine(wheel: Path, tree: Path) -> None:
    """The wheel's ``vllm`` package without its compiled parts."""
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.startswith("vllm/") and not name.endswith((".so", "/")):
                zf.extract(name, tree)


def signer(author: str | None = None) -> tuple[str, str] | None:
    """Who signs the series off: ``author`` ("Name <email>"), else git's
    ``user.name`` and ``user.email`` here; None when neither is set."""
    if author:
        match = re.fullmatch(r"\s*(.+?)\s*<([^<>\s]+@[^<>\s]+)>\s*", author)
        if match is None:
            raise SystemExit(f"--author {author!r}: expected 'Name <email>'")
        return match[1], match[2]
    name, email = (
        subprocess.run(
            ["git", "config", key], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        for key in ("user.name", "user.email")
    )
    return (name, email) if name and email else None


def _git(tree: Path, *args: str, identity: tuple[str, str] | None = None) -> str:
    # A fixed date keeps the generated series byte-reproducible.
    name, email = identity or ("unsigned", "unsigned@invalid")
    env = os.environ.copy()
    for role in ("AUTHOR", "COMMITTER"):
        env[f"GIT_{role}_NAME"], env[f"GIT_{role}_EMAIL"] = name, email
        env[f"GIT_{role}_DATE"] = "2026-01-01T00:00:00+0000"
    return subprocess.run(
        ["git", *args], cwd=tree, env=env, check=True, capture_output=True, text=True
    ).stdout


def non_test_lines(numstat: str) -> int:
    """Lines changed outside tests/ and benchmarks/ per ``git diff --numstat``."""
    rows = (line.split("\t", 2) for line in numstat.splitlines())
    return sum(
        int(added) + int(removed)
        for added, removed, path in rows
        if not path.startswith(("tests/", "benchmarks/")) and added != "-"
    )


def default_out_dir() -> Path:
    return REPO / "dist" / "patches" / f"vllm-{load_pin().VLLM_VERSION}"


def generate(out_dir: Path, author: str | None = None) -> list[Path]:
    """Write the series to ``out_dir``; its patch files in order."""
    pin = load_pin()
    identity = signer(author)
    if identity is None:
        log(
            "the series is unsigned (no Signed-off-by): set git's user.name and "
            "user.email, or pass --author 'Name <email>'"
        )
    wheel = upstream_wheel()
    files = series_files()
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.patch"):
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
        tree = Path(tmp)
        extract_pristine(wheel, tree)
        _git(tree, "init", "-q")
        _git(tree, "add", "-A")
        _git(tree, "commit", "-q", "-m", f"vLLM {pin.VLLM_VERSION}")
        for i, concern in enumerate(CONCERNS):
            edits = [e for e in EDITS if e.concern in CONCERNS[: i + 1]]
            edited = apply_edits(lambda p: zf.read(p).decode(), edits, pin.VLLM_VERSION)
            for path in files[concern]:
                (tree / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(REPO / path, tree / path)
            for path, text in {**edited, **staged_modules(concern)}.items():
                (tree / path).write_text(text)
            title, body = _message(concern, pin.FLASHINFER_VERSION)
            _git(tree, "add", "-A")
            if concern == PAGES:
                changed = _git(tree, "diff", "--cached", "--numstat")
                body += f"\n\nNon-test lines changed: {non_test_lines(changed)}."
            message = ["-m", title, "-m", body]
            if identity is not None:
                message += ["-m", f"Signed-off-by: {identity[0]} <{identity[1]}>"]
            _git(tree, "commit", "-q", *message, identity=identity)
        base = f"HEAD~{len(CONCERNS)}"
        _git(tree, "format-patch", "-q", "--no-signature", "-o", str(out_dir), base)
    patches = sorted(out_dir.glob("*.patch"))
    for patch in patches:
        lines = patch.read_text().splitlines()
        touched = {line[6:] for line in lines if line.startswith("+++ b/")}
        added, removed = (
            sum(line[:1] == mark and line[:3] != mark * 3 for line in lines)
            for mark in "+-"
        )
        log(f"{patch.name}: {len(touched)} files, +{added} -{removed}")
    return patches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="default: dist/patches/vllm-<base>")
    parser.add_argument(
        "--author",
        help="'Name <email>' to author and sign off the series "
        "(default: git's user.name and user.email)",
    )
    add_base_argument(parser)
    args = parser.parse_args()
    select_base(args.base)
    for patch in generate(args.out or default_out_dir(), args.author):
        print(patch)


if __name__ == "__main__":
    main()
