// The device-resident optimizer step's kernels (kernels.h, "the device-resident optimizer
// step"): fp32 gradient sums over many tensors in one launch, the loss sum, a deterministic
// gradient norm with clip_grad_norm's coefficient, and AdamW over the flat buffers.
//
// The AdamW arithmetic is adamw_kernel's (basic.cu), the same operation order and fused
// multiply-adds as train::adamw_step, with the gradient scaled by the clip coefficient first
// (train::adamw_step's grad_scale). The host never reads the coefficient: it is computed
// here and read from device memory, so clipping costs no host synchronisation.
#include <cmath>

#include "kernels/cuda/common.cuh"

namespace autosp::cuda {

namespace {

template <typename T>
__global__ void accumulate_chunks_kernel(const GradChunk* chunks, float scale, bool overwrite) {
  const GradChunk c = chunks[blockIdx.x];
  const T* src = static_cast<const T*>(c.src);
  for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) {
    const float g = __fmul_rn(to_f(src[i]), scale);
    c.dst[i] = overwrite ? g : __fadd_rn(c.dst[i], g);
  }
}

__global__ void add_loss_kernel(const float* loss, StepStatus* status, bool first) {
  const double l = double(*loss);
  status->loss_sum = first ? l : status->loss_sum + l;
}

// Block b sums g[i]^2 for i = b * kThreads + t + k * kNormBlocks * kThreads (k = 0, 1, ...)
// in thread t, in double, then over the block in block_sum's fixed tree.
__global__ void norm_partials_kernel(const float* g, int64_t n, double* partials) {
  __shared__ double shared[32];
  double s = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double x = g[i];
    s = fma(x, x, s);
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void norm_finish_kernel(const double* partials, double max_norm, bool check_loss, const int* error,
                                   StepStatus* status) {
  __shared__ double shared[32];
  double s = 0;
  for (int i = threadIdx.x; i < kNormBlocks; i += blockDim.x) s += partials[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) {
    const double norm = sqrt(s);
    // train::clip_coefficient: min(max_norm / (total + 1e-6), 1.0), rounded to fp32.
    const float coef = max_norm > 0 ? float(fmin(max_norm / (norm + 1e-6), 1.0)) : 1.0f;
    status->norm = norm;
    status->coef = coef;
    const bool data_ok = error == nullptr || *error == kErrorNone;
    status->applied = isfinite(norm) && data_ok && (!check_loss || isfinite(status->loss_sum)) ? 1 : 0;
  }
}

__global__ void adamw_flat_kernel(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                                  AdamWScalars s, const StepStatus* status, bf16* copy) {
  if (!status->applied) return;
  const float coef = status->coef;
  AUTOSP_GRID_STRIDE(i, n) {
    const float np = adamw_element(param[i], __fmul_rn(grad[i], coef), exp_avg[i], exp_avg_sq[i], s);
    param[i] = np;
    if (copy) copy[i] = __float2bfloat16_rn(np);
  }
}

}  // namespace

void accumulate_grad_chunks(Dt dt, const GradChunk* chunks, int64_t count, float scale, bool overwrite,
                            cudaStream_t stream) {
  if (count == 0) return;
  dispatch(dt, [&]<typename T>() {
    accumulate_chunks_kernel<T><<<static_cast<unsigned>(count), kThreads, 0, stream>>>(chunks, scale, overwrite);
  });
}

void add_loss(const float* loss, StepStatus* status, bool first, cudaStream_t stream) {
  add_loss_kernel<<<1, 1, 0, stream>>>(loss, status, first);
}

void grad_norm_partials(const float* g, int64_t n, double* partials, cudaStream_t stream) {
  norm_partials_kernel<<<kNormBlocks, kThreads, 0, stream>>>(g, n, partials);
}

void grad_norm_finish(const double* partials, double max_norm, bool check_loss, const int* error, StepStatus* status,
                      cudaStream_t stream) {
  norm_finish_kernel<<<1, kThreads, 0, stream>>>(partials, max_norm, check_loss, error, status);
}

void adamw_flat(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamWScalars& s, const StepStatus* status, void* compute_copy_bf16, cudaStream_t stream) {
  if (n == 0) return;
  adamw_flat_kernel<<<blocks_for(n), kThreads, 0, stream>>>(param, grad, exp_avg, exp_avg_sq, n, s, status,
                                                            static_cast<bf16*>(compute_copy_bf16));
}

}  // namespace autosp::cuda
