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

}  // namespace

void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamWParams& params, int64_t step, double lr) {
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
      const float g = l2 ? std::fma(param[i], wd, grad[i]) : grad[i];
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
    const float g = grad[i];
    const float p = param[i] * decay;
    const float m = std::fma(g, one_minus_beta1, exp_avg[i] * beta1);
    const float v = std::fma(one_minus_beta2 * g, g, exp_avg_sq[i] * beta2);
    const float denom = std::sqrt(v) / bias_correction2_sqrt + eps;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p + (neg_step_size * m) / denom;
  }
}

double global_grad_norm(const std::vector<std::pair<const float*, int64_t>>& grads) {
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
  for (int64_t b = 0; b < count; ++b) {
    double sum = 0.0;
    const float* data = blocks[b].data;
    for (int64_t i = 0; i < blocks[b].size; ++i) {
      const double x = data[i];
      sum = std::fma(x, x, sum);  // one rounding per element (this file has -ffp-contract=off)
    }
    partial[b] = sum;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return std::sqrt(total);
}

void scale_grads(const std::vector<std::pair<float*, int64_t>>& grads, float coef) {
  for (const auto& [data, n] : grads) {
    AUTOSP_CHECK(n >= 0, "scale_grads: tensor size ", n);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) data[i] *= coef;
  }
}

double clip_grad_norm(const std::vector<std::pair<float*, int64_t>>& grads, double max_norm) {
  AUTOSP_CHECK(max_norm > 0.0, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  std::vector<std::pair<const float*, int64_t>> views(grads.begin(), grads.end());
  const double total = global_grad_norm(views);
  // std::min(nan, 1.0) is nan, as torch.clamp(nan, max=1.0) is.
  const double coef = std::min(max_norm / (total + 1e-6), 1.0);
  scale_grads(grads, static_cast<float>(coef));
  return total;
}

}  // namespace autosp::train
