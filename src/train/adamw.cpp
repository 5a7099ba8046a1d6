#include "train/adamw.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace autosp::train {

namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelMin = 1 << 15;
// Block size of the deterministic norm: partial sums per block, then summed in order.
constexpr int64_t kNormBlock = 1 << 14;

// sum of x^2 over n floats, in double: kLanes interleaved partial sums (lane l takes the
// elements l, l + kLanes, ...) added in lane order, then the tail. Each element is one
// rounding (an explicit FMA: this file has -ffp-contract=off). The kLanes chains are
// independent, so their FMAs overlap, where a single chain waited out each FMA's latency
// (with clipping folded into AdamW, the bench model's optimizer went from 10 to 5-6 ms).
double sum_of_squares(const float* data, int64_t n) {
  constexpr int kLanes = 8;
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const double x = data[i + l];
      lane[l] = std::fma(x, x, lane[l]);
    }
  double sum = 0.0;
  for (int l = 0; l < kLanes; ++l) sum += lane[l];
  for (; i < n; ++i) {
    const double x = data[i];
    sum = std::fma(x, x, sum);
  }
  return sum;
}

}  // namespace

void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamWParams& params, int64_t step, double lr, float grad_scale) {
  AUTOSP_CHECK(step >= 1, "adamw_step: step is 1-based, got ", step);
  AUTOSP_CHECK(n >= 0, "adamw_step: n = ", n);
  // Scalars exactly as the Python side computes them (double), then rounded to fp32 once,
  // which is what a Python scalar becomes inside a float32 torch kernel.
  const double bias_correction1 = 1.0 - std::pow(params.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(params.beta2, static_cast<double>(step));
  const double step_size = lr / bias_correction1;
  const float decay = static_cast<float>(1.0 - lr * params.weight_decay);
  const float beta1 = static_cast<float>(params.beta1);
  const float one_minus_beta1 = static_cast<float>(1.0 - params.beta1);
  const float beta2 = static_cast<float>(params.beta2);
  const float one_minus_beta2 = static_cast<float>(1.0 - params.beta2);
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float eps = static_cast<float>(params.eps);
  const float neg_step_size = static_cast<float>(-step_size);

  if (!params.decoupled_weight_decay) {
    // torch.optim.Adam: the weight decay is folded into the gradient (grad.add(param,
    // alpha=wd) is vec::fmadd(param, wd, grad) in torch's AVX2 add kernel) and p is not decayed.
    const float wd = static_cast<float>(params.weight_decay);
    const bool l2 = params.weight_decay != 0.0;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const float gs = grad[i] * grad_scale;
      const float g = l2 ? std::fma(param[i], wd, gs) : gs;
      const float m = std::fma(g, one_minus_beta1, exp_avg[i] * beta1);
      const float v = std::fma(one_minus_beta2 * g, g, exp_avg_sq[i] * beta2);
      const float denom = std::sqrt(v) / bias_correction2_sqrt + eps;
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
      param[i] = param[i] + (neg_step_size * m) / denom;
    }
    return;
  }

#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;
    const float p = param[i] * decay;
    const float m = std::fma(g, one_minus_beta1, exp_avg[i] * beta1);
    const float v = std::fma(one_minus_beta2 * g, g, exp_avg_sq[i] * beta2);
    const float denom = std::sqrt(v) / bias_correction2_sqrt + eps;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p + (neg_step_size * m) / denom;
  }
}

double global_grad_sum_of_squares(const std::vector<std::pair<const float*, int64_t>>& grads) {
  // One work item per (tensor, block), in tensor then index order.
  struct Block {
    const float* data;
    int64_t size;
  };
  std::vector<Block> blocks;
  for (const auto& [data, n] : grads) {
    AUTOSP_CHECK(n >= 0, "global_grad_norm: tensor size ", n);
    for (int64_t start = 0; start < n; start += kNormBlock)
      blocks.push_back({data + start, std::min(kNormBlock, n - start)});
  }
  const int64_t count = static_cast<int64_t>(blocks.size());
  std::vector<double> partial(blocks.size(), 0.0);
#pragma omp parallel for schedule(static) if (count > 1)
  for (int64_t b = 0; b < count; ++b) partial[b] = sum_of_squares(blocks[b].data, blocks[b].size);
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

double global_grad_norm(const std::vector<std::pair<const float*, int64_t>>& grads) {
  return std::sqrt(global_grad_sum_of_squares(grads));
}

void scale_grads(const std::vector<std::pair<float*, int64_t>>& grads, float coef) {
  for (const auto& [data, n] : grads) {
    AUTOSP_CHECK(n >= 0, "scale_grads: tensor size ", n);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) data[i] *= coef;
  }
}

float clip_coefficient(double total, double max_norm) {
  AUTOSP_CHECK(max_norm > 0.0, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  // std::min(nan, 1.0) is nan, as torch.clamp(nan, max=1.0) is.
  return static_cast<float>(std::min(max_norm / (total + 1e-6), 1.0));
}

double clip_grad_norm(const std::vector<std::pair<float*, int64_t>>& grads, double max_norm) {
  std::vector<std::pair<const float*, int64_t>> views(grads.begin(), grads.end());
  const double total = global_grad_norm(views);
  scale_grads(grads, clip_coefficient(total, max_norm));
  return total;
}

}  // namespace autosp::train
