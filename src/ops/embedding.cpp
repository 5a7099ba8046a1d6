// embedding (a row gather) and its backward (a scatter-add).
#include "kernels/cpu/fused.h"
#include "ops/op.h"

namespace autosp {

namespace {

// Out-of-range ids would read outside the table: reject them before the kernel runs.
void check_ids(const int32_t* ids, int64_t n, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      user_error("embedding: token id ", ids[i], " at position ", i, " is outside [0, ", vocab, ")");
}

}  // namespace

// embedding(weight[V, H], tokens i32[...]) -> [..., H] of weight's dtype
extern const OpDef embedding_op = {
    .num_inputs = 2,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) -> Types {
      require_floating(in[0], "weight");
      require_rank(in[0], 2, "weight");
      require_dtype(in[1], DType::i32, "tokens");
      Shape out = in[1].shape;
      out.push_back(in[0].shape[1]);
      return {{in[0].dtype, out}};
    },
    .cost = nullptr,
    // dW[v] = sum of dy over the positions holding token v
    .grad = [](GradContext& c) {
      AUTOSP_CHECK(!c.needs[1], "token ids have no gradient");
      c.din[0] = c.b.emit1(OpKind::embedding_backward, {c.dout[0], c.in(1)},
                           {{"vocab", c.b.shape(c.in(0))[0]}});
    },
    .cpu = [](const KernelArgs& a) {
      const Shape& w = a.in_shape(0);
      check_ids(a.in<int32_t>(1), a.in_numel(1), w[0]);
      cpu::embedding_forward(a.in(0), a.in<int32_t>(1), a.in_numel(1), w[1], a.out(0));
    },
    // rows follow the tokens: out dim d is tokens' dim d
    .shard = [](const Shardings& in, const Types&, const Attrs&) -> Shardings {
      require(is_replicated(in[0]), "the table must be replicated");
      require(!is_partial(in[1]), "token ids cannot be partial");
      return {in[1]};
    },
};

// embedding_backward(dy[..., H], tokens i32[...]) {vocab} -> dW[vocab, H] of dy's dtype
extern const OpDef embedding_backward_op = {
    .num_inputs = 2,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      require_floating(in[0], "dy");
      require_dtype(in[1], DType::i32, "tokens");
      require(attrs.has("vocab") && attrs.get_int("vocab") > 0, "needs a positive 'vocab'");
      Shape expect = in[1].shape;
      expect.push_back(in[0].shape.empty() ? -1 : in[0].shape.back());
      require(in[0].shape == expect, "dy must be tokens' shape + [H]");
      return {{in[0].dtype, {attrs.get_int("vocab"), in[0].shape.back()}}};
    },
    .cost = [](const Types& in, const Types&, const Attrs&) {
      return Cost{double(numel(in[0].shape)), 0};
    },
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) {
      const Shape& w = a.out_shape(0);
      check_ids(a.in<int32_t>(1), a.in_numel(1), w[0]);
      cpu::embedding_backward(a.in(0), a.in<int32_t>(1), a.in_numel(1), w[1], w[0], a.out(0));
    },
};

}  // namespace autosp
