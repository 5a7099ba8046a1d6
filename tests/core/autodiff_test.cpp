// autodiff: the golden joint graph of a small transformer, its invariants, and the whole
// model's gradients against finite differences.
#include <gtest/gtest.h>

#include "ops/op.h"
#include "passes/autodiff.h"
#include "testing/golden.h"
#include "testing/gradcheck.h"
#include "testing/tiny_block.h"

namespace autosp {
namespace {

TEST(Autodiff, GoldenTinyTransformer) {
  Graph joint = autodiff(testing::tiny_transformer());
  verify(joint);
  testing::expect_golden(print_graph(joint), "autodiff_tiny_transformer.ir");
}

TEST(Autodiff, KeepsTheForwardGraphAsItsPrefix) {
  Graph forward = testing::tiny_transformer();
  Graph joint = autodiff(forward);
  ASSERT_GT(joint.nodes().size(), forward.nodes().size());
  for (size_t n = 0; n < forward.nodes().size(); ++n) {
    EXPECT_EQ(joint.node(n).op, forward.node(n).op);
    EXPECT_EQ(joint.node(n).inputs, forward.node(n).inputs);
  }
  EXPECT_EQ(joint.outputs()[0].name, "loss");
}

TEST(Autodiff, OneGradientPerParameterAndNoneForIntegerInputs) {
  Graph forward = testing::tiny_transformer();
  Graph joint = autodiff(forward);
  auto params = forward.inputs_with_role(Role::parameter);
  ASSERT_EQ(joint.outputs().size(), 1 + params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(joint.outputs()[1 + i].name, kGradPrefix + forward.value(params[i]).name);
    EXPECT_EQ(joint.type(joint.outputs()[1 + i].value), forward.type(params[i]));
  }
}

TEST(Autodiff, BuildsNoUnusedGradients) {
  // y = linear(x, w) + 0 * frozen path: x is a constant, so no dx may be built; the
  // parameter u that the loss does not depend on gets zeros, not a backward chain.
  Tracer t;
  Tensor x = t.input(Role::constant, "x", DType::f32, {3, 4});
  Tensor w = t.parameter("w", {2, 4});
  Tensor u = t.parameter("u", {2, 4});
  t.output("unused", t.silu(u));
  t.output("loss", t.sum(t.linear(x, w)));
  Graph joint = autodiff(t.finish());
  int matmuls = 0, silu_backwards = 0;
  for (const Node& n : joint.nodes()) {
    matmuls += n.op == OpKind::matmul;
    silu_backwards += n.op == OpKind::silu_backward;
  }
  EXPECT_EQ(matmuls, 1) << "only dW = dy^T x:\n" << print_graph(joint);
  EXPECT_EQ(silu_backwards, 0) << print_graph(joint);
  const Node& du = joint.node(joint.value(joint.output("grad:u")).producer);
  EXPECT_EQ(du.op, OpKind::fill);
}

TEST(Autodiff, RejectsANonScalarLoss) {
  Tracer t;
  Tensor w = t.parameter("w", {2});
  t.output("loss", t.silu(w));
  try {
    autodiff(t.finish());
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("must be f32[], got f32[2]"), std::string::npos) << e.what();
  }
}

// The whole model, end to end: every parameter's gradient by central differences of the
// mean cross-entropy loss (on the host in double, from the fp32 forward outputs).
TEST(Autodiff, TinyTransformerGradientsMatchFiniteDifferences) {
  testing::TinyDims d;
  d.B = 2;
  // The checker differentiates the outputs named y*: the model's loss is y0.
  Graph forward = testing::tiny_transformer(d, "y0");
  testing::Feed feed;
  feed.i["tokens"] = {1, 4, 2, 9, 0, 3, 3, 10, 7, 5};
  feed.i["labels"] = {4, 2, 9, 0, -100, 3, 10, 7, 5, 6};
  feed.i["positions"] = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4};
  for (ValueId p : forward.inputs_with_role(Role::parameter)) {
    const Value& v = forward.value(p);
    // Norm weights near 1 as in a real model; projections small enough that attention
    // is not saturated (a saturated softmax makes differences of L tiny and noisy).
    feed.f[v.name] = v.type.shape.size() == 1
                         ? std::vector<float>(numel(v.type.shape), 1.0f)
                         : testing::random_normal(numel(v.type.shape), uint32_t(p) + 7, 0.5f);
  }
  testing::GradCheckOptions opt;
  opt.step = 1e-2;
  testing::check_gradients(forward, feed, 3, opt);
}

}  // namespace
}  // namespace autosp
