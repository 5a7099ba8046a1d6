// cpu::moe_forward and cpu::moe_backward (kernels/cpu/moe.h) over more rows per expert than one
// chunk (kMoeChunkRows): 1600 tokens, 3 experts, each token's top 2, so every expert gets two
// or more chunks (asserted). Each token's result must be the one it gets alone (T = 1: one chunk of one
// row): y, dx and dlogits bitwise (a row of a gemm is one FMA chain over K whatever the rows
// around it, and each token's experts are summed in ascending order either way), and the
// experts' gradients, which sum over the chunks, to fp32 reordering of those sums. On 1 and 2
// threads.
#include "kernels/cpu/moe.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "testing/gradcheck.h"

namespace {

using autosp::cpu::kMoeChunkRows;
using autosp::cpu::MoeDims;
using autosp::testing::random_normal;

struct Results {
  std::vector<float> y, dx, dlogits;
  std::vector<std::vector<float>> dw;
};

Results run(const MoeDims& d, const float* x, const float* logits, const float* dy,
            const std::vector<std::vector<float>>& w) {
  std::vector<const float*> wp;
  for (const auto& m : w) wp.push_back(m.data());
  Results r;
  r.y.resize(d.T * d.H);
  std::vector<float> saved(autosp::cpu::moe_saved_floats(d));
  std::vector<float> ws(
      std::max(autosp::cpu::moe_workspace_floats(d, false), autosp::cpu::moe_workspace_floats(d, true)));
  autosp::cpu::moe_forward(d, x, logits, wp.data(), r.y.data(), saved.data(), ws.data());
  r.dx.resize(d.T * d.H);
  r.dlogits.resize(d.T * d.E);
  std::vector<float*> dwp;
  for (const auto& m : w) {
    r.dw.emplace_back(m.size());
    dwp.push_back(r.dw.back().data());
  }
  autosp::cpu::moe_backward(d, dy, x, logits, saved.data(), wp.data(), r.dx.data(), r.dlogits.data(), dwp.data(),
                            ws.data());
  return r;
}

TEST(MoeKernel, ChunksGiveEachTokenWhatItGetsAlone) {
  const MoeDims d{.T = 1600, .H = 16, .I = 12, .E = 3, .k = 2, .normalize = true};
  const std::vector<float> x = random_normal(d.T * d.H, 1), logits = random_normal(d.T * d.E, 2), dy = random_normal(d.T * d.H, 3);
  std::vector<int32_t> experts(d.T * d.k);
  std::vector<float> weights(d.T * d.k);
  autosp::cpu::moe_route(d, logits.data(), experts.data(), weights.data());
  for (int32_t e = 0; e < d.E; ++e)
    ASSERT_GT(std::count(experts.begin(), experts.end(), e), kMoeChunkRows) << "expert " << e << " fits one chunk";
  std::vector<std::vector<float>> w;
  for (int64_t e = 0; e < d.E; ++e) {
    w.push_back(random_normal(d.I * d.H, 10 + uint32_t(e), 0.3f));
    w.push_back(random_normal(d.I * d.H, 20 + uint32_t(e), 0.3f));
    w.push_back(random_normal(d.H * d.I, 30 + uint32_t(e), 0.3f));
  }
  for (int threads : {1, 2}) {
    SCOPED_TRACE(testing::Message() << threads << " threads");
    omp_set_num_threads(threads);
    const Results all = run(d, x.data(), logits.data(), dy.data(), w);
    MoeDims one = d;
    one.T = 1;
    std::vector<std::vector<double>> dw_sum(w.size());
    for (size_t m = 0; m < w.size(); ++m) dw_sum[m].assign(w[m].size(), 0.0);
    for (int64_t t = 0; t < d.T; ++t) {
      const Results r = run(one, x.data() + t * d.H, logits.data() + t * d.E, dy.data() + t * d.H, w);
      for (int64_t h = 0; h < d.H; ++h) {
        ASSERT_EQ(all.y[t * d.H + h], r.y[h]) << "token " << t;
        ASSERT_EQ(all.dx[t * d.H + h], r.dx[h]) << "token " << t;
      }
      for (int64_t e = 0; e < d.E; ++e) ASSERT_EQ(all.dlogits[t * d.E + e], r.dlogits[e]) << "token " << t;
      for (size_t m = 0; m < w.size(); ++m)
        for (size_t i = 0; i < w[m].size(); ++i) dw_sum[m][i] += r.dw[m][i];
    }
    // fp32 sums over ~1000 rows: relative reordering error well below 1e-5 of the largest.
    for (size_t m = 0; m < w.size(); ++m) {
      double worst = 0, scale = 0;
      for (size_t i = 0; i < w[m].size(); ++i) {
        worst = std::max(worst, std::abs(double(all.dw[m][i]) - dw_sum[m][i]));
        scale = std::max(scale, std::abs(dw_sum[m][i]));
      }
      EXPECT_LE(worst, 1e-5 * scale) << "weight " << m;
    }
  }
  omp_set_num_threads(2);
}

// A token whose router logits are NaN (a diverged run) still chooses k distinct experts in
// range (no read or write outside the weights); its output is NaN, which the loss carries to the
// trainer's non-finite check, and the other tokens are unaffected.
TEST(MoeKernel, NanLogitsChooseExpertsInRangeAndGiveNan) {
  const MoeDims d{.T = 3, .H = 4, .I = 5, .E = 3, .k = 2, .normalize = true};
  std::vector<float> logits = random_normal(d.T * d.E, 4);
  for (int64_t e = 0; e < d.E; ++e) logits[1 * d.E + e] = std::nanf("");
  std::vector<int32_t> experts(d.T * d.k);
  std::vector<float> weights(d.T * d.k);
  autosp::cpu::moe_route(d, logits.data(), experts.data(), weights.data());
  for (int64_t t = 0; t < d.T; ++t) {
    EXPECT_NE(experts[t * 2], experts[t * 2 + 1]) << "token " << t;
    for (int64_t j = 0; j < d.k; ++j) EXPECT_TRUE(experts[t * 2 + j] >= 0 && experts[t * 2 + j] < d.E);
  }
  std::vector<std::vector<float>> w;
  for (int64_t e = 0; e < d.E; ++e) {
    w.push_back(random_normal(d.I * d.H, 40 + uint32_t(e)));
    w.push_back(random_normal(d.I * d.H, 50 + uint32_t(e)));
    w.push_back(random_normal(d.H * d.I, 60 + uint32_t(e)));
  }
  const std::vector<float> x = random_normal(d.T * d.H, 5), dy = random_normal(d.T * d.H, 6);
  const Results r = run(d, x.data(), logits.data(), dy.data(), w);
  for (int64_t h = 0; h < d.H; ++h) {
    EXPECT_TRUE(std::isnan(r.y[1 * d.H + h]));
    EXPECT_TRUE(std::isfinite(r.y[0 * d.H + h]) && std::isfinite(r.y[2 * d.H + h]));
  }
}

}  // namespace
