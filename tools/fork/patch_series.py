# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Generate the upstream patch series: the fork's change as ``git am``-able
patches against a pristine vLLM tree, one patch per concern.

    python3 tools/fork/patch_series.py [--out DIR] [--base 0.33.0]

The pristine tree is the pinned wheel's Python package (its compiled parts
left out); each patch adds the edits of its concern (tools/fork/edits.py)
and the new files of its concern (``SERIES_FILES``) on top of the previous
one, so the series applies in order and each patch says why it exists.
Nothing here is committed: the diffs are made at build time.
"""

import argparse
import fnmatch
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
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
from tools.fork.edits import CONCERNS, EDITS, PAGES, TRITON, VALIDATION  # noqa: E402

# The repository's files each patch adds, by concern (glob patterns).
SERIES_FILES: dict[str, tuple[str, ...]] = {
    PAGES: (
        "vllm/v1/attention/backends/mla/sparse_mla_page_policy.py",
        "vllm/models/deepseek_v41/nvidia/sparse_mla_negotiation.py",
        "tests/v1/attention/backends/mla/test_sparse_mla_page_policy.py",
        "tests/v1/attention/dsv41/*.py",
        "tests/models/deepseek_v41/conftest.py",
    ),
    VALIDATION: (
        "vllm/v1/attention/backends/mla/sparse_mla_plan_report.py",
        "vllm/models/deepseek_v41/configs/*.json",
        "tests/models/deepseek_v41/test_flashinfer_sparse.py",
        "tests/models/deepseek_v41/test_kv_cache_planning.py",
        "tests/models/deepseek_v41/test_report.py",
        "tests/models/deepseek_v41/test_plan_report_cli.py",
    ),
    TRITON: (
        "vllm/models/deepseek_v41/nvidia/sparse_mla_launcher.py",
        "vllm/v1/attention/ops/triton_dsv41_sparse_mla.py",
        "tests/models/deepseek_v41/test_sparse_mla_launcher.py",
        "tests/kernels/attention/test_*dsv41*.py",
        "tests/kernels/attention/test_gpu_tests_use_live_names.py",
        "tools/kernels/dsv41_sparse_mla_offline.py",
        "benchmarks/kernels/*dsv41_sparse_mla*.py",
        # The benchmark's FlashMLA peer, run from a module built elsewhere.
        "benchmarks/kernels/flashmla_peer.py",
    ),
}
# Files of the fork that upstream does not need: the pre-0.30.0 import path
# and package markers (upstream's tests/ and tools/ are not packages).
FORK_ONLY = (
    "vllm/models/deepseek_v4_1/*",
    "tests/models/deepseek_v4_1/*",
    "*__init__.py",
)

# Each patch's title and why it exists (the commit message).
MESSAGES = {
    PAGES: (
        "[Attention] DeepSeek V4.1: KV-cache pages the sparse-MLA kernels serve",
        """
        FlashInfer 0.6.14-0.6.18 build the SM120 DSV4 decode kernels for
        64-entry pages only, but DeepSeek V4.1 pages its sliding-window cache
        in 32 tokens and its compressed KV in --block-size tokens, so SM12x
        fails at the first decode. A page policy asks the installed FlashInfer
        what it serves (its static tables before 0.7,
        supported_sparse_mla_sm120_configs() from 0.7) and the backends answer
        from it: get_swa_block_size() sizes the SWA cache,
        get_compressed_block_size(ratio) the compressed-KV spec, and
        get_supported_kernel_block_sizes() / get_preferred_block_size() report
        the pages. Other backends keep their pages.
        """,
    ),
    VALIDATION: (
        "[Attention] DeepSeek V4.1: refuse unserved sparse-MLA setups at start-up",
        """
        Every DeepSeek V4.1 layer negotiates with its backend before it builds
        a cache. The FlashInfer backend checks the GPU, the head count after
        tensor parallelism, the KV-cache dtype and --block-size against the
        page policy and raises one message naming what is supported and how
        to fix it; supports_combination() asks the same check. A plan report
        (python -m vllm.v1.attention.backends.mla.sparse_mla_plan_report plan)
        prints the pages, kernel and errors for a GPU without loading weights.
        """,
    ),
    TRITON: (
        "[Kernel] DeepSeek V4.1: portable Triton sparse-MLA fallback",
        """
        A Triton kernel with FlashInfer's two-segment sparse-MLA contract runs
        where FlashInfer has none: SM89/SM90, or a decode shape the installed
        FlashInfer's SM120 kernels lack. The policy picks it per layer when the
        layer is built and the SM120 layer calls it through a launcher; its
        tiles fit 99 KB shared-memory GPUs. With its tests and benchmark.
        """,
    ),
}


def _concern_of(path: str) -> str | None:
    if any(fnmatch.fnmatch(path, p) for p in FORK_ONLY):
        return None
    for concern, patterns in SERIES_FILES.items():
        if any(fnmatch.fnmatch(path, p) for p in patterns):
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


def extract_pristine(wheel: Path, tree: Path) -> None:
    """The wheel's ``vllm`` package without its compiled parts."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if name.startswith("vllm/") and not name.endswith((".so", "/")):
                zf.extract(info, tree)


def _git(tree: Path, *args: str) -> str:
    # A fixed author and date keep the generated series byte-reproducible.
    identity = "DeepSeek V4.1 Blackwell fork"
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": identity,
        "GIT_COMMITTER_NAME": identity,
        "GIT_AUTHOR_EMAIL": "dsv41-fork@localhost",
        "GIT_COMMITTER_EMAIL": "dsv41-fork@localhost",
        "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
        "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
    }
    return subprocess.run(
        ["git", *args], cwd=tree, env=env, check=True, capture_output=True, text=True
    ).stdout


def default_out_dir() -> Path:
    return REPO / "dist" / "patches" / f"vllm-{load_pin().VLLM_VERSION}"


def generate(out_dir: Path) -> list[Path]:
    """Write the series to ``out_dir``; return the patch files in order."""
    pin = load_pin()
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
            wanted = set(CONCERNS[: i + 1])
            edits = [e for e in EDITS if e.concern in wanted]
            edited = apply_edits(lambda p: zf.read(p).decode(), edits, pin.VLLM_VERSION)
            for path, text in edited.items():
                (tree / path).write_text(text)
            for path in files[concern]:
                (tree / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(REPO / path, tree / path)
            title, body = MESSAGES[concern]
            body = textwrap.dedent(body).strip()
            _git(tree, "add", "-A")
            _git(tree, "commit", "-q", "-m", title, "-m", body)
        _git(
            tree, "format-patch", "-q", "--no-signature", "-o", str(out_dir),
            f"HEAD~{len(CONCERNS)}",
        )  # fmt: skip
    patches = sorted(out_dir.glob("*.patch"))
    for patch in patches:
        added = removed = 0
        touched = set()
        for line in patch.read_text().splitlines():
            if line.startswith("+++ b/"):
                touched.add(line[6:])
            elif line.startswith("+") and not line.startswith("+++"):
                added += 1
            elif line.startswith("-") and not line.startswith("---"):
                removed += 1
        log(f"{patch.name}: {len(touched)} files, +{added} -{removed}")
    return patches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="default: dist/patches/vllm-<base>")
    add_base_argument(parser)
    args = parser.parse_args()
    select_base(args.base)
    for patch in generate(args.out or default_out_dir()):
        print(patch)


if __name__ == "__main__":
    main()
