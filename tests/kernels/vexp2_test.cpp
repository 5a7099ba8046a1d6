// simd::vexp2, attention's softmax exponential (kernels/cpu/attention.cpp), against a double
// 2^x over the range the softmax feeds it ([-127, 0]: scores less their maximum) and beyond
// (up to 127), and its underflow to exactly 0; simd::vtanh (attention's logit softcap)
// against a double tanh over every float magnitude. The avx2 copy: the baseline build
// (-march=x86-64-v3) can compile it, and every machine that runs autosp runs it. The avx512
// copy is the same arithmetic at another width (lane by lane, simd.h).
#define AUTOSP_ISA avx2
#include "kernels/cpu/simd.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>

namespace autosp::cpu::avx2::simd {
namespace {

float exp2_lane(float x) { return vexp2(splat(x))[0]; }

TEST(Vexp2, WithinTwoUlpOfExp2) {
  double worst = 0, at = 0;
  for (float x = -126.0f; x < 127.0f; x += 0.0009765625f * 3.3f) {  // ~77000 points, not on a grid of 1/2
    const double want = std::exp2(double(x));
    const double err = std::abs(double(exp2_lane(x)) - want) / want;
    if (err > worst) worst = err, at = x;
  }
  // Measured 7.65e-8 (x = -79.5), under 1 ulp; the bound is 2 ulp of 1.0 (2.4e-7).
  std::printf("vexp2: max relative error %.3g at x = %.6g\n", worst, at);
  EXPECT_LT(worst, 2.4e-7) << "at x = " << at;
}

TEST(Vexp2, ExactWhereTheSoftmaxNeedsIt) {
  EXPECT_EQ(exp2_lane(0.0f), 1.0f);  // a row's maximum: p = 1 exactly
  EXPECT_EQ(exp2_lane(-1.0f), 0.5f);
  EXPECT_EQ(exp2_lane(-std::numeric_limits<float>::infinity()), 0.0f);  // masked scores
  EXPECT_EQ(exp2_lane(-127.0f), 0.0f);
  EXPECT_EQ(exp2_lane(-1000.0f), 0.0f);
  EXPECT_EQ(exp2_lane(-std::numeric_limits<float>::max()), 0.0f);
  EXPECT_GT(exp2_lane(-126.0f), 0.0f);  // the smallest normal, 2^-126
}

float tanh_lane(float x) { return vtanh(splat(x))[0]; }

TEST(Vtanh, WithinFiveUlpOfTanhOverEveryMagnitude) {
  double worst = 0, at = 0;
  // Every 61st positive float below 20 (past 7.9, tanh is 1 in float), then the negative ones
  // through oddness: denormals, the 4e-4 switch to x, the rational's whole range, the clamp.
  for (uint32_t bits = 1; bits < 0x41a00000u; bits += 61) {
    float x;
    std::memcpy(&x, &bits, sizeof x);
    for (const float s : {x, -x}) {
      const double want = std::tanh(double(s));
      const double err = std::abs(double(tanh_lane(s)) - want) / std::abs(want);
      if (err > worst) worst = err, at = s;
    }
  }
  // Measured 2.88e-7 (x = 0.002, 4.8 ulp of its value); the bound is 5 ulp of 1.0 (6e-7).
  std::printf("vtanh: max relative error %.3g at x = %.6g\n", worst, at);
  EXPECT_LT(worst, 6e-7) << "at x = " << at;
}

TEST(Vtanh, SaturatesAndKeepsZeroAndNaN) {
  EXPECT_EQ(tanh_lane(0.0f), 0.0f);
  EXPECT_EQ(tanh_lane(1e-30f), 1e-30f);
  EXPECT_EQ(tanh_lane(std::numeric_limits<float>::infinity()), tanh_lane(8.0f));
  EXPECT_EQ(tanh_lane(-std::numeric_limits<float>::infinity()), -tanh_lane(8.0f));
  // Past the clamp (7.905) the rational's value, 1 - 2^-22: 4 ulp under 1, as within the range.
  EXPECT_NEAR(tanh_lane(1e30f), 1.0f, 3e-7f);
  EXPECT_TRUE(std::isnan(tanh_lane(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace
}  // namespace autosp::cpu::avx2::simd
