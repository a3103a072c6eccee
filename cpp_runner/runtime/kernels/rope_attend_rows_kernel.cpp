// The batch method's attention (docs/batching.md): rope_attend for each entry
// of B rows, each row over its own KV slot of the slot pools.
//
// lora_share::rope_write_attend_rows.out (exporter revision 14 and later):
//
//   q [B, T, n_heads * hd], k and v [B, T, n_kv * hd], cos_* and sin_* [B, T, hd]: float32
//   bias [B, T, S + 1] (an entry's mask, shared by its query heads): the cache's dtype
//   slots [B] int64; dst [B, T] int64; keys[h] and values[h] [N, S, hd]: the slot pools
//   out [B, T, n_heads * hd] float32; k_out, v_out [B * T, n_kv, hd] in the cache's dtype
//
// Row b's T entries are one sequence at consecutive positions: its last token
// and the drafts after it, verified in one step (speculative decoding). Every
// entry's keys and values are written first, into row dst[b, t] of slot
// slots[b] of every pool (none where dst is outside 1..S-1: the sink, or an
// entry past the context), and then each entry attends: an entry sees the
// ones before it in its slot exactly as one-token decode sees them in the
// cache (its mask hides the ones after it), and computes what one-token decode
// computes at its position, bit for bit. The pools are the program's inputs,
// the runtime's KV memory handed over in place, so this writes the runtime's
// cache; k_out and v_out return the same rows for a caller that passed copies.
//
// lora_share::rope_attend_rows.out (exporter revisions 11 to 13), kept for
// their programs: one entry per row (T = 1; bias [B, S + 1]), nothing written
// (the caller writes k_out and v_out).
//
// An entry reads its slot's slab rows up to its mask's last visible one (a
// short conversation beside a long one costs its own length): the rows after
// it would add exp(-inf) = 0.

#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/operator_registry.h>

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "attend_kernel.h"

namespace lora_share {
namespace {

using executorch::aten::ScalarType;
using executorch::aten::SizesType;
using executorch::aten::Tensor;
using executorch::aten::TensorList;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::KernelRuntimeContext;

bool is_float32(const Tensor& t) { return t.scalar_type() == ScalarType::Float; }

// Per thread: one entry's mask repeated for its query heads, trimmed (grown once).
thread_local std::vector<float> t_bias;

template <class T>
int64_t visible_rows(const T* bias, int64_t S) {  // the slab rows up to the last finite mask entry (>= 1)
  for (int64_t s = S; s > 1; --s) {
    float x;
    if constexpr (std::is_same_v<T, float>) {
      x = bias[s - 1];
    } else {
      x = half_to_float(bias[s - 1]);
    }
    if (x != -std::numeric_limits<float>::infinity()) return s;
  }
  return std::min<int64_t>(S, 1);  // the sink, always masked: attend_rows takes at least one slab row
}

template <class T>
void* row_bias(const T* bias, int64_t S, int64_t visible, int64_t rep) {  // [rep, visible + 1]
  t_bias.resize(static_cast<size_t>(rep * (visible + 1)));
  T* dst = reinterpret_cast<T*>(t_bias.data());
  for (int64_t r = 0; r < rep; ++r) {
    std::memcpy(dst + r * (visible + 1), bias, static_cast<size_t>(visible) * sizeof(T));
    dst[r * (visible + 1) + visible] = bias[S];
  }
  return dst;
}

// Both operators: B rows of T entries over the pools; `dst` [B, T] where each
// entry's keys and values go before any entry attends (nullptr: nowhere).
// `op` names the operator in messages.
void rows_step(KernelRuntimeContext& ctx, const char* op, int64_t T, const Tensor& q, const Tensor& k, const Tensor& v,
               const Tensor& cos_q, const Tensor& sin_q, const Tensor& cos_k, const Tensor& sin_k, const Tensor& bias,
               const Tensor& slots, const Tensor* dst, TensorList keys, TensorList values, Tensor& out, Tensor& k_out,
               Tensor& v_out) {
  ET_KERNEL_CHECK_MSG(ctx,
                      is_float32(q) && is_float32(k) && is_float32(v) && is_float32(cos_q) && is_float32(sin_q) &&
                          is_float32(cos_k) && is_float32(sin_k) && is_float32(out),
                      InvalidArgument, , "%s: q, k, v, cos, sin and out must be float32", op);
  const ScalarType dtype = bias.scalar_type();
  ET_KERNEL_CHECK_MSG(ctx, dtype == ScalarType::Float || dtype == ScalarType::Half, InvalidArgument, ,
                      "%s: bias (the cache's dtype) must be float32 or float16", op);
  ET_KERNEL_CHECK_MSG(ctx, k_out.scalar_type() == dtype && v_out.scalar_type() == dtype, InvalidArgument, ,
                      "%s: k_out and v_out must have the cache's dtype", op);
  ET_KERNEL_CHECK_MSG(ctx, slots.scalar_type() == ScalarType::Long && slots.dim() == 1, InvalidArgument, ,
                      "%s: slots must be [B] int64", op);
  const int64_t B = slots.size(0);
  const int64_t entries = B * T;
  const int64_t hd = cos_q.size(cos_q.dim() - 1);
  const int64_t n_kv = static_cast<int64_t>(keys.size());
  ET_KERNEL_CHECK_MSG(ctx, B > 0 && T > 0 && hd > 0 && hd % 2 == 0 && hd <= (1 << 20), InvalidArgument, ,
                      "%s: %" PRId64 " rows of %" PRId64 " tokens, head size %" PRId64 " (must be even)", op, B, T, hd);
  ET_KERNEL_CHECK_MSG(ctx,
                      cos_q.numel() == entries * hd && sin_q.numel() == entries * hd && cos_k.numel() == entries * hd &&
                          sin_k.numel() == entries * hd,
                      InvalidArgument, , "%s: cos and sin must be [B=%" PRId64 ", T=%" PRId64 ", hd]", op, B, T);
  ET_KERNEL_CHECK_MSG(ctx, n_kv > 0 && static_cast<int64_t>(values.size()) == n_kv, InvalidArgument, ,
                      "%s: keys and values must hold the same number of heads (>0)", op);
  ET_KERNEL_CHECK_MSG(ctx, k.numel() == entries * n_kv * hd && v.numel() == entries * n_kv * hd, InvalidArgument, ,
                      "%s: k and v must be [B, T, n_kv * hd]", op);
  ET_KERNEL_CHECK_MSG(ctx, q.numel() > 0 && q.numel() % (entries * n_kv * hd) == 0, InvalidArgument, ,
                      "%s: q must be [B, T, n_heads * hd], n_heads a multiple of n_kv", op);
  const int64_t n_heads = q.numel() / (entries * hd);
  const int64_t rep = n_heads / n_kv;
  ET_KERNEL_CHECK_MSG(ctx, n_heads <= (1 << 24), InvalidArgument, , "%s: too many heads", op);
  const int64_t total = slab_rows(op, "bias", keys, values, hd, dtype);
  ET_KERNEL_CHECK(ctx, total >= 0, InvalidArgument, );
  const Tensor& pool = keys[0];
  ET_KERNEL_CHECK_MSG(ctx, pool.dim() == 3, InvalidArgument, , "%s: keys[0] must be [N, S, hd]", op);
  const int64_t N = pool.size(0), S = pool.size(1);
  for (size_t h = 0; h < keys.size(); ++h) {
    ET_KERNEL_CHECK_MSG(ctx,
                        keys[h].dim() == 3 && values[h].dim() == 3 && keys[h].size(0) == N && values[h].size(0) == N &&
                            keys[h].size(1) == S && values[h].size(1) == S,
                        InvalidArgument, , "%s: keys[%zu] and values[%zu] must be [N=%" PRId64 ", S=%" PRId64 ", hd]",
                        op, h, h, N, S);
  }
  ET_KERNEL_CHECK_MSG(ctx, bias.numel() == entries * (S + 1) && bias.size(bias.dim() - 1) == S + 1, InvalidArgument, ,
                      "%s: bias must be [B=%" PRId64 ", T=%" PRId64 ", S+1=%" PRId64 "]", op, B, T, S + 1);
  ET_KERNEL_CHECK_MSG(
      ctx, dst == nullptr || (dst->scalar_type() == ScalarType::Long && dst->numel() == entries && is_contiguous(*dst)),
      InvalidArgument, , "%s: dst must be [B=%" PRId64 ", T=%" PRId64 "] int64", op, B, T);
  ET_KERNEL_CHECK_MSG(ctx,
                      is_contiguous(q) && is_contiguous(k) && is_contiguous(v) && is_contiguous(bias) &&
                          is_contiguous(cos_q) && is_contiguous(sin_q) && is_contiguous(cos_k) &&
                          is_contiguous(sin_k) && is_contiguous(slots),
                      InvalidArgument, , "%s: its inputs must be contiguous", op);
  const int64_t* slot = slots.const_data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    ET_KERNEL_CHECK_MSG(ctx, slot[b] >= 0 && slot[b] < N, InvalidArgument, ,
                        "%s: row %" PRId64 "'s slot %" PRId64 " is not one of the %" PRId64 " slots", op, b, slot[b],
                        N);
  }
  const SizesType out_sizes[3] = {static_cast<SizesType>(B), static_cast<SizesType>(T),
                                  static_cast<SizesType>(n_heads * hd)};
  const SizesType row_sizes[3] = {static_cast<SizesType>(entries), static_cast<SizesType>(n_kv),
                                  static_cast<SizesType>(hd)};
  ET_KERNEL_CHECK_MSG(ctx,
                      executorch::runtime::resize_tensor(out, {out_sizes, 3}) == Error::Ok &&
                          executorch::runtime::resize_tensor(k_out, {row_sizes, 3}) == Error::Ok &&
                          executorch::runtime::resize_tensor(v_out, {row_sizes, 3}) == Error::Ok,
                      InvalidArgument, , "%s: could not resize its outputs", op);
  ET_KERNEL_CHECK_MSG(ctx, is_contiguous(out) && is_contiguous(k_out) && is_contiguous(v_out), InvalidArgument, ,
                      "%s: its outputs must be contiguous", op);

  const bool half = dtype == ScalarType::Half;
  const size_t elem = half ? sizeof(half_t) : sizeof(float);
  const int64_t q_row = n_heads * hd, kv_row = n_kv * hd;
  const size_t hd_bytes = static_cast<size_t>(hd) * elem;
  char* k_rows = static_cast<char*>(k_out.mutable_data_ptr());
  char* v_rows = static_cast<char*>(v_out.mutable_data_ptr());
  // Every entry's keys and values first, and into its slot's rows: an entry
  // after it in the row reads them from there.
  for (int64_t e = 0; e < entries; ++e) {
    token_kv(half, n_kv, hd, k.const_data_ptr<float>() + e * kv_row, v.const_data_ptr<float>() + e * kv_row,
             cos_k.const_data_ptr<float>() + e * hd, sin_k.const_data_ptr<float>() + e * hd, k_rows + e * kv_row * elem,
             v_rows + e * kv_row * elem);
    const int64_t at = dst == nullptr ? 0 : dst->const_data_ptr<int64_t>()[e];
    if (at < 1 || at >= S) continue;  // the sink, or past the slab: written nowhere
    const size_t offset = static_cast<size_t>((slot[e / T] * S + at) * hd) * elem;
    for (int64_t h = 0; h < n_kv; ++h) {
      std::memcpy(static_cast<char*>(keys[h].mutable_data_ptr()) + offset, k_rows + (e * kv_row + h * hd) * elem,
                  hd_bytes);
      std::memcpy(static_cast<char*>(values[h].mutable_data_ptr()) + offset, v_rows + (e * kv_row + h * hd) * elem,
                  hd_bytes);
    }
  }
  for (int64_t e = 0; e < entries; ++e) {
    const void* mask;
    int64_t visible;
    if (half) {
      const half_t* row = static_cast<const half_t*>(bias.const_data_ptr()) + e * (S + 1);
      visible = visible_rows(row, S);
      mask = row_bias(row, S, visible, rep);
    } else {
      const float* row = bias.const_data_ptr<float>() + e * (S + 1);
      visible = visible_rows(row, S);
      mask = row_bias(row, S, visible, rep);
    }
    token_attend(half, n_heads, n_kv, hd, visible, q.const_data_ptr<float>() + e * q_row,
                 cos_q.const_data_ptr<float>() + e * hd, sin_q.const_data_ptr<float>() + e * hd, mask, keys, values,
                 slot[e / T] * S * hd, out.mutable_data_ptr<float>() + e * q_row, k_rows + e * kv_row * elem,
                 v_rows + e * kv_row * elem);
  }
}

// rope_attend_rows: 11 inputs, 3 out tensors (then the 3 returns, which alias
// them). ExecuTorch's unboxing helper takes one out tensor only.
void rope_attend_rows_boxed(KernelRuntimeContext& ctx, executorch::runtime::Span<EValue*> stack) {
  ET_KERNEL_CHECK_MSG(ctx, stack.size() >= 14, InvalidArgument, , "rope_attend_rows: expected 14 arguments, got %zu",
                      stack.size());
  const Tensor& bias = stack[7]->toTensor();
  ET_KERNEL_CHECK_MSG(ctx, bias.dim() == 2, InvalidArgument, , "rope_attend_rows: bias must be [B, S + 1]");
  rows_step(ctx, "rope_attend_rows", /*T=*/1, stack[0]->toTensor(), stack[1]->toTensor(), stack[2]->toTensor(),
            stack[3]->toTensor(), stack[4]->toTensor(), stack[5]->toTensor(), stack[6]->toTensor(), bias,
            stack[8]->toTensor(), /*dst=*/nullptr, stack[9]->toTensorList(), stack[10]->toTensorList(),
            stack[11]->toTensor(), stack[12]->toTensor(), stack[13]->toTensor());
}

// rope_write_attend_rows: 12 inputs, 3 out tensors.
void rope_write_attend_rows_boxed(KernelRuntimeContext& ctx, executorch::runtime::Span<EValue*> stack) {
  ET_KERNEL_CHECK_MSG(ctx, stack.size() >= 15, InvalidArgument, ,
                      "rope_write_attend_rows: expected 15 arguments, got %zu", stack.size());
  const Tensor& q = stack[0]->toTensor();
  const Tensor& bias = stack[7]->toTensor();
  ET_KERNEL_CHECK_MSG(ctx, q.dim() == 3 && bias.dim() == 3, InvalidArgument, ,
                      "rope_write_attend_rows: q must be [B, T, n_heads * hd] and bias [B, T, S + 1]");
  const Tensor& dst = stack[9]->toTensor();
  rows_step(ctx, "rope_write_attend_rows", q.size(1), q, stack[1]->toTensor(), stack[2]->toTensor(),
            stack[3]->toTensor(), stack[4]->toTensor(), stack[5]->toTensor(), stack[6]->toTensor(), bias,
            stack[8]->toTensor(), &dst, stack[10]->toTensorList(), stack[11]->toTensorList(), stack[12]->toTensor(),
            stack[13]->toTensor(), stack[14]->toTensor());
}

const auto registered_rows = executorch::runtime::register_kernel(
    executorch::runtime::Kernel("lora_share::rope_attend_rows.out", rope_attend_rows_boxed));
const auto registered_write_rows = executorch::runtime::register_kernel(
    executorch::runtime::Kernel("lora_share::rope_write_attend_rows.out", rope_write_attend_rows_boxed));

}  // namespace
}  // namespace lora_share
