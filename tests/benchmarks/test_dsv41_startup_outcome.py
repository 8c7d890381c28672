# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The start-up recorder, run as a subprocess on stand-in commands whose
output and exit status are known."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "dsv41_startup_outcome.py"


def _record(tmp_path: Path, program: str) -> dict:
    out = tmp_path / "run.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--",
         sys.executable, "-c", program],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(out.read_text())
    return json.loads(out.read_text())


BINDING = (
    "import sys, time\n"
    "print('INFO Model loading took 1.2 GiB memory and 3.0 seconds', flush=True)\n"
    "time.sleep(0.3)\n"
    "print('ValueError: FLASHMLA_SPARSE_DSV41 needs 64-token kernel blocks, "
    "which packed 128-token KV cache blocks cannot be split into.')\n"
    "sys.exit(1)\n"
)


def test_a_failure_after_the_weights_is_dated_after_them(tmp_path):
    record = _record(tmp_path, BINDING)
    assert record["returncode"] == 1
    assert record["outcome"] == "failed at binding"
    assert record["weights_loaded_s"] is not None
    assert record["at_s"] >= record["weights_loaded_s"] + 0.3
    assert record["line"].startswith("ValueError: FLASHMLA_SPARSE_DSV41")
    log = (tmp_path / "run.log").read_text().splitlines()
    assert len(log) == 2 and log[1].lstrip("[ ").split("]")[0] == str(record["at_s"])


REFUSED = (
    "import sys\n"
    "print('ValueError: --block-size 128 cannot serve DeepSeek V4.1: x')\n"
    "sys.exit(1)\n"
)

BACKEND_REFUSED = (
    "import sys\n"
    "print('ValueError: --attention-backend TRITON_MLA_SPARSE_DSV41 has no "
    "DeepSeek V4.1 kernel for SM100 GPUs. Leave')\n"
    "sys.exit(1)\n"
)


@pytest.mark.parametrize(
    "program, outcome, code",
    [
        (
            REFUSED,
            "refused at start-up",
            1,
        ),
        (
            BACKEND_REFUSED,
            "refused at start-up",
            1,
        ),
        # The earlier page policy's refusal is no longer the layers' message.
        (
            "import sys; print('UnsupportedSparseMLAConfig: x'); sys.exit(1)",
            "other failure",
            1,
        ),
        ("print('No common block size for 16')", "no common block size", 0),
        ("import sys; print('Traceback'); sys.exit(3)", "other failure", 3),
        ("print('done')", "ran", 0),
    ],
)
def test_outcomes(tmp_path, program, outcome, code):
    record = _record(tmp_path, program)
    assert (record["outcome"], record["returncode"]) == (outcome, code)
    assert record["weights_loaded_s"] is None
