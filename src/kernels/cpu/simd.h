// 16-wide fp32 vectors for the CPU kernels (GCC/Clang vector extensions; one zmm register
// with AVX-512, two ymm otherwise), and a vectorised exp.
//
// Every helper works lane by lane with no cross-lane arithmetic except the named horizontal
// reductions (hmax, hsum_double), which reduce in a fixed lane order. So a value depends only
// on its own lane's inputs, never on where a block starts, on the thread that runs it or on
// whether the block is a partial tail (load/store with a length).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif

namespace autosp::cpu::simd {

constexpr int64_t W = 16;
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
// Same vector, but loads/stores through it may be unaligned.
typedef float vf_u __attribute__((vector_size(64), aligned(4)));
// 16 doubles (two zmm registers): the lanes of a vf widened, for accurate long sums.
typedef double vd __attribute__((vector_size(128)));

inline vf load(const float* p) { return *reinterpret_cast<const vf_u*>(p); }
inline void store(float* p, vf x) { *reinterpret_cast<vf_u*>(p) = x; }
inline vf splat(float x) { return vf{} + x; }

// The first min(n, W) floats at p (which may be unaligned); the other lanes are `fill`.
// Memory past p + n is never touched.
inline vf load(const float* p, int64_t n, float fill = 0.0f) {
  if (n >= W) return load(p);
#if defined(__AVX512F__)
  return _mm512_mask_loadu_ps(splat(fill), static_cast<__mmask16>((1u << n) - 1u), p);
#else
  vf r = splat(fill);
  std::memcpy(&r, p, sizeof(float) * static_cast<size_t>(std::max<int64_t>(n, 0)));
  return r;
#endif
}
// Stores the first min(n, W) lanes of x at p; memory past p + n is never touched.
inline void store(float* p, int64_t n, vf x) {
  if (n >= W) return store(p, x);
#if defined(__AVX512F__)
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1u), x);
#else
  std::memcpy(p, &x, sizeof(float) * static_cast<size_t>(std::max<int64_t>(n, 0)));
#endif
}

inline vf fmadd(vf a, vf b, vf c) {
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}
inline vf vmax(vf a, vf b) { return a > b ? a : b; }
inline float hmax(vf x) {
  float r = x[0];
  for (int t = 1; t < W; ++t) r = std::max(r, x[t]);
  return r;
}
inline vd widen(vf x) { return __builtin_convertvector(x, vd); }
// Sum of the 16 lanes in double, lane 0 first.
inline double hsum_double(const vd& x) {
  double r = x[0];
  for (int t = 1; t < W; ++t) r += x[t];
  return r;
}

// exp(x) for a vector, ~1 ulp on [-87, 88]; returns exactly 0 below -87.3 (and for -inf),
// and exp(88.3) ~ 2.2e38 (finite) for anything above 88.3 (and for +inf).
// Cephes expf: x = n ln2 + r, |r| <= ln2/2, exp(r) by a degree-6 polynomial, 2^n by bits.
inline vf vexp(vf x) {
  const vf lo = splat(-87.3f);
  const vf hi = splat(88.3f);
  vf xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  // Round x / ln2 to nearest with the 1.5 * 2^23 trick (|x / ln2| < 2^22 here).
  const vf magic = splat(12582912.0f);
  vf n = (xc * splat(1.44269504088896341f) + magic) - magic;
  vf r = fmadd(n, splat(-0.693359375f), xc);
  r = fmadd(n, splat(2.12194440e-4f), r);
  vf p = splat(1.9875691500e-4f);
  p = fmadd(p, r, splat(1.3981999507e-3f));
  p = fmadd(p, r, splat(8.3334519073e-3f));
  p = fmadd(p, r, splat(4.1665795894e-2f));
  p = fmadd(p, r, splat(1.6666665459e-1f));
  p = fmadd(p, r, splat(5.0000001201e-1f));
  p = fmadd(p * r, r, r) + splat(1.0f);
  vi e = (__builtin_convertvector(n, vi) + 127) << 23;
  vf y = p * std::bit_cast<vf>(e);
  return x < lo ? vf{} : y;
}

// 1 / (1 + exp(-x)). For x < -88.3, exp(-x) saturates at ~2.2e38 rather than overflowing,
// so s is ~4.5e-39 (true value below that) and never NaN; for x > 87.3, exp(-x) is 0 and
// s is exactly 1.
inline vf vsigmoid(vf x) { return 1.0f / (1.0f + vexp(-x)); }

}  // namespace autosp::cpu::simd
