// layer_norm over the last dim (torch.nn.functional.layer_norm with weight and bias),
// saving the mean and 1/std per row for the backward.
#include "kernels/cpu/norm_act.h"
#include "ops/op.h"
#ifdef AUTOSP_HAVE_CUDA
#include "kernels/cuda/kernels.h"
#include "ops/cuda_kernels.h"
#endif

namespace autosp {

namespace {
#ifdef AUTOSP_HAVE_CUDA
void cuda_layer_norm(const KernelArgs& a, const CudaContext& c) {
  const Shape& x = a.in_shape(0);
  cuda::layer_norm_forward(cuda_in_dt(a, 0), a.in<void>(0), a.in<void>(1), a.in<void>(2), rows_of(x), x.back(),
                           float(a.attrs->get_float("eps")), a.out<void>(0), a.out<float>(1), a.out<float>(2),
                           c.stream);
}
void cuda_layer_norm_backward(const KernelArgs& a, const CudaContext& c) {
  const Shape& x = a.in_shape(1);
  cuda::layer_norm_backward(cuda_in_dt(a, 1), a.in<void>(0), a.in<void>(1), a.in<void>(2), a.in<float>(3),
                            a.in<float>(4), rows_of(x), x.back(), a.out<void>(0), a.out<void>(1), a.out<void>(2),
                            c.stream);
}
#endif
}  // namespace

// layer_norm(x[..., H], w[H], b[H]) {eps} -> (y[..., H], mean[...], rstd[...]),
// y = (x - mean) rstd w + b, rstd = 1 / sqrt(var + eps), var the biased variance of the row.
// x, w and b share a dtype and y has it; mean and rstd are f32 for bf16 x too, as rms_norm's
// rstd (op.h "Types"; apex's and torch's fused LayerNorm keep fp32 mean and rstd).
extern const OpDef layer_norm_op = {
    .num_inputs = 3,
    .num_outputs = 3,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      require_floating(in[0], "x");
      require_floating(in[1], "weight");
      require_floating(in[2], "bias");
      require_same_dtype(in[0], "x", in[1], "weight");
      require_same_dtype(in[0], "x", in[2], "bias");
      require(!in[0].shape.empty(), "x must have rank >= 1");
      require(in[1].shape == Shape{in[0].shape.back()}, "weight must be [", in[0].shape.back(), "]");
      require(in[2].shape == Shape{in[0].shape.back()}, "bias must be [", in[0].shape.back(), "]");
      require(attrs.has("eps") && attrs.get_float("eps") > 0, "needs a positive 'eps'");
      Shape rows(in[0].shape.begin(), in[0].shape.end() - 1);
      return {in[0], {DType::f32, rows}, {DType::f32, rows}};
    },
    .cost = [](const Types& in, const Types&, const Attrs&) {
      return Cost{7.0 * numel(in[0].shape), 0};
    },
    // With xhat = (x - mean) rstd and g = dy w:  dw = sum_rows dy xhat,  db = sum_rows dy,
    // dx = rstd (g - mean(g) - xhat mean(g xhat))   (mean and rstd are saved; nothing flows
    // into them)
    .grad = [](GradContext& c) {
      auto d = c.b.emit(OpKind::layer_norm_backward, {c.dout[0], c.in(0), c.in(1), c.out(1), c.out(2)});
      if (c.needs[0]) c.din[0] = d[0];
      if (c.needs[1]) c.din[1] = d[1];
      if (c.needs[2]) c.din[2] = d[2];
    },
    .cpu = [](const KernelArgs& a) {
      const Shape& x = a.in_shape(0);
      cpu::layer_norm_forward(a.in(0), a.in(1), a.in(2), rows_of(x), x.back(), float(a.attrs->get_float("eps")),
                              a.out(0), a.out(1), a.out(2));
    },
    .shard = shard_rowwise,  // y, mean and rstd share x's sharded (row) dim
    .recompute = Recompute::cheap,
    .cuda = {.name = "layer_norm_forward", .run = AUTOSP_CUDA_RUN(cuda_layer_norm)},
};

// layer_norm_backward(dy, x, w, mean f32, rstd f32) -> (dx, dw, db) of x's dtype
extern const OpDef layer_norm_backward_op = {
    .num_inputs = 5,
    .num_outputs = 3,
    .infer = [](const Types& in, const Attrs&) -> Types {
      require_floating(in[1], "x");
      require_same_dtype(in[1], "x", in[0], "dy");
      require_same_dtype(in[1], "x", in[2], "weight");
      require_dtype(in[3], DType::f32, "mean");
      require_dtype(in[4], DType::f32, "rstd");
      require(in[0].shape == in[1].shape, "dy must have x's shape");
      require(!in[1].shape.empty() && in[2].shape == Shape{in[1].shape.back()}, "weight must be [H]");
      const Shape rows(in[1].shape.begin(), in[1].shape.end() - 1);
      require(in[3].shape == rows, "mean must have x's shape without the last dim");
      require(in[4].shape == rows, "rstd must have x's shape without the last dim");
      return {in[1], in[2], in[2]};
    },
    .cost = [](const Types& in, const Types&, const Attrs&) {
      return Cost{11.0 * numel(in[0].shape), 0};
    },
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) {
      const Shape& x = a.in_shape(1);
      cpu::layer_norm_backward(a.in(0), a.in(1), a.in(2), a.in(3), a.in(4), rows_of(x), x.back(), a.out(0),
                               a.out(1), a.out(2), static_cast<double*>(a.workspace));
    },
    .cpu_workspace_bytes = [](const Types& in, const Attrs&, int) -> int64_t {
      return 8 * cpu::layer_norm_backward_scratch_doubles(rows_of(in[1].shape), in[1].shape.back());
    },
    .cuda = {.name = "layer_norm_backward", .run = AUTOSP_CUDA_RUN(cuda_layer_norm_backward)},
};

}  // namespace autosp
