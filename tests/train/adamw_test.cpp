// AdamW, Adam (L2 weight decay) and clip_grad_norm against PyTorch:
// tests/train/torch_adamw_reference.py runs torch.optim.AdamW or torch.optim.Adam
// (+ clip_grad_norm_) in fp32 on the same hashed inputs, and the results are compared per
// tensor in units in the last place.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <vector>

#include "train/adamw.h"
#include "util/error.h"

#ifndef AUTOSP_SOURCE_DIR
#error "AUTOSP_SOURCE_DIR (the repository root, a string) must be defined to find the torch reference"
#endif

namespace autosp::train {
namespace {

// Must match hashed_value() in torch_adamw_reference.py: a multiple of 1/2048 in [-1, 1).
float hashed_value(uint64_t tensor, uint64_t index, uint64_t salt) {
  uint64_t h = (index * 2654435761ull + tensor * 40503ull + salt * 97ull + 12345ull) & 0xFFFFFFFFull;
  h ^= h >> 15;
  h = (h * 2246822519ull) & 0xFFFFFFFFull;
  h ^= h >> 13;
  return static_cast<float>(static_cast<double>(static_cast<int64_t>((h >> 8) % 4096) - 2048) /
                            2048.0);
}

std::vector<float> hashed_tensor(uint64_t tensor, int64_t n, uint64_t salt, float scale) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = hashed_value(tensor, i, salt) * scale;
  return v;
}

std::string join(const std::vector<double>& xs) {
  std::ostringstream out;
  out.precision(17);
  for (size_t i = 0; i < xs.size(); ++i) out << (i ? "," : "") << xs[i];
  return out.str();
}

std::string join(const std::vector<int64_t>& xs) {
  std::ostringstream out;
  for (size_t i = 0; i < xs.size(); ++i) out << (i ? "," : "") << xs[i];
  return out.str();
}

// Distance in representable floats (0 when equal, 1 for neighbours; +0 and -0 equal).
int64_t ulp_distance(float a, float b) {
  auto ordered = [](float x) {
    int32_t i;
    std::memcpy(&i, &x, sizeof i);
    return i < 0 ? int64_t{INT32_MIN} - i : int64_t{i};
  };
  return std::llabs(ordered(a) - ordered(b));
}

struct RunSpec {
  std::vector<int64_t> sizes;
  std::vector<double> lrs;          // one per step (as a schedule would give)
  std::vector<double> grad_scales;  // one per step; powers of two keep inputs exact
  AdamWParams params;
  double max_norm = 0.0;  // 0: no clipping
};

struct Reference {
  std::vector<double> norms;
  std::map<std::string, std::vector<std::vector<float>>> tensors;  // name -> [tensor][i]
  std::string error;
};

Reference run_torch(const RunSpec& s) {
  Reference ref;
  std::ostringstream cmd;
  cmd.precision(17);
  cmd << "/usr/bin/python3 " << AUTOSP_SOURCE_DIR << "/tests/train/torch_adamw_reference.py"
      << " --sizes " << join(s.sizes) << " --lrs " << join(s.lrs) << " --grad-scales "
      << join(s.grad_scales) << " --betas " << s.params.beta1 << "," << s.params.beta2
      << " --eps " << s.params.eps << " --weight-decay " << s.params.weight_decay
      << " --max-norm " << s.max_norm
      << " --optimizer " << (s.params.decoupled_weight_decay ? "adamw" : "adam") << " 2>&1";
  FILE* pipe = popen(cmd.str().c_str(), "r");
  if (!pipe) {
    ref.error = "popen failed: " + cmd.str();
    return ref;
  }
  std::string text;
  std::array<char, 1 << 16> buf;
  size_t got;
  while ((got = fread(buf.data(), 1, buf.size(), pipe)) > 0) text.append(buf.data(), got);
  const int status = pclose(pipe);
  if (status != 0) {
    ref.error = str("torch reference failed (exit status ",
                    WIFEXITED(status) ? WEXITSTATUS(status) : -1, "); this test needs "
                    "/usr/bin/python3 with torch (Debian's python3-torch).\ncommand: ",
                    cmd.str(), "\noutput:\n", text);
    return ref;
  }
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    std::string name;
    in >> name;
    if (name == "norm") {
      int step;
      std::string value;
      in >> step >> value;
      ref.norms.push_back(std::stod(value));
    } else if (name == "param" || name == "exp_avg" || name == "exp_avg_sq") {
      size_t t;
      in >> t;
      auto& list = ref.tensors[name];
      if (list.size() <= t) list.resize(t + 1);
      std::string value;
      // repr() of an fp32 value is exact as a double; rounding to float recovers it.
      while (in >> value) list[t].push_back(static_cast<float>(std::stod(value)));
    }
  }
  return ref;
}

struct Result {
  std::vector<double> norms;
  std::vector<std::vector<float>> param, exp_avg, exp_avg_sq;
};

Result run_autosp(const RunSpec& s) {
  Result r;
  const size_t T = s.sizes.size();
  r.param.resize(T);
  r.exp_avg.resize(T);
  r.exp_avg_sq.resize(T);
  for (size_t t = 0; t < T; ++t) {
    r.param[t] = hashed_tensor(t, s.sizes[t], 0, 1.0f);
    r.exp_avg[t].assign(s.sizes[t], 0.0f);
    r.exp_avg_sq[t].assign(s.sizes[t], 0.0f);
  }
  for (size_t step = 0; step < s.lrs.size(); ++step) {
    std::vector<std::vector<float>> grads(T);
    std::vector<std::pair<float*, int64_t>> views;
    for (size_t t = 0; t < T; ++t) {
      grads[t] = hashed_tensor(t, s.sizes[t], step + 1, static_cast<float>(s.grad_scales[step]));
      views.emplace_back(grads[t].data(), s.sizes[t]);
    }
    if (s.max_norm > 0) r.norms.push_back(clip_grad_norm(views, s.max_norm));
    for (size_t t = 0; t < T; ++t)
      adamw_step(r.param[t].data(), grads[t].data(), r.exp_avg[t].data(),
                 r.exp_avg_sq[t].data(), s.sizes[t], s.params, static_cast<int64_t>(step) + 1,
                 s.lrs[step]);
  }
  return r;
}

// Sizes straddle the OpenMP threshold and are not multiples of a SIMD width (tails).
RunSpec base_spec() {
  RunSpec s;
  s.sizes = {37, 1000, 40003};
  s.lrs = {1e-3, 3e-3, 2e-3, 5e-4, 1e-2};
  s.grad_scales = {0.5, 1.0 / 128, 4.0, 1.0 / 256, 2.0};
  s.params.beta1 = 0.9;
  s.params.beta2 = 0.95;
  s.params.eps = 1e-8;
  s.params.weight_decay = 0.1;
  return s;
}

int64_t worst_ulps(const std::vector<std::vector<float>>& got,
                   const std::vector<std::vector<float>>& want) {
  int64_t worst = 0;
  for (size_t t = 0; t < std::min(got.size(), want.size()); ++t)
    for (size_t i = 0; i < std::min(got[t].size(), want[t].size()); ++i)
      worst = std::max(worst, ulp_distance(got[t][i], want[t][i]));
  return worst;
}

// max over tensors of max_i |got - want| / max_i |want|.
double worst_relative(const std::vector<std::vector<float>>& got,
                      const std::vector<std::vector<float>>& want) {
  double worst = 0.0;
  for (size_t t = 0; t < std::min(got.size(), want.size()); ++t) {
    double err = 0.0, scale = 0.0;
    for (size_t i = 0; i < std::min(got[t].size(), want[t].size()); ++i) {
      err = std::max(err, std::fabs(static_cast<double>(got[t][i]) - want[t][i]));
      scale = std::max(scale, std::fabs(static_cast<double>(want[t][i])));
    }
    if (scale > 0) worst = std::max(worst, err / scale);
  }
  return worst;
}

void expect_same_shapes(const Result& r, const Reference& ref) {
  for (const char* name : {"param", "exp_avg", "exp_avg_sq"}) {
    const auto& want = ref.tensors.at(name);
    ASSERT_EQ(want.size(), r.param.size()) << name;
    for (size_t t = 0; t < want.size(); ++t)
      ASSERT_EQ(want[t].size(), r.param[t].size()) << name << "[" << t << "]";
  }
}

TEST(AdamW, MatchesTorchWithoutClipping) {
  const RunSpec s = base_spec();
  const Reference ref = run_torch(s);
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  ASSERT_EQ(ref.tensors.size(), 3u);
  const Result r = run_autosp(s);
  expect_same_shapes(r, ref);
  // Same inputs, same fp32 operations in the same order (fused where torch's AVX2 kernels
  // fuse): bit-identical to torch.
  EXPECT_EQ(worst_ulps(r.param, ref.tensors.at("param")), 0);
  EXPECT_EQ(worst_ulps(r.exp_avg, ref.tensors.at("exp_avg")), 0);
  EXPECT_EQ(worst_ulps(r.exp_avg_sq, ref.tensors.at("exp_avg_sq")), 0);
}

TEST(AdamW, MatchesTorchWithClipping) {
  RunSpec s = base_spec();
  // Total norms are about 117 * scale: the steps with scale 1/128 and 1/256 stay below max_norm
  // (coef clamps to 1), the others are clipped.
  s.max_norm = 1.0;
  const Reference ref = run_torch(s);
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  const Result r = run_autosp(s);
  expect_same_shapes(r, ref);
  ASSERT_EQ(r.norms.size(), ref.norms.size());
  for (size_t i = 0; i < r.norms.size(); ++i) {
    // torch sums squares in fp32 (8-lane SIMD partials of ~5000 terms each); ours is a double
    // sum, so the difference is torch's rounding error: observed 1.7e-6 .. 2.3e-6 relative
    // (a float64 numpy sum agrees with ours, not with torch's).
    EXPECT_NEAR(r.norms[i], ref.norms[i], 1e-5 * ref.norms[i]) << "step " << i;
  }
  // The clip coefficient inherits that norm difference, so clipped gradients differ from
  // torch's by the same relative amount: m (linear in g) by up to the norm tolerance, v
  // (quadratic) by twice it. Near-zero elements make ulp counts meaningless, so compare
  // max |error| / max |value| per tensor. Observed: m 1.7e-6, v 3.4e-6, and p 1.8e-7 (Adam's
  // m / sqrt(v) hardly depends on the gradient scale).
  EXPECT_LE(worst_relative(r.exp_avg, ref.tensors.at("exp_avg")), 1e-5);
  EXPECT_LE(worst_relative(r.exp_avg_sq, ref.tensors.at("exp_avg_sq")), 2e-5);
  EXPECT_LE(worst_relative(r.param, ref.tensors.at("param")), 1e-6);
}

// DeepSpeed's "Adam" with adam_w_mode false is torch.optim.Adam: weight decay as an L2 term
// in the gradient. Weight decay 0.1 with parameters of size ~1 next to gradients scaled down
// to 1/256 makes the L2 term dominate some steps, so a decoupled update would be far off.
TEST(AdamW, AdamWithL2DecayMatchesTorchAdam) {
  RunSpec s = base_spec();
  s.params.decoupled_weight_decay = false;
  const Reference ref = run_torch(s);
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  const Result r = run_autosp(s);
  expect_same_shapes(r, ref);
  // The same fp32 operations in torch's order, fused where its AVX2 kernels fuse (the L2
  // term is torch's add with alpha, one vec::fmadd): bit-identical, as AdamW above.
  EXPECT_EQ(worst_ulps(r.param, ref.tensors.at("param")), 0);
  EXPECT_EQ(worst_ulps(r.exp_avg, ref.tensors.at("exp_avg")), 0);
  EXPECT_EQ(worst_ulps(r.exp_avg_sq, ref.tensors.at("exp_avg_sq")), 0);
  // And it is not AdamW: the two decays give different parameters (observed 2.2e-2).
  RunSpec w = base_spec();
  EXPECT_GT(worst_relative(run_autosp(w).param, r.param), 1e-3);
}

TEST(AdamW, AdamWithL2DecayMatchesTorchAdamWithClipping) {
  RunSpec s = base_spec();
  s.params.decoupled_weight_decay = false;
  s.max_norm = 1.0;
  const Reference ref = run_torch(s);
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  const Result r = run_autosp(s);
  expect_same_shapes(r, ref);
  ASSERT_EQ(r.norms.size(), ref.norms.size());
  // Tolerances as in MatchesTorchWithClipping, for the same reason (torch's fp32 norm sum,
  // observed 1.7e-6 .. 2.3e-6 relative here too). The L2 term is added after clipping and is
  // exact, so it only dilutes the clip coefficient's error: observed m 1.8e-7, v 2.8e-7,
  // p 1.7e-7.
  for (size_t i = 0; i < r.norms.size(); ++i)
    EXPECT_NEAR(r.norms[i], ref.norms[i], 1e-5 * ref.norms[i]) << "step " << i;
  EXPECT_LE(worst_relative(r.exp_avg, ref.tensors.at("exp_avg")), 1e-5);
  EXPECT_LE(worst_relative(r.exp_avg_sq, ref.tensors.at("exp_avg_sq")), 2e-5);
  EXPECT_LE(worst_relative(r.param, ref.tensors.at("param")), 1e-6);
}

TEST(AdamW, AdamAndAdamWAgreeWithoutWeightDecay) {
  // With wd = 0 both reduce to plain Adam; the L2 path must then not touch the gradient.
  std::vector<float> p1 = hashed_tensor(1, 257, 0, 1.0f), p2 = p1, g = hashed_tensor(1, 257, 1, 0.5f);
  std::vector<float> m1(257, 0.0f), v1(257, 0.0f), m2 = m1, v2 = v1;
  AdamWParams adamw, adam;
  adamw.weight_decay = adam.weight_decay = 0.0;
  adam.decoupled_weight_decay = false;
  for (int64_t step = 1; step <= 3; ++step) {
    adamw_step(p1.data(), g.data(), m1.data(), v1.data(), 257, adamw, step, 1e-2);
    adamw_step(p2.data(), g.data(), m2.data(), v2.data(), 257, adam, step, 1e-2);
  }
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(v1, v2);
}

TEST(AdamW, GlobalNormIsTheNormOfAllElementsAndThreadIndependent) {
  // 3-4-12 style Pythagorean values: sqrt(9 + 16 + 144) = 13 exactly.
  std::vector<float> a = {3.0f}, b = {4.0f, 0.0f}, c = {-12.0f};
  EXPECT_EQ(global_grad_norm({{a.data(), 1}, {b.data(), 2}, {c.data(), 1}}), 13.0);
  EXPECT_EQ(global_grad_norm({}), 0.0);
  // Large enough for several blocks; the fixed block order makes it reproducible.
  std::vector<float> big = hashed_tensor(7, 100003, 3, 1.0f);
  const double n1 = global_grad_norm({{big.data(), 100003}});
  const double n2 = global_grad_norm({{big.data(), 100003}});
  EXPECT_EQ(n1, n2);
  double ref = 0.0;
  for (float x : big) ref += static_cast<double>(x) * x;
  EXPECT_NEAR(n1, std::sqrt(ref), 1e-12 * n1);
}

TEST(AdamW, ClipLeavesSmallGradientsAndScalesLargeOnes) {
  std::vector<float> g = {3.0f, 4.0f};  // norm 5
  EXPECT_EQ(clip_grad_norm({{g.data(), 2}}, 10.0), 5.0);
  EXPECT_EQ(g[0], 3.0f);  // coef clamped to exactly 1
  EXPECT_EQ(g[1], 4.0f);
  EXPECT_EQ(clip_grad_norm({{g.data(), 2}}, 1.0), 5.0);
  // coef = 1 / (5 + 1e-6), as torch (the 1e-6 keeps a zero norm finite).
  const float coef = static_cast<float>(1.0 / (5.0 + 1e-6));
  EXPECT_EQ(g[0], 3.0f * coef);
  EXPECT_EQ(g[1], 4.0f * coef);
}

TEST(AdamW, GradScaleIsClippingTheGradientFirst) {
  // adamw_step(..., grad_scale = coef) must be clip_grad_norm's in-place g *= coef followed by
  // the step, bit for bit, for AdamW and Adam (whose L2 term is added after clipping); the
  // gradient it reads stays as it was.
  for (const bool decoupled : {true, false}) {
    AdamWParams params;
    params.weight_decay = 0.1;
    params.decoupled_weight_decay = decoupled;
    const std::vector<float> g0 = hashed_tensor(2, 1000, 1, 3.0f);
    std::vector<float> p1 = hashed_tensor(2, 1000, 0, 1.0f), p2 = p1, m1(1000, 0.0f), v1(1000, 0.0f), m2 = m1,
                       v2 = v1;
    for (int64_t step = 1; step <= 3; ++step) {
      std::vector<float> clipped = g0, read = g0;
      clip_grad_norm({{clipped.data(), 1000}}, 1.0);
      const float coef = clip_coefficient(global_grad_norm({{g0.data(), 1000}}), 1.0);
      ASSERT_LT(coef, 1.0f);
      adamw_step(p1.data(), clipped.data(), m1.data(), v1.data(), 1000, params, step, 1e-2);
      adamw_step(p2.data(), read.data(), m2.data(), v2.data(), 1000, params, step, 1e-2, coef);
      EXPECT_EQ(read, g0);
    }
    EXPECT_EQ(p1, p2) << "decoupled " << decoupled;
    EXPECT_EQ(m1, m2) << "decoupled " << decoupled;
    EXPECT_EQ(v1, v2) << "decoupled " << decoupled;
  }
}

TEST(AdamW, ScalarFirstStepByHand) {
  // Step 1 from m = v = 0: m = (1-b1) g, v = (1-b2) g^2, bc1 = 1-b1, bc2 = 1-b2, so
  // m / bc1 = g and sqrt(v / bc2) = |g|: the update is lr * sign(g) (up to eps), after
  // decay p (1 - lr wd). With p = 1, g = 0.5, lr = 0.1, wd = 0.5: 0.95 - 0.1 = 0.85.
  float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
  AdamWParams params;
  params.weight_decay = 0.5;
  adamw_step(&p, &g, &m, &v, 1, params, 1, 0.1);
  EXPECT_NEAR(p, 0.85f, 1e-6f);
  EXPECT_NEAR(m, 0.05f, 1e-8f);
  EXPECT_NEAR(v, 0.00025f, 1e-10f);
}

}  // namespace
}  // namespace autosp::train
