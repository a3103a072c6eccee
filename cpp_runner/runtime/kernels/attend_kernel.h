// What the decode kernels in this folder share: attend_kernel.cpp's attention
// on raw buffers, the float16 conversions it rounds with, and
// rope_attend_kernel.cpp's one-token halves.
#pragma once

#include <executorch/runtime/core/exec_aten/exec_aten.h>

#include <cstdint>
#include <cstring>

namespace lora_share {

using half_t = uint16_t;  // float16 storage; converted to float32 for arithmetic

inline float half_to_float(half_t h) {
#if defined(__aarch64__)
  __fp16 v;
  std::memcpy(&v, &h, sizeof v);
  return static_cast<float>(v);
#else
  return c10::detail::fp16_ieee_to_fp32_value(h);
#endif
}

inline half_t float_to_half(float f) {  // round to nearest even, as XNNPACK's convert
#if defined(__aarch64__)
  __fp16 v = static_cast<__fp16>(f);
  half_t h;
  std::memcpy(&h, &v, sizeof h);
  return h;
#else
  return c10::detail::fp16_ieee_from_fp32_value(f);
#endif
}

// attend (attend_kernel.cpp's header comment) on contiguous buffers of float16
// (`half`) or float32, every shape already checked by the caller: q and out
// [n_kv, R, hd], k_new and v_new [n_kv, T, hd], bias [R, S + T], keys[h] and
// values[h] [S, hd]; with `slab_offset`, the S rows start that many elements
// into each keys[h] and values[h] (one KV slot of a pool: rope_attend_rows).
void attend_rows(bool half, int64_t n_kv, int64_t R, int64_t hd, int64_t S, int64_t T, const void* q, const void* k_new,
                 const void* v_new, const void* bias, executorch::aten::TensorList keys,
                 executorch::aten::TensorList values, void* out, int64_t slab_offset = 0);

// The loops attend_rows runs: "avx512", "avx2" or "portable" (picked once, at
// first use; LORA_SHARE_ATTEND_ISA forces one the CPU can run).
const char* attend_isa();

// The rows S of the cache slabs an attention call reads: keys[h] and values[h]
// for each head, of `dtype`, each [S, hd] and contiguous (S read off keys[0];
// 0 without heads). -1 after logging what is wrong, prefixed with `op`;
// `dtype_of` names the input the slabs' dtype must match. The caller checks
// keys and values hold the same number of heads.
int64_t slab_rows(const char* op, const char* dtype_of, executorch::aten::TensorList keys,
                  executorch::aten::TensorList values, int64_t hd, executorch::aten::ScalarType dtype);

// True when every dimension of `t` of size > 1 is laid out densely, in order.
bool is_contiguous(const executorch::aten::Tensor& t);

// rope_attend's two halves (rope_attend_kernel.cpp, compiled without
// floating-point contraction), which the batch method's kernel
// (rope_attend_rows_kernel.cpp) runs apart, every entry's keys and values
// before any entry's attention. token_kv: one token's k and v [n_kv * hd]
// (float32), k rotated by cos_k/sin_k, into the cache's dtype (`half` or
// float32) in k_dst and v_dst [n_kv, hd]. token_attend: q [n_heads * hd]
// rotated by cos_q/sin_q into the cache's dtype, attend_rows over S slab rows
// from `slab_offset` and this token's k_dst/v_dst with `bias` [rep, S + 1],
// the result into out [n_heads * hd] float32.
void token_kv(bool half, int64_t n_kv, int64_t hd, const float* k, const float* v, const float* cos_k,
              const float* sin_k, void* k_dst, void* v_dst);
void token_attend(bool half, int64_t n_heads, int64_t n_kv, int64_t hd, int64_t S, const float* q, const float* cos_q,
                  const float* sin_q, const void* bias, executorch::aten::TensorList keys,
                  executorch::aten::TensorList values, int64_t slab_offset, float* out, const void* k_dst,
                  const void* v_dst);

}  // namespace lora_share
