#include "train/cuda_adamw.h"

#include <cmath>

#include "kernels/cuda/kernels.h"
#include "util/error.h"

namespace autosp::train {

cuda::AdamWScalars cuda_adamw_scalars(const AdamWParams& params, int64_t step, double lr) {
  AUTOSP_CHECK(step >= 1, "cuda_adamw_step: step is 1-based, got ", step);
  const double bias_correction1 = 1.0 - std::pow(params.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(params.beta2, static_cast<double>(step));
  cuda::AdamWScalars s{};
  s.decay = params.decoupled_weight_decay ? static_cast<float>(1.0 - lr * params.weight_decay) : 1.0f;
  s.beta1 = static_cast<float>(params.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - params.beta1);
  s.beta2 = static_cast<float>(params.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - params.beta2);
  s.step_size = static_cast<float>(-(lr / bias_correction1));
  s.sqrt_bc2 = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(params.eps);
  s.l2 = params.decoupled_weight_decay ? 0.0f : static_cast<float>(params.weight_decay);
  return s;
}

void cuda_adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                     const AdamWParams& params, int64_t step, double lr, void* compute_copy_bf16,
                     cudaStream_t stream) {
  cuda::adamw_step(param, grad, exp_avg, exp_avg_sq, n, cuda_adamw_scalars(params, step, lr), compute_copy_bf16,
                   stream);
}

}  // namespace autosp::train
