// AdamW on the device (the cuda backend): train::adamw_step's maths and operation order on
// fp32 device buffers (master weights, gradient, moments), optionally writing the updated
// weights rounded to bf16 into the compute copy the next step reads.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/kernels.h"
#include "train/adamw.h"

namespace autosp::train {

// The kernels' fp32 scalars for optimizer step `step` (1-based) at `lr`, computed in double
// and rounded to fp32 exactly as adamw_step does.
cuda::AdamWScalars cuda_adamw_scalars(const AdamWParams& params, int64_t step, double lr);

// Enqueued on `stream`; the scalars are computed here in double and rounded to fp32 exactly
// as adamw_step does, so the device update equals the host one element for element.
void cuda_adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                     const AdamWParams& params, int64_t step, double lr, void* compute_copy_bf16,
                     cudaStream_t stream);

}  // namespace autosp::train
