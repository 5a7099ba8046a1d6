// The IR: printer/parser round trip, parse errors, the verifier.
#include <gtest/gtest.h>

#include "ops/op.h"
#include "passes/autodiff.h"
#include "testing/tiny_block.h"

namespace autosp {
namespace {

void expect_round_trip(const Graph& g) {
  const std::string text = print_graph(g);
  Graph parsed = parse_graph(text, "round_trip");
  EXPECT_TRUE(parsed == g) << text;
  EXPECT_EQ(print_graph(parsed), text);
  verify(parsed);
}

TEST(IrText, RoundTripForwardAndJoint) {
  Graph forward = testing::tiny_transformer();
  expect_round_trip(forward);
  expect_round_trip(autodiff(forward));
}

TEST(IrText, RoundTripShardingNamesAndEveryAttrKind) {
  Graph g;
  GraphBuilder b(g);
  ValueId x = g.add_input(Role::constant, {DType::f32, {2, 3}}, "x \"quoted\"");
  ValueId y = b.emit1(OpKind::scale, {x}, {{"alpha", 1e-30}});
  ValueId z = b.emit1(OpKind::transpose, {y}, {{"perm", std::vector<int64_t>{1, 0}}});
  ValueId w = b.emit1(OpKind::fill, {}, {{"shape", Shape{}}, {"value", -0.1}});
  g.mutable_value(y).sharding = {Sharding::Kind::shard, 1};
  g.mutable_value(z).sharding = {Sharding::Kind::partial, -1};
  g.mutable_value(w).sharding = {Sharding::Kind::replicated, -1};
  g.mutable_value(z).name = "z";
  g.add_output("z", z);
  g.add_output("w", w);
  const std::string text = print_graph(g);
  EXPECT_NE(text.find("@shard(1)"), std::string::npos) << text;
  EXPECT_NE(text.find("alpha=1e-30"), std::string::npos) << text;
  EXPECT_NE(text.find("perm=[1, 0]"), std::string::npos) << text;
  expect_round_trip(g);
}

TEST(IrText, RoundTripBf16) {
  Graph g;
  GraphBuilder b(g);
  ValueId x = g.add_input(Role::parameter, {DType::bf16, {2, 16}}, "x");
  EXPECT_EQ(g.type(x).bytes(), 2 * 16 * 2);
  EXPECT_EQ((TensorType{DType::f32, {2, 16}}.bytes()), 2 * 16 * 4);
  ValueId y = b.emit1(OpKind::silu, {x});
  ValueId z = b.emit1(OpKind::convert, {y}, {{"dtype", std::string("f32")}});
  g.mutable_value(y).sharding = {Sharding::Kind::shard, 1};
  g.add_output("z", z);
  const std::string text = print_graph(g);
  EXPECT_NE(text.find("input() {role=\"parameter\"} : bf16[2, 16] \"x\""), std::string::npos) << text;
  EXPECT_NE(text.find("silu(%0) : bf16[2, 16] @shard(1)"), std::string::npos) << text;
  EXPECT_NE(text.find("convert(%1) {dtype=\"f32\"} : f32[2, 16]"), std::string::npos) << text;
  expect_round_trip(g);
  // f16 is an IR dtype: it parses (and prints) though no op rule accepts it
  Graph h = parse_graph("graph {\n  %0 = input() {role=\"constant\"} : f16[3]\n}\n");
  EXPECT_EQ(h.type(0), (TensorType{DType::f16, {3}}));
  EXPECT_EQ(h.type(0).bytes(), 6);
}

TEST(IrVerify, RejectsADtypeTheOpRuleDisagreesWith) {
  // a bf16 silu recorded as f32: the rule says the result has the operand's dtype
  Graph g = parse_graph(
      "graph {\n"
      "  %0 = input() {role=\"parameter\"} : bf16[2, 3]\n"
      "  %1 = silu(%0) : f32[2, 3]\n"
      "}\n");
  try {
    verify(g);
    FAIL() << "verify accepted a wrong result dtype";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("typed f32[2, 3] but the op's rule gives bf16[2, 3]"), std::string::npos)
        << e.what();
  }
}

TEST(IrText, FloatAttributesRoundTripExactly) {
  for (double v : {0.1, 1.0 / 3.0, 500000.0, 1e-5, 0.08838834764831845, -2.0}) {
    Graph g;
    GraphBuilder b(g);
    ValueId x = g.add_input(Role::constant, {DType::f32, {2}}, "x");
    g.add_output("y", b.emit1(OpKind::scale, {x}, {{"alpha", v}}));
    Graph parsed = parse_graph(print_graph(g));
    EXPECT_EQ(parsed.node(1).attrs.get_float("alpha"), v);
    EXPECT_TRUE(std::holds_alternative<double>(parsed.node(1).attrs.all().at("alpha")));
  }
}

TEST(IrText, FloatListsRoundTripExactlyAndStayApartFromIntLists) {
  // ALiBi's slopes: powers of two and their interpolations, and whole numbers (printed 1.0)
  const std::vector<double> slopes = {0.5, 0.25, 0.7071067811865476, 1.0, -3.0, 1e-30};
  Graph g;
  GraphBuilder b(g);
  ValueId x = g.add_input(Role::constant, {DType::f32, {2}}, "x");
  g.add_output("y", b.emit1(OpKind::scale, {x}, {{"alpha", 2.0}, {"floats", slopes}, {"ints", Shape{1, -2}}}));
  const std::string text = print_graph(g);
  EXPECT_NE(text.find("floats=[0.5, 0.25, 0.7071067811865476, 1.0, -3.0, 1e-30]"), std::string::npos) << text;
  Graph parsed = parse_graph(text);
  EXPECT_EQ(parsed.node(1).attrs.get_floats("floats"), slopes);
  EXPECT_EQ(parsed.node(1).attrs.get_ints("ints"), (Shape{1, -2}));
  expect_round_trip(g);
}

void expect_parse_error(const std::string& text, const std::string& fragment);

TEST(IrText, ListsOfMixedKindsAreErrors) {
  const std::string head = "graph {\n  %0 = input() {role=\"constant\"} : f32[2]\n  %1 = scale(%0) {alpha=1.0, l=";
  expect_parse_error(head + "[0.5, 1]} : f32[2]\n}\n", "a float list with an integer element");
  expect_parse_error(head + "[1, 0.5]} : f32[2]\n}\n", "an int list with a float element");
}

void expect_parse_error(const std::string& text, const std::string& fragment) {
  try {
    parse_graph(text, "bad.ir");
    ADD_FAILURE() << "no error for:\n" << text;
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.ir:"), std::string::npos) << e.what();
  }
}

TEST(IrText, ParseErrorsNameLineAndProblem) {
  expect_parse_error("graph {\n  %0 = frobnicate() : f32[2]\n}\n", "bad.ir:2:");
  expect_parse_error("graph {\n  %0 = frobnicate() : f32[2]\n}\n", "unknown op 'frobnicate'");
  expect_parse_error("graph {\n  %1 = silu(%0) : f32[2]\n}\n", "%0 is used before it is defined");
  expect_parse_error("graph {\n  %0 = input() {role=\"parameter\"} : f64[2]\n}\n", "unknown dtype 'f64'");
  expect_parse_error("graph {\n  %0 = input() : f32[2]\n}\n", "needs a role");
  expect_parse_error("graph {\n  %0 = input() {role=\"parameter\"} : f32[2]\n  %0 = silu(%0) : f32[2]\n}\n",
                     "defined twice");
  expect_parse_error("graph {\n  %0 = input() {role=\"parameter\"} : f32[2 \n}\n", "expected ']'");
  expect_parse_error("graph {\n", "expected '%'");
  expect_parse_error("", "expected 'graph'");
}

TEST(IrVerify, RejectsAResultTypeTheOpRuleDisagreesWith) {
  Graph g = parse_graph(
      "graph {\n"
      "  %0 = input() {role=\"parameter\"} : f32[2, 3]\n"
      "  %1 = silu(%0) : f32[3, 2]\n"
      "}\n");
  try {
    verify(g);
    FAIL() << "verify accepted a wrong result type";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("node 1 (silu)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("f32[2, 3]"), std::string::npos) << e.what();
  }
}

TEST(IrVerify, RejectsAnOpWhoseOperandsBreakItsRule) {
  Graph g = parse_graph(
      "graph {\n"
      "  %0 = input() {role=\"parameter\"} : f32[2, 3]\n"
      "  %1 = input() {role=\"parameter\"} : f32[4, 5]\n"
      "  %2 = linear(%0, %1) : f32[2, 4]\n"
      "}\n");
  EXPECT_THROW(verify(g), InternalError);
}

TEST(IrVerify, AcceptsEveryGraphThePipelineBuilds) {
  Graph forward = testing::tiny_transformer();
  verify(forward);
  verify(autodiff(forward));
}

}  // namespace
}  // namespace autosp
