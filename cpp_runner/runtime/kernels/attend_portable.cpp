// The attend kernel's portable inner loops (attend_kernel.cpp's header
// comment): plain loops and four-float vectors, which the compiler turns into
// NEON on aarch64 and SSE2 on x86-64; what runs where neither AVX2 nor AVX-512
// does.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attend_driver.h"
#include "attend_vec4.h"

namespace lora_share {
namespace attend_loops {
namespace {

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

}  // namespace

Loops portable_loops() { return loops_of<OpsPortable>(); }

}  // namespace attend_loops
}  // namespace lora_share
