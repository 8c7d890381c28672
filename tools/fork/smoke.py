# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Smoke check run by the interpreter of a venv the fork wheel was installed in.

    <venv>/bin/python tools/fork/smoke.py

Exits non-zero unless the installed vLLM is the fork wheel, the overlay is
imported from it, vLLM's own plugin loader activates the fork, and loading
the DeepSeek V4.1 model's modules binds the fork into them.
"""

import importlib.metadata
import sys
from pathlib import Path


def main() -> None:
    import vllm
    import vllm.plugins
    from vllm.plugins import deepseek_v4_1_blackwell as fork
    from vllm.plugins.deepseek_v4_1_blackwell.pin import LOCAL_VERSION_TAG

    installed = importlib.metadata.version("vllm")
    site = Path(vllm.__file__).resolve().parent
    overlay = Path(fork.__file__).resolve()
    failures = []
    if not installed.endswith("+" + LOCAL_VERSION_TAG):
        failures.append(f"installed vllm is {installed}, not the fork wheel")
    if site not in overlay.parents:
        failures.append(f"overlay imported from {overlay}, outside {site}")
    vllm.plugins.load_general_plugins()
    if not fork._registered:
        failures.append("vLLM's plugin loader did not activate the fork")
    # The bindings into the model's modules apply as those modules load.
    from vllm.models.deepseek_v41.nvidia import flashinfer_sparse, model
    from vllm.plugins.deepseek_v4_1_blackwell.hooks import _WRAPPED

    launcher = flashinfer_sparse.flashinfer_trtllm_batch_decode_sparse_mla_dsv4
    for name, bound in (
        ("_select_dsv4_attn_cls", model._select_dsv4_attn_cls),
        ("flashinfer_trtllm_batch_decode_sparse_mla_dsv4", launcher),
    ):
        if not getattr(bound, _WRAPPED, False):
            failures.append(f"{name} was not bound when the model loaded")
    for failure in failures:
        print(f"SMOKE FAIL: {failure}", file=sys.stderr)
    if failures:
        sys.exit(1)
    print(f"smoke ok: vllm {installed} from {site}; fork plugin active")


if __name__ == "__main__":
    main()
