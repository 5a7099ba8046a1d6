// silu, swiglu, gelu, relu, clamp, tanh and xIELU, with their explicit backward ops.
#include <cmath>
#include <limits>

#include "kernels/cpu/basic.h"
#include "kernels/cpu/fused.h"
#include "kernels/cpu/norm_act.h"
#include "ops/op.h"
#ifdef AUTOSP_HAVE_CUDA
#include "kernels/cuda/fused.h"
#include "ops/cuda_kernels.h"
#endif

namespace autosp {

namespace {

// Operands of one floating dtype and one shape; `results` results of that type.
Types elementwise_float(const Types& in, std::initializer_list<const char*> names, int results) {
  int i = 0;
  for (const char* name : names) {
    require_floating(in[i], name);
    require_same_dtype(in[0], *names.begin(), in[i], name);
    require(in[i].shape == in[0].shape, name, " must have the shape of ", *names.begin());
    ++i;
  }
  return Types(results, in[0]);
}

template <int FlopsPerElement>
Cost elementwise_cost(const Types& in, const Types&, const Attrs&) {
  return {double(FlopsPerElement) * numel(in[0].shape), 0};
}

// gelu's "approximate" attribute, as torch's: "none" (the erf form) or "tanh". Returns
// whether it is "tanh"; shape_error for anything else.
bool gelu_tanh(const Attrs& attrs) {
  require(attrs.has("approximate"), "needs an 'approximate' attribute (\"none\" or \"tanh\")");
  const std::string* a = std::get_if<std::string>(&attrs.all().at("approximate"));
  require(a != nullptr && (*a == "none" || *a == "tanh"), "approximate must be \"none\" or \"tanh\"");
  return *a == "tanh";
}

// clamp's bounds: "min" and "max", each optional (absent: -inf, +inf), not both absent.
float clamp_low(const Attrs& attrs) {
  return attrs.has("min") ? float(attrs.get_float("min")) : -std::numeric_limits<float>::infinity();
}
float clamp_high(const Attrs& attrs) {
  return attrs.has("max") ? float(attrs.get_float("max")) : std::numeric_limits<float>::infinity();
}
void check_clamp(const Attrs& attrs) {
  require(attrs.has("min") || attrs.has("max"), "needs a 'min' or a 'max' attribute (or both)");
  require(!std::isnan(clamp_low(attrs)) && !std::isnan(clamp_high(attrs)) && clamp_low(attrs) <= clamp_high(attrs),
          "'min' ", clamp_low(attrs), " must be at most 'max' ", clamp_high(attrs));
}

}  // namespace

#ifdef AUTOSP_HAVE_CUDA
namespace {
void cuda_silu(const KernelArgs& a, const CudaContext& c) {
  cuda::silu_forward(cuda_in_dt(a, 0), a.in<void>(0), a.in_numel(0), a.out<void>(0), c.stream);
}
void cuda_silu_backward(const KernelArgs& a, const CudaContext& c) {
  cuda::silu_backward(cuda_in_dt(a, 0), a.in<void>(0), a.in<void>(1), a.in_numel(0), a.out<void>(0), c.stream);
}
void cuda_relu(const KernelArgs& a, const CudaContext& c) {
  cuda::relu_forward(cuda_in_dt(a, 0), a.in<void>(0), a.in_numel(0), a.out<void>(0), c.stream);
}
void cuda_relu_backward(const KernelArgs& a, const CudaContext& c) {
  cuda::relu_backward(cuda_in_dt(a, 0), a.in<void>(0), a.in<void>(1), a.in_numel(0), a.out<void>(0), c.stream);
}
void cuda_clamp(const KernelArgs& a, const CudaContext& c) {
  cuda::clamp_forward(cuda_in_dt(a, 0), a.in<void>(0), a.in_numel(0), clamp_low(*a.attrs), clamp_high(*a.attrs),
                      a.out<void>(0), c.stream);
}
void cuda_clamp_backward(const KernelArgs& a, const CudaContext& c) {
  cuda::clamp_backward(cuda_in_dt(a, 0), a.in<void>(0), a.in<void>(1), a.in_numel(0), clamp_low(*a.attrs),
                       clamp_high(*a.attrs), a.out<void>(0), c.stream);
}
void cuda_tanh(const KernelArgs& a, const CudaContext& c) {
  cuda::tanh_forward(cuda_in_dt(a, 0), a.in<void>(0), a.in_numel(0), a.out<void>(0), c.stream);
}
void cuda_tanh_backward(const KernelArgs& a, const CudaContext& c) {
  cuda::tanh_backward(cuda_in_dt(a, 0), a.in<void>(0), a.in<void>(1), a.in_numel(0), a.out<void>(0), c.stream);
}
void cuda_xielu(const KernelArgs& a, const CudaContext& c) {
  cuda::xielu_forward(cuda_in_dt(a, 0), a.in<void>(0), a.in_numel(0), a.in<void>(1), a.in<void>(2),
                      float(a.attrs->get_float("beta")), float(a.attrs->get_float("eps")), a.out<void>(0), c.stream);
}
void cuda_xielu_backward(const KernelArgs& a, const CudaContext& c) {
  cuda::xielu_backward(cuda_in_dt(a, 1), a.in<void>(0), a.in<void>(1), a.in_numel(1), a.in<void>(2), a.in<void>(3),
                       float(a.attrs->get_float("beta")), float(a.attrs->get_float("eps")), a.out<void>(0),
                       a.out<void>(1), a.out<void>(2), c.stream);
}
void cuda_gelu(const KernelArgs& a, const CudaContext& c) {
  cuda::gelu_forward(cuda_in_dt(a, 0), a.in<void>(0), a.in_numel(0), gelu_tanh(*a.attrs), a.out<void>(0), c.stream);
}
void cuda_gelu_backward(const KernelArgs& a, const CudaContext& c) {
  cuda::gelu_backward(cuda_in_dt(a, 0), a.in<void>(0), a.in<void>(1), a.in_numel(0), gelu_tanh(*a.attrs),
                      a.out<void>(0), c.stream);
}
void cuda_swiglu(const KernelArgs& a, const CudaContext& c) {
  cuda::swiglu_forward_fused(cuda_in_dt(a, 0), a.in<void>(0), a.in<void>(1), a.in_numel(0), a.out<void>(0), c.stream);
}
void cuda_swiglu_backward(const KernelArgs& a, const CudaContext& c) {
  cuda::swiglu_backward_fused(cuda_in_dt(a, 0), a.in<void>(0), a.in<void>(1), a.in<void>(2), a.in_numel(0),
                              a.out<void>(0), a.out<void>(1), c.stream);
}
}  // namespace
#endif

// silu(x) = x s(x), s the logistic sigmoid
extern const OpDef silu_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) { return elementwise_float(in, {"x"}, 1); },
    .cost = elementwise_cost<4>,
    .grad = [](GradContext& c) { c.din[0] = c.b.emit1(OpKind::silu_backward, {c.dout[0], c.in(0)}); },
    .cpu = [](const KernelArgs& a) { cpu::silu_forward(a.in(0), a.in_numel(0), a.out(0)); },
    .shard = [](const Shardings& in, const Types& t, const Attrs& a) -> Shardings {
      require(!is_partial(in[0]), "silu of a partial sum is not a partial sum");
      return shard_elementwise(in, t, a);
    },
    .cpu_inplace = true,
    .recompute = Recompute::cheap,
    .cpu_per_isa = true,
    .cuda = {.name = "silu_forward", .run = AUTOSP_CUDA_RUN(cuda_silu), .inplace = true},
};

// silu_backward(dy, x) = dy s(x) (1 + x (1 - s(x)))
extern const OpDef silu_backward_op = {
    .num_inputs = 2,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) { return elementwise_float(in, {"dy", "x"}, 1); },
    .cost = elementwise_cost<7>,
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) {
      cpu::silu_backward(a.in(0), a.in(1), a.in_numel(0), a.out(0));
    },
    .cpu_inplace = true,
    .cpu_per_isa = true,
    .cuda = {.name = "silu_backward", .run = AUTOSP_CUDA_RUN(cuda_silu_backward), .inplace = true},
};

// relu(x) = max(x, 0) (the squared relu of Primer, Arcee and Persimmon is relu then mul)
extern const OpDef relu_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) { return elementwise_float(in, {"x"}, 1); },
    .cost = elementwise_cost<1>,
    .grad = [](GradContext& c) { c.din[0] = c.b.emit1(OpKind::relu_backward, {c.dout[0], c.in(0)}); },
    .cpu = [](const KernelArgs& a) { cpu::relu_forward(a.in(0), a.in_numel(0), a.out(0)); },
    .shard = [](const Shardings& in, const Types& t, const Attrs& a) -> Shardings {
      require(!is_partial(in[0]), "relu of a partial sum is not a partial sum");
      return shard_elementwise(in, t, a);
    },
    .cpu_inplace = true,
    .recompute = Recompute::cheap,
    .cuda = {.name = "relu_forward", .run = AUTOSP_CUDA_RUN(cuda_relu), .inplace = true},
};

// relu_backward(dy, x) = dy where x > 0, else 0 (0 at x = 0, as torch)
extern const OpDef relu_backward_op = {
    .num_inputs = 2,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) { return elementwise_float(in, {"dy", "x"}, 1); },
    .cost = elementwise_cost<1>,
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) { cpu::relu_backward(a.in(0), a.in(1), a.in_numel(0), a.out(0)); },
    .cpu_inplace = true,
    .cuda = {.name = "relu_backward", .run = AUTOSP_CUDA_RUN(cuda_relu_backward), .inplace = true},
};

// clamp(x) {min, max}: min(max(x, min), max), either bound optional (not both absent), min <=
// max (DBRX's clip_qkv: q, k and v kept within +-c)
extern const OpDef clamp_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) {
      check_clamp(attrs);
      return elementwise_float(in, {"x"}, 1);
    },
    .cost = elementwise_cost<1>,
    .grad = [](GradContext& c) {
      c.din[0] = c.b.emit1(OpKind::clamp_backward, {c.dout[0], c.in(0)}, c.attrs());
    },
    .cpu = [](const KernelArgs& a) {
      cpu::clamp_forward(a.in(0), a.in_numel(0), clamp_low(*a.attrs), clamp_high(*a.attrs), a.out(0));
    },
    .shard = [](const Shardings& in, const Types& t, const Attrs& a) -> Shardings {
      require(!is_partial(in[0]), "clamp of a partial sum is not a partial sum");
      return shard_elementwise(in, t, a);
    },
    .cpu_inplace = true,
    .recompute = Recompute::cheap,
    .cuda = {.name = "clamp_forward", .run = AUTOSP_CUDA_RUN(cuda_clamp), .inplace = true},
};

// clamp_backward(dy, x) {as the forward's} = dy where min <= x <= max (bounds included, as
// torch's), else 0
extern const OpDef clamp_backward_op = {
    .num_inputs = 2,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) {
      check_clamp(attrs);
      return elementwise_float(in, {"dy", "x"}, 1);
    },
    .cost = elementwise_cost<1>,
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) {
      cpu::clamp_backward(a.in(0), a.in(1), a.in_numel(0), clamp_low(*a.attrs), clamp_high(*a.attrs), a.out(0));
    },
    .cpu_inplace = true,
    .cuda = {.name = "clamp_backward", .run = AUTOSP_CUDA_RUN(cuda_clamp_backward), .inplace = true},
};

// tanh(x) (Gemma 2's final logit softcap: c tanh(logits / c))
extern const OpDef tanh_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) { return elementwise_float(in, {"x"}, 1); },
    .cost = elementwise_cost<1>,
    // d/dx tanh(x) = 1 - tanh(x)^2: from the output, which the backward keeps instead of x
    .grad = [](GradContext& c) { c.din[0] = c.b.emit1(OpKind::tanh_backward, {c.dout[0], c.out(0)}); },
    .cpu = [](const KernelArgs& a) { cpu::tanh_forward(a.in(0), a.in_numel(0), a.out(0)); },
    .shard = [](const Shardings& in, const Types& t, const Attrs& a) -> Shardings {
      require(!is_partial(in[0]), "tanh of a partial sum is not a partial sum");
      return shard_elementwise(in, t, a);
    },
    .cpu_inplace = true,
    .recompute = Recompute::cheap,
    .cuda = {.name = "tanh_forward", .run = AUTOSP_CUDA_RUN(cuda_tanh), .inplace = true},
};

// tanh_backward(dy, y) = dy (1 - y^2), y = tanh(x)
extern const OpDef tanh_backward_op = {
    .num_inputs = 2,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) { return elementwise_float(in, {"dy", "y"}, 1); },
    .cost = elementwise_cost<1>,
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) { cpu::tanh_backward(a.in(0), a.in(1), a.in_numel(0), a.out(0)); },
    .cpu_inplace = true,
    .cuda = {.name = "tanh_backward", .run = AUTOSP_CUDA_RUN(cuda_tanh_backward), .inplace = true},
};

namespace {
// xIELU's operands: x, and its learned scalars alpha_p and alpha_n ([1] each, of x's dtype);
// attributes beta and eps (finite).
void check_xielu(const Types& in, const Attrs& attrs, size_t x) {
  require_floating(in[x], "x");
  for (size_t i = x + 1; i < x + 3; ++i) {
    const char* name = i == x + 1 ? "alpha_p" : "alpha_n";
    require_same_dtype(in[x], "x", in[i], name);
    require(in[i].shape == Shape{1}, name, " must be [1], got ", shape_str(in[i].shape));
  }
  for (const char* k : {"beta", "eps"})
    require(attrs.has(k) && std::isfinite(attrs.get_float(k)), "needs a finite '", k, "'");
}
}  // namespace

// xielu(x, alpha_p [1], alpha_n [1]) {beta, eps} (Apertus' activation; kernels/cpu/norm_act.h):
// a_p = softplus(alpha_p), a_n = beta + softplus(alpha_n);
// y = a_p x^2 + beta x for x > 0, else (expm1(min(x, eps)) - x) a_n + beta x.
extern const OpDef xielu_op = {
    .num_inputs = 3,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      check_xielu(in, attrs, 0);
      return {in[0]};
    },
    .cost = [](const Types& in, const Types&, const Attrs&) { return Cost{6.0 * numel(in[0].shape), 0}; },
    // dx = dy y'(x); d alpha_p = sum dy x^2 [x > 0] softplus'(alpha_p); d alpha_n = sum dy
    // (expm1(min(x, eps)) - x) [x <= 0] softplus'(alpha_n): one backward op for the three.
    .grad = [](GradContext& c) {
      auto d = c.b.emit(OpKind::xielu_backward, {c.dout[0], c.in(0), c.in(1), c.in(2)}, c.attrs());
      for (int i = 0; i < 3; ++i)
        if (c.needs[i]) c.din[i] = d[i];
    },
    .cpu = [](const KernelArgs& a) {
      cpu::xielu_forward(a.in(0), a.in_numel(0), a.in(1)[0], a.in(2)[0], float(a.attrs->get_float("beta")),
                         float(a.attrs->get_float("eps")), a.out(0));
    },
    // Elementwise in x; the scalars whole on every rank.
    .shard = [](const Shardings& in, const Types&, const Attrs&) -> Shardings {
      require(!is_partial(in[0]), "xielu of a partial sum is not a partial sum");
      require(is_replicated(in[1]) && is_replicated(in[2]), "xielu's alpha_p and alpha_n must be replicated");
      return {in[0]};
    },
    .cpu_inplace = true,
    .recompute = Recompute::cheap,
    .cuda = {.name = "xielu_forward", .run = AUTOSP_CUDA_RUN(cuda_xielu), .inplace = true},
};

// xielu_backward(dy, x, alpha_p, alpha_n) {beta, eps} -> (dx, dalpha_p [1], dalpha_n [1])
extern const OpDef xielu_backward_op = {
    .num_inputs = 4,
    .num_outputs = 3,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      check_xielu(in, attrs, 1);
      require(in[0] == in[1], "dy must have x's type");
      return {in[1], in[2], in[3]};
    },
    .cost = [](const Types& in, const Types&, const Attrs&) { return Cost{8.0 * numel(in[1].shape), 0}; },
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) {
      cpu::xielu_backward(a.in(0), a.in(1), a.in_numel(1), a.in(2)[0], a.in(3)[0], float(a.attrs->get_float("beta")),
                          float(a.attrs->get_float("eps")), a.out(0), a.out(1), a.out(2));
    },
    .cuda = {.name = "xielu_backward", .run = AUTOSP_CUDA_RUN(cuda_xielu_backward)},
};

// gelu(x) {approximate}: "none": 0.5 x (1 + erf(x / sqrt 2)); "tanh": 0.5 x (1 + tanh(sqrt(2/pi)
// (x + 0.044715 x^3))) (torch.nn.functional.gelu; GPT-2's gelu_new, Gemma's gelu_pytorch_tanh)
extern const OpDef gelu_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) {
      gelu_tanh(attrs);
      return elementwise_float(in, {"x"}, 1);
    },
    .cost = elementwise_cost<8>,
    .grad = [](GradContext& c) {
      c.din[0] = c.b.emit1(OpKind::gelu_backward, {c.dout[0], c.in(0)}, c.attrs());
    },
    .cpu = [](const KernelArgs& a) {
      cpu::gelu_forward(a.in(0), a.in_numel(0), gelu_tanh(*a.attrs), a.out(0));
    },
    .shard = [](const Shardings& in, const Types& t, const Attrs& a) -> Shardings {
      require(!is_partial(in[0]), "gelu of a partial sum is not a partial sum");
      return shard_elementwise(in, t, a);
    },
    .cpu_inplace = true,
    .recompute = Recompute::cheap,
    .cuda = {.name = "gelu_forward", .run = AUTOSP_CUDA_RUN(cuda_gelu), .inplace = true},
};

// gelu_backward(dy, x) {approximate} = dy gelu'(x), torch's derivative of the same form
extern const OpDef gelu_backward_op = {
    .num_inputs = 2,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) {
      gelu_tanh(attrs);
      return elementwise_float(in, {"dy", "x"}, 1);
    },
    .cost = elementwise_cost<12>,
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) {
      cpu::gelu_backward(a.in(0), a.in(1), a.in_numel(0), gelu_tanh(*a.attrs), a.out(0));
    },
    .cpu_inplace = true,
    .cuda = {.name = "gelu_backward", .run = AUTOSP_CUDA_RUN(cuda_gelu_backward), .inplace = true},
};

// swiglu(gate, up) = silu(gate) * up
extern const OpDef swiglu_op = {
    .num_inputs = 2,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) { return elementwise_float(in, {"gate", "up"}, 1); },
    .cost = elementwise_cost<5>,
    // dgate = dy up silu'(gate), dup = dy silu(gate): one fused op gives both.
    .grad = [](GradContext& c) {
      auto d = c.b.emit(OpKind::swiglu_backward, {c.dout[0], c.in(0), c.in(1)});
      if (c.needs[0]) c.din[0] = d[0];
      if (c.needs[1]) c.din[1] = d[1];
    },
    .cpu = [](const KernelArgs& a) {
      cpu::swiglu_forward(a.in(0), a.in(1), a.in_numel(0), a.out(0));
    },
    .shard = [](const Shardings& in, const Types& t, const Attrs& a) -> Shardings {
      require(!is_partial(in[0]) && !is_partial(in[1]), "swiglu of partial sums is not a partial sum");
      return shard_elementwise(in, t, a);
    },
    .cpu_inplace = true,
    .recompute = Recompute::cheap,
    .cpu_per_isa = true,
    .cuda = {.name = "swiglu_fused", .run = AUTOSP_CUDA_RUN(cuda_swiglu), .inplace = true},
};

// swiglu_backward(dy, gate, up) -> (dgate, dup)
extern const OpDef swiglu_backward_op = {
    .num_inputs = 3,
    .num_outputs = 2,
    .infer = [](const Types& in, const Attrs&) {
      return elementwise_float(in, {"dy", "gate", "up"}, 2);
    },
    .cost = elementwise_cost<9>,
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) {
      cpu::swiglu_backward(a.in(0), a.in(1), a.in(2), a.in_numel(0), a.out(0), a.out(1));
    },
    .cpu_inplace = true,
    .cpu_per_isa = true,
    .cuda = {.name = "swiglu_backward_fused", .run = AUTOSP_CUDA_RUN(cuda_swiglu_backward), .inplace = true},
};

}  // namespace autosp
