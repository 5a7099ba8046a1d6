// Fused linear + cross-entropy on the CPU (contract in linear_cross_entropy.h).
//
// Per chunk of rows: one gemm makes the chunk's logits in the workspace, a row-parallel
// pass turns them into lse (forward) or into dlogits in place (backward), and the backward
// finishes with two gemms: dx_c = dz W and dW += dz^T x_c. The row maths is that of
// cross_entropy_forward/backward (fused.cpp), so the fused and unfused paths agree to
// within the gemms' rounding.
#include "kernels/cpu/linear_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/basic.h"

namespace autosp::cpu {
namespace {

// Below this many logits a chunk's row pass runs on the calling thread.
constexpr int64_t kMinParallelWork = int64_t{1} << 15;

int64_t rows_per_chunk(int64_t T, int64_t chunk_rows) { return std::max<int64_t>(1, std::min(T, chunk_rows)); }

// Stable log-sum-exp of one row: max-shifted, the exp-sum in double.
double row_lse(const float* z, int64_t V) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int64_t v = 0; v < V; ++v) m = std::max(m, z[v]);
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t v = 0; v < V; ++v) s += double{std::exp(z[v] - m)};
  return double{m} + std::log(s);
}

}  // namespace

int64_t linear_cross_entropy_forward_workspace_floats(int64_t T, int64_t V, int64_t chunk_rows) {
  if (T == 0) return 0;
  const int64_t rows = rows_per_chunk(T, chunk_rows);
  return rows * V + 2 * rows;  // logits, then one double per row (its loss)
}

int64_t linear_cross_entropy_backward_workspace_floats(int64_t T, int64_t V, int64_t chunk_rows) {
  if (T == 0) return 0;
  return rows_per_chunk(T, chunk_rows) * V;  // logits, overwritten by dlogits
}

void linear_cross_entropy_forward(const float* x, const float* W, const int32_t* labels,
                                  int64_t T, int64_t H, int64_t V, int32_t ignore_index,
                                  int64_t chunk_rows, float* loss_sum, float* lse,
                                  float* workspace) {
  const int64_t rows = rows_per_chunk(T, chunk_rows);
  // The doubles first: the workspace is 64-byte aligned, rows * V floats may not be.
  auto* row_loss = reinterpret_cast<double*>(workspace);
  float* z = workspace + 2 * rows;
  double total = 0.0;
  for (int64_t t0 = 0; t0 < T; t0 += rows) {
    const int64_t r = std::min(rows, T - t0);
    gemm(false, true, r, V, H, x + t0 * H, W, z);
#pragma omp parallel for schedule(static) if (r * V >= kMinParallelWork)
    for (int64_t i = 0; i < r; ++i) {
      const float* zr = z + i * V;
      const double l = row_lse(zr, V);
      const int32_t y = labels[t0 + i];
      lse[t0 + i] = static_cast<float>(l);
      row_loss[i] = y == ignore_index ? 0.0 : l - double{zr[y]};
    }
    for (int64_t i = 0; i < r; ++i) total += row_loss[i];  // row order: thread-independent
  }
  *loss_sum = static_cast<float>(total);
}

void linear_cross_entropy_backward(const float* dloss_sum, const float* x, const float* W,
                                   const int32_t* labels, const float* lse, int64_t T, int64_t H,
                                   int64_t V, int32_t ignore_index, int64_t chunk_rows, float* dx,
                                   float* dW, float* workspace) {
  const float g = *dloss_sum;
  const int64_t rows = rows_per_chunk(T, chunk_rows);
  float* dz = workspace;
  bool dW_written = false;
  for (int64_t t0 = 0; t0 < T; t0 += rows) {
    const int64_t r = std::min(rows, T - t0);
    // A chunk of ignored rows (padding, masked prompts) has dz = 0: skip its three gemms.
    if (std::all_of(labels + t0, labels + t0 + r, [&](int32_t y) { return y == ignore_index; })) {
      std::memset(dx + t0 * H, 0, sizeof(float) * r * H);
      continue;
    }
    gemm(false, true, r, V, H, x + t0 * H, W, dz);  // recompute the logits
#pragma omp parallel for schedule(static) if (r * V >= kMinParallelWork)
    for (int64_t i = 0; i < r; ++i) {
      float* dr = dz + i * V;
      const int32_t y = labels[t0 + i];
      if (y == ignore_index) {
        std::memset(dr, 0, sizeof(float) * V);
        continue;
      }
      const float l = lse[t0 + i], zy = dr[y];
#pragma omp simd
      for (int64_t v = 0; v < V; ++v) dr[v] = g * std::exp(dr[v] - l);
      // g (p - 1) rather than g p - g: p - 1 is exact for p >= 1/2, so only one rounding.
      dr[y] = g * (std::exp(zy - l) - 1.0f);
    }
    gemm(false, false, r, H, V, dz, W, dx + t0 * H);               // dx_c = dz W
    gemm(true, false, V, H, r, dz, x + t0 * H, dW, dW_written);    // dW += dz^T x_c
    dW_written = true;
  }
  if (!dW_written) std::memset(dW, 0, sizeof(float) * V * H);
}

}  // namespace autosp::cpu
