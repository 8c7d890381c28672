# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The generated upstream patch series applies to a pristine tree taken from
the pinned wheel and holds the fork; each pull request applies there with only
the ones it builds on and passes its own tests; and (on the default base) the
CPU suite passes on the whole patched tree alone."""

import email
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
import yaml

from tools.fork.build_wheel import fork_files
from tools.fork.common import REPO, all_bases, load_pin
from tools.fork.patch_series import (
    FORK_ONLY,
    applied_with,
    builds_on,
    extract_pristine,
    generate,
    pull_requests,
)

pytestmark = pytest.mark.slow


AUTHOR = ("Ada Reviewer", "ada@example.org")
BASE = load_pin().VLLM_VERSION
PULL_REQUESTS = pull_requests(BASE)
NUM_PATCHES = sum(map(len, PULL_REQUESTS.values()))
# The most lines outside tests/ a [Bugfix] patch that opens a series adds.
BUGFIX_MAX_ADDED_LINES = 100
# The most lines the [Kernel] pull request adds, tests and benchmark
# included (its tests build a small model of their own, to stand alone; its
# benchmark times the kernel beside FlashMLA's decode and prefill and vLLM's
# small-head decode): what a reviewer can take in one pull request with its
# RFC.
KERNEL_MAX_ADDED_LINES = 3600
# Words of this repository that upstream text has no use for: the fork, and
# the vLLM releases it builds on (a pristine tree is simply vLLM).
FORK_WORDS = re.compile(
    "|".join([r"(?<![a-z])fork", *(re.escape(b) for b in all_bases())]), re.I
)


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    return generate(tmp_path_factory.mktemp("series"), f"{AUTHOR[0]} <{AUTHOR[1]}>")


@pytest.fixture(scope="session")
def pristine_tree(upstream_wheel_path, tmp_path_factory):
    """The pinned wheel's ``vllm`` package, extracted once; copy it to patch it."""
    tree = tmp_path_factory.mktemp("pristine") / "vllm-tree"
    extract_pristine(upstream_wheel_path, tree)
    return tree


def test_every_patch_is_authored_and_signed_off_by_its_generator(series):
    """vLLM's DCO check: a Signed-off-by trailer naming the patch's author."""
    for patch in series:
        text = patch.read_text()
        author = re.search(r"^From: (.+) <(.+)>$", text, re.M)
        assert author is not None and (author[1], author[2]) == AUTHOR
        message = text.split("\n---\n", 1)[0]
        trailers = re.findall(r"^Signed-off-by: (.+) <(.+)>$", message, re.M)
        assert trailers == [AUTHOR], patch.name


# Signing does not depend on the base: one base's series shows it.
@pytest.mark.default_base_only
def test_without_an_identity_the_series_is_unsigned(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("tools.fork.patch_series.signer", lambda author=None: None)
    patches = generate(tmp_path)
    assert "the series is unsigned" in capsys.readouterr().err
    for patch in patches:
        assert "Signed-off-by:" not in patch.read_text()


def _added_non_test_lines(patch) -> int:
    """Lines the patch adds outside tests/ and benchmarks/, from its diff."""
    counted, path = 0, ""
    for line in patch.read_text().split("\n---\n", 1)[1].splitlines():
        if line.startswith("diff --git a/"):
            path = line.split(" b/", 1)[1]
        elif line.startswith("+") and not line.startswith("+++"):
            counted += not path.startswith(("tests/", "benchmarks/"))
    return counted


def test_no_message_counts_lines(series):
    for patch in series:
        message = patch.read_text().split("\n---\n", 1)[0]
        assert not re.search(r"\d+ lines|lines changed", message), patch.name


def test_no_patch_speaks_of_the_fork_or_its_bases(series):
    for patch in series:
        message, diff = patch.read_text().split("\n---\n", 1)
        lines = [message, *(a for a in diff.splitlines() if a[:1] == "+")]
        offending = [line for line in lines if FORK_WORDS.search(line)]
        assert not offending, (patch.name, offending)


@pytest.mark.default_base_only
def test_the_bugfix_opens_the_series_and_is_small(series):
    """On the pull request's base the first patch is the [Bugfix] alone."""
    assert next(iter(PULL_REQUESTS.values()))[0] == "bugfix"
    first = series[0].read_text()
    assert "Subject: [PATCH] [Bugfix]" in first
    assert _added_non_test_lines(series[0]) <= BUGFIX_MAX_ADDED_LINES


def _added_lines(patch) -> int:
    diff = patch.read_text().split("\n---\n", 1)[1]
    return sum(
        line.startswith("+") and not line.startswith("+++")
        for line in diff.splitlines()
    )


def test_the_kernel_pull_request_is_reviewable(series):
    kernel = [p for p in series if p.parent.name == "kernel"]
    assert kernel and "Subject: [PATCH] [Kernel]" in kernel[0].read_text()
    assert sum(map(_added_lines, kernel)) <= KERNEL_MAX_ADDED_LINES


def _git(tree, *args):
    return subprocess.run(
        ["git", *args], cwd=tree, capture_output=True, text=True, check=False
    )


def test_one_patch_per_concern_with_its_reason(series):
    assert len(series) == NUM_PATCHES
    assert [p.parent.name for p in series] == [
        name for name, concerns in PULL_REQUESTS.items() for _ in concerns
    ]
    for patch in series:
        siblings = sorted(patch.parent.glob("*.patch"))
        number = siblings.index(patch) + 1
        text = patch.read_text()
        assert f"Subject: [PATCH {number}/{len(siblings)}]" in text or (
            len(siblings) == 1 and "Subject: [PATCH] " in text
        )
        # A body that says why, before the diffstat.
        message = text.split("\n\n", 1)[1].split("\n---\n", 1)[0]
        assert len(message.split()) > 30


def _added_files(patch):
    return re.findall(r"^diff --git a/\S+ b/(\S+)$", patch.read_text(), re.M)


def _apply(tree, patches):
    assert _git(tree, "init", "-q").returncode == 0
    for patch in patches:
        check = _git(tree, "apply", "--check", str(patch))
        assert check.returncode == 0, check.stderr
        applied = _git(tree, "apply", str(patch))
        assert applied.returncode == 0, applied.stderr


def _run_in(tree, *args):
    """``python -m ARGS`` in ``tree`` with only the tree on the path."""
    env = {**os.environ, "PYTHONPATH": str(tree), "VLLM_PLUGINS": ""}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=tree, env=env, capture_output=True, text=True
    )


def _ruff_findings(tree, files) -> set[tuple[str, str, str]]:
    """(file, rule, message) of each ruff finding in ``files`` of ``tree``."""
    config = ["--config", str(REPO / "pyproject.toml")]
    result = _run_in(tree, "ruff", "check", *config, "--output-format", "json", *files)
    return {
        (os.path.relpath(f["filename"], tree), f["code"], f["message"])
        for f in json.loads(result.stdout or "[]")
    }


def _patches_of(series, name: str) -> list:
    return [p for p in series if p.parent.name == name]


def test_a_pull_request_names_the_one_it_builds_on(series):
    """Its first commit message names the first commit of the pull request
    it needs applied first; one that builds on nothing names no other."""
    messages, titles = {}, {}
    for name in PULL_REQUESTS:
        text = _patches_of(series, name)[0].read_text().split("\n---\n", 1)[0]
        subject = " ".join(email.message_from_string(text)["Subject"].split())
        titles[name] = subject.split("] ", 1)[1]
        messages[name] = " ".join(text.split("\n\n", 1)[1].split())
    for name in PULL_REQUESTS:
        named = [o for o in PULL_REQUESTS if o != name and titles[o] in messages[name]]
        below = builds_on(BASE).get(name)
        assert named == ([below] if below else []), (name, named)


def _test_area_paths(tree, files) -> list[str]:
    """The files a Buildkite test area among ``files`` names: its steps'
    source-file dependencies and the test files their commands run (from
    tests/)."""
    paths = []
    for area in (f for f in files if f.startswith(".buildkite/test_areas/")):
        for step in yaml.safe_load((tree / area).read_text())["steps"]:
            paths += step.get("source_file_dependencies", [])
            for command in step.get("commands", []):
                paths += [
                    f"tests/{word.split('::')[0]}"
                    for word in command.split()
                    if word.split("::")[0].endswith(".py")
                ]
    return paths


@pytest.mark.parametrize("name", list(PULL_REQUESTS))
def test_each_pull_request_passes_its_own_tests_alone(
    series, pristine_tree, tmp_path, name
):
    """A pristine tree with only ``name`` and the pull requests it builds on
    applied: the files they touch are ruff-clean, every file a test area of
    theirs names exists, and the tests ``name`` adds collect and pass."""
    tree = tmp_path / "vllm-tree"
    shutil.copytree(pristine_tree, tree)
    patches = [p for pr in applied_with(name, BASE) for p in _patches_of(series, pr)]
    _apply(tree, patches)
    touched = sorted({f for p in patches for f in _added_files(p)})
    python = [f for f in touched if f.endswith(".py")]
    config = ["--config", str(REPO / "pyproject.toml")]
    # Findings the patches add: upstream's own files carry some already.
    before = _ruff_findings(
        pristine_tree, [f for f in python if (pristine_tree / f).exists()]
    )
    assert _ruff_findings(tree, python) - before == set()
    result = _run_in(tree, "ruff", "format", "--check", *config, *python)
    assert result.returncode == 0, result.stdout + result.stderr
    missing = [p for p in _test_area_paths(tree, touched) if not (tree / p).exists()]
    assert not missing, missing
    own = [
        f
        for p in _patches_of(series, name)
        for f in _added_files(p)
        if f.startswith("tests/") and os.path.basename(f).startswith("test_")
    ]
    assert own, f"{name} adds no tests"
    result = _run_in(tree, "pytest", "-q", "-p", "no:cacheprovider", *own)
    summary = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "passed" in summary and "failed" not in summary, summary


# The backport's page policy goes whole into its first pull request, Triton
# choice included (no module is staged), so this holds on the default base.
@pytest.mark.default_base_only
def test_the_first_pull_request_holds_no_triton(series):
    """The first pull request neither routes to nor names the Triton kernel
    outside its tests; the kernel's pull request brings it."""
    first = next(iter(PULL_REQUESTS))
    for patch in (p for p in series if p.parent.name == first):
        path = ""
        for line in patch.read_text().split("\n---\n", 1)[1].splitlines():
            if line.startswith("diff --git a/"):
                path = line.split(" b/", 1)[1]
            elif line.startswith("+") and not path.startswith("tests/"):
                assert "triton" not in line.lower(), (patch.name, path, line)


@pytest.fixture(scope="module")
def patched_tree(series, pristine_tree, upstream_wheel_path, tmp_path_factory):
    """A pristine tree from the pinned wheel with the series applied."""
    tree = tmp_path_factory.mktemp("patched") / "vllm-tree"
    shutil.copytree(pristine_tree, tree)
    with zipfile.ZipFile(upstream_wheel_path) as zf:
        pristine_attention = zf.read("vllm/models/deepseek_v41/attention.py")
    assert (tree / "vllm/models/deepseek_v41/attention.py").read_bytes() == (
        pristine_attention
    )
    _apply(tree, series)
    return tree


def test_the_patched_tree_holds_the_fork(patched_tree, upstream_wheel_path):
    """What the series changes is what the fork wheel ships, byte for byte,
    and the series brings its tests."""
    tree = patched_tree
    assert (tree / "tests").is_dir()
    edited, new = fork_files(upstream_wheel_path)
    for path, data in {**edited, **new}.items():
        if any(fnmatch.fnmatch(path, pattern) for pattern in FORK_ONLY):
            continue
        assert (tree / path).read_bytes() == data, path


# On the other bases the tree holds that base's fork byte for byte (above),
# whose CPU suite the same run passes: running it again there costs CI
# minutes and finds nothing new.
@pytest.mark.default_base_only
def test_the_cpu_suite_passes_on_the_patched_tree_alone(patched_tree):
    tree = patched_tree
    # Only the patched tree: vllm and the tests resolve inside it, and the
    # interpreter is told nothing about this repository.
    env = {**os.environ, "PYTHONPATH": str(tree), "VLLM_PLUGINS": ""}
    # The report's full command-line table already ran against this base.
    env["DSV41_PLAN_REPORT_CASES"] = "few"
    where = subprocess.run(
        [sys.executable, "-c", "import vllm; print(vllm.__file__)"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.stdout.strip() == str(tree / "vllm" / "__init__.py"), where.stderr
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    summary = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    # At least the binding test's 92 cases and the backend choice's 25 ran.
    assert passed >= 117, summary
    assert "failed" not in summary and "error" not in summary, summary
