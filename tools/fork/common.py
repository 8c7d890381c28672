# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""What the fork's environment and build scripts share.

These scripts run before any vLLM is installed, so they use only the standard
library and read the pin straight from its file.
"""

import hashlib
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
NEW_MODULES = REPO / "vllm"
# The fork's own top-level packages, shipped in the fork wheel beside
# ``vllm`` and linked into the dev venvs; not vLLM's, not in the patch series.
FORK_PACKAGES = (REPO / "vllm_dsv41_plan",)
PIN_FILE = REPO / "tools" / "fork" / "pin.py"
WHEEL_CACHE = REPO / ".cache" / "wheels"
DEV_REQUIREMENTS = REPO / "requirements" / "dev.txt"


def load_pin(base: str | None = None) -> SimpleNamespace:
    """The pin of one upstream base (``base``, else ``VLLM_FORK_BASE``, else
    the default), read from the pin module without importing vLLM (which may
    not be installed yet). ``VLLM_VERSION`` names the base."""
    values = runpy.run_path(str(PIN_FILE))
    base = base or os.environ.get(values["BASE_ENV"]) or values["DEFAULT_BASE"]
    if base not in values["BASES"]:
        raise SystemExit(
            f"{values['BASE_ENV']}={base} is not a base of the fork; "
            f"choose one of {', '.join(values['BASES'])} "
            f"({PIN_FILE.relative_to(REPO)})."
        )
    shared = {k: v for k, v in values.items() if k.isupper() and k != "BASES"}
    shared["ARCHES"] = tuple(values["BASES"][base]["WHEELS"])
    return SimpleNamespace(VLLM_VERSION=base, **shared, **values["BASES"][base])


def all_bases() -> list[str]:
    return list(runpy.run_path(str(PIN_FILE))["BASES"])


def select_base(base: str | None) -> SimpleNamespace:
    """Make ``base`` the base of this process and of everything it runs (the
    scripts' ``--base`` flag); None keeps ``VLLM_FORK_BASE`` or the default."""
    pin = load_pin(base)
    os.environ[pin.BASE_ENV] = pin.VLLM_VERSION
    return pin


def add_base_argument(parser) -> None:
    parser.add_argument(
        "--base",
        choices=all_bases(),
        default=None,
        help="upstream vLLM release to work on (default: $VLLM_FORK_BASE, "
        "else the pin's default)",
    )


def venv_dir(name: str) -> Path:
    """``REPO/name`` for the default base, ``REPO/name-<version>`` for the
    others, so each base has its own venvs."""
    pin = load_pin()
    suffix = "" if pin.VLLM_VERSION == pin.DEFAULT_BASE else f"-{pin.VLLM_VERSION}"
    return REPO / f"{name}{suffix}"


def log(message: str) -> None:
    print(f"[fork] {message}", file=sys.stderr, flush=True)


def run(*cmd: str | Path, **kwargs) -> None:
    log(" ".join(str(c) for c in cmd))
    subprocess.run([str(c) for c in cmd], check=True, **kwargs)


# Waits before each retry of a pip command. A fresh CI machine downloads a few
# GB from the package index; one dropped connection must not fail the run.
PIP_RETRY_WAITS_S = (15, 60)
# How many lines of a failed pip's output the error carries (the cause is last).
PIP_ERROR_TAIL_LINES = 40


def run_pip(python: Path, *args: str | Path, env: dict[str, str]) -> None:
    """Run ``python -m pip args``, retrying a failed run, and fail with the
    end of pip's own output so that a CI log shows why it failed."""
    cmd = [str(python), "-m", "pip", "--disable-pip-version-check"]
    cmd += [str(a) for a in args]
    attempts = 1 + len(PIP_RETRY_WAITS_S)
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
    tail = [line for line in lines if not line.startswith("WARNING:")]
    tail = tail[-PIP_ERROR_TAIL_LINES:]
    # The first line is what a test summary shows: put pip's error there too.
    errors = [line for line in tail if line.startswith("ERROR:")]
    raise RuntimeError(
        f"pip failed {attempts} times (exit {result.returncode}): "
        + " ".join(str(a) for a in args)
        + (f" -- {errors[-1]}" if errors else "")
        + "\n--- end of pip's output ---\n"
        + "\n".join(tail)
    )


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def upstream_wheel(arch: str | None = None) -> Path:
    """The pinned upstream vLLM wheel for ``arch`` (default: the pin's
    ``DEFAULT_ARCH``), downloaded once and checked every time.

    A wheel whose sha256 differs from the pin is deleted and the build stops:
    the fork wheel must be the pinned upstream's bytes plus the fork's edits.
    """
    pin = load_pin()
    arch = arch or pin.DEFAULT_ARCH
    if arch not in pin.WHEELS:
        raise SystemExit(
            f"no pinned vLLM {pin.VLLM_VERSION} wheel for {arch}; the pin has "
            f"{', '.join(pin.WHEELS)}"
        )
    name, sha256 = pin.WHEELS[arch]
    path = WHEEL_CACHE / name
    if not path.exists():
        WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
        platform_tag = name.rsplit("-", 1)[-1].removesuffix(".whl")
        # pip downloads into a temporary folder and moves the file into
        # --dest when it is complete, so an interrupted download leaves no
        # partial wheel and two builds at once do not collide.
        run_pip(
            Path(sys.executable), "download", "--no-deps", "--only-binary=:all:",
            "--platform", platform_tag, "--dest", WHEEL_CACHE,
            f"vllm=={pin.VLLM_VERSION}", env=dict(os.environ),
        )  # fmt: skip
    if not path.exists():
        raise SystemExit(
            f"pip did not produce {name}; the fork is built from that "
            f"manylinux wheel of vLLM {pin.VLLM_VERSION}."
        )
    actual = sha256_of(path)
    if actual != sha256:
        path.unlink()
        raise SystemExit(
            f"{name} has sha256 {actual}, but the pin in "
            f"{PIN_FILE.relative_to(REPO)} says {sha256}. "
            "The download was deleted; run again, and if it still differs the "
            "package index serves another file than the one the fork was built on."
        )
    return path


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def provision_venv(
    venv: Path, vllm_requirement: str | Path, extra_args: tuple[str | Path, ...] = ()
) -> None:
    """Create ``venv`` (or update it in place) with the pinned torch, the given
    vLLM wheel and the pinned FlashInfer (plus ``extra_args`` for pip).

    torch is installed first and on its own so that pip takes the pinned
    release and never a larger build; the packages vLLM's metadata pulls in
    that break beside it are removed afterwards.
    """
    pin = load_pin()
    if not venv_python(venv).exists():
        run(sys.executable, "-m", "venv", venv)
    python = venv_python(venv)
    # No download cache: beside the venvs it would double the disk that the
    # CUDA wheels of vLLM 0.33's requirements take.
    env = {**os.environ, "PIP_PROGRESS_BAR": "off", "PIP_NO_CACHE_DIR": "1"}
    run_pip(python, "install", "-q", f"torch=={pin.TORCH_VERSION}", env=env)
    run_pip(
        python, "install", "-q", vllm_requirement,
        f"flashinfer-python=={pin.FLASHINFER_VERSION}",
        f"torch=={pin.TORCH_VERSION}", *extra_args, env=env,
    )  # fmt: skip
    run_pip(python, "uninstall", "-q", "-y", *pin.INCOMPATIBLE_PACKAGES, env=env)


def site_packages(venv: Path) -> Path:
    query = "import sysconfig; print(sysconfig.get_path('purelib'))"
    out = subprocess.run(
        [venv_python(venv), "-c", query], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip())


def _files_under(root: Path) -> list[Path]:
    return sorted(
        p.relative_to(REPO)
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def new_module_files() -> list[Path]:
    """Every file of the fork's new modules (under ``vllm/``), relative to the
    repository root."""
    return _files_under(NEW_MODULES)


def fork_package_files() -> list[Path]:
    """Every file of the fork's own top-level packages (``FORK_PACKAGES``),
    relative to the repository root."""
    return [p for root in FORK_PACKAGES for p in _files_under(root)]
