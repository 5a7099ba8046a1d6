// Graph inputs, constants, and the elementwise and reduction ops.
#include <cstring>

#include "kernels/cpu/basic.h"
#include "ops/op.h"
#ifdef AUTOSP_HAVE_CUDA
#include "ops/cuda_kernels.h"
#endif

namespace autosp {

namespace {

Types same_float_types(const Types& in) {
  require_floating(in[0], "a");
  require_floating(in[1], "b");
  require_same_dtype(in[0], "a", in[1], "b");
  require(in[0].shape == in[1].shape, "operands must have the same shape");
  return {in[0]};
}

Cost flops_per_element(const Types&, const Types& out, const Attrs&) {
  return {double(numel(out[0].shape)), 0};
}

// vector_norm's operand x [..., n] (rank >= 1) and its result [...], x's shape without the last dim.
Shape norm_shape(const TensorType& x) {
  require_floating(x, "x");
  require(!x.shape.empty(), "x must have at least one dim (the one the norm is taken over)");
  return Shape(x.shape.begin(), x.shape.end() - 1);
}

// A row-wise reduction's sharding: x split on a dim other than the reduced last one (which the
// result keeps), or whole. `rank`: x's.
Sharding shard_reduced_rows(const Sharding& x, size_t rank, const char* what) {
  require(!is_partial(x), "the norm of a partial sum is not one (", what, ")");
  require(!is_shard(x) || x.dim < int(rank) - 1, "x must not be split on the dim the norm is taken over (", what,
          ")");
  return x;
}

Shape shape_attr(const Attrs& attrs) {
  require(attrs.has("shape"), "needs a 'shape' attribute");
  Shape shape = attrs.get_ints("shape");
  for (int64_t d : shape)  // not require(): its message would be built for every shape
    if (d < 0) shape_error("shape ", shape_str(shape), " has a negative dim");
  return shape;
}

}  // namespace

#ifdef AUTOSP_HAVE_CUDA
namespace {
void cuda_fill(const KernelArgs& a, const CudaContext& c) {
  cuda::fill(cuda_out_dt(a, 0), a.out<void>(0), a.out_numel(0), float(a.attrs->get_float("value")), c.stream);
}
void cuda_expand(const KernelArgs& a, const CudaContext& c) {
  cuda::expand(cuda_in_dt(a, 0), a.in<void>(0), a.out<void>(0), a.out_numel(0), c.stream);
}
void cuda_broadcast(const KernelArgs& a, const CudaContext& c) {
  const int64_t n = a.in_numel(0);
  if (n == 0) return;  // an empty x: an empty result
  cuda::broadcast_rows(cuda_in_dt(a, 0), a.in<void>(0), a.out_numel(0) / n, n, a.out<void>(0), c.stream);
}
void cuda_add(const KernelArgs& a, const CudaContext& c) {
  cuda::add(cuda_in_dt(a, 0), a.in<void>(0), a.in<void>(1), a.out_numel(0), a.out<void>(0), c.stream);
}
void cuda_mul(const KernelArgs& a, const CudaContext& c) {
  cuda::mul(cuda_in_dt(a, 0), a.in<void>(0), a.in<void>(1), a.out_numel(0), a.out<void>(0), c.stream);
}
void cuda_scale(const KernelArgs& a, const CudaContext& c) {
  cuda::scale(cuda_in_dt(a, 0), a.in<void>(0), a.out_numel(0), float(a.attrs->get_float("alpha")), a.out<void>(0),
              c.stream, float(a.attrs->get_float("beta", 0.0)));
}
void cuda_sum(const KernelArgs& a, const CudaContext& c) {
  cuda::sum(cuda_in_dt(a, 0), a.in<void>(0), a.in_numel(0), a.out<void>(0), c.stream);
}
void cuda_div(const KernelArgs& a, const CudaContext& c) {
  cuda::div(cuda_in_dt(a, 0), a.in<void>(0), a.in<void>(1), a.out_numel(0), a.out<void>(0), c.stream);
}
void cuda_stop_gradient(const KernelArgs& a, const CudaContext& c) {
  cuda::convert(cuda_in_dt(a, 0), cuda_in_dt(a, 0), a.in<void>(0), a.in_numel(0), a.out<void>(0), c.stream);
}
void cuda_vector_norm(const KernelArgs& a, const CudaContext& c) {
  const int64_t n = a.in_types[0]->shape.back();
  cuda::vector_norm(cuda_in_dt(a, 0), a.in<void>(0), a.out_numel(0), n, a.out<void>(0), c.stream);
}
void cuda_vector_norm_backward(const KernelArgs& a, const CudaContext& c) {
  const int64_t n = a.in_types[1]->shape.back();
  cuda::vector_norm_backward(cuda_in_dt(a, 0), a.in<void>(0), a.in<void>(1), a.in<void>(2), a.in_numel(0), n,
                             a.out<void>(0), c.stream);
}
void cuda_div_scalar(const KernelArgs& a, const CudaContext& c) {
  cuda::div_scalar(cuda_in_dt(a, 0), a.in<void>(0), a.out_numel(0), a.in<void>(1), a.out<void>(0), c.stream);
}
}  // namespace
#endif

extern const OpDef input_op = {
    .num_inputs = 0,
    .num_outputs = 1,
    .infer = [](const Types&, const Attrs&) -> Types {
      shape_error("graph inputs are made with Graph::add_input");
    },
    .cost = nullptr,
    .grad = nullptr,
    .cpu = nullptr,  // bound by the executor
};

// fill {shape, value, dtype}: a constant tensor; dtype "f32" (the default) or "bf16"
// (autodiff's zero gradient of a bf16 parameter). The CPU kernel writes f32.
extern const OpDef fill_op = {
    .num_inputs = 0,
    .num_outputs = 1,
    .infer = [](const Types&, const Attrs& attrs) -> Types {
      require(attrs.has("value"), "needs a 'value' attribute");
      return {{attrs.has("dtype") ? dtype_attr(attrs, "dtype") : DType::f32, shape_attr(attrs)}};
    },
    .cost = nullptr,
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) {
      cpu::fill(a.out(0), a.out_numel(0), float(a.attrs->get_float("value")));
    },
    // The same constant on every rank: a fill shaped like a sequence-sharded operand (one the
    // model builds over all S) is refused where it meets the shard, by that op's rule.
    .shard = [](const Shardings&, const Types&, const Attrs&) -> Shardings { return {replicated()}; },
    .recompute = Recompute::cheap,
    .cuda = {.name = "fill", .run = AUTOSP_CUDA_RUN(cuda_fill)},
};

// expand(x[]) {shape}: broadcasts a scalar.
extern const OpDef expand_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      require_floating(in[0], "x");
      require_rank(in[0], 0, "x");
      return {{in[0].dtype, shape_attr(attrs)}};
    },
    .cost = nullptr,
    // d/dx sum_i y_i = sum(dy)
    .grad = [](GradContext& c) { c.din[0] = c.b.emit1(OpKind::sum, {c.dout[0]}); },
    .cpu = [](const KernelArgs& a) { cpu::fill(a.out(0), a.out_numel(0), a.in(0)[0]); },
    .recompute = Recompute::cheap,
    .cuda = {.name = "expand", .run = AUTOSP_CUDA_RUN(cuda_expand)},
};

// broadcast(x[T...], like[L..., ...]) {dims: k}: [L_0, ..., L_{k-1}, T...], x repeated over
// like's first k dims (a row vector over the rows: a layer's scale [H], a token-type embedding's
// row). `like` is read for its shape only (any dtype) and gets no gradient; its sharding, on one
// of those k dims, is the result's (the autosp pass shards x's repetitions, never x).
Shape broadcast_shape_of(const Types& in, const Attrs& attrs) {
  const int64_t k = attrs.get_int("dims", -1);
  require(k >= 1 && k <= int64_t(in[1].shape.size()), "dims must be in [1, rank of like = ", in[1].shape.size(),
          "], got ", k);
  Shape out(in[1].shape.begin(), in[1].shape.begin() + k);
  out.insert(out.end(), in[0].shape.begin(), in[0].shape.end());
  return out;
}
extern const OpDef broadcast_op = {
    .num_inputs = 2,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      require_floating(in[0], "x");
      return {{in[0].dtype, broadcast_shape_of(in, attrs)}};
    },
    .cost = nullptr,
    // dx = the sum of dy over the repetitions: dy's rows [R, numel(x)] summed.
    .grad = [](GradContext& c) {
      const Shape x = c.b.shape(c.in(0));  // a copy: emitting grows the graph
      const ValueId sums = column_sums(c.b, c.dout[0], numel(x));
      c.din[0] = x.size() == 1 ? sums : c.b.emit1(OpKind::reshape, {sums}, {{"shape", x}});
    },
    .cpu = [](const KernelArgs& a) {
      const int64_t bytes = a.in_numel(0) * dtype_size(a.in_types[0]->dtype);
      const int64_t rows = a.out_numel(0) / std::max<int64_t>(a.in_numel(0), 1);
      const auto* x = a.in<char>(0);
      auto* y = a.out<char>(0);
      for (int64_t r = 0; r < rows; ++r) std::memcpy(y + r * bytes, x, size_t(bytes));
    },
    .shard = [](const Shardings& in, const Types&, const Attrs& attrs) -> Shardings {
      require(is_replicated(in[0]), "x must be replicated (it is repeated over the sequence, not split)");
      require(!is_partial(in[1]), "like must not be a partial sum");
      require(!is_shard(in[1]) || in[1].dim < attrs.get_int("dims", -1),
              "like must be split on one of the dims x is repeated over");
      return {in[1]};
    },
    .recompute = Recompute::cheap,
    .cpu_any_dtype = true,  // copies x's bytes
    .cuda = {.name = "broadcast", .run = AUTOSP_CUDA_RUN(cuda_broadcast)},
    .no_gradient_inputs = 0b10,
};

extern const OpDef add_op = {
    .num_inputs = 2,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) { return same_float_types(in); },
    .cost = flops_per_element,
    .grad = [](GradContext& c) {
      if (c.needs[0]) c.din[0] = c.dout[0];
      if (c.needs[1]) c.din[1] = c.dout[0];
    },
    .cpu = [](const KernelArgs& a) { cpu::add(a.in(0), a.in(1), a.out_numel(0), a.out(0)); },
    .shard = shard_elementwise,  // a sum of two partial sums is a partial sum
    .cpu_inplace = true,
    .recompute = Recompute::cheap,
    .cuda = {.name = "add", .run = AUTOSP_CUDA_RUN(cuda_add), .inplace = true},
};

extern const OpDef mul_op = {
    .num_inputs = 2,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) { return same_float_types(in); },
    .cost = flops_per_element,
    // d(a b) = da b + a db
    .grad = [](GradContext& c) {
      if (c.needs[0]) c.din[0] = c.b.emit1(OpKind::mul, {c.dout[0], c.in(1)});
      if (c.needs[1]) c.din[1] = c.b.emit1(OpKind::mul, {c.dout[0], c.in(0)});
    },
    .cpu = [](const KernelArgs& a) { cpu::mul(a.in(0), a.in(1), a.out_numel(0), a.out(0)); },
    .shard = [](const Shardings& in, const Types& t, const Attrs& a) -> Shardings {
      require(!is_partial(in[0]) && !is_partial(in[1]), "a product of partial sums is not one");
      return shard_elementwise(in, t, a);
    },
    .cpu_inplace = true,
    .recompute = Recompute::cheap,
    .cuda = {.name = "mul", .run = AUTOSP_CUDA_RUN(cuda_mul), .inplace = true},
};

// scale(x) {alpha, beta = 0}: alpha x + beta (a constant added without a tensor of it, which
// under sequence parallelism would need the local shape).
extern const OpDef scale_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      require_floating(in[0], "x");
      require(attrs.has("alpha"), "needs an 'alpha' attribute");
      return {in[0]};
    },
    .cost = flops_per_element,
    .grad = [](GradContext& c) {
      c.din[0] = c.b.emit1(OpKind::scale, {c.dout[0]}, {{"alpha", c.attrs().get_float("alpha")}});
    },
    .cpu = [](const KernelArgs& a) {
      cpu::scale(a.in(0), a.out_numel(0), float(a.attrs->get_float("alpha")), a.out(0),
                 float(a.attrs->get_float("beta", 0.0)));
    },
    .shard = shard_elementwise,
    .cpu_inplace = true,
    .recompute = Recompute::cheap,
    .cuda = {.name = "scale", .run = AUTOSP_CUDA_RUN(cuda_scale), .inplace = true},
};

// sum(x): the sum of all elements, a scalar of x's dtype (accumulated in double on the
// CPU, in f32 by a bf16 kernel, and rounded once), so that expand's gradient has its
// operand's dtype.
extern const OpDef sum_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) -> Types {
      require_floating(in[0], "x");
      return {{in[0].dtype, {}}};
    },
    .cost = [](const Types& in, const Types&, const Attrs&) {
      return Cost{double(numel(in[0].shape)), 0};
    },
    .grad = [](GradContext& c) {
      c.din[0] = c.b.emit1(OpKind::expand, {c.dout[0]}, {{"shape", c.b.shape(c.in(0))}});
    },
    .cpu = [](const KernelArgs& a) {
      a.out(0)[0] = float(cpu::sum(a.in(0), a.in_numel(0), static_cast<double*>(a.workspace)));
    },
    .cpu_workspace_bytes = [](const Types& in, const Attrs&, int) -> int64_t {
      return 8 * cpu::sum_scratch_doubles(numel(in[0].shape));
    },
    // the sum of a shard is this rank's part of the whole sum
    .shard = [](const Shardings& in, const Types&, const Attrs&) -> Shardings {
      return {is_replicated(in[0]) ? replicated() : partial()};
    },
    .cuda = {.name = "sum", .run = AUTOSP_CUDA_RUN(cuda_sum)},
};

// div(a, b): a / b elementwise, operands of one shape (DoRA's magnitude over its weight's
// norm).
extern const OpDef div_op = {
    .num_inputs = 2,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) { return same_float_types(in); },
    .cost = flops_per_element,
    // da = dy / b;  db = -dy a / b^2 = -(dy y) / b
    .grad = [](GradContext& c) {
      if (c.needs[0]) c.din[0] = c.b.emit1(OpKind::div, {c.dout[0], c.in(1)});
      if (c.needs[1]) {
        const ValueId q = c.b.emit1(OpKind::div, {c.b.emit1(OpKind::mul, {c.dout[0], c.out(0)}), c.in(1)});
        c.din[1] = c.b.emit1(OpKind::scale, {q}, {{"alpha", -1.0}});
      }
    },
    .cpu = [](const KernelArgs& a) { cpu::div(a.in(0), a.in(1), a.out_numel(0), a.out(0)); },
    .shard = [](const Shardings& in, const Types& t, const Attrs& a) -> Shardings {
      require(!is_partial(in[0]) && !is_partial(in[1]), "a quotient of partial sums is not one");
      return shard_elementwise(in, t, a);
    },
    .cpu_inplace = true,
    .recompute = Recompute::cheap,
    .cuda = {.name = "div", .run = AUTOSP_CUDA_RUN(cuda_div), .inplace = true},
};

// stop_gradient(x): x, through which no gradient flows (torch's detach of a value computed from
// the parameters: DoRA's weight norm, held constant in its backward).
extern const OpDef stop_gradient_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) -> Types {
      require_floating(in[0], "x");
      return {in[0]};
    },
    .cost = nullptr,
    .grad = nullptr,  // (no_gradient_inputs: autodiff sends none to x)
    .cpu = [](const KernelArgs& a) {
      if (a.in<void>(0) != a.out<void>(0))
        std::memcpy(a.out<char>(0), a.in<char>(0), size_t(a.in_numel(0) * dtype_size(a.in_types[0]->dtype)));
    },
    .shard = [](const Shardings& in, const Types&, const Attrs&) -> Shardings { return {in[0]}; },
    .cpu_inplace = true,
    .recompute = Recompute::cheap,
    .cpu_any_dtype = true,  // copies x's bytes
    .cuda = {.name = "stop_gradient", .run = AUTOSP_CUDA_RUN(cuda_stop_gradient), .inplace = true},
    .no_gradient_inputs = 0b1,
};

// vector_norm(x[..., n]): [...], the 2-norm of each row, sqrt(sum_i x_i^2) (torch.linalg.norm
// and vector_norm over one dim, moved last by the importer), accumulated in double.
extern const OpDef vector_norm_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) -> Types { return {{in[0].dtype, norm_shape(in[0])}}; },
    .cost = [](const Types& in, const Types&, const Attrs&) { return Cost{2.0 * double(numel(in[0].shape)), 0}; },
    // dx = dy / y x
    .grad = [](GradContext& c) {
      c.din[0] = c.b.emit1(OpKind::vector_norm_backward, {c.dout[0], c.in(0), c.out(0)});
    },
    .cpu = [](const KernelArgs& a) {
      cpu::vector_norm(a.in(0), a.out_numel(0), a.in_types[0]->shape.back(), a.out(0));
    },
    .shard = [](const Shardings& in, const Types& t, const Attrs&) -> Shardings {
      return {shard_reduced_rows(in[0], t[0].shape.size(), "x")};
    },
    .recompute = Recompute::cheap,
    .cuda = {.name = "vector_norm", .run = AUTOSP_CUDA_RUN(cuda_vector_norm)},
};

// vector_norm_backward(dy[...], x[..., n], y[...]) = dx[..., n]: dy / y x, 0 in a row whose
// norm y is 0.
extern const OpDef vector_norm_backward_op = {
    .num_inputs = 3,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) -> Types {
      const Shape rows = norm_shape(in[1]);
      for (int i : {0, 2}) {
        const char* name = i == 0 ? "dy" : "y";
        require_floating(in[i], name);
        require_same_dtype(in[1], "x", in[i], name);
        require(in[i].shape == rows, name, " must have x's shape without its last dim");
      }
      return {in[1]};
    },
    .cost = [](const Types& in, const Types&, const Attrs&) { return Cost{2.0 * double(numel(in[1].shape)), 0}; },
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) {
      cpu::vector_norm_backward(a.in(0), a.in(1), a.in(2), a.in_numel(0), a.in_types[1]->shape.back(), a.out(0));
    },
    .shard = [](const Shardings& in, const Types& t, const Attrs&) -> Shardings {
      const Sharding x = shard_reduced_rows(in[1], t[1].shape.size(), "x");
      require(in[0] == x && in[2] == x, "dy, x and y must be split alike, got ", sharding_str(in[0]), ", ",
              sharding_str(in[1]), ", ", sharding_str(in[2]));
      return {x};
    },
    .cpu_inplace = true,
    .cuda = {.name = "vector_norm_backward", .run = AUTOSP_CUDA_RUN(cuda_vector_norm_backward), .inplace = true},
};

// div_scalar(x, s[]): x / s, s a scalar tensor of x's dtype (the loss normaliser: f32
// loss sum over f32 count, whatever the model's dtype).
extern const OpDef div_scalar_op = {
    .num_inputs = 2,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) -> Types {
      require_floating(in[0], "x");
      require_floating(in[1], "s");
      require_same_dtype(in[0], "x", in[1], "s");
      require_rank(in[1], 0, "s");
      return {in[0]};
    },
    .cost = flops_per_element,
    // dx = dy / s;  ds = -sum(dy x) / s^2 = -sum(dy y) / s
    .grad = [](GradContext& c) {
      if (c.needs[0]) c.din[0] = c.b.emit1(OpKind::div_scalar, {c.dout[0], c.in(1)});
      if (c.needs[1]) {
        ValueId dot = c.b.emit1(OpKind::sum, {c.b.emit1(OpKind::mul, {c.dout[0], c.out(0)})});
        ValueId neg = c.b.emit1(OpKind::scale, {dot}, {{"alpha", -1.0}});
        c.din[1] = c.b.emit1(OpKind::div_scalar, {neg, c.in(1)});
      }
    },
    .cpu = [](const KernelArgs& a) {
      cpu::div_scalar(a.in(0), a.out_numel(0), a.in(1)[0], a.out(0));
    },
    // (partial) x / (replicated) s is a partial sum of x / s; the divisor must be whole
    .shard = [](const Shardings& in, const Types&, const Attrs&) -> Shardings {
      require(is_replicated(in[1]), "the divisor must be replicated, got ", sharding_str(in[1]));
      return {in[0]};
    },
    .cpu_inplace = true,
    .recompute = Recompute::cheap,
    .cuda = {.name = "div_scalar", .run = AUTOSP_CUDA_RUN(cuda_div_scalar), .inplace = true},
};

}  // namespace autosp
