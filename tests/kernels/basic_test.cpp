// cpu::concat_slabs (kernels/cpu/basic.h) against a copy written out here: a flat bucket of
// many operands (outer 1, where one thread's share spans and splits operands) and slabs
// along a middle dim, at 1, 2 and 3 threads, with sizes that do not divide evenly.
#include "kernels/cpu/basic.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <vector>

namespace {

using autosp::cpu::concat_slabs;

struct Case {
  int64_t outer, inner;
  std::vector<int64_t> lens;
};

std::vector<float> expected(const Case& c, const std::vector<std::vector<float>>& xs) {
  std::vector<float> y;
  for (int64_t o = 0; o < c.outer; ++o)
    for (size_t i = 0; i < xs.size(); ++i) {
      const int64_t row = c.lens[i] * c.inner;
      y.insert(y.end(), xs[i].begin() + o * row, xs[i].begin() + (o + 1) * row);
    }
  return y;
}

void check(const Case& c) {
  std::vector<std::vector<float>> xs;
  std::vector<const float*> ptrs;
  float next = 1.0f;
  for (int64_t len : c.lens) {
    xs.emplace_back(c.outer * len * c.inner);
    for (float& v : xs.back()) v = next++;  // every element distinct
    ptrs.push_back(xs.back().data());
  }
  const std::vector<float> want = expected(c, xs);
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    std::vector<float> y(want.size(), -1.0f);
    concat_slabs(ptrs.data(), c.lens.data(), static_cast<int64_t>(c.lens.size()), c.outer, c.inner, y.data());
    for (size_t k = 0; k < y.size(); ++k) ASSERT_EQ(y[k], want[k]) << threads << " threads, element " << k;
  }
  omp_set_num_threads(saved);
}

TEST(ConcatSlabs, FlatBucketOfManyOperands) {
  // 39 operands like the tiny Llama's gradients, ~300k floats: over the parallel threshold.
  Case c{1, 1, {}};
  for (int i = 0; i < 39; ++i) c.lens.push_back(i % 3 == 0 ? 16384 : 257 + 31 * i);
  check(c);
}

TEST(ConcatSlabs, AlongAMiddleDim) {
  check({5, 7, {3, 1, 4}});               // small: one thread copies it all
  check({33, 129, {17, 5, 40, 1}});       // over the threshold, shares split inside rows
}

TEST(ConcatSlabs, OneOperandAndEmptyOnes) {
  check({4, 3, {0, 6, 0}});
  check({1, 70001, {1}});
}

}  // namespace
