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
# FlashInfer that release requires exactly (UPSTREAM_FLASHINFER_VERSION: the
# one upstream's metadata names, where the fork wheel requires another).
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
    # The current release: the default and the base of the upstream pull
    # request. It pins flashinfer-python 0.7.3, which the package index does
    # not publish; the fork wheel requires 0.7.4, the nearest release there
    # (its SM120 sparse-MLA decode envelope reads the same).
    "0.34.0": {
        "WHEELS": {
            "x86_64": (
                "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl",
                "79ca4b3cd74aec08c4bf476bdf0cb15735b605ae5368526a2faae1e30f044ca2",
            ),
            "aarch64": (
                "vllm-0.34.0-cp38-abi3-manylinux_2_28_aarch64.whl",
                "7d96231fc141ad4b3a441292b77362b285b335ca7d1b0e2ab441d4ebde82f405",
            ),
        },
        "TORCH_VERSION": "2.14.0",
        "FLASHINFER_VERSION": "0.7.4",
        "UPSTREAM_FLASHINFER_VERSION": "0.7.3",
    },
}
# The architecture tools build for when none is named (this machine's kind).
DEFAULT_ARCH = "x86_64"
DEFAULT_BASE = "0.34.0"
BASE_ENV = "VLLM_FORK_BASE"
# PEP 440 local version label of the fork wheels: 0.30.0+dsv41sm12x.
LOCAL_VERSION_TAG = "dsv41sm12x"
# Packages vLLM's metadata pulls in that do not load beside a CPU torch
# ("operator torchvision::nms does not exist"); nothing the fork runs needs them.
INCOMPATIBLE_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
