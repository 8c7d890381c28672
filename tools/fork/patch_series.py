# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Generate the upstream patch series: one ``git am``-able patch per concern.

The patches apply to a pristine vLLM tree taken from the pinned wheel.

    python3 tools/fork/patch_series.py [--out DIR] [--base 0.34.0]

The base's pull requests (tools/fork/series.toml) are written in order, each
to its own folder; each patch adds its concern's edits (tools/fork/edits.py)
and whole files on top of the ones before it, to the pinned wheel's Python
package. A pull request applies to a pristine tree with only the ones it
builds on (series.toml's ``builds_on``), and its first commit message names
that one. The diffs are made at build time, never committed.
"""

import argparse
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.fork.common import (  # noqa: E402
    REPO,
    add_base_argument,
    load_pin,
    log,
    select_base,
    series,
    upstream_wheel,
    within_bases,
)
from tools.fork.edit_engine import apply_edits  # noqa: E402
from tools.fork.edits import EDITS, INDEXER, PAGES  # noqa: E402

_SERIES = series()
FORK_ONLY: tuple[str, ...] = tuple(_SERIES["fork_only"])


def _message(concern: str, flashinfer: str, base: str) -> tuple[str, str]:
    message = dict(_SERIES["messages"][concern])
    # A text may differ per base: a table of texts by base.
    for key in ("title", "body"):
        if isinstance(message.get(key), dict):
            message[key] = message[key][base]
    if concern != PAGES:
        return message["title"], message["body"].strip()
    parts = []
    if any(e.file == INDEXER for e in concern_edits(PAGES, base)):
        parts.append(message["indexer"].strip())
    # FlashInfer's SM120 kernels take run-time pages from 0.7.1 on.
    numbers = [int(p) for p in flashinfer.split(".")[:3] if p.isdigit()]
    pages = "fixed" if numbers < [0, 7, 1] else "runtime"
    parts.append(message[f"{pages}_sm120_pages"].strip())
    return message["title"], "\n\n".join(parts)


def concern_edits(concern: str, base: str) -> list:
    return [e for e in EDITS if e.concern == concern and e.applies_to(base)]


def pull_requests(base: str) -> dict[str, list[str]]:
    """The base's pull requests in order, each its concerns in order."""
    return dict(_SERIES["pull_requests"][base])


def builds_on(base: str) -> dict[str, str]:
    """The base's pull requests that need another applied first: each one's
    name, and that one's."""
    return dict(_SERIES.get("builds_on", {}).get(base, {}))


def applied_with(name: str, base: str) -> list[str]:
    """The pull requests a tree needs for ``name`` to apply: the ones it
    builds on, first applied first, then ``name``."""
    chain, below = [name], builds_on(base)
    while chain[0] in below:
        chain.insert(0, below[chain[0]])
    return chain


def _concern_of(path: str, base: str | None = None) -> str | None:
    """The first concern, in ``base``'s order (default: the pin's), whose
    files include ``path``."""
    base = base or load_pin().VLLM_VERSION
    if any(fnmatch.fnmatch(path, p) for p in FORK_ONLY) or not within_bases(path, base):
        return None
    order = [c for pr in pull_requests(base).values() for c in pr]
    for concern in order:
        if any(fnmatch.fnmatch(path, p) for p in _SERIES["files"][concern]):
            return concern
    return None


def series_files() -> dict[str, list[str]]:
    """The repository's tracked files each of the pin's patches adds."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.split()
    out: dict[str, list[str]] = {c: [] for c in _SERIES["files"]}
    for path in tracked:
        concern = _concern_of(path)
        if concern is not None and (REPO / path).is_file():
            out[concern].append(path)
    return out


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
    """Write each pull request's patches to ``out_dir/<name>/``; return every
    patch file, pull requests in order."""
    pin = load_pin()
    base = pin.VLLM_VERSION
    identity = signer(author)
    if identity is None:
        log(
            "the series is unsigned (no Signed-off-by): set git's user.name and "
            "user.email, or pass --author 'Name <email>'"
        )
    wheel = upstream_wheel()
    files = series_files()
    if out_dir.exists():
        shutil.rmtree(out_dir)
    patches: list[Path] = []
    done: list[str] = []
    titles: dict[str, str] = {}
    below = builds_on(base)
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
        tree = Path(tmp)
        extract_pristine(wheel, tree)
        _git(tree, "init", "-q")
        _git(tree, "add", "-A")
        _git(tree, "commit", "-q", "-m", f"vLLM {base}")
        for name, concerns in pull_requests(base).items():
            start = _git(tree, "rev-parse", "HEAD").strip()
            for concern in concerns:
                done.append(concern)
                edits = [e for e in EDITS if e.concern in done]
                edited = apply_edits(lambda p: zf.read(p).decode(), edits, base)
                for path in files[concern]:
                    (tree / path).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(REPO / path, tree / path)
                for path, text in edited.items():
                    (tree / path).write_text(text)
                title, body = _message(concern, pin.FLASHINFER_VERSION, base)
                titles.setdefault(name, title)
                if concern == concerns[0] and name in below:
                    body += (
                        f'\n\nThis builds on the pull request "{titles[below[name]]}" '
                        "and applies on top of it."
                    )
                _git(tree, "add", "-A")
                message = ["-m", title, "-m", body]
                if identity is not None:
                    message += ["-m", f"Signed-off-by: {identity[0]} <{identity[1]}>"]
                _git(tree, "commit", "-q", *message, identity=identity)
            folder = out_dir / name
            _git(tree, "format-patch", "-q", "--no-signature", "-o", str(folder), start)
            patches += sorted(folder.glob("*.patch"))
    for patch in patches:
        lines = patch.read_text().splitlines()
        touched = {line[6:] for line in lines if line.startswith("+++ b/")}
        added, removed = (
            sum(line[:1] == mark and line[:3] != mark * 3 for line in lines)
            for mark in "+-"
        )
        where = f"{patch.parent.name}/{patch.name}"
        log(f"{where}: {len(touched)} files, +{added} -{removed}")
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
