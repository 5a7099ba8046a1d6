// Fused linear + cross-entropy on the CPU (contract in linear_cross_entropy.h).
//
// Per chunk of rows: one gemm makes the chunk's logits in the workspace, the instruction
// set's cross_entropy_forward / cross_entropy_backward (fused.cpp, vectorised exp) turn them
// into lse and the chunk's loss (forward) or into dlogits in place (backward), and the
// backward finishes with two gemms: dx_c = dz W and dW += dz^T x_c. So the fused and unfused
// paths run the same row maths and agree to within the gemms' rounding (bit for bit in the
// row pass when the rows fit one chunk). linear_cross_entropy_with_grad runs both in one pass
// over the chunks (the training step's form, passes/fuse.h).
#include "kernels/cpu/linear_cross_entropy.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/basic.h"
#include "kernels/cpu/fused.h"

namespace autosp::cpu {
namespace {

int64_t rows_per_chunk(int64_t T, int64_t chunk_rows) { return std::max<int64_t>(1, std::min(T, chunk_rows)); }

bool all_ignored(const int32_t* labels, int64_t r, int32_t ignore_index) {
  return std::all_of(labels, labels + r, [&](int32_t y) { return y == ignore_index; });
}

// A chunk's backward from its logits z (r x V): dz = dloss_sum (softmax - onehot) in place,
// then dx_c = dz W and dW = (or, with accumulate, +=) dz^T x_c.
void chunk_backward(const float* dloss_sum, float* z, const float* x_c, const float* W, const int32_t* labels_c,
                    const float* lse_c, int64_t r, int64_t H, int64_t V, int32_t ignore_index, float* dx_c,
                    float* dW, bool accumulate, float softcap) {
  cross_entropy_backward(dloss_sum, z, labels_c, lse_c, r, V, ignore_index, z, softcap);
  gemm(false, false, r, H, V, z, W, dx_c);
  gemm(true, false, V, H, r, z, x_c, dW, accumulate);
}

}  // namespace

int64_t linear_cross_entropy_forward_workspace_floats(int64_t T, int64_t V, int64_t chunk_rows) {
  if (T == 0) return 0;
  return rows_per_chunk(T, chunk_rows) * V;  // logits
}

int64_t linear_cross_entropy_backward_workspace_floats(int64_t T, int64_t V, int64_t chunk_rows) {
  if (T == 0) return 0;
  return rows_per_chunk(T, chunk_rows) * V;  // logits, overwritten by dlogits
}

void linear_cross_entropy_forward(const float* x, const float* W, const int32_t* labels,
                                  int64_t T, int64_t H, int64_t V, int32_t ignore_index,
                                  int64_t chunk_rows, float* loss_sum, float* lse,
                                  float* workspace, float softcap) {
  const int64_t rows = rows_per_chunk(T, chunk_rows);
  float* z = workspace;
  double total = 0.0;  // the chunks' sums, in chunk order: thread-independent
  for (int64_t t0 = 0; t0 < T; t0 += rows) {
    const int64_t r = std::min(rows, T - t0);
    gemm(false, true, r, V, H, x + t0 * H, W, z);
    float chunk_loss = 0.0f;
    cross_entropy_forward(z, labels + t0, r, V, ignore_index, &chunk_loss, lse + t0, softcap);
    total += chunk_loss;
  }
  *loss_sum = static_cast<float>(total);
}

void linear_cross_entropy_backward(const float* dloss_sum, const float* x, const float* W,
                                   const int32_t* labels, const float* lse, int64_t T, int64_t H,
                                   int64_t V, int32_t ignore_index, int64_t chunk_rows, float* dx,
                                   float* dW, float* workspace, float softcap) {
  const int64_t rows = rows_per_chunk(T, chunk_rows);
  float* dz = workspace;
  bool dW_written = false;
  for (int64_t t0 = 0; t0 < T; t0 += rows) {
    const int64_t r = std::min(rows, T - t0);
    // A chunk of ignored rows (padding, masked prompts) has dz = 0: skip its three gemms.
    if (all_ignored(labels + t0, r, ignore_index)) {
      std::memset(dx + t0 * H, 0, sizeof(float) * r * H);
      continue;
    }
    gemm(false, true, r, V, H, x + t0 * H, W, dz);  // recompute the logits
    chunk_backward(dloss_sum, dz, x + t0 * H, W, labels + t0, lse + t0, r, H, V, ignore_index, dx + t0 * H, dW,
                   dW_written, softcap);
    dW_written = true;
  }
  if (!dW_written) std::memset(dW, 0, sizeof(float) * V * H);
}

int64_t linear_cross_entropy_with_grad_workspace_floats(int64_t T, int64_t V, int64_t chunk_rows) {
  if (T == 0) return 0;
  const int64_t rows = rows_per_chunk(T, chunk_rows);
  return rows * V + rows;  // logits (then dz), and the chunk's lse
}

void linear_cross_entropy_with_grad(const float* x, const float* W, const int32_t* labels,
                                    const float* dloss_sum, int64_t T, int64_t H, int64_t V,
                                    int32_t ignore_index, int64_t chunk_rows, float* loss_sum,
                                    float* dx, float* dW, float* workspace, float softcap) {
  const int64_t rows = rows_per_chunk(T, chunk_rows);
  float* z = workspace;
  float* lse = workspace + rows * V;
  double total = 0.0;  // as linear_cross_entropy_forward: the chunks' sums in chunk order
  bool dW_written = false;
  for (int64_t t0 = 0; t0 < T; t0 += rows) {
    const int64_t r = std::min(rows, T - t0);
    // An all-ignored chunk: loss 0 (the forward's sum adds +0) and dz = 0.
    if (all_ignored(labels + t0, r, ignore_index)) {
      std::memset(dx + t0 * H, 0, sizeof(float) * r * H);
      continue;
    }
    gemm(false, true, r, V, H, x + t0 * H, W, z);
    float chunk_loss = 0.0f;
    cross_entropy_forward(z, labels + t0, r, V, ignore_index, &chunk_loss, lse, softcap);
    total += chunk_loss;
    chunk_backward(dloss_sum, z, x + t0 * H, W, labels + t0, lse, r, H, V, ignore_index, dx + t0 * H, dW, dW_written,
                   softcap);
    dW_written = true;
  }
  *loss_sum = static_cast<float>(total);
  if (!dW_written) std::memset(dW, 0, sizeof(float) * V * H);
}

}  // namespace autosp::cpu
