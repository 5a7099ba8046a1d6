// simd::vexp2, attention's softmax exponential (kernels/cpu/attention.cpp), against a double
// 2^x over the range the softmax feeds it ([-127, 0]: scores less their maximum) and beyond
// (up to 127), and its underflow to exactly 0. The avx2 copy: the baseline build
// (-march=x86-64-v3) can compile it, and every machine that runs autosp runs it. The avx512
// copy is the same arithmetic at another width (lane by lane, simd.h).
#define AUTOSP_ISA avx2
#include "kernels/cpu/simd.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
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

}  // namespace
}  // namespace autosp::cpu::avx2::simd
