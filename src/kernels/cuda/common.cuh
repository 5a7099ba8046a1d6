// Device helpers shared by the .cu files: fp32 loads and rounded stores for both dtypes,
// launch shapes, dtype dispatch and block reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/kernels.h"

namespace autosp::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }

constexpr int kThreads = 256;

// Enough blocks for one element per thread, capped (the kernels loop grid-stride).
inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (int64_t{1} << 20) ? (int64_t{1} << 20) : b));
}

#define AUTOSP_GRID_STRIDE(i, n)                                                    \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);        \
       i += int64_t(gridDim.x) * blockDim.x)

// Calls f.template operator()<T>() with T = float or bf16 as dt says.
template <typename F>
void dispatch(Dt dt, F&& f) {
  if (dt == Dt::bf16) f.template operator()<bf16>();
  else f.template operator()<float>();
}

// Sum over the block of v (any blockDim.x that is a multiple of 32, up to 1024); every
// thread gets the result. `shared` holds 32 values.
template <typename A>
__device__ A block_sum(A v, A* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? shared[lane] : A(0);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A score or logit s capped as Gemma 2's softcaps do, c tanh(s / c) (c = 0: s itself), and the
// cap's derivative 1 - tanh^2(s / c) (1 without a cap): the attention kernels' and the loss rows'.
struct Capped {
  float s, ds;
};
__device__ __forceinline__ Capped cap(float s, float softcap) {
  if (softcap <= 0.0f) return {s, 1.0f};
  const float t = tanhf(s / softcap);
  return {softcap * t, 1.0f - t * t};
}

template <typename A>
__device__ A block_max(A v, A* shared) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? shared[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// One AdamW (or Adam) element in train::adamw_step's operation order and fused multiply-adds,
// from the gradient g as the step uses it (already scaled): updates the moments and returns
// the new parameter.
__device__ __forceinline__ float adamw_element(float param, float g, float& exp_avg, float& exp_avg_sq,
                                               const AdamWScalars& s) {
  if (s.l2 != 0.0f) g = __fmaf_rn(param, s.l2, g);
  const float p = __fmul_rn(param, s.decay);
  const float m = __fmaf_rn(g, s.one_minus_beta1, __fmul_rn(exp_avg, s.beta1));
  const float v = __fmaf_rn(__fmul_rn(s.one_minus_beta2, g), g, __fmul_rn(exp_avg_sq, s.beta2));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.sqrt_bc2), s.eps);
  exp_avg = m;
  exp_avg_sq = v;
  return __fadd_rn(p, __fdiv_rn(__fmul_rn(s.step_size, m), denom));
}

__device__ __forceinline__ void set_error(int* error, int code) {
  if (error) atomicCAS(error, kErrorNone, code);
}

}  // namespace autosp::cuda
