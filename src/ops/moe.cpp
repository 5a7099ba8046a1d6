// moe (the sparse mixture-of-experts block: routing and SwiGLU experts in one op) and
// moe_backward; moe_balance (the load-balancing loss's statistics) and moe_balance_backward.
// The maths is kernels/cpu/moe.h's.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/moe.h"
#include "kernels/cpu/moe_routing.h"
#include "kernels/cuda/limits.h"
#include "ops/op.h"
#ifdef AUTOSP_HAVE_CUDA
#include "kernels/cuda/fused.h"
#include "kernels/cuda/moe.h"
#include "ops/cuda_kernels.h"
#endif

namespace autosp {

namespace {

// Whether the experts' weights from `weights` on are stacked, transformers 5's layout: gate_up
// [E, 2 I, H] (each expert's gate rows, then its up rows) and down [E, H, I], two operands.
bool stacked_weights(const Types& in, size_t weights) {
  return in.size() == weights + 2 && in[weights].shape.size() == 3;
}
// Or DBRX's, three operands: gate [E, I, H], up [E, I, H] and down [E, I, H] (each expert's down
// transposed: its w2).
bool stacked_apart(const Types& in, size_t weights) {
  return in.size() == weights + 3 && in[weights].shape.size() == 3;
}

// The experts' form (attribute "experts": "swiglu", the default, "gpt_oss" {alpha, limit} or
// "llama4") and where the routing weight applies (attribute "weight_input" 0 or 1): kernels/cpu/
// moe.h's MoeExperts.
cpu::MoeExperts moe_experts(const Attrs& attrs) {
  cpu::MoeExperts x;
  const std::string form = attrs.has("experts") ? attrs.get_str("experts") : std::string("swiglu");
  require(form == "swiglu" || form == "gpt_oss" || form == "llama4",
          "experts must be \"swiglu\", \"gpt_oss\" or \"llama4\", got \"", form, "\"");
  x.form = form == "gpt_oss" ? cpu::MoeExperts::gpt_oss : form == "llama4" ? cpu::MoeExperts::llama4
                                                                            : cpu::MoeExperts::swiglu;
  require(x.form == cpu::MoeExperts::gpt_oss || (!attrs.has("alpha") && !attrs.has("limit")),
          "'alpha' and 'limit' are gpt_oss experts' only");
  x.alpha = attrs.get_float("alpha", x.alpha);
  x.limit = attrs.get_float("limit", x.limit);
  require(std::isfinite(x.alpha) && std::isfinite(x.limit) && x.limit > 0, "alpha must be finite and limit a positive "
          "number, got alpha ", x.alpha, " and limit ", x.limit);
  const int64_t weight_input = attrs.get_int("weight_input", 0);
  require(weight_input == 0 || weight_input == 1, "weight_input must be 0 or 1, got ", weight_input);
  x.weight_input = weight_input == 1;
  return x;
}

// The routing beyond softmax top-k (kernels/cpu/moe.h's MoeRouting), from the attributes
// {score: "softmax" | "sigmoid", groups, topk_group, group_score: "max" | "top2", dropped:
// "-inf" | "zero", scale, norm_eps, bias: [E]}, each optional.
cpu::MoeRouting moe_routing(const Attrs& attrs, const cpu::MoeDims& d) {
  cpu::MoeRouting r;
  auto text = [&](const char* key, const char* fallback) {
    return attrs.has(key) ? attrs.get_str(key) : std::string(fallback);
  };
  const std::string score = text("score", "softmax"), group = text("group_score", "max"), dropped = text("dropped", "-inf");
  require(score == "softmax" || score == "sigmoid", "score must be \"softmax\" or \"sigmoid\", got \"", score, "\"");
  require(group == "max" || group == "top2", "group_score must be \"max\" or \"top2\", got \"", group, "\"");
  require(dropped == "-inf" || dropped == "zero", "dropped must be \"-inf\" or \"zero\", got \"", dropped, "\"");
  r.sigmoid = score == "sigmoid";
  r.group_top2 = group == "top2";
  r.dropped_zero = dropped == "zero";
  r.groups = attrs.get_int("groups", 1);
  r.topk_group = attrs.get_int("topk_group", r.groups);
  require(r.groups >= 1 && d.E % r.groups == 0, "groups=", r.groups, " must divide the ", d.E, " experts");
  require(r.groups <= moe_routing::kMaxGroups, "groups=", r.groups, " above the ", moe_routing::kMaxGroups,
          " the routing takes");
  require(r.topk_group >= 1 && r.topk_group <= r.groups, "topk_group=", r.topk_group, " must be in [1, ", r.groups,
          "] (the groups)");
  require(!r.group_top2 || r.groups == 1 || d.E / r.groups >= 2, "group_score \"top2\" needs groups of 2 experts or "
          "more, got ", d.E / r.groups);
  r.scale = attrs.get_float("scale", 1.0);
  r.norm_eps = attrs.get_float("norm_eps", 0.0);
  require(std::isfinite(r.scale) && r.scale > 0, "scale must be a positive number, got ", r.scale);
  require(std::isfinite(r.norm_eps) && r.norm_eps >= 0, "norm_eps must be a number >= 0, got ", r.norm_eps);
  if (attrs.has("bias")) {
    r.bias = attrs.get_floats("bias");
    require(int64_t(r.bias.size()) == d.E, "bias must hold one number per expert (", d.E, "), got ", r.bias.size());
    for (double b : r.bias) require(std::isfinite(b), "bias must be finite, got ", b);
  }
  return r;
}

// moe's operands: x [..., H] and router logits [..., E] (x's leading dims) from `first` on,
// and from `weights` on expert e's gate [I, H], up [I, H] and down [H, I] for e = 0 .. E - 1,
// or the stacked gate_up [E, 2 I, H] and down [E, H, I] (stacked_weights); every floating
// operand of x's dtype. {top_k: 1..E, normalize: 0 or 1}.
cpu::MoeDims moe_dims(const Types& in, const Attrs& attrs, size_t first, size_t weights) {
  require(in.size() >= weights + 1, "expected x, the router logits and 3 weights per expert");
  const TensorType &x = in[first], &logits = in[first + 1];
  require_floating(x, "x");
  require_same_dtype(x, "x", logits, "router logits");
  require(!x.shape.empty(), "x must have rank >= 1");
  require(logits.shape.size() == x.shape.size() &&
              std::equal(x.shape.begin(), x.shape.end() - 1, logits.shape.begin()),
          "router logits must be x's leading dims by the experts, got x ", type_str(x), " and logits ",
          type_str(logits));
  cpu::MoeDims d;
  d.T = rows_of(x.shape);
  d.H = x.shape.back();
  d.E = logits.shape.back();
  require(d.E >= 1, "at least one expert");
  // (LongCat-Flash's zero-computation experts: the last Z of the E the logits score, with no weights)
  d.zero_experts = attrs.get_int("zero_experts", 0);
  require(d.zero_experts >= 0 && d.zero_experts < d.E, "zero_experts=", d.zero_experts, " must be in [0, ", d.E,
          ") (the router's experts, one of them computed at least)");
  const int64_t Ew = d.experts_with_weights();
  const bool stacked = stacked_weights(in, weights);
  const bool apart = stacked_apart(in, weights);
  require(stacked || apart || moe_experts(attrs).fused() || int64_t(in.size()) == int64_t(weights) + 3 * Ew,
          "router logits of ", d.E, " experts", d.zero_experts ? str(" (", d.zero_experts, " of them zero)") : "",
          " need ", 3 * Ew, " expert weights (gate, up and down of each), 2 stacked ones (gate_up [E, 2 I, H] and "
          "down [E, H, I]) or 3 (gate, up and down [E, I, H]), got ", int64_t(in.size()) - int64_t(weights));
  require(attrs.has("top_k"), "needs a 'top_k' attribute");
  d.k = attrs.get_int("top_k");
  require(d.k >= 1 && d.k <= d.E, "top_k=", d.k, " must be in [1, ", d.E, "] (the experts)");
  const int64_t normalize = attrs.get_int("normalize", 0);
  require(normalize == 0 || normalize == 1, "normalize must be 0 or 1, got ", normalize);
  d.normalize = normalize == 1;
  d.routing = moe_routing(attrs, d);
  d.experts = moe_experts(attrs);
  if (d.experts.form == cpu::MoeExperts::llama4) {
    // gate_up [E, H, 2 I] (the gate's columns, then the up's), down [E, I, H]
    require(in.size() == weights + 2, "llama4 experts are 2 operands (gate_up and down), got ", in.size() - weights);
    require_same_dtype(x, "x", in[weights], "gate_up");
    require_same_dtype(x, "x", in[weights + 1], "down");
    const TensorType &gate_up = in[weights], &down = in[weights + 1];
    d.I = gate_up.shape.size() == 3 ? gate_up.shape[2] / 2 : 0;
    require(gate_up.shape == Shape{Ew, d.H, 2 * d.I} && d.I >= 1, "llama4 experts' gate_up must be [E, H, 2 I] = [",
            Ew, ", ", d.H, ", 2 I], got ", type_str(gate_up));
    require(down.shape == Shape{Ew, d.I, d.H}, "llama4 experts' down must be [E, I, H] = ",
            shape_str(Shape{Ew, d.I, d.H}), ", got ", type_str(down));
    return d;
  }
  if (d.experts.form == cpu::MoeExperts::gpt_oss) {
    // gate_up [E, H, 2 I] (gate and up columns interleaved), its bias [E, 2 I], down [E, I, H], its bias [E, H]
    require(in.size() == weights + 4, "gpt_oss experts are 4 operands (gate_up, gate_up_bias, down, down_bias), got ",
            in.size() - weights);
    const char* names[] = {"gate_up", "gate_up_bias", "down", "down_bias"};
    for (size_t i = 0; i < 4; ++i) require_same_dtype(x, "x", in[weights + i], names[i]);
    const TensorType &gate_up = in[weights], &down = in[weights + 2];
    d.I = gate_up.shape.size() == 3 ? gate_up.shape[2] / 2 : 0;
    require(gate_up.shape == Shape{Ew, d.H, 2 * d.I} && d.I >= 1, "gpt_oss experts' gate_up must be [E, H, 2 I] = [",
            Ew, ", ", d.H, ", 2 I], got ", type_str(gate_up));
    require(in[weights + 1].shape == Shape{Ew, 2 * d.I}, "gate_up_bias must be [E, 2 I] = ",
            shape_str(Shape{Ew, 2 * d.I}), ", got ", type_str(in[weights + 1]));
    require(down.shape == Shape{Ew, d.I, d.H}, "gpt_oss experts' down must be [E, I, H] = ",
            shape_str(Shape{Ew, d.I, d.H}), ", got ", type_str(down));
    require(in[weights + 3].shape == Shape{Ew, d.H}, "down_bias must be [E, H] = ", shape_str(Shape{Ew, d.H}),
            ", got ", type_str(in[weights + 3]));
    return d;
  }
  if (apart) {
    const char* names[] = {"gate", "up", "down"};
    d.I = in[weights].shape[1];
    d.down_transposed = true;
    for (size_t i = 0; i < 3; ++i) {
      require_same_dtype(x, "x", in[weights + i], names[i]);
      require(in[weights + i].shape == Shape{Ew, d.I, d.H} && d.I >= 1, "the stacked ", names[i],
              " must be [E, I, H] = [", Ew, ", I, ", d.H, "] as gate's (down: each expert's transposed), got ",
              type_str(in[weights + i]));
    }
    return d;
  }
  if (stacked) {
    const TensorType &gate_up = in[weights], &down = in[weights + 1];
    require_same_dtype(x, "x", gate_up, "gate_up");
    require_same_dtype(x, "x", down, "down");
    d.I = gate_up.shape[1] / 2;
    require(gate_up.shape == Shape{Ew, 2 * d.I, d.H} && d.I >= 1, "the stacked gate_up must be [E, 2 I, H] = [", Ew,
            ", 2 I, ", d.H, "], got ", type_str(gate_up));
    require(down.shape == Shape{Ew, d.H, d.I}, "the stacked down must be [E, H, I] = ",
            shape_str(Shape{Ew, d.H, d.I}), ", got ", type_str(down));
    return d;
  }
  d.I = in[weights].shape.size() == 2 ? in[weights].shape[0] : -1;
  for (int64_t e = 0; e < Ew; ++e) {
    const char* names[] = {"gate", "up", "down"};
    for (int64_t m = 0; m < 3; ++m) {
      const TensorType& w = in[weights + 3 * e + m];
      const Shape want = m < 2 ? Shape{d.I, d.H} : Shape{d.H, d.I};
      require_same_dtype(x, "x", w, names[m]);
      require(w.shape == want, "expert ", e, "'s ", names[m], " must be ", shape_str(want), ", got ", type_str(w),
              " (gate and up [I, H], down [H, I], one I for all experts)");
    }
  }
  return d;
}

// The cuda routing kernels keep a token's probabilities in per-thread arrays.
void check_device_experts(const Types& in, size_t logits) {
  const int64_t E = in[logits].shape.back();
  require(E <= cuda::kMoeMaxExperts, E, " experts: the cuda moe kernels take at most ", cuda::kMoeMaxExperts);
}
// ... and its chosen weights (top_k of them).
void check_device_routing(const Types& in, const Attrs& attrs, size_t first, size_t weights) {
  const int64_t k = moe_dims(in, attrs, first, weights).k;
  require(k <= moe_routing::kMaxTopK, "top_k=", k, ": the cuda moe kernels take at most ", moe_routing::kMaxTopK);
}

// The forward's operands: x, logits, then the weights. Its results: y and the saved products.
cpu::MoeDims forward_dims(const Types& in, const Attrs& attrs) { return moe_dims(in, attrs, 0, 2); }
// The backward's: dy, x, logits, the forward's saved products, then the weights.
constexpr size_t kBackwardWeights = 4;
cpu::MoeDims backward_dims(const Types& in, const Attrs& attrs) {
  const cpu::MoeDims d = moe_dims(in, attrs, 1, kBackwardWeights);
  require(in[0].dtype == in[1].dtype && in[0].shape == in[1].shape, "dy must be x's type, got dy ", type_str(in[0]),
          " and x ", type_str(in[1]));
  require(in[3].dtype == in[1].dtype && in[3].shape == Shape{cpu::moe_saved_floats(d)},
          "saved must be the forward's saved products, [T k (2 I + H)] = [", cpu::moe_saved_floats(d),
          "] of x's dtype, got ", type_str(in[3]));
  return d;
}

Types types_of(const KernelArgs& a) {
  Types t;
  for (const TensorType* p : a.in_types) t.push_back(*p);
  return t;
}

// The experts' weights as the kernels take them, w[3 e], w[3 e + 1], w[3 e + 2] expert e's gate,
// up and down: the buffers `bufs` themselves, or pointers into the stacked gate_up and down
// (stacked_weights) of elements of `esize` bytes.
template <class P>
std::vector<P> expert_weights(const std::vector<P>& bufs, const cpu::MoeDims& d, bool stacked, int64_t esize) {
  using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<P>>, const char, char>;
  std::vector<P> w;
  const int64_t expert = esize * d.I * d.H;  // bytes of one [I, H] or [H, I] matrix
  if (!stacked && bufs.size() == 3 && d.down_transposed) {  // DBRX's, stacked apart
    for (int64_t e = 0; e < d.experts_with_weights(); ++e)
      for (int m = 0; m < 3; ++m) w.push_back(reinterpret_cast<P>(reinterpret_cast<Byte*>(bufs[m]) + expert * e));
    return w;
  }
  if (!stacked) return bufs;
  for (int64_t e = 0; e < d.experts_with_weights(); ++e) {
    Byte* gate = reinterpret_cast<Byte*>(bufs[0]) + 2 * expert * e;
    w.push_back(reinterpret_cast<P>(gate));
    w.push_back(reinterpret_cast<P>(gate + expert));
    w.push_back(reinterpret_cast<P>(reinterpret_cast<Byte*>(bufs[1]) + expert * e));
  }
  return w;
}
// The operands' buffers from `first` on (the experts' weights), as the kernels take them.
std::vector<const float*> floats_from(const KernelArgs& a, size_t first, const cpu::MoeDims& d) {
  std::vector<const float*> w;
  for (size_t i = first; i < a.inputs.size(); ++i) w.push_back(static_cast<const float*>(a.inputs[i]));
  return expert_weights(w, d, stacked_weights(types_of(a), first), 4);
}

// The fused experts' operands from `first` on: gpt-oss's gate_up, gate_up_bias, down, down_bias, or
// Llama 4's gate_up, down (no biases); and the backward's gradients of them (from its result 2 on).
cpu::FusedExperts fused_experts(const KernelArgs& a, size_t first, const cpu::MoeDims& d) {
  const int i = int(first);
  if (d.experts.form == cpu::MoeExperts::gpt_oss) return {a.in(i), a.in(i + 1), a.in(i + 2), a.in(i + 3)};
  return {a.in(i), nullptr, a.in(i + 1), nullptr};
}
cpu::FusedExpertGrads fused_expert_grads(const KernelArgs& a, const cpu::MoeDims& d) {
  if (d.experts.form == cpu::MoeExperts::gpt_oss) return {a.out(2), a.out(3), a.out(4), a.out(5)};
  return {a.out(2), nullptr, a.out(3), nullptr};
}

// The cuda kernels' scratch (ops/moe.cpp's cuda_moe): the routing (each slot's expert, weight
// and, backward, dw; the slots by expert) and one chunk's rows in the operands' dtype, each
// piece at a 256-byte boundary. Chunks are larger than the CPU's: a gemm of 4096 rows keeps
// an H200 busy.
constexpr int64_t kMoeDeviceChunkRows = 4096;
struct MoeDeviceLayout {
  int64_t experts = 0, weights = 0, slots = 0, dws = 0, bias = -1, rows = 0, total = 0;  // bias: -1 none
  int64_t R = 0;  // rows per chunk
};
MoeDeviceLayout moe_device_layout(const cpu::MoeDims& d, DType dtype, bool backward) {
  MoeDeviceLayout l;
  const int64_t slots = d.T * d.k, esize = dtype == DType::bf16 ? 2 : 4;
  l.R = std::min(slots, kMoeDeviceChunkRows);
  int64_t at = 0;
  auto piece = [&](int64_t bytes) {
    const int64_t start = at;
    at += cuda_aligned(bytes);
    return start;
  };
  l.experts = piece(4 * slots);
  l.weights = piece(4 * slots);
  l.slots = piece(4 * slots);
  l.dws = backward ? piece(4 * slots) : 0;
  if (!d.routing.bias.empty()) l.bias = piece(8 * d.E);  // the router's correction bias, in double
  // (fused: the forward's fused gate and up products too; the backward's in dg's and du's room)
  l.rows = piece(esize * l.R * (backward ? 3 * d.H + 4 * d.I : d.H + d.I + (d.experts.fused() ? 2 * d.I : 0)));
  l.total = at;
  return l;
}
int64_t moe_device_workspace_bytes(const Types& in, const Attrs& attrs, bool backward) {
  return moe_device_layout(backward ? backward_dims(in, attrs) : forward_dims(in, attrs), in[backward ? 1 : 0].dtype,
                           backward)
      .total;
}

}  // namespace

#ifdef AUTOSP_HAVE_CUDA
namespace {

// The routing on the device, and its slots by expert (ascending tokens within each) sorted on
// the host: the op's one host synchronisation, since cuBLAS takes each expert's row count from
// the host. start[e] .. start[e + 1] are expert e's slots.
struct DeviceRouting {
  int32_t* experts;
  float* weights;
  int32_t* slots;
  std::vector<int32_t> start;
  moe_routing::Route route;  // its bias in the workspace
};
DeviceRouting route_on_device(const cpu::MoeDims& d, const MoeDeviceLayout& l, cuda::Dt dt, const void* logits,
                              void* workspace, const CudaContext& c, const char* op) {
  char* ws = static_cast<char*>(workspace);
  DeviceRouting r{reinterpret_cast<int32_t*>(ws + l.experts), reinterpret_cast<float*>(ws + l.weights),
                  reinterpret_cast<int32_t*>(ws + l.slots), std::vector<int32_t>(d.E + 1, 0), cpu::moe_route_of(d)};
  if (l.bias >= 0) {  // (from pageable memory: the call returns once the source is read)
    r.route.bias = reinterpret_cast<const double*>(ws + l.bias);
    check_cuda(cudaMemcpyAsync(ws + l.bias, d.routing.bias.data(), size_t(8 * d.E), cudaMemcpyHostToDevice, c.stream),
               "cudaMemcpyAsync", op);
  }
  const int64_t n = d.T * d.k;
  cuda::moe_route(dt, logits, d.T, d.E, d.k, r.route, r.experts, r.weights, c.stream);
  std::vector<int32_t> experts(n), slots(n);
  check_cuda(cudaMemcpyAsync(experts.data(), r.experts, size_t(4 * n), cudaMemcpyDeviceToHost, c.stream),
             "cudaMemcpyAsync", op);
  check_cuda(cudaStreamSynchronize(c.stream), "cudaStreamSynchronize", op);
  cpu::moe_slots(d, experts.data(), slots.data(), r.start.data());
  // (from pageable memory: the call returns once the source is read)
  check_cuda(cudaMemcpyAsync(r.slots, slots.data(), size_t(4 * n), cudaMemcpyHostToDevice, c.stream),
             "cudaMemcpyAsync", op);
  return r;
}

// The experts' rows as they take them: gathered, and with the input weighted scaled by the routing
// weights (cpu::MoeExperts::weight_input).
void cuda_gather_inputs(const cpu::MoeDims& d, cuda::Dt dt, const void* x, const DeviceRouting& r, const int32_t* slots,
                        int64_t n, void* rows, const CudaContext& c) {
  cuda::moe_gather_rows(dt, x, slots, n, d.k, d.H, rows, c.stream);
  if (d.experts.weight_input) cuda::moe_scale_rows(dt, rows, slots, r.weights, n, d.H, c.stream);
}
// The weights the outputs are scattered with (null: 1, the inputs were weighted), and the ones the
// inputs' gradients are.
const float* cuda_output_weights(const cpu::MoeDims& d, const DeviceRouting& r) {
  return d.experts.weight_input ? nullptr : r.weights;
}
const float* cuda_input_weights(const cpu::MoeDims& d, const DeviceRouting& r) {
  return d.experts.weight_input ? r.weights : nullptr;
}

// The zero-computation experts' slots after the computed ones' (cpu::MoeDims::zero_experts), through
// the rows xs: y[t] += w_j x[t]; and the backward's, through xs, dys and dout: dws = <dy[t], x[t]>,
// dx[t] += w_j dy[t] (the CPU's identity_forward and identity_backward).
void cuda_identity_experts(const cpu::MoeDims& d, cuda::Dt dt, const DeviceRouting& r, int64_t R, const void* x,
                           char* xs, void* y, const CudaContext& c) {
  cpu::for_each_expert_chunk(d.experts_with_weights(), d.E, r.start, R, [&](int64_t, int64_t at, int64_t n) {
    cuda::moe_gather_rows(dt, x, r.slots + at, n, d.k, d.H, xs, c.stream);
    cuda::moe_scatter_add(dt, xs, r.slots + at, r.weights, n, d.k, d.H, y, c.stream);
  });
}
void cuda_identity_experts_backward(const cpu::MoeDims& d, cuda::Dt dt, const DeviceRouting& r, int64_t R,
                                    const void* dy, const void* x, char* xs, char* dys, char* dout, float* dws,
                                    void* dx, const CudaContext& c) {
  cpu::for_each_expert_chunk(d.experts_with_weights(), d.E, r.start, R, [&](int64_t, int64_t at, int64_t n) {
    cuda::moe_gather_rows(dt, x, r.slots + at, n, d.k, d.H, xs, c.stream);
    cuda::moe_gather_rows(dt, dy, r.slots + at, n, d.k, d.H, dys, c.stream);
    cuda::moe_output_grad(dt, dys, xs, dout, r.slots + at, r.weights, n, d.H, dws, c.stream);
    cuda::moe_scatter_add(dt, dout, r.slots + at, nullptr, n, d.k, d.H, dx, c.stream);
  });
}

// As cpu::moe_fused_forward: gather, the fused gate and up product, its bias (gpt-oss's) and the
// GLU (g and u into the saved planes), the down product and its bias (saved), the scatter-add.
void cuda_moe_fused(const KernelArgs& a, const CudaContext& c, const cpu::MoeDims& d, const DeviceRouting& r,
                    const MoeDeviceLayout& l) {
  const cuda::Dt dt = cuda_in_dt(a, 0);
  const int64_t H = d.H, I = d.I, es = cuda::dt_size(dt);
  const moe_experts::FusedForm form = d.experts.fused_form();
  const bool biases = d.experts.form == cpu::MoeExperts::gpt_oss;
  char *xs = static_cast<char*>(a.workspace) + l.rows, *hh = xs + es * l.R * H, *gu = hh + es * l.R * I;
  char* saved = static_cast<char*>(a.outputs[1]);
  const char *w_gu = a.in<char>(2), *w_d = a.in<char>(biases ? 4 : 3);
  const char *b_gu = biases ? a.in<char>(3) : nullptr, *b_d = biases ? a.in<char>(5) : nullptr;
  cuda::fill(dt, a.outputs[0], d.T * H, 0.0f, c.stream);
  cpu::for_each_expert_chunk(d.experts_with_weights(), r.start, l.R, [&](int64_t e, int64_t at, int64_t n) {
    const int32_t* slots = r.slots + at;
    const cpu::MoeSavedAt s = cpu::moe_saved_at(d, at);
    char *g = saved + es * s.g, *u = saved + es * s.u, *o = saved + es * s.o;
    cuda_gather_inputs(d, dt, a.inputs[0], r, slots, n, xs, c);
    cuda_gemm(c, dt, dt, false, false, n, 2 * I, H, xs, w_gu + es * e * H * 2 * I, gu, false, "moe");
    cuda::moe_fused_glu(dt, form, gu, b_gu ? b_gu + es * e * 2 * I : nullptr, n, I, g, u, hh, c.stream);
    cuda_gemm(c, dt, dt, false, false, n, H, I, hh, w_d + es * e * I * H, o, false, "moe");
    if (b_d) cuda::moe_add_row_bias(dt, o, b_d + es * e * H, n, H, c.stream);
    cuda::moe_scatter_add(dt, o, slots, cuda_output_weights(d, r), n, d.k, H, a.outputs[0], c.stream);
  });
  cuda_identity_experts(d, dt, r, l.R, a.inputs[0], xs, a.outputs[0], c);
}

// As cpu::moe_fused_backward, from the saved products.
void cuda_moe_fused_backward(const KernelArgs& a, const CudaContext& c, const cpu::MoeDims& d, const DeviceRouting& r,
                             const MoeDeviceLayout& l) {
  const cuda::Dt dt = cuda_in_dt(a, 1);
  const int64_t H = d.H, I = d.I, es = cuda::dt_size(dt), R = l.R;
  const moe_experts::FusedForm form = d.experts.fused_form();
  const bool biases = d.experts.form == cpu::MoeExperts::gpt_oss;
  float* dws = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + l.dws);
  char *xs = static_cast<char*>(a.workspace) + l.rows, *dys = xs + es * R * H, *dout = dys + es * R * H;
  char *hh = dout + es * R * H, *dh = hh + es * R * I, *dgu = dh + es * R * I;
  const char* saved = a.in<char>(3);
  const char *w_gu = a.in<char>(4), *w_d = a.in<char>(biases ? 6 : 5);
  char* dw_gu = static_cast<char*>(a.outputs[2]);
  char* dw_d = static_cast<char*>(a.outputs[biases ? 4 : 3]);
  char* db_gu = biases ? static_cast<char*>(a.outputs[3]) : nullptr;
  char* db_d = biases ? static_cast<char*>(a.outputs[5]) : nullptr;
  cuda::fill(dt, a.outputs[0], d.T * H, 0.0f, c.stream);
  cuda::fill(dt, dw_gu, d.experts_with_weights() * H * 2 * I, 0.0f, c.stream);
  cuda::fill(dt, dw_d, d.experts_with_weights() * I * H, 0.0f, c.stream);
  if (biases) {
    cuda::fill(dt, db_gu, d.experts_with_weights() * 2 * I, 0.0f, c.stream);
    cuda::fill(dt, db_d, d.experts_with_weights() * H, 0.0f, c.stream);
  }
  cpu::for_each_expert_chunk(d.experts_with_weights(), r.start, R, [&](int64_t e, int64_t at, int64_t n) {
    const int32_t* slots = r.slots + at;
    const cpu::MoeSavedAt s = cpu::moe_saved_at(d, at);
    const char *g = saved + es * s.g, *u = saved + es * s.u, *o = saved + es * s.o;
    cuda_gather_inputs(d, dt, a.inputs[1], r, slots, n, xs, c);
    cuda::moe_gather_rows(dt, a.inputs[0], slots, n, d.k, H, dys, c.stream);
    cuda::moe_fused_glu_of_saved(dt, form, g, u, n * I, hh, c.stream);
    cuda::moe_output_grad(dt, dys, o, dout, slots, cuda_output_weights(d, r), n, H, dws, c.stream);
    cuda_gemm(c, dt, dt, true, false, I, H, n, hh, dout, dw_d + es * e * I * H, true, "moe_backward");
    cuda_gemm(c, dt, dt, false, true, n, I, H, dout, w_d + es * e * I * H, dh, false, "moe_backward");
    cuda::moe_fused_glu_backward(dt, form, dh, g, u, n, I, dgu, c.stream);
    cuda_gemm(c, dt, dt, true, false, H, 2 * I, n, xs, dgu, dw_gu + es * e * H * 2 * I, true, "moe_backward");
    cuda_gemm(c, dt, dt, false, true, n, H, 2 * I, dgu, w_gu + es * e * H * 2 * I, dys, false, "moe_backward");
    if (biases) {
      cuda::moe_add_column_sums(dt, dgu, n, 2 * I, db_gu + es * e * 2 * I, c.stream);
      cuda::moe_add_column_sums(dt, dout, n, H, db_d + es * e * H, c.stream);
    }
    if (d.experts.weight_input) cuda::moe_input_weight_grad(dt, dys, a.inputs[1], slots, n, d.k, H, dws, c.stream);
    cuda::moe_scatter_add(dt, dys, slots, cuda_input_weights(d, r), n, d.k, H, a.outputs[0], c.stream);
  });
  cuda_identity_experts_backward(d, dt, r, R, a.inputs[0], a.inputs[1], xs, dys, dout, dws, a.outputs[0], c);
  cuda::moe_router_backward(dt, a.inputs[2], dws, d.T, d.E, d.k, r.route, a.outputs[1], c.stream);
}

// As cpu::moe_forward, chunk by chunk of each expert's rows: gather, gate and up products (into
// the saved planes), the fused swiglu, the down product (saved), the weighted scatter-add.
void cuda_moe(const KernelArgs& a, const CudaContext& c) {
  const cpu::MoeDims d = forward_dims(types_of(a), *a.attrs);
  const cuda::Dt dt = cuda_in_dt(a, 0);
  const MoeDeviceLayout l = moe_device_layout(d, a.in_types[0]->dtype, false);
  const DeviceRouting r = route_on_device(d, l, dt, a.inputs[1], a.workspace, c, "moe");
  if (d.experts.fused()) return cuda_moe_fused(a, c, d, r, l);
  const int64_t H = d.H, I = d.I, es = cuda::dt_size(dt);
  char* rows = static_cast<char*>(a.workspace) + l.rows;
  char *xs = rows, *hh = xs + es * l.R * H;
  char* saved = static_cast<char*>(a.outputs[1]);
  const std::vector<const void*> w =
      expert_weights(std::vector<const void*>(a.inputs.begin() + 2, a.inputs.end()), d, stacked_weights(types_of(a), 2),
                     es);
  cuda::fill(dt, a.outputs[0], d.T * H, 0.0f, c.stream);
  cpu::for_each_expert_chunk(d.experts_with_weights(), r.start, l.R, [&](int64_t e, int64_t at, int64_t n) {
    const int32_t* slots = r.slots + at;
    const cpu::MoeSavedAt s = cpu::moe_saved_at(d, at);
    char *g = saved + es * s.g, *u = saved + es * s.u, *o = saved + es * s.o;
    cuda_gather_inputs(d, dt, a.inputs[0], r, slots, n, xs, c);
    cuda_gemm(c, dt, dt, false, true, n, I, H, xs, w[3 * e], g, false, "moe");
    cuda_gemm(c, dt, dt, false, true, n, I, H, xs, w[3 * e + 1], u, false, "moe");
    cuda::swiglu_forward_fused(dt, g, u, n * I, hh, c.stream);
    cuda_gemm(c, dt, dt, false, !d.down_transposed, n, H, I, hh, w[3 * e + 2], o, false, "moe");
    cuda::moe_scatter_add(dt, o, slots, cuda_output_weights(d, r), n, d.k, H, a.outputs[0], c.stream);
  });
  cuda_identity_experts(d, dt, r, l.R, a.inputs[0], xs, a.outputs[0], c);
}

// As cpu::moe_backward, from the saved products.
void cuda_moe_backward(const KernelArgs& a, const CudaContext& c) {
  const cpu::MoeDims d = backward_dims(types_of(a), *a.attrs);
  const cuda::Dt dt = cuda_in_dt(a, 1);
  const MoeDeviceLayout l = moe_device_layout(d, a.in_types[1]->dtype, true);
  const DeviceRouting r = route_on_device(d, l, dt, a.inputs[2], a.workspace, c, "moe_backward");
  if (d.experts.fused()) return cuda_moe_fused_backward(a, c, d, r, l);
  const int64_t H = d.H, I = d.I, es = cuda::dt_size(dt), R = l.R;
  float* dws = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + l.dws);
  char* rows = static_cast<char*>(a.workspace) + l.rows;
  char *xs = rows, *dys = xs + es * R * H, *dout = dys + es * R * H, *hh = dout + es * R * H, *dh = hh + es * R * I;
  char *dg = dh + es * R * I, *du = dg + es * R * I;
  const char* saved = static_cast<const char*>(a.inputs[3]);
  const bool stacked = stacked_weights(types_of(a), kBackwardWeights);
  const std::vector<const void*> w = expert_weights(
      std::vector<const void*>(a.inputs.begin() + kBackwardWeights, a.inputs.end()), d, stacked, es);
  const std::vector<void*> dw =
      expert_weights(std::vector<void*>(a.outputs.begin() + 2, a.outputs.end()), d, stacked, es);
  cuda::fill(dt, a.outputs[0], d.T * H, 0.0f, c.stream);
  for (int64_t m = 0; m < 3 * d.experts_with_weights(); ++m) cuda::fill(dt, dw[m], I * H, 0.0f, c.stream);
  cpu::for_each_expert_chunk(d.experts_with_weights(), r.start, R, [&](int64_t e, int64_t at, int64_t n) {
    const void *wg = w[3 * e], *wu = w[3 * e + 1], *wd = w[3 * e + 2];
    void *dwg = dw[3 * e], *dwu = dw[3 * e + 1], *dwd = dw[3 * e + 2];
    const int32_t* slots = r.slots + at;
    const cpu::MoeSavedAt s = cpu::moe_saved_at(d, at);
    const char *g = saved + es * s.g, *u = saved + es * s.u, *o = saved + es * s.o;
    cuda_gather_inputs(d, dt, a.inputs[1], r, slots, n, xs, c);
    cuda::moe_gather_rows(dt, a.inputs[0], slots, n, d.k, H, dys, c.stream);
    cuda::swiglu_forward_fused(dt, g, u, n * I, hh, c.stream);
    cuda::moe_output_grad(dt, dys, o, dout, slots, cuda_output_weights(d, r), n, H, dws, c.stream);
    if (d.down_transposed)
      cuda_gemm(c, dt, dt, true, false, I, H, n, hh, dout, dwd, true, "moe_backward");
    else
      cuda_gemm(c, dt, dt, true, false, H, I, n, dout, hh, dwd, true, "moe_backward");
    cuda_gemm(c, dt, dt, false, d.down_transposed, n, I, H, dout, wd, dh, false, "moe_backward");
    cuda::swiglu_backward_fused(dt, dh, g, u, n * I, dg, du, c.stream);
    cuda_gemm(c, dt, dt, true, false, I, H, n, dg, xs, dwg, true, "moe_backward");
    cuda_gemm(c, dt, dt, true, false, I, H, n, du, xs, dwu, true, "moe_backward");
    cuda_gemm(c, dt, dt, false, false, n, H, I, dg, wg, dys, false, "moe_backward");
    cuda_gemm(c, dt, dt, false, false, n, H, I, du, wu, dys, true, "moe_backward");
    if (d.experts.weight_input) cuda::moe_input_weight_grad(dt, dys, a.inputs[1], slots, n, d.k, H, dws, c.stream);
    cuda::moe_scatter_add(dt, dys, slots, cuda_input_weights(d, r), n, d.k, H, a.outputs[0], c.stream);
  });
  cuda_identity_experts_backward(d, dt, r, R, a.inputs[0], a.inputs[1], xs, dys, dout, dws, a.outputs[0], c);
  cuda::moe_router_backward(dt, a.inputs[2], dws, d.T, d.E, d.k, r.route, a.outputs[1], c.stream);
}

// As the CPU's: each input's rows through two kernels, the sums kept in double.
void cuda_moe_balance(const KernelArgs& a, const CudaContext& c) {
  const int64_t E = a.in_shape(0).back(), k = a.attrs->get_int("top_k");
  double* acc = static_cast<double*>(a.workspace);
  float* rows = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + cuda_aligned(16 * E));
  check_cuda(cudaMemsetAsync(acc, 0, size_t(16 * E), c.stream), "cudaMemsetAsync", "moe_balance");
  for (size_t i = 0; i < a.inputs.size(); ++i)
    cuda::moe_balance_stats(cuda_in_dt(a, int(i)), a.inputs[i], rows_of(a.in_shape(int(i))), E, k, rows, acc, c.stream);
  cuda::moe_balance_finish(acc, E, a.out(0), c.stream);
}
void cuda_moe_balance_backward(const KernelArgs& a, const CudaContext& c) {
  const int64_t E = a.in_shape(1).back();
  for (size_t i = 1; i < a.inputs.size(); ++i)
    cuda::moe_balance_backward(cuda_in_dt(a, int(i)), a.in(0), a.inputs[i], rows_of(a.in_shape(int(i))), E,
                               a.outputs[i - 1], c.stream);
}

}  // namespace
#endif

// moe(x, router_logits, gate_0, up_0, down_0, ..., gate_{E-1}, up_{E-1}, down_{E-1})
//     {top_k, normalize} = (y [..., H], saved [T k (2 I + H)]): each row of x through its top_k
// experts, weighted by their softmax probabilities (kernels/cpu/moe.h), and the experts' gate
// and up products and outputs its backward reads. Or moe(x, router_logits, gate_up, down), the
// experts stacked as transformers 5 keeps them (gate_up [E, 2 I, H], down [E, H, I]): the same
// maths, each expert's matrices read in place. Or moe(x, router_logits, gate_up, gate_up_bias, down,
// down_bias) {experts: "gpt_oss", alpha, limit}, gpt-oss's experts (kernels/cpu/moe.h's
// MoeExperts), as it keeps them (gate_up [E, H, 2 I] interleaved, down [E, I, H]). Or moe(x,
// router_logits, gate_up, down) {experts: "llama4"}, Llama 4's (gate_up [E, H, 2 I], the gate's
// columns then the up's, down [E, I, H]). Any form with {weight_input: 1} (Llama 4's) weights each
// expert's input by its routing weight instead of its output; with {zero_experts: Z} (LongCat-Flash's)
// the last Z of the experts the logits score are identities, with no weights among the operands. The importer's
// form of transformers' sparse MoE blocks, whose router linear stays a linear before it.
extern const OpDef moe_op = {
    .num_inputs = -1,
    .num_outputs = 2,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      const cpu::MoeDims d = forward_dims(in, attrs);
      return {in[0], {in[0].dtype, {cpu::moe_saved_floats(d)}}};
    },
    // Each row: k experts of three [I, H] products, and the routing over E.
    .cost = [](const Types& in, const Types&, const Attrs& attrs) {
      const cpu::MoeDims d = forward_dims(in, attrs);
      return Cost{double(d.T) * (6.0 * double(d.k) * double(d.H) * double(d.I) + 4.0 * double(d.E)), 0};
    },
    // One backward op for every operand (it recomputes the routing, and reads the products).
    .grad = [](GradContext& c) {
      std::vector<ValueId> ins{c.dout[0], c.in(0), c.in(1), c.out(1)};
      ins.insert(ins.end(), c.node.inputs.begin() + 2, c.node.inputs.end());
      const std::vector<ValueId> d = c.b.emit(OpKind::moe_backward, ins, c.attrs());
      for (size_t i = 0; i < c.node.inputs.size(); ++i)
        if (c.needs[i]) c.din[i] = d[i];
    },
    .cpu = [](const KernelArgs& a) {
      const cpu::MoeDims d = forward_dims(types_of(a), *a.attrs);
      if (d.experts.fused()) {
        cpu::moe_fused_forward(d, a.in(0), a.in(1), fused_experts(a, 2, d), a.out(0), a.out(1),
                               static_cast<float*>(a.workspace));
        return;
      }
      const std::vector<const float*> w = floats_from(a, 2, d);
      cpu::moe_forward(d, a.in(0), a.in(1), w.data(), a.out(0), a.out(1), static_cast<float*>(a.workspace));
    },
    .cpu_workspace_bytes = [](const Types& in, const Attrs& attrs, int) -> int64_t {
      return 4 * cpu::moe_workspace_floats(forward_dims(in, attrs), false);
    },
    // Row-wise: every token's rows are its own; the experts' weights are replicated. The saved
    // products are this rank's tokens' (local, as any activation of a sharded row).
    .shard = [](const Shardings& in, const Types& t, const Attrs& a) -> Shardings {
      require(in[0] == in[1] && !is_partial(in[0]), "x and the router logits must be sharded alike (not partial), got ",
              sharding_str(in[0]), " and ", sharding_str(in[1]));
      for (size_t i = 2; i < in.size(); ++i) require(is_replicated(in[i]), "the experts' weights must be replicated");
      const Sharding y = shard_rowwise({in[0], in[1]}, {t[0], t[1]}, a)[0];
      return {y, is_shard(y) ? shard(0) : replicated()};
    },
    .recompute = Recompute::matmul,
    .cuda = {.name = "moe_forward",
             .run = AUTOSP_CUDA_RUN(cuda_moe),
             .workspace_bytes = [](const Types& in, const Types&, const Attrs& attrs) -> int64_t {
               return moe_device_workspace_bytes(in, attrs, false);
             },
             .check = [](const Types& in, const Attrs& attrs) {
               check_device_experts(in, 1);
               check_device_routing(in, attrs, 0, 2);
             }},
};

// moe_backward(dy, x, router_logits, saved, gate_0, up_0, down_0, ...) {top_k, normalize} =
// (dx, dlogits, dgate_0, dup_0, ddown_0, ...), or with the stacked weights (dx, dlogits,
// dgate_up, ddown): the gradient of x, the logits and every expert's weights, each of its
// operand's type.
extern const OpDef moe_backward_op = {
    .num_inputs = -1,
    .num_outputs = -1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      backward_dims(in, attrs);
      Types out{in[1], in[2]};
      out.insert(out.end(), in.begin() + kBackwardWeights, in.end());
      return out;
    },
    // Per expert six products: ddown, dh, dgate, dup, and dx's two.
    .cost = [](const Types& in, const Types&, const Attrs& attrs) {
      const cpu::MoeDims d = backward_dims(in, attrs);
      return Cost{double(d.T) * (12.0 * double(d.k) * double(d.H) * double(d.I) + 10.0 * double(d.E)), 0};
    },
    .cpu = [](const KernelArgs& a) {
      const cpu::MoeDims d = backward_dims(types_of(a), *a.attrs);
      if (d.experts.fused()) {
        cpu::moe_fused_backward(d, a.in(0), a.in(1), a.in(2), a.in(3), fused_experts(a, kBackwardWeights, d), a.out(0),
                                a.out(1), fused_expert_grads(a, d), static_cast<float*>(a.workspace));
        return;
      }
      const std::vector<const float*> w = floats_from(a, kBackwardWeights, d);
      std::vector<float*> dw;
      for (size_t i = 2; i < a.outputs.size(); ++i) dw.push_back(a.out(int(i)));
      dw = expert_weights(dw, d, stacked_weights(types_of(a), kBackwardWeights), 4);
      cpu::moe_backward(d, a.in(0), a.in(1), a.in(2), a.in(3), w.data(), a.out(0), a.out(1), dw.data(),
                        static_cast<float*>(a.workspace));
    },
    .cpu_workspace_bytes = [](const Types& in, const Attrs& attrs, int) -> int64_t {
      return 4 * cpu::moe_workspace_floats(backward_dims(in, attrs), true);
    },
    .cuda = {.name = "moe_backward",
             .run = AUTOSP_CUDA_RUN(cuda_moe_backward),
             .workspace_bytes = [](const Types& in, const Types&, const Attrs& attrs) -> int64_t {
               return moe_device_workspace_bytes(in, attrs, true);
             },
             .check = [](const Types& in, const Attrs& attrs) {
               check_device_experts(in, 2);
               check_device_routing(in, attrs, 1, kBackwardWeights);
             }},
};

namespace {
// The load-balancing loss's statistics, for moe_balance's operands: L layers' router logits,
// each [..., E] of one type. {top_k}
int64_t balance_experts(const Types& in, const Attrs& attrs, size_t first) {
  require(in.size() > first, "expected the router logits of at least one layer");
  const TensorType& l = in[first];
  require_floating(l, "router logits");
  require(!l.shape.empty() && l.shape.back() >= 1, "router logits must be [..., E], got ", type_str(l));
  for (size_t i = first; i < in.size(); ++i)
    require(in[i] == l, "every layer's router logits must be ", type_str(l), ", got ", type_str(in[i]));
  require(attrs.has("top_k"), "needs a 'top_k' attribute");
  const int64_t k = attrs.get_int("top_k");
  require(k >= 1 && k <= l.shape.back(), "top_k=", k, " must be in [1, ", l.shape.back(), "] (the experts)");
  return l.shape.back();
}
}  // namespace

// moe_balance(logits_0, ..., logits_{L-1}) {top_k} = f32 [2, E]: over every layer's rows, the
// count of rows whose top_k experts include e (row 0) and the sum of the rows' softmax
// probabilities of e (row 1) (kernels/cpu/moe.h). Transformers' load-balancing loss is E
// sum_e counts_e psum_e / N^2 of them, N the rows of all layers (torch_import builds it of
// slices, a product, a sum and a scale). Sharded rows give this rank's part of the sums (partial:
// the autosp pass all-reduces it over the group).
extern const OpDef moe_balance_op = {
    .num_inputs = -1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      return {{DType::f32, {2, balance_experts(in, attrs, 0)}}};
    },
    .cost = [](const Types& in, const Types&, const Attrs&) {
      return Cost{10.0 * double(in.size()) * double(numel(in[0].shape)), 0};
    },
    // Only the probability sums have a gradient (the counts change by steps).
    .grad = [](GradContext& c) {
      std::vector<ValueId> ins{c.dout[0]};
      ins.insert(ins.end(), c.node.inputs.begin(), c.node.inputs.end());
      const std::vector<ValueId> d = c.b.emit(OpKind::moe_balance_backward, ins, c.attrs());
      for (size_t i = 0; i < c.node.inputs.size(); ++i)
        if (c.needs[i]) c.din[i] = d[i];
    },
    .cpu = [](const KernelArgs& a) {
      const int64_t E = a.in_shape(0).back(), k = a.attrs->get_int("top_k");
      std::vector<double> counts(E, 0.0), psum(E, 0.0);
      for (size_t i = 0; i < a.inputs.size(); ++i)
        cpu::moe_balance_stats(a.in(int(i)), rows_of(a.in_shape(int(i))), E, k, counts.data(), psum.data());
      for (int64_t e = 0; e < E; ++e) {
        a.out(0)[e] = float(counts[e]);
        a.out(0)[E + e] = float(psum[e]);
      }
    },
    .shard = [](const Shardings& in, const Types&, const Attrs&) -> Shardings {
      for (const Sharding& s : in)
        require(s == in[0] && !is_partial(s), "every layer's router logits must be sharded alike (not partial)");
      return {is_shard(in[0]) ? partial() : replicated()};
    },
    .cuda = {.name = "moe_balance",
             .run = AUTOSP_CUDA_RUN(cuda_moe_balance),
             .workspace_bytes = [](const Types& in, const Types&, const Attrs&) -> int64_t {
               const int64_t E = in[0].shape.back();
               return cuda_aligned(16 * E) + cuda_aligned(8 * rows_of(in[0].shape) * E);
             },
             .check = [](const Types& in, const Attrs&) { check_device_experts(in, 0); }},
};

// moe_balance_backward(dstats [2, E], logits_0, ..., logits_{L-1}) {top_k} = (dlogits_0, ...):
// each row's p (g - <g, p>), g = dstats[1] (kernels/cpu/moe.h).
extern const OpDef moe_balance_backward_op = {
    .num_inputs = -1,
    .num_outputs = -1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      const int64_t E = balance_experts(in, attrs, 1);
      require(in[0] == TensorType{DType::f32, {2, E}}, "dstats must be f32[2, ", E, "], got ", type_str(in[0]));
      return Types(in.begin() + 1, in.end());
    },
    .cost = [](const Types& in, const Types&, const Attrs&) {
      return Cost{10.0 * double(in.size() - 1) * double(numel(in[1].shape)), 0};
    },
    .cpu = [](const KernelArgs& a) {
      const int64_t E = a.in_shape(1).back();
      for (size_t i = 1; i < a.inputs.size(); ++i)
        cpu::moe_balance_backward(a.in(0) + E, a.in(int(i)), rows_of(a.in_shape(int(i))), E, a.out(int(i) - 1));
    },
    .cuda = {.name = "moe_balance_backward",
             .run = AUTOSP_CUDA_RUN(cuda_moe_balance_backward),
             .check = [](const Types& in, const Attrs&) { check_device_experts(in, 1); }},
};

}  // namespace autosp
