#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Set up the GPU machine (no vLLM installed there) for the DSV4.1 sparse-MLA
# benchmark and tests, then run the given command. Run from the repository
# root with the git-ignored .peers/ folder carried along:
#   .peers/vllm_src.tgz  vLLM 0.30.0's *.py files and dist-info (the kernel
#                        module imports vllm.triton_utils)
# and, optionally, FlashMLA's peer extension built outside the repository
# (see benchmarks/kernels/flashmla_peer.py). Example:
#   bash benchmarks/kernels/dsv41_sparse_mla_device.sh \
#     python3 benchmarks/kernels/benchmark_dsv41_sparse_mla.py \
#       --flashmla-module PATH --out-dir "$OUT"
set -euo pipefail
echo "repository root: $PWD"
site=$(mktemp -d /tmp/vllm_site.XXXXXX)
mkdir -p "$site"
tar xzf .peers/vllm_src.tgz -C "$site"
# vllm/platforms/cuda.py imports this compiled module at import time; the
# Triton kernel uses no compiled vLLM op, so an empty stand-in is enough.
touch "$site/vllm/_C_stable_libtorch.py"
# This repository's kernel replaces the pinned vLLM's copy of the module.
# (The tarball may hold a link to this very file: replace, don't write through.)
dst="$site/vllm/v1/attention/ops/triton_dsv41_sparse_mla.py"
rm -f "$dst"
cp vllm/v1/attention/ops/triton_dsv41_sparse_mla.py "$dst"
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1
"$@"
