// Bad input to the graph builder is a UserError naming the op and the operand shapes.
#include <gtest/gtest.h>

#include "frontend/tracer.h"

namespace autosp {
namespace {

template <typename Fn>
void expect_user_error(Fn&& fn, std::initializer_list<const char*> fragments) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    for (const char* f : fragments)
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
          << "message lacks '" << f << "': " << e.what();
  }
}

TEST(BuilderErrors, LinearShapeMismatchNamesOpAndShapes) {
  Tracer t;
  Tensor x = t.parameter("x", {2, 16, 32});
  Tensor w = t.parameter("w", {64, 31});
  expect_user_error([&] { t.linear(x, w); },
                    {"linear(f32[2, 16, 32], f32[64, 31])", "last dim (32)", "in-features"});
}

TEST(BuilderErrors, WrongDtype) {
  Tracer t;
  Tensor w = t.parameter("w", {10, 4});
  Tensor tok = t.parameter("tok", {2, 3});  // f32, not i32
  expect_user_error([&] { t.embedding(w, tok); },
                    {"embedding(f32[10, 4], f32[2, 3])", "tokens must be i32"});
}

TEST(BuilderErrors, APaddingIdxOutsideTheTable) {
  Tracer t;
  Tensor w = t.parameter("w", {7, 4});
  Tensor tok = t.input(Role::tokens, "tokens", DType::i32, {2});
  expect_user_error([&] { t.embedding(w, tok, 7); }, {"embedding(f32[7, 4], i32[2])", "padding_idx 7 is outside [0, 7)"});
}

TEST(BuilderErrors, MixedDtypesNameBothTypes) {
  Tracer t;
  Tensor x = t.parameter("x", {2, 3}, DType::bf16);
  Tensor y = t.parameter("y", {2, 3});
  expect_user_error([&] { t.add(x, y); }, {"add(bf16[2, 3], f32[2, 3])", "a and b must have the same dtype",
                                           "a bf16[2, 3] and b f32[2, 3]"});
  Tensor w = t.parameter("w", {4, 3});
  expect_user_error([&] { t.linear(x, w); }, {"linear(bf16[2, 3], f32[4, 3])", "x bf16[2, 3] and weight f32[4, 3]"});
  EXPECT_EQ(t.shape(t.linear(t.convert(y, DType::bf16), t.convert(w, DType::bf16))), (Shape{2, 4}));
  expect_user_error([&] { t.parameter("h", {2}, DType::f16); }, {"parameter 'h' must be f32 or bf16, got f16"});
}

TEST(BuilderErrors, BadAttributes) {
  Tracer t;
  Tensor x = t.parameter("x", {1, 3, 2, 5});
  Tensor pos = t.input(Role::positions, "pos", DType::i32, {1, 3});
  expect_user_error([&] { t.rope(x, pos, {}); }, {"rope(f32[1, 3, 2, 5], i32[1, 3])", "D must be even"});
  RopeOptions bad;
  bad.rope_type = "dynamic";
  Tensor y = t.parameter("y", {1, 3, 2, 4});
  expect_user_error([&] { t.rope(y, pos, bad); }, {"rope(", "unknown rope_type 'dynamic'"});
  expect_user_error([&] { t.transpose(y, {0, 1, 1, 2}); }, {"transpose(f32[1, 3, 2, 4])", "not a permutation"});
  expect_user_error([&] { t.slice(y, 1, 2, 7); }, {"slice(", "[2, 7) is not within dim 1 of size 3"});
  expect_user_error([&] { t.reshape(y, {5, 5}); }, {"reshape(", "cannot reshape [1, 3, 2, 4]"});
  expect_user_error([&] { t.rms_norm(y, t.parameter("nw", {4}), -1.0); }, {"rms_norm(", "positive 'eps'"});
}

TEST(BuilderErrors, AttentionHeadsAndShapes) {
  Tracer t;
  Tensor q = t.parameter("q", {1, 8, 6, 4});
  Tensor k = t.parameter("k", {1, 8, 4, 4});
  expect_user_error([&] { t.attention(q, k, k, true, 0.5); },
                    {"attention(f32[1, 8, 6, 4], f32[1, 8, 4, 4], f32[1, 8, 4, 4])",
                     "NH=6 must be a multiple of kv heads NKV=4"});
  Tensor k2 = t.parameter("k2", {1, 7, 2, 4});
  expect_user_error([&] { t.attention(q, k2, k2, true, 0.5); }, {"agree on B, S and D"});
  Tensor k3 = t.parameter("k3", {1, 8, 2, 4});
  expect_user_error([&] { t.attention(q, k3, k3, true, 0.0); }, {"positive 'scale'"});
  Tensor docs = t.input(Role::documents, "docs", DType::i32, {1, 7});
  expect_user_error([&] { t.attention(q, k3, k3, docs, true, 0.5); },
                    {"documents must be i32[1, 8] (q's B and S), got [1, 7]"});
  Tensor fdocs = t.parameter("fdocs", {1, 8});
  expect_user_error([&] { t.attention(q, k3, k3, fdocs, true, 0.5); }, {"documents"});
}

TEST(BuilderErrors, CrossEntropyLabelsShape) {
  Tracer t;
  Tensor logits = t.parameter("logits", {2, 3, 10});
  Tensor labels = t.input(Role::labels, "labels", DType::i32, {2, 4});
  expect_user_error([&] { t.cross_entropy(logits, labels); },
                    {"cross_entropy(f32[2, 3, 10], i32[2, 4])", "labels must have logits' shape"});
}

TEST(BuilderErrors, DuplicateInputName) {
  Tracer t;
  t.parameter("w", {2});
  expect_user_error([&] { t.parameter("w", {3}); }, {"input 'w' is declared twice"});
}

}  // namespace
}  // namespace autosp
