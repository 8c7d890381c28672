# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The base's Triton for a GPU host whose torch brought an older one.

Triton comes with torch, so a host keeps its own; the base's torch requires
a newer Triton (the one vLLM's kernels are compiled by where users run
them). That Triton runs beside the host's torch once it is cut down to the
compiler and the NVIDIA backend: the AMD backend, CUPTI, its own copies of
the CUDA binaries and the profiler go, so that it fits in few device calls.
The host's CUDA toolkit stands in for the binaries (``environment``).
"""

import csv
import io
import os
import zipfile
from pathlib import Path

from tools.fork.common import record_row

# Wheel entries left out, by path prefix.
DROPPED = (
    "triton/backends/amd/",
    "triton/backends/nvidia/bin/",
    "triton/backends/nvidia/lib/cupti",
    "triton/_C/libproton.so",
    "triton/instrumentation/",
)
# Triton reads these for the tools it no longer carries.
TOOL_VARIABLES = {
    "TRITON_PTXAS_PATH": "ptxas",
    "TRITON_PTXAS_BLACKWELL_PATH": "ptxas",
    "TRITON_CUOBJDUMP_PATH": "cuobjdump",
    "TRITON_NVDISASM_PATH": "nvdisasm",
}


def strip(wheel: Path, out_dir: Path) -> Path:
    """``wheel`` without ``DROPPED``, under its own name in ``out_dir``, with
    a RECORD that lists what it holds. Entries are LZMA-compressed (about a
    third smaller than deflate for ``libtriton.so``); pip reads them through
    ``zipfile``."""
    out = out_dir / wheel.name
    rows = []
    with (
        zipfile.ZipFile(wheel) as src,
        zipfile.ZipFile(out, "w", compression=zipfile.ZIP_LZMA) as dst,
    ):
        record = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        for info in src.infolist():
            if info.filename == record or info.filename.startswith(DROPPED):
                continue
            data = src.read(info)
            dst.writestr(info, data, compress_type=zipfile.ZIP_LZMA)
            rows.append(record_row(info.filename, data))
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows([*rows, [record, "", ""]])
        dst.writestr(record, text.getvalue(), compress_type=zipfile.ZIP_LZMA)
    return out


def environment(cuda_home: str | None = None) -> dict[str, str]:
    """What a stripped Triton needs: its own backends found in its tree (the
    host Triton's entry points name backends this one lacks) and the CUDA
    toolkit's binaries in place of its own."""
    home = Path(cuda_home or os.environ.get("CUDA_HOME") or "/usr/local/cuda")
    env = {"TRITON_BACKENDS_IN_TREE": "1"}
    env.update({k: str(home / "bin" / v) for k, v in TOOL_VARIABLES.items()})
    return env
