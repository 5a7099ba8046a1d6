// CPU kernels of the mixture-of-experts layer (the `moe` op): the sparse MoE block of Mixtral,
// Qwen2/3-MoE and OLMoE. T tokens (the rows of x [T, H]), E experts, each a SwiGLU MLP
// down_e(silu(gate_e x) * up_e x) with gate_e, up_e [I, H] and down_e [H, I], and each token
// sent to the k experts its router logits [T, E] rank highest:
//
//   p = softmax(logits[t]),  e_1..e_k = the k largest p (ties to the lower expert),
//   w_j = p_{e_j}  (normalize: p_{e_j} / sum_i p_{e_i}, Mixtral's and norm_topk_prob's),
//   y[t] = sum over the chosen experts in ascending order of w_j expert_{e_j}(x[t])
//
// which is transformers' loop (index_add_ per expert, ascending) with no token dropped. Each
// expert runs on its own tokens only, gathered in ascending order, in chunks of at most
// kMoeChunkRows rows: two gemms, the fused swiglu, one gemm, a scatter-add. The forward keeps,
// per slot (a token's j-th choice) in the experts' order, the expert's gate and up products and
// its output (`saved`, what a dense MLP's backward keeps: the backward runs no gemm of the
// forward again; under checkpointing the op is recomputed whole, like any other); the routing
// is computed in double and rounded once, and recomputed by the backward. Sums over tokens (the
// weights' gradients) follow the chunks' fixed order, so the results are the same on any thread
// count.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/moe_experts.h"
#include "kernels/cpu/moe_routing.h"

namespace autosp::cpu {

// How a token's experts are chosen and weighted beyond softmax top-k (DeepSeek-V3's and GLM-4.5's
// routers; the defaults are Mixtral's):
//   s = softmax(logits) or, `sigmoid`, sigmoid of each logit;  c = s + bias (the choice's scores);
//   `groups` > 1: the E experts in `groups` equal groups, each scored by its best c (`group_top2`:
//   the sum of its two best), and only the `topk_group` best groups' experts stay choosable (the
//   others' c is -inf, or 0 with `dropped_zero`); the k largest c chosen (ties to the lower
//   expert), weighted by their s (never c): u_j = s_{e_j}, normalize: u_j / (sum_i u_i + norm_eps),
//   then times `scale`.
struct MoeRouting {
  bool sigmoid = false;
  int64_t groups = 1, topk_group = 1;
  bool group_top2 = false, dropped_zero = false;
  double scale = 1.0, norm_eps = 0.0;
  std::vector<double> bias;  // [E], or empty: none
};

// The experts' form (the default: SwiGLU experts of their own gate, up and down matrices), and
// where the routing weight applies:
//   `gpt_oss`: gpt-oss's experts, with biases and a clamped GLU,
//     [g | u] = x W_gu + b_gu   (W_gu [H, 2 I], b_gu [2 I]: gate and up columns interleaved, g_j
//                                column 2 j and u_j column 2 j + 1, as gpt-oss keeps them)
//     h = (clamp(u, -L, L) + 1) c sigmoid(alpha c),  c = min(g, L)
//     expert(x) = h W_d + b_d   (W_d [I, H], b_d [H])
//   with alpha 1.702 and the limit L 7 in gpt-oss; the clamps' gradient is torch's: 1 where the
//   value is within its bounds (bounds included), else 0;
//   `llama4`: Llama 4's, [g | u] = x W_gu (the gate's I columns, then the up's: torch's chunk),
//     expert(x) = (silu(g) u) W_d, no biases.
// Both are fused: one [H, 2 I] product for the gate and the up (moe_fused_*; moe_experts.h).
//   `weight_input` (Llama 4's): the routing weight w_j scales the expert's input, not its output:
//     y[t] = sum_j expert_{e_j}(w_j x[t]),  so dw_j = <dx_j, x[t]> with dx_j the gradient at the
//     expert's input, and x[t] gains w_j dx_j.
struct MoeExperts {
  enum Form { swiglu, gpt_oss, llama4 } form = swiglu;
  bool weight_input = false;
  double alpha = 1.702, limit = 7.0;
  bool fused() const { return form != swiglu; }
  moe_experts::FusedForm fused_form() const { return {form == gpt_oss, float(alpha), float(limit)}; }
};

// zero_experts Z (LongCat-Flash's zero-computation experts): the last Z of the E experts the router
// chooses among are the identity, expert(x) = x, with no weights; the others, E - Z, are computed
// (experts_with_weights()). Their slots add w_j x[t]: dw_j = <dy[t], x[t]>, and x[t] gains w_j dy[t].
struct MoeDims {
  int64_t T = 0, H = 0, I = 0, E = 0, k = 0;
  int64_t zero_experts = 0;
  int64_t experts_with_weights() const { return E - zero_experts; }
  bool normalize = false;
  bool down_transposed = false;  // each expert's down given as [I, H] (DBRX's w2), not [H, I]
  MoeRouting routing;
  MoeExperts experts;
};

constexpr int64_t kMoeChunkRows = 512;

// The router as moe_routing.h's functions take it (its bias pointing into d's).
moe_routing::Route moe_route_of(const MoeDims& d);

// Token t's experts[t, j] and weights[t, j], j < k, in descending order of p.
void moe_route(const MoeDims& d, const float* logits, int32_t* experts, float* weights);

// The slots t k + j by expert, ascending t within each (a counting sort of experts [T, k]):
// expert e's are slots[start[e] .. start[e + 1]). Host code, the cuda op's too.
void moe_slots(const MoeDims& d, const int32_t* experts, int32_t* slots, int32_t* start);

// The experts' weights as the op takes them: w[3e], w[3e + 1], w[3e + 2] are expert e's gate,
// up and down (dw likewise; down [I, H] where d.down_transposed). saved: moe_saved_floats(d), three planes over the T k slots in the
// experts' order, gate products [T k, I], up products [T k, I], outputs [T k, H]. Workspace:
// moe_workspace_floats(d, backward) floats.
int64_t moe_saved_floats(const MoeDims& d);

// The saved planes at slot `at` (in the experts' order): the element offsets of its gate and up
// products [., I] and its output [., H]. Host code, the cuda op's layout too (ops/moe.cpp).
struct MoeSavedAt {
  int64_t g, u, o;
};
inline MoeSavedAt moe_saved_at(const MoeDims& d, int64_t at) {
  const int64_t slots = d.T * d.k;
  return {at * d.I, (slots + at) * d.I, 2 * slots * d.I + at * d.H};
}
// Every expert's slots in chunks of at most R rows, experts and chunks in order: chunk(e, at, n)
// for the n slots slots[at .. at + n) of expert e (start as moe_slots gives it). Host code: the
// CPU kernels' loop and the cuda op's.
// (Or of experts first .. last - 1.)
template <class Start, class Chunk>
void for_each_expert_chunk(int64_t first, int64_t last, const Start& start, int64_t R, Chunk&& chunk) {
  for (int64_t e = first; e < last; ++e)
    for (int64_t at = start[e]; at < start[e + 1]; at += R) chunk(e, at, std::min<int64_t>(R, start[e + 1] - at));
}
template <class Start, class Chunk>
void for_each_expert_chunk(int64_t E, const Start& start, int64_t R, Chunk&& chunk) {
  for_each_expert_chunk(0, E, start, R, chunk);
}
int64_t moe_workspace_floats(const MoeDims& d, bool backward);
void moe_forward(const MoeDims& d, const float* x, const float* logits, const float* const* w, float* y, float* saved,
                 float* workspace);
// dx (the experts' part; the router's reaches x through dlogits), dlogits, and every expert's
// dgate, dup, ddown (zero for an expert no token chose), from the forward's saved products.
//   dw_j = <dy[t], expert_{e_j}(x[t])>;  softmax, normalize (w the softmax of the chosen logits
//   alone, times the scale c): dlogits[t, e_j] = w_j (dw_j - sum_i dw_i w_i / c) and 0 for the
//   others (exactly); otherwise through du_j, the gradient of u_j = s_{e_j} (c dw_j, or
//   normalized c (dw_j / D - sum_i dw_i u_i / D^2), D = sum_i u_i + norm_eps): softmax
//   dlogits[t, e] = p_e (du_e - sum_j du_j p_{e_j}) (du_e = 0 unchosen), sigmoid
//   dlogits[t, e] = du_e s_e (1 - s_e). The choice (top k, groups, the bias) has no gradient.
void moe_backward(const MoeDims& d, const float* dy, const float* x, const float* logits, const float* saved,
                  const float* const* w, float* dx, float* dlogits, float* const* dw, float* workspace);

// The same of the fused experts (MoeExperts: gpt-oss's, Llama 4's): gate_up [E, H, 2 I], down
// [E, I, H], and gpt-oss's biases gate_up_bias [E, 2 I] and down_bias [E, H] (null: none); saved
// and workspace as above (moe_*_floats of d). Each gradient is written for every expert (zero for
// one no token chose).
struct FusedExperts {
  const float *gate_up, *gate_up_bias, *down, *down_bias;
};
struct FusedExpertGrads {
  float *gate_up, *gate_up_bias, *down, *down_bias;
};
void moe_fused_forward(const MoeDims& d, const float* x, const float* logits, const FusedExperts& w, float* y,
                       float* saved, float* workspace);
void moe_fused_backward(const MoeDims& d, const float* dy, const float* x, const float* logits, const float* saved,
                        const FusedExperts& w, float* dx, float* dlogits, const FusedExpertGrads& dw,
                        float* workspace);

// The load-balancing loss's statistics (Switch Transformer's; transformers'
// load_balancing_loss_func) over one layer's router logits [T, E]: counts[e] gains the rows
// whose top k (as moe_route chooses) include e, psum[e] the sum over rows of softmax(row)_e,
// both in double, the rows in order.
void moe_balance_stats(const float* logits, int64_t T, int64_t E, int64_t k, double* counts, double* psum);
// The gradient of sum_e g_e psum_e (the counts have none: they change only by steps):
// dlogits[t] = p (g - <g, p>), p = softmax(logits[t]).
void moe_balance_backward(const float* g, const float* logits, int64_t T, int64_t E, float* dlogits);

}  // namespace autosp::cpu
