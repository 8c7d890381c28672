# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Build the offline GPU payload: one archive that runs the GPU tests on a host
with torch and Triton but no vLLM, no FlashInfer and no package index.

    python3 tools/fork/gpu_payload.py [--base 0.30.0] [--python 3.12] [--out PATH]

The archive (``dist/gpu-payload-vllm-<base>-cp<XY>.tar.gz``) holds:

- ``tree/``: the fork wheel's Python tree and dist-info, without its compiled
  parts, plus the stubs in ``STUBS``; likewise the packages in ``UNPACKED``;
- ``wheels/``: the other packages in ``WHEELS`` for that Python, at the
  versions installed in the base's dev venv (the ones the CPU tests ran);
- ``tests/``, ``tools/`` and ``pyproject.toml``: pytest runs from the archive's
  root, which has no ``vllm/`` folder, so ``vllm`` always comes from the tree;
- ``run_gpu_tests.py``: the device-side entry point (see its docstring) and
  ``payload.json``, what the archive holds and why.

gzip, not xz: much of it is wheels, compressed already; xz made the archive
8% smaller and took 15 times as long (measured here).
"""

import argparse
import gzip
import io
import json
import os
import re
import sys
import tarfile
import zipfile
from collections.abc import Iterable, Iterator
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.fork.common import (  # noqa: E402
    REPO,
    add_base_argument,
    load_pin,
    log,
    run_pip,
    select_base,
    site_packages,
    venv_dir,
)

# Files travel to the GPU host at most 64 MiB per call.
MAX_ARCHIVE_BYTES = 64 << 20
ENTRY_POINT = "run_gpu_tests.py"
MANIFEST = "payload.json"
TREE = "tree"
WHEEL_CACHE = REPO / ".cache" / "gpu-payload" / "wheels"

# Compiled modules that the selected tests' imports reach, replaced by small
# Python modules (STUB_SOURCES, else empty), each with why the tests can do
# without it.
STUBS = {
    "vllm/_C_stable_libtorch.py": (
        "imported at module level by vllm/platforms/cuda.py only to register "
        "vLLM's compiled torch ops; the GPU tests run the fork's Triton kernels "
        "and Python code, and the only torch.ops._C calls their imports make "
        "are CUTLASS capability probes (w8a8_utils asks at import on CUDA), "
        "which the stub answers 'not supported'"
    ),
    "vllm/vllm_flash_attn/_vllm_fa2_C.py": (
        "vllm.vllm_flash_attn refuses to import without one of its compiled "
        "extensions, and on CUDA vllm/v1/attention/backends/fa_utils.py "
        "imports it at module level; the GPU tests call no flash-attention op"
    ),
}
STUB_SOURCES = {
    "vllm/_C_stable_libtorch.py": """\
# Stand-in for vLLM's compiled op library in the offline GPU payload: the
# CUTLASS capability probes vLLM runs at import answer "not supported".
import torch

_lib = torch.library.Library("_C", "FRAGMENT")
for _name in (
    "cutlass_scaled_mm_supports_fp4",
    "cutlass_scaled_mm_supports_fp8",
    "cutlass_scaled_mm_supports_block_fp8",
    "cutlass_group_gemm_supported",
):
    _lib.define(f"{_name}(int cuda_device_capability) -> bool")
    _lib.impl(_name, lambda cuda_device_capability: False, "CompositeImplicitAutograd")
""",
}

# Packages the GPU tests import (through vllm) that the GPU host lacks, each
# with where the import comes from. Versions are the dev venv's.
WHEELS = {
    "pydantic": "vllm.config, reached by every vllm module the tests import",
    "pydantic-core": "pydantic's compiled core",
    "annotated-types": "a requirement of pydantic",
    "typing-inspection": "a requirement of pydantic",
    "typing-extensions": "pydantic 2.14 needs 4.16 or newer",
    "msgspec": "vllm.v1 request and output structs",
    "cbor2": "vllm's KV-cache block hashing (vllm.v1.core.kv_cache_utils)",
    "blake3": "vllm.utils hashing",
    "cachetools": "vllm.utils caches",
    "pyzmq": "vllm.utils network helpers",
    "openai": "vllm's request protocol types, reached from vllm.v1.request",
    "jiter": "a requirement of openai",
    "sniffio": "a requirement of openai",
    "httpx2": "a requirement of openai",
    "httpcore2": "a requirement of httpx2",
    "truststore": "a requirement of httpx2",
    "openai-harmony": "vllm.reasoning, reached from vllm.config (vLLM 0.30.0)",
    "oss-harmony": "the same module, openai_harmony, under vLLM 0.33.0's name",
    "fastapi": "vllm's protocol models",
    "starlette": "a requirement of fastapi",
    "pybase64": "vllm's multimodal and protocol helpers",
    "partial-json-parser": "vllm's tool parsers",
    "xgrammar": "vllm.v1.structured_output, reached from vllm.v1.request",
    "llguidance": "vllm.v1.structured_output (annotations of its grammar class)",
    "flashinfer-python": "the tests read its version; vllm.utils.flashinfer",
    "apache-tvm-ffi": "flashinfer's runtime, loaded by import flashinfer",
}

# Packages of WHEELS shipped as their wheel's files, trimmed like the fork
# wheel, instead of as a wheel.
UNPACKED = {
    "flashinfer-python": (
        "its wheel's CUDA sources (flashinfer/data: 43 MB compressed in 0.7.2) "
        "are for the kernels FlashInfer compiles at run time, which the Triton "
        "tests never do; the rest is 15 to 20 MB"
    ),
}

# Requirements of the packages above that the payload leaves out on purpose;
# every other requirement is in WHEELS or on the GPU host (HOST_PACKAGES).
OMITTED = {
    name: "FlashInfer loads it only for kernels the GPU tests do not run"
    for name in (
        "cuda-python",
        "cuda-tile",
        "nccl4py",
        "nccl-extensions",
        "nvidia-cudnn-frontend",
        "nvidia-cutlass-dsl",
    )
}

# What the GPU host (the H200 machine's image, as read on 2026-11-17) already
# has: the tests' own imitation of it is made of exactly these.
_HOST_PACKAGES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc
anyio attrs botorch build certifi charset-normalizer chex click cloudpickle
cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils
execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt
jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader
lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath
msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx
ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu
safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions
typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
xxhash yarl zipp
"""
HOST_PACKAGES = frozenset(_HOST_PACKAGES.split())

# What of the fork wheel stays behind, by why.
DROPPED_SUFFIXES = {
    ".so": "compiled",
    # Sources of kernels vLLM compiles at run time (DeepGEMM, CUTLASS FMHA);
    # the tests compile none of them.
    ".h": "C/C++/CUDA source",
    ".hpp": "C/C++/CUDA source",
    ".cuh": "C/C++/CUDA source",
    ".inl": "C/C++/CUDA source",
    ".cu": "C/C++/CUDA source",
    ".cpp": "C/C++/CUDA source",
    ".cc": "C/C++/CUDA source",
    ".c": "C/C++/CUDA source",
}
# Data files above this size are tools and web assets (the vllm-rs binary,
# the API docs' JavaScript), not something a test imports.
MAX_DATA_FILE_BYTES = 1 << 20
# The manylinux platforms whose wheels the payload may take; llguidance has
# only manylinux_2_31 wheels. The GPU host's Python 3.12.3 is Ubuntu 24.04's
# (glibc 2.39), and its pip refuses a wheel its glibc cannot load.
PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in (35, 34, 31, 28, 27, 17)),
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
# Copied from the checkout, for pytest to run from the archive's root.
CHECKOUT_PATHS = ("pyproject.toml", "tests", "tools")
# A fixed timestamp keeps the archive's bytes a function of its contents.
MTIME = 1767225600  # 2026-01-01


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def default_payload_name(base: str, python: str) -> str:
    return f"gpu-payload-vllm-{base}-cp{python.replace('.', '')}.tar.gz"


def installed_versions(site: Path) -> dict[str, str]:
    """Canonical name -> version of every distribution installed in ``site``."""
    return {
        canonical(d.metadata["Name"]): d.version
        for d in metadata.distributions(path=[str(site)])
    }


def pinned_wheels(site: Path) -> dict[str, str]:
    """``WHEELS`` with the versions installed in ``site`` (a dev venv). A
    package the venv lacks is no requirement of this base's vLLM (vLLM 0.33.0
    dropped openai-harmony, say) and stays out."""
    pin = load_pin()
    versions = installed_versions(site)
    if "vllm" not in versions:
        raise SystemExit(
            f"{site} has no vllm; the payload takes the versions of the base's "
            f"dev venv (python3 tools/fork/dev_env.py --base {pin.VLLM_VERSION})"
        )
    if versions.get("flashinfer-python") != pin.FLASHINFER_VERSION:
        raise SystemExit(
            f"{site} has flashinfer-python {versions.get('flashinfer-python')}, "
            f"the pin says {pin.FLASHINFER_VERSION}; run tools/fork/dev_env.py again"
        )
    for name in WHEELS:
        if name not in versions:
            log(f"{name}: not in {site}, so not a requirement of this base")
    return {name: versions[name] for name in WHEELS if name in versions}


def _fits(wheel_name: str, python: str) -> bool:
    """Whether a wheel file's Python and ABI tags load on CPython ``python``."""
    python_tags, abi_tag = wheel_name.removesuffix(".whl").split("-")[-3:-1]
    cp = f"cp{python.replace('.', '')}"
    for tag in python_tags.split("."):
        if tag in ("py3", cp) and abi_tag in ("none", cp):
            return True
        # A stable-ABI wheel serves its CPython and every later one.
        stable = abi_tag == "abi3" and tag.startswith("cp3")
        if stable and int(tag[3:]) <= int(cp[3:]):
            return True
    return False


def _cached_wheel(name: str, version: str, python: str) -> Path | None:
    prefix = f"{canonical(name).replace('-', '_')}-{version}-"
    for path in sorted(WHEEL_CACHE.glob("*.whl")):
        if path.name.lower().startswith(prefix) and _fits(path.name, python):
            return path
    return None


def fetch_wheels(versions: dict[str, str], python: str) -> dict[str, Path]:
    """The wheel of each ``name==version`` for ``python`` on manylinux x86_64,
    from ``WHEEL_CACHE`` or downloaded into it."""
    wheels = {}
    for name, version in versions.items():
        path = _cached_wheel(name, version, python)
        if path is None:
            WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
            platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
            run_pip(
                Path(sys.executable), "download", "-q", "--no-deps",
                "--only-binary=:all:", "--python-version", python,
                "--implementation", "cp", *platforms, "-d", WHEEL_CACHE,
                f"{name}=={version}", env=dict(os.environ),
            )  # fmt: skip
            path = _cached_wheel(name, version, python)
        if path is None:
            raise SystemExit(
                f"pip downloaded no wheel of {name}=={version} for CPython "
                f"{python} into {WHEEL_CACHE}"
            )
        wheels[name] = path
    return wheels


def _dropped(name: str, size: int) -> str | None:
    """Why the fork wheel's entry ``name`` stays out of the payload, if it
    does."""
    if ".dist-info/" in name:
        # RECORD would list the compiled files the payload leaves out.
        return "RECORD" if name.endswith("/RECORD") else None
    suffix = Path(name).suffix
    if ".so" in Path(name).suffixes:
        return DROPPED_SUFFIXES[".so"]
    if suffix in DROPPED_SUFFIXES:
        return DROPPED_SUFFIXES[suffix]
    if suffix != ".py" and size > MAX_DATA_FILE_BYTES:
        return f"data file over {MAX_DATA_FILE_BYTES >> 20} MiB"
    return None


def tree_entries(wheel: Path, summary: dict) -> Iterator[tuple[str, bytes]]:
    """(path, bytes) of the entries of a pure-Python-layout ``wheel`` that the
    payload keeps; adds the counts of what it kept and dropped to
    ``summary``."""
    kept = summary.setdefault("kept", {"files": 0, "bytes": 0})
    dropped = summary.setdefault("dropped", {})
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            if ".data/" in info.filename.split("/", 1)[0] + "/":
                raise SystemExit(f"{wheel.name}: {info.filename} needs an installer")
            why = _dropped(info.filename, info.file_size)
            counts = (
                kept
                if why is None
                else dropped.setdefault(why, {"files": 0, "bytes": 0})
            )
            counts["files"] += 1
            counts["bytes"] += info.file_size
            if why is None:
                yield info.filename, zf.read(info)


def stub_entries(fork_wheel: Path) -> Iterator[tuple[str, bytes]]:
    with zipfile.ZipFile(fork_wheel) as zf:
        names = set(zf.namelist())
    for path in STUBS:
        if path in names:
            raise SystemExit(f"{fork_wheel.name} has {path}; the stub would replace it")
        yield path, STUB_SOURCES.get(path, "").encode()


def checkout_files() -> Iterator[Path]:
    """Files of the checkout that pytest needs, relative to the repository."""
    for top in CHECKOUT_PATHS:
        root = REPO / top
        paths = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in paths:
            rel = path.relative_to(REPO)
            skip = {"__pycache__", ".pytest_cache"} & set(rel.parts)
            if path.is_file() and not skip and path.suffix != ".pyc":
                yield rel


def _write_archive(path: Path, members: Iterable[tuple[str, bytes]]) -> None:
    """A reproducible tar.gz of ``members`` (name, bytes); ``.py`` files at
    the top are executable."""
    with (
        path.open("wb") as f,
        gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = MTIME
            info.mode = 0o755 if name == ENTRY_POINT else 0o644
            tar.addfile(info, io.BytesIO(data))


def build_payload(
    out: Path,
    python: str,
    site: Path,
    wheel_dir: Path | None = None,
    fork_wheel: Path | None = None,
) -> dict:
    """Write the payload for the current base and CPython ``python`` to
    ``out``; ``site`` is the dev venv whose package versions it takes, and
    ``fork_wheel`` a fork wheel already built (else one is built into
    ``wheel_dir``). Returns the manifest (also stored in the archive as
    ``payload.json``)."""
    from tools.fork.build_wheel import build, fork_version

    pin = load_pin()
    versions = pinned_wheels(site)
    wheels = fetch_wheels(versions, python)
    fork_wheel = fork_wheel or build(wheel_dir or REPO / "dist")
    manifest: dict = {
        "base": pin.VLLM_VERSION,
        "vllm": fork_version(),
        "python": python,
        "tree": TREE,
        "stubs": STUBS,
        "unpacked": {
            name: {"version": versions[name], "why": UNPACKED[name]}
            for name in wheels
            if name in UNPACKED
        },
        "wheels": {
            name: {"version": versions[name], "file": f"wheels/{path.name}"}
            for name, path in wheels.items()
            if name not in UNPACKED
        },
    }

    def members() -> Iterator[tuple[str, bytes]]:
        trees = [fork_wheel, *(wheels[name] for name in manifest["unpacked"])]
        for wheel in trees:
            for name, data in tree_entries(wheel, manifest):
                yield f"{TREE}/{name}", data
        for name, data in stub_entries(fork_wheel):
            yield f"{TREE}/{name}", data
        for name in manifest["wheels"]:
            yield f"wheels/{wheels[name].name}", wheels[name].read_bytes()
        files = list(checkout_files())
        for rel in files:
            yield rel.as_posix(), (REPO / rel).read_bytes()
        manifest["checkout_files"] = len(files)
        yield ENTRY_POINT, Path(__file__).with_name("gpu_payload_run.py").read_bytes()
        yield MANIFEST, json.dumps(manifest, indent=1).encode()

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial")
    try:
        _write_archive(tmp, members())
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    size = out.stat().st_size
    manifest["archive_bytes"] = size
    if size > MAX_ARCHIVE_BYTES:
        raise SystemExit(
            f"{out} is {size / 2**20:.1f} MiB, over the "
            f"{MAX_ARCHIVE_BYTES >> 20} MiB a call carries to the GPU host"
        )
    return manifest


def describe(out: Path, manifest: dict) -> str:
    unpacked = ", ".join(manifest["unpacked"]) or "no other"
    lines = [
        (
            f"{out} ({manifest['archive_bytes'] / 2**20:.1f} MiB): vLLM "
            f"{manifest['vllm']} for CPython {manifest['python']}"
        ),
        (
            f"  {TREE}/: {manifest['kept']['files']} files, "
            f"{manifest['kept']['bytes'] / 1e6:.1f} MB from the fork wheel and "
            f"{unpacked}; left out:"
        ),
    ]
    for why, d in sorted(manifest["dropped"].items()):
        lines.append(f"    {d['files']} files, {d['bytes'] / 1e6:.1f} MB ({why})")
    lines.append("  stubs:")
    lines += [f"    {path}: {why}" for path, why in manifest["stubs"].items()]
    for name, u in manifest["unpacked"].items():
        lines.append(f"  {name}=={u['version']} unpacked: {u['why']}")
    lines.append(f"  wheels/: {len(manifest['wheels'])} wheels")
    for name, w in manifest["wheels"].items():
        lines.append(f"    {name}=={w['version']}")
    lines.append(
        f"  {manifest['checkout_files']} files of {', '.join(CHECKOUT_PATHS)}; "
        f"entry point {ENTRY_POINT}"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_base_argument(parser)
    parser.add_argument(
        "--python", default="3.12", help="the GPU host's CPython (default 3.12)"
    )
    parser.add_argument("--out", type=Path, help="archive path (default: dist/...)")
    parser.add_argument(
        "--venv",
        type=Path,
        help="dev venv whose package versions the wheels take (default: the "
        "base's, .venv or .venv-<base>)",
    )
    args = parser.parse_args()
    if not re.fullmatch(r"3\.\d+", args.python):
        parser.error(f"--python {args.python}: give major.minor, e.g. 3.12")
    pin = select_base(args.base)
    venv = args.venv or venv_dir(".venv")
    if not venv.exists():
        raise SystemExit(
            f"no dev venv {venv}; make it with python3 tools/fork/dev_env.py "
            f"--base {pin.VLLM_VERSION}"
        )
    out = args.out or REPO / "dist" / default_payload_name(
        pin.VLLM_VERSION, args.python
    )
    manifest = build_payload(out, args.python, site_packages(venv))
    log(f"wrote {out}")
    print(describe(out, manifest))


if __name__ == "__main__":
    main()
