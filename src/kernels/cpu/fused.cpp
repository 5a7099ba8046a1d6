// CPU kernels of the fused row-wise ops (contract in fused.h).
//
// Invariants kept by every kernel here:
//  - Outputs are overwritten, never accumulated into.
//  - Nothing inside an OpenMP region throws or allocates; buffers are sized before it.
//  - Every value is computed the same way whatever the thread count: rows are independent,
//    and reductions over rows (rms_norm dw, cross-entropy loss_sum) go through a fixed
//    partition into row chunks that does not depend on the number of threads, summed in
//    chunk order. Embedding dW sums tokens in increasing t for every thread split.
#include "kernels/cpu/fused.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "util/error.h"

namespace autosp::cpu {
namespace {

// Below this many elements of work a kernel runs on the calling thread: forking a team
// costs more than the work.
constexpr int64_t kMinParallelWork = int64_t{1} << 15;

// Reductions over rows are split into at most this many contiguous row chunks, whatever
// the thread count, so the summation order (and so the rounding) is fixed.
constexpr int64_t kRowChunks = 64;

bool parallel(int64_t work) { return work >= kMinParallelWork; }

// Chunk c of n rows split into `chunks` nearly equal contiguous ranges.
int64_t chunk_begin(int64_t c, int64_t n, int64_t chunks) { return n * c / chunks; }

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

// ---- embedding ------------------------------------------------------------------------

void embedding_forward(const float* W, const int32_t* tokens, int64_t T, int64_t H, float* out) {
#pragma omp parallel for schedule(static) if (parallel(T * H))
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(out + t * H, W + int64_t{tokens[t]} * H, sizeof(float) * H);
  }
}

// Each thread owns a block of columns of dW and walks every token in order, so dW[v, h]
// is dy[t1, h] + dy[t2, h] + ... in increasing t, for any split, with no atomics. Column
// blocks are multiples of 16 floats (one cache line) so threads never share a line.
void embedding_backward(const float* dy, const int32_t* tokens, int64_t T, int64_t H, int64_t V,
                        float* dW) {
  const bool par = parallel(std::max(T, V) * H);
#pragma omp parallel if (par)
  {
    const int64_t nth = omp_get_num_threads(), me = omp_get_thread_num();
#pragma omp for schedule(static)
    for (int64_t v = 0; v < V; ++v) std::memset(dW + v * H, 0, sizeof(float) * H);
    // (implicit barrier: dW is zero before any thread scatters into it)
    constexpr int64_t kLine = 16;
    const int64_t lines = (H + kLine - 1) / kLine;
    const int64_t h0 = std::min(H, lines * me / nth * kLine);
    const int64_t h1 = std::min(H, lines * (me + 1) / nth * kLine);
    if (h0 < h1) {
      for (int64_t t = 0; t < T; ++t) {
        const float* src = dy + t * H;
        float* dst = dW + int64_t{tokens[t]} * H;
#pragma omp simd
        for (int64_t h = h0; h < h1; ++h) dst[h] += src[h];
      }
    }
  }
}

// ---- rms_norm -------------------------------------------------------------------------

void rms_norm_forward(const float* x, const float* w, int64_t T, int64_t H, float eps, float* y,
                      float* rstd) {
#pragma omp parallel for schedule(static) if (parallel(T * H))
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * H;
    float* yr = y + t * H;
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int64_t h = 0; h < H; ++h) ss += double{xr[h]} * double{xr[h]};
    const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(H) + eps));
    rstd[t] = r;
    // Same rounding order as Hugging Face: (x * rstd) * w.
#pragma omp simd
    for (int64_t h = 0; h < H; ++h) yr[h] = (xr[h] * r) * w[h];
  }
}

// With r = (mean(x^2) + eps)^(-1/2), dr/dx_j = -r^3 x_j / H, so
//   dx = r (w * dy) - (r^3 / H) (sum_k dy_k w_k x_k) x
//   dw = sum over rows of dy * x * r
void rms_norm_backward(const float* dy, const float* x, const float* w, const float* rstd,
                       int64_t T, int64_t H, float* dx, float* dw) {
  const int64_t chunks = std::max<int64_t>(1, std::min(T, kRowChunks));
  // Per-chunk partial dw in double: O(kRowChunks * H), small next to the T * H inputs.
  std::vector<double> partial(static_cast<size_t>(chunks * H), 0.0);
  double* part = partial.data();
  const bool par = parallel(T * H);
#pragma omp parallel if (par)
  {
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      double* pc = part + c * H;
      for (int64_t t = chunk_begin(c, T, chunks); t < chunk_begin(c + 1, T, chunks); ++t) {
        const float* xr = x + t * H;
        const float* dyr = dy + t * H;
        float* dxr = dx + t * H;
        const float r = rstd[t];
        double dot = 0.0;
#pragma omp simd reduction(+ : dot)
        for (int64_t h = 0; h < H; ++h) dot += double{dyr[h]} * double{w[h]} * double{xr[h]};
        const float coef = static_cast<float>(double{r} * r * r * dot / static_cast<double>(H));
#pragma omp simd
        for (int64_t h = 0; h < H; ++h) {
          dxr[h] = r * (w[h] * dyr[h]) - coef * xr[h];
          pc[h] += double{dyr[h]} * double{xr[h]} * double{r};
        }
      }
    }
    // (implicit barrier: every partial is complete)
#pragma omp for schedule(static)
    for (int64_t h = 0; h < H; ++h) {
      double s = 0.0;
      for (int64_t c = 0; c < chunks; ++c) s += part[c * H + h];
      dw[h] = static_cast<float>(s);
    }
  }
}

// ---- rope -----------------------------------------------------------------------------

void rope_forward(const float* x, const int32_t* pos, const double* inv_freq, int64_t T, int64_t NH,
                  int64_t D, bool inverse, float* y) {
  AUTOSP_CHECK(D % 2 == 0, "rope head dim D = ", D, " must be even");
  const int64_t half = D / 2;
  // cos and sin of one row's angles, per thread: [threads][2][half].
  const int threads = omp_get_max_threads();
  std::vector<float> table(static_cast<size_t>(threads) * 2 * half);
  const double sign = inverse ? -1.0 : 1.0;
#pragma omp parallel if (parallel(T * NH * D))
  {
    float* cs = table.data() + static_cast<int64_t>(omp_get_thread_num()) * 2 * half;
    float* sn = cs + half;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(pos[t]) * inv_freq[i];
        cs[i] = static_cast<float>(std::cos(angle));
        sn[i] = static_cast<float>(sign * std::sin(angle));
      }
      for (int64_t n = 0; n < NH; ++n) {
        const float* xr = x + (t * NH + n) * D;
        float* yr = y + (t * NH + n) * D;
        // Both halves are read before either is written, so y may alias x.
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = xr[i], b = xr[i + half];
          yr[i] = a * cs[i] - b * sn[i];
          yr[i + half] = b * cs[i] + a * sn[i];
        }
      }
    }
  }
}

void rope_inv_freq(int64_t D, double theta, const RopeScaling& scaling, double* inv_freq) {
  AUTOSP_CHECK(D % 2 == 0 && D > 0, "rope head dim D = ", D, " must be even and positive");
  const double orig = scaling.original_max_position_embeddings;
  const double low = scaling.low_freq_factor, high = scaling.high_freq_factor;
  if (scaling.llama3) {
    AUTOSP_CHECK(high != low, "llama3 rope scaling needs high_freq_factor != low_freq_factor");
  }
  constexpr double kPi = 3.14159265358979323846;
  for (int64_t i = 0; i < D / 2; ++i) {
    double f = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(D));
    if (scaling.llama3) {
      const double wavelen = 2.0 * kPi / f;
      if (wavelen > orig / low) {
        f = f / scaling.factor;
      } else if (!(wavelen < orig / high)) {
        const double smooth = (orig / wavelen - low) / (high - low);
        f = (1.0 - smooth) * f / scaling.factor + smooth * f;
      }
    }
    inv_freq[i] = f;
  }
}

// ---- silu / swiglu --------------------------------------------------------------------

void silu_forward(const float* x, int64_t n, float* y) {
#pragma omp parallel for simd schedule(static) if (parallel(n))
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid(x[i]);
}

// d/dx silu(x) = s(x) (1 + x (1 - s(x)))
void silu_backward(const float* dy, const float* x, int64_t n, float* dx) {
#pragma omp parallel for simd schedule(static) if (parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    const float s = sigmoid(x[i]);
    dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
  }
}

void swiglu_forward(const float* gate, const float* up, int64_t n, float* out) {
#pragma omp parallel for simd schedule(static) if (parallel(n))
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

// out = silu(g) u:  dg = dy u silu'(g),  du = dy silu(g)
void swiglu_backward(const float* dy, const float* gate, const float* up, int64_t n, float* dgate,
                     float* dup) {
#pragma omp parallel for simd schedule(static) if (parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i], s = sigmoid(g);
    dgate[i] = dy[i] * up[i] * s * (1.0f + g * (1.0f - s));
    dup[i] = dy[i] * g * s;
  }
}

// ---- cross entropy --------------------------------------------------------------------

// lse = m + log(sum exp(x - m)) with m the row max, so no exp overflows; the sum and the
// per-row loss are in double, and loss_sum adds fixed row chunks in chunk order.
void cross_entropy_forward(const float* logits, const int32_t* labels, int64_t T, int64_t V,
                           int32_t ignore_index, float* loss_sum, float* lse) {
  const int64_t chunks = std::min(T, kRowChunks);
  std::array<double, kRowChunks> partial{};
#pragma omp parallel for schedule(static) if (parallel(T * V))
  for (int64_t c = 0; c < chunks; ++c) {
    double acc = 0.0;
    for (int64_t t = chunk_begin(c, T, chunks); t < chunk_begin(c + 1, T, chunks); ++t) {
      const float* xr = logits + t * V;
      float m = -INFINITY;
#pragma omp simd reduction(max : m)
      for (int64_t v = 0; v < V; ++v) m = std::max(m, xr[v]);
      double s = 0.0;
#pragma omp simd reduction(+ : s)
      for (int64_t v = 0; v < V; ++v) s += double{std::exp(xr[v] - m)};
      const double l = double{m} + std::log(s);
      lse[t] = static_cast<float>(l);
      if (labels[t] != ignore_index) acc += l - double{xr[labels[t]]};
    }
    partial[c] = acc;
  }
  double total = 0.0;
  for (int64_t c = 0; c < chunks; ++c) total += partial[c];
  *loss_sum = static_cast<float>(total);
}

void cross_entropy_backward(const float* dloss_sum, const float* logits, const int32_t* labels,
                            const float* lse, int64_t T, int64_t V, int32_t ignore_index,
                            float* dlogits) {
  const float g = *dloss_sum;
#pragma omp parallel for schedule(static) if (parallel(T * V))
  for (int64_t t = 0; t < T; ++t) {
    float* dr = dlogits + t * V;
    if (labels[t] == ignore_index) {
      std::memset(dr, 0, sizeof(float) * V);
      continue;
    }
    const float* xr = logits + t * V;
    const float l = lse[t];
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) dr[v] = g * std::exp(xr[v] - l);
    // g (p - 1) rather than g p - g: p - 1 is exact for p >= 1/2, so only one rounding.
    // (p itself is only as good as the float lse: ~|lse| 2^-24 absolute, see fused.h.)
    const int64_t y = labels[t];
    dr[y] = g * (std::exp(xr[y] - l) - 1.0f);
  }
}

}  // namespace autosp::cpu
