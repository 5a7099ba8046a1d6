// cpu::gemm (kernels/cpu/gemm.h) against its own definition, bit for bit: every C element is
// one chain of fused multiply-adds over k = 0 .. K-1 in order, starting from 0 (or from C's
// value with accumulate). Checked here with std::fma one element at a time, on every
// instruction set this CPU runs, at 1, 2 and 3 threads and inside a parallel region, for
// every transpose combination, with M, N and K that leave partial register tiles, partial
// packed panels and several blocks of K and of columns; and nothing past C is written.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/basic.h"
#include "kernels/cpu/isa.h"

namespace {

namespace cpu = autosp::cpu;

struct Shape {
  int64_t M, N, K;
};

std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

// The definition: C[i, j] = fma chain over k of op(A)[i, k] op(B)[k, j].
std::vector<float> reference(bool ta, bool tb, const Shape& s, const std::vector<float>& A,
                             const std::vector<float>& B, const std::vector<float>& C0, bool accumulate) {
  std::vector<float> C(static_cast<size_t>(s.M * s.N));
  for (int64_t i = 0; i < s.M; ++i)
    for (int64_t j = 0; j < s.N; ++j) {
      float acc = accumulate ? C0[i * s.N + j] : 0.0f;
      for (int64_t k = 0; k < s.K; ++k) {
        const float a = ta ? A[k * s.M + i] : A[i * s.K + k];
        const float b = tb ? B[j * s.K + k] : B[k * s.N + j];
        acc = std::fma(a, b, acc);
      }
      C[i * s.N + j] = acc;
    }
  return C;
}

constexpr int64_t kGuard = 64;  // floats after C that must stay untouched
constexpr float kGuardValue = -12345.0f;

void check(bool ta, bool tb, const Shape& s, bool accumulate, int threads, bool in_parallel) {
  const auto A = random_floats(s.M * s.K, 1 + static_cast<uint32_t>(s.M * 7 + s.K));
  const auto B = random_floats(s.K * s.N, 2 + static_cast<uint32_t>(s.N * 5 + s.K));
  const auto C0 = random_floats(s.M * s.N, 3);
  const auto want = reference(ta, tb, s, A, B, C0, accumulate);
  std::vector<float> C(C0);
  C.resize(C0.size() + kGuard, kGuardValue);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  if (in_parallel) {
#pragma omp parallel num_threads(2)
    {
#pragma omp single
      cpu::gemm(ta, tb, s.M, s.N, s.K, A.data(), B.data(), C.data(), accumulate);
    }
  } else {
    cpu::gemm(ta, tb, s.M, s.N, s.K, A.data(), B.data(), C.data(), accumulate);
  }
  omp_set_num_threads(saved);
  const std::string what = std::string(cpu::isa_name(cpu::active_isa())) + (ta ? " A^T" : " A") +
                           (tb ? " B^T" : " B") + " M " + std::to_string(s.M) + " N " + std::to_string(s.N) +
                           " K " + std::to_string(s.K) + (accumulate ? " accumulate" : "") + ", " +
                           std::to_string(threads) + " threads" + (in_parallel ? " in a parallel region" : "");
  for (size_t e = 0; e < want.size(); ++e)
    ASSERT_EQ(std::memcmp(&C[e], &want[e], sizeof(float)), 0)
        << what << ": element (" << e / s.N << ", " << e % s.N << ") " << C[e] << " != " << want[e];
  for (int64_t g = 0; g < kGuard; ++g) ASSERT_EQ(C[want.size() + g], kGuardValue) << what << ": wrote past C";
}

class GemmTest : public ::testing::TestWithParam<cpu::Isa> {
 protected:
  void SetUp() override {
    saved_ = cpu::active_isa();
    cpu::set_active_isa(GetParam());
  }
  void TearDown() override { cpu::set_active_isa(saved_); }
  cpu::Isa saved_{};
};

// Register tiles are 14 x 32 (avx512) and 6 x 16 (avx2); K blocks of at most 256; packed
// blocks of 256 columns. These shapes leave every kind of remainder on both sets.
TEST_P(GemmTest, EveryTransposeAndRemainderIsTheFmaChain) {
  const Shape shapes[] = {{1, 1, 1},   {13, 7, 5},    {15, 33, 1},   {29, 17, 257},
                          {6, 48, 64}, {100, 40, 600}, {3, 300, 33}, {57, 290, 70}};
  for (const Shape& s : shapes)
    for (int t = 0; t < 4; ++t)
      for (bool accumulate : {false, true}) check(t & 1, t & 2, s, accumulate, 2, false);
}

TEST_P(GemmTest, SameBitsOnAnyThreadCount) {
  // Wider than tall: the 10 (avx512) or 19 (avx2) panels of 300 columns split between the
  // threads; taller than wide: the rows split, A and A^T (a weight's gradient: K the tokens).
  for (int threads : {1, 3}) {
    check(false, true, {70, 300, 260}, false, threads, false);
    check(true, false, {40, 300, 300}, false, threads, false);
    check(false, false, {200, 3, 40}, true, threads, false);
    check(true, false, {300, 40, 520}, false, threads, false);
  }
}

TEST_P(GemmTest, InsideAParallelRegionRunsOnTheCallingThread) {
  check(false, true, {50, 70, 90}, false, 2, true);
  check(true, false, {50, 70, 90}, true, 2, true);
}

TEST_P(GemmTest, EmptyKZeroesOrKeepsC) {
  std::vector<float> C = {1.0f, 2.0f, 3.0f, 4.0f};
  const float none = 0.0f;
  cpu::gemm(false, false, 2, 2, 0, &none, &none, C.data(), true);
  EXPECT_EQ(C, (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f}));
  cpu::gemm(false, false, 2, 2, 0, &none, &none, C.data(), false);
  EXPECT_EQ(C, (std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f}));
}

INSTANTIATE_TEST_SUITE_P(Isas, GemmTest, ::testing::ValuesIn(cpu::supported_isas()),
                         [](const ::testing::TestParamInfo<cpu::Isa>& info) { return std::string(cpu::isa_name(info.param)); });

}  // namespace
