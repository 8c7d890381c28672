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
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "vllm"
PIN_FILE = OVERLAY / "plugins" / "deepseek_v4_1_blackwell" / "pin.py"
WHEEL_CACHE = REPO / ".cache" / "wheels"
DEV_REQUIREMENTS = REPO / "requirements" / "dev.txt"


def load_pin() -> SimpleNamespace:
    """The upstream pin, read from the overlay's pin module without importing
    vLLM (which may not be installed yet)."""
    values = runpy.run_path(str(PIN_FILE))
    return SimpleNamespace(**{k: v for k, v in values.items() if k.isupper()})


def log(message: str) -> None:
    print(f"[fork] {message}", file=sys.stderr, flush=True)


def run(*cmd: str | Path, **kwargs) -> None:
    log(" ".join(str(c) for c in cmd))
    subprocess.run([str(c) for c in cmd], check=True, **kwargs)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def upstream_wheel() -> Path:
    """The pinned upstream vLLM wheel, downloaded once and checked every time.

    A wheel whose sha256 differs from the pin is deleted and the build stops:
    the fork wheel must be the pinned upstream's bytes plus the overlay.
    """
    pin = load_pin()
    path = WHEEL_CACHE / pin.VLLM_WHEEL
    if not path.exists():
        WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
        run(
            sys.executable, "-m", "pip", "download", "--no-deps",
            "--only-binary=:all:", "--dest", WHEEL_CACHE,
            f"vllm=={pin.VLLM_VERSION}",
        )  # fmt: skip
    if not path.exists():
        raise SystemExit(
            f"pip did not produce {pin.VLLM_WHEEL}; the fork is built from the "
            "x86_64 manylinux wheel of vLLM {pin.VLLM_VERSION}."
        )
    actual = sha256_of(path)
    if actual != pin.VLLM_WHEEL_SHA256:
        path.unlink()
        raise SystemExit(
            f"{pin.VLLM_WHEEL} has sha256 {actual}, but the pin in "
            f"{PIN_FILE.relative_to(REPO)} says {pin.VLLM_WHEEL_SHA256}. "
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
    pip = [venv_python(venv), "-m", "pip", "--disable-pip-version-check"]
    env = {**os.environ, "PIP_PROGRESS_BAR": "off"}
    run(*pip, "install", "-q", f"torch=={pin.TORCH_VERSION}", env=env)
    run(
        *pip, "install", "-q", vllm_requirement,
        f"flashinfer-python=={pin.FLASHINFER_VERSION}",
        f"torch=={pin.TORCH_VERSION}", *extra_args, env=env,
    )  # fmt: skip
    run(*pip, "uninstall", "-q", "-y", *pin.INCOMPATIBLE_PACKAGES, env=env)


def site_packages(venv: Path) -> Path:
    query = "import sysconfig; print(sysconfig.get_path('purelib'))"
    out = subprocess.run(
        [venv_python(venv), "-c", query], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip())


def overlay_files() -> list[Path]:
    """Every source file of the overlay, relative to the repository root."""
    return sorted(
        p.relative_to(REPO)
        for p in OVERLAY.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )
