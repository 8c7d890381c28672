// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: Copyright contributors to the vLLM project
//
// Benchmark-only binding to FlashMLA's SM90 sparse FP8 decode for DeepSeek V4
// ("MODEL1" records: 448 FP8 + 64 BF16 values, then 8 UE8M0 scale bytes per
// token, laid out per page like vLLM's fp8_ds_mla). Built on the GPU machine
// by build_flashmla_peer.py against FlashMLA's own sources, which are never
// committed here. Two entry points so that the per-batch planning (the
// scheduler kernel) stays outside the timed region: plan() once per batch
// shape and lengths, decode() per step (the attention kernel plus FlashMLA's
// split combine).

#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <vector>

#include "params.h"
#include "sm90/decode/sparse_fp8/splitkv_mla.h"
#include "smxx/decode/combine/combine.h"
#include "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.h"

namespace {

constexpr int kHeadDim = 512;
// FlashMLA's SM90 planner constants for this kernel: candidates are scheduled
// in blocks of 64, and each split costs about five blocks of fixed overhead.
constexpr int kBlockTopk = 64;
constexpr int kFixedOverheadBlocks = 5;

int sm_parts(int num_heads) {
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  // One query token per batch entry (s_q = 1); 128 heads take two 64-head
  // halves of the machine.
  return std::max(sms / (num_heads / 64), 1);
}

int as_int(int64_t v) {
  TORCH_CHECK(v <= INT32_MAX, "stride exceeds int32");
  return static_cast<int>(v);
}

// Returns (tile scheduler metadata, num_splits) for decode().
std::vector<at::Tensor> plan(const at::Tensor& topk_length,
                             const at::Tensor& extra_topk_length,
                             int64_t num_heads, int64_t topk,
                             int64_t extra_topk) {
  TORCH_CHECK(num_heads == 64 || num_heads == 128, "64 or 128 heads");
  TORCH_CHECK(topk_length.dtype() == torch::kInt32 &&
              extra_topk_length.dtype() == torch::kInt32);
  at::cuda::CUDAGuard guard(topk_length.device());
  const int b = static_cast<int>(topk_length.size(0));
  const int parts = sm_parts(static_cast<int>(num_heads));
  auto opts = topk_length.options().dtype(torch::kInt32);
  at::Tensor meta = torch::empty(
      {parts, static_cast<int64_t>(sizeof(DecodingSchedMeta) / 4)}, opts);
  at::Tensor splits = torch::empty({b + 1}, opts);
  GetDecodeSchedMetaParams p{};
  p.b = b;
  p.s_q = 1;
  p.block_size_n = kBlockTopk;
  p.fixed_overhead_num_blocks = kFixedOverheadBlocks;
  p.topk = static_cast<int>(topk);
  p.extra_topk = static_cast<int>(extra_topk);
  p.topk_length = topk_length.data_ptr<int>();
  p.extra_topk_length = extra_topk_length.data_ptr<int>();
  p.seqlens_k_ptr = nullptr;
  p.tile_scheduler_metadata_ptr =
      reinterpret_cast<DecodingSchedMeta*>(meta.data_ptr());
  p.num_splits_ptr = splits.data_ptr<int>();
  p.num_sm_parts = parts;
  p.stream = at::cuda::getCurrentCUDAStream().stream();
  smxx::decode::run_get_decoding_sched_meta_kernel(p);
  return {meta, splits};
}

// q, out: [b, 1, h, 512] BF16; kv, extra_kv: [pages, page_size, 1, 584]
// uint8; indices: [b, 1, k] int32; lengths: [b] int32; sinks: [h] float32;
// lse: [b, 1, h] float32; o_accum: [b + parts, 1, h, 512] float32;
// lse_accum: [b + parts, 1, h] float32.
void decode(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices,
            const at::Tensor& topk_length, const at::Tensor& sinks,
            const at::Tensor& extra_kv, const at::Tensor& extra_indices,
            const at::Tensor& extra_topk_length, const at::Tensor& meta,
            const at::Tensor& splits, at::Tensor& out, at::Tensor& lse,
            at::Tensor& o_accum, at::Tensor& lse_accum, double sm_scale) {
  TORCH_CHECK(q.dim() == 4 && q.size(1) == 1 && q.size(3) == kHeadDim);
  TORCH_CHECK(kv.dtype() == torch::kUInt8 && extra_kv.dtype() == torch::kUInt8);
  TORCH_CHECK(kv.size(3) == 584 && kv.stride(1) == 584 &&
              extra_kv.size(3) == 584 && extra_kv.stride(1) == 584);
  const int h = static_cast<int>(q.size(2));
  const int parts = sm_parts(h);
  TORCH_CHECK(meta.size(0) == parts && o_accum.size(0) == q.size(0) + parts);
  at::cuda::CUDAGuard guard(q.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  using bf16 = cutlass::bfloat16_t;

  SparseAttnDecodeParams p{};
  p.b = static_cast<int>(q.size(0));
  p.s_q = 1;
  p.h_q = h;
  p.h_kv = 1;
  p.d_qk = kHeadDim;
  p.d_v = kHeadDim;
  p.sm_scale = static_cast<float>(sm_scale);
  p.sm_scale_div_log2 = static_cast<float>(sm_scale * 1.4426950408889634);
  p.num_blocks = static_cast<int>(kv.size(0));
  p.page_block_size = static_cast<int>(kv.size(1));
  p.topk = static_cast<int>(indices.size(2));
  p.model_type = ModelType::MODEL1;
  p.q = reinterpret_cast<bf16*>(q.data_ptr());
  p.kv = reinterpret_cast<bf16*>(kv.data_ptr());
  p.indices = indices.data_ptr<int>();
  p.topk_length = topk_length.data_ptr<int>();
  p.attn_sink = sinks.data_ptr<float>();
  p.lse = lse.data_ptr<float>();
  p.out = reinterpret_cast<bf16*>(out.data_ptr());
  p.extra_num_blocks = static_cast<int>(extra_kv.size(0));
  p.extra_page_block_size = static_cast<int>(extra_kv.size(1));
  p.extra_topk = static_cast<int>(extra_indices.size(2));
  p.extra_kv = reinterpret_cast<bf16*>(extra_kv.data_ptr());
  p.extra_indices = extra_indices.data_ptr<int>();
  p.extra_topk_length = extra_topk_length.data_ptr<int>();
  p.stride_q_b = as_int(q.stride(0));
  p.stride_q_s_q = as_int(q.stride(1));
  p.stride_q_h_q = as_int(q.stride(2));
  p.stride_kv_block = as_int(kv.stride(0));
  p.stride_kv_row = as_int(kv.stride(1));
  p.stride_indices_b = as_int(indices.stride(0));
  p.stride_indices_s_q = as_int(indices.stride(1));
  p.stride_lse_b = as_int(lse.stride(0));
  p.stride_lse_s_q = as_int(lse.stride(1));
  p.stride_o_b = as_int(out.stride(0));
  p.stride_o_s_q = as_int(out.stride(1));
  p.stride_o_h_q = as_int(out.stride(2));
  p.stride_extra_kv_block = as_int(extra_kv.stride(0));
  p.stride_extra_kv_row = as_int(extra_kv.stride(1));
  p.stride_extra_indices_b = as_int(extra_indices.stride(0));
  p.stride_extra_indices_s_q = as_int(extra_indices.stride(1));
  p.stream = stream;
  p.lse_accum = lse_accum.data_ptr<float>();
  p.o_accum = o_accum.data_ptr<float>();
  p.stride_lse_accum_split = as_int(lse_accum.stride(0));
  p.stride_lse_accum_s_q = as_int(lse_accum.stride(1));
  p.stride_o_accum_split = as_int(o_accum.stride(0));
  p.stride_o_accum_s_q = as_int(o_accum.stride(1));
  p.stride_o_accum_h_q = as_int(o_accum.stride(2));
  p.tile_scheduler_metadata_ptr =
      reinterpret_cast<DecodingSchedMeta*>(meta.data_ptr());
  p.num_splits_ptr = splits.data_ptr<int>();
  p.num_sm_parts = parts;

  if (h == 64) {
    sm90::decode::sparse_fp8::run_flash_splitkv_mla_fp8_sparse_kernel<
        ModelType::MODEL1, 64>(p);
  } else {
    TORCH_CHECK(h == 128, "64 or 128 heads");
    sm90::decode::sparse_fp8::run_flash_splitkv_mla_fp8_sparse_kernel<
        ModelType::MODEL1, 128>(p);
  }

  CombineParams c{};
  c.b = p.b;
  c.s_q = 1;
  c.h_q = h;
  c.d_v = kHeadDim;
  c.lse = p.lse;
  c.out = out.data_ptr();
  c.stride_lse_b = p.stride_lse_b;
  c.stride_lse_s_q = p.stride_lse_s_q;
  c.stride_o_b = p.stride_o_b;
  c.stride_o_s_q = p.stride_o_s_q;
  c.stride_o_h_q = p.stride_o_h_q;
  c.lse_accum = p.lse_accum;
  c.o_accum = p.o_accum;
  c.stride_lse_accum_split = p.stride_lse_accum_split;
  c.stride_lse_accum_s_q = p.stride_lse_accum_s_q;
  c.stride_o_accum_split = p.stride_o_accum_split;
  c.stride_o_accum_s_q = p.stride_o_accum_s_q;
  c.stride_o_accum_h_q = p.stride_o_accum_h_q;
  c.tile_scheduler_metadata_ptr = p.tile_scheduler_metadata_ptr;
  c.num_splits_ptr = p.num_splits_ptr;
  c.num_sm_parts = parts;
  c.attn_sink = p.attn_sink;
  c.stream = stream;
  smxx::decode::run_flash_mla_combine_kernel<bf16>(c);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("plan", &plan, "FlashMLA decode schedule for one batch shape");
  m.def("decode", &decode, "FlashMLA SM90 MODEL1 sparse FP8 decode + combine");
}
