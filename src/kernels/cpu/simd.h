// fp32 vectors of the target's width for the per-instruction-set kernels (isa.h): 16 lanes
// (one zmm register) in the avx512 copy, 8 (one ymm) in the avx2 copy; GCC/Clang vector
// extensions plus the few intrinsics they lack (masked tails, fused multiply-add), and a
// vectorised exp.
//
// Every helper works lane by lane with no cross-lane arithmetic except the named horizontal
// reductions (hmax, hsum_double), which reduce in a fixed lane order. So a value depends only
// on its own lane's inputs, never on where a block starts, on the thread that runs it or on
// whether the block is a partial tail (load/store with a length).
#pragma once

#ifndef AUTOSP_ISA
#error "simd.h is for the sources compiled once per instruction set (see kernels/cpu/isa.h)"
#endif

#include <immintrin.h>

#include <bit>
#include <cstdint>

#if defined(__AVX512F__) != defined(AUTOSP_ISA_AVX512)
#error "the avx512 kernels must be built with AVX-512 enabled, and only they"
#endif
#if !defined(__AVX2__) || !defined(__FMA__)
#error "the CPU kernels need at least AVX2 and FMA"
#endif

// GCC warns that a 64-byte vector (vd in the avx2 copy) is passed differently with and
// without AVX-512; these helpers are inline, within one instruction set's copy, so no call
// crosses that boundary.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace autosp::cpu::AUTOSP_ISA::simd {

#if defined(__AVX512F__)
#define AUTOSP_SIMD_BYTES 64
#else
#define AUTOSP_SIMD_BYTES 32
#endif
constexpr int64_t W = AUTOSP_SIMD_BYTES / 4;  // lanes
typedef float vf __attribute__((vector_size(AUTOSP_SIMD_BYTES)));
typedef int32_t vi __attribute__((vector_size(AUTOSP_SIMD_BYTES)));
// Same vector, but loads/stores through it may be unaligned.
typedef float vf_u __attribute__((vector_size(AUTOSP_SIMD_BYTES), aligned(4)));
// W doubles: the lanes of a vf widened, for accurate long sums.
typedef double vd __attribute__((vector_size(2 * AUTOSP_SIMD_BYTES)));

inline vf load(const float* p) { return *reinterpret_cast<const vf_u*>(p); }
inline void store(float* p, vf x) { *reinterpret_cast<vf_u*>(p) = x; }
// x in every lane: one broadcast (vf{} + x would add 0.0f first, since -0.0f + 0.0f is
// +0.0f: an extra dependent add in front of every broadcast in the micro-kernels).
inline vf splat(float x) {
#if defined(__AVX512F__)
  return _mm512_set1_ps(x);
#else
  return _mm256_set1_ps(x);
#endif
}

#if !defined(__AVX512F__)
// Lanes [0, n) set (all bits), the others clear.
inline __m256i first_lanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

// The first min(n, W) floats at p (which may be unaligned); the other lanes are `fill`.
// Memory past p + n is never touched (masked loads do not fault on masked-off lanes).
inline vf load(const float* p, int64_t n, float fill = 0.0f) {
  if (n >= W) return load(p);
  if (n <= 0) return splat(fill);
#if defined(__AVX512F__)
  return _mm512_mask_loadu_ps(splat(fill), static_cast<__mmask16>((1u << n) - 1u), p);
#else
  const __m256i m = first_lanes(n);
  return _mm256_blendv_ps(splat(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
#endif
}
// Stores the first min(n, W) lanes of x at p; memory past p + n is never touched.
inline void store(float* p, int64_t n, vf x) {
  if (n >= W) return store(p, x);
  if (n <= 0) return;
#if defined(__AVX512F__)
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1u), x);
#else
  _mm256_maskstore_ps(p, first_lanes(n), x);
#endif
}

// a * b + c with one rounding, explicitly: the micro-kernels' FMAs do not depend on the
// compiler choosing to contract a * b + c.
inline vf fmadd(vf a, vf b, vf c) {
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(a, b, c);
#else
  return _mm256_fmadd_ps(a, b, c);
#endif
}
inline vf vmax(vf a, vf b) { return a > b ? a : b; }
inline float hmax(vf x) {
  float r = x[0];
  for (int t = 1; t < W; ++t) r = x[t] > r ? x[t] : r;
  return r;
}
inline vd widen(vf x) { return __builtin_convertvector(x, vd); }
// Sum of the W lanes in double, lane 0 first.
inline double hsum_double(const vd& x) {
  double r = x[0];
  for (int t = 1; t < W; ++t) r += x[t];
  return r;
}

// W / 2 doubles: one register, so comparisons and selects stay single instructions
// (GCC lowers those of two-register generic vectors to scalar code).
constexpr int64_t WD = W / 2;
typedef double vdn __attribute__((vector_size(AUTOSP_SIMD_BYTES)));
typedef int64_t vln __attribute__((vector_size(AUTOSP_SIMD_BYTES)));
typedef double vdn_u __attribute__((vector_size(AUTOSP_SIMD_BYTES), aligned(8)));

// sin and cos of WD angles in double (each within ~1e-16 of the exact value for |x| < 2^30):
// Cephes' sin/cos: x reduced modulo pi/4 with a three-part pi/4 (Cody-Waite), then degree
// 13/14 polynomials on [-pi/4, pi/4], the octant choosing which and the signs.
inline void vsincos(vdn x, vdn* sin_out, vdn* cos_out) {
  const vdn zero{};
  const vln negative = x < zero;  // all bits set in negative lanes
  const vdn ax = negative ? -x : x;
  const vdn two52 = zero + 4503599627370496.0;  // 2^52: adding it rounds to an integer
  const vdn t = ax * 1.27323954473516268615;    // 4 / pi
  vdn y = (t + two52) - two52;
  y = y > t ? y - 1.0 : y;                      // floor (t >= 0)
  vln j = std::bit_cast<vln>(y + two52) & 7;    // the octant, from the integer's low bits
  const vln odd = j & 1;
  j = (j + odd) & 7;                            // odd octants map to the next even one
  y = odd != 0 ? y + 1.0 : y;
  const vdn z = ((ax - y * 7.85398125648498535156e-1) - y * 3.77489470793079817668e-8) -
                y * 2.69515142907905952645e-15;
  const vdn zz = z * z;
  vdn ps = zero + 1.58962301576546568060e-10;
  ps = ps * zz - 2.50507477628578072866e-8;
  ps = ps * zz + 2.75573136213857245213e-6;
  ps = ps * zz - 1.98412698295895385996e-4;
  ps = ps * zz + 8.33333333332211858878e-3;
  ps = ps * zz - 1.66666666666666307295e-1;
  const vdn sin_z = z + z * zz * ps;
  vdn pc = zero - 1.13585365213876817300e-11;
  pc = pc * zz + 2.08757008419747316778e-9;
  pc = pc * zz - 2.75573141792967388112e-7;
  pc = pc * zz + 2.48015872888517045348e-5;
  pc = pc * zz - 1.38888888888730564116e-3;
  pc = pc * zz + 4.16666666666665929218e-2;
  const vdn cos_z = 1.0 - 0.5 * zz + zz * zz * pc;
  // Octant j in {0, 2, 4, 6}: sin x = sin z, cos z, -sin z, -cos z; cos x = cos z, -sin z,
  // -cos z, sin z. sin is odd in x, cos even.
  const vln swap = (j == 2) | (j == 6);
  const vdn s_abs = swap ? cos_z : sin_z;
  const vdn c_abs = swap ? sin_z : cos_z;
  const vln s_neg = (j >= 4) ^ negative;
  const vln c_neg = (j == 2) | (j == 4);
  *sin_out = s_neg ? -s_abs : s_abs;
  *cos_out = c_neg ? -c_abs : c_abs;
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

// 2^x for a vector of x < 128, within 7.7e-8 relative on [-126, 127) (tests/kernels/
// vexp2_test.cpp); exactly 0 below -126.5 (and for -inf). Attention's
// softmax exponents (scores less their maximum, scaled to base 2) are never above 0: there it
// is vexp's work without the reduction by ln 2 and the upper clamp (14 operations instead of
// 22). x = n + f, |f| <= 1/2, 2^f by Cephes exp2f's degree-6 polynomial, 2^n by bits (n = -127
// gives the bits of 0).
inline vf vexp2(vf x) {
  const vf xc = vmax(x, splat(-127.0f));
  const vf magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const vf n = (xc + magic) - magic;
  const vf f = xc - n;
  vf p = splat(1.535336188319500e-4f);
  p = fmadd(p, f, splat(1.339887440266574e-3f));
  p = fmadd(p, f, splat(9.618437357674640e-3f));
  p = fmadd(p, f, splat(5.550332471162809e-2f));
  p = fmadd(p, f, splat(2.402264791363012e-1f));
  p = fmadd(p, f, splat(6.931472028550421e-1f));
  p = fmadd(p, f, splat(1.0f));
  const vi e = (__builtin_convertvector(n, vi) + 127) << 23;
  return p * std::bit_cast<vf>(e);
}

// tanh(x) for a vector, within 5 ulp (tests/kernels/vexp2_test.cpp, measured 4.8): Eigen's
// float tanh, a 13/6 odd rational function on x clamped to +-7.9053 (where it is 1 in float);
// below 4e-4 in magnitude tanh x is x to float precision, and the rational's x^2 would
// lose the denormals. NaN stays NaN (every comparison is false).
inline vf vtanh(vf x) {
  const vf c = splat(7.90531110763549805f);
  const vf xc = x > c ? c : (x < -c ? -c : x);
  const vf x2 = xc * xc;
  vf p = splat(-2.76076847742355e-16f);
  p = fmadd(p, x2, splat(2.00018790482477e-13f));
  p = fmadd(p, x2, splat(-8.60467152213735e-11f));
  p = fmadd(p, x2, splat(5.12229709037114e-08f));
  p = fmadd(p, x2, splat(1.48572235717979e-05f));
  p = fmadd(p, x2, splat(6.37261928875436e-04f));
  p = fmadd(p, x2, splat(4.89352455891786e-03f));
  vf q = splat(1.19825839466702e-06f);
  q = fmadd(q, x2, splat(1.18534705686654e-04f));
  q = fmadd(q, x2, splat(2.26843463243900e-03f));
  q = fmadd(q, x2, splat(4.89352518554385e-03f));
  const vf ax = x < vf{} ? -x : x;
  return ax < splat(0.0004f) ? x : p * xc / q;
}

// 1 / (1 + exp(-x)). For x < -88.3, exp(-x) saturates at ~2.2e38 rather than overflowing,
// so s is ~4.5e-39 (true value below that) and never NaN; for x > 87.3, exp(-x) is 0 and
// s is exactly 1.
inline vf vsigmoid(vf x) { return 1.0f / (1.0f + vexp(-x)); }

}  // namespace autosp::cpu::AUTOSP_ISA::simd
