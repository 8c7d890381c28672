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
import re
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
from tools.fork.module_stages import earlier_stage  # noqa: E402

# The repository's files each patch adds, by concern (glob patterns).
SERIES_FILES: dict[str, tuple[str, ...]] = {
    PAGES: (
        "vllm/v1/attention/backends/mla/indexer_pages.py",
        "vllm/models/deepseek_v41/nvidia/sparse_mla_pages.py",
        "tests/models/deepseek_v41/conftest.py",
        "tests/models/deepseek_v41/test_indexer_cache_pages.py",
        "tests/models/deepseek_v41/test_sparse_mla_pages.py",
        "tests/v1/attention/dsv41/flashinfer_release.py",
    ),
    VALIDATION: (
        "tests/models/deepseek_v41/layer_config.py",
        "tests/models/deepseek_v41/test_sparse_mla_validation.py",
    ),
    TRITON: (
        "vllm/models/deepseek_v41/nvidia/sparse_mla_launcher.py",
        "vllm/v1/attention/ops/triton_dsv41_sparse_mla.py",
        "tests/models/deepseek_v41/test_sparse_mla_launcher.py",
        "tests/models/deepseek_v41/test_sparse_mla_triton_fallback.py",
        "tests/v1/attention/dsv41/*.py",
        "tests/kernels/attention/test_*dsv41*.py",
        "tests/kernels/attention/test_gpu_tests_use_live_names.py",
        "tests/kernels/attention/dsv41_offline_compile.py",
        "benchmarks/kernels/*dsv41_sparse_mla*.py",
        # The benchmark's FlashMLA peer, run from a module built elsewhere.
        "benchmarks/kernels/flashmla_peer.py",
        # The GPU steps of every patch's tests, for vLLM's pipeline generator.
        ".buildkite/test_areas/deepseek_v4_1_blackwell.yaml",
    ),
}
# New modules that a later patch extends, and the definitions each later
# concern adds to them: an earlier patch adds the module without those
# (tools/fork/module_stages.py), so it holds only its own concern.
PAGES_MODULE = "vllm/models/deepseek_v41/nvidia/sparse_mla_pages.py"
LATER_DEFINITIONS: dict[str, dict[str, tuple[str, ...]]] = {
    PAGES_MODULE: {
        VALIDATION: (
            "PLAIN_ROW_KV_CACHE_DTYPES",
            "PACKED_KV_CACHE_DTYPES",
            "BLOCK_SIZE_CHOICES",
            "SparseMLAPlan.padded_heads",
            "SparseMLAPlan.swa_topks",
            "SparseMLAPlan.kv_cache_dtype",
            "_refuse",
            "pad_q_heads",
            "check_kv_cache_dtype",
            "swa_topks",
            "negotiate",
            "_check_model_shape",
            "negotiate_for_model",
            "PagedBackends",
            "_block_size_refusal",
            "check_block_size",
            "negotiate_layer",
            "supports_compute_capability",
            "unsupported_reason",
        ),
        TRITON: (
            "TRITON_MIN_CAPABILITY",
            "SparseMLAKernel.TRITON",
            "SparseMLAPlan.note",
            "SparseMLAPlan.serves",
            "_triton_plan",
            "_triton_for_unserved_shapes",
        ),
    },
}
# Files of the fork that upstream does not need: the pre-0.30.0 import path,
# package markers (upstream's tests/ and tools/ are not packages), and the
# plan report, the fork's own command, with the tests that build on it.
FORK_ONLY = (
    "vllm/models/deepseek_v4_1/*",
    "tests/models/deepseek_v4_1/*",
    "*__init__.py",
    "vllm_dsv41_plan/*",
    "tests/plan_report/*",
    "tests/models/deepseek_v41/test_indexer_pages.py",
    "tests/models/deepseek_v41/test_kv_cache_planning.py",
    # Minutes of Triton's interpreter on CPU; the series runs the same decode
    # on the GPU (tests/kernels/attention/test_dsv41_many_step_decode.py).
    "tests/v1/attention/dsv41/test_many_step_decode.py",
)

# Each patch's title and why it exists (the commit message). PAGES says what
# fails on the base: the indexer's pages everywhere, and the sliding-window
# and compressed pages too where FlashInfer's SM120 kernels fix their page.
INDEXER_FAILURE = """
DeepSeek V4.1 pages each kv-source layer's indexer K cache with
--block-size tokens, so a ratio-1 layer gets pages of --block-size
compressed states. DeepGEMM's paged MQA logits take only some state
counts per page on each GPU (64 on SM12x with the DeepGEMM vLLM ships
here, 32 or 64 with newer ones), so at the default --block-size 128 the
first indexer decode on SM12x fails DeepGEMM's host check, and no single
--block-size serves both the ratio-1 and the ratio-2 layers.

Page every indexer K cache at 64 compressed states (64 * compress_ratio
tokens), which DeepGEMM takes on every GPU it serves, and have
DeepseekV41IndexerBackend report those kernel pages. The indexer cache
asks DeepGEMM once while the model is built, so a DeepGEMM that refuses
the pages fails at start-up naming the pages it takes.
"""
FIXED_SM120_PAGES = """
FlashInfer's SM120 DSV4 decode kernels are built here for 64-entry pages
only, while the sliding-window cache is paged in 32 tokens and the
compressed KV in --block-size tokens, so the first SM120 decode fails as
well. A page policy reads what the installed FlashInfer serves (its
fixed tables, or supported_sparse_mla_sm120_configs()) and the backends
answer from it: get_swa_block_size() sizes the SWA cache,
get_compressed_block_size(ratio) the compressed-KV spec (64 states per
page), and get_supported_kernel_block_sizes() / get_preferred_block_size()
report those pages.
"""
RUNTIME_SM120_PAGES = """
The sliding-window and compressed-KV caches get their page from the
backend too (get_swa_block_size(), get_compressed_block_size(ratio)):
FlashInfer's SM120 kernels take the page at run time, so both keep
today's pages, and a FlashInfer built for fixed pages gets the pages its
tables name.
"""
PAGES_TITLE = "[Bugfix] DeepSeek V4.1: KV-cache pages every sparse kernel reads"
MESSAGES = {
    VALIDATION: (
        "[Attention] DeepSeek V4.1: refuse unserved sparse-MLA setups at start-up",
        """
        Every DeepSeek V4.1 layer negotiates with its backend before it builds
        a cache. The FlashInfer backend checks the GPU, the head count after
        tensor parallelism, the KV-cache dtype and --block-size (against the
        sparse-MLA and the indexer kernels' pages, with vLLM's own kernel-page
        selection) and raises one message naming what is supported and how
        to fix it; supports_combination() makes the same checks.
        """,
    ),
    TRITON: (
        "[Kernel] DeepSeek V4.1: portable Triton sparse-MLA fallback",
        """
        A Triton kernel with FlashInfer's two-segment sparse-MLA contract. It
        runs by itself only where no FlashInfer kernel serves the model: an
        SM12x decode shape the installed FlashInfer's SM120 kernels lack, or
        an SM12x host without FlashInfer's SM120 kernels. On SM89/SM90 it
        runs when FLASHINFER_MLA_SPARSE_DSV41 is asked for by name (FlashMLA
        stays the default there). Its tiles fit 99 KB shared-memory GPUs.
        With its tests and benchmark.
        """,
    ),
}


def _message(concern: str, fixed_sm120_pages: bool) -> tuple[str, str]:
    if concern != PAGES:
        title, body = MESSAGES[concern]
        return title, textwrap.dedent(body).strip()
    pages = FIXED_SM120_PAGES if fixed_sm120_pages else RUNTIME_SM120_PAGES
    body = f"{INDEXER_FAILURE.strip()}\n\n{pages.strip()}"
    return PAGES_TITLE, body


def sm120_pages_fixed(flashinfer_version: str) -> bool:
    """Whether the base's FlashInfer builds its SM120 kernels for one page
    (run-time pages arrived in FlashInfer 0.7.1)."""
    numbers = tuple(int(p) for p in flashinfer_version.split(".")[:3] if p.isdigit())
    return numbers < (0, 7, 1)


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


def staged_modules(concern: str) -> dict[str, str]:
    """The new modules that later patches extend, as the patch of
    ``concern`` leaves them."""
    later = CONCERNS[CONCERNS.index(concern) + 1 :]
    out = {}
    for path, added in LATER_DEFINITIONS.items():
        if _concern_of(path) in CONCERNS[: CONCERNS.index(concern) + 1]:
            removed = [name for c in later for name in added.get(c, ())]
            out[path] = earlier_stage((REPO / path).read_text(), removed)
    return out


def extract_pristine(wheel: Path, tree: Path) -> None:
    """The wheel's ``vllm`` package without its compiled parts."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if name.startswith("vllm/") and not name.endswith((".so", "/")):
                zf.extract(info, tree)


def signer(author: str | None = None) -> tuple[str, str] | None:
    """Who signs the series off: ``author`` ("Name <email>"), else git's
    ``user.name`` and ``user.email`` here; None when neither is set."""
    if author:
        match = re.fullmatch(r"\s*(.+?)\s*<([^<>\s]+@[^<>\s]+)>\s*", author)
        if match is None:
            raise SystemExit(f"--author {author!r}: expected 'Name <email>'")
        return match[1], match[2]

    def config(key: str) -> str:
        return subprocess.run(
            ["git", "config", key], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()

    name, email = config("user.name"), config("user.email")
    return (name, email) if name and email else None


def _git(tree: Path, *args: str, identity: tuple[str, str] | None = None) -> str:
    # A fixed date keeps the generated series byte-reproducible.
    name, email = identity or ("unsigned", "unsigned@invalid")
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": name,
        "GIT_COMMITTER_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_EMAIL": email,
        "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
        "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
    }
    return subprocess.run(
        ["git", *args], cwd=tree, env=env, check=True, capture_output=True, text=True
    ).stdout


def non_test_lines(numstat: str) -> int:
    """Added plus removed lines outside tests/ and benchmarks/ in ``git diff
    --numstat`` output."""
    total = 0
    for line in numstat.splitlines():
        added, removed, path = line.split("\t", 2)
        if not path.startswith(("tests/", "benchmarks/")) and added != "-":
            total += int(added) + int(removed)
    return total


def default_out_dir() -> Path:
    return REPO / "dist" / "patches" / f"vllm-{load_pin().VLLM_VERSION}"


def generate(out_dir: Path, author: str | None = None) -> list[Path]:
    """Write the series to ``out_dir``, signed off by ``signer(author)``;
    return the patch files in order."""
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
            wanted = set(CONCERNS[: i + 1])
            edits = [e for e in EDITS if e.concern in wanted]
            edited = apply_edits(lambda p: zf.read(p).decode(), edits, pin.VLLM_VERSION)
            for path, text in edited.items():
                (tree / path).write_text(text)
            for path in files[concern]:
                (tree / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(REPO / path, tree / path)
            for path, text in staged_modules(concern).items():
                (tree / path).write_text(text)
            title, body = _message(concern, sm120_pages_fixed(pin.FLASHINFER_VERSION))
            _git(tree, "add", "-A")
            if concern == PAGES:
                changed = _git(tree, "diff", "--cached", "--numstat")
                body += f"\n\nNon-test lines changed: {non_test_lines(changed)}."
            message = ["-m", title, "-m", body]
            if identity is not None:
                message += ["-m", f"Signed-off-by: {identity[0]} <{identity[1]}>"]
            _git(tree, "commit", "-q", *message, identity=identity)
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
