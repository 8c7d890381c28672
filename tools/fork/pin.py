# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The upstream releases the fork is written over.

This is the only place the pinned versions live. The build and environment
scripts under ``tools/fork/`` load this file directly (it imports nothing, so
it can be read without vLLM installed). Which base a command works on is one
setting: the scripts' ``--base`` flag, which sets ``VLLM_FORK_BASE`` for
everything they run, or that variable itself.
"""

# vLLM release -> the upstream wheels the fork is built from, per CPU
# architecture (file name and sha256, checked before use; x86_64 for B200 and
# RTX hosts, aarch64 for GB200 and GB10 / DGX Spark), and the torch and
# FlashInfer that release requires exactly.
BASES = {
    # The seed's base.
    "0.30.0": {
        "WHEELS": {
            "x86_64": (
                "vllm-0.30.0-cp38-abi3-manylinux_2_28_x86_64.whl",
                "ef52ee58c410ead0b8afb190838fa4cbcb52075596f67862a03859d984966ac4",
            ),
            "aarch64": (
                "vllm-0.30.0-cp38-abi3-manylinux_2_28_aarch64.whl",
                "eb3e11bab695d085098579a6eda2d602419adec3826ebfbcce9a3ffa543eb62e",
            ),
        },
        "TORCH_VERSION": "2.13.0",
        "FLASHINFER_VERSION": "0.6.18.post1",
    },
    # The newest release: the base of the upstream pull request.
    "0.33.0": {
        "WHEELS": {
            "x86_64": (
                "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
                "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",
            ),
            "aarch64": (
                "vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl",
                "e9e404f52c8494b69bd83fe99fe7ecfa9f6b89fbd156d2a9639c24ea41d6d606",
            ),
        },
        "TORCH_VERSION": "2.14.0",
        "FLASHINFER_VERSION": "0.7.2.post1",
    },
}
# The architecture tools build for when none is named (this machine's kind).
DEFAULT_ARCH = "x86_64"
DEFAULT_BASE = "0.30.0"
BASE_ENV = "VLLM_FORK_BASE"
# PEP 440 local version label of the fork wheels: 0.30.0+dsv41sm12x.
LOCAL_VERSION_TAG = "dsv41sm12x"
# Packages vLLM's metadata pulls in that do not load beside a CPU torch
# ("operator torchvision::nms does not exist"); nothing the fork runs needs them.
INCOMPATIBLE_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
