# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""What the fork's environment and build scripts share.

They run before any vLLM is installed, so this uses only the standard library
and reads the pin straight from its file."""

import base64
import fnmatch
import functools
import hashlib
import os
import runpy
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
NEW_MODULES = REPO / "vllm"
# The fork's own top-level packages, shipped in the fork wheel beside
# ``vllm`` and linked into the dev venvs; not vLLM's, not in the patch series.
FORK_PACKAGES = (REPO / "vllm_dsv41_plan",)
PIN_FILE = REPO / "tools" / "fork" / "pin.py"
SERIES_FILE = REPO / "tools" / "fork" / "series.toml"
WHEEL_CACHE = REPO / ".cache" / "wheels"
DEV_REQUIREMENTS = REPO / "requirements" / "dev.txt"
# In the main job's venv of a base: the sha256 of the fork wheel it holds,
# written once the venv is complete.
WHEEL_VENV_STAMP = ".fork-wheel-sha256"
# A fresh CI machine downloads a few GB from the package index: one dropped
# connection must not fail the run, so pip is retried after these waits.
PIP_RETRY_WAITS_S = (15, 60)
PIP_ERROR_TAIL_LINES = 40  # of a failed pip's output (the cause is last)


def all_bases() -> list[str]:
    return list(runpy.run_path(str(PIN_FILE))["BASES"])


def load_pin(base: str | None = None) -> SimpleNamespace:
    """The pin of ``base`` (else ``VLLM_FORK_BASE``, else the default)."""
    values = runpy.run_path(str(PIN_FILE))
    base = base or os.environ.get(values["BASE_ENV"]) or values["DEFAULT_BASE"]
    if base not in values["BASES"]:
        raise SystemExit(
            f"{values['BASE_ENV']}={base} is not a base of the fork; choose one of "
            f"{', '.join(values['BASES'])} ({PIN_FILE.relative_to(REPO)})."
        )
    shared = {k: v for k, v in values.items() if k.isupper() and k != "BASES"}
    shared["ARCHES"] = tuple(values["BASES"][base]["WHEELS"])
    return SimpleNamespace(VLLM_VERSION=base, **shared, **values["BASES"][base])


def select_base(base: str | None) -> SimpleNamespace:
    """Make ``base`` the base of this process and of everything it runs."""
    pin = load_pin(base)
    os.environ[pin.BASE_ENV] = pin.VLLM_VERSION
    return pin


def add_base_argument(parser, **kwargs) -> None:
    default = "(default: $VLLM_FORK_BASE, else the pin's default)"
    kwargs.setdefault("help", f"upstream vLLM release to work on {default}")
    parser.add_argument("--base", choices=all_bases(), **kwargs)


def venv_dir(name: str) -> Path:
    """Each base has its own venvs: ``name``, else ``name-<version>``."""
    pin = load_pin()
    suffix = "" if pin.VLLM_VERSION == pin.DEFAULT_BASE else f"-{pin.VLLM_VERSION}"
    return REPO / f"{name}{suffix}"


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def log(message: str) -> None:
    print(f"[fork] {message}", file=sys.stderr, flush=True)


def run(*cmd: str | Path, **kwargs) -> None:
    log(" ".join(str(c) for c in cmd))
    subprocess.run([str(c) for c in cmd], check=True, **kwargs)


def run_pip(python: Path, *args: str | Path, env: dict[str, str]) -> None:
    """``python -m pip args``, retried; the last try's error ends up on the
    first line of the exception (what a CI test summary shows)."""
    cmd = [str(c) for c in (python, "-m", "pip", "--disable-pip-version-check", *args)]
    for wait in (*PIP_RETRY_WAITS_S, None):
        log(" ".join(cmd))
        result = subprocess.run(cmd, env=env, capture_output=True, text=True)
        sys.stderr.write(result.stderr)
        if result.returncode == 0:
            return
        if wait is not None:
            log(f"pip failed (exit {result.returncode}); retrying in {wait} s")
            time.sleep(wait)
    # pip's warnings (unreachable extra indexes, say) are not why it failed.
    lines = (result.stdout + result.stderr).splitlines()
    tail = [x for x in lines if not x.startswith("WARNING:")][-PIP_ERROR_TAIL_LINES:]
    error = next((f" -- {x}" for x in reversed(tail) if x.startswith("ERROR:")), "")
    raise RuntimeError(
        f"pip failed {len(PIP_RETRY_WAITS_S) + 1} times (exit {result.returncode}): "
        f"{' '.join(cmd[4:])}{error}\n--- end of pip's output ---\n" + "\n".join(tail)
    )


def record_row(name: str, data: bytes) -> tuple[str, str, str]:
    """A wheel RECORD row: path, urlsafe base64 sha256 without padding, size."""
    sha = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
    return (name, f"sha256={sha.rstrip(b'=').decode()}", str(len(data)))


def sha256_of(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def upstream_wheel(arch: str | None = None) -> Path:
    """The pinned upstream wheel for ``arch``, downloaded once and checked every
    time: the fork wheel must be the pinned upstream's bytes plus the edits."""
    pin = load_pin()
    if (arch := arch or pin.DEFAULT_ARCH) not in pin.WHEELS:
        raise SystemExit(
            f"no pinned vLLM {pin.VLLM_VERSION} wheel for {arch}; the pin has "
            f"{', '.join(pin.WHEELS)}"
        )
    name, sha256 = pin.WHEELS[arch]
    path = WHEEL_CACHE / name
    if not path.exists():
        WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
        platform_tag = name.rsplit("-", 1)[-1].removesuffix(".whl")
        # pip moves the file into --dest once complete, so an interrupted
        # download leaves no partial wheel and two builds do not collide.
        # --dest is the cache: pip's own would hold the wheel a second time.
        run_pip(
            Path(sys.executable), "download", "--no-deps", "--only-binary=:all:",
            "--platform", platform_tag, "--dest", WHEEL_CACHE,
            f"vllm=={pin.VLLM_VERSION}", env={**os.environ, "PIP_NO_CACHE_DIR": "1"},
        )  # fmt: skip
    if not path.exists():
        raise SystemExit(
            f"pip did not produce {name}; the fork is built from that manylinux "
            f"wheel of vLLM {pin.VLLM_VERSION}."
        )
    if (actual := sha256_of(path)) != sha256:
        path.unlink()
        raise SystemExit(
            f"{name} has sha256 {actual}, but the pin in "
            f"{PIN_FILE.relative_to(REPO)} says {sha256}. "
            "The download was deleted; run again, and if it still differs the "
            "package index serves another file than the one the fork was built on."
        )
    return path


def clone_venv(source: Path, venv: Path) -> None:
    """Make ``venv`` hold ``source``'s packages as hard links: no download, no
    disk. A linked file must never be written in place, or ``source`` changes
    too: pip removes and installs files by renaming and creating them, Python
    replaces the bytecode it writes, and the files that name the venv's own
    path (scripts, activate files, ``pyvenv.cfg``) are written anew here."""
    run("rm", "-rf", venv)
    run("cp", "-al", source, venv)
    old, new = str(source.resolve()).encode(), str(venv.resolve()).encode()
    for path in [venv / "pyvenv.cfg", *(venv / "bin").iterdir()]:
        if not path.is_file() or path.is_symlink():
            continue
        if old not in (data := path.read_bytes()):
            continue
        mode = path.stat().st_mode
        path.unlink()
        path.write_bytes(data.replace(old, new))
        path.chmod(mode)


def provision_venv(
    venv: Path, vllm_requirement: str | Path, extra_args: tuple[str | Path, ...] = ()
) -> None:
    """Create or update ``venv`` with the pinned torch, ``vllm_requirement`` and
    FlashInfer; torch first and alone, so pip never takes a larger build."""
    pin = load_pin()
    if not (python := venv_python(venv)).exists():
        run(sys.executable, "-m", "venv", venv)
    # No download cache: beside the venvs it would double the disk that the
    # CUDA wheels of vLLM 0.34's requirements take.
    env = {**os.environ, "PIP_PROGRESS_BAR": "off", "PIP_NO_CACHE_DIR": "1"}
    torch = f"torch=={pin.TORCH_VERSION}"
    run_pip(python, "install", "-q", torch, env=env)
    flashinfer = f"flashinfer-python=={pin.FLASHINFER_VERSION}"
    requirements: tuple[str | Path, ...] = (vllm_requirement,)
    if str(vllm_requirement).endswith(".whl") and (
        pinned := upstream_requirements(Path(vllm_requirement))
    ):
        # Upstream's FlashInfer pin is not published: install vLLM alone and
        # its requirements with the pin's FlashInfer in place of upstream's.
        run_pip(python, "install", "-q", "--no-deps", vllm_requirement, env=env)
        requirements = tuple(pinned)
    run_pip(
        python, "install", "-q", *requirements, flashinfer, torch, *extra_args, env=env
    )
    # What vLLM pulls in that breaks beside that torch.
    run_pip(python, "uninstall", "-q", "-y", *pin.INCOMPATIBLE_PACKAGES, env=env)


def wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = (n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return zf.read(name).decode()


def fork_metadata(metadata: str) -> str:
    """``metadata`` requiring the pin's FlashInfer where upstream names one
    the package index does not publish."""
    pin = load_pin()
    upstream = getattr(pin, "UPSTREAM_FLASHINFER_VERSION", None)
    if upstream is None:
        return metadata
    old = f"Requires-Dist: flashinfer-python=={upstream}\n"
    new = f"Requires-Dist: flashinfer-python=={pin.FLASHINFER_VERSION}\n"
    if new in metadata:
        return metadata  # already the fork's
    if old not in metadata:
        raise SystemExit(
            f"vLLM {pin.VLLM_VERSION}'s metadata no longer requires "
            f"flashinfer-python=={upstream}; update {PIN_FILE.relative_to(REPO)}."
        )
    return metadata.replace(old, new)


def upstream_requirements(wheel: Path) -> list[str]:
    """The requirements of ``wheel`` without extras, with the pin's FlashInfer,
    when they differ from the wheel's own (else empty)."""
    metadata = wheel_metadata(wheel)
    if (fixed := fork_metadata(metadata)) == metadata:
        return []
    prefix = "Requires-Dist: "
    return [
        line[len(prefix) :]
        for line in fixed.splitlines()
        if line.startswith(prefix) and "extra ==" not in line
    ]


@functools.cache
def series() -> dict:
    """tools/fork/series.toml: each base's pull requests and each concern's files."""
    import tomllib  # Python 3.11: only the build tools read it, not the wheel writer

    return tomllib.loads(SERIES_FILE.read_text())


def on_base(path: str | Path, base: str | None = None) -> bool:
    """Whether the repository file ``path`` belongs to ``base`` (default: the
    pin's): a file some concern lists does only where one of them is in the
    base's series (the page policy and its tests are the backport's alone)."""
    base = base or load_pin().VLLM_VERSION
    if not within_bases(path, base):
        return False
    listed = [
        concern
        for concern, patterns in series()["files"].items()
        if any(fnmatch.fnmatch(str(path), p) for p in patterns)
    ]
    prs = series()["pull_requests"][base].values()
    return not listed or any(c in listed for pr in prs for c in pr)


def within_bases(path: str | Path, base: str) -> bool:
    """False for a file series.toml's ``only_on`` keeps to other bases than
    ``base`` (a module whose upstream hooks only some bases' edits add)."""
    only_on = series().get("only_on", {})
    return all(
        base in bases
        for pattern, bases in only_on.items()
        if fnmatch.fnmatch(str(path), pattern)
    )


def new_module_files(
    roots: tuple[Path, ...] = (NEW_MODULES,), base: str | None = None
) -> list[Path]:
    """Files under ``roots`` on ``base`` (default: the pin's), relative to
    REPO, sorted per root, no bytecode."""
    files = [p for root in roots for p in sorted(root.rglob("*")) if p.is_file()]
    keep = (p for p in files if "__pycache__" not in p.parts and p.suffix != ".pyc")
    return [p.relative_to(REPO) for p in keep if on_base(p.relative_to(REPO), base)]


def fork_package_files() -> list[Path]:
    return new_module_files(FORK_PACKAGES)
