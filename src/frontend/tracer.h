// The tracing API model code is written in: plain single-device tensor code that records
// a forward graph. Shapes are checked as each op is recorded; a mismatch is a UserError
// naming the op and its operand shapes.
//
//   Tracer t;
//   Tensor tokens = t.input(Role::tokens, "tokens", DType::i32, {B, S});
//   Tensor w = t.parameter("model.embed_tokens.weight", {V, H});
//   Tensor x = t.embedding(w, tokens);
//   ...
//   t.output("loss", t.cross_entropy(logits, labels));
//   Graph forward = t.finish();
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/op.h"

namespace autosp {

struct Tensor {
  ValueId id = -1;
};

// Hugging Face's rope types (transformers' modeling_rope_utils): "default", "linear"
// (frequencies / factor), "llama3" (factor, low/high_freq_factor, original positions) and
// "yarn" (factor, original positions, beta_fast/slow, truncate; its attention_factor scales
// cos and sin, which the model applies as attention_factor^2 on the attention scale, since
// it multiplies both q and k). And autosp's own "frequencies": the D/2 inverse frequencies as
// they are (`inv_freq`; theta and the scaling unused), for a table none of those give.
struct RopeOptions {
  double theta = 10000.0;
  std::string rope_type = "default";
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192.0;
  double beta_fast = 32.0, beta_slow = 1.0;  // yarn
  bool truncate = true;                      // yarn
  double attention_factor = 1.0;             // yarn, resolved from factor / mscale / mscale_all_dim
  bool interleaved = false;                  // pairs (2i, 2i + 1), GPT-J's layout, not (i, i + D/2)
  std::vector<double> inv_freq;              // "frequencies"
};

// The rope op's attributes for these options (what Tracer::rope emits).
Attrs rope_attrs(const RopeOptions& options);

class Tracer {
 public:
  Tracer() : b_(graph_) {}

  Tensor parameter(const std::string& name, const Shape& shape, DType dtype = DType::f32);
  Tensor input(Role role, const std::string& name, DType dtype, const Shape& shape);
  void output(const std::string& name, Tensor t) { graph_.add_output(name, t.id); }
  Graph finish() { return std::move(graph_); }
  const Graph& graph() const { return graph_; }  // as traced so far

  const Shape& shape(Tensor t) const { return graph_.shape(t.id); }

  Tensor embedding(Tensor weight, Tensor tokens);
  // torch's padding_idx: that row's gradient stays zero.
  Tensor embedding(Tensor weight, Tensor tokens, int64_t padding_idx);
  Tensor linear(Tensor x, Tensor weight);               // x W^T
  Tensor linear(Tensor x, Tensor weight, Tensor bias);  // x W^T + b
  Tensor add(Tensor a, Tensor b);
  Tensor mul(Tensor a, Tensor b);
  Tensor scale(Tensor x, double alpha, double beta = 0.0);  // alpha x + beta
  Tensor div(Tensor a, Tensor b);                            // a / b, one shape
  Tensor div_scalar(Tensor x, Tensor s);                     // x / s, s a scalar []
  // x, through which no gradient flows (torch's detach)
  Tensor stop_gradient(Tensor x);
  // the 2-norm of each row over the last dim: [..., n] -> [...]
  Tensor vector_norm(Tensor x);
  Tensor silu(Tensor x);
  Tensor relu(Tensor x);
  Tensor tanh(Tensor x);  // torch.tanh
  // torch.clamp: min(max(x, min), max), either bound optional (not both)
  Tensor clamp(Tensor x, std::optional<double> min, std::optional<double> max);
  // xIELU (Apertus) with its learned scalars alpha_p, alpha_n ([1]) and constants beta, eps
  Tensor xielu(Tensor x, Tensor alpha_p, Tensor alpha_n, double beta, double eps);
  Tensor swiglu(Tensor gate, Tensor up);  // silu(gate) * up
  Tensor rms_norm(Tensor x, Tensor weight, double eps);
  // torch.nn.functional.gelu: the erf form, or approximate="tanh" (GPT-2, Gemma)
  Tensor gelu(Tensor x, bool tanh_approximation);
  // torch.nn.functional.layer_norm over the last dim with weight and bias [H]
  Tensor layer_norm(Tensor x, Tensor weight, Tensor bias, double eps);
  Tensor rope(Tensor x, Tensor positions, const RopeOptions& options);
  // window W > 0 (causal only): query i sees only keys i - W < j <= i (a sliding window).
  // softcap c > 0 (Gemma 2): each score s = scale q.k becomes c tanh(s / c) before the softmax.
  // alibi (BLOOM, MPT; empty: none): the slopes a_h of the NH query heads, each score of query
  // i and key j gains a_h (j - i).
  Tensor attention(Tensor q, Tensor k, Tensor v, bool causal, double scale, int64_t window = 0, double softcap = 0,
                   const std::vector<double>& alibi = {});
  // Attention within documents: `documents` (i32 [B, S], non-decreasing) keeps each query to
  // the keys of its own document (packed samples).
  Tensor attention(Tensor q, Tensor k, Tensor v, Tensor documents, bool causal, double scale, int64_t window = 0,
                   double softcap = 0, const std::vector<double>& alibi = {});
  // Either, with sinks (gpt-oss; [NH] of q's dtype: a learned logit per query head that joins
  // each row's softmax as a key of zero value) where given, and documents where given. Llama 4's
  // chunk C > 0 (causal): each query sees only the keys of its own chunk of C positions; its
  // temperature [F, A] (non-empty): query row i scaled by log1p(floor((i + 1) / F)) A + 1.
  Tensor attention(Tensor q, Tensor k, Tensor v, const std::optional<Tensor>& documents,
                   const std::optional<Tensor>& sinks, bool causal, double scale, int64_t window, double softcap,
                   const std::vector<double>& alibi, int64_t chunk = 0, const std::vector<double>& temperature = {});
  // Mean over labelled tokens (label != ignore_index) of -log softmax(logits)[label].
  Tensor cross_entropy(Tensor logits, Tensor labels, int64_t ignore_index = -100);
  // cross_entropy(linear(x, weight), labels) as one fused op that never holds the
  // [..., V] logits (the LM head and its loss, for training).
  // softcap c > 0: of the logits c tanh(x weight^T / c) (Gemma 2's final_logit_softcapping).
  Tensor linear_cross_entropy(Tensor x, Tensor weight, Tensor labels, int64_t ignore_index = -100,
                              double softcap = 0);
  // The sparse mixture-of-experts block (Mixtral's, Qwen-MoE's): each row of x through the top_k
  // of E SwiGLU experts its router logits [..., E] rank highest, weighted by their softmax
  // probabilities (normalize: divided by their sum). experts: gate, up [I, H] and down [H, I] of
  // each expert in turn (3 E tensors), or stacked as transformers 5 keeps them: gate_up
  // [E, 2 I, H] (each expert's gate rows, then its up rows) and down [E, H, I] (2 tensors).
  // `routing`: the routing beyond softmax top-k (ops/moe.cpp's attributes: score, groups,
  // topk_group, group_score, dropped, scale, norm_eps, bias; kernels/cpu/moe.h's MoeRouting).
  Tensor moe(Tensor x, Tensor router_logits, const std::vector<Tensor>& experts, int64_t top_k, bool normalize,
             Attrs routing = {});
  // The load-balancing statistics of L layers' router logits [..., E] (each row's top_k): f32
  // [2, E], the count of rows choosing each expert and the sum of its probabilities.
  Tensor moe_balance(const std::vector<Tensor>& router_logits, int64_t top_k);
  Tensor reshape(Tensor x, const Shape& shape);
  Tensor transpose(Tensor x, const std::vector<int64_t>& perm);
  Tensor slice(Tensor x, int64_t dim, int64_t start, int64_t end);
  Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
  Tensor sum(Tensor x);
  Tensor fill(const Shape& shape, double value, DType dtype = DType::f32);  // a constant
  // x repeated over like's first `dims` dims ([like's first dims..., x's shape...]); like is read
  // for its shape only
  Tensor broadcast(Tensor x, Tensor like, int64_t dims);
  Tensor convert(Tensor x, DType dtype);  // f32 <-> bf16, rounding to nearest even

 private:
  Tensor op(OpKind kind, std::vector<Tensor> inputs, Attrs attrs = {});

  Graph graph_;
  GraphBuilder b_;
};

}  // namespace autosp
