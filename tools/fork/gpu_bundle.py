# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Build, install and run the GPU-host bundle: the fork wheel and what a host lacks.

    python3 -m tools.fork.gpu_bundle describe-host > host.json   # on the host
    python3 -m tools.fork.gpu_bundle build --host host.json [--base B]
    python3 -m tools.fork.gpu_bundle install DIR    # on the host, once a part
    python3 -m tools.fork.gpu_bundle run -- python3 -m pytest tests/...

For a host with Python, torch and Triton but no package index. ``build`` keeps
of pip's resolution of vLLM and FlashInfer (the base's dev venv) what the
described host lacks or holds at a refused version, less torch's own
requirements and ``LEFT_OUT``, has pip download those wheels for the host,
and cuts them and the fork wheel, whole, into parts of one device call each.
A Triton older than the base's on the host gets the base's, stripped
(``triton_wheel``), on its own path entry. ``install`` (standard library
only) keeps parts as they arrive; with the last it has pip install
everything with no index and reports what pip finds unmet and which
compiled parts load. Nothing is stubbed. ``run`` runs a command with it from
a copy of the checkout (whose ``vllm/`` would shadow it), the checkout's new
modules copied over the installed ones.
"""

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tools.fork import triton_wheel
from tools.fork.common import REPO, log, new_module_files, sha256_of

MANIFEST = "bundle.json"
CONTENTS = "contents.json"
TRITON = "triton"
REQUIREMENTS = "requirements.txt"
WAITING = 3
# A device call carries 64 MiB: a part and the checkout (about 21 MB, most
# of it the serving runs' raw results).
DEFAULT_PART_MIB = 40
# Copied from the checkout for ``run``: what the runs execute and read.
CHECKOUT_PATHS = ("tests", "benchmarks", "tools", ".buildkite")
# Requirements of vLLM or FlashInfer that no run on such a host takes, by
# why; together several hundred MB, more than a device call carries.
LEFT_OUT = {
    "tokenspeed-mla": "an alternative MLA kernel package vLLM imports only when chosen",
    "humming-kernels": "quantised GEMM kernels for other models",
    "nvidia-cudnn-frontend": "FlashInfer's cuDNN attention path",
    "nccl4py": "FlashInfer's multi-GPU communication",
    "nccl-extensions": "FlashInfer's multi-GPU communication",
    "cuda-tile": "FlashInfer's CUDA Tile kernels",
    "pynvvideocodec": "video decoding for multimodal inputs",
    "instanttensor": "an alternative weight loader",
    "fastsafetensors": "an alternative weight loader",
    "anthropic": "the Anthropic-compatible API endpoint",
}
# The packages a resolution of vLLM and FlashInfer starts from.
ROOTS = ("vllm", "flashinfer-python")

# Runs in the dev venv, which holds pip's resolution: each distribution the
# roots reach under the host's markers (not through LEFT_OUT), whether torch
# reaches it, and whether the host's version meets every specifier on it.
RESOLUTION = r"""
import json, sys
from importlib import metadata
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon
from packaging.version import Version
host = json.load(open(sys.argv[1]))
# Marker.evaluate fills every other marker from this interpreter (Linux too).
env = {"python_version": host["python"].rsplit(".", 1)[0],
       "python_full_version": host["python"], "platform_machine": host["machine"]}
dists = {canon(d.metadata["Name"]): d for d in metadata.distributions()}
stop = set(json.loads(sys.argv[2]))
def walk(roots):
    seen, specs, todo = set(), {}, [(canon(r), ()) for r in roots]
    needs = {}
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen or name not in dists or name in stop:
            continue
        seen.add((name, extras))
        for text in dists[name].requires or []:
            req = Requirement(text)
            if req.marker and not any(
                req.marker.evaluate({**env, "extra": e}) for e in ("", *extras)
            ):
                continue
            specs.setdefault(canon(req.name), []).append(req.specifier)
            needs.setdefault(name, set()).add(canon(req.name))
            todo.append((canon(req.name), tuple(sorted(req.extras))))
    return {n for n, _ in seen}, specs, needs
names, specs, needs = walk(sys.argv[3:])
by_torch = walk(["torch"])[0]
have = {canon(k): v for k, v in host["packages"].items()}
ok = lambda n: n in have and all(Version(have[n]) in s for s in specs.get(n, ()))
out = {n: {"version": dists[n].version, "torch": n in by_torch, "host": have.get(n),
           "host_ok": ok(n), "needs": sorted(needs.get(n, ()))} for n in names}
print(json.dumps(out))
"""

# Runs on the host with the target on the path; prints one JSON object.
CHECK = r"""
import importlib, json, sys, torch, vllm
from importlib import metadata
r = {n: metadata.version(n) for n in ("torch", "triton", "vllm", "flashinfer-python")}
r.update(python=sys.version.split()[0], vllm_file=vllm.__file__, loaded=[], failed={},
         gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None)
for module in sys.argv[1:]:
    try:
        importlib.import_module(module)
        r["loaded"].append(module)
    except BaseException as e:  # every failure is reported, none is fatal
        r["failed"][module] = f"{type(e).__name__}: {e}"[:600]
print(json.dumps(r))
"""


def describe_host() -> dict:
    from importlib import metadata

    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "glibc": platform.libc_ver()[1],
        "packages": {d.metadata["Name"]: d.version for d in metadata.distributions()},
    }


def platform_tags(host: dict) -> list[str]:
    """The manylinux tags whose wheels the host's glibc loads, newest first."""
    minor, arch = int(host["glibc"].split(".")[1]), host["machine"]
    tags = [f"manylinux_2_{m}_{arch}" for m in range(minor, 16, -1)]
    return [*tags, f"manylinux2014_{arch}", f"manylinux1_{arch}"]


def plan(host: dict, venv_python: Path, host_file: Path) -> tuple[dict, dict]:
    """(name -> version to ship, name -> why it stays out) for ``host``. A
    Triton the host lacks is shipped stripped (``triton_wheel``), apart from
    the others."""
    from tools.fork.common import load_pin

    out = subprocess.run(
        [venv_python, "-c", RESOLUTION, host_file, json.dumps(list(LEFT_OUT)), *ROOTS],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    ship, out_why, torch_built = {}, {}, load_pin().INCOMPATIBLE_PACKAGES
    resolved = json.loads(out)
    for name, d in resolved.items():
        if name == "vllm":
            continue
        if d["host_ok"]:
            out_why[name] = f"the host has {d['host']}"
        elif name == TRITON:
            ship[name] = d["version"]
        elif d["torch"] or name in torch_built:
            out_why[name] = "comes with the host's torch"
        else:
            ship[name] = d["version"]
    # A host package kept at another version than the resolution's may refuse
    # what the bundle replaces beneath it (the host's transformers and a
    # newer huggingface-hub): ship the resolution's version of it too.
    while kept := [
        n
        for n in out_why
        if n in resolved
        and resolved[n]["host"] != resolved[n]["version"]
        and not (resolved[n]["torch"] or n in torch_built)
        and set(resolved[n]["needs"]) & set(ship)
    ]:
        for name in kept:
            ship[name] = resolved[name]["version"]
            del out_why[name]
    return ship, {**out_why, **LEFT_OUT}


def build(host_file: Path, out: Path, part_bytes: int, venv: Path) -> dict:
    """The parts and ``bundle.json`` in ``out`` (emptied first)."""
    from tools.fork.build_wheel import build as build_wheel
    from tools.fork.common import load_pin, run_pip, venv_python

    host = json.loads(host_file.read_text())
    wheel = build_wheel(REPO / "dist")
    ship, left_out = plan(host, venv_python(venv), host_file)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheels = Path(tmp, "wheels")
        platforms = [a for tag in platform_tags(host) for a in ("--platform", tag)]
        run_pip(
            Path(sys.executable), "download", "-q", "--no-deps",
            "--only-binary=:all:", "--python-version", host["python"].rsplit(".", 1)[0],
            "--implementation", "cp", *platforms, "-d", wheels,
            *(f"{n}=={v}" for n, v in ship.items()), env=dict(os.environ),
        )  # fmt: skip
        triton = None
        if TRITON in ship:
            triton = stripped_triton(next(wheels.glob(f"{TRITON}-*.whl")))
            log(f"Triton {ship.pop(TRITON)} ships stripped: {triton.name}")
        requirements = "".join(f"{n}=={v}\n" for n, v in ship.items())
        (wheels / REQUIREMENTS).write_text(requirements)
        contents = {
            "base": load_pin().VLLM_VERSION,
            "wheel": wheel.name,
            "wheel_sha256": sha256_of(wheel),
            "host": host_file.name,
            "python": host["python"],
            "shipped": ship,
            "triton": triton and triton.name,
            "left_out": left_out,
        }
        Path(tmp, CONTENTS).write_text(json.dumps(contents, indent=1))
        whole = out / "bundle.tar"
        # Fixed times and owners: a rebuild of the same bundle has its sha256,
        # so a host that holds some of its parts keeps them.
        same = lambda info: info.replace(
            mtime=0, uid=0, gid=0, uname="", gname="", deep=False
        )  # noqa: E731
        with tarfile.open(whole, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(Path(tmp, CONTENTS), CONTENTS, filter=same)
            tar.add(wheel, wheel.name, filter=same)
            for path in sorted(wheels.iterdir()):
                if path.name.startswith(f"{TRITON}-"):
                    continue
                tar.add(path, f"wheels/{path.name}", filter=same)
            if triton:
                tar.add(triton, f"{TRITON}/{triton.name}", filter=same)
    parts = []
    with whole.open("rb") as f:
        while chunk := f.read(part_bytes):
            name = out / f"part-{len(parts):02d}"
            name.write_bytes(chunk)
            digest = hashlib.sha256(chunk).hexdigest()
            parts.append({"file": name.name, "bytes": len(chunk), "sha256": digest})
    manifest = {**contents, "parts": parts, "sha256": sha256_of(whole)}
    whole.unlink()
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def stripped_triton(wheel: Path) -> Path:
    """``wheel`` stripped, made once per wheel (compressing it takes minutes)."""
    cache = REPO / ".cache" / "triton-stripped" / sha256_of(wheel)
    if not (cache / wheel.name).exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            triton_wheel.strip(wheel, Path(tmp)).rename(cache / wheel.name)
    return cache / wheel.name


def collect(parts_dir: Path, state: Path) -> tuple[dict, list[str]]:
    """Keep the parts that arrived; (manifest, the parts still missing)."""
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
        if sha256_of(src) != part["sha256"]:
            raise SystemExit(f"{src} does not match {MANIFEST}: build it again")
        shutil.copyfile(src, dst)
        log(f"received {part['file']}")
    missing = [p["file"] for p in manifest["parts"] if not (state / p["file"]).exists()]
    return manifest, missing


def unpack(manifest: dict, state: Path) -> Path:
    """The joined parts, checked and unpacked under ``state/unpacked``."""
    root = state / "unpacked"
    if (root / CONTENTS).exists():
        return root
    whole = state / "bundle.tar"
    with whole.open("wb") as out:
        for part in manifest["parts"]:
            out.write((state / part["file"]).read_bytes())
    if sha256_of(whole) != manifest["sha256"]:
        raise SystemExit("the joined parts do not match the bundle's sha256")
    with tarfile.open(whole) as tar:
        tar.extractall(root, filter="data")
    whole.unlink()
    return root


def install(manifest: dict, root: Path, target: Path) -> dict:
    """pip installs the bundle into ``target``; returns the check's report."""
    stamp = target / ".gpu-bundle"
    if not (stamp.exists() and stamp.read_text() == manifest["sha256"]):
        shutil.rmtree(target, ignore_errors=True)
        wheels = root / "wheels"
        # --no-deps: with --target pip cannot see the host's packages, so the
        # resolution is the one made for this host when the bundle was built.
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index"]
        pip += ["--find-links", str(wheels), "--no-deps", "--no-compile"]
        wheel = str(root / manifest["wheel"])
        subprocess.run(
            [*pip, "--target", target, wheel, "-r", wheels / REQUIREMENTS], check=True
        )
        if manifest.get("triton"):
            # Its own path entry, so that ``run --host-triton`` can leave it out.
            triton = root / TRITON / manifest["triton"]
            subprocess.run([*pip, "--target", target / TRITON, triton], check=True)
        make_site_dir(target)
        stamp.write_text(manifest["sha256"])
    env = environment(target, manifest)
    compiled = sorted(
        ".".join(p.relative_to(target).with_name(p.name.split(".")[0]).parts)
        for p in (target / "vllm").rglob("*.so")
    )
    out = subprocess.run(
        [sys.executable, "-c", CHECK, *dict.fromkeys(compiled)],
        env=env, capture_output=True, text=True, cwd=target.parent,
    )  # fmt: skip
    if out.returncode:
        raise SystemExit(f"vLLM does not import from {target}:\n{out.stderr[-3000:]}")
    report = json.loads(out.stdout.strip().splitlines()[-1])
    if not Path(report["vllm_file"]).resolve().is_relative_to(target.resolve()):
        raise SystemExit(f"vllm imported from {report['vllm_file']}, not {target}")
    # pip's own word on what this host leaves unmet (torch's pin, LEFT_OUT).
    unmet = subprocess.run(
        [sys.executable, "-m", "pip", "check"],
        env=env, capture_output=True, text=True, cwd=target.parent,
    ).stdout.splitlines()  # fmt: skip
    report.update(wheel_sha256=manifest["wheel_sha256"], pip_check=unmet)
    (target / "bundle-check.json").write_text(json.dumps(report, indent=1))
    return report


def make_site_dir(target: Path) -> None:
    """Have Python process ``target``'s .pth files, as in a site-packages:
    on PYTHONPATH alone it does not (the CuTe DSL finds its ``cutlass``
    package through one). Python imports ``sitecustomize`` at start-up."""
    (target / "sitecustomize.py").write_text(
        "import os, site\n\nsite.addsitedir(os.path.dirname(__file__))\n"
    )


def environment(
    target: Path, manifest: dict, host_triton: bool = False
) -> dict[str, str]:
    env = dict(os.environ, VLLM_FORK_BASE=manifest["base"])
    paths = [str(target), env.get("PYTHONPATH")]
    if manifest.get("triton") and not host_triton:
        paths.insert(0, str(target / TRITON))
        env.update(triton_wheel.environment())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    return env


def refresh_new_modules(target: Path) -> list[str]:
    """Copy the checkout's new modules over the installed fork's where they
    differ, as the dev venv links them: a changed kernel runs without a new
    bundle. (Edits of upstream files still need one.)"""
    changed = []
    for rel in new_module_files():
        src, dst = REPO / rel, target / rel
        if not dst.exists() or dst.read_bytes() != src.read_bytes():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            changed.append(str(rel))
    return changed


def run_here(
    state: Path, target: Path, command: list[str], host_triton: bool = False
) -> int:
    """``command`` with the installed bundle, from a copy of the checkout."""
    manifest = json.loads((state / MANIFEST).read_text())
    work = state / "checkout"
    shutil.rmtree(work, ignore_errors=True)
    skip = shutil.ignore_patterns("__pycache__")
    for rel in CHECKOUT_PATHS:
        if (REPO / rel).is_dir():
            shutil.copytree(REPO / rel, work / rel, ignore=skip)
    shutil.copyfile(REPO / "pyproject.toml", work / "pyproject.toml")
    for path in refresh_new_modules(target):
        log(f"the checkout's {path} replaces the bundle's")
    env = environment(target, manifest, host_triton)
    return subprocess.run(command, cwd=work, env=env).returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    sub.add_parser("describe-host", help="print this host's description (JSON)")
    b = sub.add_parser("build", help="build the bundle for a described host")
    b.add_argument("--host", type=Path, required=True, help="describe-host's JSON")
    b.add_argument("--base", default=None, help="vLLM base (default: the pin's)")
    b.add_argument("--out", type=Path, help="default: dist/gpu-bundle-vllm-<base>-cpXY")
    b.add_argument("--part-mib", type=int, default=DEFAULT_PART_MIB)
    i = sub.add_parser("install", help="keep the parts that came; install when whole")
    i.add_argument("parts", type=Path, help=f"folder with {MANIFEST} and parts")
    r = sub.add_parser("run", help="run a command with the installed bundle")
    r.add_argument("command", nargs="+", help="after --: the command")
    r.add_argument(
        "--host-triton", action="store_true", help="the host's Triton, not the base's"
    )
    for p in (i, r):
        p.add_argument("--state", type=Path, default=Path("/tmp/gpu-bundle"))
        p.add_argument("--target", type=Path, default=Path("/tmp/gpu-site"))
    args = parser.parse_args()
    if args.verb == "describe-host":
        print(json.dumps(describe_host(), indent=1))
    elif args.verb == "build":
        from tools.fork.common import select_base, venv_dir

        if args.part_mib < 1:
            parser.error("--part-mib must be at least 1")
        base = select_base(args.base).VLLM_VERSION
        tag = "cp" + "".join(json.loads(args.host.read_text())["python"].split(".")[:2])
        out = args.out or REPO / "dist" / f"gpu-bundle-vllm-{base}-{tag}"
        manifest = build(args.host, out, args.part_mib << 20, venv_dir(".venv"))
        print(json.dumps({k: v for k, v in manifest.items() if k != "parts"}, indent=1))
        log(f"{out}: {len(manifest['parts'])} parts; send {MANIFEST} and one a call")
    elif args.verb == "install":
        if not (args.parts / MANIFEST).is_file():
            parser.error(f"{args.parts} has no {MANIFEST}: give the bundle's folder")
        manifest, missing = collect(args.parts, args.state)
        if missing:
            log(f"still missing: {', '.join(missing)}")
            sys.exit(WAITING)
        report = install(manifest, unpack(manifest, args.state), args.target)
        print(json.dumps(report, indent=1))
        for module, why in report["failed"].items():
            log(f"does not load here: {module}: {why}")
    elif not (args.state / MANIFEST).is_file():
        parser.error(f"{args.state} holds no bundle: run install first")
    else:
        sys.exit(run_here(args.state, args.target, args.command, args.host_triton))


if __name__ == "__main__":
    main()
