# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The stripped Triton wheel of the GPU-host bundle, from a small wheel laid
out as Triton's is: what it keeps and drops, its RECORD, and pip installing
it."""

import base64
import csv
import hashlib
import io
import subprocess
import sys
import zipfile
from pathlib import Path

from tools.fork import triton_wheel

NAME = "triton-9.9.0-cp312-cp312-manylinux_2_28_x86_64.whl"
DIST_INFO = "triton-9.9.0.dist-info"
KEPT = {
    "triton/__init__.py": b"version = '9.9.0'\n",
    "triton/_C/libtriton.so": b"\x7fELF" + bytes(range(256)) * 64,
    "triton/backends/nvidia/compiler.py": b"# the NVIDIA backend\n",
    "triton/backends/nvidia/lib/libdevice.10.bc": b"BC" * 100,
    "triton/backends/nvidia/include/cuda.h": b"/* header */\n",
    "triton/profiler/__init__.py": b"",
}
DROPPED = {
    "triton/backends/amd/compiler.py": b"# AMD\n",
    "triton/backends/nvidia/bin/ptxas": b"ptxas",
    "triton/backends/nvidia/bin/ptxas-blackwell": b"ptxas",
    "triton/backends/nvidia/bin/nvdisasm": b"nvdisasm",
    "triton/backends/nvidia/lib/cupti/libcupti.so": b"cupti",
    "triton/backends/nvidia/lib/cupti-blackwell/libcupti.so": b"cupti",
    "triton/_C/libproton.so": b"proton",
    "triton/instrumentation/libGPUInstrumentationTestLib.so": b"x",
}
METADATA = {
    f"{DIST_INFO}/METADATA": b"Metadata-Version: 2.1\nName: triton\nVersion: 9.9.0\n",
    f"{DIST_INFO}/WHEEL": (
        b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
        b"Tag: cp312-cp312-manylinux_2_28_x86_64\n"
    ),
}


def _wheel(tmp_path: Path) -> Path:
    path = tmp_path / "in" / NAME
    path.parent.mkdir()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in {**KEPT, **DROPPED, **METADATA}.items():
            z.writestr(name, data)
        z.writestr(f"{DIST_INFO}/RECORD", "stale,,\n")
    return path


def test_stripped_wheel_keeps_the_compiler_and_records_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    stripped = triton_wheel.strip(_wheel(tmp_path), out)
    assert stripped == out / NAME
    with zipfile.ZipFile(stripped) as z:
        names = set(z.namelist())
        assert names == {*KEPT, *METADATA, f"{DIST_INFO}/RECORD"}
        for name, data in {**KEPT, **METADATA}.items():
            assert z.read(name) == data
        rows = list(csv.reader(io.StringIO(z.read(f"{DIST_INFO}/RECORD").decode())))
    recorded = {r[0]: r[1:] for r in rows}
    assert set(recorded) == names
    for name, data in {**KEPT, **METADATA}.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
        digest = digest.rstrip(b"=").decode()
        assert recorded[name] == [f"sha256={digest}", str(len(data))]


def test_pip_installs_the_stripped_wheel(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    stripped = triton_wheel.strip(_wheel(tmp_path), out)
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
         "--ignore-requires-python", "--platform", "manylinux_2_28_x86_64",
         "--python-version", "3.12", "--only-binary=:all:",
         "--target", str(target), str(stripped)],
        check=True,
    )  # fmt: skip
    assert (target / "triton/_C/libtriton.so").read_bytes() == KEPT[
        "triton/_C/libtriton.so"
    ]
    assert not (target / "triton/backends/amd").exists()
    assert not (target / "triton/backends/nvidia/bin").exists()


def test_environment_points_triton_at_the_toolkit() -> None:
    env = triton_wheel.environment("/opt/cuda-13.0")
    assert env == {
        "TRITON_BACKENDS_IN_TREE": "1",
        "TRITON_PTXAS_PATH": "/opt/cuda-13.0/bin/ptxas",
        "TRITON_PTXAS_BLACKWELL_PATH": "/opt/cuda-13.0/bin/ptxas",
        "TRITON_CUOBJDUMP_PATH": "/opt/cuda-13.0/bin/cuobjdump",
        "TRITON_NVDISASM_PATH": "/opt/cuda-13.0/bin/nvdisasm",
    }
