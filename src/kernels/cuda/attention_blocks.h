// The cuda backend's attention by blocks of queries (ops/cuda_attention.cpp): its block
// size and scratch layout, as host constants without CUDA headers, so that the `lower`
// pass and plan_memory size its workspace on machines without nvcc too.
//
// A block is up to `rows` queries of the G query heads that share one kv head. Its scores
// (G x rows x keys, f32) come from cuBLAS, one gemm per head; a row kernel turns them into
// probabilities and the log-sum-exp, and a second gemm per head multiplies them with V. The
// backward recomputes the scores and dP = dO V^T the same way, forms dS, and adds dS^T Q and
// P^T dO into f32 sums of dK and dV over the blocks and the group's heads. Only one block's
// scores exist at a time: the scratch grows with S (one block of rows x S), never S x S.
#pragma once
#include <algorithm>
#include <cstdint>

namespace autosp::cuda {

// One block's score buffers in the backward (two f32, two of the dtype) stay within
// kAttentionBlockBytes and within kAttentionBlockPerQ times the bytes of q, so that the
// scratch is a small part of the step's memory on small models and short sequences too
// (where a block of all S queries would be S x S).
constexpr int64_t kAttentionBlockBytes = int64_t{64} << 20;
constexpr int64_t kAttentionBlockPerQ = 4;

// Query rows per block: the largest power of two (at least 16, at most S) whose backward
// score buffers fit the bounds above. elem: bytes of the dtype (2 bf16, 4 f32).
inline int64_t attention_block_rows(int64_t B, int64_t S, int64_t NH, int64_t NKV, int64_t D, int64_t elem) {
  const int64_t G = NH / std::max<int64_t>(1, NKV);
  const int64_t budget = std::min(kAttentionBlockBytes, kAttentionBlockPerQ * B * S * NH * D * elem);
  const int64_t per_row = std::max<int64_t>(1, G * S * (8 + 2 * elem));
  int64_t rows = 16;
  while (rows * 2 * per_row <= budget && rows < S) rows *= 2;
  return std::max<int64_t>(1, std::min(rows, S));
}

// Byte offsets into the workspace (each at a 256-byte boundary); -1: not used.
struct AttentionBlockLayout {
  int64_t rows = 0;
  int64_t delta = -1;    // f32 [B, NH, S] (backward): rowsum(dout * out)
  int64_t scores = -1;   // f32 [G, rows, S]
  int64_t dprobs = -1;   // f32 [G, rows, S] (backward)
  int64_t probs = -1;    // dtype [G, rows, S]
  int64_t dscores = -1;  // dtype [G, rows, S] (backward)
  int64_t dk = -1;       // f32 [S, D] (backward): one kv head's sum
  int64_t dv = -1;       // f32 [S, D] (backward)
  int64_t bytes = 0;
};

inline AttentionBlockLayout attention_block_layout(bool backward, int64_t B, int64_t S, int64_t NH, int64_t NKV,
                                                   int64_t D, int64_t elem, int64_t rows) {
  auto aligned = [](int64_t x) { return (x + 255) / 256 * 256; };
  AttentionBlockLayout l;
  l.rows = rows;
  const int64_t cells = (NH / std::max<int64_t>(1, NKV)) * rows * S;
  int64_t at = 0;
  auto take = [&](int64_t bytes) {
    const int64_t here = at;
    at += aligned(bytes);
    return here;
  };
  if (backward) l.delta = take(4 * B * NH * S);
  l.scores = take(4 * cells);
  if (backward) l.dprobs = take(4 * cells);
  l.probs = take(elem * cells);
  if (backward) {
    l.dscores = take(elem * cells);
    l.dk = take(4 * S * D);
    l.dv = take(4 * S * D);
  }
  l.bytes = at;
  return l;
}

inline AttentionBlockLayout attention_block_layout(bool backward, int64_t B, int64_t S, int64_t NH, int64_t NKV,
                                                   int64_t D, int64_t elem) {
  return attention_block_layout(backward, B, S, NH, NKV, D, elem, attention_block_rows(B, S, NH, NKV, D, elem));
}

}  // namespace autosp::cuda
