# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""DeepGEMM for vLLM 0.30.0's indexer on a GPU host whose torch is older than
the one that release pins: the newer vLLM wheel's DeepGEMM (2.8.1, built on
torch's stable ABI, so it loads there), presented with 0.30.0's calls.

vLLM 0.30.0's own DeepGEMM (2.8.0) is compiled against torch 2.13 and does not
load on the H200's torch 2.11; vLLM imports a top-level ``deep_gemm`` before
its vendored copy. So the serving run copies the 0.33.0 wheel's
``vllm/third_party/deep_gemm`` to ``deep_gemm_281`` and this file to
``deep_gemm.py``, side by side on ``PYTHONPATH``. Two calls differ:

- ``fp8_fp4_mqa_logits`` (prefill): 2.8.1 returns compressed logits (row i
  holds key positions ``[ks[i], ke[i])`` from column 0) and takes their width;
  0.30.0 reads absolute columns. Expanded here by a gather, -inf outside.
- ``fp8_fp4_paged_mqa_logits`` (decode): the same kernel without the
  ``clean_logits`` argument 0.30.0 passes (always False there).

All three attention ways of a run share the indexer, so this cannot favour
one. ``python h200_deep_gemm.py`` checks both calls against PyTorch on the GPU.
"""

import deep_gemm_281 as _dg
import torch

globals().update({k: v for k, v in vars(_dg).items() if not k.startswith("__")})


def fp8_fp4_mqa_logits(
    q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits=True, **_
) -> torch.Tensor:
    n = kv[0].shape[0]
    compressed = _dg.fp8_fp4_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, n)
    columns = torch.arange(n, device=compressed.device)
    shift = columns[None, :] - cu_seqlen_ks.long()[:, None]
    inside = (shift >= 0) & (columns[None, :] < cu_seqlen_ke.long()[:, None])
    taken = compressed.gather(1, shift.clamp(0, compressed.shape[1] - 1))
    return torch.where(inside, taken, float("-inf"))


def fp8_fp4_paged_mqa_logits(
    q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
    clean_logits=False, indices=None,
) -> torch.Tensor:  # fmt: skip
    assert not clean_logits, "the kernel leaves unused logits as they are"
    return _dg.fp8_fp4_paged_mqa_logits(
        q, kv_cache, weights, context_lens, block_table, schedule_meta,
        max_context_len, indices,
    )  # fmt: skip


def _check() -> None:
    """Prefill logits against PyTorch: sum over heads of weight * relu(q.k),
    times the key's scale, on every row's own key range."""
    torch.manual_seed(0)
    m, h, d, n = 96, 64, 128, 300
    q = torch.randn(m, h, d, device="cuda").to(torch.float8_e4m3fn)
    k = torch.randn(n, d, device="cuda").to(torch.float8_e4m3fn)
    k_scale = torch.rand(n, device="cuda") + 0.5
    w = torch.randn(m, h, device="cuda")
    ks = torch.randint(0, 100, (m,), device="cuda", dtype=torch.int32)
    ke = (ks + torch.randint(1, 200, (m,), device="cuda")).clamp(max=n).int()
    got = fp8_fp4_mqa_logits((q, None), (k, k_scale), w, ks, ke)
    dots = torch.einsum("mhd,nd->mhn", q.float(), k.float()).relu()
    want = torch.einsum("mhn,mh->mn", dots, w) * k_scale[None, :]
    cols = torch.arange(n, device="cuda")[None, :]
    inside = (cols >= ks[:, None]) & (cols < ke[:, None])
    error = (got - want).abs()[inside].max().item() / want.abs().max().item()
    print(f"prefill logits: largest error {error:.2e} of the largest logit; "
          f"-inf outside every range: {bool(got[~inside].isinf().all())}")  # fmt: skip


if __name__ == "__main__":
    _check()
