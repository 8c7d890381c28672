# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""vLLM's small-head Triton sparse decode for SM90, as a benchmark peer.

A development branch of vLLM, in no release, decodes DeepSeek V4.1 at 8 or
16 local heads on Hopper with its own Triton kernel,
``small_head_sparse_decode``, over the same 584-byte ``fp8_ds_mla`` pages and
global slot ids. The benchmark takes the path of a copy of that file, loads it
as a module, calls its entry point and records the file's sha256 as
provenance.
"""

import hashlib
import importlib.util
from pathlib import Path

import torch

ENTRY = "small_head_sparse_decode"
HEADS = (8, 16)


def load(path: str):
    """(module, sha256 of the file) for the copy at ``path``."""
    data = Path(path).read_bytes()
    spec = importlib.util.spec_from_file_location("small_head_peer_copy", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, ENTRY, None)):
        raise ValueError(f"{path} has no {ENTRY}()")
    return module, hashlib.sha256(data).hexdigest()


class SmallHeadPeer:
    """The upstream decode on the benchmark's inputs: the SWA pool as its
    main cache, the compressed pool (when present) as its extra cache, the
    same slot ids, live lengths and sinks. It takes 8 or 16 heads only; its
    own gate in vLLM sends it at most 16 tokens, the benchmark times it at
    every token count to compare kernels."""

    def __init__(self, module) -> None:
        self.fn = getattr(module, ENTRY)

    @staticmethod
    def supports(heads: int) -> bool:
        return heads in HEADS

    def prepare(self, x: dict):
        q = x["query"]
        out = torch.empty_like(q)
        heads = q.shape[1]

        def run() -> torch.Tensor:
            self.fn(
                q, x["swa"], x["swa_idx"], x["swa_lens"],
                x["cmp"], x["cmp_idx"], x["cmp_lens"],
                x["sinks"], x["scale"], out, heads,
            )  # fmt: skip
            return out

        return run
