// Four-float vectors in GCC/Clang's vector extensions (NEON on aarch64, SSE2
// on x86-64): the portable loops' arithmetic (attend_portable.cpp), and the
// scalar exp the AVX2 loops' tails use (attend_avx2.cpp), so both round alike.
#pragma once

#include <cstdint>
#include <cstring>

#include "attend_kernel.h"

namespace lora_share {
namespace attend_loops {

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

}  // namespace attend_loops
}  // namespace lora_share
