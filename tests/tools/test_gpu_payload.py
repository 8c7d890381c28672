# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The offline GPU payload runs the GPU tests on a host that has only what the
GPU host has.

The imitation of the GPU host is a venv of this Python without pip's packages,
and a folder on its ``PYTHONPATH`` with links to this dev venv's packages that
the host has (``HOST_PACKAGES``, plus what those require here: this venv's
huggingface-hub is newer than the host's and needs httpx2), never a package
the payload brings. The payload is built for this Python, unpacked, and its
entry point installs it and runs the GPU tests: on a CPU they must be
collected (the imports close) and skip.
"""

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import venv
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tools.fork import gpu_payload
from tools.fork.common import REPO, load_pin

SITE = Path(sysconfig.get_paths()["purelib"])
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
# The Buildkite H100 step's files, and the decode test written beside them.
GPU_TESTS = (
    "tests/kernels/attention/test_triton_dsv41_sparse_mla.py",
    "tests/kernels/attention/test_flashinfer_sparse_mla_dsv41_blackwell.py",
    "tests/v1/attention/dsv41/test_many_step_decode.py",
)


def _environments(python: str) -> list[dict[str, str]]:
    return [
        {
            "python_version": python,
            "python_full_version": f"{python}.0",
            "sys_platform": "linux",
            "platform_system": "Linux",
            "platform_machine": "x86_64",
            "implementation_name": "cpython",
            "platform_python_implementation": "CPython",
            "extra": "",
        }
    ]


def test_every_requirement_of_the_wheels_is_shipped_there_or_omitted():
    from importlib import metadata

    shipped = set(gpu_payload.WHEELS)
    known = shipped | gpu_payload.HOST_PACKAGES | set(gpu_payload.OMITTED)
    installed = gpu_payload.installed_versions(SITE)
    unmet = []
    for name in shipped & set(installed):
        for line in metadata.distribution(name).requires or []:
            req = Requirement(line)
            for env in _environments("3.11") + _environments("3.12"):
                wanted = req.marker is None or req.marker.evaluate(env)
                if wanted and gpu_payload.canonical(req.name) not in known:
                    unmet.append(f"{name} -> {req.name}")
    assert not unmet, sorted(set(unmet))
    assert set(gpu_payload.UNPACKED) <= shipped


def test_wheel_tags():
    fits = gpu_payload._fits
    assert fits("a-1-py3-none-any.whl", "3.12")
    assert fits("a-1-cp312-cp312-manylinux_2_17_x86_64.whl", "3.12")
    assert not fits("a-1-cp311-cp311-manylinux_2_17_x86_64.whl", "3.12")
    assert fits("a-1-cp39-abi3-manylinux_2_31_x86_64.whl", "3.12")
    assert not fits("a-1-cp313-abi3-manylinux_2_31_x86_64.whl", "3.12")


@pytest.mark.parametrize(
    "name, why",
    [
        ("vllm/_C.abi3.so", "compiled"),
        ("vllm/third_party/x/include/cute/a.hpp", "C/C++/CUDA source"),
        ("vllm/vllm-rs", "data file over 1 MiB"),
        ("vllm-0.30.0.dist-info/RECORD", "RECORD"),
        ("vllm/v1/attention/ops/triton_dsv41_sparse_mla.py", None),
        ("vllm-0.30.0.dist-info/METADATA", None),
    ],
)
def test_what_the_tree_leaves_out(name, why):
    size = 60 << 20 if name.endswith("vllm-rs") else 100
    assert gpu_payload._dropped(name, size) == why


@pytest.fixture(scope="module")
def payload(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("payload") / "payload.tar.gz"
    manifest = gpu_payload.build_payload(out, PYTHON, SITE)
    return out, manifest


@pytest.mark.slow
def test_archive(payload):
    out, manifest = payload
    assert out.stat().st_size <= gpu_payload.MAX_ARCHIVE_BYTES
    with tarfile.open(out) as tar:
        members = {m.name: m for m in tar.getmembers()}
        stored = json.loads(tar.extractfile(gpu_payload.MANIFEST).read())
    assert not [n for n in members if ".so" in Path(n).suffixes]
    # The root must not hold a vllm/ that would shadow the tree.
    assert not [n for n in members if n.startswith("vllm/")]
    assert stored["stubs"] == gpu_payload.STUBS
    for path in gpu_payload.STUBS:
        text = gpu_payload.STUB_SOURCES.get(path, "").encode()
        assert members[f"{gpu_payload.TREE}/{path}"].size == len(text)
    for wheel in stored["wheels"].values():
        assert wheel["file"] in members
    assert gpu_payload.ENTRY_POINT in members
    assert "tests/conftest.py" in members and "pyproject.toml" in members
    assert manifest["base"] == load_pin().VLLM_VERSION


def _link_host_packages(into: Path, exclude: set[str]) -> None:
    """Link this venv's distributions that the GPU host has (and what they
    require here) into ``into``, file tree by file tree; a folder shared with
    a distribution left out (``nvidia/``) is made and its parts linked."""
    from importlib import metadata

    dists = {
        gpu_payload.canonical(d.metadata["Name"]): d
        for d in metadata.distributions(path=[str(SITE)])
    }
    wanted = {n for n in gpu_payload.HOST_PACKAGES if n in dists}
    todo = list(wanted)
    while todo:
        for line in dists[todo.pop()].requires or []:
            req = Requirement(line)
            name = gpu_payload.canonical(req.name)
            if req.marker and not req.marker.evaluate({"extra": ""}):
                continue
            if name in dists and name not in wanted and name not in exclude:
                wanted.add(name)
                todo.append(name)

    def files(names) -> set[str]:
        return {
            str(f)
            for n in names
            for f in dists[n].files or []
            if not str(f).startswith("..")
        }

    ours = files(wanted)
    theirs = set()
    for path in files(set(dists) - wanted):
        parts = path.split("/")
        theirs |= {"/".join(parts[:i]) for i in range(1, len(parts) + 1)}

    def link(rel: str) -> None:
        if rel in theirs:
            prefix = rel + "/"
            for child in {
                p[len(prefix) :].split("/")[0] for p in ours if p.startswith(prefix)
            }:
                link(prefix + child)
            return
        dest = into / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            dest.symlink_to(SITE / rel)

    for top in {p.split("/")[0] for p in ours}:
        link(top)


@pytest.fixture(scope="module")
def gpu_host(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """(python, environment) of the imitation of the GPU host."""
    root = tmp_path_factory.mktemp("gpu-host")
    venv.create(root / "venv", with_pip=False, symlinks=True)
    _link_host_packages(root / "packages", set(gpu_payload.WHEELS))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    }
    env["PYTHONPATH"] = str(root / "packages")
    return root / "venv" / "bin" / "python", env


def _module_imports(paths: list[Path]) -> set[str]:
    """Every vllm and flashinfer module the files import, at any depth."""
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m.split(".")[0] in ("vllm", "flashinfer")}


@pytest.mark.slow
@pytest.mark.default_base_only
def test_gpu_tests_run_from_the_payload_on_the_imitated_host(
    payload, gpu_host, tmp_path
):
    archive, manifest = payload
    python, env = gpu_host
    unpacked = tmp_path / "p"
    with tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="data")
    tests = [t for t in GPU_TESTS if (unpacked / t).exists()]
    target = tmp_path / "site"
    report = tmp_path / "report.xml"

    def run_tests(*args) -> str:
        run = subprocess.run(
            [python, unpacked / gpu_payload.ENTRY_POINT, "--target", target,
             "--junitxml", report, "--", "-q", "-rs", *args],
            env=env, capture_output=True, text=True, cwd=tmp_path,
        )  # fmt: skip
        output = run.stdout + run.stderr
        assert run.returncode == 0, output[-6000:]
        return output

    # Every file collects: its imports close over the payload and the host.
    output = run_tests("--collect-only", *tests)
    assert re.search(rf"vllm_file: {re.escape(str(target.resolve()))}/vllm/", output)
    # The H100 step's files run: GPU tests skip, CPU tests pass. (The decode
    # file's CPU test takes minutes; the dev venv's suite runs it.)
    output = run_tests(*GPU_TESTS[:2])
    root = ET.parse(report).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    assert sum(int(s.get("errors", 0)) for s in suites) == 0, output[-6000:]
    assert sum(int(s.get("failures", 0)) for s in suites) == 0, output[-6000:]
    assert sum(int(s.get("tests", 0)) for s in suites) > 0

    # The imports inside the GPU tests' bodies, which skipped here, under the
    # CUDA platform the GPU host loads (an H200's capability): on CUDA some
    # modules ask compiled ops at import (vLLM's CUTLASS capability probes),
    # which the payload's stub must answer.
    sources = [unpacked / t for t in tests]
    sources += sorted((unpacked / "tests/v1/attention/dsv41").glob("*.py"))
    modules = _module_imports(sources)
    script = (
        "import importlib, importlib.util, sys\n"
        "import vllm.platforms\n"
        "from vllm.platforms.cuda import CudaPlatform\n"
        "from vllm.platforms.interface import DeviceCapability\n"
        "CudaPlatform.get_device_capability = classmethod(\n"
        "    lambda cls, device_id=0: DeviceCapability(9, 0))\n"
        "vllm.platforms.current_platform = CudaPlatform()\n"
        "assert vllm.platforms.current_platform.is_cuda()\n"
        "bad = []\n"
        f"for m in {sorted(modules)!r}:\n"
        "    parent = m.rpartition('.')[0]\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except ModuleNotFoundError as e:\n"
        "        # 'from package import name' names an attribute, not a module.\n"
        "        if e.name != m or not parent:\n"
        "            bad.append(f'{m}: {e!r}')\n"
        "    except Exception as e:\n"
        "        bad.append(f'{m}: {e!r}')\n"
        "print('\\n'.join(bad)); sys.exit(1 if bad else 0)\n"
    )
    env = {**env, "PYTHONPATH": os.pathsep.join([str(target), env["PYTHONPATH"]])}
    run = subprocess.run(
        [python, "-c", script], env=env, capture_output=True, text=True, cwd=unpacked
    )
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]


@pytest.mark.slow
def test_buildkite_runner_unpacks_the_payload(payload, tmp_path, monkeypatch):
    """gpu_tests.py --offline unpacks once and refuses another base's payload."""
    spec = importlib.util.spec_from_file_location(
        "gpu_tests", REPO / ".buildkite" / "scripts" / "gpu_tests.py"
    )
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    monkeypatch.setattr(runner, "OFFLINE", tmp_path)
    archive, manifest = payload
    root = runner.unpack_payload(archive)
    assert (root / gpu_payload.ENTRY_POINT).is_file()
    assert runner.unpack_payload(archive) == root
    other = "0.0.0" if manifest["base"] != "0.0.0" else "0.0.1"
    monkeypatch.setenv("VLLM_FORK_BASE", other)
    with pytest.raises(SystemExit, match="holds vLLM"):
        runner.unpack_payload(archive)
