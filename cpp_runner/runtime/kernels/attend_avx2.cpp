// The attend kernel's AVX2 inner loops (+ FMA + F16C; attend_kernel.cpp's
// header comment), compiled with per-function target attributes (no -march
// on the target) and run only where the CPU has them.

#include "attend_driver.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attend_vec4.h"

namespace lora_share {
namespace attend_loops {
namespace {

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

}  // namespace

Loops avx2_loops() { return loops_of<OpsAvx2>(); }

}  // namespace attend_loops
}  // namespace lora_share

#endif  // __x86_64__
