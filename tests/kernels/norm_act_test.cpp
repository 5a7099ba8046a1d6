// layer_norm and gelu's CPU kernels (kernels/cpu/norm_act.h) against double-precision
// computations of torch's formulas (torch.nn.functional.layer_norm, torch.nn.functional.gelu
// and their autograd derivatives). Odd sizes; a second, larger size runs the OpenMP paths,
// where the backward's reductions must not change with the thread count.
#include "kernels/cpu/norm_act.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace {

using namespace autosp::cpu;

std::vector<float> random_floats(int64_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

// Largest |got - want| / max(1, |want|) over a tensor.
double max_rel_error(const std::vector<float>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double e = 0;
  for (size_t i = 0; i < got.size(); ++i)
    e = std::max(e, std::abs(double(got[i]) - want[i]) / std::max(1.0, std::abs(want[i])));
  return e;
}

// ---- layer_norm -----------------------------------------------------------------------------

struct LayerNormRef {
  std::vector<double> y, mean, rstd, dx, dw, db;
};

LayerNormRef layer_norm_ref(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b,
                            const std::vector<float>& dy, int64_t T, int64_t H, double eps) {
  LayerNormRef r;
  r.y.resize(T * H), r.dx.resize(T * H), r.mean.resize(T), r.rstd.resize(T), r.dw.assign(H, 0), r.db.assign(H, 0);
  for (int64_t t = 0; t < T; ++t) {
    double m = 0, v = 0;
    for (int64_t h = 0; h < H; ++h) m += x[t * H + h];
    m /= double(H);
    for (int64_t h = 0; h < H; ++h) v += (x[t * H + h] - m) * (x[t * H + h] - m);
    v /= double(H);  // biased, as torch's layer_norm
    const double rs = 1.0 / std::sqrt(v + eps);
    r.mean[t] = m, r.rstd[t] = rs;
    double mg = 0, mgx = 0;
    for (int64_t h = 0; h < H; ++h) {
      const double xhat = (x[t * H + h] - m) * rs, g = double(dy[t * H + h]) * w[h];
      r.y[t * H + h] = xhat * w[h] + b[h];
      mg += g, mgx += g * xhat;
      r.dw[h] += double(dy[t * H + h]) * xhat;
      r.db[h] += dy[t * H + h];
    }
    mg /= double(H), mgx /= double(H);
    for (int64_t h = 0; h < H; ++h) {
      const double xhat = (x[t * H + h] - m) * rs;
      r.dx[t * H + h] = rs * (double(dy[t * H + h]) * w[h] - mg - xhat * mgx);
    }
  }
  return r;
}

void check_layer_norm(int64_t T, int64_t H) {
  SCOPED_TRACE(testing::Message() << "T " << T << " H " << H);
  // An offset mean, so a one-pass variance would lose digits.
  const auto x = random_floats(T * H, 2.0f, 5.0f, 1), w = random_floats(H, -1.5f, 1.5f, 2),
             b = random_floats(H, -1.0f, 1.0f, 3), dy = random_floats(T * H, -1.0f, 1.0f, 4);
  const float eps = 1e-5f;
  std::vector<float> y(T * H), mean(T), rstd(T), dx(T * H), dw(H), db(H);
  layer_norm_forward(x.data(), w.data(), b.data(), T, H, eps, y.data(), mean.data(), rstd.data());
  layer_norm_backward(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), T, H, dx.data(), dw.data(), db.data());
  const LayerNormRef r = layer_norm_ref(x, w, b, dy, T, H, eps);
  EXPECT_LE(max_rel_error(y, r.y), 2e-5);
  EXPECT_LE(max_rel_error(mean, r.mean), 1e-6);
  EXPECT_LE(max_rel_error(rstd, r.rstd), 1e-6);
  EXPECT_LE(max_rel_error(dx, r.dx), 5e-5);
  EXPECT_LE(max_rel_error(dw, r.dw), 1e-4);
  EXPECT_LE(max_rel_error(db, r.db), 1e-5);
}

TEST(NormActKernels, LayerNormMatchesTorchsFormulaInDouble) {
  check_layer_norm(37, 67);
  check_layer_norm(1031, 96);  // many backward chunks, OpenMP rows
}

TEST(NormActKernels, LayerNormBackwardDoesNotDependOnTheThreadCount) {
  const int64_t T = 2053, H = 48;
  const auto x = random_floats(T * H, -3.0f, 3.0f, 5), w = random_floats(H, -1.0f, 1.0f, 6),
             b = random_floats(H, -1.0f, 1.0f, 7), dy = random_floats(T * H, -1.0f, 1.0f, 8);
  std::vector<float> y(T * H), mean(T), rstd(T);
  layer_norm_forward(x.data(), w.data(), b.data(), T, H, 1e-5f, y.data(), mean.data(), rstd.data());
  std::vector<float> dx1(T * H), dw1(H), db1(H), dx4(T * H), dw4(H), db4(H);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  layer_norm_backward(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), T, H, dx1.data(), dw1.data(), db1.data());
  omp_set_num_threads(4);
  layer_norm_backward(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), T, H, dx4.data(), dw4.data(), db4.data());
  omp_set_num_threads(saved);
  EXPECT_EQ(dx1, dx4);
  EXPECT_EQ(dw1, dw4);
  EXPECT_EQ(db1, db4);
}

// ---- gelu -----------------------------------------------------------------------------------

double gelu_ref(double x, bool tanh_form) {
  if (tanh_form) return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}
// torch's GeluBackward: the exact derivative of each form.
double gelu_grad_ref(double x, bool tanh_form) {
  if (tanh_form) {
    const double k = std::sqrt(2 / M_PI), t = std::tanh(k * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
  }
  return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}

TEST(NormActKernels, GeluMatchesTorchsFormulasInDouble) {
  const int64_t n = 4099;
  auto x = random_floats(n, -8.0f, 8.0f, 9);
  x[0] = 0.0f, x[1] = -20.0f, x[2] = 20.0f, x[3] = 1e-4f;
  const auto dy = random_floats(n, -2.0f, 2.0f, 10);
  for (bool tanh_form : {false, true}) {
    SCOPED_TRACE(tanh_form ? "tanh" : "none");
    std::vector<float> y(n), dx(n);
    gelu_forward(x.data(), n, tanh_form, y.data());
    gelu_backward(dy.data(), x.data(), n, tanh_form, dx.data());
    std::vector<double> y_ref(n), dx_ref(n);
    for (int64_t i = 0; i < n; ++i) {
      y_ref[i] = gelu_ref(x[i], tanh_form);
      dx_ref[i] = dy[i] * gelu_grad_ref(x[i], tanh_form);
    }
    EXPECT_LE(max_rel_error(y, y_ref), 2e-6);
    EXPECT_LE(max_rel_error(dx, dx_ref), 5e-6);
    // The two forms differ (by up to ~5e-4 near |x| = 2): the attribute is honoured.
    std::vector<double> other(n);
    for (int64_t i = 0; i < n; ++i) other[i] = gelu_ref(x[i], !tanh_form);
    EXPECT_GT(max_rel_error(y, other), 1e-4);
    // In place: y may be x, dx may be dy.
    std::vector<float> inplace = x, dinplace = dy;
    gelu_forward(inplace.data(), n, tanh_form, inplace.data());
    gelu_backward(dinplace.data(), x.data(), n, tanh_form, dinplace.data());
    EXPECT_EQ(inplace, y);
    EXPECT_EQ(dinplace, dx);
  }
}

}  // namespace
