#include "kernels/cpu/norm_act.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace autosp::cpu {

namespace {

// Rows per chunk of the backward's partial sums: depends on T only (so does the order of
// every sum), at most kMaxChunks chunks.
constexpr int64_t kMaxChunks = 256, kMinRowsPerChunk = 16;
int64_t rows_per_chunk(int64_t T) {
  return std::max(kMinRowsPerChunk, (T + kMaxChunks - 1) / kMaxChunks);
}
int64_t num_chunks(int64_t T) {
  const int64_t r = rows_per_chunk(T);
  return (T + r - 1) / r;
}

}  // namespace

// ---- layer_norm -----------------------------------------------------------------------------

void layer_norm_forward(const float* x, const float* w, const float* b, int64_t T, int64_t H,
                        float eps, float* y, float* mean, float* rstd) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * H;
    double s = 0;
    for (int64_t h = 0; h < H; ++h) s += xr[h];
    const double mu = H > 0 ? s / double(H) : 0.0;
    double ss = 0;
    for (int64_t h = 0; h < H; ++h) {
      const double d = double(xr[h]) - mu;
      ss += d * d;
    }
    const double var = H > 0 ? ss / double(H) : 0.0;
    const float m = float(mu), r = float(1.0 / std::sqrt(var + double(eps)));
    float* yr = y + t * H;
    for (int64_t h = 0; h < H; ++h) yr[h] = (xr[h] - m) * r * w[h] + b[h];
    mean[t] = m;
    rstd[t] = r;
  }
}

int64_t layer_norm_backward_scratch_doubles(int64_t T, int64_t H) { return 2 * num_chunks(T) * H; }

void layer_norm_backward(const float* dy, const float* x, const float* w, const float* mean,
                         const float* rstd, int64_t T, int64_t H, float* dx, float* dw, float* db,
                         double* scratch) {
  std::vector<double> own;
  if (!scratch) {
    own.resize(static_cast<size_t>(layer_norm_backward_scratch_doubles(T, H)));
    scratch = own.data();
  }
  const int64_t R = rows_per_chunk(T), C = num_chunks(T);
  // Chunk c's partial dw in scratch[c * 2H, + H), its partial db after it.
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    double* pw = scratch + c * 2 * H;
    double* pb = pw + H;
    std::fill(pw, pw + 2 * H, 0.0);
    const int64_t t1 = std::min(T, (c + 1) * R);
    for (int64_t t = c * R; t < t1; ++t) {
      const float* dyr = dy + t * H;
      const float* xr = x + t * H;
      const float m = mean[t], r = rstd[t];
      double sg = 0, sgx = 0;
      for (int64_t h = 0; h < H; ++h) {
        const float xhat = (xr[h] - m) * r, g = dyr[h] * w[h];
        sg += g;
        sgx += double(g) * xhat;
        pw[h] += double(dyr[h]) * xhat;
        pb[h] += dyr[h];
      }
      const float mg = float(sg / double(H)), mgx = float(sgx / double(H));
      float* dxr = dx + t * H;
      for (int64_t h = 0; h < H; ++h) {
        const float xhat = (xr[h] - m) * r;
        dxr[h] = r * (dyr[h] * w[h] - mg - xhat * mgx);
      }
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t h = 0; h < H; ++h) {
    double sw = 0, sb = 0;
    for (int64_t c = 0; c < C; ++c) {
      sw += scratch[c * 2 * H + h];
      sb += scratch[c * 2 * H + H + h];
    }
    dw[h] = float(sw);
    db[h] = float(sb);
  }
}

// ---- gelu -----------------------------------------------------------------------------------

namespace {
constexpr float kSqrt1_2 = 0.70710678118654752440f;      // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;   // 1 / sqrt(2 pi)
constexpr float kSqrt2OverPi = 0.79788456080286535588f;  // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;
}  // namespace

void gelu_forward(const float* x, int64_t n, bool tanh, float* y) {
  if (tanh) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i];
      y[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + kKappa * v * v * v)));
    }
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i];
      y[i] = 0.5f * v * (1.0f + std::erf(v * kSqrt1_2));
    }
  }
}

// torch (aten/src/ATen/native/cpu/Activation.cpp, GeluBackwardKernelImpl):
//  none: dx = dy (cdf + x pdf), cdf = 0.5 (1 + erf(x / sqrt 2)), pdf = exp(-x^2 / 2) / sqrt(2 pi)
//  tanh: u = sqrt(2/pi) (x + k x^3), t = tanh(u),
//        dx = dy (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 k x^2))
void gelu_backward(const float* dy, const float* x, int64_t n, bool tanh, float* dx) {
  if (tanh) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i], v2 = v * v;
      const float t = std::tanh(kSqrt2OverPi * (v + kKappa * v2 * v));
      const float left = 0.5f * (1.0f + t);
      const float right = 0.5f * v * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kKappa * v2);
      dx[i] = dy[i] * (left + right);
    }
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i];
      const float cdf = 0.5f * (1.0f + std::erf(v * kSqrt1_2));
      const float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
      dx[i] = dy[i] * (cdf + v * pdf);
    }
  }
}

// ---- xIELU ------------------------------------------------------------------------------------

namespace {
// torch.nn.functional.softplus (beta 1, threshold 20) and its derivative.
double softplus(double v) { return v > 20.0 ? v : std::log1p(std::exp(v)); }
double softplus_grad(double v) { return v > 20.0 ? 1.0 : 1.0 / (1.0 + std::exp(-v)); }
constexpr int64_t kXieluChunks = 64;  // fixed: the sums do not depend on the thread count
}  // namespace

void xielu_forward(const float* x, int64_t n, float alpha_p, float alpha_n, float beta, float eps, float* y) {
  const float ap = float(softplus(alpha_p)), an = beta + float(softplus(alpha_n));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = v > 0.0f ? ap * v * v + beta * v : (std::expm1(std::min(v, eps)) - v) * an + beta * v;
  }
}

void xielu_backward(const float* dy, const float* x, int64_t n, float alpha_p, float alpha_n, float beta, float eps,
                    float* dx, float* dalpha_p, float* dalpha_n) {
  const float ap = float(softplus(alpha_p)), an = beta + float(softplus(alpha_n));
  double sum_p[kXieluChunks] = {}, sum_n[kXieluChunks] = {};
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < kXieluChunks; ++c) {
    double sp = 0.0, sn = 0.0;
    for (int64_t i = n * c / kXieluChunks; i < n * (c + 1) / kXieluChunks; ++i) {
      const float v = x[i], g = dy[i];
      if (v > 0.0f) {
        sp += double(g) * v * v;
        dx[i] = g * (2.0f * ap * v + beta);
      } else {
        const float m = std::min(v, eps);
        const float dmin = v < eps ? 1.0f : (v == eps ? 0.5f : 0.0f);
        sn += double(g) * (std::expm1(m) - v);
        dx[i] = g * ((std::exp(m) * dmin - 1.0f) * an + beta);
      }
    }
    sum_p[c] = sp, sum_n[c] = sn;
  }
  double p = 0.0, q = 0.0;
  for (int64_t c = 0; c < kXieluChunks; ++c) p += sum_p[c], q += sum_n[c];
  *dalpha_p = float(p * softplus_grad(alpha_p));
  *dalpha_n = float(q * softplus_grad(alpha_n));
}

}  // namespace autosp::cpu
