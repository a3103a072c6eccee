// The attend kernel's AVX-512 inner loops (F, BW, DQ, VL + F16C + FMA;
// attend_kernel.cpp's header comment), compiled with per-function target
// attributes (no -march on the target) and run only where the CPU has them.

#include "attend_driver.h"

#if defined(__x86_64__)
// GCC 12's AVX-512 headers trip its own -Wuninitialized (_mm512_undefined_ps
// initialises itself: GCC bug 105593, fixed in 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace lora_share {
namespace attend_loops {
namespace {

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

}  // namespace

Loops avx512_loops() { return loops_of<OpsAvx512>(); }

}  // namespace attend_loops
}  // namespace lora_share

#endif  // __x86_64__
