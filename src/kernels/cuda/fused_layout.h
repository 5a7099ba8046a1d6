// The fused kernels' (kernels/cuda/fused.h) launch shapes, vector widths and scratch sizes,
// as host code without CUDA headers: the ops' workspace rules (OpDef::cuda.workspace_bytes)
// give plan_memory exactly what the kernels use, on machines without nvcc too, and the tests
// check these rules on the CPU (tests/kernels/fused_layout_test.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>

namespace autosp::cuda {

// One vector access is 16 bytes (ld.global.v4 / st.global.v4): 8 bf16 or 4 f32 elements.
constexpr int64_t kVectorBytes = 16;

inline bool is_aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % uintptr_t(bytes) == 0; }

// Elements per access of a kernel over rows of `row` elements of `elem` bytes: the 16-byte
// vector when every pointer is 16-byte aligned and a row is a whole number of vectors (so
// every row starts aligned too), else 1 (the kernel's scalar fallback).
inline int64_t vector_width(int64_t elem, int64_t row, std::initializer_list<const void*> pointers) {
  const int64_t n = kVectorBytes / elem;
  if (n <= 1 || row % n != 0) return 1;
  for (const void* p : pointers)
    if (!is_aligned(p, kVectorBytes)) return 1;
  return n;
}
// The same for a flat array, whose last n % width elements the kernel takes one by one.
inline int64_t flat_vector_width(int64_t elem, std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (!is_aligned(p, kVectorBytes)) return 1;
  return std::max<int64_t>(1, kVectorBytes / elem);
}

// Threads of a block that owns one row of `items` vectors: enough for one vector each, in
// whole warps, at least one warp (small H: the block is one warp) and at most kRowThreads
// (larger rows: each thread takes several, strided by the block).
constexpr int kRowThreads = 256;
inline int row_threads(int64_t items) {
  const int64_t warps = (std::max<int64_t>(items, 1) + 31) / 32;
  return static_cast<int>(std::min<int64_t>(warps * 32, kRowThreads));
}

// rms_norm_backward: block b of G = rms_norm_backward_blocks(T) takes rows b, b + G, ...,
// writes their dx, and sums dy * xhat over its rows per column into its own row of the
// workspace (G x H floats: partial[b, h]); a second kernel adds the G partial sums of each
// column in order b = 0 .. G-1. No atomics: dw is the same on every run. G is a function of
// T only (never of the device), so the plan and the result do not depend on the GPU.
constexpr int64_t kRmsNormBackwardMaxBlocks = 512;  // 4 blocks per SM on a 132-SM H100
inline int64_t rms_norm_backward_blocks(int64_t T) { return std::clamp<int64_t>(T, 0, kRmsNormBackwardMaxBlocks); }
inline int64_t rms_norm_backward_workspace_bytes(int64_t T, int64_t H) {
  return 4 * rms_norm_backward_blocks(T) * H;
}
// Up to this H a block keeps its column sums in shared memory (H floats: 32 KiB, under the
// 48 KiB a block gets without opting in) and copies them to its workspace row at the end;
// above it, it adds into its workspace row in place (each column owned by one thread).
constexpr int64_t kRmsNormSharedMaxH = 8192;

// embedding_backward: dW's fp32 sums, V x H floats, for a bf16 dW (an f32 dW is its own sum).
inline int64_t embedding_backward_workspace_bytes(bool f32, int64_t V, int64_t H) { return f32 ? 0 : 4 * V * H; }

}  // namespace autosp::cuda
