// lora_share::attend.out: fused decode attention over the caller's KV cache.
//
//   attend.out(Tensor q, Tensor k_new, Tensor v_new, Tensor bias, Tensor[] keys,
//              Tensor[] values, *, Tensor(a!) out) -> Tensor(a!)
//
// Grouped-query attention, batch 1, every tensor contiguous and of one dtype
// (float32 or float16, the KV cache's):
//   q            [n_kv, R, hd]   R query rows per key/value head (RoPE'd, scaled)
//   k_new, v_new [n_kv, T, hd]   this call's keys and values
//   bias         [1, R, S + T]   additive: 0 where a row sees a slot, -inf where not
//   keys[h], values[h]           [S, hd] each: the cache slabs, read in place
//   out          [n_kv, R, hd]   softmax(q k^T + bias) v, accumulated in float32
//
// It replaces XNNPACK's per-call repacking of the past keys and values. The
// work for one head is split in key blocks (flash-decoding): each block keeps,
// per row, its running max, sum and unnormalised float32 accumulator, chunk by
// chunk (online softmax), and blocks of one head are merged at the end. Blocks
// run on ExecuTorch's threadpool (the one XNNPACK uses) once a call is large
// enough to pay for the hand-off.
//
// The driver is written once (attend_driver.h) over a struct of inner loops,
// of which there are three, one file each: AVX-512 (F/BW/DQ/VL + F16C + FMA,
// attend_avx512.cpp), AVX2 (+ FMA + F16C, attend_avx2.cpp), both x86-64 only
// and compiled with per-function target attributes (no -march on the target),
// chosen once at run time; and a portable version of plain loops for
// everything else (attend_portable.cpp; aarch64: the compiler vectorises them
// for NEON). LORA_SHARE_ATTEND_ISA=avx512|avx2|portable in the environment
// forces one (testing); a request the CPU cannot run falls back.

#include "attend_kernel.h"

#include <executorch/extension/kernel_util/make_boxed_from_unboxed_functor.h>
#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/kernel/kernel_includes.h>

#include <cinttypes>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "attend_driver.h"

namespace lora_share {
namespace {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::aten::TensorList;

struct Impl {
  attend_loops::Loops loops;
  const char* isa;
};

Impl pick_impl() {
  const char* want = std::getenv("LORA_SHARE_ATTEND_ISA");
  const bool any = want == nullptr || *want == '\0';
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  if (avx512 && (any || std::strcmp(want, "avx512") == 0)) return Impl{attend_loops::avx512_loops(), "avx512"};
  if (avx2 && (any || std::strcmp(want, "avx512") == 0 || std::strcmp(want, "avx2") == 0))
    return Impl{attend_loops::avx2_loops(), "avx2"};
#else
  (void)any;
#endif
  return Impl{attend_loops::portable_loops(), "portable"};
}

const Impl& impl() {
  static const Impl chosen = pick_impl();
  return chosen;
}

}  // namespace

const char* attend_isa() { return impl().isa; }

bool is_contiguous(const Tensor& t) {
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  int64_t expected = 1;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    if (sizes[d] != 1 && strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

int64_t slab_rows(const char* op, const char* dtype_of, TensorList keys, TensorList values, int64_t hd,
                  ScalarType dtype) {
  if (keys.size() == 0) return 0;
  if (keys[0].dim() < 1 || keys[0].size(keys[0].dim() - 1) != hd) {
    ET_LOG(Error, "%s: keys[0] must be [S, hd=%" PRId64 "]", op, hd);
    return -1;
  }
  const int64_t S = keys[0].numel() / hd;
  for (size_t h = 0; h < keys.size(); ++h) {
    const Tensor& kh = keys[h];
    const Tensor& vh = values[h];
    if (kh.scalar_type() != dtype || vh.scalar_type() != dtype) {
      ET_LOG(Error, "%s: keys[%zu] and values[%zu] must have %s's dtype", op, h, h, dtype_of);
      return -1;
    }
    if (kh.dim() < 1 || vh.dim() < 1 || kh.size(kh.dim() - 1) != hd || vh.size(vh.dim() - 1) != hd ||
        kh.numel() != S * hd || vh.numel() != S * hd) {
      ET_LOG(Error, "%s: keys[%zu] and values[%zu] must be [S=%" PRId64 ", hd=%" PRId64 "]", op, h, h, S, hd);
      return -1;
    }
    if (!is_contiguous(kh) || !is_contiguous(vh)) {
      ET_LOG(Error, "%s: keys[%zu] and values[%zu] must be contiguous", op, h, h);
      return -1;
    }
  }
  return S;
}

void attend_rows(bool half, int64_t n_kv, int64_t R, int64_t hd, int64_t S, int64_t T, const void* q, const void* k_new,
                 const void* v_new, const void* bias, TensorList keys, TensorList values, void* out,
                 int64_t slab_offset) {
  attend_loops::Problem P;
  P.n_kv = n_kv;
  P.R = R;
  P.hd = hd;
  P.hdp = (hd + 15) / 16 * 16;
  P.S = S;
  P.T = T;
  P.q = q;
  P.k_new = k_new;
  P.v_new = v_new;
  P.bias = bias;
  P.out = out;
  P.keys = keys;
  P.values = values;
  P.slab_offset = slab_offset;
  const attend_loops::Loops& run = impl().loops;
  (half ? run.f16 : run.f32)(P);
}

executorch::aten::Tensor& attend_out(executorch::runtime::KernelRuntimeContext& ctx, const Tensor& q,
                                     const Tensor& k_new, const Tensor& v_new, const Tensor& bias, TensorList keys,
                                     TensorList values, Tensor& out) {
  using executorch::runtime::Error;
  const ScalarType dtype = q.scalar_type();
  ET_KERNEL_CHECK_MSG(ctx, dtype == ScalarType::Float || dtype == ScalarType::Half, InvalidArgument, out,
                      "attend: q must be float32 or float16, got dtype %d", static_cast<int>(dtype));
  ET_KERNEL_CHECK_MSG(ctx, q.dim() == 3, InvalidArgument, out, "attend: q must be [n_kv, R, hd], got %zd dims",
                      static_cast<ssize_t>(q.dim()));
  const int64_t n_kv = q.size(0), R = q.size(1), hd = q.size(2);
  ET_KERNEL_CHECK_MSG(ctx, k_new.dim() == 3 && v_new.dim() == 3, InvalidArgument, out,
                      "attend: k_new and v_new must be [n_kv, T, hd]");
  const int64_t T = k_new.size(1);
  ET_KERNEL_CHECK_MSG(ctx,
                      k_new.size(0) == n_kv && k_new.size(2) == hd && v_new.size(0) == n_kv && v_new.size(1) == T &&
                          v_new.size(2) == hd,
                      InvalidArgument, out,
                      "attend: k_new and v_new must both be [n_kv=%" PRId64 ", T, hd=%" PRId64 "]", n_kv, hd);
  ET_KERNEL_CHECK_MSG(ctx, static_cast<int64_t>(keys.size()) == n_kv && static_cast<int64_t>(values.size()) == n_kv,
                      InvalidArgument, out,
                      "attend: keys and values must hold n_kv=%" PRId64 " tensors, got %zu and %zu", n_kv, keys.size(),
                      values.size());
  ET_KERNEL_CHECK_MSG(ctx, hd > 0 && hd <= (1 << 20) && R <= (1 << 24), InvalidArgument, out,
                      "attend: unsupported head size %" PRId64 " or row count %" PRId64, hd, R);
  const int64_t S = slab_rows("attend", "q", keys, values, hd, dtype);
  ET_KERNEL_CHECK(ctx, S >= 0, InvalidArgument, out);
  ET_KERNEL_CHECK_MSG(ctx,
                      k_new.scalar_type() == dtype && v_new.scalar_type() == dtype && bias.scalar_type() == dtype &&
                          out.scalar_type() == dtype,
                      InvalidArgument, out, "attend: k_new, v_new, bias and out must have q's dtype");
  ET_KERNEL_CHECK_MSG(ctx,
                      (bias.dim() == 3 && bias.size(0) == 1 && bias.size(1) == R && bias.size(2) == S + T) ||
                          (bias.dim() == 2 && bias.size(0) == R && bias.size(1) == S + T),
                      InvalidArgument, out, "attend: bias must be [1, R=%" PRId64 ", S+T=%" PRId64 "]", R, S + T);
  ET_KERNEL_CHECK_MSG(ctx, is_contiguous(q) && is_contiguous(k_new) && is_contiguous(v_new) && is_contiguous(bias),
                      InvalidArgument, out, "attend: q, k_new, v_new and bias must be contiguous");
  ET_KERNEL_CHECK_MSG(ctx, executorch::runtime::resize_tensor(out, q.sizes()) == Error::Ok, InvalidArgument, out,
                      "attend: could not resize out to q's shape [%" PRId64 ", %" PRId64 ", %" PRId64 "]", n_kv, R, hd);
  ET_KERNEL_CHECK_MSG(ctx, is_contiguous(out), InvalidArgument, out, "attend: out must be contiguous");
  if (out.numel() == 0) return out;

  attend_rows(dtype == ScalarType::Half, n_kv, R, hd, S, T, q.const_data_ptr(), k_new.const_data_ptr(),
              v_new.const_data_ptr(), bias.const_data_ptr(), keys, values, out.mutable_data_ptr());
  return out;
}

}  // namespace lora_share

EXECUTORCH_LIBRARY(lora_share, "attend.out", lora_share::attend_out);
