# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The FlashMLA that vLLM ships, as the sparse-MLA benchmark's peer.

vLLM's SM90 / SM100 DeepSeek V4.1 layers decode through FlashMLA's sparse
FP8 kernel (``vllm._flashmla_C`` behind
``vllm.third_party.flashmla.flash_mla_interface``) on the same 584-byte
``fp8_ds_mla`` pages the Triton kernel reads. The peer calls it as vLLM's
FlashMLA layer does: each query token its own batch entry (``s_q`` = 1,
DSpark's tokens included), the SWA pool as the main cache and the compressed
pool as the extra cache, per-entry top-k lengths and sinks, the heads padded
to the 64 or 128 FlashMLA takes.
"""

import torch


def load():
    """vLLM's FlashMLA decode entry point, or the reason it is unavailable."""
    try:
        from vllm.third_party.flashmla import flash_mla_interface
    except Exception as e:  # not built for this torch or GPU
        return None, f"{type(e).__name__}: {e}"
    return flash_mla_interface, None


class FlashMLAPeer:
    """FlashMLA's decode on the benchmark's inputs. The head padding (zero
    queries, -inf sinks), the output buffer and FlashMLA's scheduling (its
    first call plans; vLLM plans once a step and reuses it across layers)
    are made once, outside the timed region."""

    def __init__(self, interface) -> None:
        self.fmla = interface

    def prepare(self, x: dict):
        """Return the per-step call, which is what gets timed; it returns
        the output view of the real heads."""
        q = x["query"]
        tokens, heads, dim = q.shape
        padded = 64 if heads <= 64 else 128
        qp = torch.zeros(tokens, 1, padded, dim, dtype=q.dtype, device=q.device)
        qp[:, 0, :heads] = q
        sinks = torch.full((padded,), float("-inf"), device=q.device)
        sinks[:heads] = x["sinks"]
        out = torch.empty_like(qp)
        sched, _ = self.fmla.get_mla_metadata()
        swa = x["swa"].view(torch.uint8)
        cmp = None if x["cmp"] is None else x["cmp"].view(torch.uint8)

        def run() -> torch.Tensor:
            self.fmla.flash_mla_with_kvcache(
                q=qp,
                k_cache=swa,
                block_table=None,
                cache_seqlens=None,
                head_dim_v=dim,
                tile_scheduler_metadata=sched,
                softmax_scale=x["scale"],
                is_fp8_kvcache=True,
                indices=x["swa_idx"],
                topk_length=x["swa_lens"],
                attn_sink=sinks,
                extra_k_cache=cmp,
                extra_indices_in_kvcache=x["cmp_idx"],
                extra_topk_length=x["cmp_lens"],
                out=out,
            )
            return out[:, 0, :heads]

        run()  # plans
        return run


def load_gather():
    """vLLM's dequantize-and-gather of paged K rows into BF16 (the step its
    FlashMLA layer runs before the sparse prefill kernel), or the reason it
    is unavailable."""
    try:
        from vllm.models.deepseek_v41.common.ops.cache_utils import (
            dequantize_and_gather_k_cache,
        )
        from vllm.utils.import_utils import has_cutedsl
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"
    return dequantize_and_gather_k_cache, "cutedsl" if has_cutedsl() else "triton"


class FlashMLAPrefillPeer:
    """FlashMLA's sparse prefill the way vLLM's DeepSeek V4.1 FlashMLA layer
    runs it for one request's chunk: the request's compressed rows, then its
    SWA rows from the first one any query token sees, are dequantised into a
    BF16 workspace (two gathers), and ``flash_mla_sparse_fwd`` attends over
    workspace positions. Heads are not padded on SM90 at 8/16/32 (the layer
    passes its local heads), 64 and 128 run as they are.

    The per-token workspace positions (the layer builds them with
    ``combine_topk_swa_indices`` from the indexer's output) are made once
    here, outside the timed region, from the same candidates the op reads."""

    def __init__(self, interface, gather) -> None:
        self.fmla = interface
        self.gather = gather

    def prepare(self, x: dict):
        """Return (the gathers plus the kernel, the kernel alone); each
        returns the output."""
        p = x["prefill"]
        q = x["query"]
        tokens, heads, dim = q.shape
        n_cmp, n_swa = p["n_cmp"], p["swa_gather"]
        kv = torch.empty(1, n_cmp + n_swa, dim, dtype=torch.bfloat16, device=q.device)
        seq = torch.tensor([p["seq_len"]], dtype=torch.int32, device=q.device)
        cmp_seq = torch.tensor([n_cmp], dtype=torch.int32, device=q.device)
        swa_gather = torch.tensor([n_swa], dtype=torch.int32, device=q.device)
        out = torch.empty_like(q)
        flat_kv = kv.view(-1, 1, dim)
        indices = p["ws_idx"].unsqueeze(1)

        def gathers() -> None:
            self.gather(
                kv, x["cmp"], seq_lens=cmp_seq, gather_lens=None,
                block_table=p["cmp_table"], block_size=p["page"], offset=0,
            )  # fmt: skip
            self.gather(
                kv, x["swa"], seq_lens=seq, gather_lens=swa_gather,
                block_table=p["swa_table"], block_size=p["page"], offset=n_cmp,
            )  # fmt: skip

        def kernel() -> torch.Tensor:
            self.fmla.flash_mla_sparse_fwd(
                q=q, kv=flat_kv, indices=indices, sm_scale=x["scale"],
                attn_sink=x["sinks"], topk_length=p["ws_lens"], out=out,
            )  # fmt: skip
            return out

        def both() -> torch.Tensor:
            gathers()
            return kernel()

        return both, kernel
