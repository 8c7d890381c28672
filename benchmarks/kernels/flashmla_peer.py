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
