// Causal (or full) attention with grouped KV heads, flash-style: the forward saves only
// the log-sum-exp of each query row, and neither direction holds an S x S matrix.
#include "kernels/cpu/attention.h"
#include "ops/op.h"

namespace autosp {

namespace {

// q [B, S, NH, D], k and v [B, S, NKV, D], of one floating dtype
cpu::AttentionDims attention_dims(const Types& in) {
  for (int i = 0; i < 3; ++i) {
    const char* name = i == 0 ? "q" : i == 1 ? "k" : "v";
    require_floating(in[i], name);
    require_same_dtype(in[0], "q", in[i], name);
    require_rank(in[i], 4, i == 0 ? "q [B, S, NH, D]" : i == 1 ? "k [B, S, NKV, D]" : "v [B, S, NKV, D]");
  }
  const Shape &q = in[0].shape, &k = in[1].shape;
  require(k == in[2].shape, "k and v must have the same shape");
  require(q[0] == k[0] && q[1] == k[1] && q[3] == k[3], "q and k must agree on B, S and D");
  require(k[2] > 0 && q[2] % k[2] == 0, "query heads NH=", q[2],
          " must be a multiple of kv heads NKV=", k[2]);
  return {q[0], q[1], q[2], k[2], q[3]};
}

void check_attrs(const Attrs& attrs) {
  require(attrs.has("scale") && attrs.get_float("scale") > 0, "needs a positive 'scale'");
  require(attrs.has("causal"), "needs 'causal' (0 or 1)");
}

double attention_flops(const cpu::AttentionDims& d, bool causal, double matmuls) {
  // Each S x S x D matmul is 2 S^2 D FLOPs per head; causal halves the work.
  return matmuls * 2.0 * d.B * d.NH * d.S * d.S * d.D * (causal ? 0.5 : 1.0);
}

}  // namespace

// attention(q, k, v) {causal, scale} -> (out [B, S, NH, D], lse [B, NH, S])
// out has q's dtype; lse is f32 for bf16 operands too, as FlashAttention's softmax_lse: the
// backward rebuilds the probabilities exp(s - lse) from it, and an lse near 10 rounded to
// bf16 (8 significant bits) is off by up to 0.03, scaling its row's probabilities by 3%.
extern const OpDef attention_op = {
    .num_inputs = 3,
    .num_outputs = 2,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      cpu::AttentionDims d = attention_dims(in);
      check_attrs(attrs);
      return {in[0], {DType::f32, {d.B, d.NH, d.S}}};
    },
    .cost = [](const Types& in, const Types&, const Attrs& attrs) {
      return Cost{attention_flops(attention_dims(in), attrs.get_int("causal") != 0, 2), 0};
    },
    // FlashAttention backward: recomputes the probabilities from q, k and lse.
    .grad = [](GradContext& c) {
      AUTOSP_CHECK(c.dout[1] < 0, "nothing differentiates through the log-sum-exp");
      auto d = c.b.emit(OpKind::attention_backward,
                        {c.dout[0], c.in(0), c.in(1), c.in(2), c.out(0), c.out(1)}, c.attrs());
      for (int i = 0; i < 3; ++i)
        if (c.needs[i]) c.din[i] = d[i];
    },
    .cpu = [](const KernelArgs& a) {
      cpu::AttentionDims d = attention_dims({*a.in_types[0], *a.in_types[1], *a.in_types[2]});
      cpu::attention_forward(d, a.attrs->get_int("causal") != 0, float(a.attrs->get_float("scale")),
                             a.in(0), a.in(1), a.in(2), a.out(0), a.out(1),
                             static_cast<float*>(a.workspace), a.threads);
    },
    .cpu_workspace_bytes = [](const Types& in, const Attrs&, int threads) -> int64_t {
      return cpu::attention_forward_workspace_floats(attention_dims(in), threads) * 4;
    },
    // Every query needs every key: the sequence must be whole, so heads are split instead
    // (the autosp pass exchanges q, k, v to shard(2) before and the output back after).
    .shard = [](const Shardings& in, const Types&, const Attrs&) -> Shardings {
      for (const Sharding& s : in)
        require(s == in[0] && !is_partial(s) && (!is_shard(s) || s.dim == 0 || s.dim == 2),
                "attention needs the whole sequence: q, k, v must be split alike on B or heads, got ",
                sharding_str(s));
      if (is_shard(in[0])) return {in[0], shard(in[0].dim == 2 ? 1 : 0)};  // lse is [B, NH, S]
      return {in[0], in[0]};
    },
};

// attention_backward(dout, q, k, v, out, lse) {causal, scale} -> (dq, dk, dv), each of its
// operand's type (so of q's dtype); lse is f32.
extern const OpDef attention_backward_op = {
    .num_inputs = 6,
    .num_outputs = 3,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      cpu::AttentionDims d = attention_dims({in[1], in[2], in[3]});
      check_attrs(attrs);
      require(in[0] == in[1] && in[4] == in[1], "dout and out must have q's type");
      require(in[5] == TensorType{DType::f32, {d.B, d.NH, d.S}}, "lse must be f32[B, NH, S]");
      return {in[1], in[2], in[3]};
    },
    .cost = [](const Types& in, const Types&, const Attrs& attrs) {
      return Cost{attention_flops(attention_dims({in[1], in[2], in[3]}),
                                  attrs.get_int("causal") != 0, 5), 0};
    },
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) {
      cpu::AttentionDims d = attention_dims({*a.in_types[1], *a.in_types[2], *a.in_types[3]});
      cpu::attention_backward(d, a.attrs->get_int("causal") != 0, float(a.attrs->get_float("scale")),
                              a.in(1), a.in(2), a.in(3), a.in(4), a.in(5), a.in(0), a.out(0),
                              a.out(1), a.out(2), static_cast<float*>(a.workspace), a.threads);
    },
    .cpu_workspace_bytes = [](const Types& in, const Attrs&, int threads) -> int64_t {
      return cpu::attention_backward_workspace_floats(attention_dims({in[1], in[2], in[3]}), threads) * 4;
    },
};

}  // namespace autosp
