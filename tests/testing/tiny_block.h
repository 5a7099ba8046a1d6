// A small pre-norm transformer (embedding, one Llama-style block with GQA attention and a
// SwiGLU MLP, final norm, untied head, cross-entropy), traced with the frontend. Used by
// the golden autodiff test and the end-to-end finite-difference test.
#pragma once
#include <cmath>
#include <string>

#include "frontend/tracer.h"

namespace autosp::testing {

struct TinyDims {
  int64_t B = 1, S = 5, V = 11, H = 8, NH = 2, NKV = 1, D = 4, F = 12;
};

inline Graph tiny_transformer(const TinyDims& d = {}, const std::string& loss_name = "loss") {
  Tracer t;
  Tensor tokens = t.input(Role::tokens, "tokens", DType::i32, {d.B, d.S});
  Tensor labels = t.input(Role::labels, "labels", DType::i32, {d.B, d.S});
  Tensor positions = t.input(Role::positions, "positions", DType::i32, {d.B, d.S});
  Tensor embed = t.parameter("embed", {d.V, d.H});
  Tensor attn_norm = t.parameter("attn_norm", {d.H});
  Tensor wq = t.parameter("wq", {d.NH * d.D, d.H});
  Tensor wk = t.parameter("wk", {d.NKV * d.D, d.H});
  Tensor wv = t.parameter("wv", {d.NKV * d.D, d.H});
  Tensor wo = t.parameter("wo", {d.H, d.NH * d.D});
  Tensor mlp_norm = t.parameter("mlp_norm", {d.H});
  Tensor w_gate = t.parameter("w_gate", {d.F, d.H});
  Tensor w_up = t.parameter("w_up", {d.F, d.H});
  Tensor w_down = t.parameter("w_down", {d.H, d.F});
  Tensor final_norm = t.parameter("final_norm", {d.H});
  Tensor head = t.parameter("head", {d.V, d.H});

  const double eps = 1e-5;
  Tensor x = t.embedding(embed, tokens);
  Tensor h = t.rms_norm(x, attn_norm, eps);
  Tensor q = t.reshape(t.linear(h, wq), {d.B, d.S, d.NH, d.D});
  Tensor k = t.reshape(t.linear(h, wk), {d.B, d.S, d.NKV, d.D});
  Tensor v = t.reshape(t.linear(h, wv), {d.B, d.S, d.NKV, d.D});
  RopeOptions rope;
  rope.theta = 10000.0;
  q = t.rope(q, positions, rope);
  k = t.rope(k, positions, rope);
  Tensor a = t.attention(q, k, v, /*causal=*/true, 1.0 / std::sqrt(double(d.D)));
  x = t.add(x, t.linear(t.reshape(a, {d.B, d.S, d.NH * d.D}), wo));
  h = t.rms_norm(x, mlp_norm, eps);
  Tensor gate = t.linear(h, w_gate);  // one statement per op: a fixed node order
  Tensor up = t.linear(h, w_up);
  x = t.add(x, t.linear(t.swiglu(gate, up), w_down));
  Tensor logits = t.linear(t.rms_norm(x, final_norm, eps), head);
  t.output(loss_name, t.cross_entropy(logits, labels));
  return t.finish();
}

}  // namespace autosp::testing
