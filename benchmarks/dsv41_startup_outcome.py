# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Run a vLLM command and record where its start-up ended and when.

    python benchmarks/dsv41_startup_outcome.py --out OUT.json -- CMD [ARGS...]

Writes ``OUT.log`` (every output line prefixed with the seconds since launch)
and ``OUT.json``: the exit status, the elapsed seconds, when the weights were
loaded (vLLM's "Model loading took" line), and the outcome with the line that
decided it: ``refused at start-up`` (the DeepSeek V4.1 layers' --block-size
check or the model's --attention-backend check, before weights),
``failed at binding`` (a KV cache that cannot be split into kernel blocks),
``no common block size``, ``other failure`` or ``ran``.
"""

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

# Checked in order: the first pattern any line matches decides the outcome.
OUTCOMES = (
    (
        "refused at start-up",
        re.compile(
            r"--block-size \d+ cannot serve DeepSeek V4\.1"
            r"|--attention-backend \S+ has no DeepSeek V4\.1 kernel"
        ),
    ),
    ("failed at binding", re.compile(r"cannot be split into")),
    ("no common block size", re.compile(r"No common block size")),
)
WEIGHTS_LOADED = re.compile(r"Model loading took|Loading weights took")


def classify(lines: list[tuple[float, str]], returncode: int) -> dict:
    """The outcome of a run from its timed output lines and exit status."""
    weights = next((t for t, line in lines if WEIGHTS_LOADED.search(line)), None)
    for outcome, pattern in OUTCOMES:
        hit = next(((t, line) for t, line in lines if pattern.search(line)), None)
        if hit is not None:
            return {
                "outcome": outcome,
                "at_s": hit[0],
                "line": hit[1].strip(),
                "weights_loaded_s": weights,
            }
    outcome = "ran" if returncode == 0 else "other failure"
    last = lines[-1][1].strip() if lines else ""
    return {"outcome": outcome, "at_s": None, "line": last, "weights_loaded_s": weights}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    start = time.monotonic()
    lines: list[tuple[float, str]] = []
    with (
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as proc,
        args.out.with_suffix(".log").open("w") as log,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            elapsed = round(time.monotonic() - start, 1)
            lines.append((elapsed, line))
            log.write(f"[{elapsed:7.1f}] {line}")
    record = {
        "command": command,
        "returncode": proc.returncode,
        "elapsed_s": round(time.monotonic() - start, 1),
        **classify(lines, proc.returncode),
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record))
    sys.exit(0)


if __name__ == "__main__":
    main()
