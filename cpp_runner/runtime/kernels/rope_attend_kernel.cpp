// lora_share::rope_attend.out: one decoded token's attention step, from its
// q, k, v projections to the output projection's input.
//
//   rope_attend.out(Tensor q, Tensor k, Tensor v, Tensor cos_q, Tensor sin_q,
//                   Tensor cos_k, Tensor sin_k, Tensor bias, Tensor[] keys,
//                   Tensor[] values, *, Tensor(a!) out, Tensor(b!) k_out,
//                   Tensor(c!) v_out) -> (Tensor(a!), Tensor(b!), Tensor(c!))
//
//   q [1, 1, n_heads * hd], k and v [1, 1, n_kv * hd], cos_* and sin_* [1, 1, hd]: float32
//   bias [1, rep, S + 1], keys[h] and values[h] [S, hd]: the cache's dtype (float32 or float16)
//   out [1, 1, n_heads * hd] float32; k_out, v_out [n_kv, 1, hd] in the cache's dtype
//
// Why one operator: the decode method's graph had, per layer, about 24 small
// XNNPACK operators here (RoPE's multiplies, rotations and adds; the views and
// transposes that lay heads out as rows; the casts to and from a float16
// cache). Each costs a dispatch and a thread hand-off on every token, more than
// its arithmetic (a few hundred numbers). Here they are loops over the token's
// rows around attend_rows (attend_kernel.cpp).
//
// It rounds where that graph did, so a program computes the same numbers:
// x * cos and rotate_half(x) * sin each rounded to float32, then their sum
// (this file is compiled without floating-point contraction: no fused
// multiply-add), then rounding to the cache's dtype; the attention's output,
// rounded to the cache's dtype by attend, back to float32.

#include "attend_kernel.h"

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

namespace lora_share {
namespace {

using executorch::aten::ScalarType;
using executorch::aten::SizesType;
using executorch::aten::Tensor;
using executorch::aten::TensorList;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::KernelRuntimeContext;

// rows [n, hd] of x rotated: x * cos + rotate_half(x) * sin, in float32, into
// `dst` as float32 or float16.
template <class T>
void rotate_rows(const float* x, int64_t n, int64_t hd, const float* cos, const float* sin, T* dst) {
  const int64_t half = hd / 2;
  for (int64_t r = 0; r < n; ++r) {
    const float* row = x + r * hd;
    T* out = dst + r * hd;
    for (int64_t i = 0; i < hd; ++i) {
      const float rotated = i < half ? -row[i + half] : row[i - half];
      const float a = row[i] * cos[i];
      const float b = rotated * sin[i];
      const float y = a + b;
      if constexpr (std::is_same_v<T, float>) {
        out[i] = y;
      } else {
        out[i] = float_to_half(y);
      }
    }
  }
}

template <class T>
void copy_rows(const float* x, int64_t n, T* dst) {
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, float>) {
      dst[i] = x[i];
    } else {
      dst[i] = float_to_half(x[i]);
    }
  }
}

// Per thread: the rotated queries and the attention's rows in the cache's
// dtype (a few KB; grown once).
thread_local std::vector<float> t_rows;

bool is_float32(const Tensor& t) { return t.scalar_type() == ScalarType::Float; }

}  // namespace

void token_kv(bool half, int64_t n_kv, int64_t hd, const float* k, const float* v, const float* ck, const float* sk,
              void* k_dst, void* v_dst) {
  if (half) {
    rotate_rows(k, n_kv, hd, ck, sk, static_cast<half_t*>(k_dst));
    copy_rows(v, n_kv * hd, static_cast<half_t*>(v_dst));
  } else {
    rotate_rows(k, n_kv, hd, ck, sk, static_cast<float*>(k_dst));
    copy_rows(v, n_kv * hd, static_cast<float*>(v_dst));
  }
}

void token_attend(bool half, int64_t n_heads, int64_t n_kv, int64_t hd, int64_t S, const float* q, const float* cq,
                  const float* sq, const void* bias, TensorList keys, TensorList values, int64_t slab_offset,
                  float* out, const void* k_dst, const void* v_dst) {
  // Query rows [n_kv, rep, hd] are the heads in order (head h reads key/value
  // head h / rep): q's own layout, so RoPE writes them in place.
  const size_t row_floats = static_cast<size_t>(n_heads * hd);
  // Rotated queries, then the attention's output, each in the cache's dtype.
  t_rows.resize(half ? row_floats : 2 * row_floats);
  void* q_rows = t_rows.data();
  void* attended = half ? static_cast<void*>(reinterpret_cast<half_t*>(t_rows.data()) + row_floats)
                        : static_cast<void*>(t_rows.data() + row_floats);
  if (half) {
    rotate_rows(q, n_heads, hd, cq, sq, static_cast<half_t*>(q_rows));
  } else {
    rotate_rows(q, n_heads, hd, cq, sq, static_cast<float*>(q_rows));
  }
  attend_rows(half, n_kv, n_heads / n_kv, hd, S, /*T=*/1, q_rows, k_dst, v_dst, bias, keys, values, attended,
              slab_offset);
  if (half) {
    const half_t* a = static_cast<const half_t*>(attended);
    for (size_t i = 0; i < row_floats; ++i) out[i] = half_to_float(a[i]);
  } else {
    const float* a = static_cast<const float*>(attended);
    for (size_t i = 0; i < row_floats; ++i) out[i] = a[i];
  }
}

namespace {

// One token's whole step (rope_attend): token_kv, then token_attend.
void one_token(bool half, int64_t n_heads, int64_t n_kv, int64_t hd, int64_t S, const float* q, const float* k,
               const float* v, const float* cq, const float* sq, const float* ck, const float* sk, const void* bias,
               TensorList keys, TensorList values, int64_t slab_offset, float* out, void* k_dst, void* v_dst) {
  token_kv(half, n_kv, hd, k, v, ck, sk, k_dst, v_dst);
  token_attend(half, n_heads, n_kv, hd, S, q, cq, sq, bias, keys, values, slab_offset, out, k_dst, v_dst);
}

void rope_attend_out(KernelRuntimeContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos_q,
                     const Tensor& sin_q, const Tensor& cos_k, const Tensor& sin_k, const Tensor& bias, TensorList keys,
                     TensorList values, Tensor& out, Tensor& k_out, Tensor& v_out) {
  ET_KERNEL_CHECK_MSG(ctx,
                      is_float32(q) && is_float32(k) && is_float32(v) && is_float32(cos_q) && is_float32(sin_q) &&
                          is_float32(cos_k) && is_float32(sin_k) && is_float32(out),
                      InvalidArgument, , "rope_attend: q, k, v, cos, sin and out must be float32");
  const ScalarType dtype = bias.scalar_type();
  ET_KERNEL_CHECK_MSG(ctx, dtype == ScalarType::Float || dtype == ScalarType::Half, InvalidArgument, ,
                      "rope_attend: bias (the cache's dtype) must be float32 or float16, got dtype %d",
                      static_cast<int>(dtype));
  ET_KERNEL_CHECK_MSG(ctx, k_out.scalar_type() == dtype && v_out.scalar_type() == dtype, InvalidArgument, ,
                      "rope_attend: k_out and v_out must have the cache's dtype");
  const int64_t hd = cos_q.numel();
  const int64_t n_kv = static_cast<int64_t>(keys.size());
  ET_KERNEL_CHECK_MSG(ctx, hd > 0 && hd % 2 == 0 && hd <= (1 << 20), InvalidArgument, ,
                      "rope_attend: head size %" PRId64 " must be even and positive", hd);
  ET_KERNEL_CHECK_MSG(ctx, sin_q.numel() == hd && cos_k.numel() == hd && sin_k.numel() == hd, InvalidArgument, ,
                      "rope_attend: cos and sin must each hold hd=%" PRId64 " numbers", hd);
  ET_KERNEL_CHECK_MSG(ctx, n_kv > 0 && static_cast<int64_t>(values.size()) == n_kv, InvalidArgument, ,
                      "rope_attend: keys and values must hold the same number of heads (>0), got %zu and %zu",
                      keys.size(), values.size());
  ET_KERNEL_CHECK_MSG(ctx, k.numel() == n_kv * hd && v.numel() == n_kv * hd, InvalidArgument, ,
                      "rope_attend: k and v must hold one token of n_kv=%" PRId64 " heads of hd=%" PRId64, n_kv, hd);
  ET_KERNEL_CHECK_MSG(ctx, q.numel() % (n_kv * hd) == 0 && q.numel() > 0, InvalidArgument, ,
                      "rope_attend: q must hold one token of a multiple of n_kv=%" PRId64 " heads", n_kv);
  const int64_t n_heads = q.numel() / hd;
  const int64_t rep = n_heads / n_kv;
  ET_KERNEL_CHECK_MSG(ctx, n_heads <= (1 << 24), InvalidArgument, , "rope_attend: too many heads");
  const int64_t S = slab_rows("rope_attend", "bias", keys, values, hd, dtype);
  ET_KERNEL_CHECK(ctx, S >= 0, InvalidArgument, );
  ET_KERNEL_CHECK_MSG(ctx,
                      (bias.dim() == 3 && bias.size(0) == 1 && bias.size(1) == rep && bias.size(2) == S + 1) ||
                          (bias.dim() == 2 && bias.size(0) == rep && bias.size(1) == S + 1),
                      InvalidArgument, , "rope_attend: bias must be [1, rep=%" PRId64 ", S+1=%" PRId64 "]", rep, S + 1);
  ET_KERNEL_CHECK_MSG(ctx,
                      is_contiguous(q) && is_contiguous(k) && is_contiguous(v) && is_contiguous(bias) &&
                          is_contiguous(cos_q) && is_contiguous(sin_q) && is_contiguous(cos_k) && is_contiguous(sin_k),
                      InvalidArgument, , "rope_attend: its inputs must be contiguous");
  const SizesType out_sizes[3] = {1, 1, static_cast<SizesType>(n_heads * hd)};
  const SizesType row_sizes[3] = {static_cast<SizesType>(n_kv), 1, static_cast<SizesType>(hd)};
  ET_KERNEL_CHECK_MSG(ctx,
                      executorch::runtime::resize_tensor(out, {out_sizes, 3}) == Error::Ok &&
                          executorch::runtime::resize_tensor(k_out, {row_sizes, 3}) == Error::Ok &&
                          executorch::runtime::resize_tensor(v_out, {row_sizes, 3}) == Error::Ok,
                      InvalidArgument, , "rope_attend: could not resize its outputs");
  ET_KERNEL_CHECK_MSG(ctx, is_contiguous(out) && is_contiguous(k_out) && is_contiguous(v_out), InvalidArgument, ,
                      "rope_attend: its outputs must be contiguous");

  one_token(dtype == ScalarType::Half, n_heads, n_kv, hd, S, q.const_data_ptr<float>(), k.const_data_ptr<float>(),
            v.const_data_ptr<float>(), cos_q.const_data_ptr<float>(), sin_q.const_data_ptr<float>(),
            cos_k.const_data_ptr<float>(), sin_k.const_data_ptr<float>(), bias.const_data_ptr(), keys, values,
            /*slab_offset=*/0, out.mutable_data_ptr<float>(), k_out.mutable_data_ptr(), v_out.mutable_data_ptr());
}

// The boxed entry ExecuTorch calls: 10 inputs, 3 out tensors (then the 3
// returns, which alias them). ExecuTorch's unboxing helper takes one out
// tensor only.
void rope_attend_boxed(KernelRuntimeContext& ctx, executorch::runtime::Span<EValue*> stack) {
  ET_KERNEL_CHECK_MSG(ctx, stack.size() >= 13, InvalidArgument, , "rope_attend: expected 13 arguments, got %zu",
                      stack.size());
  rope_attend_out(ctx, stack[0]->toTensor(), stack[1]->toTensor(), stack[2]->toTensor(), stack[3]->toTensor(),
                  stack[4]->toTensor(), stack[5]->toTensor(), stack[6]->toTensor(), stack[7]->toTensor(),
                  stack[8]->toTensorList(), stack[9]->toTensorList(), stack[10]->toTensor(), stack[11]->toTensor(),
                  stack[12]->toTensor());
}

const auto registered =
    executorch::runtime::register_kernel(executorch::runtime::Kernel("lora_share::rope_attend.out", rope_attend_boxed));

}  // namespace
}  // namespace lora_share
