// The op set's type rules (src/ops/op.h, "Types"): every op accepts bf16 where it accepts
// f32, results follow the operands' dtype, the saved statistics stay f32, mixed f32/bf16
// operands and f16 are refused with both types named, integer operands stay i32.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "kernels/cpu/fused.h"
#include "ops/op.h"
#include "ops/rope.h"

namespace autosp {
namespace {

constexpr DType bf16 = DType::bf16, f32 = DType::f32, i32 = DType::i32;

TensorType T(DType dtype, Shape shape) { return {dtype, std::move(shape)}; }

// The result types of `op` on operands of `types`, through GraphBuilder (as the tracer and
// every pass build nodes). Records the op as covered.
std::set<OpKind>& covered() {
  static std::set<OpKind> ops;
  return ops;
}

Types infer(OpKind op, const Types& types, Attrs attrs = {}) {
  covered().insert(op);
  Graph g;
  GraphBuilder b(g);
  std::vector<ValueId> ins;
  for (size_t i = 0; i < types.size(); ++i) ins.push_back(g.add_input(Role::constant, types[i], str("x", i)));
  Types out;
  for (ValueId v : b.emit(op, ins, std::move(attrs))) out.push_back(g.type(v));
  verify(g);
  return out;
}

std::string infer_error(OpKind op, const Types& types, Attrs attrs = {}) {
  try {
    infer(op, types, std::move(attrs));
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << op_name(op) << "(" << types_str(types) << ") was accepted";
  return "";
}

Attrs group(int64_t size) { return {{"group", std::string("sp")}, {"size", size}}; }

void elementwise_and_reduction_ops_follow_the_operand_dtype() {
  for (DType d : {f32, bf16}) {
    SCOPED_TRACE(dtype_name(d));
    const TensorType x = T(d, {2, 3}), s = T(d, {});
    EXPECT_EQ(infer(OpKind::add, {x, x}), Types{x});
    EXPECT_EQ(infer(OpKind::mul, {x, x}), Types{x});
    EXPECT_EQ(infer(OpKind::scale, {x}, {{"alpha", 2.0}}), Types{x});
    EXPECT_EQ(infer(OpKind::sum, {x}), Types{s});  // the scalar has x's dtype
    EXPECT_EQ(infer(OpKind::expand, {s}, {{"shape", Shape{2, 3}}}), Types{x});
    EXPECT_EQ(infer(OpKind::div_scalar, {x, s}), Types{x});
    EXPECT_EQ(infer(OpKind::div, {x, x}), Types{x});
    EXPECT_NE(infer_error(OpKind::div, {x, T(d, {3})}).find("operands must have the same shape"), std::string::npos);
    EXPECT_EQ(infer(OpKind::stop_gradient, {x}), Types{x});
    // the norm of each row: the last dim dropped (a vector's: a scalar)
    const TensorType rows = T(d, {2});
    EXPECT_EQ(infer(OpKind::vector_norm, {x}), Types{rows});
    EXPECT_EQ(infer(OpKind::vector_norm, {rows}), Types{s});
    EXPECT_NE(infer_error(OpKind::vector_norm, {s}).find("x must have at least one dim"), std::string::npos);
    EXPECT_EQ(infer(OpKind::vector_norm_backward, {rows, x, rows}), Types{x});
    EXPECT_NE(infer_error(OpKind::vector_norm_backward, {x, x, rows}).find("dy must have x's shape without its last dim"),
              std::string::npos);
    EXPECT_NE(infer_error(OpKind::vector_norm_backward, {rows, x, T(d == f32 ? bf16 : f32, {2})}).find("y"),
              std::string::npos);
    // x repeated over like's first dims, like of any dtype (its shape only)
    const TensorType row = T(d, {3});
    EXPECT_EQ(infer(OpKind::broadcast, {row, x}, {{"dims", int64_t{1}}}), (Types{T(d, {2, 3})}));
    EXPECT_EQ(infer(OpKind::broadcast, {row, T(i32, {4, 2})}, {{"dims", int64_t{2}}}), (Types{T(d, {4, 2, 3})}));
    EXPECT_EQ(infer(OpKind::broadcast, {x, T(bf16, {4, 2})}, {{"dims", int64_t{1}}}), (Types{T(d, {4, 2, 3})}));
    EXPECT_NE(infer_error(OpKind::broadcast, {row, x}, {{"dims", int64_t{3}}}).find("dims must be in [1, rank of like = 2], got 3"),
              std::string::npos);
    EXPECT_NE(infer_error(OpKind::broadcast, {row, x}).find("dims must be in [1, rank of like = 2], got -1"),
              std::string::npos);
    EXPECT_NE(infer_error(OpKind::broadcast, {T(i32, {3}), x}, {{"dims", int64_t{1}}}).find("x must be f32 or bf16"),
              std::string::npos);
    EXPECT_EQ(infer(OpKind::silu, {x}), Types{x});
    EXPECT_EQ(infer(OpKind::silu_backward, {x, x}), Types{x});
    EXPECT_EQ(infer(OpKind::relu, {x}), Types{x});
    EXPECT_EQ(infer(OpKind::relu_backward, {x, x}), Types{x});
    EXPECT_EQ(infer(OpKind::tanh, {x}), Types{x});
    EXPECT_EQ(infer(OpKind::tanh_backward, {x, x}), Types{x});
    const Attrs clip{{"min", -8.0}, {"max", 8.0}};
    EXPECT_EQ(infer(OpKind::clamp, {x}, clip), Types{x});
    EXPECT_EQ(infer(OpKind::clamp, {x}, {{"max", 7.0}}), Types{x});
    EXPECT_EQ(infer(OpKind::clamp_backward, {x, x}, clip), Types{x});
    EXPECT_NE(infer_error(OpKind::clamp, {x}).find("needs a 'min' or a 'max' attribute"), std::string::npos);
    EXPECT_NE(infer_error(OpKind::clamp, {x}, {{"min", 2.0}, {"max", 1.0}}).find("'min' 2 must be at most 'max' 1"),
              std::string::npos);
    const TensorType one{x.dtype, {1}};
    const Attrs xielu{{"beta", 0.5}, {"eps", -1e-6}};
    EXPECT_EQ(infer(OpKind::xielu, {x, one, one}, xielu), Types{x});
    EXPECT_EQ(infer(OpKind::xielu_backward, {x, x, one, one}, xielu), (Types{x, one, one}));
    for (const char* approximate : {"none", "tanh"}) {
      const Attrs a{{"approximate", std::string(approximate)}};
      EXPECT_EQ(infer(OpKind::gelu, {x}, a), Types{x});
      EXPECT_EQ(infer(OpKind::gelu_backward, {x, x}, a), Types{x});
    }
    EXPECT_EQ(infer(OpKind::swiglu, {x, x}), Types{x});
    EXPECT_EQ(infer(OpKind::swiglu_backward, {x, x, x}), (Types{x, x}));
  }
}

void fill_takes_an_optional_dtype() {
  EXPECT_EQ(infer(OpKind::fill, {}, {{"shape", Shape{4}}, {"value", 0.0}}), Types{T(f32, {4})});
  EXPECT_EQ(infer(OpKind::fill, {}, {{"shape", Shape{4}}, {"value", 0.0}, {"dtype", std::string("bf16")}}),
            Types{T(bf16, {4})});
  for (const char* bad : {"f16", "i32", "float"})
    EXPECT_NE(infer_error(OpKind::fill, {}, {{"shape", Shape{4}}, {"value", 0.0}, {"dtype", std::string(bad)}})
                  .find("is not a floating dtype (f32 or bf16)"),
              std::string::npos)
        << bad;
  EXPECT_NE(infer_error(OpKind::fill, {}, {{"shape", Shape{4}}, {"value", 0.0}, {"dtype", int64_t{1}}})
                .find("must be a dtype name"),
            std::string::npos);
}

void convert_changes_the_dtype_and_nothing_else() {
  const TensorType x = T(f32, {2, 3}), y = T(bf16, {2, 3});
  EXPECT_EQ(infer(OpKind::convert, {x}, {{"dtype", std::string("bf16")}}), Types{y});
  EXPECT_EQ(infer(OpKind::convert, {y}, {{"dtype", std::string("f32")}}), Types{x});
  EXPECT_EQ(infer(OpKind::convert, {y}, {{"dtype", std::string("bf16")}}), Types{y});
  EXPECT_NE(infer_error(OpKind::convert, {x}).find("needs a 'dtype' attribute"), std::string::npos);
  EXPECT_NE(infer_error(OpKind::convert, {T(i32, {2})}, {{"dtype", std::string("f32")}})
                .find("x must be f32 or bf16, got i32[2]"),
            std::string::npos);
}

void matmuls_norms_rope_and_embedding_follow_the_operand_dtype() {
  for (DType d : {f32, bf16}) {
    SCOPED_TRACE(dtype_name(d));
    EXPECT_EQ(infer(OpKind::linear, {T(d, {2, 5, 8}), T(d, {3, 8})}), Types{T(d, {2, 5, 3})});
    EXPECT_EQ(infer(OpKind::linear, {T(d, {2, 5, 8}), T(d, {3, 8}), T(d, {3})}), Types{T(d, {2, 5, 3})});
    EXPECT_EQ(infer(OpKind::matmul, {T(d, {5, 8}), T(d, {5, 3})}, {{"trans_a", int64_t{1}}}),
              Types{T(d, {8, 3})});
    // rstd, one value per row, is f32 whatever x is
    EXPECT_EQ(infer(OpKind::rms_norm, {T(d, {2, 5, 8}), T(d, {8})}, {{"eps", 1e-5}}),
              (Types{T(d, {2, 5, 8}), T(f32, {2, 5})}));
    EXPECT_EQ(infer(OpKind::rms_norm_backward, {T(d, {2, 5, 8}), T(d, {2, 5, 8}), T(d, {8}), T(f32, {2, 5})}),
              (Types{T(d, {2, 5, 8}), T(d, {8})}));
    // mean and rstd, one value per row each, are f32 whatever x is
    EXPECT_EQ(infer(OpKind::layer_norm, {T(d, {2, 5, 8}), T(d, {8}), T(d, {8})}, {{"eps", 1e-5}}),
              (Types{T(d, {2, 5, 8}), T(f32, {2, 5}), T(f32, {2, 5})}));
    EXPECT_EQ(infer(OpKind::layer_norm_backward,
                    {T(d, {2, 5, 8}), T(d, {2, 5, 8}), T(d, {8}), T(f32, {2, 5}), T(f32, {2, 5})}),
              (Types{T(d, {2, 5, 8}), T(d, {8}), T(d, {8})}));
    EXPECT_EQ(infer(OpKind::rope, {T(d, {1, 5, 2, 4}), T(i32, {1, 5})}, {{"theta", 1e4}}),
              Types{T(d, {1, 5, 2, 4})});
    EXPECT_EQ(infer(OpKind::embedding, {T(d, {11, 8}), T(i32, {1, 5})}), Types{T(d, {1, 5, 8})});
    EXPECT_EQ(infer(OpKind::embedding_backward, {T(d, {1, 5, 8}), T(i32, {1, 5})}, {{"vocab", int64_t{11}}}),
              Types{T(d, {11, 8})});
  }
}

// moe: y of x's type and the saved products [T k (2 I + H)]; its backward one gradient per
// operand but the saved products, each of the operand's type. The rule names what is wrong: the
// count of expert weights, top_k, an expert's shape, a dtype, the saved products.
Types stacked_of(const TensorType& x, const TensorType& logits) {
  return {x, logits, T(DType::f32, {3, 12, 8}), T(DType::f32, {3, 8, 6})};
}

void moe_follows_the_operand_dtype() {
  const Attrs attrs{{"top_k", int64_t{2}}, {"normalize", int64_t{1}}};
  for (DType d : {f32, bf16}) {
    SCOPED_TRACE(dtype_name(d));
    const TensorType x = T(d, {2, 5, 8}), logits = T(d, {2, 5, 3}), gu = T(d, {6, 8}), down = T(d, {8, 6});
    const TensorType saved = T(d, {2 * 5 * 2 * (2 * 6 + 8)});
    Types in{x, logits};
    for (int e = 0; e < 3; ++e) in.insert(in.end(), {gu, gu, down});
    EXPECT_EQ(infer(OpKind::moe, in, attrs), (Types{x, saved}));
    Types back{x, x, logits, saved};
    back.insert(back.end(), in.begin() + 2, in.end());
    EXPECT_EQ(infer(OpKind::moe_backward, back, attrs), in);
    back[3] = T(d, {7});
    EXPECT_NE(infer_error(OpKind::moe_backward, back, attrs).find("saved must be the forward's saved products"),
              std::string::npos);
  }
  const TensorType x = T(f32, {2, 5, 8}), logits = T(f32, {2, 5, 3}), gu = T(f32, {6, 8}), down = T(f32, {8, 6});
  Types in{x, logits};
  for (int e = 0; e < 3; ++e) in.insert(in.end(), {gu, gu, down});
  EXPECT_NE(infer_error(OpKind::moe, Types(in.begin(), in.end() - 1), attrs)
                .find("router logits of 3 experts need 9 expert weights (gate, up and down of each), 2 stacked ones "
                      "(gate_up [E, 2 I, H] and down [E, H, I]) or 3 (gate, up and down [E, I, H]), got 8"),
            std::string::npos);
  // transformers 5's stacked experts: gate_up [E, 2 I, H] and down [E, H, I], the same results.
  for (DType d : {f32, bf16}) {
    const TensorType xd = T(d, {2, 5, 8}), ld = T(d, {2, 5, 3}), gate_up = T(d, {3, 12, 8}), dn = T(d, {3, 8, 6});
    const TensorType saved = T(d, {2 * 5 * 2 * (2 * 6 + 8)});
    EXPECT_EQ(infer(OpKind::moe, {xd, ld, gate_up, dn}, attrs), (Types{xd, saved}));
    EXPECT_EQ(infer(OpKind::moe_backward, {xd, xd, ld, saved, gate_up, dn}, attrs), (Types{xd, ld, gate_up, dn}));
  }
  EXPECT_NE(infer_error(OpKind::moe, {x, logits, T(f32, {3, 11, 8}), T(f32, {3, 8, 6})}, attrs)
                .find("the stacked gate_up must be [E, 2 I, H] = [3, 2 I, 8], got f32[3, 11, 8]"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::moe, {x, logits, T(f32, {3, 12, 8}), T(f32, {3, 6, 8})}, attrs)
                .find("the stacked down must be [E, H, I] = [3, 8, 6], got f32[3, 6, 8]"),
            std::string::npos);
  // Llama 4's experts (gate_up [E, H, 2 I], down [E, I, H]) and LongCat-Flash's zero experts: the last
  // Z of the logits' E have no weights; Z in [0, E), and weight_input 0 or 1.
  {
    Attrs l4 = attrs;
    l4.set("experts", std::string("llama4"));
    const TensorType saved = T(f32, {2 * 5 * 2 * (2 * 6 + 8)});
    EXPECT_EQ(infer(OpKind::moe, {x, logits, T(f32, {3, 8, 12}), T(f32, {3, 6, 8})}, l4), (Types{x, saved}));
    EXPECT_NE(infer_error(OpKind::moe, {x, logits, T(f32, {3, 12, 8}), T(f32, {3, 8, 6})}, l4)
                  .find("llama4 experts' gate_up must be [E, H, 2 I] = [3, 8, 2 I], got f32[3, 12, 8]"),
              std::string::npos);
    Attrs zero = l4;
    zero.set("zero_experts", int64_t{1});
    EXPECT_EQ(infer(OpKind::moe, {x, logits, T(f32, {2, 8, 12}), T(f32, {2, 6, 8})}, zero), (Types{x, saved}));
    Attrs listed_zero = attrs;
    listed_zero.set("zero_experts", int64_t{1});
    EXPECT_NE(infer_error(OpKind::moe, in, listed_zero)
                  .find("router logits of 3 experts (1 of them zero) need 6 expert weights"),
              std::string::npos);
    for (int64_t bad : {int64_t{-1}, int64_t{3}}) {
      zero.set("zero_experts", bad);
      EXPECT_NE(infer_error(OpKind::moe, {x, logits, T(f32, {2, 8, 12}), T(f32, {2, 6, 8})}, zero)
                    .find(str("zero_experts=", bad, " must be in [0, 3)")),
                std::string::npos);
    }
    l4.set("weight_input", int64_t{2});
    EXPECT_NE(infer_error(OpKind::moe, {x, logits, T(f32, {3, 8, 12}), T(f32, {3, 6, 8})}, l4)
                  .find("weight_input must be 0 or 1, got 2"),
              std::string::npos);
  }
  // DBRX's experts, stacked apart: gate, up and down [E, I, H] (each expert's down transposed).
  {
    const TensorType w = T(f32, {3, 6, 8}), saved = T(f32, {2 * 5 * 2 * (2 * 6 + 8)});
    EXPECT_EQ(infer(OpKind::moe, {x, logits, w, w, w}, attrs), (Types{x, saved}));
    EXPECT_EQ(infer(OpKind::moe_backward, {x, x, logits, saved, w, w, w}, attrs), (Types{x, logits, w, w, w}));
    EXPECT_NE(infer_error(OpKind::moe, {x, logits, w, w, T(f32, {3, 8, 6})}, attrs)
                  .find("the stacked down must be [E, I, H] = [3, I, 8] as gate's (down: each expert's transposed), "
                        "got f32[3, 8, 6]"),
              std::string::npos);
  }
  // gpt-oss's experts: gate_up [E, H, 2 I], its bias [E, 2 I], down [E, I, H], its bias [E, H].
  {
    Attrs g = attrs;
    g.set("experts", std::string("gpt_oss"));
    const Types oss{x, logits, T(f32, {3, 8, 12}), T(f32, {3, 12}), T(f32, {3, 6, 8}), T(f32, {3, 8})};
    const TensorType saved = T(f32, {2 * 5 * 2 * (2 * 6 + 8)});
    EXPECT_EQ(infer(OpKind::moe, oss, g), (Types{x, saved}));
    Types back{x, x, logits, saved};
    back.insert(back.end(), oss.begin() + 2, oss.end());
    Types grads{x, logits};
    grads.insert(grads.end(), oss.begin() + 2, oss.end());
    EXPECT_EQ(infer(OpKind::moe_backward, back, g), grads);
    Types wrong_bias = oss;
    wrong_bias[3] = T(f32, {3, 6});
    EXPECT_NE(infer_error(OpKind::moe, wrong_bias, g).find("gate_up_bias must be [E, 2 I] = [3, 12], got f32[3, 6]"),
              std::string::npos);
    EXPECT_NE(infer_error(OpKind::moe, Types(oss.begin(), oss.end() - 1), g)
                  .find("gpt_oss experts are 4 operands (gate_up, gate_up_bias, down, down_bias), got 3"),
              std::string::npos);
    Attrs bad = g;
    bad.set("limit", -1.0);
    EXPECT_NE(infer_error(OpKind::moe, oss, bad).find("limit a positive number"), std::string::npos);
    Attrs plain = attrs;
    plain.set("alpha", 1.0);
    EXPECT_NE(infer_error(OpKind::moe, stacked_of(x, logits), plain).find("'alpha' and 'limit' are gpt_oss experts' "
                                                                          "only"),
              std::string::npos);
  }
  // The routers beyond softmax top-k: their attributes checked, named.
  const Types stacked{x, logits, T(f32, {3, 12, 8}), T(f32, {3, 8, 6})};
  auto routing_error = [&](Attrs extra) {
    for (const auto& [k, v] : attrs.all()) extra.set(k, v);
    return infer_error(OpKind::moe, stacked, extra);
  };
  EXPECT_EQ(infer(OpKind::moe, stacked, [&] {
              Attrs a = attrs;
              a.set("score", std::string("sigmoid"));
              a.set("groups", int64_t{3});
              a.set("topk_group", int64_t{2});
              a.set("scale", 2.5);
              a.set("bias", std::vector<double>{0.1, 0.0, -0.1});
              return a;
            }())[0],
            x);
  EXPECT_NE(routing_error({{"score", std::string("relu")}}).find("score must be \"softmax\" or \"sigmoid\""),
            std::string::npos);
  EXPECT_NE(routing_error({{"groups", int64_t{2}}}).find("groups=2 must divide the 3 experts"), std::string::npos);
  EXPECT_NE(routing_error({{"groups", int64_t{3}}, {"topk_group", int64_t{4}}}).find("topk_group=4 must be in [1, 3]"),
            std::string::npos);
  EXPECT_NE(routing_error({{"bias", std::vector<double>{0.1}}}).find("bias must hold one number per expert (3), got 1"),
            std::string::npos);
  EXPECT_NE(routing_error({{"scale", -1.0}}).find("scale must be a positive number"), std::string::npos);
  // (the routing keeps the groups' choice as the bits of one word)
  EXPECT_NE(infer_error(OpKind::moe, {x, T(f32, {2, 5, 130}), T(f32, {130, 12, 8}), T(f32, {130, 8, 6})},
                        {{"top_k", int64_t{2}}, {"groups", int64_t{65}}})
                .find("groups=65 above the 64 the routing takes"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::moe, {x, logits, T(f32, {4, 12, 8}), T(f32, {4, 8, 6})}, attrs)
                .find("the stacked gate_up must be [E, 2 I, H] = [3, 2 I, 8], got f32[4, 12, 8]"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::moe, in, {{"top_k", int64_t{4}}}).find("top_k=4 must be in [1, 3]"),
            std::string::npos);
  Types wrong = in;
  wrong[7] = T(f32, {6, 7});
  EXPECT_NE(infer_error(OpKind::moe, wrong, attrs).find("expert 1's down must be [8, 6], got f32[6, 7]"),
            std::string::npos);
  wrong = in;
  wrong[2] = T(bf16, {6, 8});
  EXPECT_NE(infer_error(OpKind::moe, wrong, attrs).find("x and gate must have the same dtype"), std::string::npos);
  wrong = in;
  wrong[1] = T(f32, {2, 4, 3});
  EXPECT_NE(infer_error(OpKind::moe, wrong, attrs).find("router logits must be x's leading dims"), std::string::npos);
  // The load-balancing statistics are f32 whatever the logits; their backward gives each layer's.
  for (DType d : {f32, bf16}) {
    const TensorType l = T(d, {2, 5, 3});
    EXPECT_EQ(infer(OpKind::moe_balance, {l, l}, {{"top_k", int64_t{2}}}), Types{T(f32, {2, 3})});
    EXPECT_EQ(infer(OpKind::moe_balance_backward, {T(f32, {2, 3}), l, l}, {{"top_k", int64_t{2}}}), (Types{l, l}));
  }
  EXPECT_NE(infer_error(OpKind::moe_balance, {T(f32, {2, 5, 3}), T(f32, {2, 4, 3})}, {{"top_k", int64_t{2}}})
                .find("every layer's router logits must be f32[2, 5, 3], got f32[2, 4, 3]"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::moe_balance, {T(f32, {2, 5, 3})}, {{"top_k", int64_t{4}}}).find("top_k=4"),
            std::string::npos);
}

void attention_keeps_an_f32_log_sum_exp() {
  const Attrs attrs{{"causal", int64_t{1}}, {"scale", 0.5}};
  for (DType d : {f32, bf16}) {
    SCOPED_TRACE(dtype_name(d));
    const TensorType q = T(d, {1, 6, 4, 8}), kv = T(d, {1, 6, 2, 8}), lse = T(f32, {1, 4, 6});
    EXPECT_EQ(infer(OpKind::attention, {q, kv, kv}, attrs), (Types{q, lse}));
    EXPECT_EQ(infer(OpKind::attention_backward, {q, q, kv, kv, q, lse}, attrs), (Types{q, kv, kv}));
  }
  const TensorType q = T(bf16, {1, 6, 4, 8}), kv = T(bf16, {1, 6, 2, 8});
  EXPECT_NE(infer_error(OpKind::attention_backward, {q, q, kv, kv, q, T(bf16, {1, 4, 6})}, attrs)
                .find("lse must be f32[B, NH, S]"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::attention, {q, T(f32, {1, 6, 2, 8}), kv}, attrs)
                .find("q and k must have the same dtype, got q bf16[1, 6, 4, 8] and k f32[1, 6, 2, 8]"),
            std::string::npos);
  // Values of their own head dim (DeepSeek-V3's): out, dout and dv are v's.
  {
    const TensorType v = T(bf16, {1, 6, 2, 5}), out = T(bf16, {1, 6, 4, 5}), lse = T(f32, {1, 4, 6});
    EXPECT_EQ(infer(OpKind::attention, {q, kv, v}, attrs), (Types{out, lse}));
    EXPECT_EQ(infer(OpKind::attention_backward, {out, q, kv, v, out, lse}, attrs), (Types{q, kv, v}));
    EXPECT_NE(infer_error(OpKind::attention_backward, {q, q, kv, v, out, lse}, attrs)
                  .find("dout and out must be bf16[1, 6, 4, 5] (q's B, S, NH and dtype, v's head dim), got "
                        "bf16[1, 6, 4, 8] and bf16[1, 6, 4, 5]"),
              std::string::npos);
    EXPECT_NE(infer_error(OpKind::attention, {q, kv, T(bf16, {1, 6, 1, 8})}, attrs)
                  .find("k and v must agree on B, S and NKV, got k [1, 6, 2, 8] and v [1, 6, 1, 8]"),
              std::string::npos);
  }
  // A sliding window is causal only, and positive.
  EXPECT_EQ(infer(OpKind::attention, {q, kv, kv}, {{"causal", int64_t{1}}, {"scale", 0.5}, {"window", int64_t{4}}}),
            (Types{q, T(f32, {1, 4, 6})}));
  EXPECT_NE(infer_error(OpKind::attention, {q, kv, kv}, {{"causal", int64_t{0}}, {"scale", 0.5}, {"window", int64_t{4}}})
                .find("a 'window' needs causal attention"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::attention, {q, kv, kv}, {{"causal", int64_t{1}}, {"scale", 0.5}, {"window", int64_t{-1}}})
                .find("'window' must be positive"),
            std::string::npos);
  // Llama 4's chunk (causal, positive) and temperature ([floor_scale > 0, attn_scale]).
  EXPECT_EQ(infer(OpKind::attention, {q, kv, kv}, {{"causal", int64_t{1}}, {"scale", 0.5}, {"chunk", int64_t{4}},
                                                   {"temperature", std::vector<double>{8192.0, 0.1}}}),
            (Types{q, T(f32, {1, 4, 6})}));
  EXPECT_NE(infer_error(OpKind::attention, {q, kv, kv}, {{"causal", int64_t{0}}, {"scale", 0.5}, {"chunk", int64_t{4}}})
                .find("a 'chunk' needs causal attention"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::attention, {q, kv, kv}, {{"causal", int64_t{1}}, {"scale", 0.5}, {"chunk", int64_t{-2}}})
                .find("'chunk' must be positive (or 0: none), got -2"),
            std::string::npos);
  for (const std::vector<double>& bad : {std::vector<double>{0.0, 0.1}, std::vector<double>{8192.0}})
    EXPECT_NE(infer_error(OpKind::attention, {q, kv, kv}, {{"causal", int64_t{1}}, {"scale", 0.5}, {"temperature", bad}})
                  .find("'temperature' must be [floor_scale, attn_scale], floor_scale > 0"),
              std::string::npos);
  // ALiBi: one slope per query head (per head of every rank's part with alibi_split), finite,
  // and not with a softcap.
  const Attrs causal{{"causal", int64_t{1}}, {"scale", 0.5}};
  auto with = [&](std::initializer_list<std::pair<const std::string, AttrValue>> extra) {
    Attrs a = causal;
    for (const auto& [key, value] : extra) a.set(key, value);
    return a;
  };
  const std::vector<double> four = {0.5, 0.25, 0.125, 0.0625};
  EXPECT_EQ(infer(OpKind::attention, {q, kv, kv}, with({{"alibi", four}})), (Types{q, T(f32, {1, 4, 6})}));
  EXPECT_EQ(infer(OpKind::attention_backward, {q, q, kv, kv, q, T(f32, {1, 4, 6})}, with({{"alibi", four}})),
            (Types{q, kv, kv}));
  const TensorType q2 = T(bf16, {1, 6, 2, 8});  // 2 of the 4 heads on each of 2 ranks
  EXPECT_EQ(infer(OpKind::attention, {q2, kv, kv}, with({{"alibi", four}, {"alibi_split", int64_t{2}}})),
            (Types{q2, T(f32, {1, 2, 6})}));
  EXPECT_NE(infer_error(OpKind::attention, {q2, kv, kv}, with({{"alibi", four}}))
                .find("'alibi' has 4 slopes for 2 query heads"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::attention, {q, kv, kv}, with({{"alibi", four}, {"alibi_split", int64_t{2}}}))
                .find("'alibi' has 4 slopes for 8 query heads (NH = 4 on each of alibi_split = 2 ranks)"),
            std::string::npos);
  const std::vector<double> not_finite = {0.5, std::nan(""), 0.1, 0.2};
  EXPECT_NE(infer_error(OpKind::attention, {q, kv, kv}, with({{"alibi", not_finite}}))
                .find("an ALiBi slope that is not finite"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::attention, {q, kv, kv}, with({{"alibi", four}, {"softcap", 2.0}}))
                .find("'alibi' with a 'softcap'"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::attention, {q, kv, kv}, with({{"alibi_split", int64_t{2}}}))
                .find("'alibi_split' without 'alibi'"),
            std::string::npos);
  // Sinks (gpt-oss's): operand 3, one logit per query head of the model's (sinks_split parts),
  // of q's dtype, before the document ids; the backward gives dsinks of the sinks' type.
  const TensorType sinks = T(bf16, {4}), lse = T(f32, {1, 4, 6}), docs = T(i32, {1, 6});
  const Attrs sunk = with({{"sinks", int64_t{1}}});
  EXPECT_EQ(infer(OpKind::attention, {q, kv, kv, sinks, docs}, sunk), (Types{q, lse}));
  EXPECT_EQ(infer(OpKind::attention_backward, {q, q, kv, kv, q, lse, sinks, docs}, sunk), (Types{q, kv, kv, sinks}));
  EXPECT_EQ(infer(OpKind::attention, {q2, kv, kv, sinks}, with({{"sinks", int64_t{1}}, {"sinks_split", int64_t{2}}})),
            (Types{q2, T(f32, {1, 2, 6})}));
  EXPECT_NE(infer_error(OpKind::attention, {q2, kv, kv, sinks}, sunk).find("sinks must be [2] (one logit per query "
                                                                          "head), got [4]"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::attention, {q, kv, kv, T(f32, {4})}, sunk)
                .find("q and sinks must have the same dtype"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::attention, {q, kv, kv}, sunk).find("'sinks' 1 needs the sinks operand"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::attention_backward, {q, q, kv, kv, q, lse}, sunk).find("'sinks' 1 needs the sinks "
                                                                                      "operand"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::attention, {q, kv, kv, sinks}, with({{"sinks_split", int64_t{2}}}))
                .find("'sinks_split' without 'sinks'"),
            std::string::npos);
}

void cross_entropy_keeps_an_f32_loss_and_log_sum_exp() {
  for (DType d : {f32, bf16}) {
    SCOPED_TRACE(dtype_name(d));
    const TensorType labels = T(i32, {2, 5}), lse = T(f32, {2, 5}), loss = T(f32, {});
    const TensorType logits = T(d, {2, 5, 11});
    EXPECT_EQ(infer(OpKind::cross_entropy, {logits, labels}), (Types{loss, lse}));
    EXPECT_EQ(infer(OpKind::cross_entropy_backward, {loss, logits, labels, lse}), Types{logits});
    const TensorType x = T(d, {2, 5, 8}), w = T(d, {11, 8});
    EXPECT_EQ(infer(OpKind::linear_cross_entropy, {x, w, labels}), (Types{loss, lse}));
    EXPECT_EQ(infer(OpKind::linear_cross_entropy_backward, {loss, x, w, labels, lse}), (Types{x, w}));
    EXPECT_EQ(infer(OpKind::linear_cross_entropy_with_grad, {x, w, labels, loss}), (Types{loss, x, w}));
    EXPECT_EQ(infer(OpKind::count_valid, {labels}), Types{loss});
  }
  const TensorType logits = T(bf16, {2, 5, 11}), labels = T(i32, {2, 5});
  EXPECT_NE(infer_error(OpKind::cross_entropy_backward, {T(bf16, {}), logits, labels, T(f32, {2, 5})})
                .find("dloss must be f32[]"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::cross_entropy, {logits, T(bf16, {2, 5})}).find("labels must be i32"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::linear_cross_entropy_with_grad,
                        {T(bf16, {2, 5, 8}), T(bf16, {11, 8}), labels, T(bf16, {})})
                .find("dloss must be f32[]"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::linear_cross_entropy, {T(bf16, {2, 5, 8}), T(f32, {11, 8}), labels})
                .find("x and weight must have the same dtype"),
            std::string::npos);
}

void layout_ops_and_collectives_keep_the_dtype() {
  for (DType d : {f32, bf16}) {
    SCOPED_TRACE(dtype_name(d));
    const TensorType x = T(d, {2, 4, 6});
    EXPECT_EQ(infer(OpKind::reshape, {x}, {{"shape", Shape{8, 6}}}), Types{T(d, {8, 6})});
    EXPECT_EQ(infer(OpKind::transpose, {x}, {{"perm", Shape{2, 0, 1}}}), Types{T(d, {6, 2, 4})});
    EXPECT_EQ(infer(OpKind::slice, {x}, {{"dim", int64_t{1}}, {"start", int64_t{1}}, {"end", int64_t{3}}}),
              Types{T(d, {2, 2, 6})});
    EXPECT_EQ(infer(OpKind::slice_backward, {T(d, {2, 2, 6})},
                    {{"dim", int64_t{1}}, {"start", int64_t{1}}, {"size", int64_t{4}}}),
              Types{x});
    EXPECT_EQ(infer(OpKind::concat, {x, x}, {{"dim", int64_t{2}}}), Types{T(d, {2, 4, 12})});
    Attrs a2a = group(2);
    a2a.set("scatter_dim", int64_t{2});
    a2a.set("gather_dim", int64_t{1});
    EXPECT_EQ(infer(OpKind::all_to_all, {x}, a2a), Types{T(d, {2, 8, 3})});
    EXPECT_EQ(infer(OpKind::all_reduce, {x}, group(2)), Types{x});
    Attrs dim1 = group(2);
    dim1.set("dim", int64_t{1});
    EXPECT_EQ(infer(OpKind::all_gather, {x}, dim1), Types{T(d, {2, 8, 6})});
    EXPECT_EQ(infer(OpKind::reduce_scatter, {x}, dim1), Types{T(d, {2, 2, 6})});
  }
  // a bf16 all-to-all moves half the bytes of an f32 one
  Graph g;
  GraphBuilder b(g);
  Attrs a2a = group(2);
  a2a.set("scatter_dim", int64_t{2});
  a2a.set("gather_dim", int64_t{1});
  ValueId x32 = g.add_input(Role::constant, T(f32, {2, 4, 6}), "x32");
  ValueId x16 = g.add_input(Role::constant, T(bf16, {2, 4, 6}), "x16");
  b.emit1(OpKind::all_to_all, {x32}, a2a);
  b.emit1(OpKind::all_to_all, {x16}, a2a);
  EXPECT_EQ(node_cost(g, g.node(2)).bytes, 2 * node_cost(g, g.node(3)).bytes);
  EXPECT_EQ(node_cost(g, g.node(3)).bytes, 2.0 * 48 / 2);  // (P - 1) / P of 48 bf16 values
}

// Every floating operand pair of one op: both dtypes in the message, in the op's own terms.
void mixed_f32_and_bf16_is_an_error_naming_both_types() {
  const TensorType a = T(f32, {2, 3}), b = T(bf16, {2, 3});
  const std::string add = infer_error(OpKind::add, {a, b});
  EXPECT_NE(add.find("add(f32[2, 3], bf16[2, 3])"), std::string::npos) << add;
  EXPECT_NE(add.find("a and b must have the same dtype, got a f32[2, 3] and b bf16[2, 3]"), std::string::npos)
      << add;
  EXPECT_NE(add.find("convert"), std::string::npos) << add;
  EXPECT_NE(infer_error(OpKind::mul, {b, a}).find("got a bf16[2, 3] and b f32[2, 3]"), std::string::npos);
  EXPECT_NE(infer_error(OpKind::swiglu, {a, b}).find("gate and up must have the same dtype"), std::string::npos);
  EXPECT_NE(infer_error(OpKind::silu_backward, {b, a}).find("dy and x must have the same dtype"), std::string::npos);
  EXPECT_NE(infer_error(OpKind::div_scalar, {b, T(f32, {})}).find("x and s must have the same dtype"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::linear, {T(f32, {2, 8}), T(f32, {3, 8}), T(f32, {8})}).find("bias must be [3]"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::linear, {T(bf16, {2, 8}), T(f32, {3, 8})})
                .find("x and weight must have the same dtype, got x bf16[2, 8] and weight f32[3, 8]"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::matmul, {a, T(bf16, {3, 4})}).find("a and b must have the same dtype"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::rms_norm, {T(bf16, {2, 8}), T(f32, {8})}, {{"eps", 1e-5}})
                .find("x and weight must have the same dtype"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::rms_norm_backward, {T(f32, {2, 8}), T(bf16, {2, 8}), T(bf16, {8}), T(f32, {2})})
                .find("x and dy must have the same dtype"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::rms_norm_backward, {T(bf16, {2, 8}), T(bf16, {2, 8}), T(bf16, {8}), T(bf16, {2})})
                .find("rstd must be f32"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::gelu_backward, {b, a}, {{"approximate", std::string("tanh")}})
                .find("dy and x must have the same dtype"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::layer_norm, {T(bf16, {2, 8}), T(bf16, {8}), T(f32, {8})}, {{"eps", 1e-5}})
                .find("x and bias must have the same dtype"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::layer_norm, {T(bf16, {2, 8}), T(f32, {8}), T(bf16, {8})}, {{"eps", 1e-5}})
                .find("x and weight must have the same dtype"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::layer_norm_backward,
                        {T(f32, {2, 8}), T(bf16, {2, 8}), T(bf16, {8}), T(f32, {2}), T(f32, {2})})
                .find("x and dy must have the same dtype"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::layer_norm_backward,
                        {T(bf16, {2, 8}), T(bf16, {2, 8}), T(bf16, {8}), T(bf16, {2}), T(f32, {2})})
                .find("mean must be f32"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::layer_norm_backward,
                        {T(bf16, {2, 8}), T(bf16, {2, 8}), T(bf16, {8}), T(f32, {2}), T(bf16, {2})})
                .find("rstd must be f32"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::concat, {a, a, b}, {{"dim", int64_t{0}}})
                .find("operand 0 and operand 2 must have the same dtype, got operand 0 f32[2, 3] and operand 2 bf16[2, 3]"),
            std::string::npos);
}

void f16_and_integers_are_not_floating_operands() {
  const TensorType h = T(DType::f16, {2, 3});
  EXPECT_NE(infer_error(OpKind::add, {h, h}).find("a must be f32 or bf16, got f16[2, 3]"), std::string::npos);
  EXPECT_NE(infer_error(OpKind::silu, {T(i32, {4})}).find("x must be f32 or bf16, got i32[4]"), std::string::npos);
  EXPECT_NE(infer_error(OpKind::gelu, {T(i32, {4})}, {{"approximate", std::string("none")}})
                .find("x must be f32 or bf16, got i32[4]"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::layer_norm, {h, T(DType::f16, {3}), T(DType::f16, {3})}, {{"eps", 1e-5}})
                .find("x must be f32 or bf16, got f16[2, 3]"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::all_reduce, {T(i32, {4})}, group(2)).find("x must be f32 or bf16"),
            std::string::npos);
  // integer operands stay i32: bf16 token ids or positions are refused
  EXPECT_NE(infer_error(OpKind::embedding, {T(bf16, {11, 8}), T(bf16, {1, 5})}).find("tokens must be i32"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::rope, {T(bf16, {1, 5, 2, 4}), T(bf16, {1, 5})}, {{"theta", 1e4}})
                .find("positions must be i32"),
            std::string::npos);
}

// rope's frequencies given as they are: D/2 of them, each positive and finite, without a theta
// (which they replace); and a theta's rope takes no table.
TEST(OpTypes, RopeOfGivenFrequencies) {
  const Types in = {T(f32, {1, 5, 2, 8}), T(i32, {1, 5})};
  const Attrs table{{"rope_type", std::string("frequencies")}, {"inv_freq", std::vector<double>{1.0, 0.1, 0.01, 1e-3}}};
  EXPECT_EQ(infer(OpKind::rope, in, table), (Types{in[0]}));
  auto with = [&](const std::string& key, AttrValue value) {
    Attrs a = table;
    a.set(key, std::move(value));
    return a;
  };
  EXPECT_NE(infer_error(OpKind::rope, in, with("inv_freq", std::vector<double>{1.0, 0.1, 0.01}))
                .find("inv_freq has 3 frequencies; head dim 8 needs 4"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::rope, in, with("inv_freq", std::vector<double>{1.0, 0.0, 0.01, 1e-3}))
                .find("inv_freq[1] = 0 is not a positive frequency"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::rope, in, with("inv_freq", std::vector<double>{1.0, 0.1, std::nan(""), 1e-3}))
                .find("inv_freq[2] = nan is not a positive frequency"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::rope, in, with("theta", 1e4)).find("rope_type frequencies takes no 'theta'"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::rope, in, {{"rope_type", std::string("frequencies")}})
                .find("rope_type frequencies needs 'inv_freq'"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::rope, in, {{"theta", 1e4}, {"inv_freq", std::vector<double>{1.0, 0.1, 0.01, 1e-3}}})
                .find("'inv_freq' is rope_type frequencies' only"),
            std::string::npos);
}

// What every backend's rope kernel rotates by (ops/rope.h): a theta's frequencies as
// rope_inv_freq computes them, and a table as it is.
TEST(OpTypes, TheRopesFrequenciesAreAThetasOrTheTableItself) {
  const int64_t D = 16;
  Attrs llama3{{"theta", 500000.0}, {"rope_type", std::string("llama3")}, {"factor", 8.0},
               {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64.0}};
  std::vector<double> got(D / 2), want(D / 2);
  rope_frequencies(llama3, D, got.data());
  cpu::RopeScaling s;
  s.kind = cpu::RopeScaling::llama3, s.factor = 8.0, s.original_max_position_embeddings = 64.0;
  cpu::rope_inv_freq(D, 500000.0, s, want.data());
  EXPECT_EQ(got, want);
  const std::vector<double> table{0.8, 0.31, 0.0125, 3.5e-4, 1e-5, 7e-6, 2e-7, 1e-9};
  rope_frequencies({{"rope_type", std::string("frequencies")}, {"inv_freq", table}}, D, got.data());
  EXPECT_EQ(got, table);
}

// Shape and attribute errors of the GPT-2 / Gemma ops (layer_norm's bias, gelu's approximate).
TEST(OpTypes, LayerNormAndGeluRefuseBadShapesAndAttributes) {
  const TensorType x = T(f32, {2, 5, 8}), h = T(f32, {8});
  const Attrs eps{{"eps", 1e-5}};
  EXPECT_NE(infer_error(OpKind::layer_norm, {x, h, T(f32, {7})}, eps).find("bias must be [8]"), std::string::npos);
  EXPECT_NE(infer_error(OpKind::layer_norm, {x, T(f32, {2, 8}), h}, eps).find("weight must be [8]"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::layer_norm, {T(f32, {}), T(f32, {1}), T(f32, {1})}, eps).find("rank >= 1"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::layer_norm, {x, h, h}).find("needs a positive 'eps'"), std::string::npos);
  EXPECT_NE(infer_error(OpKind::layer_norm, {x, h, h}, {{"eps", 0.0}}).find("needs a positive 'eps'"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::layer_norm_backward, {T(f32, {2, 5, 7}), x, h, T(f32, {2, 5}), T(f32, {2, 5})})
                .find("dy must have x's shape"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::layer_norm_backward, {x, x, h, T(f32, {2}), T(f32, {2, 5})})
                .find("mean must have x's shape without the last dim"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::gelu, {x}).find("needs an 'approximate' attribute"), std::string::npos);
  EXPECT_NE(infer_error(OpKind::gelu, {x}, {{"approximate", std::string("sigmoid")}})
                .find("approximate must be \"none\" or \"tanh\""),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::gelu, {x}, {{"approximate", int64_t{1}}}).find("approximate must be"),
            std::string::npos);
  EXPECT_NE(infer_error(OpKind::gelu_backward, {x, T(f32, {2, 5, 7})}, {{"approximate", std::string("none")}})
                .find("x must have the shape of dy"),
            std::string::npos);
}

TEST(OpTypes, ElementwiseAndReductionOpsFollowTheOperandDtype) { elementwise_and_reduction_ops_follow_the_operand_dtype(); }
TEST(OpTypes, FillTakesAnOptionalDtype) { fill_takes_an_optional_dtype(); }
TEST(OpTypes, ConvertChangesTheDtypeAndNothingElse) { convert_changes_the_dtype_and_nothing_else(); }
TEST(OpTypes, MatmulsNormsRopeAndEmbeddingFollowTheOperandDtype) { matmuls_norms_rope_and_embedding_follow_the_operand_dtype(); }
TEST(OpTypes, AttentionKeepsAnF32LogSumExp) { attention_keeps_an_f32_log_sum_exp(); }
TEST(OpTypes, MoeFollowsTheOperandDtype) { moe_follows_the_operand_dtype(); }
TEST(OpTypes, CrossEntropyKeepsAnF32LossAndLogSumExp) { cross_entropy_keeps_an_f32_loss_and_log_sum_exp(); }
TEST(OpTypes, LayoutOpsAndCollectivesKeepTheDtype) { layout_ops_and_collectives_keep_the_dtype(); }
TEST(OpTypes, MixedF32AndBf16IsAnErrorNamingBothTypes) { mixed_f32_and_bf16_is_an_error_naming_both_types(); }
TEST(OpTypes, F16AndIntegersAreNotFloatingOperands) { f16_and_integers_are_not_floating_operands(); }

// The matrix is complete: every op but `input` has its types checked above.
TEST(OpTypes, EveryOpHasATypeTest) {
  elementwise_and_reduction_ops_follow_the_operand_dtype();
  fill_takes_an_optional_dtype();
  convert_changes_the_dtype_and_nothing_else();
  matmuls_norms_rope_and_embedding_follow_the_operand_dtype();
  attention_keeps_an_f32_log_sum_exp();
  moe_follows_the_operand_dtype();
  cross_entropy_keeps_an_f32_loss_and_log_sum_exp();
  layout_ops_and_collectives_keep_the_dtype();
  mixed_f32_and_bf16_is_an_error_naming_both_types();
  f16_and_integers_are_not_floating_operands();
  for (int i = 0; i < kNumOps; ++i) {
    const auto op = static_cast<OpKind>(i);
    if (op == OpKind::input) continue;
    EXPECT_TRUE(covered().count(op)) << op_name(op) << " has no type test";
  }
}

}  // namespace
}  // namespace autosp
