# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""FlashMLA's SM90 sparse FP8 decode (DeepSeek V4 "MODEL1" records) as the
benchmark's peer, run on the benchmark's pools.

FlashMLA is no part of this repository: neither its sources nor a build of
them, nor a recipe for one. The benchmark takes an extension module built
outside it (``--flashmla-module PATH``) that exposes ``plan(swa_lens,
cmp_lens, heads, swa_topk, cmp_topk) -> (metadata, splits)`` and
``decode(q, swa, swa_idx, swa_lens, sinks, cmp, cmp_idx, cmp_lens, metadata,
splits, out, lse, o_acc, lse_acc, scale)`` over FlashMLA's MODEL1 kernels,
where the compressed segment's ``cmp_lens``, ``cmp``, ``cmp_idx`` may be
``None`` (``cmp_topk`` 0: SWA only, as DSpark's draft layer);
``VERSIONS`` beside it names the FlashMLA and CUTLASS commits.
"""

import importlib.util
from importlib.machinery import ExtensionFileLoader
from pathlib import Path

import torch


def load_module(path: str):
    """The built extension at ``path``."""
    spec = importlib.util.spec_from_loader(
        "flashmla_peer", ExtensionFileLoader("flashmla_peer", path)
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def version(path: str) -> str:
    """The FlashMLA and CUTLASS commits the module at ``path`` was built from."""
    versions = Path(path).with_name("VERSIONS")
    return versions.read_text().strip() if versions.exists() else "unknown"


class FlashMLAPeer:
    """FlashMLA's decode on the benchmark's inputs: each query token is its
    own batch entry (s_q = 1) with its own top-k lengths; the SWA pool is
    FlashMLA's main cache and the compressed pool its extra cache. FlashMLA
    takes 64 or 128 heads only, so fewer heads run padded to 64 (zero
    queries, -inf sinks), as they would in a serving stack; the padding is
    made once, outside the timed region."""

    def __init__(self, module) -> None:
        self.mod = module

    def prepare(self, x: dict):
        """Plan (FlashMLA's get_mla_metadata step) and allocate once; return
        the per-step call, which is what gets timed, and its output view."""
        q = x["query"]
        tokens, heads, dim = q.shape
        padded = 64 if heads <= 64 else 128
        qp = torch.zeros(tokens, 1, padded, dim, dtype=q.dtype, device=q.device)
        qp[:, 0, :heads] = q
        sinks = torch.full((padded,), float("-inf"), device=q.device)
        sinks[:heads] = x["sinks"]
        has_cmp = x["cmp"] is not None
        meta, splits = self.mod.plan(
            x["swa_lens"],
            x["cmp_lens"],
            padded,
            x["swa_idx"].shape[-1],
            x["cmp_idx"].shape[-1] if has_cmp else 0,
        )
        parts = meta.shape[0]
        out = torch.empty_like(qp)
        lse = torch.empty(tokens, 1, padded, device=q.device)
        o_acc = torch.empty(tokens + parts, 1, padded, dim, device=q.device)
        lse_acc = torch.empty(tokens + parts, 1, padded, device=q.device)
        swa = x["swa"].view(torch.uint8)
        cmp = x["cmp"].view(torch.uint8) if has_cmp else None

        def run() -> torch.Tensor:
            self.mod.decode(
                qp,
                swa,
                x["swa_idx"],
                x["swa_lens"],
                sinks,
                cmp,
                x["cmp_idx"],
                x["cmp_lens"],
                meta,
                splits,
                out,
                lse,
                o_acc,
                lse_acc,
                x["scale"],
            )
            return out[:, 0, :heads]

        return run
