# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Collect the engine bundle's parts on the GPU host; once all are there,
install and check it (the bundle is built by tools/fork/engine_bundle.py).

    python3 tools/fork/engine_bundle_receive.py PARTS_DIR \
        [--state /tmp/engine-bundle] [--target /tmp/engine-site]

Each call takes the parts in ``PARTS_DIR`` (``bundle.json`` and any
``part-NN``) that match ``bundle.json``'s checksums and keeps them in
``--state``. A state left by another bundle is wiped first, so a new bundle,
or a chain broken by a machine that was given back (the new one starts
empty), starts over cleanly; the output says which parts are still missing.
Exit status: 0 when the bundle is installed and checked, 3 while parts are
missing, 1 on an error.

When the last part arrives it checks the whole bundle's sha256, unpacks it,
installs the GPU payload (its own entry point), the fork's compiled libraries
(replacing the payload's stand-ins) and the engine's wheels into
``--target``; then, in a fresh interpreter with the target on
``PYTHONPATH``, it imports vLLM, loads each library, and reports versions
and what could not be loaded and why (``--target/engine-check.json``). A
target that already holds this bundle is reused. Runs from a checkout with
the host's Python alone (the standard library and this repository's
tools).
"""

import argparse
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.fork.common import sha256_of  # noqa: E402

MANIFEST = "bundle.json"
STAMP = ".engine-bundle"
WAITING = 3

# Runs with the target on PYTHONPATH; prints one JSON object.
CHECK = r"""
import importlib, json, sys, traceback
from importlib import metadata
report = {"python": sys.version.split()[0], "loaded": [], "failed": {}}
for name in ("torch", "triton", "vllm", "flashinfer-python", "tilelang",
             "deep-gemm"):
    try:
        report[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        report[name] = None
import torch
report["gpu"] = (torch.cuda.get_device_name() if torch.cuda.is_available()
                 else None)
for module in sys.argv[1:]:
    try:
        importlib.import_module(module)
        report["loaded"].append(module)
    except BaseException as e:  # noqa: BLE001 - report every failure
        report["failed"][module] = f"{type(e).__name__}: {e}"[:600]
print(json.dumps(report))
"""


def log(message: str) -> None:
    print(f"[engine-bundle] {message}", file=sys.stderr, flush=True)


def collect(parts_dir: Path, state: Path) -> tuple[dict, list[str]]:
    """Keep the parts that arrived; returns the manifest and what is missing."""
    manifest = json.loads((parts_dir / MANIFEST).read_text())
    held = state / MANIFEST
    if held.exists() and json.loads(held.read_text())["sha256"] != manifest["sha256"]:
        log(f"{state} holds another bundle: starting over")
        shutil.rmtree(state)
    state.mkdir(parents=True, exist_ok=True)
    held.write_text(json.dumps(manifest))
    for part in manifest["parts"]:
        src, dst = parts_dir / part["file"], state / part["file"]
        if dst.exists() or not src.exists():
            continue
        if src.stat().st_size != part["bytes"] or sha256_of(src) != part["sha256"]:
            raise SystemExit(f"{src} does not match {MANIFEST}: build it again")
        shutil.copyfile(src, dst)
        log(f"received {part['file']} ({part['bytes'] / 2**20:.1f} MiB)")
    missing = [p["file"] for p in manifest["parts"] if not (state / p["file"]).exists()]
    return manifest, missing


def join(manifest: dict, state: Path) -> Path:
    """The parts joined and checked, unpacked under ``state/unpacked``."""
    root = state / "unpacked"
    if (root / "bundle-contents.json").exists():
        return root
    whole = hashlib.sha256()
    tar_path = state / "bundle.tar"
    with tar_path.open("wb") as out:
        for part in manifest["parts"]:
            with (state / part["file"]).open("rb") as f:
                for block in iter(lambda f=f: f.read(1 << 22), b""):
                    whole.update(block)
                    out.write(block)
    if whole.hexdigest() != manifest["sha256"]:
        raise SystemExit("the joined parts do not match the bundle's sha256")
    with tarfile.open(tar_path) as tar:
        tar.extractall(root, filter="data")
    tar_path.unlink()
    return root


def install(manifest: dict, root: Path, target: Path, state: Path) -> None:
    stamp = target / STAMP
    if stamp.exists() and stamp.read_text() == manifest["sha256"]:
        log(f"reusing {target}: it holds this bundle")
        return
    shutil.rmtree(target, ignore_errors=True)
    # 1. The GPU payload: the fork's Python tree and the test dependencies.
    payload = state / "payload"
    shutil.rmtree(payload, ignore_errors=True)
    with tarfile.open(root / manifest["payload"]) as tar:
        tar.extractall(payload, filter="data")
    entry = [sys.executable, str(payload / "run_gpu_tests.py"), "--target", target]
    subprocess.run([*entry, "--check-only"], check=True)
    # 2. The compiled libraries, in place of the payload's stand-ins.
    for path in manifest["compiled"]:
        dst = target / path
        dst.write_bytes(
            lzma.decompress((root / "compiled" / f"{path}.xz").read_bytes())
        )
        stand_in = dst.with_name(dst.name.split(".", 1)[0] + ".py")
        if stand_in.exists():
            stand_in.unlink()
            log(f"{path} replaces the payload's stand-in {stand_in.name}")
    # 3. The engine's other requirements.
    wheels = [str(root / w["file"]) for w in manifest["wheels"].values()]
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    pip += ["--no-compile", "--no-cache-dir", "--upgrade", "--target", str(target)]
    subprocess.run([*pip, *wheels], check=True)
    stamp.write_text(manifest["sha256"])


def check(manifest: dict, target: Path) -> dict:
    modules = ["vllm"]
    modules += [
        p.removesuffix(".abi3.so").replace("/", ".") for p in manifest["compiled"]
    ]
    # DeepGEMM is no part of the bundle (see engine_bundle.py): say whether
    # the host has one vLLM can load.
    modules += ["tilelang", "deep_gemm"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(target), env.get("PYTHONPATH")])
    )
    out = subprocess.run(
        [sys.executable, "-c", CHECK, *modules],
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"the check could not run:\n{out.stderr[-3000:]}")
    report = json.loads(out.stdout.strip().splitlines()[-1])
    (target / "engine-check.json").write_text(json.dumps(report, indent=1))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("parts", type=Path, help="folder with bundle.json and parts")
    parser.add_argument("--state", type=Path, default=Path("/tmp/engine-bundle"))
    parser.add_argument("--target", type=Path, default=Path("/tmp/engine-site"))
    parser.add_argument(
        "--unpack-only", action="store_true", help="stop once the bundle is unpacked"
    )
    args = parser.parse_args()
    if not (args.parts / MANIFEST).exists():
        raise SystemExit(f"{args.parts} has no {MANIFEST}")
    manifest, missing = collect(args.parts, args.state.resolve())
    total = len(manifest["parts"])
    if missing:
        log(
            f"holding {total - len(missing)} of {total} parts; send next: "
            f"{', '.join(missing)}"
        )
        sys.exit(WAITING)
    root = join(manifest, args.state.resolve())
    if args.unpack_only:
        log(f"unpacked into {root}")
        return
    target = args.target.resolve()
    install(manifest, root, target, args.state.resolve())
    report = check(manifest, target)
    print(json.dumps(report, indent=1))
    for module, why in report["failed"].items():
        log(f"could not load {module}: {why}")
    log(f"installed into {target}; use PYTHONPATH={target}")


if __name__ == "__main__":
    main()
