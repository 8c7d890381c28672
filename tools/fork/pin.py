# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The upstream release this fork is a delta over.

This is the only place the pinned versions live. The build and environment
scripts under ``tools/fork/`` load this file directly (it imports nothing, so
it can be read without vLLM installed).
"""

# vLLM release whose files the fork edits in place and adds to.
VLLM_VERSION = "0.30.0"
# The upstream wheel the fork wheel is assembled from, checked before use.
VLLM_WHEEL = "vllm-0.30.0-cp38-abi3-manylinux_2_28_x86_64.whl"
VLLM_WHEEL_SHA256 = "ef52ee58c410ead0b8afb190838fa4cbcb52075596f67862a03859d984966ac4"
# vLLM 0.30.0 requires exactly these.
TORCH_VERSION = "2.13.0"
FLASHINFER_VERSION = "0.6.18.post1"
# PEP 440 local version label of the fork wheel: 0.30.0+dsv41sm12x.
LOCAL_VERSION_TAG = "dsv41sm12x"
# Packages vLLM's metadata pulls in that do not load beside the pinned torch
# ("operator torchvision::nms does not exist"); nothing the fork runs needs them.
INCOMPATIBLE_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
