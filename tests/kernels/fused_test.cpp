// The fused row-wise CPU kernels against plain double-precision references written here.
// Sizes are odd on purpose (T = 37, H = 67, V = 101) so no loop happens to be a multiple
// of a vector width; a second, larger size crosses the kernels' parallel threshold so the
// OpenMP paths run, and there the result must not change with the thread count.
#include "kernels/cpu/fused.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
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

std::vector<int32_t> random_ints(int64_t n, int32_t lo, int32_t hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

// Largest |got - want| over a tensor.
double max_abs_error(const std::vector<float>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double e = 0.0;
  for (size_t i = 0; i < got.size(); ++i) e = std::max(e, std::abs(double{got[i]} - want[i]));
  return e;
}

// Runs f with exactly `threads` OpenMP threads, then restores the previous setting.
template <typename F>
void with_threads(int threads, F&& f) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  f();
  omp_set_num_threads(before);
}

constexpr int64_t kT = 37, kH = 67, kV = 101;

double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// ---- references (double) --------------------------------------------------------------

void rms_norm_ref(const std::vector<float>& x, const std::vector<float>& w, int64_t T, int64_t H,
                  double eps, std::vector<double>& y, std::vector<double>& rstd) {
  y.assign(static_cast<size_t>(T * H), 0.0);
  rstd.assign(static_cast<size_t>(T), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0.0;
    for (int64_t h = 0; h < H; ++h) ss += double{x[t * H + h]} * x[t * H + h];
    const double r = 1.0 / std::sqrt(ss / H + eps);
    rstd[t] = r;
    for (int64_t h = 0; h < H; ++h) y[t * H + h] = x[t * H + h] * r * w[h];
  }
}

// Through the full Jacobian rather than the closed form the kernel uses:
//   d(x_i r)/dx_j = delta_ij r - x_i x_j r^3 / H
void rms_norm_backward_ref(const std::vector<float>& dy, const std::vector<float>& x,
                           const std::vector<float>& w, int64_t T, int64_t H, double eps,
                           std::vector<double>& dx, std::vector<double>& dw) {
  dx.assign(static_cast<size_t>(T * H), 0.0);
  dw.assign(static_cast<size_t>(H), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x.data() + t * H;
    const float* dyr = dy.data() + t * H;
    double ss = 0.0;
    for (int64_t h = 0; h < H; ++h) ss += double{xr[h]} * xr[h];
    const double r = 1.0 / std::sqrt(ss / H + eps);
    for (int64_t j = 0; j < H; ++j) {
      double acc = 0.0;
      for (int64_t i = 0; i < H; ++i) {
        const double jac = (i == j ? r : 0.0) - double{xr[i]} * xr[j] * r * r * r / H;
        acc += double{dyr[i]} * w[i] * jac;
      }
      dx[t * H + j] = acc;
      dw[j] += double{dyr[j]} * xr[j] * r;
    }
  }
}

void rope_ref(const std::vector<float>& x, const std::vector<int32_t>& pos,
              const std::vector<double>& inv_freq, int64_t T, int64_t NH, int64_t D, bool inverse,
              std::vector<double>& y) {
  y.assign(x.size(), 0.0);
  const int64_t half = D / 2;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < NH; ++n)
      for (int64_t i = 0; i < half; ++i) {
        const double a = (inverse ? -1.0 : 1.0) * pos[t] * inv_freq[i];
        const int64_t base = (t * NH + n) * D;
        const double x1 = x[base + i], x2 = x[base + i + half];
        y[base + i] = x1 * std::cos(a) - x2 * std::sin(a);
        y[base + i + half] = x2 * std::cos(a) + x1 * std::sin(a);
      }
}

// Softmax through exp(x - lse) with lse from a max-shifted sum, all in double.
std::vector<double> log_sum_exp_ref(const std::vector<float>& logits, int64_t T, int64_t V) {
  std::vector<double> lse(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    double m = -INFINITY;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, double{logits[t * V + v]});
    double s = 0.0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(logits[t * V + v] - m);
    lse[t] = m + std::log(s);
  }
  return lse;
}

double cross_entropy_ref(const std::vector<float>& logits, const std::vector<int32_t>& labels,
                         int64_t T, int64_t V, int32_t ignore) {
  const auto lse = log_sum_exp_ref(logits, T, V);
  double loss = 0.0;
  for (int64_t t = 0; t < T; ++t)
    if (labels[t] != ignore) loss += lse[t] - logits[t * V + labels[t]];
  return loss;
}

// d/dx_v (lse - x_y) = softmax(x)_v - [v == y]
std::vector<double> cross_entropy_backward_ref(double dloss, const std::vector<float>& logits,
                                               const std::vector<int32_t>& labels, int64_t T,
                                               int64_t V, int32_t ignore) {
  const auto lse = log_sum_exp_ref(logits, T, V);
  std::vector<double> d(logits.size(), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    if (labels[t] == ignore) continue;
    for (int64_t v = 0; v < V; ++v)
      d[t * V + v] = dloss * (std::exp(logits[t * V + v] - lse[t]) - (v == labels[t] ? 1.0 : 0.0));
  }
  return d;
}

// ---- embedding ------------------------------------------------------------------------

TEST(FusedKernelEmbedding, ForwardCopiesRows) {
  const auto W = random_floats(kV * kH, -1, 1, 1);
  const auto tokens = random_ints(kT, 0, kV - 1, 2);
  std::vector<float> out(kT * kH, NAN);
  embedding_forward(W.data(), tokens.data(), kT, kH, out.data());
  for (int64_t t = 0; t < kT; ++t)
    for (int64_t h = 0; h < kH; ++h) ASSERT_EQ(out[t * kH + h], W[tokens[t] * kH + h]);
}

// Tokens drawn from only 5 ids, so most ids repeat many times and most of dW's rows are
// untouched (and must still be written as zero over the NaN fill).
TEST(FusedKernelEmbedding, BackwardScatterAddsRepeatedTokens) {
  const auto dy = random_floats(kT * kH, -1, 1, 3);
  auto tokens = random_ints(kT, 0, 4, 4);
  for (auto& tok : tokens) tok = tok * 17 + 3;  // ids 3, 20, 37, 54, 71
  std::vector<float> dW(kV * kH, NAN);
  embedding_backward(dy.data(), tokens.data(), kT, kH, kV, dW.data());
  std::vector<double> want(kV * kH, 0.0);
  for (int64_t t = 0; t < kT; ++t)
    for (int64_t h = 0; h < kH; ++h) want[tokens[t] * kH + h] += dy[t * kH + h];
  // Each entry sums ~7 values in [-1, 1] in float: observed 3.0e-7.
  EXPECT_LT(max_abs_error(dW, want), 1.5e-6);
}

// Above the parallel threshold; the column split between threads must not change dW.
TEST(FusedKernelEmbedding, BackwardIndependentOfThreadCount) {
  const int64_t T = 1031, H = 133, V = 257;
  const auto dy = random_floats(T * H, -1, 1, 5);
  const auto tokens = random_ints(T, 0, 40, 6);  // repeats, and ids 41.. stay zero
  std::vector<float> one(V * H), two(V * H);
  with_threads(1, [&] { embedding_backward(dy.data(), tokens.data(), T, H, V, one.data()); });
  with_threads(2, [&] { embedding_backward(dy.data(), tokens.data(), T, H, V, two.data()); });
  EXPECT_EQ(one, two);
  std::vector<double> want(V * H, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) want[tokens[t] * H + h] += dy[t * H + h];
  // ~25 terms per entry summed in float: observed 2.6e-6.
  EXPECT_LT(max_abs_error(two, want), 1e-5);
}

// ---- rms_norm -------------------------------------------------------------------------

TEST(FusedKernelRmsNorm, ForwardMatchesReference) {
  const float eps = 1e-5f;
  const auto x = random_floats(kT * kH, -2, 2, 7);
  const auto w = random_floats(kH, 0.5, 1.5, 8);
  std::vector<float> y(kT * kH), rstd(kT);
  rms_norm_forward(x.data(), w.data(), kT, kH, eps, y.data(), rstd.data());
  std::vector<double> y_ref, rstd_ref;
  rms_norm_ref(x, w, kT, kH, eps, y_ref, rstd_ref);
  // rstd ~ 0.87: one rounding to float (sum of squares in fp32 lanes), observed 3.4e-8.
  EXPECT_LT(max_abs_error(rstd, rstd_ref), 1e-7);
  // |y| <= ~2.6, three float roundings: observed 2.5e-7.
  EXPECT_LT(max_abs_error(y, y_ref), 1e-6);
}

TEST(FusedKernelRmsNorm, BackwardMatchesReference) {
  const float eps = 1e-5f;
  const auto x = random_floats(kT * kH, -2, 2, 9);
  const auto w = random_floats(kH, 0.5, 1.5, 10);
  const auto dy = random_floats(kT * kH, -1, 1, 11);
  std::vector<float> y(kT * kH), rstd(kT), dx(kT * kH, NAN), dw(kH, NAN);
  rms_norm_forward(x.data(), w.data(), kT, kH, eps, y.data(), rstd.data());
  rms_norm_backward(dy.data(), x.data(), w.data(), rstd.data(), kT, kH, dx.data(), dw.data());
  std::vector<double> dx_ref, dw_ref;
  rms_norm_backward_ref(dy, x, w, kT, kH, eps, dx_ref, dw_ref);
  // |dx| <= ~2; the saved float rstd and float products: observed 1.5e-7.
  EXPECT_LT(max_abs_error(dx, dx_ref), 6e-7);
  // dw sums 37 rows in double but each row's r is the saved float rstd: observed 4.7e-7.
  EXPECT_LT(max_abs_error(dw, dw_ref), 2e-6);
}

// Above the parallel threshold; dw's row chunks are fixed, so dw (and dx) are bitwise the
// same on 1 and 2 threads.
TEST(FusedKernelRmsNorm, BackwardIndependentOfThreadCount) {
  const int64_t T = 517, H = 131;
  const auto x = random_floats(T * H, -2, 2, 12);
  const auto w = random_floats(H, 0.5, 1.5, 13);
  const auto dy = random_floats(T * H, -1, 1, 14);
  std::vector<float> y(T * H), rstd(T);
  rms_norm_forward(x.data(), w.data(), T, H, 1e-6f, y.data(), rstd.data());
  std::vector<float> dx1(T * H), dw1(H), dx2(T * H), dw2(H);
  with_threads(1, [&] {
    rms_norm_backward(dy.data(), x.data(), w.data(), rstd.data(), T, H, dx1.data(), dw1.data());
  });
  with_threads(2, [&] {
    rms_norm_backward(dy.data(), x.data(), w.data(), rstd.data(), T, H, dx2.data(), dw2.data());
  });
  EXPECT_EQ(dx1, dx2);
  EXPECT_EQ(dw1, dw2);
  std::vector<double> y_ref, rstd_ref, dx_ref, dw_ref;
  rms_norm_backward_ref(dy, x, w, T, H, 1e-6, dx_ref, dw_ref);
  // As in BackwardMatchesReference; dw now sums 517 rows: observed dx 1.4e-7, dw 1.3e-6.
  EXPECT_LT(max_abs_error(dx2, dx_ref), 6e-7);
  EXPECT_LT(max_abs_error(dw2, dw_ref), 6e-6);
}

// ---- rope -----------------------------------------------------------------------------

constexpr int64_t kNH = 3, kD = 34;

std::vector<double> plain_inv_freq(int64_t D, double theta) {
  std::vector<double> f(static_cast<size_t>(D / 2));
  rope_inv_freq(D, theta, RopeScaling{}, f.data());
  return f;
}

TEST(FusedKernelRope, ForwardMatchesReference) {
  const auto x = random_floats(kT * kNH * kD, -1, 1, 15);
  // Positions up to 2^17: a float angle would be off by ~0.004 rad there; ours are double.
  const auto pos = random_ints(kT, 0, 131071, 16);
  const auto inv_freq = plain_inv_freq(kD, 10000.0);
  for (bool inverse : {false, true}) {
    std::vector<float> y(x.size());
    rope_forward(x.data(), pos.data(), inv_freq.data(), kT, kNH, kD, inverse, y.data());
    std::vector<double> want;
    rope_ref(x, pos, inv_freq, kT, kNH, kD, inverse, want);
    // |x| <= 1; cos/sin rounded to float, two products and a sum: observed 9.6e-8
    // (forward) and 1.1e-7 (inverse).
    EXPECT_LT(max_abs_error(y, want), 5e-7) << "inverse = " << inverse;
  }
}

// The cos/sin table itself (vectorised double sin/cos in simd.h, rounded to float): rotating
// the unit vector e_i gives y[i] = cos and y[i + D/2] = sin exactly, which must equal
// std::cos / std::sin in double rounded to float, to within one float ulp, for positions up
// to 2^20 and every frequency of Llama 3's rope (theta 500000, D = 128) and a D = 40 one
// (not a multiple of any vector width).
TEST(FusedKernelRope, TableIsDoubleSinCosRoundedToFloat) {
  for (const auto& [D, theta] : {std::pair<int64_t, double>{128, 500000.0}, {40, 10000.0}}) {
    const int64_t half = D / 2, T = 2 * half;
    auto pos = random_ints(T, 0, (1 << 20) - 1, 31);
    pos[0] = 0, pos[1] = 1, pos[2] = (1 << 20) - 1;
    const auto inv_freq = plain_inv_freq(D, theta);
    std::vector<float> x(T * D, 0.0f), y(T * D);
    for (int64_t t = 0; t < T; ++t) x[t * D + t % half] = 1.0f;  // row t rotates e_{t mod half}
    for (bool inverse : {false, true}) {
      rope_forward(x.data(), pos.data(), inv_freq.data(), T, 1, D, inverse, y.data());
      double worst = 0.0;
      for (int64_t t = 0; t < T; ++t) {
        const int64_t i = t % half;
        const double angle = double(pos[t]) * inv_freq[i];
        const float want_c = float(std::cos(angle)), want_s = float((inverse ? -1 : 1) * std::sin(angle));
        const float ulp = std::numeric_limits<float>::epsilon();
        worst = std::max({worst, std::abs(double(y[t * D + i]) - want_c) / ulp,
                          std::abs(double(y[t * D + i + half]) - want_s) / ulp});
      }
      EXPECT_LE(worst, 1.0) << "D=" << D << " inverse=" << inverse << ": worst error in float epsilons";
    }
  }
}

TEST(FusedKernelRope, InverseUndoesForward) {
  const auto x = random_floats(kT * kNH * kD, -1, 1, 17);
  const auto pos = random_ints(kT, 0, 8191, 18);
  const auto inv_freq = plain_inv_freq(kD, 500000.0);
  std::vector<float> y(x.size()), back(x.size());
  rope_forward(x.data(), pos.data(), inv_freq.data(), kT, kNH, kD, false, y.data());
  rope_forward(y.data(), pos.data(), inv_freq.data(), kT, kNH, kD, true, back.data());
  const std::vector<double> want(x.begin(), x.end());
  // Two rotations with float cos/sin (|cos^2 + sin^2 - 1| ~ 1e-7): observed 1.2e-7.
  EXPECT_LT(max_abs_error(back, want), 5e-7);
}

// y may alias x (the kernel reads both halves before writing either).
TEST(FusedKernelRope, InPlaceMatchesOutOfPlace) {
  const int64_t T = 129, NH = 4, D = 128;  // above the parallel threshold
  const auto x = random_floats(T * NH * D, -1, 1, 19);
  const auto pos = random_ints(T, 0, 100000, 20);
  const auto inv_freq = plain_inv_freq(D, 500000.0);
  std::vector<float> y(x.size()), inplace = x;
  rope_forward(x.data(), pos.data(), inv_freq.data(), T, NH, D, false, y.data());
  rope_forward(inplace.data(), pos.data(), inv_freq.data(), T, NH, D, false, inplace.data());
  EXPECT_EQ(y, inplace);
}

// The interleaved layout (pairs 2i, 2i + 1) is the rotate-half rope of each head with its pairs
// gathered into the halves (x[2i] to i, x[2i + 1] to i + D/2) and scattered back, bit for bit (the
// same products and sums per pair); in place too. D = 34 (17 pairs, no whole vector) and 128 over
// the parallel threshold.
TEST(FusedKernelRope, InterleavedIsRotateHalfOfThePairsGathered) {
  for (const auto& [T, NH, D] : {std::tuple<int64_t, int64_t, int64_t>{kT, kNH, kD}, {129, 4, 128}}) {
    const int64_t half = D / 2;
    const auto x = random_floats(T * NH * D, -1, 1, 23);
    const auto pos = random_ints(T, 0, 100000, 24);
    const auto inv_freq = plain_inv_freq(D, 10000.0);
    std::vector<float> gathered(x.size());
    for (int64_t r = 0; r < T * NH; ++r)
      for (int64_t i = 0; i < half; ++i)
        gathered[r * D + i] = x[r * D + 2 * i], gathered[r * D + half + i] = x[r * D + 2 * i + 1];
    for (bool inverse : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "D=" << D << " inverse=" << inverse);
      std::vector<float> halves(x.size()), want(x.size()), y(x.size()), inplace = x;
      rope_forward(gathered.data(), pos.data(), inv_freq.data(), T, NH, D, inverse, halves.data());
      for (int64_t r = 0; r < T * NH; ++r)
        for (int64_t i = 0; i < half; ++i)
          want[r * D + 2 * i] = halves[r * D + i], want[r * D + 2 * i + 1] = halves[r * D + half + i];
      rope_forward(x.data(), pos.data(), inv_freq.data(), T, NH, D, inverse, y.data(), nullptr, true);
      EXPECT_EQ(y, want);
      rope_forward(inplace.data(), pos.data(), inv_freq.data(), T, NH, D, inverse, inplace.data(), nullptr, true);
      EXPECT_EQ(inplace, y);
    }
  }
}

TEST(FusedKernelRopeInvFreq, PlainIsThetaPower) {
  const int64_t D = 128;
  const auto f = plain_inv_freq(D, 500000.0);
  for (int64_t i = 0; i < D / 2; ++i)
    // A different route (exp of a log) to the same number: |log theta| * eps ~ 1.5e-15
    // relative; observed at most 5.6e-16.
    EXPECT_NEAR(f[i], std::exp(-std::log(500000.0) * 2.0 * i / D), 4e-15 * f[i]) << i;
  EXPECT_EQ(f[0], 1.0);
}

// Llama 3.1 (D = 128, theta = 500000, factor 8, low 1, high 4, original 8192). The
// expected numbers come from transformers' _compute_llama3_parameters transcribed into
// torch 1.13 in float64 (/usr/bin/python3), printed with repr. Bands: wavelen < 2048
// keeps inv_freq (i <= 28), wavelen > 8192 divides by 8 (i >= 35), between is smoothed.
TEST(FusedKernelRopeInvFreq, Llama3MatchesTransformers) {
  RopeScaling s;
  s.kind = RopeScaling::llama3;
  s.factor = 8.0;
  s.low_freq_factor = 1.0;
  s.high_freq_factor = 4.0;
  s.original_max_position_embeddings = 8192.0;
  std::vector<double> f(64);
  rope_inv_freq(128, 500000.0, s, f.data());
  const struct {
    int i;
    double want;
  } cases[] = {
      {0, 1.0},                      // high frequency: unchanged
      {20, 0.016560440080994446},    // unchanged
      {28, 0.0032114459947525913},   // last unchanged (wavelen 1956)
      {29, 0.002166570763503359},    // first smoothed (wavelen 2402)
      {32, 0.0005248461609929547},   // smoothed
      {34, 0.00017850781276799638},  // last smoothed (wavelen 6695)
      {35, 9.556212353964683e-05},   // first divided by 8 (wavelen 8219)
      {63, 3.068925988914511e-07},   // divided by 8
  };
  // Same operations in the same order as the float64 torch code, different pow/exp
  // library: observed equal except i = 32, one ulp off (2.1e-16 relative).
  for (const auto& c : cases) EXPECT_NEAR(f[c.i], c.want, 2e-15 * c.want) << "i = " << c.i;
}

// yarn (D = 128, theta = 500000) against transformers' own _compute_yarn_parameters (4.46.3,
// in the venv of scripts/install_hf_venv.sh, with max_position_embeddings = the original
// positions, which 4.46 reads them from), which computes in float32: hence 1e-6 relative.
// Below the correction range the frequency is kept, above it divided by the factor.
TEST(FusedKernelRopeInvFreq, YarnMatchesTransformers) {
  const struct {
    double factor, orig, beta_fast, beta_slow;
    std::vector<std::pair<int, double>> want;
  } cases[] = {
      {4.0, 2048, 32, 1,
       {{0, 1.0}, {10, 0.12868738174438477}, {20, 0.010350275784730911}, {25, 0.002475304529070854},
        {30, 0.0005327799008227885}, {40, 6.856204709038138e-05}, {63, 6.137851755738666e-07}}},
      {8.0, 64, 16, 2,
       {{0, 1.0}, {10, 0.016085922718048096}, {20, 0.0020700551103800535}, {25, 0.0007425913354381919},
        {30, 0.00026638995041139424}, {40, 3.428102354519069e-05}, {63, 3.068925877869333e-07}}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.orig);
    RopeScaling s;
    s.kind = RopeScaling::yarn;
    s.factor = c.factor;
    s.original_max_position_embeddings = c.orig;
    s.beta_fast = c.beta_fast;
    s.beta_slow = c.beta_slow;
    std::vector<double> f(64);
    rope_inv_freq(128, 500000.0, s, f.data());
    for (const auto& [i, want] : c.want) EXPECT_NEAR(f[i], want, 1e-6 * want) << i;
  }
}

// ---- silu / swiglu --------------------------------------------------------------------

// Includes the saturated tails: expf(-x) overflows to inf for x < -88.7 and s must then be
// 0, not NaN.
std::vector<float> silu_inputs(int64_t n, uint32_t seed) {
  auto x = random_floats(n, -8, 8, seed);
  const float tails[] = {-100.0f, -88.5f, -30.0f, 0.0f, 30.0f, 88.5f, 100.0f};
  for (size_t i = 0; i < std::size(tails); ++i) x[i * 3] = tails[i];
  return x;
}

TEST(FusedKernelSilu, ForwardBackwardMatchReference) {
  const int64_t n = kT * kH;
  const auto x = silu_inputs(n, 21);
  const auto dy = random_floats(n, -1, 1, 22);
  std::vector<float> y(n), dx(n);
  silu_forward(x.data(), n, y.data());
  silu_backward(dy.data(), x.data(), n, dx.data());
  std::vector<double> y_ref(n), dx_ref(n);
  for (int64_t i = 0; i < n; ++i) {
    const double s = sigmoid_ref(x[i]);
    y_ref[i] = x[i] * s;
    dx_ref[i] = dy[i] * (s + x[i] * s * (1.0 - s));  // product rule on x s(x)
  }
  // |y| <= 100 in the tails (ulp 7.6e-6 there); observed 7.2e-7.
  EXPECT_LT(max_abs_error(y, y_ref), 4e-6);
  // |dx| <= 1.1, but 1 - s loses digits as s -> 1 and is then scaled by x <= 8:
  // observed 4.9e-7.
  EXPECT_LT(max_abs_error(dx, dx_ref), 2e-6);
}

TEST(FusedKernelSwiglu, ForwardBackwardMatchReference) {
  const int64_t n = kT * kH;
  const auto g = silu_inputs(n, 23);
  const auto u = random_floats(n, -2, 2, 24);
  const auto dy = random_floats(n, -1, 1, 25);
  std::vector<float> out(n), dg(n), du(n);
  swiglu_forward(g.data(), u.data(), n, out.data());
  swiglu_backward(dy.data(), g.data(), u.data(), n, dg.data(), du.data());
  std::vector<double> out_ref(n), dg_ref(n), du_ref(n);
  for (int64_t i = 0; i < n; ++i) {
    const double s = sigmoid_ref(g[i]);
    out_ref[i] = g[i] * s * u[i];
    dg_ref[i] = dy[i] * u[i] * (s + g[i] * s * (1.0 - s));
    du_ref[i] = dy[i] * g[i] * s;
  }
  // |out| <= 200 in the tails: observed 1.6e-6.
  EXPECT_LT(max_abs_error(out, out_ref), 8e-6);
  // |dg| <= 2.2, same 1 - s loss as silu_backward: observed 5.8e-7.
  EXPECT_LT(max_abs_error(dg, dg_ref), 3e-6);
  // |du| <= 100: observed 6.7e-7.
  EXPECT_LT(max_abs_error(du, du_ref), 4e-6);
}

// Above the parallel threshold: elementwise, so the split cannot change a value.
TEST(FusedKernelSwiglu, IndependentOfThreadCount) {
  const int64_t n = 100003;
  const auto g = random_floats(n, -8, 8, 26);
  const auto u = random_floats(n, -2, 2, 27);
  std::vector<float> a(n), b(n);
  with_threads(1, [&] { swiglu_forward(g.data(), u.data(), n, a.data()); });
  with_threads(2, [&] { swiglu_forward(g.data(), u.data(), n, b.data()); });
  EXPECT_EQ(a, b);
}

// ---- cross entropy --------------------------------------------------------------------

constexpr int32_t kIgnore = -100;

// Every third row ignored.
std::vector<int32_t> labels_with_ignored(int64_t T, int64_t V, uint32_t seed) {
  auto labels = random_ints(T, 0, static_cast<int32_t>(V - 1), seed);
  for (int64_t t = 0; t < T; t += 3) labels[t] = kIgnore;
  return labels;
}

TEST(FusedKernelCrossEntropy, ForwardMatchesReference) {
  const auto logits = random_floats(kT * kV, -5, 5, 28);
  const auto labels = labels_with_ignored(kT, kV, 29);
  float loss = NAN;
  std::vector<float> lse(kT, NAN);
  cross_entropy_forward(logits.data(), labels.data(), kT, kV, kIgnore, &loss, lse.data());
  // lse is written for ignored rows too.
  // lse ~ 6, one float rounding (ulp 4.8e-7): observed 2.3e-7.
  EXPECT_LT(max_abs_error(lse, log_sum_exp_ref(logits, kT, kV)), 1e-6);
  const double want = cross_entropy_ref(logits, labels, kT, kV, kIgnore);
  // loss ~ 178, summed in double and rounded once (half an ulp is 7.6e-6): observed 1.8e-6.
  EXPECT_NEAR(loss, want, 2e-5);
}

TEST(FusedKernelCrossEntropy, BackwardMatchesReference) {
  const auto logits = random_floats(kT * kV, -5, 5, 30);
  const auto labels = labels_with_ignored(kT, kV, 31);
  float loss = 0;
  std::vector<float> lse(kT);
  cross_entropy_forward(logits.data(), labels.data(), kT, kV, kIgnore, &loss, lse.data());
  const float dloss = 0.37f;
  std::vector<float> d(kT * kV, NAN);
  cross_entropy_backward(&dloss, logits.data(), labels.data(), lse.data(), kT, kV, kIgnore,
                         d.data());
  // |d| <= 0.37; exp of (x - float lse), lse ~ 6 so its rounding is ~2.4e-7 relative:
  // observed 2.1e-8.
  EXPECT_LT(max_abs_error(d, cross_entropy_backward_ref(dloss, logits, labels, kT, kV, kIgnore)),
            2e-7);
  for (int64_t t = 0; t < kT; t += 3)
    for (int64_t v = 0; v < kV; ++v) ASSERT_EQ(d[t * kV + v], 0.0f);
  // In place (dlogits == logits), as linear_cross_entropy's chunks run it: bit for bit the
  // same, the label's p read before its row is overwritten included.
  std::vector<float> in_place = logits;
  cross_entropy_backward(&dloss, in_place.data(), labels.data(), lse.data(), kT, kV, kIgnore,
                         in_place.data());
  for (int64_t i = 0; i < kT * kV; ++i) ASSERT_EQ(in_place[i], d[i]) << "in place, element " << i;
}

TEST(FusedKernelCrossEntropy, AllIgnoredGivesZero) {
  const auto logits = random_floats(kT * kV, -5, 5, 32);
  const std::vector<int32_t> labels(kT, kIgnore);
  float loss = NAN;
  std::vector<float> lse(kT, NAN);
  cross_entropy_forward(logits.data(), labels.data(), kT, kV, kIgnore, &loss, lse.data());
  EXPECT_EQ(loss, 0.0f);
  for (float l : lse) EXPECT_TRUE(std::isfinite(l));
  const float dloss = 1.0f;
  std::vector<float> d(kT * kV, NAN);
  cross_entropy_backward(&dloss, logits.data(), labels.data(), lse.data(), kT, kV, kIgnore,
                         d.data());
  for (float v : d) ASSERT_EQ(v, 0.0f);
}

// Logits around 1000 overflow a naive exp; the max shift keeps everything finite. Row 1
// has one dominating logit (p ~ 1 - 1e-8), row 2 a label whose p underflows to 0.
TEST(FusedKernelCrossEntropy, LargeLogitsStayFinite) {
  auto logits = random_floats(kT * kV, 990, 1010, 33);
  auto labels = labels_with_ignored(kT, kV, 34);
  logits[1 * kV + 7] = 1030.0f;  // row 1: label 7 dominates by >= 20
  labels[1] = 7;
  logits[2 * kV + 5] = -1000.0f;  // row 2: a label far below the rest
  labels[2] = 5;
  float loss = NAN;
  std::vector<float> lse(kT);
  cross_entropy_forward(logits.data(), labels.data(), kT, kV, kIgnore, &loss, lse.data());
  ASSERT_TRUE(std::isfinite(loss));
  const double want = cross_entropy_ref(logits, labels, kT, kV, kIgnore);
  // loss ~ 2292, summed in double and rounded once (half an ulp is 1.2e-4): observed 2.5e-5.
  EXPECT_NEAR(loss, want, 5e-4);
  const float dloss = 1.0f;
  std::vector<float> d(kT * kV);
  cross_entropy_backward(&dloss, logits.data(), labels.data(), lse.data(), kT, kV, kIgnore,
                         d.data());
  for (float v : d) ASSERT_TRUE(std::isfinite(v));
  // lse ~ 1010 is stored in float (ulp 6.1e-5), so every p carries up to ~6e-5 relative
  // error from the contract itself; row 1's label gradient (-1.3e-8) comes out as 0 for the
  // same reason: observed 7.3e-6 absolute (|d| <= 1).
  const auto d_ref = cross_entropy_backward_ref(dloss, logits, labels, kT, kV, kIgnore);
  EXPECT_LT(max_abs_error(d, d_ref), 6e-5);
}

// Above the parallel threshold; loss_sum adds fixed row chunks in order, so it is bitwise
// the same on 1 and 2 threads.
TEST(FusedKernelCrossEntropy, IndependentOfThreadCount) {
  const int64_t T = 301, V = 1001;
  const auto logits = random_floats(T * V, -5, 5, 35);
  const auto labels = labels_with_ignored(T, V, 36);
  float loss1 = 0, loss2 = 0;
  std::vector<float> lse1(T), lse2(T), d1(T * V), d2(T * V);
  const float dloss = 1.0f / 200;
  with_threads(1, [&] {
    cross_entropy_forward(logits.data(), labels.data(), T, V, kIgnore, &loss1, lse1.data());
    cross_entropy_backward(&dloss, logits.data(), labels.data(), lse1.data(), T, V, kIgnore,
                           d1.data());
  });
  with_threads(2, [&] {
    cross_entropy_forward(logits.data(), labels.data(), T, V, kIgnore, &loss2, lse2.data());
    cross_entropy_backward(&dloss, logits.data(), labels.data(), lse2.data(), T, V, kIgnore,
                           d2.data());
  });
  EXPECT_EQ(loss1, loss2);
  EXPECT_EQ(lse1, lse2);
  EXPECT_EQ(d1, d2);
  // loss ~ 1901 (half an ulp is 6.1e-5): observed 2.1e-5.
  EXPECT_NEAR(loss2, cross_entropy_ref(logits, labels, T, V, kIgnore), 3e-4);
}

}  // namespace
