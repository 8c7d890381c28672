# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The GPU-host bundle, through its command line, for a host made from this
dev venv.

``describe-host`` describes this interpreter; the host handed to ``build`` is
that description without two small distributions vLLM requires and with a
third at a version vLLM's requirements refuse. The one bundle built for it
must ship exactly those three, and install from parts that arrive out of
order, one of them corrupt, over several calls. Every expectation is read
independently of the tool: from ``importlib.metadata``, vLLM's requirements,
the fork wheel's zip entries and RECORD, and the parts' bytes.
"""

import base64
import csv
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.tags import sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from tools.fork.common import REPO, load_pin
from tools.fork.gpu_bundle import LEFT_OUT

# The bundle's code is the same for every base and the other base's wheel
# differs only in the files the wheel tests check; one base's build and
# install (about 45 s) is enough in CI.
pytestmark = [pytest.mark.slow, pytest.mark.default_base_only]

WAITING = 3
PART_MIB = 100
# Small distributions vLLM requires directly that the described host lacks.
LACKED = ("cbor2", "cachetools")
# A small pure-Python one vLLM requires with a lower bound; the host holds it
# at a version below that bound.
REFUSED = "prometheus-client"
REFUSED_HOST_VERSION = "0.0.1"
SHIPPED = (*LACKED, REFUSED)


def _tool(*args: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """``python -m tools.fork.gpu_bundle args`` as a host runs it."""
    return subprocess.run(
        [sys.executable, "-m", "tools.fork.gpu_bundle", *map(str, args)],
        cwd=cwd, capture_output=True, text=True,
    )  # fmt: skip


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _fork_version() -> str:
    pin = load_pin()
    return f"{pin.VLLM_VERSION}+{pin.LOCAL_VERSION_TAG}"


def _vllm_requirements() -> list[Requirement]:
    """vLLM's requirements that apply to this interpreter (no extras)."""
    reqs = [Requirement(text) for text in metadata.requires("vllm") or []]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def _installed() -> dict[str, str]:
    return {
        canonicalize_name(d.metadata["Name"]): d.version
        for d in metadata.distributions()
    }


@pytest.fixture(scope="module")
def description() -> dict[str, Any]:
    run = _tool("describe-host")
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def host_file(
    description: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """This interpreter as a host that lacks ``LACKED`` and holds ``REFUSED``
    at a version vLLM refuses."""
    packages = {
        name: version
        for name, version in description["packages"].items()
        if canonicalize_name(name) not in SHIPPED
    }
    packages[REFUSED] = REFUSED_HOST_VERSION
    path = tmp_path_factory.mktemp("host") / "host.json"
    path.write_text(json.dumps({**description, "packages": packages}))
    return path


@pytest.fixture(scope="module")
def bundle(
    host_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any]]:
    """(folder, bundle.json) of the one bundle built for ``host_file``."""
    out = tmp_path_factory.mktemp("tmp") / "bundle"
    run = _tool(
        "build", "--host", host_file, "--base", load_pin().VLLM_VERSION,
        "--part-mib", str(PART_MIB), "--out", out,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-6000:]
    manifest = json.loads((out / "bundle.json").read_text())
    # What build prints is the manifest less its parts.
    assert json.loads(run.stdout) == {k: v for k, v in manifest.items() if k != "parts"}
    return out, manifest


def _carry(bundle_dir: Path, into: Path, *parts: str) -> Path:
    """A device call's folder: ``bundle.json`` and the parts ``parts``."""
    into.mkdir(parents=True)
    for name in ("bundle.json", *parts):
        os.link(bundle_dir / name, into / name)
    return into


@pytest.fixture(scope="module")
def installed(
    bundle: tuple[Path, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The bundle installed from parts carried over several calls: the last
    part alone, then a corrupt copy of the first, then the ones between, then
    the first."""
    bundle_dir, manifest = bundle
    root = tmp_path_factory.mktemp("host-run")
    state, target = root / "state", root / "site"
    names = [p["file"] for p in manifest["parts"]]
    assert len(names) >= 2, "a bundle of one part cannot arrive out of order"

    def install(folder: Path) -> subprocess.CompletedProcess[str]:
        return _tool("install", folder, "--state", state, "--target", target)

    calls = {}
    calls["last"] = install(_carry(bundle_dir, root / "call-1", names[-1]))
    corrupt = root / "call-2"
    corrupt.mkdir()
    shutil.copyfile(bundle_dir / "bundle.json", corrupt / "bundle.json")
    data = bytearray((bundle_dir / names[0]).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (corrupt / names[0]).write_bytes(bytes(data))
    calls["corrupt"] = install(corrupt)
    calls["corrupt_kept"] = (state / names[0]).exists()
    if names[1:-1]:
        calls["middle"] = install(_carry(bundle_dir, root / "call-3", *names[1:-1]))
    start = time.monotonic()
    calls["first"] = install(_carry(bundle_dir, root / "call-4", names[0]))
    calls["first_s"] = time.monotonic() - start
    return {"state": state, "target": target, "names": names, "root": root, **calls}


@pytest.fixture(scope="module")
def report(installed: dict[str, Any]) -> dict[str, Any]:
    done = installed["first"]
    assert done.returncode == 0, done.stderr[-6000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def fork_wheel(bundle: tuple[Path, dict[str, Any]]) -> Path:
    wheel = REPO / "dist" / bundle[1]["wheel"]
    assert wheel.is_file()
    return wheel


def test_describe_host_is_this_interpreter(description: dict[str, Any]) -> None:
    assert description["python"] == platform.python_version()
    assert description["machine"] == platform.machine()
    packages = {canonicalize_name(k): v for k, v in description["packages"].items()}
    for name in ("vllm", "torch", *SHIPPED):
        assert packages[name] == metadata.version(name), name


def test_the_host_lacks_or_refuses_three_of_vllms_requirements() -> None:
    """The three distributions are vLLM's requirements, installed here; the
    host's version of ``REFUSED`` is one vLLM's requirement refuses."""
    reqs = {canonicalize_name(r.name): r for r in _vllm_requirements()}
    installed = _installed()
    for name in SHIPPED:
        assert name in reqs and name in installed, name
    refused = reqs[REFUSED].specifier
    assert not refused.contains(REFUSED_HOST_VERSION, prereleases=True)
    assert refused.contains(installed[REFUSED])


def test_manifest_ships_what_the_host_lacks(
    bundle: tuple[Path, dict[str, Any]],
) -> None:
    _, manifest = bundle
    pin = load_pin()
    assert manifest["base"] == pin.VLLM_VERSION
    assert manifest["python"] == platform.python_version()
    assert manifest["shipped"] == {name: metadata.version(name) for name in SHIPPED}
    assert "torch" in manifest["left_out"] and "torch" not in manifest["shipped"]
    installed = _installed()
    for name in LEFT_OUT:
        if name in installed:
            assert name in manifest["left_out"], name
            assert name not in manifest["shipped"], name
    assert not set(manifest["shipped"]) & set(pin.INCOMPATIBLE_PACKAGES)


def test_fork_wheel_in_the_manifest_is_the_one_in_dist(
    bundle: tuple[Path, dict[str, Any]], fork_wheel: Path
) -> None:
    _, manifest = bundle
    assert fork_wheel.name.startswith(f"vllm-{_fork_version()}-")
    assert manifest["wheel_sha256"] == _sha256(fork_wheel)


def test_parts_cover_the_bundle_and_hold_what_it_lists(
    bundle: tuple[Path, dict[str, Any]], fork_wheel: Path, tmp_path: Path
) -> None:
    bundle_dir, manifest = bundle
    parts = manifest["parts"]
    assert [p["file"] for p in parts] == [f"part-{i:02d}" for i in range(len(parts))]
    assert sorted(p.name for p in bundle_dir.iterdir()) == sorted(
        ["bundle.json", *(p["file"] for p in parts)]
    )
    whole, digest = tmp_path / "bundle.tar", hashlib.sha256()
    with whole.open("wb") as out:
        for part in parts:
            data = (bundle_dir / part["file"]).read_bytes()
            assert len(data) == part["bytes"] <= PART_MIB << 20, part["file"]
            assert hashlib.sha256(data).hexdigest() == part["sha256"], part["file"]
            digest.update(data)
            out.write(data)
    assert all(p["bytes"] == PART_MIB << 20 for p in parts[:-1])
    assert whole.stat().st_size == sum(p["bytes"] for p in parts)
    assert digest.hexdigest() == manifest["sha256"]

    with tarfile.open(whole) as tar:
        members = {m.name: m for m in tar.getmembers()}
        contents = json.loads(tar.extractfile("contents.json").read())
        requirements = tar.extractfile("wheels/requirements.txt").read().decode()
        wheel_digest = hashlib.file_digest(
            tar.extractfile(manifest["wheel"]), "sha256"
        ).hexdigest()
    assert contents == {
        k: v for k, v in manifest.items() if k not in ("parts", "sha256")
    }
    assert wheel_digest == _sha256(fork_wheel)
    assert sorted(requirements.splitlines()) == sorted(
        f"{n}=={v}" for n, v in manifest["shipped"].items()
    )
    # One wheel per shipped distribution, at its version, for this host.
    wheels = [n for n in members if n.startswith("wheels/") and n.endswith(".whl")]
    assert set(members) == {"contents.json", manifest["wheel"],
                            "wheels/requirements.txt", *wheels}  # fmt: skip
    here = set(sys_tags())
    found = {}
    for name in wheels:
        dist, version, _, tags = parse_wheel_filename(name.removeprefix("wheels/"))
        assert tags & here, name
        found[dist] = version
    assert found == {n: Version(v) for n, v in manifest["shipped"].items()}


def test_install_waits_for_parts_and_refuses_a_corrupt_one(
    installed: dict[str, Any],
) -> None:
    names = installed["names"]
    last = installed["last"]
    assert last.returncode == WAITING, last.stderr
    assert f"still missing: {', '.join(names[:-1])}" in last.stderr
    corrupt = installed["corrupt"]
    assert corrupt.returncode not in (0, WAITING), corrupt.stderr
    assert f"{names[0]} does not match bundle.json" in corrupt.stderr
    assert "Traceback" not in corrupt.stderr
    assert not installed["corrupt_kept"]
    if "middle" in installed:
        middle = installed["middle"]
        assert middle.returncode == WAITING, middle.stderr
        assert f"still missing: {names[0]}" in middle.stderr
    assert installed["first"].returncode == 0, installed["first"].stderr[-6000:]


def test_report_is_the_fork_from_the_target(
    installed: dict[str, Any], report: dict[str, Any], fork_wheel: Path
) -> None:
    target = installed["target"]
    assert report["vllm"] == _fork_version()
    assert report["torch"] == metadata.version("torch")
    assert report["python"] == platform.python_version()
    assert Path(report["vllm_file"]).resolve().is_relative_to(target.resolve())
    assert report["wheel_sha256"] == _sha256(fork_wheel)
    assert json.loads((target / "bundle-check.json").read_text()) == report
    # The target holds the fork wheel and the shipped wheels, nothing else.
    in_target = {
        canonicalize_name(d.metadata["Name"]): d.version
        for d in metadata.distributions(path=[str(target)])
    }
    assert in_target == {
        "vllm": _fork_version(),
        **{name: metadata.version(name) for name in SHIPPED},
    }


def test_report_tries_every_compiled_module_once(
    report: dict[str, Any], fork_wheel: Path
) -> None:
    with zipfile.ZipFile(fork_wheel) as zf:
        compiled = {
            ".".join([*Path(n).parent.parts, Path(n).name.split(".")[0]])
            for n in zf.namelist()
            if n.startswith("vllm/") and n.endswith(".so")
        }
    assert compiled
    loaded, failed = report["loaded"], report["failed"]
    assert len(loaded) == len(set(loaded))
    assert not set(loaded) & set(failed)
    assert set(loaded) | set(failed) == compiled
    for module, why in failed.items():
        assert why.strip(), module


def test_pip_check_names_what_this_host_lacks(report: dict[str, Any]) -> None:
    """pip's check sees the host's packages and the target: what vLLM
    requires and neither holds (here the packages that do not load beside a
    CPU torch) is reported, and nothing the bundle shipped is."""
    lines = report["pip_check"]
    assert isinstance(lines, list) and all(isinstance(x, str) for x in lines)
    installed = _installed()
    absent = {
        canonicalize_name(r.name)
        for r in _vllm_requirements()
        if canonicalize_name(r.name) not in installed
    }
    reported = {
        canonicalize_name(line.split(" requires ")[1].split(",")[0])
        for line in lines
        if line.startswith("vllm ") and line.endswith(", which is not installed.")
    }
    # The dev venvs leave out what does not load beside a CPU torch.
    assert absent, "this venv holds every requirement of vLLM: nothing to report"
    assert absent <= reported, (absent, lines)
    for name in SHIPPED:
        assert not [x for x in lines if canonicalize_name(x.split()[0]) == name]
        assert not [x for x in lines if f"requires {name}," in x.lower()]


def _record(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as zf:
        name = f"vllm-{_fork_version()}.dist-info/RECORD"
        rows = csv.reader(io.StringIO(zf.read(name).decode()))
        return {row[0]: row[1] for row in rows if row[1]}


def test_installed_files_are_the_wheels_bytes(
    installed: dict[str, Any], report: dict[str, Any], fork_wheel: Path
) -> None:
    record = _record(fork_wheel)
    with zipfile.ZipFile(fork_wheel) as zf:
        sizes = {i.filename: i.file_size for i in zf.infolist()}
    smallest_so = min((n for n in record if n.endswith(".so")), key=sizes.__getitem__)
    paths = ["vllm/__init__.py", smallest_so]
    edited = "vllm/models/deepseek_v41/attention.py"
    if edited in record:
        paths.append(edited)
    for rel in paths:
        data = (installed["target"] / rel).read_bytes()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
        assert record[rel] == "sha256=" + digest.rstrip(b"=").decode(), rel


def _run(installed: dict[str, Any], *command: str) -> subprocess.CompletedProcess[str]:
    return _tool(
        "run", "--state", installed["state"], "--target", installed["target"],
        "--", *command,
    )  # fmt: skip


def test_run_uses_the_target_from_a_copy_of_the_checkout(
    installed: dict[str, Any], report: dict[str, Any]
) -> None:
    script = (
        "import json, os, vllm\n"
        "print(json.dumps({'vllm': vllm.__file__, 'cwd': os.getcwd(),\n"
        "                  'base': os.environ.get('VLLM_FORK_BASE')}))\n"
    )
    run = _run(installed, sys.executable, "-c", script)
    assert run.returncode == 0, run.stderr[-4000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert Path(seen["vllm"]).resolve().is_relative_to(installed["target"].resolve())
    assert seen["base"] == load_pin().VLLM_VERSION
    cwd = Path(seen["cwd"])
    assert cwd.resolve() == (installed["state"] / "checkout").resolve()
    assert (cwd / "tests" / "tools").is_dir() and (cwd / "pyproject.toml").is_file()
    assert not (cwd / "vllm").exists()


def test_run_passes_the_exit_status_through(
    installed: dict[str, Any], report: dict[str, Any]
) -> None:
    assert _run(installed, sys.executable, "-c", "raise SystemExit(7)").returncode == 7


def test_a_second_install_reuses_the_target(
    bundle: tuple[Path, dict[str, Any]],
    installed: dict[str, Any],
    report: dict[str, Any],
) -> None:
    bundle_dir, manifest = bundle
    target = installed["target"]
    stamp = target / ".gpu-bundle"
    assert stamp.read_text() == manifest["sha256"]
    before = (target / "vllm" / "__init__.py").stat()
    # The state holds every part: a call with only bundle.json completes.
    folder = _carry(bundle_dir, installed["root"] / "call-again")
    start = time.monotonic()
    again = _tool("install", folder, "--state", installed["state"], "--target", target)
    took = time.monotonic() - start
    assert again.returncode == 0, again.stderr[-4000:]
    after = (target / "vllm" / "__init__.py").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert stamp.read_text() == manifest["sha256"]
    assert json.loads(again.stdout)["vllm"] == _fork_version()
    # Only the check runs again, not pip.
    assert took < installed["first_s"], (took, installed["first_s"])


def test_build_refuses_empty_parts(tmp_path: Path) -> None:
    host = tmp_path / "host.json"
    host.write_text("{}")
    run = _tool("build", "--host", host, "--part-mib", "0", "--out", tmp_path / "b")
    assert run.returncode == 2
    assert "usage:" in run.stderr
    assert "--part-mib must be at least 1" in run.stderr
    assert not (tmp_path / "b").exists()


def test_install_needs_the_bundles_folder(tmp_path: Path) -> None:
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "part-00").write_bytes(b"x")
    state = tmp_path / "state"
    run = _tool("install", tmp_path / "parts", "--state", state,
                "--target", tmp_path / "site")  # fmt: skip
    assert run.returncode == 2
    assert "has no bundle.json" in run.stderr
    assert "Traceback" not in run.stderr
    assert not state.exists()


def test_the_target_processes_its_pth_files(tmp_path: Path) -> None:
    """A package that puts its modules on the path through a .pth file (the
    CuTe DSL's ``cutlass``) imports from the bundle's target."""
    from tools.fork.gpu_bundle import environment, make_site_dir

    target = tmp_path / "site"
    (target / "hidden").mkdir(parents=True)
    (target / "hidden" / "found_by_pth.py").write_text("ANSWER = 42\n")
    (target / "a.pth").write_text(
        f"import sys, os; sys.path.append(os.path.join({str(target)!r}, 'hidden'))\n"
    )
    probe = [sys.executable, "-c", "import found_by_pth; print(found_by_pth.ANSWER)"]
    env = environment(target, {"base": load_pin().VLLM_VERSION})
    before = subprocess.run(probe, env=env, capture_output=True, text=True)
    assert before.returncode != 0  # PYTHONPATH alone skips .pth files
    make_site_dir(target)
    after = subprocess.run(probe, env=env, capture_output=True, text=True)
    assert after.stdout.strip() == "42", after.stderr
