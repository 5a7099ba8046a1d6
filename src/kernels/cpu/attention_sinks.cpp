// Attention sinks (attention.h): folded into the flash kernels' results, in double per row.
// Built for the baseline, not per instruction set: O(B S NH Dv) next to the kernels' O(S^2).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention.h"

namespace autosp::cpu {

namespace {
// log(exp(a) + exp(b)), exact where either is -inf.
double log_add_exp(double a, double b) {
  const double m = std::max(a, b);
  if (std::isinf(m)) return m;
  return m + std::log1p(std::exp(-std::abs(a - b)));
}
}  // namespace

void attention_sinks_forward(const AttentionDims& d, const float* sinks, float* out, float* lse, int threads) {
  const int64_t S = d.S, NH = d.NH, Dv = d.dv();
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t i = 0; i < S; ++i) {
        float& l = lse[(b * NH + h) * S + i];
        const double folded = log_add_exp(double(l), double(sinks[h]));
        const float keep = float(std::exp(double(l) - folded));  // the keys' share of the row
        float* o = out + ((b * S + i) * NH + h) * Dv;
        for (int64_t c = 0; c < Dv; ++c) o[c] *= keep;
        l = float(folded);
      }
}

void attention_sinks_backward(const AttentionDims& d, const float* sinks, const float* out, const float* lse,
                              const float* dout, float* dsinks, int threads) {
  const int64_t S = d.S, NH = d.NH, Dv = d.dv();
  // One head per iteration, its rows in order: the same sum on any thread count.
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t h = 0; h < NH; ++h) {
    double sum = 0.0;
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t i = 0; i < S; ++i) {
        const float *o = out + ((b * S + i) * NH + h) * Dv, *g = dout + ((b * S + i) * NH + h) * Dv;
        double dot = 0.0;
        for (int64_t c = 0; c < Dv; ++c) dot += double(g[c]) * double(o[c]);
        sum += std::exp(double(sinks[h]) - double(lse[(b * NH + h) * S + i])) * dot;
      }
    dsinks[h] = float(-sum);
  }
}

}  // namespace autosp::cpu
