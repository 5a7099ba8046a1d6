#include "frontend/tracer.h"

namespace autosp {

Tensor Tracer::op(OpKind kind, std::vector<Tensor> inputs, Attrs attrs) {
  std::vector<ValueId> ids;
  for (Tensor t : inputs) {
    AUTOSP_CHECK(t.id >= 0 && t.id < static_cast<ValueId>(graph_.values().size()),
                 op_name(kind), ": operand is not a tensor of this trace");
    ids.push_back(t.id);
  }
  return {b_.emit(kind, std::move(ids), std::move(attrs))[0]};
}

Tensor Tracer::parameter(const std::string& name, const Shape& shape, DType dtype) {
  if (!is_floating(dtype))
    user_error("parameter '", name, "' must be f32 or bf16, got ", dtype_name(dtype));
  return input(Role::parameter, name, dtype, shape);
}

Tensor Tracer::input(Role role, const std::string& name, DType dtype, const Shape& shape) {
  if (graph_.find_input(name) >= 0) user_error("input '", name, "' is declared twice");
  for (int64_t d : shape)
    if (d < 0) user_error("input '", name, "' has a negative dim in ", shape_str(shape));
  return {graph_.add_input(role, {dtype, shape}, name)};
}

Tensor Tracer::embedding(Tensor w, Tensor tokens) { return op(OpKind::embedding, {w, tokens}); }
Tensor Tracer::embedding(Tensor w, Tensor tokens, int64_t padding_idx) {
  return op(OpKind::embedding, {w, tokens}, {{"padding_idx", padding_idx}});
}
Tensor Tracer::linear(Tensor x, Tensor w) { return op(OpKind::linear, {x, w}); }
Tensor Tracer::linear(Tensor x, Tensor w, Tensor bias) { return op(OpKind::linear, {x, w, bias}); }
Tensor Tracer::add(Tensor a, Tensor b) { return op(OpKind::add, {a, b}); }
Tensor Tracer::mul(Tensor a, Tensor b) { return op(OpKind::mul, {a, b}); }
Tensor Tracer::scale(Tensor x, double alpha, double beta) {
  if (beta == 0.0) return op(OpKind::scale, {x}, {{"alpha", alpha}});
  return op(OpKind::scale, {x}, {{"alpha", alpha}, {"beta", beta}});
}
Tensor Tracer::silu(Tensor x) { return op(OpKind::silu, {x}); }
Tensor Tracer::relu(Tensor x) { return op(OpKind::relu, {x}); }
Tensor Tracer::div(Tensor a, Tensor b) { return op(OpKind::div, {a, b}); }
Tensor Tracer::div_scalar(Tensor x, Tensor s) { return op(OpKind::div_scalar, {x, s}); }
Tensor Tracer::stop_gradient(Tensor x) { return op(OpKind::stop_gradient, {x}); }
Tensor Tracer::vector_norm(Tensor x) { return op(OpKind::vector_norm, {x}); }
Tensor Tracer::tanh(Tensor x) { return op(OpKind::tanh, {x}); }
Tensor Tracer::clamp(Tensor x, std::optional<double> min, std::optional<double> max) {
  Attrs attrs;
  if (min) attrs.set("min", *min);
  if (max) attrs.set("max", *max);
  return op(OpKind::clamp, {x}, attrs);
}
Tensor Tracer::xielu(Tensor x, Tensor alpha_p, Tensor alpha_n, double beta, double eps) {
  return op(OpKind::xielu, {x, alpha_p, alpha_n}, {{"beta", beta}, {"eps", eps}});
}
Tensor Tracer::swiglu(Tensor gate, Tensor up) { return op(OpKind::swiglu, {gate, up}); }
Tensor Tracer::sum(Tensor x) { return op(OpKind::sum, {x}); }
Tensor Tracer::fill(const Shape& shape, double value, DType dtype) {
  return op(OpKind::fill, {}, {{"shape", shape}, {"value", value}, {"dtype", std::string(dtype_name(dtype))}});
}
Tensor Tracer::broadcast(Tensor x, Tensor like, int64_t dims) {
  return op(OpKind::broadcast, {x, like}, {{"dims", dims}});
}
Tensor Tracer::convert(Tensor x, DType dtype) {
  return op(OpKind::convert, {x}, {{"dtype", std::string(dtype_name(dtype))}});
}

Tensor Tracer::rms_norm(Tensor x, Tensor w, double eps) {
  return op(OpKind::rms_norm, {x, w}, {{"eps", eps}});
}

Tensor Tracer::gelu(Tensor x, bool tanh_approximation) {
  return op(OpKind::gelu, {x}, {{"approximate", std::string(tanh_approximation ? "tanh" : "none")}});
}

Tensor Tracer::layer_norm(Tensor x, Tensor w, Tensor bias, double eps) {
  return op(OpKind::layer_norm, {x, w, bias}, {{"eps", eps}});
}

Tensor Tracer::rope(Tensor x, Tensor positions, const RopeOptions& o) {
  return op(OpKind::rope, {x, positions}, rope_attrs(o));
}

Attrs rope_attrs(const RopeOptions& o) {
  if (o.rope_type == "frequencies") {
    Attrs attrs{{"rope_type", o.rope_type}};
    attrs.set("inv_freq", o.inv_freq);
    if (o.interleaved) attrs.set("interleaved", int64_t{1});
    return attrs;
  }
  Attrs attrs{{"theta", o.theta}};
  if (o.rope_type != "default") {
    attrs.set("rope_type", o.rope_type);
    attrs.set("factor", o.factor);
  }
  if (o.rope_type == "llama3") {
    attrs.set("low_freq_factor", o.low_freq_factor);
    attrs.set("high_freq_factor", o.high_freq_factor);
    attrs.set("original_max_position_embeddings", o.original_max_position_embeddings);
  }
  if (o.rope_type == "yarn") {
    attrs.set("original_max_position_embeddings", o.original_max_position_embeddings);
    attrs.set("beta_fast", o.beta_fast);
    attrs.set("beta_slow", o.beta_slow);
    attrs.set("truncate", int64_t{o.truncate});
  }
  if (o.interleaved) attrs.set("interleaved", int64_t{1});
  return attrs;
}

namespace {
// The window, softcap and alibi attributes only where there is one: a graph without stays as
// it always was.
Attrs attention_attrs(bool causal, double scale, int64_t window, double softcap, const std::vector<double>& alibi) {
  Attrs attrs{{"causal", int64_t{causal}}, {"scale", scale}};
  if (window != 0) attrs.set("window", window);
  if (softcap != 0) attrs.set("softcap", softcap);
  if (!alibi.empty()) attrs.set("alibi", alibi);
  return attrs;
}
}  // namespace

Tensor Tracer::attention(Tensor q, Tensor k, Tensor v, bool causal, double scale, int64_t window, double softcap,
                         const std::vector<double>& alibi) {
  return op(OpKind::attention, {q, k, v}, attention_attrs(causal, scale, window, softcap, alibi));
}

Tensor Tracer::attention(Tensor q, Tensor k, Tensor v, Tensor documents, bool causal, double scale, int64_t window,
                         double softcap, const std::vector<double>& alibi) {
  return op(OpKind::attention, {q, k, v, documents}, attention_attrs(causal, scale, window, softcap, alibi));
}

Tensor Tracer::attention(Tensor q, Tensor k, Tensor v, const std::optional<Tensor>& documents,
                         const std::optional<Tensor>& sinks, bool causal, double scale, int64_t window, double softcap,
                         const std::vector<double>& alibi, int64_t chunk, const std::vector<double>& temperature) {
  std::vector<Tensor> ins = {q, k, v};
  Attrs attrs = attention_attrs(causal, scale, window, softcap, alibi);
  if (chunk != 0) attrs.set("chunk", chunk);
  if (!temperature.empty()) attrs.set("temperature", temperature);
  if (sinks) {
    ins.push_back(*sinks);
    attrs.set("sinks", int64_t{1});
  }
  if (documents) ins.push_back(*documents);
  return op(OpKind::attention, ins, attrs);
}

Tensor Tracer::cross_entropy(Tensor logits, Tensor labels, int64_t ignore_index) {
  Attrs attrs{{"ignore_index", ignore_index}};
  Tensor loss_sum = op(OpKind::cross_entropy, {logits, labels}, attrs);
  Tensor count = op(OpKind::count_valid, {labels}, attrs);
  return op(OpKind::div_scalar, {loss_sum, count});
}

Tensor Tracer::linear_cross_entropy(Tensor x, Tensor weight, Tensor labels, int64_t ignore_index, double softcap) {
  Attrs attrs{{"ignore_index", ignore_index}};  // the op picks its chunk from V
  Attrs head = attrs;
  if (softcap != 0) head.set("softcap", softcap);
  Tensor loss_sum = op(OpKind::linear_cross_entropy, {x, weight, labels}, head);
  Tensor count = op(OpKind::count_valid, {labels}, attrs);
  return op(OpKind::div_scalar, {loss_sum, count});
}

Tensor Tracer::moe(Tensor x, Tensor router_logits, const std::vector<Tensor>& experts, int64_t top_k,
                   bool normalize, Attrs routing) {
  std::vector<Tensor> in{x, router_logits};
  in.insert(in.end(), experts.begin(), experts.end());
  routing.set("top_k", top_k);
  routing.set("normalize", int64_t{normalize});
  return op(OpKind::moe, in, routing);
}

Tensor Tracer::moe_balance(const std::vector<Tensor>& router_logits, int64_t top_k) {
  return op(OpKind::moe_balance, router_logits, {{"top_k", top_k}});
}

Tensor Tracer::reshape(Tensor x, const Shape& shape) {
  return op(OpKind::reshape, {x}, {{"shape", shape}});
}
Tensor Tracer::transpose(Tensor x, const std::vector<int64_t>& perm) {
  return op(OpKind::transpose, {x}, {{"perm", perm}});
}
Tensor Tracer::slice(Tensor x, int64_t dim, int64_t start, int64_t end) {
  return op(OpKind::slice, {x}, {{"dim", dim}, {"start", start}, {"end", end}});
}
Tensor Tracer::concat(const std::vector<Tensor>& xs, int64_t dim) {
  return op(OpKind::concat, xs, {{"dim", dim}});
}

}  // namespace autosp
