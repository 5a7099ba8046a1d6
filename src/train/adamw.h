// AdamW and gradient-norm clipping on fp32 buffers, matching PyTorch 1.13 on the CPU:
// torch.optim.AdamW (default single-tensor path: foreach=False, amsgrad=False,
// maximize=False, capturable=False) and torch.nn.utils.clip_grad_norm_ (norm_type 2).
//
// AdamW, per element, in torch's operation order (fp32 unless noted; scalars are computed
// in double as Python does and rounded to fp32 once, as torch does with a Python scalar):
//   p  = p * (1 - lr * wd)
//   m  = m * b1;  m = m + (1 - b1) * g              (torch's add_ with alpha: one fused FMA)
//   v  = v * b2;  v = v + ((1 - b2) * g) * g        (addcmul_: the last multiply-add fused)
//   bc1 = 1 - b1^step,  bc2 = 1 - b2^step           (double, step 1-based)
//   denom = sqrt(v) / sqrt(bc2) + eps
//   p  = p + ((-lr / bc1) * m) / denom              (addcdiv_)
// Where torch's AVX2 kernels fuse a multiply-add (vec::fmadd, and what the compiler contracts
// in addcmul_), this code uses std::fma, so results agree with the torch reference bit for bit
// on AVX2/FMA machines (tests/train/adamw_test.cpp checks it against a torch run).
//
// With decoupled_weight_decay = false it is torch.optim.Adam instead (DeepSpeed's "Adam" with
// adam_w_mode false): weight decay is an L2 term added to the gradient, and the parameter is
// not decayed:
//   g  = g + wd * p                                  (grad.add(param, alpha=wd): one fused FMA;
//                                                      skipped when wd == 0, as torch does)
//   m, v, bc1, bc2, denom as above
//   p  = p + ((-lr / bc1) * m) / denom
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

namespace autosp::train {

// Defaults are torch.optim.AdamW's.
struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  // true: AdamW (p *= 1 - lr * wd); false: torch.optim.Adam's L2 decay (g += wd * p).
  bool decoupled_weight_decay = true;
};

// One AdamW (or, with decoupled_weight_decay false, Adam) step on n elements, in place. `step` is 1-based (the step count after this
// update, as torch's state["step"]); `lr` is this step's learning rate (params.lr is not
// read, so a schedule can drive it). The gradient used is grad * grad_scale, rounded to fp32
// (grad itself is not written): with grad_scale = clip_coefficient(...) that is exactly
// clip_grad_norm's g *= coef followed by the step, without a pass over the gradients.
// Multi-threaded with OpenMP over elements; the result does not depend on the thread count.
void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamWParams& params, int64_t step, double lr, float grad_scale = 1.0f);

// sqrt(sum over all tensors and elements of g^2), accumulated in double in a fixed order
// (fixed-size blocks, each summed in 8 interleaved lanes, the blocks' sums in index order),
// so it does not depend on the thread count.
// Mathematically the 2-norm of the per-tensor 2-norms, as clip_grad_norm_ computes it; torch
// accumulates in fp32, so the two agree to fp32 accumulation error, not bit for bit.
double global_grad_norm(const std::vector<std::pair<const float*, int64_t>>& grads);
// Its square before the root: a ZeRO shard's part of the world's sum.
double global_grad_sum_of_squares(const std::vector<std::pair<const float*, int64_t>>& grads);

// g *= coef for every element of every tensor (fp32 multiply, as torch's mul_).
void scale_grads(const std::vector<std::pair<float*, int64_t>>& grads, float coef);

// clip_grad_norm_'s coefficient for a total norm: min(max_norm / (total + 1e-6), 1.0),
// rounded to fp32 (nan for a nan total). max_norm > 0.
float clip_coefficient(double total, double max_norm);

// torch.nn.utils.clip_grad_norm_(max_norm): total = global_grad_norm(grads);
// coef = min(max_norm / (total + 1e-6), 1.0), rounded to fp32; every gradient is multiplied
// by coef (also when coef == 1, as torch does). Returns the pre-clip total norm. A non-finite
// total gives a non-finite or zero coef, exactly as in torch; the caller decides what to do.
// max_norm > 0 (a config value of 0 means "no clipping" and must not reach here).
double clip_grad_norm(const std::vector<std::pair<float*, int64_t>>& grads, double max_norm);

}  // namespace autosp::train
