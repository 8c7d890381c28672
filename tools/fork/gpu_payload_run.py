# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Run the GPU tests from an unpacked GPU payload (``run_gpu_tests.py`` at the
payload's root; built by tools/fork/gpu_payload.py).

    tar xzf gpu-payload-vllm-0.30.0-cp312.tar.gz -C /tmp/p
    python3 /tmp/p/run_gpu_tests.py [--target /tmp/p-site] [--junitxml R.xml] \
        -- tests/kernels/attention/test_triton_dsv41_sparse_mla.py

1. Installs the payload's wheels with pip (no index, no dependency
   resolution) into ``--target`` and copies the fork's vLLM tree beside them;
   a target that already holds this payload is reused.
2. Puts the target first on ``PYTHONPATH`` and prints what the tests will
   import: Python, torch, Triton, vLLM (failing unless vLLM comes from the
   target), FlashInfer and the GPU.
3. Runs pytest from the payload's root with the given arguments and a JUnit
   report, and exits with pytest's status. ``--check-only`` stops after 2.

It uses only the standard library: the host has Python, torch and pytest, and
nothing of vLLM.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
MANIFEST = ROOT / "payload.json"
STAMP = ".gpu-payload"

# Runs in the test environment; prints one JSON object.
CHECK = """
import json, sys
import torch, triton, vllm
from importlib import metadata
info = {
    "python": sys.version.split()[0],
    "torch": torch.__version__,
    "triton": triton.__version__,
    "vllm": metadata.version("vllm"),
    "vllm_file": vllm.__file__,
    "flashinfer": metadata.version("flashinfer-python"),
    "gpu": None,
}
if torch.cuda.is_available():
    major, minor = torch.cuda.get_device_capability()
    info["gpu"] = f"{torch.cuda.get_device_name()} (SM{major}{minor})"
print(json.dumps(info))
"""


def log(message: str) -> None:
    print(f"[gpu-payload] {message}", file=sys.stderr, flush=True)


def payload_id() -> str:
    return hashlib.sha256(MANIFEST.read_bytes()).hexdigest()


def install(target: Path, manifest: dict) -> None:
    """The payload's wheels and vLLM tree in ``target``, unless it holds them."""
    stamp = target / STAMP
    if stamp.exists() and stamp.read_text() == payload_id():
        log(f"reusing {target}: it holds this payload")
        return
    shutil.rmtree(target, ignore_errors=True)
    wheels = [str(ROOT / w["file"]) for w in manifest["wheels"].values()]
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check"]
    cmd += ["-q", "--no-index", "--no-deps", "--target", str(target), *wheels]
    log(f"installing {len(wheels)} wheels into {target}")
    subprocess.run(cmd, check=True)
    shutil.copytree(ROOT / manifest["tree"], target, dirs_exist_ok=True)
    stamp.write_text(payload_id())


def environment(target: Path, manifest: dict) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(target), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    # The tests and the tools read the base from here.
    env["VLLM_FORK_BASE"] = manifest["base"]
    return env


def check(target: Path, env: dict[str, str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHECK],
        env=env,
        cwd=ROOT,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    info = json.loads(out.strip().splitlines()[-1])
    for key, value in info.items():
        log(f"{key}: {value}")
    if not Path(info["vllm_file"]).resolve().is_relative_to(target):
        raise SystemExit(f"vllm was imported from {info['vllm_file']}, not {target}")
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--target",
        type=Path,
        default=ROOT / "site-packages",
        help="where the packages go (default: site-packages/ in the payload)",
    )
    parser.add_argument(
        "--junitxml",
        type=Path,
        default=ROOT / "reports" / "gpu-tests.xml",
        help="JUnit report of the pytest run",
    )
    parser.add_argument(
        "--check-only", action="store_true", help="install and check, run no tests"
    )
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's")
    args = parser.parse_args()

    manifest = json.loads(MANIFEST.read_text())
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if running != manifest["python"]:
        raise SystemExit(
            f"this payload is for CPython {manifest['python']}, this is {running}; "
            f"build one with tools/fork/gpu_payload.py --python {running}"
        )
    target = args.target.resolve()
    install(target, manifest)
    env = environment(target, manifest)
    check(target, env)
    if args.check_only:
        return
    report = args.junitxml.resolve()
    report.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pytest", f"--junitxml={report}"]
    status = subprocess.run([*cmd, *args.pytest_args], env=env, cwd=ROOT).returncode
    log(f"pytest exited {status}; report {report}")
    sys.exit(status)


if __name__ == "__main__":
    main()
