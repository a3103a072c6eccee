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
// The inner loops exist three times: AVX-512 (F/BW/DQ/VL + F16C + FMA), AVX2
// (+ FMA + F16C), both x86-64 only and compiled with per-function target
// attributes (no -march on the target), chosen once at run time; and a
// portable version of plain loops for everything else (aarch64: the compiler
// vectorises them for NEON). LORA_SHARE_ATTEND_ISA=avx512|avx2|portable in the
// environment forces one (testing); a request the CPU cannot run falls back.

#include "attend_kernel.h"

#include <executorch/extension/kernel_util/make_boxed_from_unboxed_functor.h>
#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#if defined(__x86_64__)
// GCC 12's AVX-512 headers trip its own -Wuninitialized (_mm512_undefined_ps
// initialises itself: GCC bug 105593, fixed in 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#endif

namespace lora_share {
namespace {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::aten::TensorList;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kChunk = 64;     // keys per online-softmax step
constexpr int kRowBlock = 16;  // query rows per task (decode has R <= 16)
// Software prefetch: the cache rows about 8 KB ahead of the ones being read
// (the hardware prefetcher alone leaves a single core well below its bandwidth).
constexpr int kPrefetchBytes = 8192;
inline int prefetch_rows(int64_t row_bytes) {
  return static_cast<int>(std::max<int64_t>(16, kPrefetchBytes / std::max<int64_t>(1, row_bytes)));
}
// Below this much work (n_kv * R * (S + T) * hd multiply-adds) one call stays on the
// calling thread: the threadpool hand-off costs about as much as the work itself
// (measured: SmolLM2-135M's shape, 3 x 3 x 64, gains from 2 threads from S ~ 50).
constexpr int64_t kParallelMinWork = 32 * 1024;
// A key block handed to a thread covers at least this many positions.
constexpr int64_t kMinBlock = 128;

// ---- portable ------------------------------------------------------------------------
// GCC/Clang vector extensions: four floats, NEON on aarch64, SSE2 on x86-64.

typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

inline v4f ldv(const float* p) {
  v4f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void stv(float* p, v4f v) { std::memcpy(p, &v, sizeof v); }
inline v4f splat(float x) { return v4f{x, x, x, x}; }
inline float hsum(v4f v) { return (v[0] + v[2]) + (v[1] + v[3]); }

// exp(x) for x <= 0 (x - max of a row); 0 below -87 (and for -inf): Cephes' expf
// polynomial.
inline v4f exp_v4(v4f x) {
  const v4i keep = x >= splat(-87.0f);
  x = x < splat(-87.0f) ? splat(-87.0f) : x;
  // n = round(x * log2(e)): x <= 0, so truncating t - 0.5 toward zero rounds
  const v4i ni = __builtin_convertvector(x * splat(1.44269504088896341f) - splat(0.5f), v4i);
  const v4f n = __builtin_convertvector(ni, v4f);
  v4f r = x - n * splat(0.693359375f);
  r = r - n * splat(-2.12194440e-4f);
  const v4f z = r * r;
  v4f y = splat(1.9875691500e-4f);
  y = y * r + splat(1.3981999507e-3f);
  y = y * r + splat(8.3334519073e-3f);
  y = y * r + splat(4.1665795894e-2f);
  y = y * r + splat(1.6666665459e-1f);
  y = y * r + splat(5.0000001201e-1f);
  y = y * z + r + splat(1.0f);
  const v4i e = (ni + 127) << 23;
  v4f scale;
  std::memcpy(&scale, &e, sizeof scale);
  v4i bits;
  const v4f out = y * scale;
  std::memcpy(&bits, &out, sizeof bits);
  bits &= keep;
  v4f res;
  std::memcpy(&res, &bits, sizeof res);
  return res;
}

// Four float16 to float32, exactly (zeros, subnormals, infinities, NaN): the
// exponent rebiased in integer lanes, subnormals renormalised by one subtraction.
inline v4f half4_to_float(const half_t* p) {
  const v4i h = {p[0], p[1], p[2], p[3]};
  const v4i exp_mask = v4i{0x7c00, 0x7c00, 0x7c00, 0x7c00} << 13;
  v4i o = (h & 0x7fff) << 13;
  const v4i e = o & exp_mask;
  o += (127 - 15) << 23;
  o += (e == exp_mask) & ((128 - 16) << 23);  // infinity, NaN
  v4i sub = o + (1 << 23);
  v4f subf;
  std::memcpy(&subf, &sub, sizeof subf);
  subf -= splat(6.103515625e-05f);  // 2^-14
  std::memcpy(&sub, &subf, sizeof sub);
  o = e == 0 ? sub : o;  // zero, subnormal
  o |= (h & 0x8000) << 16;
  v4f f;
  std::memcpy(&f, &o, sizeof f);
  return f;
}

inline float exp_nonpositive(float x) {  // one lane of exp_v4
  return exp_v4(splat(x))[0];
}

struct OpsPortable {
  static void to_f32(const float* src, int64_t n, float* dst) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  }
  static void to_f32(const half_t* src, int64_t n, float* dst) {
#if defined(__aarch64__)
    const __fp16* s = reinterpret_cast<const __fp16*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
#else
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) stv(dst + i, half4_to_float(src + i));
    for (; i < n; ++i) dst[i] = half_to_float(src[i]);
#endif
  }
  static float row_max(const float* x, int n) {
    v4f m = splat(kNegInf);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
      const v4f v = ldv(x + i);
      m = v > m ? v : m;
    }
    float r = std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
    for (; i < n; ++i) r = x[i] > r ? x[i] : r;
    return r;
  }
  static float exp_sum(float* x, int n, float mx) {
    v4f sum = splat(0.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
      const v4f e = exp_v4(ldv(x + i) - splat(mx));
      stv(x + i, e);
      sum += e;
    }
    float s = hsum(sum);
    for (; i < n; ++i) {
      x[i] = exp_nonpositive(x[i] - mx);
      s += x[i];
    }
    return s;
  }
  static void scale(float* x, int n, float f) {
    for (int i = 0; i < n; ++i) x[i] *= f;
  }
  static void axpy(float* y, const float* x, float a, int n) {
    for (int i = 0; i < n; ++i) y[i] += a * x[i];
  }
  static float dot(const float* a, const float* b, int n) {
    v4f a0 = splat(0.0f), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
      a0 += ldv(a + i) * ldv(b + i);
      a1 += ldv(a + i + 4) * ldv(b + i + 4);
      a2 += ldv(a + i + 8) * ldv(b + i + 8);
      a3 += ldv(a + i + 12) * ldv(b + i + 12);
    }
    for (; i + 4 <= n; i += 4) a0 += ldv(a + i) * ldv(b + i);
    float tail = 0.0f;
    for (; i < n; ++i) tail += a[i] * b[i];
    return hsum((a0 + a1) + (a2 + a3)) + tail;
  }
  // s[r*ss + c] += q[r] . k[c] for r < nr, c < n. kt: scratch for one key row.
  template <class T>
  static void scores(const float* q, int nr, int hdp, const T* k, int n, int hd, float* kt, float* s, int ss) {
    for (int c = 0; c < n; ++c) {
      const float* kr;
      if constexpr (std::is_same_v<T, float>) {
        kr = k + static_cast<int64_t>(c) * hd;
        (void)kt;
      } else {
        to_f32(k + static_cast<int64_t>(c) * hd, hd, kt);
        kr = kt;
      }
      for (int r = 0; r < nr; ++r) s[r * ss + c] += dot(q + r * hdp, kr, hd);
    }
  }
  // acc[r*hdp + d] += sum_c p[r*ps + c] * v[c][d]. vt: scratch for one value row.
  template <class T>
  static void pv(const float* p, int nr, int ps, const T* v, int n, int hd, float* acc, int hdp, float* vt) {
    for (int c = 0; c < n; ++c) {
      const float* vr;
      if constexpr (std::is_same_v<T, float>) {
        vr = v + static_cast<int64_t>(c) * hd;
        (void)vt;
      } else {
        to_f32(v + static_cast<int64_t>(c) * hd, hd, vt);
        vr = vt;
      }
      for (int r = 0; r < nr; ++r) {
        const float pr = p[r * ps + c];
        if (pr == 0.0f) continue;
        float* a = acc + r * hdp;
        for (int d = 0; d < hd; ++d) a[d] += pr * vr[d];
      }
    }
  }
  static void store(const float* acc, float f, int hd, float* dst) {
    for (int d = 0; d < hd; ++d) dst[d] = acc[d] * f;
  }
  static void store(const float* acc, float f, int hd, half_t* dst) {
#if defined(__aarch64__)
    __fp16* o = reinterpret_cast<__fp16*>(dst);
    for (int d = 0; d < hd; ++d) o[d] = static_cast<__fp16>(acc[d] * f);
#else
    for (int d = 0; d < hd; ++d) dst[d] = float_to_half(acc[d] * f);
#endif
  }
};

#if defined(__x86_64__)

// ---- AVX-512 (F, BW, DQ, VL) + F16C + FMA ------------------------------------------

#define LS_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,f16c,fma")))
#define LS_AVX512_INLINE LS_AVX512 __attribute__((always_inline)) inline

LS_AVX512_INLINE __m512 ld16(const float* p) { return _mm512_loadu_ps(p); }
LS_AVX512_INLINE __m512 ld16(const half_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
LS_AVX512_INLINE __m512 ld16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
LS_AVX512_INLINE __m512 ld16(const half_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
LS_AVX512_INLINE __mmask16 mask16(int n) {  // the first n lanes, 0 <= n <= 16
  return static_cast<__mmask16>((1u << n) - 1u);
}

// exp(x) for x <= 0; exactly 0 below -120 (and for -inf), NaN stays NaN.
LS_AVX512_INLINE __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-120.0f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  const __m512 z = _mm512_mul_ps(r, r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_add_ps(_mm512_fmadd_ps(y, z, r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);  // y * 2^n, underflowing to 0
}

// The horizontal sums of 16 vectors as one vector, in order: 46 shuffles and
// adds instead of 16 full reductions.
LS_AVX512_INLINE __m512 reduce16x16(const __m512* a) {
  __m512 b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i)  // [a.c0+a.c2, a.c1+a.c3, a'.c0+a'.c2, a'.c1+a'.c3]
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int i = 0; i < 4; ++i)  // 128-bit chunk j: 4 partial sums of key 4i+j
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int i = 0; i < 2; ++i)  // chunk j: lanes 0,2 key 8i+j, lanes 1,3 key 8i+4+j
    d[i] = _mm512_add_ps(_mm512_unpacklo_ps(c[2 * i], c[2 * i + 1]), _mm512_unpackhi_ps(c[2 * i], c[2 * i + 1]));
  // chunk j: lane 0 key j, lane 1 key 8+j, lane 2 key 4+j, lane 3 key 12+j
  const __m512 e = _mm512_add_ps(_mm512_unpacklo_ps(d[0], d[1]), _mm512_unpackhi_ps(d[0], d[1]));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, e);
}

template <int NR, int NC, bool Masked, class T>
LS_AVX512_INLINE void pv_tile512(const float* p, int ps, const T* v, int n, int hd, float* acc, int hdp,
                                 __mmask16 last) {
  const int64_t ahead = static_cast<int64_t>(prefetch_rows(hd * static_cast<int64_t>(sizeof(T)))) * hd;
  __m512 a[NR][NC];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < NC; ++j) a[r][j] = _mm512_loadu_ps(acc + r * hdp + 16 * j);
  for (int c = 0; c < n; ++c) {
    const T* vr = v + static_cast<int64_t>(c) * hd;
    if (NC == 4) {
      const char* pf = reinterpret_cast<const char*>(vr + ahead);
      for (int b = 0; b < 64 * static_cast<int>(sizeof(T)); b += 64) _mm_prefetch(pf + b, _MM_HINT_T0);
    }
    __m512 vv[NC];
    for (int j = 0; j < NC; ++j) vv[j] = (Masked && j == NC - 1) ? ld16(vr + 16 * j, last) : ld16(vr + 16 * j);
    for (int r = 0; r < NR; ++r) {
      const __m512 pb = _mm512_set1_ps(p[r * ps + c]);
      for (int j = 0; j < NC; ++j) a[r][j] = _mm512_fmadd_ps(pb, vv[j], a[r][j]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < NC; ++j) _mm512_storeu_ps(acc + r * hdp + 16 * j, a[r][j]);
}

template <int NR, class T>
LS_AVX512 void pv_rows512(const float* p, int ps, const T* v, int n, int hd, float* acc, int hdp) {
  int d = 0;
  for (; d + 64 <= hd; d += 64) pv_tile512<NR, 4, false>(p, ps, v + d, n, hd, acc + d, hdp, 0);
  const int rest = hd - d;
  if (rest == 0) return;
  const int nc = (rest + 15) / 16;
  const __mmask16 last = mask16(rest - 16 * (nc - 1));
  switch (nc) {
    case 1:
      pv_tile512<NR, 1, true>(p, ps, v + d, n, hd, acc + d, hdp, last);
      break;
    case 2:
      pv_tile512<NR, 2, true>(p, ps, v + d, n, hd, acc + d, hdp, last);
      break;
    case 3:
      pv_tile512<NR, 3, true>(p, ps, v + d, n, hd, acc + d, hdp, last);
      break;
    default:
      pv_tile512<NR, 4, true>(p, ps, v + d, n, hd, acc + d, hdp, last);
      break;
  }
}

// scores for a head size known at compile time (a multiple of 16): the key tile's
// offsets are constants, its conversion straight-line code.
template <int HD, class T>
LS_AVX512 void scores512_fixed(const float* q, int nr, const T* k, int n, float* kt, float* s, int ss) {
  for (int c0 = 0; c0 < n; c0 += 16) {
    const int nk = std::min(16, n - c0);
    const T* kc = k + static_cast<int64_t>(c0) * HD;
    {  // the keys one chunk ahead (no fault past the end)
      constexpr int kAhead = std::max<int>(16, kPrefetchBytes / (HD * sizeof(T)));
      const char* pf = reinterpret_cast<const char*>(kc + kAhead * HD);
      for (int b = 0; b < 16 * HD * static_cast<int>(sizeof(T)); b += 64) _mm_prefetch(pf + b, _MM_HINT_T0);
    }
    const float* kb = kt;
    if constexpr (std::is_same_v<T, float>) {
      kb = kc;
      (void)kt;
    } else if (nk == 16) {
      for (int j = 0; j < 16; ++j)
        for (int d = 0; d < HD; d += 16) _mm512_storeu_ps(kt + j * HD + d, ld16(kc + j * HD + d));
    } else {
      for (int j = 0; j < nk; ++j)
        for (int d = 0; d < HD; d += 16) _mm512_storeu_ps(kt + j * HD + d, ld16(kc + j * HD + d));
    }
    if (nk == 16) {
      for (int r = 0; r < nr; ++r) {
        const float* qr = q + r * HD;
        __m512 a[16];
        for (int j = 0; j < 16; ++j) a[j] = _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int d = 0; d < HD; d += 16) {
          const __m512 qv = _mm512_loadu_ps(qr + d);
          for (int j = 0; j < 16; ++j) a[j] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kb + j * HD + d), a[j]);
        }
        float* sr = s + r * ss + c0;
        _mm512_storeu_ps(sr, _mm512_add_ps(_mm512_loadu_ps(sr), reduce16x16(a)));
      }
    } else {
      for (int r = 0; r < nr; ++r) {
        const float* qr = q + r * HD;
        for (int j = 0; j < nk; ++j) {
          __m512 a = _mm512_setzero_ps();
          for (int d = 0; d < HD; d += 16)
            a = _mm512_fmadd_ps(_mm512_loadu_ps(qr + d), _mm512_loadu_ps(kb + j * HD + d), a);
          s[r * ss + c0 + j] += _mm512_reduce_add_ps(a);
        }
      }
    }
  }
}

struct OpsAvx512 {
  LS_AVX512 static void to_f32(const float* src, int64_t n, float* dst) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  }
  LS_AVX512 static void to_f32(const half_t* src, int64_t n, float* dst) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, ld16(src + i));
    if (i < n) {
      const __mmask16 m = mask16(static_cast<int>(n - i));
      _mm512_mask_storeu_ps(dst + i, m, ld16(src + i, m));
    }
  }
  LS_AVX512 static float row_max(const float* x, int n) {
    __m512 m = _mm512_set1_ps(kNegInf);
    int i = 0;
    for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
    if (i < n) m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, mask16(n - i), x + i));
    return _mm512_reduce_max_ps(m);
  }
  LS_AVX512 static float exp_sum(float* x, int n, float mx) {
    const __m512 vm = _mm512_set1_ps(mx);
    __m512 sum = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
      _mm512_storeu_ps(x + i, e);
      sum = _mm512_add_ps(sum, e);
    }
    if (i < n) {
      const __mmask16 m = mask16(n - i);
      const __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vm)));
      _mm512_mask_storeu_ps(x + i, m, e);
      sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
  }
  LS_AVX512 static void scale(float* x, int n, float f) {
    const __m512 vf = _mm512_set1_ps(f);
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), vf));
    if (i < n) {
      const __mmask16 m = mask16(n - i);
      _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vf));
    }
  }
  LS_AVX512 static void axpy(float* y, const float* x, float a, int n) {
    const __m512 va = _mm512_set1_ps(a);
    int i = 0;
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
      const __mmask16 m = mask16(n - i);
      _mm512_mask_storeu_ps(y + i, m,
                            _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
  }
  // s[r*ss + c] += q[r] . k[c]. q rows are zero-padded to hdp (a multiple of 16);
  // key rows are used in place (float32, hd == hdp) or converted 16 at a time
  // into kt (16 x hdp, zero-padded), once for all rows.
  template <class T>
  LS_AVX512 static void scores(const float* q, int nr, int hdp, const T* k, int n, int hd, float* kt, float* s,
                               int ss) {
    switch (hd) {
      case 64:
        return scores512_fixed<64>(q, nr, k, n, kt, s, ss);
      case 128:
        return scores512_fixed<128>(q, nr, k, n, kt, s, ss);
      case 256:
        return scores512_fixed<256>(q, nr, k, n, kt, s, ss);
      default:
        break;
    }
    constexpr bool kDirect = std::is_same_v<T, float>;
    const bool direct = kDirect && hd == hdp;
    for (int c0 = 0; c0 < n; c0 += 16) {
      const int nk = std::min(16, n - c0);
      const T* kc = k + static_cast<int64_t>(c0) * hd;
      const float* kb = kt;
      int ks = hdp;
      if (direct) {
        kb = reinterpret_cast<const float*>(kc);
        ks = hd;
      } else {
        for (int j = 0; j < nk; ++j) {
          to_f32(kc + static_cast<int64_t>(j) * hd, hd, kt + j * hdp);
          for (int d = hd; d < hdp; ++d) kt[j * hdp + d] = 0.0f;
        }
      }
      if (nk == 16) {
        for (int r = 0; r < nr; ++r) {
          const float* qr = q + r * hdp;
          __m512 a[16];
          for (int j = 0; j < 16; ++j) a[j] = _mm512_setzero_ps();
          for (int d = 0; d < hdp; d += 16) {
            const __m512 qv = _mm512_loadu_ps(qr + d);
            for (int j = 0; j < 16; ++j) a[j] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kb + j * ks + d), a[j]);
          }
          float* sr = s + r * ss + c0;
          _mm512_storeu_ps(sr, _mm512_add_ps(_mm512_loadu_ps(sr), reduce16x16(a)));
        }
      } else {
        for (int r = 0; r < nr; ++r) {
          const float* qr = q + r * hdp;
          for (int j = 0; j < nk; ++j) {
            __m512 a = _mm512_setzero_ps();
            for (int d = 0; d < hdp; d += 16)
              a = _mm512_fmadd_ps(_mm512_loadu_ps(qr + d), _mm512_loadu_ps(kb + j * ks + d), a);
            s[r * ss + c0 + j] += _mm512_reduce_add_ps(a);
          }
        }
      }
    }
  }
  // acc[r*hdp + d] += sum_c p[r*ps + c] * v[c][d], four rows at a time with the
  // accumulators of 64 columns in registers; each value row is loaded (and
  // converted) once per four rows.
  template <class T>
  LS_AVX512 static void pv(const float* p, int nr, int ps, const T* v, int n, int hd, float* acc, int hdp, float*) {
    int r = 0;
    for (; r + 4 <= nr; r += 4) pv_rows512<4>(p + r * ps, ps, v, n, hd, acc + r * hdp, hdp);
    switch (nr - r) {
      case 3:
        pv_rows512<3>(p + r * ps, ps, v, n, hd, acc + r * hdp, hdp);
        break;
      case 2:
        pv_rows512<2>(p + r * ps, ps, v, n, hd, acc + r * hdp, hdp);
        break;
      case 1:
        pv_rows512<1>(p + r * ps, ps, v, n, hd, acc + r * hdp, hdp);
        break;
      default:
        break;
    }
  }
  LS_AVX512 static void store(const float* acc, float f, int hd, float* dst) {
    const __m512 vf = _mm512_set1_ps(f);
    int d = 0;
    for (; d + 16 <= hd; d += 16) _mm512_storeu_ps(dst + d, _mm512_mul_ps(_mm512_loadu_ps(acc + d), vf));
    if (d < hd) _mm512_mask_storeu_ps(dst + d, mask16(hd - d), _mm512_mul_ps(_mm512_loadu_ps(acc + d), vf));
  }
  LS_AVX512 static void store(const float* acc, float f, int hd, half_t* dst) {
    const __m512 vf = _mm512_set1_ps(f);
    int d = 0;
    for (; d + 16 <= hd; d += 16)
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(dst + d),
          _mm512_cvtps_ph(_mm512_mul_ps(_mm512_loadu_ps(acc + d), vf), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (d < hd)
      _mm256_mask_storeu_epi16(
          dst + d, mask16(hd - d),
          _mm512_cvtps_ph(_mm512_mul_ps(_mm512_loadu_ps(acc + d), vf), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

// ---- AVX2 + FMA + F16C ----------------------------------------------------------------

#define LS_AVX2 __attribute__((target("avx2,fma,f16c")))
#define LS_AVX2_INLINE LS_AVX2 __attribute__((always_inline)) inline

LS_AVX2_INLINE __m256 ld8(const float* p) { return _mm256_loadu_ps(p); }
LS_AVX2_INLINE __m256 ld8(const half_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
LS_AVX2_INLINE float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
LS_AVX2_INLINE float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
// exp(x) for x <= 0; exactly 0 below -87 (and for -inf).
LS_AVX2_INLINE __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
  x = _mm256_max_ps(lo, x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  const __m256 z = _mm256_mul_ps(r, r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, z, r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), keep);
}
// The horizontal sums of 8 vectors as one vector, in order.
LS_AVX2_INLINE __m256 reduce8x8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}
LS_AVX2_INLINE float ld1(const float* p) { return *p; }
LS_AVX2_INLINE float ld1(const half_t* p) { return _cvtsh_ss(*p); }

// AVX2 has 16 ymm registers: four rows by 16 columns of accumulators.
template <int NR, int NC, class T>
LS_AVX2_INLINE void pv_tile256(const float* p, int ps, const T* v, int n, int hd, float* acc, int hdp) {
  const int64_t ahead = static_cast<int64_t>(prefetch_rows(hd * static_cast<int64_t>(sizeof(T)))) * hd;
  __m256 a[NR][NC];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < NC; ++j) a[r][j] = _mm256_loadu_ps(acc + r * hdp + 8 * j);
  for (int c = 0; c < n; ++c) {
    const T* vr = v + static_cast<int64_t>(c) * hd;
    _mm_prefetch(reinterpret_cast<const char*>(vr + ahead), _MM_HINT_T0);
    __m256 vv[NC];
    for (int j = 0; j < NC; ++j) vv[j] = ld8(vr + 8 * j);
    for (int r = 0; r < NR; ++r) {
      const __m256 pb = _mm256_broadcast_ss(p + r * ps + c);
      for (int j = 0; j < NC; ++j) a[r][j] = _mm256_fmadd_ps(pb, vv[j], a[r][j]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < NC; ++j) _mm256_storeu_ps(acc + r * hdp + 8 * j, a[r][j]);
}

template <int NR, class T>
LS_AVX2 void pv_rows256(const float* p, int ps, const T* v, int n, int hd, float* acc, int hdp) {
  int d = 0;
  for (; d + 16 <= hd; d += 16) pv_tile256<NR, 2>(p, ps, v + d, n, hd, acc + d, hdp);
  if (d + 8 <= hd) {
    pv_tile256<NR, 1>(p, ps, v + d, n, hd, acc + d, hdp);
    d += 8;
  }
  for (; d < hd; ++d)  // hd % 8 columns
    for (int c = 0; c < n; ++c) {
      const float x = ld1(v + static_cast<int64_t>(c) * hd + d);
      for (int r = 0; r < NR; ++r) acc[r * hdp + d] += p[r * ps + c] * x;
    }
}

// scores for a head size known at compile time (a multiple of 8).
template <int HD, class T>
LS_AVX2 void scores256_fixed(const float* q, int nr, const T* k, int n, float* kt, float* s, int ss) {
  constexpr int kAhead = std::max<int>(16, kPrefetchBytes / (HD * sizeof(T)));
  for (int c0 = 0; c0 < n; c0 += 8) {
    const int nk = std::min(8, n - c0);
    const T* kc = k + static_cast<int64_t>(c0) * HD;
    {
      const char* pf = reinterpret_cast<const char*>(kc + kAhead * HD);
      for (int b = 0; b < 8 * HD * static_cast<int>(sizeof(T)); b += 64) _mm_prefetch(pf + b, _MM_HINT_T0);
    }
    const float* kb = kt;
    if constexpr (std::is_same_v<T, float>) {
      kb = kc;
      (void)kt;
    } else {
      for (int j = 0; j < nk; ++j)
        for (int d = 0; d < HD; d += 8) _mm256_storeu_ps(kt + j * HD + d, ld8(kc + j * HD + d));
    }
    if (nk == 8) {
      for (int r = 0; r < nr; ++r) {
        const float* qr = q + r * HD;
        __m256 a[8];
        for (int j = 0; j < 8; ++j) a[j] = _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int d = 0; d < HD; d += 8) {
          const __m256 qv = _mm256_loadu_ps(qr + d);
          for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kb + j * HD + d), a[j]);
        }
        float* sr = s + r * ss + c0;
        _mm256_storeu_ps(sr, _mm256_add_ps(_mm256_loadu_ps(sr), reduce8x8(a)));
      }
    } else {
      for (int r = 0; r < nr; ++r) {
        const float* qr = q + r * HD;
        for (int j = 0; j < nk; ++j) {
          __m256 a = _mm256_setzero_ps();
          for (int d = 0; d < HD; d += 8)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(qr + d), _mm256_loadu_ps(kb + j * HD + d), a);
          s[r * ss + c0 + j] += hsum8(a);
        }
      }
    }
  }
}

struct OpsAvx2 {
  LS_AVX2 static void to_f32(const float* src, int64_t n, float* dst) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  }
  LS_AVX2 static void to_f32(const half_t* src, int64_t n, float* dst) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, ld8(src + i));
    for (; i < n; ++i) dst[i] = _cvtsh_ss(src[i]);
  }
  LS_AVX2 static float row_max(const float* x, int n) {
    __m256 m = _mm256_set1_ps(kNegInf);
    int i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
    float r = hmax8(m);
    for (; i < n; ++i) r = x[i] > r ? x[i] : r;
    return r;
  }
  LS_AVX2 static float exp_sum(float* x, int n, float mx) {
    const __m256 vm = _mm256_set1_ps(mx);
    __m256 sum = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
      _mm256_storeu_ps(x + i, e);
      sum = _mm256_add_ps(sum, e);
    }
    float s = hsum8(sum);
    for (; i < n; ++i) {
      x[i] = exp_nonpositive(x[i] - mx);
      s += x[i];
    }
    return s;
  }
  LS_AVX2 static void scale(float* x, int n, float f) {
    const __m256 vf = _mm256_set1_ps(f);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vf));
    for (; i < n; ++i) x[i] *= f;
  }
  LS_AVX2 static void axpy(float* y, const float* x, float a, int n) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; ++i) y[i] += a * x[i];
  }
  template <class T>
  LS_AVX2 static void scores(const float* q, int nr, int hdp, const T* k, int n, int hd, float* kt, float* s, int ss) {
    switch (hd) {
      case 64:
        return scores256_fixed<64>(q, nr, k, n, kt, s, ss);
      case 128:
        return scores256_fixed<128>(q, nr, k, n, kt, s, ss);
      case 256:
        return scores256_fixed<256>(q, nr, k, n, kt, s, ss);
      default:
        break;
    }
    constexpr bool kDirect = std::is_same_v<T, float>;
    const bool direct = kDirect && hd == hdp;
    for (int c0 = 0; c0 < n; c0 += 8) {
      const int nk = std::min(8, n - c0);
      const T* kc = k + static_cast<int64_t>(c0) * hd;
      const float* kb = kt;
      int ks = hdp;
      if (direct) {
        kb = reinterpret_cast<const float*>(kc);
        ks = hd;
      } else {
        for (int j = 0; j < nk; ++j) {
          to_f32(kc + static_cast<int64_t>(j) * hd, hd, kt + j * hdp);
          for (int d = hd; d < hdp; ++d) kt[j * hdp + d] = 0.0f;
        }
      }
      if (nk == 8) {
        for (int r = 0; r < nr; ++r) {
          const float* qr = q + r * hdp;
          __m256 a[8];
          for (int j = 0; j < 8; ++j) a[j] = _mm256_setzero_ps();
          for (int d = 0; d < hdp; d += 8) {
            const __m256 qv = _mm256_loadu_ps(qr + d);
            for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kb + j * ks + d), a[j]);
          }
          float* sr = s + r * ss + c0;
          _mm256_storeu_ps(sr, _mm256_add_ps(_mm256_loadu_ps(sr), reduce8x8(a)));
        }
      } else {
        for (int r = 0; r < nr; ++r) {
          const float* qr = q + r * hdp;
          for (int j = 0; j < nk; ++j) {
            __m256 a = _mm256_setzero_ps();
            for (int d = 0; d < hdp; d += 8)
              a = _mm256_fmadd_ps(_mm256_loadu_ps(qr + d), _mm256_loadu_ps(kb + j * ks + d), a);
            s[r * ss + c0 + j] += hsum8(a);
          }
        }
      }
    }
  }
  template <class T>
  LS_AVX2 static void pv(const float* p, int nr, int ps, const T* v, int n, int hd, float* acc, int hdp, float*) {
    int r = 0;
    for (; r + 4 <= nr; r += 4) pv_rows256<4>(p + r * ps, ps, v, n, hd, acc + r * hdp, hdp);
    switch (nr - r) {
      case 3:
        pv_rows256<3>(p + r * ps, ps, v, n, hd, acc + r * hdp, hdp);
        break;
      case 2:
        pv_rows256<2>(p + r * ps, ps, v, n, hd, acc + r * hdp, hdp);
        break;
      case 1:
        pv_rows256<1>(p + r * ps, ps, v, n, hd, acc + r * hdp, hdp);
        break;
      default:
        break;
    }
  }
  LS_AVX2 static void store(const float* acc, float f, int hd, float* dst) {
    const __m256 vf = _mm256_set1_ps(f);
    int d = 0;
    for (; d + 8 <= hd; d += 8) _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_loadu_ps(acc + d), vf));
    for (; d < hd; ++d) dst[d] = acc[d] * f;
  }
  LS_AVX2 static void store(const float* acc, float f, int hd, half_t* dst) {
    const __m256 vf = _mm256_set1_ps(f);
    int d = 0;
    for (; d + 8 <= hd; d += 8)
      _mm_storeu_si128(
          reinterpret_cast<__m128i*>(dst + d),
          _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(acc + d), vf), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; d < hd; ++d) dst[d] = _cvtss_sh(acc[d] * f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
};

#endif  // __x86_64__

// ---- the driver: key blocks, online softmax, merge, threads --------------------------

struct Problem {
  int64_t n_kv, R, hd, hdp, S, T;
  const void* q;
  const void* k_new;
  const void* v_new;
  const void* bias;
  void* out;
  TensorList keys, values;
  int64_t slab_offset;  // elements into each of keys[h] and values[h] where the S rows start
};

// A 64-byte aligned float buffer that only grows: one per thread, so a call
// allocates nothing once the shapes have been seen.
class Scratch {
 public:
  float* get(size_t n) {
    if (n > size_) {
      buf_.reset(new float[n + 16]);
      size_ = n;
    }
    auto addr = reinterpret_cast<uintptr_t>(buf_.get());
    return reinterpret_cast<float*>((addr + 63) & ~static_cast<uintptr_t>(63));
  }

 private:
  std::unique_ptr<float[]> buf_;
  size_t size_ = 0;
};

thread_local Scratch t_work;      // a task's q, scores and key tile (and its accumulators when serial)
thread_local Scratch t_partials;  // the calling thread's per-task partial results

// One task's partial result: acc [kRowBlock][hdp], then m [kRowBlock], l [kRowBlock].
inline size_t partial_floats(int64_t hdp) { return static_cast<size_t>(kRowBlock * (hdp + 2)); }
inline size_t work_floats(int64_t hdp) { return static_cast<size_t>(kRowBlock * hdp + kRowBlock * kChunk + 16 * hdp); }

template <class Ops, class T>
struct Attend {
  // Rows [r0, r0 + nr) of head h over positions [p0, p1) of the S + T: running
  // max m, sum l and unnormalised accumulator acc (nr x hdp) per row.
  static void block(const Problem& P, int64_t h, int64_t r0, int nr, int64_t p0, int64_t p1, float* acc, float* m,
                    float* l, float* work) {
    const int hd = static_cast<int>(P.hd), hdp = static_cast<int>(P.hdp);
    float* q32 = work;
    float* s = q32 + kRowBlock * hdp;
    float* kt = s + kRowBlock * kChunk;
    const T* q = static_cast<const T*>(P.q) + (h * P.R + r0) * P.hd;
    for (int r = 0; r < nr; ++r) {
      Ops::to_f32(q + r * P.hd, hd, q32 + r * hdp);
      for (int d = hd; d < hdp; ++d) q32[r * hdp + d] = 0.0f;
    }
    std::fill(acc, acc + nr * hdp, 0.0f);
    std::fill(m, m + nr, kNegInf);
    std::fill(l, l + nr, 0.0f);
    const int64_t L = P.S + P.T;
    const T* bias = static_cast<const T*>(P.bias) + r0 * L;

    // Positions [a, b) of one segment (the cache, or this call's keys), whose
    // first position is bias column col0.
    auto segment = [&](const T* kb, const T* vb, int64_t a, int64_t b, int64_t col0) {
      for (int64_t c0 = a; c0 < b; c0 += kChunk) {
        const int n = static_cast<int>(std::min<int64_t>(kChunk, b - c0));
        bool any = false;  // a chunk no row may see is skipped (sliding windows)
        for (int r = 0; r < nr; ++r) {
          Ops::to_f32(bias + r * L + col0 + c0, n, s + r * kChunk);
          any = any || Ops::row_max(s + r * kChunk, n) != kNegInf;
        }
        if (!any) continue;
        Ops::scores(q32, nr, hdp, kb + c0 * P.hd, n, hd, kt, s, kChunk);
        for (int r = 0; r < nr; ++r) {
          float* row = s + r * kChunk;
          const float mx = Ops::row_max(row, n);
          if (mx == kNegInf) {
            std::fill(row, row + n, 0.0f);
            continue;
          }
          const float mn = std::max(m[r], mx);
          if (m[r] != kNegInf && mn > m[r]) {
            const float f = std::exp(m[r] - mn);
            Ops::scale(acc + r * hdp, hd, f);
            l[r] *= f;
          }
          l[r] += Ops::exp_sum(row, n, mn);
          m[r] = mn;
        }
        Ops::pv(s, nr, kChunk, vb + c0 * P.hd, n, hd, acc, hdp, kt);
      }
    };
    if (p0 < std::min(p1, P.S))
      segment(static_cast<const T*>(P.keys[h].const_data_ptr()) + P.slab_offset,
              static_cast<const T*>(P.values[h].const_data_ptr()) + P.slab_offset, p0, std::min(p1, P.S), 0);
    if (std::max(p0, P.S) < p1)
      segment(static_cast<const T*>(P.k_new) + h * P.T * P.hd, static_cast<const T*>(P.v_new) + h * P.T * P.hd,
              std::max(p0, P.S) - P.S, p1 - P.S, P.S);
  }

  static void finish(const Problem& P, int64_t h, int64_t r0, int nr, const float* acc, const float* l) {
    T* out = static_cast<T*>(P.out) + (h * P.R + r0) * P.hd;
    for (int r = 0; r < nr; ++r) {
      T* o = out + r * P.hd;
      if (l[r] > 0.0f)
        Ops::store(acc + r * P.hdp, 1.0f / l[r], static_cast<int>(P.hd), o);
      else
        std::memset(o, 0, static_cast<size_t>(P.hd) * sizeof(T));  // a row that sees nothing
    }
  }

  // Unit u (head, row block) over its whole range, finished into out.
  static void unit(const Problem& P, int64_t u, int64_t nrb) {
    const int64_t h = u / nrb, r0 = (u % nrb) * kRowBlock;
    const int nr = static_cast<int>(std::min<int64_t>(kRowBlock, P.R - r0));
    float* work = t_work.get(work_floats(P.hdp) + partial_floats(P.hdp));
    float* acc = work + work_floats(P.hdp);
    float* m = acc + kRowBlock * P.hdp;
    float* l = m + kRowBlock;
    block(P, h, r0, nr, 0, P.S + P.T, acc, m, l, work);
    finish(P, h, r0, nr, acc, l);
  }

  static void run(const Problem& P) {
    const int64_t nrb = (P.R + kRowBlock - 1) / kRowBlock;
    const int64_t units = P.n_kv * nrb;
    const int64_t L = P.S + P.T;
    const int64_t threads = std::max<int64_t>(1, executorch::extension::get_thread_count());
    const int64_t work = P.n_kv * P.R * L * P.hd;
    if (units == 0) return;
    if (threads == 1 || work < kParallelMinWork) {
      for (int64_t u = 0; u < units; ++u) unit(P, u, nrb);
      return;
    }
    // Key blocks per unit: the fewest that spread the tasks evenly over the
    // threads (parallel_for gives each thread one contiguous run of tasks).
    int64_t splits = 1;
    double best = 0.0;
    const int64_t max_splits = std::max<int64_t>(1, std::min<int64_t>(64, L / kMinBlock));
    for (int64_t sp = 1; sp <= max_splits; ++sp) {
      const int64_t tasks = units * sp;
      const double balance = static_cast<double>(tasks) / (((tasks + threads - 1) / threads) * threads);
      if (balance > best + 1e-9) {
        best = balance;
        splits = sp;
      }
      if (balance >= 0.99) break;
    }
    if (units * splits == 1) {
      unit(P, 0, nrb);
      return;
    }
    if (splits == 1) {
      const bool ok = executorch::extension::parallel_for(0, units, 1, [&](int64_t b, int64_t e) {
        for (int64_t u = b; u < e; ++u) unit(P, u, nrb);
      });
      if (!ok)
        for (int64_t u = 0; u < units; ++u) unit(P, u, nrb);
      return;
    }
    // Block b of a unit covers [b * span, (b + 1) * span), whole chunks.
    const int64_t span = ((L + splits - 1) / splits + kChunk - 1) / kChunk * kChunk;
    const int64_t tasks = units * splits;
    const size_t pf = partial_floats(P.hdp);
    float* partials = t_partials.get(pf * static_cast<size_t>(tasks));
    auto task = [&](int64_t t) {
      const int64_t u = t / splits, b = t % splits;
      const int64_t h = u / nrb, r0 = (u % nrb) * kRowBlock;
      const int nr = static_cast<int>(std::min<int64_t>(kRowBlock, P.R - r0));
      float* acc = partials + pf * static_cast<size_t>(t);
      float* m = acc + kRowBlock * P.hdp;
      float* l = m + kRowBlock;
      const int64_t p0 = std::min(L, b * span), p1 = std::min(L, (b + 1) * span);
      if (p0 >= p1) {  // nothing left for this block
        std::fill(m, m + nr, kNegInf);
        std::fill(l, l + nr, 0.0f);
        return;
      }
      block(P, h, r0, nr, p0, p1, acc, m, l, t_work.get(work_floats(P.hdp)));
    };
    const bool ok = executorch::extension::parallel_for(0, tasks, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) task(t);
    });
    if (!ok)
      for (int64_t t = 0; t < tasks; ++t) task(t);
    // Merge each unit's blocks into the first: rescale to the common max.
    const int hd = static_cast<int>(P.hd);
    for (int64_t u = 0; u < units; ++u) {
      const int64_t h = u / nrb, r0 = (u % nrb) * kRowBlock;
      const int nr = static_cast<int>(std::min<int64_t>(kRowBlock, P.R - r0));
      float* first = partials + pf * static_cast<size_t>(u * splits);
      float* fm = first + kRowBlock * P.hdp;
      float* fl = fm + kRowBlock;
      for (int r = 0; r < nr; ++r) {
        float mx = kNegInf;
        for (int64_t b = 0; b < splits; ++b) {
          const float* mb = partials + pf * static_cast<size_t>(u * splits + b) + kRowBlock * P.hdp;
          mx = std::max(mx, mb[r]);
        }
        if (mx == kNegInf) {
          fl[r] = 0.0f;
          continue;
        }
        float* a0 = first + r * P.hdp;
        const float w0 = fm[r] == kNegInf ? 0.0f : std::exp(fm[r] - mx);
        if (w0 != 1.0f) Ops::scale(a0, hd, w0);
        float lsum = fl[r] * w0;
        for (int64_t b = 1; b < splits; ++b) {
          const float* pb = partials + pf * static_cast<size_t>(u * splits + b);
          const float* mb = pb + kRowBlock * P.hdp;
          const float* lb = mb + kRowBlock;
          if (mb[r] == kNegInf) continue;
          const float w = std::exp(mb[r] - mx);
          Ops::axpy(a0, pb + r * P.hdp, w, hd);
          lsum += lb[r] * w;
        }
        fl[r] = lsum;
      }
      finish(P, h, r0, nr, first, fl);
    }
  }
};

using RunFn = void (*)(const Problem&);
struct Impl {
  RunFn f32;
  RunFn f16;
  const char* isa;
};

template <class Ops>
constexpr Impl impl_of(const char* isa) {
  return Impl{&Attend<Ops, float>::run, &Attend<Ops, half_t>::run, isa};
}

Impl pick_impl() {
  const char* want = std::getenv("LORA_SHARE_ATTEND_ISA");
  const bool any = want == nullptr || *want == '\0';
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  if (avx512 && (any || std::strcmp(want, "avx512") == 0)) return impl_of<OpsAvx512>("avx512");
  if (avx2 && (any || std::strcmp(want, "avx512") == 0 || std::strcmp(want, "avx2") == 0))
    return impl_of<OpsAvx2>("avx2");
#else
  (void)any;
#endif
  return impl_of<OpsPortable>("portable");
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
  Problem P;
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
  const Impl& run = impl();
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
