# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The generated upstream patch series applies to a pristine tree taken from
the pinned wheel and holds the fork, and (on the default base) the CPU suite
passes on that patched tree alone."""

import fnmatch
import os
import re
import subprocess
import sys
import zipfile

import pytest

from tools.fork.build_wheel import fork_files
from tools.fork.common import REPO
from tools.fork.edits import CONCERNS
from tools.fork.patch_series import FORK_ONLY, extract_pristine, generate

pytestmark = pytest.mark.slow


AUTHOR = ("Ada Reviewer", "ada@example.org")


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    return generate(tmp_path_factory.mktemp("series"), f"{AUTHOR[0]} <{AUTHOR[1]}>")


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


def test_the_first_patch_counts_its_non_test_lines(series):
    """Its message states the count its own diff has outside tests/ and
    benchmarks/ (counted here from the diff text, not from git's numstat)."""
    text = series[0].read_text()
    stated = int(re.search(r"Non-test lines changed: (\d+)\.", text)[1])
    counted, path = 0, ""
    for line in text.split("\n---\n", 1)[1].splitlines():
        if line.startswith("diff --git a/"):
            path = line.split(" b/", 1)[1]
        elif line.startswith(("+++", "---")):
            continue
        elif line.startswith(("+", "-")) and not path.startswith(
            ("tests/", "benchmarks/")
        ):
            counted += 1
    assert stated == counted


def _git(tree, *args):
    return subprocess.run(
        ["git", *args], cwd=tree, capture_output=True, text=True, check=False
    )


def test_one_patch_per_concern_with_its_reason(series):
    assert len(series) == len(CONCERNS)
    for number, patch in enumerate(series, 1):
        text = patch.read_text()
        assert f"Subject: [PATCH {number}/{len(CONCERNS)}]" in text
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


@pytest.mark.parametrize("count", range(1, len(CONCERNS)))
def test_each_patch_passes_its_own_tests_alone(
    series, upstream_wheel_path, tmp_path, count
):
    """The first ``count`` patches on a pristine tree: the files they touch
    are ruff-clean, and the tests the last of them adds pass there (the last
    patch's own tests are the whole suite, run below)."""
    tree = tmp_path / "vllm-tree"
    extract_pristine(upstream_wheel_path, tree)
    _apply(tree, series[:count])
    touched = sorted({f for p in series[:count] for f in _added_files(p)})
    python = [f for f in touched if f.endswith(".py")]
    config = ["--config", str(REPO / "pyproject.toml")]
    for ruff in (["check", *config], ["format", "--check", *config]):
        result = _run_in(tree, "ruff", *ruff, *python)
        assert result.returncode == 0, result.stdout + result.stderr
    own = [
        f
        for f in _added_files(series[count - 1])
        if f.startswith("tests/") and os.path.basename(f).startswith("test_")
    ]
    assert own, f"patch {count} adds no tests"
    result = _run_in(tree, "pytest", "-q", "-p", "no:cacheprovider", *own)
    summary = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "passed" in summary and "failed" not in summary, summary


def test_the_first_patches_hold_no_triton(series):
    """The page fix and the validation neither route to nor name the Triton
    kernel outside their tests; the last patch brings it."""
    for patch in series[:-1]:
        path = ""
        for line in patch.read_text().split("\n---\n", 1)[1].splitlines():
            if line.startswith("diff --git a/"):
                path = line.split(" b/", 1)[1]
            elif line.startswith("+") and not path.startswith("tests/"):
                assert "triton" not in line.lower(), (patch.name, path, line)


@pytest.fixture(scope="module")
def patched_tree(series, upstream_wheel_path, tmp_path_factory):
    """A pristine tree from the pinned wheel with the series applied."""
    tree = tmp_path_factory.mktemp("patched") / "vllm-tree"
    extract_pristine(upstream_wheel_path, tree)
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
    # The many-step decode (minutes on CPU) already ran against this base's
    # fork, whose files the tree holds (test_the_patched_tree_holds_the_fork).
    many_step = "tests/v1/attention/dsv41/test_many_step_decode.py"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests",
            "--deselect",
            many_step,
        ],  # fmt: skip
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    summary = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert passed >= 150, summary
    assert "failed" not in summary and "error" not in summary, summary
