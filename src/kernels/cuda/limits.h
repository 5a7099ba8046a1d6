// What the cuda backend's reference kernels can run, as host constants without CUDA headers:
// the `lower` pass refuses a graph beyond them at compile time (passes/lower.h), on machines
// without nvcc too, so `autosp plan --backend cuda` and `autosp dump --stage lower` say so.
#pragma once
#include <cstdint>

namespace autosp::cuda {

// The largest head dim of the rope kernel (its inverse frequencies are passed by value).
constexpr int64_t kRopeMaxD = 256;
// The largest head dim of the attention kernels (a query row's accumulator in registers).
constexpr int64_t kAttentionMaxD = 256;

}  // namespace autosp::cuda
