// rms_norm over the last dim, saving 1/rms per row for the backward.
#include "kernels/cpu/fused.h"
#include "kernels/cuda/fused_layout.h"
#include "ops/op.h"
#ifdef AUTOSP_HAVE_CUDA
#include "kernels/cuda/fused.h"
#include "ops/cuda_kernels.h"
#endif

namespace autosp {

namespace {
// rms_norm_backward's device scratch: the fused kernel's per-block column sums of dw
// (kernels/cuda/fused_layout.h).
int64_t cuda_rms_norm_backward_workspace(const Types& in, const Types&, const Attrs&) {
  return cuda::rms_norm_backward_workspace_bytes(rows_of(in[1].shape), in[1].shape.back());
}
#ifdef AUTOSP_HAVE_CUDA
void cuda_rms_norm(const KernelArgs& a, const CudaContext& c) {
  const Shape& x = a.in_shape(0);
  cuda::rms_norm_forward_fused(cuda_in_dt(a, 0), a.in<void>(0), a.in<void>(1), rows_of(x), x.back(),
                         float(a.attrs->get_float("eps")), a.out<void>(0), a.out<float>(1), c.stream);
}
void cuda_rms_norm_backward(const KernelArgs& a, const CudaContext& c) {
  const Shape& x = a.in_shape(1);
  cuda::rms_norm_backward_fused(cuda_in_dt(a, 1), a.in<void>(0), a.in<void>(1), a.in<void>(2), a.in<float>(3),
                                rows_of(x), x.back(), a.out<void>(0), a.out<void>(1),
                                static_cast<float*>(a.workspace), c.stream);
}
#endif
}  // namespace

// rms_norm(x[..., H], w[H]) {eps} -> (y[..., H], rstd[...]),  y = x * rstd * w,
// rstd = 1 / sqrt(mean(x^2) + eps). x and w share a dtype and y has it; rstd is f32 for
// bf16 x too: fused RMSNorm kernels (apex, FlashAttention's) reduce in fp32 and save rstd
// in fp32 for the backward, and it is one value per row, so it costs 2/H of y's bytes.
extern const OpDef rms_norm_op = {
    .num_inputs = 2,
    .num_outputs = 2,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      require_floating(in[0], "x");
      require_floating(in[1], "weight");
      require_same_dtype(in[0], "x", in[1], "weight");
      require(!in[0].shape.empty(), "x must have rank >= 1");
      require(in[1].shape == Shape{in[0].shape.back()}, "weight must be [", in[0].shape.back(), "]");
      require(attrs.has("eps") && attrs.get_float("eps") > 0, "needs a positive 'eps'");
      Shape rows(in[0].shape.begin(), in[0].shape.end() - 1);
      return {in[0], {DType::f32, rows}};
    },
    .cost = [](const Types& in, const Types&, const Attrs&) {
      return Cost{4.0 * numel(in[0].shape), 0};
    },
    // With xhat = x rstd:  dw = sum_rows dy xhat,
    // dx = rstd (dy w - xhat mean(dy w xhat))   (rstd is saved; nothing flows into it)
    .grad = [](GradContext& c) {
      auto d = c.b.emit(OpKind::rms_norm_backward, {c.dout[0], c.in(0), c.in(1), c.out(1)});
      if (c.needs[0]) c.din[0] = d[0];
      if (c.needs[1]) c.din[1] = d[1];
    },
    .cpu = [](const KernelArgs& a) {
      const Shape& x = a.in_shape(0);
      cpu::rms_norm_forward(a.in(0), a.in(1), rows_of(x), x.back(),
                            float(a.attrs->get_float("eps")), a.out(0), a.out(1));
    },
    .shard = shard_rowwise,  // y and rstd share x's sharded (row) dim
    .recompute = Recompute::cheap,
    .cpu_per_isa = true,
    .cuda = {.name = "rms_norm_fused", .run = AUTOSP_CUDA_RUN(cuda_rms_norm)},
};

// rms_norm_backward(dy, x, w, rstd f32) -> (dx, dw) of x's dtype
extern const OpDef rms_norm_backward_op = {
    .num_inputs = 4,
    .num_outputs = 2,
    .infer = [](const Types& in, const Attrs&) -> Types {
      require_floating(in[1], "x");
      require_same_dtype(in[1], "x", in[0], "dy");
      require_same_dtype(in[1], "x", in[2], "weight");
      require_dtype(in[3], DType::f32, "rstd");
      require(in[0].shape == in[1].shape, "dy must have x's shape");
      require(!in[1].shape.empty() && in[2].shape == Shape{in[1].shape.back()},
              "weight must be [H]");
      require(in[3].shape == Shape(in[1].shape.begin(), in[1].shape.end() - 1),
              "rstd must have x's shape without the last dim");
      return {in[1], in[2]};
    },
    .cost = [](const Types& in, const Types&, const Attrs&) {
      return Cost{8.0 * numel(in[0].shape), 0};
    },
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) {
      const Shape& x = a.in_shape(1);
      cpu::rms_norm_backward(a.in(0), a.in(1), a.in(2), a.in(3), rows_of(x), x.back(), a.out(0),
                             a.out(1), static_cast<double*>(a.workspace));
    },
    .cpu_workspace_bytes = [](const Types& in, const Attrs&, int) -> int64_t {
      return 8 * cpu::rms_norm_backward_scratch_doubles(rows_of(in[1].shape), in[1].shape.back());
    },
    .cpu_per_isa = true,
    .cuda = {.name = "rms_norm_backward_fused",
             .run = AUTOSP_CUDA_RUN(cuda_rms_norm_backward),
             .workspace_bytes = cuda_rms_norm_backward_workspace},
};

}  // namespace autosp
