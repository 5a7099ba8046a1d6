// What the cuda backend's reference kernels can run, as host constants without CUDA headers:
// the `lower` pass refuses a graph beyond them at compile time (passes/lower.h), on machines
// without nvcc too, so `autosp plan --backend cuda` and `autosp dump --stage lower` say so.
#pragma once
#include <cstdint>

namespace autosp::cuda {

// The largest head dim of the rope kernel (its inverse frequencies are passed by value).
constexpr int64_t kRopeMaxD = 256;
// The largest head dim of the reference attention kernels (kernels.h, attention_forward and
// attention_backward: a query row's accumulator in registers). The attention ops run the
// blocks of ops/cuda_attention.cpp, whose gemms take any head dim, so lower refuses no head
// dim for attention; the reference kernels are what the tests hold the blocks to, and they
// refuse a larger D on the host (std::invalid_argument) rather than overrun their registers.
constexpr int64_t kAttentionMaxD = 256;
// The most query heads (per rank) of an attention with ALiBi slopes: the kernels take them by
// value (kernels.h, AlibiSlopes). BLOOM-176B has 112.
constexpr int64_t kAttentionMaxAlibiHeads = 128;
// The most experts of the moe op's routing kernels (kernels/cuda/moe.h: a token's probabilities
// in per-thread arrays). Qwen3-MoE and OLMoE have 128 and 64, DeepSeek-V3 256.
constexpr int64_t kMoeMaxExperts = 512;

}  // namespace autosp::cuda
