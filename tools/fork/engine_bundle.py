# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Build the engine bundle: what vLLM's engine needs on an air-gapped GPU host
that has Python, torch and Triton, cut into parts that fit one device call.

    python3 tools/fork/engine_bundle.py [--base 0.30.0] [--python 3.12] \
        [--part-mib 60]

The GPU payload (tools/fork/gpu_payload.py: the fork's Python tree, the test
dependencies, the tests) runs kernels and layers; the engine also needs the
fork wheel's compiled op libraries (``COMPILED``), the rest of vLLM's Python
requirements that the host lacks (``ENGINE_WHEELS``). One requirement is
not in it: DeepGEMM, which vLLM's sparse-attention indexer needs on CUDA.
The copy inside the vLLM wheel (``vllm/third_party/deep_gemm``) is compiled
against the torch vLLM pins and does not load on another torch, and DeepGEMM
publishes no wheel; a host with another torch needs its own build of it, and
the receiver's check says whether ``deep_gemm`` loads.

The bundle is one uncompressed tar of those pieces (compiled libraries
xz-compressed one by one; wheels and the payload are compressed already),
written as ``part-NN`` files under ``dist/engine-bundle-vllm-<base>-cp<XY>/``
next to ``bundle.json`` (each part's size and sha256, the whole's sha256).
Send ``bundle.json`` and one part per call; on the host,
``tools/fork/engine_bundle_receive.py`` collects them, and installs and checks
everything once the last one arrives.
"""

import argparse
import hashlib
import io
import json
import lzma
import re
import shutil
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.fork.common import (  # noqa: E402
    REPO,
    add_base_argument,
    load_pin,
    log,
    select_base,
    site_packages,
    venv_dir,
)
from tools.fork.gpu_payload import (  # noqa: E402
    MTIME,
    build_payload,
    default_payload_name,
    fetch_wheels,
    installed_versions,
)

# What one device call carries, less room for the checkout that travels too.
DEFAULT_PART_MIB = 60
MANIFEST = "bundle.json"

# The fork wheel's compiled parts the engine loads for DeepSeek V4.1 on SM90,
# by why. The flash-attention extensions (440 MB) stay out: no DeepSeek V4.1
# layer calls them, and the payload's stub keeps vllm.vllm_flash_attn
# importable.
COMPILED = {
    "vllm/_C_stable_libtorch.abi3.so": "vLLM's op library: norms, rotary "
    "embedding, KV-cache writes, indexer K cache, FP8 quantisation",
    "vllm/_moe_C_stable_libtorch.abi3.so": "MoE routing and expert alignment",
    "vllm/_flashmla_C.abi3.so": "FlashMLA, upstream's DeepSeek V4.1 sparse "
    "decode on SM90 (the reference run)",
    "vllm/_flashmla_extension_C.abi3.so": "FlashMLA's planner",
    "vllm/_deepselect_C.abi3.so": "the indexer's top-k selection",
    "vllm/cumem_allocator.abi3.so": "the engine's sleep-mode allocator, loaded "
    "at start-up",
}

# vLLM requirements the GPU payload does not carry and the host lacks, that
# the engine imports on its way to a DeepSeek V4.1 generate(), by why. Left
# out on purpose: the CUTLASS DSL, tokenspeed's Triton fork, video decoding,
# NCCL bindings, cuDNN frontend and the alternative safetensors loaders
# (hundreds of MB, for paths this run does not take).
ENGINE_WHEELS = {
    "tilelang": "DeepSeek V4.1's mHC kernels (compiled on the host at run time)",
    "z3-solver": "a requirement of tilelang",
    "torch-c-dlpack-ext": "a requirement of tilelang",
    "compressed-tensors": "vLLM's quantization config registry",
    "depyf": "vLLM's compilation config",
    "astor": "a requirement of depyf",
    "dill": "a requirement of depyf",
    "lark": "structured output grammars",
    "lm-format-enforcer": "structured output",
    "outlines-core": "structured output",
    "setproctitle": "engine process names",
    "python-json-logger": "vLLM's logging config",
    "watchfiles": "vLLM's reload helpers",
    "uvicorn": "vLLM's server module, imported by the entrypoints",
    "python-multipart": "fastapi forms",
    "sse-starlette": "streaming responses",
    "prometheus-fastapi-instrumentator": "metrics",
    "pydantic-extra-types": "protocol types",
    "jsonschema": "tool and structured-output schemas",
    "jsonschema-specifications": "a requirement of jsonschema",
    "referencing": "a requirement of jsonschema",
    "rpds-py": "a requirement of referencing",
    "ijson": "streaming JSON parsing",
    "loguru": "a requirement of vLLM's kernels packages",
    "docstring-parser": "argument help",
    "nvtx": "profiling ranges",
    "model-hosting-container-standards": "server entrypoints",
    "opentelemetry-api": "tracing hooks",
    "opentelemetry-sdk": "tracing hooks",
    "opentelemetry-semantic-conventions": "tracing hooks",
    "opentelemetry-semantic-conventions-ai": "tracing hooks",
}


def default_bundle_dir(base: str, python: str) -> Path:
    return REPO / "dist" / f"engine-bundle-vllm-{base}-cp{python.replace('.', '')}"


def engine_wheel_versions(site: Path) -> dict[str, str]:
    """``ENGINE_WHEELS`` at the versions installed in the dev venv ``site``;
    one it lacks is no requirement of this base and stays out."""
    versions = installed_versions(site)
    for name in ENGINE_WHEELS:
        if name not in versions:
            log(f"{name}: not in {site}, so not a requirement of this base")
    return {name: versions[name] for name in ENGINE_WHEELS if name in versions}


def compiled_members(fork_wheel: Path) -> Iterator[tuple[str, bytes]]:
    """Each ``COMPILED`` library of the fork wheel, xz-compressed."""
    with zipfile.ZipFile(fork_wheel) as zf:
        names = set(zf.namelist())
        for path in COMPILED:
            if path not in names:
                raise SystemExit(f"{fork_wheel.name} has no {path}")
            log(f"compressing {path}")
            yield f"compiled/{path}.xz", lzma.compress(zf.read(path), preset=6)


def _write_parts(members: Iterator[tuple[str, bytes]], out: Path, part_bytes: int):
    """An uncompressed tar of ``members`` cut into ``part-NN`` files of at
    most ``part_bytes``; returns (parts, whole sha256, whole size)."""
    whole_tar = out / "bundle.tar"
    with tarfile.open(whole_tar, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), MTIME, 0o644
            tar.addfile(info, io.BytesIO(data))
    parts, whole = [], hashlib.sha256()
    with whole_tar.open("rb") as f:
        while chunk := f.read(part_bytes):
            name = f"part-{len(parts):02d}"
            (out / name).write_bytes(chunk)
            whole.update(chunk)
            digest = hashlib.sha256(chunk).hexdigest()
            parts.append({"file": name, "bytes": len(chunk), "sha256": digest})
    size = whole_tar.stat().st_size
    whole_tar.unlink()
    return parts, whole.hexdigest(), size


def build_bundle(
    out: Path,
    python: str,
    site: Path,
    part_bytes: int,
) -> dict:
    """Write the bundle's parts and ``bundle.json`` into ``out`` (emptied
    first); returns the manifest."""
    from tools.fork.build_wheel import build, fork_version

    pin = load_pin()
    fork_wheel = build(REPO / "dist")
    payload = REPO / "dist" / default_payload_name(pin.VLLM_VERSION, python)
    payload_manifest = build_payload(payload, python, site, fork_wheel=fork_wheel)
    versions = engine_wheel_versions(site)
    wheels = fetch_wheels(versions, python)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    manifest: dict = {
        "base": pin.VLLM_VERSION,
        "vllm": fork_version(),
        "python": python,
        "payload": f"payload/{payload.name}",
        "compiled": COMPILED,
        "wheels": {
            name: {
                "version": versions[name],
                "file": f"wheels/{p.name}",
                "why": ENGINE_WHEELS[name],
            }
            for name, p in wheels.items()
        },  # fmt: skip
        "payload_stubs": payload_manifest["stubs"],
    }

    def members() -> Iterator[tuple[str, bytes]]:
        yield manifest["payload"], payload.read_bytes()
        yield from compiled_members(fork_wheel)
        for name, w in manifest["wheels"].items():
            yield w["file"], wheels[name].read_bytes()
        # The receiver reads this copy to know what the bundle holds.
        yield "bundle-contents.json", json.dumps(manifest, indent=1).encode()

    return write_bundle(out, manifest, members(), part_bytes)


def write_bundle(
    out: Path, manifest: dict, members: Iterator[tuple[str, bytes]], part_bytes: int
) -> dict:
    """The parts of a tar of ``members`` and ``bundle.json`` (``manifest``
    with the parts' and the whole's sizes and checksums) in ``out``."""
    parts, digest, size = _write_parts(members, out, part_bytes)
    manifest.update(parts=parts, sha256=digest, bytes=size)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def describe(out: Path, manifest: dict) -> str:
    lines = [
        (
            f"{out}: vLLM {manifest['vllm']} for CPython {manifest['python']}, "
            f"{manifest['bytes'] / 2**20:.1f} MiB in {len(manifest['parts'])} "
            f"parts (bundle {manifest['sha256'][:12]})"
        )
    ]
    lines += [f"  {p['file']}: {p['bytes'] / 2**20:.1f} MiB" for p in manifest["parts"]]
    lines.append(f"  {manifest['payload']} (the GPU payload)")
    lines.append("  compiled:")
    lines += [f"    {path}: {why}" for path, why in manifest["compiled"].items()]
    lines.append(f"  wheels: {len(manifest['wheels'])}")
    lines += [
        f"    {name}=={w['version']}: {w['why']}"
        for name, w in manifest["wheels"].items()
    ]
    lines.append(
        "  not in it: DeepGEMM (the wheel's copy loads only on the torch vLLM "
        "pins; the receiver's check says whether deep_gemm loads on the host)"
    )
    lines.append(
        "send per call: bundle.json plus one part; on the host run "
        "tools/fork/engine_bundle_receive.py (see its docstring)"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_base_argument(parser)
    parser.add_argument("--python", default="3.12", help="the GPU host's CPython")
    parser.add_argument("--out", type=Path, help="parts folder (default: dist/...)")
    parser.add_argument(
        "--part-mib", type=int, default=DEFAULT_PART_MIB, help="largest part, MiB"
    )
    args = parser.parse_args()
    if not re.fullmatch(r"3\.\d+", args.python):
        parser.error(f"--python {args.python}: give major.minor, e.g. 3.12")
    if args.part_mib < 1:
        parser.error("--part-mib must be at least 1")
    pin = select_base(args.base)
    venv = venv_dir(".venv")
    if not venv.exists():
        raise SystemExit(
            f"no dev venv {venv}; make it with python3 tools/fork/dev_env.py "
            f"--base {pin.VLLM_VERSION}"
        )
    out = args.out or default_bundle_dir(pin.VLLM_VERSION, args.python)
    manifest = build_bundle(out, args.python, site_packages(venv), args.part_mib << 20)
    log(f"wrote {out}")
    print(describe(out, manifest))


if __name__ == "__main__":
    main()
