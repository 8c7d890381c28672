# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The new modules only add files: none may sit at a path upstream vLLM has
(upstream files change through the edit list)."""

import csv
import io
import zipfile

from tools.fork.common import NEW_MODULES, REPO, load_pin, new_module_files


def _upstream_record(wheel) -> set[str]:
    pin = load_pin()
    with zipfile.ZipFile(wheel) as zf:
        text = zf.read(f"vllm-{pin.VLLM_VERSION}.dist-info/RECORD").decode()
    return {row[0] for row in csv.reader(io.StringIO(text)) if row}


def test_no_new_module_shadows_upstream(upstream_wheel_path):
    record = _upstream_record(upstream_wheel_path)
    # Sanity: the RECORD really is upstream's package listing.
    assert "vllm/models/deepseek_v41/nvidia/flashinfer_sparse.py" in record
    files = [str(p) for p in new_module_files()]
    assert files, "the fork has no new modules"
    assert sorted(set(files) & record) == []


def test_new_modules_live_under_vllm_only():
    for path in new_module_files():
        assert (REPO / path).resolve().is_relative_to(NEW_MODULES)
