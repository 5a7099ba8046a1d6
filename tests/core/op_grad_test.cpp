// A finite-difference gradient check for every differentiable op, through autodiff and the
// CPU executor. Backward ops (embedding_backward, rms_norm_backward, ...) are checked as
// the gradients of their forward ops; input, fill and count_valid have no gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <utility>

#include "frontend/tracer.h"
#include "testing/gradcheck.h"

namespace autosp {
namespace {

using testing::check_gradients;
using testing::Feed;

// n normal draws, each moved `margin` further from 0 (no draw within margin of it): inputs held
// away from a kink or a pole at 0, where finite differences would straddle it.
std::vector<float> away_from_zero(int64_t n, uint32_t seed, float margin) {
  std::vector<float> xs = testing::random_normal(n, seed);
  for (float& v : xs) v = v >= 0 ? v + margin : v - margin;
  return xs;
}

TEST(OpGrad, Add) {
  Tracer t;
  Tensor a = t.parameter("a", {3, 5}), b = t.parameter("b", {3, 5});
  t.output("y0", t.add(a, b));
  check_gradients(t.finish(), {});
}

TEST(OpGrad, AddSameOperandTwice) {
  Tracer t;
  Tensor a = t.parameter("a", {4});
  t.output("y0", t.add(a, a));  // the two uses' gradients are summed
  check_gradients(t.finish(), {});
}

TEST(OpGrad, Mul) {
  Tracer t;
  Tensor a = t.parameter("a", {2, 7}), b = t.parameter("b", {2, 7});
  t.output("y0", t.mul(a, b));
  check_gradients(t.finish(), {});
}

TEST(OpGrad, ScaleSumExpand) {
  Tracer t;
  Tensor a = t.parameter("a", {3, 4});
  t.output("y0", t.scale(a, -2.5));
  t.output("y1", t.sum(a));
  t.output("y2", t.scale(a, 0.5, 0.25));  // alpha x + beta
  check_gradients(t.finish(), {});
}

TEST(OpGrad, DivScalar) {
  Graph g;
  GraphBuilder b(g);
  ValueId x = g.add_input(Role::parameter, {DType::f32, {6}}, "x");
  ValueId s = g.add_input(Role::parameter, {DType::f32, {}}, "s");
  g.add_output("y0", b.emit1(OpKind::div_scalar, {x, s}));
  Feed feed;
  feed.f["s"] = {2.5f};  // away from 0, where x / s is smooth
  check_gradients(g, feed);
}

// a / b over divisors held away from 0 (|b| >= 0.5), where the quotient is smooth.
TEST(OpGrad, Div) {
  Tracer t;
  Tensor a = t.parameter("a", {3, 5}), b = t.parameter("b", {3, 5});
  t.output("y0", t.div(a, b));
  Feed feed;
  feed.f["b"] = away_from_zero(15, 4, 0.5f);
  check_gradients(t.finish(), feed);
}

// The 2-norm of each row of a matrix, and of a vector (a scalar), as DoRA's weight norm.
TEST(OpGrad, VectorNorm) {
  Tracer t;
  Tensor x = t.parameter("x", {4, 6}), v = t.parameter("v", {5});
  t.output("y0", t.vector_norm(x));
  t.output("y1", t.vector_norm(v));
  check_gradients(t.finish(), {});
}

// A row of zeros has norm 0 and gets no gradient (torch's subgradient there), the others theirs.
TEST(OpGrad, VectorNormOfAZeroRowPassesNoGradient) {
  Tracer t;
  Tensor x = t.parameter("x", {2, 3});
  t.output("y0", t.vector_norm(x));
  const Graph forward = t.finish();
  Graph joint = autodiff(testing::with_probe_loss(forward));
  Feed feed;
  feed.f["x"] = {0, 0, 0, 3, 0, -4};
  feed.f["r_y0"] = {2, 10};
  HeapAllocator alloc;
  CpuExecutor ex(joint, alloc);
  feed.bind(ex, joint);
  ex.run();
  EXPECT_EQ(ex.output_vector("y0"), (std::vector<float>{0, 5}));
  // d/dx 10 |x| = 10 x / |x| = (6, 0, -8)
  EXPECT_EQ(ex.output_vector(kGradPrefix + std::string("x")), (std::vector<float>{0, 0, 0, 6, 0, -8}));
}

// stop_gradient passes x on and no gradient back: y = a * stop_gradient(a a) has the gradient
// of a * c, c = a a held constant (c r), not that of a^3 (3 a^2 r). No finite difference
// can see this (it differentiates through); the gradient is checked against its formula.
TEST(OpGrad, StopGradientPassesTheValueAndNoGradient) {
  Tracer t;
  Tensor a = t.parameter("a", {2, 3});
  t.output("y0", t.mul(a, t.stop_gradient(t.mul(a, a))));
  const Graph forward = t.finish();
  Graph joint = autodiff(testing::with_probe_loss(forward));
  Feed feed;
  testing::fill_random(feed, joint, 3);
  HeapAllocator alloc;
  CpuExecutor ex(joint, alloc);
  feed.bind(ex, joint);
  ex.run();
  const std::vector<float> y = ex.output_vector("y0"), da = ex.output_vector(kGradPrefix + std::string("a"));
  const std::vector<float>&xs = feed.f.at("a"), &r = feed.f.at("r_y0");
  for (size_t k = 0; k < xs.size(); ++k) {
    EXPECT_EQ(y[k], xs[k] * (xs[k] * xs[k])) << k;
    EXPECT_EQ(da[k], r[k] * (xs[k] * xs[k])) << k;
  }
}

TEST(OpGrad, Expand) {
  Graph g;
  GraphBuilder b(g);
  ValueId x = g.add_input(Role::parameter, {DType::f32, {}}, "x");
  g.add_output("y0", b.emit1(OpKind::expand, {x}, {{"shape", Shape{2, 3}}}));
  check_gradients(g, {});
}

// x repeated over the leading dims of `like`: its gradient sums dy over the repetitions; `like`
// is read for its shape only, so the product's is x's whole gradient.
TEST(OpGrad, BroadcastOverLeadingDims) {
  Tracer t;
  Tensor w = t.parameter("w", {5}), v = t.parameter("v", {2, 5}), x = t.parameter("x", {3, 4, 5});
  t.output("y0", t.mul(t.broadcast(w, x, 2), x));  // a layer scale [H] times [.., H]
  t.output("y1", t.broadcast(v, x, 1));             // [3, 2, 5]
  check_gradients(t.finish(), {});
}

TEST(OpGrad, Linear) {
  Tracer t;
  Tensor x = t.parameter("x", {2, 3, 5}), w = t.parameter("w", {4, 5});
  t.output("y0", t.linear(x, w));
  check_gradients(t.finish(), {});
}

// With a bias (Qwen2's q, k, v projections): db = sum of dy over rows.
TEST(OpGrad, LinearWithBias) {
  Tracer t;
  Tensor x = t.parameter("x", {2, 3, 5}), w = t.parameter("w", {4, 5}), b = t.parameter("b", {4});
  t.output("y0", t.linear(x, w, b));
  check_gradients(t.finish(), {});
}

TEST(OpGrad, MatmulEveryTransposition) {
  for (int64_t ta : {0, 1})
    for (int64_t tb : {0, 1}) {
      SCOPED_TRACE(str("trans_a=", ta, " trans_b=", tb));
      const int64_t M = 3, N = 4, K = 5;
      Graph g;
      GraphBuilder b(g);
      ValueId a = g.add_input(Role::parameter, {DType::f32, ta ? Shape{K, M} : Shape{M, K}}, "a");
      ValueId c = g.add_input(Role::parameter, {DType::f32, tb ? Shape{N, K} : Shape{K, N}}, "b");
      g.add_output("y0", b.emit1(OpKind::matmul, {a, c}, {{"trans_a", ta}, {"trans_b", tb}}));
      check_gradients(g, {});
    }
}

TEST(OpGrad, MatmulBatchedA) {
  Graph g;
  GraphBuilder b(g);
  ValueId a = g.add_input(Role::parameter, {DType::f32, {2, 3, 5}}, "a");
  ValueId c = g.add_input(Role::parameter, {DType::f32, {4, 5}}, "b");
  g.add_output("y0", b.emit1(OpKind::matmul, {a, c}, {{"trans_b", int64_t{1}}}));
  check_gradients(g, {});
}

TEST(OpGrad, Silu) {
  Tracer t;
  Tensor x = t.parameter("x", {3, 9});
  t.output("y0", t.silu(x));
  check_gradients(t.finish(), {});
}

// x held at least 0.1 from the kink, where a central difference of step 1e-2 is exact; the
// squared relu (relu, then mul by itself) as the models use it.
TEST(OpGrad, ReluAndItsSquare) {
  Tracer t;
  Tensor x = t.parameter("x", {3, 9});
  Tensor r = t.relu(x);
  t.output("y0", r);
  t.output("y1", t.mul(r, r));
  Feed feed;
  feed.f["x"] = away_from_zero(27, 7, 0.1f);
  check_gradients(t.finish(), feed);
}

// clamp to [-1, 1] (DBRX's clip_qkv), and to a max alone: x held at least 0.1 from
// the bounds, as relu's from its kink; some of x on each side of each bound.
TEST(OpGrad, Clamp) {
  Tracer t;
  Tensor x = t.parameter("x", {3, 9});
  t.output("y0", t.clamp(x, -1.0, 1.0));
  t.output("y1", t.clamp(x, std::nullopt, 0.5));
  Feed feed;
  std::vector<float> xs = testing::random_normal(27, 8, 2.0f);
  for (float& v : xs)
    for (float bound : {-1.0f, 0.5f, 1.0f})
      if (std::abs(v - bound) < 0.1f) v = bound + (v >= bound ? 0.1f : -0.1f);
  feed.f["x"] = xs;
  check_gradients(t.finish(), feed);
}

// Gemma 2's final logit softcap as the importer builds it: c tanh(x / c), c = 2, over inputs
// that reach the saturating part (|x| up to ~6).
TEST(OpGrad, TanhAndTheLogitSoftcap) {
  Tracer t;
  Tensor x = t.parameter("x", {3, 9});
  t.output("y0", t.tanh(x));
  t.output("y1", t.scale(t.tanh(t.scale(x, 0.5)), 2.0));
  Feed feed;
  std::vector<float> xs = testing::random_normal(27, 9);
  for (float& v : xs) v *= 2.0f;
  feed.f["x"] = xs;
  check_gradients(t.finish(), feed);
}

// xIELU (Apertus) with its two learned scalars: x on both branches, held 0.05 from the kinks
// at 0 and at eps (-1e-6), where the finite difference would straddle them; alpha_p, alpha_n
// with their own gradients (sums over every element).
TEST(OpGrad, XieluAndItsScalars) {
  Tracer t;
  Tensor x = t.parameter("x", {3, 9});
  Tensor ap = t.parameter("alpha_p", {1}), an = t.parameter("alpha_n", {1});
  t.output("y0", t.xielu(x, ap, an, 0.5, -1e-6));
  Feed feed;
  std::vector<float> xs = testing::random_normal(27, 11);
  for (float& v : xs) v = 2.0f * v + (v >= 0 ? 0.05f : -0.05f);
  feed.f["x"] = xs;
  feed.f["alpha_p"] = {0.3f};
  feed.f["alpha_n"] = {-0.2f};
  check_gradients(t.finish(), feed);
}

// Router logits of T tokens over 5 experts: each row a permutation of 0, 0.6, 1.2 and 1.8, and
// -3 for expert 4, so that no step of the differences (at most 1e-2 x 1.8) changes a token's top 2
// and expert 4 is never chosen.
std::vector<float> spaced_logits(int64_t T) {
  std::vector<float> l;
  std::vector<int> order = {0, 1, 2, 3};
  for (int64_t r = 0; r < T; ++r) {
    std::next_permutation(order.begin(), order.end());
    for (int e = 0; e < 4; ++e) l.push_back(0.6f * float(order[e]));
    l.push_back(-3.0f);
  }
  return l;
}

// The sparse mixture-of-experts block: 5 experts, each token's top 2, with and without the
// normalisation of their weights. Each row's logits are a permutation of 0, 0.6, 1.2, 1.8 and
// -3 for expert 4, so no step of the differences (at most 1e-2 x 1.8) changes a token's
// experts, and expert 4, which no token chooses, must get zero gradients.
// And with the experts stacked as transformers 5 keeps them (gate_up [E, 2 I, H], down [E, H, I]),
// and stacked apart as DBRX does (gate, up and down [E, I, H], each expert's down transposed).
TEST(OpGrad, MixtureOfExperts) {
  for (int variant = 0; variant < 6; ++variant) {
    const bool stacked = variant >= 2 && variant < 4, apart = variant >= 4, normalize = variant % 2 == 1;
    SCOPED_TRACE(str(normalize ? "normalized" : "softmax weights", stacked ? ", stacked" : "", apart ? ", apart" : ""));
    const int64_t T = 6, H = 6, I = 5, E = 5;
    Tracer t;
    Tensor x = t.parameter("x", {2, T / 2, H}), logits = t.parameter("logits", {2, T / 2, E});
    std::vector<Tensor> experts;
    if (apart) {
      experts = {t.parameter("gate", {E, I, H}), t.parameter("up", {E, I, H}), t.parameter("down", {E, I, H})};
    } else if (stacked) {
      experts = {t.parameter("gate_up", {E, 2 * I, H}), t.parameter("down", {E, H, I})};
    } else {
      for (int64_t e = 0; e < E; ++e) {
        experts.push_back(t.parameter(str("gate", e), {I, H}));
        experts.push_back(t.parameter(str("up", e), {I, H}));
        experts.push_back(t.parameter(str("down", e), {H, I}));
      }
    }
    t.output("y0", t.moe(x, logits, experts, 2, normalize));
    Feed feed;
    feed.f["logits"] = spaced_logits(T);
    check_gradients(t.finish(), feed);
  }
}

// gpt-oss's experts (kernels/cpu/moe.h's MoeExperts): biases, gate and up interleaved, the
// clamped GLU. The clamps' kinks are where no difference crosses them: the limit is put in the
// middle of the widest gap between the data's gate products and |up products| (of each token's
// two experts) in their middle half, so that some of each lie on either side and none within a
// step's reach: half the gap, asserted above 0.04, where a step of 1e-2 in x, a weight or a
// bias moves a product by at most 0.03 (|x| < 3, |w| < 2).
TEST(OpGrad, MixtureOfGptOssExperts) {
  const int64_t T = 6, H = 5, I = 3, E = 5;
  Feed feed;
  feed.f["x"] = autosp::testing::random_normal(T * H, 11);
  feed.f["gate_up"] = autosp::testing::random_normal(E * H * 2 * I, 12, 0.5f);
  feed.f["gate_up_bias"] = autosp::testing::random_normal(E * 2 * I, 13, 0.5f);
  feed.f["down"] = autosp::testing::random_normal(E * I * H, 14);
  feed.f["down_bias"] = autosp::testing::random_normal(E * H, 15);
  const std::vector<float> l = spaced_logits(T);  // as MixtureOfExperts'
  feed.f["logits"] = l;
  std::vector<double> kinks;  // g and |u| of every token and expert
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) {
      if (l[t * E + e] < 0.6f * 2) continue;  // not one of the token's two
      for (int64_t c = 0; c < 2 * I; ++c) {
        double v = feed.f["gate_up_bias"][e * 2 * I + c];
        for (int64_t h = 0; h < H; ++h) v += double(feed.f["x"][t * H + h]) * feed.f["gate_up"][(e * H + h) * 2 * I + c];
        kinks.push_back(c % 2 == 0 ? v : std::abs(v));
      }
    }
  std::sort(kinks.begin(), kinks.end());
  double limit = 0, gap = 0;
  for (size_t i = kinks.size() / 4; i < 3 * kinks.size() / 4; ++i)
    if (kinks[i + 1] - kinks[i] > gap) gap = kinks[i + 1] - kinks[i], limit = 0.5 * (kinks[i] + kinks[i + 1]);
  ASSERT_EQ(kinks.size(), size_t(T * 2 * 2 * I));
  ASSERT_GT(gap / 2, 0.04) << "the data leave no room for the limit away from the kinks";
  for (double alpha : {1.702, 0.5}) {
    SCOPED_TRACE(str("alpha ", alpha, ", limit ", limit));
    Tracer t;
    Tensor x = t.parameter("x", {2, T / 2, H}), logits = t.parameter("logits", {2, T / 2, E});
    std::vector<Tensor> experts = {t.parameter("gate_up", {E, H, 2 * I}), t.parameter("gate_up_bias", {E, 2 * I}),
                                   t.parameter("down", {E, I, H}), t.parameter("down_bias", {E, H})};
    t.output("y0", t.moe(x, logits, experts, 2, true,
                         {{"experts", std::string("gpt_oss")}, {"alpha", alpha}, {"limit", limit}}));
    check_gradients(t.finish(), feed);
  }
}

// E SwiGLU experts' gate, up [I, H] and down [H, I] parameters ("gate0", "up0", "down0", ...) in
// turn, the moe op's listed form, and their values (normal, x 0.5) in the feed from seed + 1 on.
std::vector<Tensor> listed_experts(Tracer& t, Feed& feed, int64_t E, int64_t H, int64_t I, uint32_t seed) {
  std::vector<Tensor> experts;
  for (int64_t e = 0; e < E; ++e)
    for (const char* m : {"gate", "up", "down"}) {
      const std::string name = str(m, e);
      experts.push_back(t.parameter(name, m[0] == 'd' ? Shape{H, I} : Shape{I, H}));
      feed.f[name] = autosp::testing::random_normal(I * H, seed + uint32_t(experts.size()), 0.5f);
    }
  return experts;
}

// Llama 4's experts (gate_up [E, H, 2 I]: the gate's columns, then the up's; down [E, I, H]) with
// its sigmoid router weighting each expert's input, top 1 and top 2; and the input weighted on
// the listed SwiGLU experts too. The weights' gradient is then <dx_j, x>, through every product.
TEST(OpGrad, MixtureOfLlama4ExpertsWeightingTheirInput) {
  const int64_t T = 6, H = 5, I = 3, E = 5;
  Feed feed;
  feed.f["x"] = autosp::testing::random_normal(T * H, 21);
  feed.f["gate_up"] = autosp::testing::random_normal(E * H * 2 * I, 22, 0.5f);
  feed.f["down"] = autosp::testing::random_normal(E * I * H, 23);
  feed.f["logits"] = spaced_logits(T);  // as MixtureOfExperts'
  const Attrs llama4 = {{"experts", std::string("llama4")}, {"weight_input", int64_t{1}},
                        {"score", std::string("sigmoid")}};
  for (int64_t k : {1, 2}) {
    SCOPED_TRACE(str("llama4, top ", k));
    Tracer t;
    Tensor x = t.parameter("x", {2, T / 2, H}), logits = t.parameter("logits", {2, T / 2, E});
    t.output("y0", t.moe(x, logits, {t.parameter("gate_up", {E, H, 2 * I}), t.parameter("down", {E, I, H})}, k, false,
                         llama4));
    check_gradients(t.finish(), feed);
  }
  SCOPED_TRACE("listed SwiGLU experts, input weighted");
  Feed listed;
  listed.f["x"] = feed.f["x"];
  listed.f["logits"] = feed.f["logits"];
  Tracer t;
  Tensor x = t.parameter("x", {T, H}), logits = t.parameter("logits", {T, E});
  const std::vector<Tensor> experts = listed_experts(t, listed, E, H, I, 30);
  t.output("y0", t.moe(x, logits, experts, 2, true, {{"weight_input", int64_t{1}}}));
  check_gradients(t.finish(), listed);
}

// LongCat-Flash's zero-computation experts: of the 5 experts the logits score, the last 2 are
// identities (expert 3 chosen by some tokens, expert 4 by none), beside 3 computed ones, listed
// (softmax, scaled, unnormalised, as LongCat-Flash) and Llama 4's fused ones weighting their input.
TEST(OpGrad, MixtureOfExpertsWithZeroExperts) {
  const int64_t T = 6, H = 5, I = 3, E = 5, Z = 2;
  Feed feed;
  feed.f["x"] = autosp::testing::random_normal(T * H, 41);
  feed.f["logits"] = spaced_logits(T);  // as MixtureOfExperts'
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "llama4 experts, input weighted" : "listed experts");
    Tracer t;
    Tensor x = t.parameter("x", {T, H}), logits = t.parameter("logits", {T, E});
    std::vector<Tensor> experts;
    Attrs attrs{{"zero_experts", Z}, {"scale", 2.0}};
    if (fused) {
      experts = {t.parameter("gate_up", {E - Z, H, 2 * I}), t.parameter("down", {E - Z, I, H})};
      feed.f["gate_up"] = autosp::testing::random_normal((E - Z) * H * 2 * I, 42, 0.5f);
      attrs.set("experts", std::string("llama4"));
      attrs.set("weight_input", int64_t{1});
    } else {
      experts = listed_experts(t, feed, E - Z, H, I, 50);
    }
    t.output("y0", t.moe(x, logits, experts, 2, false, attrs));
    check_gradients(t.finish(), feed);
  }
}

// The load-balancing statistics of two layers' router logits: the counts (row 0) have no
// gradient (nor do their finite differences: the logits are spaced so no step changes a row's top
// 2), the probability sums (row 1) the softmax's.
// The routers beyond softmax top-k (kernels/cpu/moe.h's MoeRouting), 6 experts, top 2: DeepSeek-V2's
// (softmax, groups of 3 scored by their best, one kept, weights times 2.5) and V3's and GLM-4.5's
// (sigmoid, a correction bias for the choice, groups of 2 scored by their two best, 2 of 3 kept,
// weights normalised with norm_eps and times 2.5), a plain sigmoid one, and softmax normalised
// times 2.5. Each row's logits are a permutation of the logits of sigmoid scores 0.03 x 2^i, whose
// pair sums differ by 0.03 or more, so no step of the differences (and no bias, at most 0.004)
// changes a choice of groups or experts; the weights and gradients are the uncorrected scores'.
TEST(OpGrad, MixtureOfExpertsRouters) {
  const std::vector<std::pair<const char*, Attrs>> routers = {
      {"deepseek-v2", {{"groups", int64_t{2}}, {"topk_group", int64_t{1}}, {"scale", 2.5}}},
      {"deepseek-v3", {{"score", std::string("sigmoid")}, {"groups", int64_t{3}}, {"topk_group", int64_t{2}},
                       {"group_score", std::string("top2")}, {"scale", 2.5}, {"norm_eps", 1e-20},
                       {"bias", std::vector<double>{0.004, -0.003, 0.002, 0.0, -0.004, 0.001}}}},
      {"sigmoid", {{"score", std::string("sigmoid")}}},
      {"softmax scaled", {{"scale", 2.5}}}};
  for (const auto& [name, routing] : routers)
    for (const bool normalize : {false, true}) {
      SCOPED_TRACE(str(name, normalize ? ", normalized" : ""));
      const int64_t T = 6, H = 5, I = 4, E = 6;
      Tracer t;
      Tensor x = t.parameter("x", {2, T / 2, H}), logits = t.parameter("logits", {2, T / 2, E});
      std::vector<Tensor> experts = {t.parameter("gate_up", {E, 2 * I, H}), t.parameter("down", {E, H, I})};
      t.output("y0", t.moe(x, logits, experts, 2, normalize, routing));
      Feed feed;
      std::vector<float> l;
      std::vector<int> order = {0, 1, 2, 3, 4, 5};
      for (int64_t r = 0; r < T; ++r) {
        for (int shuffle = 0; shuffle <= r * 7; ++shuffle) std::next_permutation(order.begin(), order.end());
        for (int e = 0; e < 6; ++e) {
          const double score = 0.03 * double(1 << order[e]);
          l.push_back(float(std::log(score / (1 - score))));
        }
      }
      feed.f["logits"] = l;
      check_gradients(t.finish(), feed);
    }
}

TEST(OpGrad, MoeBalanceStatistics) {
  Tracer t;
  Tensor a = t.parameter("a", {2, 3, 4}), b = t.parameter("b", {2, 3, 4});
  t.output("y0", t.moe_balance({a, b}, 2));
  Feed feed;
  std::vector<int> order = {0, 1, 2, 3};
  for (const char* name : {"a", "b"}) {
    std::vector<float> l;
    for (int r = 0; r < 6; ++r) {
      std::next_permutation(order.begin(), order.end());
      for (int e = 0; e < 4; ++e) l.push_back(0.6f * float(order[e]));
    }
    feed.f[name] = l;
  }
  check_gradients(t.finish(), feed);
}

TEST(OpGrad, Swiglu) {
  Tracer t;
  Tensor g = t.parameter("gate", {2, 11}), u = t.parameter("up", {2, 11});
  t.output("y0", t.swiglu(g, u));
  check_gradients(t.finish(), {});
}

TEST(OpGrad, Embedding) {
  Tracer t;
  Tensor w = t.parameter("w", {7, 4});
  Tensor tok = t.input(Role::tokens, "tokens", DType::i32, {2, 5});
  t.output("y0", t.embedding(w, tok));
  Feed feed;
  feed.i["tokens"] = {0, 3, 3, 6, 1, 3, 2, 0, 6, 6};  // repeats: the backward scatter-adds
  check_gradients(t.finish(), feed);
}

// torch's padding_idx: the padding row's gradient is zero, every other row's is the plain
// embedding's (checked by finite differences above), bit for bit.
TEST(OpGrad, EmbeddingPaddingIdxZeroesThatRowOnly) {
  std::map<bool, std::vector<float>> grads;
  for (const bool padded : {false, true}) {
    Tracer t;
    Tensor w = t.parameter("w", {7, 4});
    Tensor tok = t.input(Role::tokens, "tokens", DType::i32, {2, 5});
    t.output("y0", padded ? t.embedding(w, tok, 3) : t.embedding(w, tok));
    const Graph forward = t.finish();
    Graph joint = autodiff(testing::with_probe_loss(forward));
    Feed feed;
    feed.i["tokens"] = {0, 3, 3, 6, 1, 3, 2, 0, 6, 6};
    testing::fill_random(feed, joint, 1);
    HeapAllocator alloc;
    CpuExecutor ex(joint, alloc);
    feed.bind(ex, joint);
    ex.run();
    grads[padded] = ex.output_vector(kGradPrefix + std::string("w"));
  }
  for (int64_t v = 0; v < 7; ++v)
    for (int64_t h = 0; h < 4; ++h) {
      const size_t k = size_t(v * 4 + h);
      if (v == 3) {
        EXPECT_EQ(grads[true][k], 0.0f) << "row 3, the padding row";
        EXPECT_NE(grads[false][k], 0.0f);  // token 3 is read: the plain gradient is not zero
      } else {
        EXPECT_EQ(grads[true][k], grads[false][k]) << "row " << v;
      }
    }
}

TEST(OpGrad, RmsNorm) {
  Tracer t;
  Tensor x = t.parameter("x", {2, 3, 8}), w = t.parameter("w", {8});
  t.output("y0", t.rms_norm(x, w, 1e-5));
  check_gradients(t.finish(), {});
}

TEST(OpGrad, LayerNorm) {
  Tracer t;
  Tensor x = t.parameter("x", {2, 3, 8}), w = t.parameter("w", {8}), b = t.parameter("b", {8});
  t.output("y0", t.layer_norm(x, w, b, 1e-5));
  check_gradients(t.finish(), {});
}

TEST(OpGrad, GeluErfAndTanh) {
  for (bool tanh_approximation : {false, true}) {
    SCOPED_TRACE(tanh_approximation ? "tanh" : "none");
    Tracer t;
    Tensor x = t.parameter("x", {3, 9});
    t.output("y0", t.gelu(x, tanh_approximation));
    check_gradients(t.finish(), {});
  }
}

TEST(OpGrad, RopeDefaultLinearLlama3AndYarn) {
  for (const char* type : {"default", "linear", "llama3", "yarn"}) {
    SCOPED_TRACE(type);
    Tracer t;
    Tensor x = t.parameter("x", {2, 3, 2, 8});
    Tensor pos = t.input(Role::positions, "positions", DType::i32, {2, 3});
    RopeOptions o;
    o.theta = 500000.0;
    if (std::string(type) == "llama3") {
      o.rope_type = "llama3";
      o.factor = 8.0;
      o.original_max_position_embeddings = 16;  // small, so every frequency band is used
    }
    if (std::string(type) == "linear") {
      o.rope_type = "linear";
      o.factor = 4.0;
    }
    if (std::string(type) == "yarn") {  // the ramp over D/2 = 4 frequencies: some on each side
      o.rope_type = "yarn";
      o.factor = 8.0;
      o.original_max_position_embeddings = 64;
      o.beta_fast = 16.0;
      o.beta_slow = 2.0;
    }
    t.output("y0", t.rope(x, pos, o));
    Feed feed;
    feed.i["positions"] = {0, 1, 2, 5, 17, 1000};
    check_gradients(t.finish(), feed);
  }
}

// The frequencies given as they are (longrope's per-dimension factors), rotate-half and
// interleaved.
TEST(OpGrad, RopeOfGivenFrequencies) {
  for (bool interleaved : {false, true}) {
    SCOPED_TRACE(interleaved ? "interleaved" : "rotate-half");
    Tracer t;
    Tensor x = t.parameter("x", {2, 3, 2, 8});
    Tensor pos = t.input(Role::positions, "positions", DType::i32, {2, 3});
    RopeOptions o;
    o.rope_type = "frequencies";
    o.inv_freq = {0.8, 0.31, 0.0125, 3.5e-4};
    o.interleaved = interleaved;
    t.output("y0", t.rope(x, pos, o));
    Feed feed;
    feed.i["positions"] = {0, 1, 2, 5, 17, 1000};
    check_gradients(t.finish(), feed);
  }
}

// The interleaved pairs (2i, 2i + 1), GPT-J's layout.
TEST(OpGrad, RopeInterleaved) {
  Tracer t;
  Tensor x = t.parameter("x", {2, 3, 2, 8});
  Tensor pos = t.input(Role::positions, "positions", DType::i32, {2, 3});
  RopeOptions o;
  o.interleaved = true;
  t.output("y0", t.rope(x, pos, o));
  Feed feed;
  feed.i["positions"] = {0, 1, 2, 5, 17, 1000};
  check_gradients(t.finish(), feed);
}

TEST(OpGrad, AttentionCausalGqa) {
  for (bool causal : {true, false})
    for (int64_t nkv : {1, 2, 4}) {
      SCOPED_TRACE(str("causal=", causal, " NKV=", nkv));
      const int64_t B = 2, S = 5, NH = 4, D = 4;
      Tracer t;
      Tensor q = t.parameter("q", {B, S, NH, D});
      Tensor k = t.parameter("k", {B, S, nkv, D});
      Tensor v = t.parameter("v", {B, S, nkv, D});
      t.output("y0", t.attention(q, k, v, causal, 1.0 / std::sqrt(double(D))));
      check_gradients(t.finish(), {});
    }
}

// Values of their own head dim Dv (DeepSeek-V3's latent attention), narrower and wider than
// q's and k's D: out and dv are [.., Dv].
TEST(OpGrad, AttentionWithValuesOfTheirOwnHeadDim) {
  for (int64_t dv : {2, 6})
    for (int64_t nkv : {1, 4}) {
      SCOPED_TRACE(str("Dv=", dv, " NKV=", nkv));
      const int64_t B = 2, S = 5, NH = 4, D = 4;
      Tracer t;
      Tensor q = t.parameter("q", {B, S, NH, D});
      Tensor k = t.parameter("k", {B, S, nkv, D});
      Tensor v = t.parameter("v", {B, S, nkv, dv});
      t.output("y0", t.attention(q, k, v, true, 1.0 / std::sqrt(double(D))));
      check_gradients(t.finish(), {});
    }
}

// gpt-oss's attention sinks: a learned logit per query head in each row's softmax; the
// gradient reaches q, k, v and the sinks, with documents and a window too.
TEST(OpGrad, AttentionWithSinks) {
  for (bool causal : {true, false})
    for (bool packed : {false, true}) {
      SCOPED_TRACE(str("causal=", causal, " packed=", packed));
      const int64_t B = 2, S = 6, NH = 4, NKV = 2, D = 4;
      Tracer t;
      Tensor q = t.parameter("q", {B, S, NH, D});
      Tensor k = t.parameter("k", {B, S, NKV, D});
      Tensor v = t.parameter("v", {B, S, NKV, D});
      Tensor sinks = t.parameter("sinks", {NH});
      std::optional<Tensor> docs;
      if (packed) docs = t.input(Role::documents, "documents", DType::i32, {B, S});
      t.output("y0", t.attention(q, k, v, docs, sinks, causal, 1.0 / std::sqrt(double(D)), causal ? 3 : 0, 0, {}));
      Feed feed;
      if (packed) feed.i["documents"] = {0, 0, 0, 1, 1, 2, 0, 1, 1, 1, 1, 1};
      check_gradients(t.finish(), feed);
    }
}

// Packed samples: document ids keep each query within its document. S = 70 puts a boundary
// on the 64-row tile edge and others inside tiles, and has one-token documents.
TEST(OpGrad, AttentionWithDocuments) {
  for (bool causal : {true, false})
    for (auto [S, nkv, ids] : {std::tuple<int64_t, int64_t, std::vector<int32_t>>{9, 2, {0, 0, 0, 1, 2, 2, 2, 2, 3}},
                               {70, 1, {}}}) {
      SCOPED_TRACE(str("causal=", causal, " S=", S));
      const int64_t B = 2, NH = 2, D = 4;
      Tracer t;
      Tensor q = t.parameter("q", {B, S, NH, D});
      Tensor k = t.parameter("k", {B, S, nkv, D});
      Tensor v = t.parameter("v", {B, S, nkv, D});
      Tensor docs = t.input(Role::documents, "documents", DType::i32, {B, S});
      t.output("y0", t.attention(q, k, v, docs, causal, 1.0 / std::sqrt(double(D))));
      Feed feed;
      if (ids.empty())  // row 0: boundaries at 1, 30 and 64; row 1: at 63 and 64
        for (int64_t b = 0; b < B; ++b)
          for (int64_t i = 0; i < S; ++i)
            ids.push_back(b == 0 ? (i >= 1) + (i >= 30) + (i >= 64) : (i >= 63) + (i >= 64));
      else
        ids.insert(ids.end(), ids.begin(), ids.end());
      feed.i["documents"] = ids;
      check_gradients(t.finish(), feed);
    }
}

// The finite-difference check of one attention: q, k, v of [B, S, NH or NKV, D = 4], causal or
// full, a window (0: none), document ids (packed: rows of 3 and 2 documents) and a softcap (0:
// none). S > 64 spans several key and query tiles (and the window's skipped ones); one
// sequence and one KV group keep its finite differences to a few seconds (42 s with B 2, NH 4).
void check_attention_gradients(int64_t S, bool causal, int64_t window, bool packed, double softcap,
                               const std::vector<double>& alibi = {}) {
  SCOPED_TRACE(str("S=", S, causal ? " causal" : " full", " window=", window, packed ? " packed" : "",
                   " softcap=", softcap, alibi.empty() ? "" : " alibi"));
  const int64_t B = S > 64 ? 1 : 2, NH = S > 64 ? 2 : 4, NKV = S > 64 ? 1 : 2, D = 4;
  Tracer t;
  Tensor q = t.parameter("q", {B, S, NH, D});
  Tensor k = t.parameter("k", {B, S, NKV, D});
  Tensor v = t.parameter("v", {B, S, NKV, D});
  const double scale = 1.0 / std::sqrt(double(D));
  Feed feed;
  if (packed) {
    Tensor docs = t.input(Role::documents, "documents", DType::i32, {B, S});
    t.output("y0", t.attention(q, k, v, docs, causal, scale, window, softcap, alibi));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < S; ++i) feed.i["documents"].push_back(int32_t(i >= S / 3) + int32_t(b && i >= S / 2));
  } else {
    t.output("y0", t.attention(q, k, v, causal, scale, window, softcap, alibi));
  }
  check_gradients(t.finish(), feed);
}

// Gemma 2's logit softcap c tanh(s / c): a cap of 0.5 bends every score of these inputs, full
// and causal, with GQA, a window and documents; S = 70 spans the kernels' tiles.
TEST(OpGrad, AttentionWithSoftcap) {
  for (auto [S, causal, window, packed] : {std::tuple<int64_t, bool, int64_t, bool>{5, false, 0, false},
                                           {5, true, 0, false}, {9, true, 3, false}, {9, true, 0, true},
                                           {70, true, 20, false}})
    check_attention_gradients(S, causal, window, packed, 0.5);
}

// ALiBi (BLOOM, MPT): slopes 1 and 1/4 per query head (2 or 4 heads: the steep ones make
// the bias dominate the scores), full and causal, with a window and documents; S = 70 spans
// the kernels' tiles. The bias is a constant: its gradient paths are the plain ones, so this
// checks that both directions add the same bias (a backward without it gives P wrong).
TEST(OpGrad, AttentionWithAlibi) {
  for (auto [S, causal, window, packed] : {std::tuple<int64_t, bool, int64_t, bool>{5, false, 0, false},
                                           {5, true, 0, false}, {9, true, 3, false}, {9, true, 0, true},
                                           {70, true, 20, false}}) {
    const int64_t NH = S > 64 ? 2 : 4;
    std::vector<double> slopes = {1.0, 0.25, 0.5, 0.125};
    slopes.resize(NH);
    check_attention_gradients(S, causal, window, packed, 0.0, slopes);
  }
}

// A sliding window (Mistral): windows of 1, 3 and longer than S = 9; with documents too.
// S = 70 with W = 20 has tiles wholly outside the window and tiles across its edge.
TEST(OpGrad, AttentionWithSlidingWindow) {
  for (auto [S, window] : {std::pair<int64_t, int64_t>{9, 1}, {9, 3}, {9, 12}, {70, 20}})
    for (bool packed : {false, true}) check_attention_gradients(S, true, window, packed, 0.0);
}

TEST(OpGrad, CrossEntropyMeanWithIgnoredLabels) {
  Tracer t;
  Tensor logits = t.parameter("logits", {2, 3, 6});
  Tensor labels = t.input(Role::labels, "labels", DType::i32, {2, 3});
  t.output("y0", t.cross_entropy(logits, labels));
  Feed feed;
  feed.i["labels"] = {0, 5, -100, 2, 2, -100};
  check_gradients(t.finish(), feed);
}

// mean = linear_cross_entropy(x, w, labels)[0] / count_valid(labels), as Tracer builds it
// but with the op's attributes given (a chunk of a few rows; the default is one chunk here).
Graph linear_cross_entropy_mean(const Shape& x_shape, int64_t V, const Attrs& attrs) {
  Graph g;
  GraphBuilder b(g);
  ValueId x = g.add_input(Role::parameter, {DType::f32, x_shape}, "x");
  ValueId w = g.add_input(Role::parameter, {DType::f32, {V, x_shape.back()}}, "w");
  ValueId labels = g.add_input(Role::labels, {DType::i32, Shape(x_shape.begin(), x_shape.end() - 1)},
                               "labels");
  auto outs = b.emit(OpKind::linear_cross_entropy, {x, w, labels}, attrs);
  ValueId count = b.emit1(OpKind::count_valid, {labels}, {{"ignore_index", int64_t{-100}}});
  g.add_output("y0", b.emit1(OpKind::div_scalar, {outs[0], count}));
  g.add_output("lse", outs[1]);
  return g;
}

// The loss "y0", "lse" and the gradients of x and w of a linear + cross-entropy forward graph
// (fused or not), from its joint graph on the CPU.
std::map<std::string, std::vector<float>> run_head(const Graph& forward, Feed& feed) {
  Graph joint = autodiff(forward, {.loss = "y0"});
  verify(joint);
  HeapAllocator alloc;
  CpuExecutor ex(joint, alloc);
  feed.bind(ex, joint);
  ex.run();
  std::map<std::string, std::vector<float>> out;
  for (const char* name : {"y0", "lse", "grad:x", "grad:w"}) out[name] = ex.output_vector(name);
  return out;
}

// max |got - want| and max |want| of one output.
std::pair<double, double> max_error(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, scale = 0;
  for (size_t k = 0; k < want.size(); ++k) {
    err = std::max(err, std::abs(double(got[k]) - double(want[k])));
    scale = std::max(scale, std::abs(double(want[k])));
  }
  return {err, scale};
}

TEST(OpGrad, LinearCrossEntropyChunkedWithIgnoredLabels) {
  // T = 9 rows in chunks of 2: a short last chunk, and rows 2-3 a chunk with no label
  // (whose backward skips its gemms).
  Graph g = linear_cross_entropy_mean({3, 3, 4}, 7, {{"ignore_index", int64_t{-100}}, {"chunk", int64_t{2}}});
  Feed feed;
  feed.i["labels"] = {0, 6, -100, -100, 3, 3, 6, -100, 1};
  check_gradients(g, feed);  // the default tolerances; observed worst error: 0.3% of the bound
}

// Gemma 2's final logit softcap on the fused head: c = 1.5 bends logits of these inputs (up to
// ~4) hard; chunks of 2 with ignored rows, as above.
TEST(OpGrad, LinearCrossEntropyWithSoftcap) {
  Graph g = linear_cross_entropy_mean(
      {3, 3, 4}, 7, {{"ignore_index", int64_t{-100}}, {"chunk", int64_t{2}}, {"softcap", 1.5}});
  Feed feed;
  feed.i["labels"] = {0, 6, -100, -100, 3, 3, 6, -100, 1};
  check_gradients(g, feed);
}

// linear then cross_entropy, unfused, mean over labelled rows, as linear_cross_entropy_mean but
// with the [B, S, V] logits made; with a softcap c > 0 written out between them: scale by 1 / c,
// tanh, scale by c.
Graph linear_then_cross_entropy(int64_t B, int64_t S, int64_t H, int64_t V, double softcap = 0) {
  Graph g;
  GraphBuilder b(g);
  ValueId x = g.add_input(Role::parameter, {DType::f32, {B, S, H}}, "x");
  ValueId w = g.add_input(Role::parameter, {DType::f32, {V, H}}, "w");
  ValueId labels = g.add_input(Role::labels, {DType::i32, {B, S}}, "labels");
  Attrs attrs{{"ignore_index", int64_t{-100}}};
  ValueId logits = b.emit1(OpKind::linear, {x, w});
  if (softcap > 0) {
    ValueId t = b.emit1(OpKind::tanh, {b.emit1(OpKind::scale, {logits}, {{"alpha", 1.0 / softcap}})});
    logits = b.emit1(OpKind::scale, {t}, {{"alpha", softcap}});
  }
  auto outs = b.emit(OpKind::cross_entropy, {logits, labels}, attrs);
  ValueId count = b.emit1(OpKind::count_valid, {labels}, attrs);
  g.add_output("y0", b.emit1(OpKind::div_scalar, {outs[0], count}));
  g.add_output("lse", outs[1]);
  return g;
}

// The capped head fused equals the cap written out (linear, scale by 1 / c, tanh, scale by c,
// cross_entropy) to fp32 rounding: the fused row passes take tanh from simd::vtanh (a few ulp),
// the tanh op from std::tanh. Observed at most 4e-7 of the largest value (loss, lse, gradients).
TEST(OpGrad, LinearCrossEntropySoftcapEqualsTheCapWrittenOut) {
  const int64_t B = 2, S = 37, H = 16, V = 50;
  const double cap = 3.0;
  const Graph unfused = linear_then_cross_entropy(B, S, H, V, cap);
  Feed feed;
  for (int64_t i = 0; i < B * S; ++i) feed.i["labels"].push_back(i % 5 == 3 ? -100 : int32_t(i * 17 % V));
  testing::fill_random(feed, unfused, 3);  // logits of std 4: most of them capped hard
  auto run = [&](const Graph& forward) { return run_head(forward, feed); };
  auto want = run(unfused);
  for (int64_t chunk : {int64_t{0}, int64_t{8}}) {
    Attrs attrs{{"ignore_index", int64_t{-100}}, {"softcap", cap}};
    if (chunk) attrs.set("chunk", chunk);
    auto got = run(linear_cross_entropy_mean({B, S, H}, V, attrs));
    for (const auto& [name, w] : want) {
      const auto [err, scale] = max_error(got[name], w);
      std::printf("softcap chunk=%lld %-6s max |fused - written out| = %.3g (max %.3g)\n", (long long)chunk,
                  name.c_str(), err, scale);
      EXPECT_LT(err, 1e-5 * scale) << name << ", chunk " << chunk;
    }
  }
}

// The same loss, lse and gradients as linear then cross_entropy, for the default chunk
// (one chunk here), chunks of one row, and chunks that do not divide T.
TEST(OpGrad, LinearCrossEntropyEqualsLinearThenCrossEntropy) {
  const int64_t B = 2, S = 37, H = 16, V = 50;
  const Graph unfused = linear_then_cross_entropy(B, S, H, V);
  Feed feed;
  for (int64_t i = 0; i < B * S; ++i) feed.i["labels"].push_back(i % 5 == 3 ? -100 : int32_t(i * 17 % V));
  // Unit-variance x and w: logits of std 4, a softmax far from uniform.
  testing::fill_random(feed, unfused, 3);

  auto run = [&](const Graph& forward) { return run_head(forward, feed); };
  auto want = run(unfused);
  for (int64_t chunk : {int64_t{0}, int64_t{1}, int64_t{8}}) {
    SCOPED_TRACE(str("chunk=", chunk));
    Attrs attrs{{"ignore_index", int64_t{-100}}};
    if (chunk) attrs.set("chunk", chunk);
    auto got = run(linear_cross_entropy_mean({B, S, H}, V, attrs));
    for (const auto& [name, w] : want) {
      const auto [err, scale] = max_error(got[name], w);
      std::printf("linear_cross_entropy chunk=%lld %-6s max |fused - unfused| = %.3g (max |unfused| %.3g)\n",
                  (long long)chunk, name.c_str(), err, scale);
      // Both paths do the same row maths on logits from gemms of the same operands; what
      // differs is the gemms' row counts and dW's summation over chunks. cpu::gemm makes
      // each element one FMA chain over K whatever the rows, and dW's accumulating gemm
      // continues each element's chain from chunk to chunk (kernels/cpu/gemm.h), so every
      // output is bitwise the unfused one's. (Under OpenBLAS, before issue 25's own gemm:
      // lse 2 ulp, gradients ~5e-7 of the largest.)
      EXPECT_EQ(err, 0.0) << name << " (scale " << scale << ")";
    }
  }
}

TEST(OpGrad, ReshapeTranspose) {
  Tracer t;
  Tensor x = t.parameter("x", {2, 3, 4});
  t.output("y0", t.transpose(t.reshape(x, {6, 2, 2}), {2, 0, 1}));
  check_gradients(t.finish(), {});
}

TEST(OpGrad, SliceConcat) {
  Tracer t;
  Tensor a = t.parameter("a", {2, 5, 3}), b = t.parameter("b", {2, 2, 3});
  Tensor s = t.slice(a, 1, 1, 4);
  t.output("y0", t.concat({b, s, b}, 1));
  t.output("y1", t.slice(a, 2, 0, 1));
  check_gradients(t.finish(), {});
}

}  // namespace
}  // namespace autosp
