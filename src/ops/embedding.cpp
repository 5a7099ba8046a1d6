// embedding (a row gather) and its backward (a scatter-add).
#include <algorithm>

#include "kernels/cpu/fused.h"
#include "kernels/cuda/fused_layout.h"
#include "ops/op.h"
#ifdef AUTOSP_HAVE_CUDA
#include "kernels/cuda/fused.h"
#include "ops/cuda_kernels.h"
#endif

namespace autosp {

namespace {

// Out-of-range ids would read outside the table: reject them before the kernel runs.
void check_ids(const int32_t* ids, int64_t n, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      user_error("embedding: token id ", ids[i], " at position ", i, " is outside [0, ", vocab, ")");
}

}  // namespace

namespace {
// embedding_backward's device scratch: dW's fp32 sums for a bf16 dW (f32 sums in dW itself).
int64_t cuda_embedding_backward_workspace(const Types&, const Types& out, const Attrs&) {
  return cuda::embedding_backward_workspace_bytes(out[0].dtype == DType::f32, out[0].shape[0], out[0].shape[1]);
}
#ifdef AUTOSP_HAVE_CUDA
void cuda_embedding(const KernelArgs& a, const CudaContext& c) {
  const Shape& w = a.in_shape(0);
  cuda::embedding_forward_fused(cuda_in_dt(a, 0), a.in<void>(0), a.in<int32_t>(1), a.in_numel(1), w[1], w[0],
                                a.out<void>(0), c.error, c.stream);
}
void cuda_embedding_backward(const KernelArgs& a, const CudaContext& c) {
  const Shape& w = a.out_shape(0);
  float* acc = cuda_out_dt(a, 0) == cuda::Dt::f32 ? a.out<float>(0) : static_cast<float*>(a.workspace);
  cuda::embedding_backward_fused(cuda_in_dt(a, 0), a.in<void>(0), a.in<int32_t>(1), a.in_numel(1), w[1], w[0],
                                 a.out<void>(0), acc, c.error, c.stream);
  if (a.attrs->has("padding_idx")) {
    const int64_t row = w[1] * int64_t(dtype_size(a.out_types[0]->dtype));
    check_cuda(cudaMemsetAsync(a.out<char>(0) + a.attrs->get_int("padding_idx") * row, 0, size_t(row), c.stream),
               "cudaMemsetAsync", "embedding_backward's padding row");
  }
}
#endif
}  // namespace

// The padding row torch's padding_idx names, checked against the table's V rows.
void check_padding_idx(const Attrs& attrs, int64_t vocab) {
  if (!attrs.has("padding_idx")) return;
  const int64_t p = attrs.get_int("padding_idx");
  require(p >= 0 && p < vocab, "padding_idx ", p, " is outside [0, ", vocab, ")");
}

// embedding(weight[V, H], tokens i32[...]) {padding_idx?} -> [..., H] of weight's dtype.
// padding_idx (torch's): the gradient of that row is zero (its tokens add nothing to dW).
extern const OpDef embedding_op = {
    .num_inputs = 2,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      require_floating(in[0], "weight");
      require_rank(in[0], 2, "weight");
      require_dtype(in[1], DType::i32, "tokens");
      check_padding_idx(attrs, in[0].shape[0]);
      Shape out = in[1].shape;
      out.push_back(in[0].shape[1]);
      return {{in[0].dtype, out}};
    },
    .cost = nullptr,
    // dW[v] = sum of dy over the positions holding token v
    .grad = [](GradContext& c) {
      AUTOSP_CHECK(!c.needs[1], "token ids have no gradient");
      Attrs attrs{{"vocab", c.b.shape(c.in(0))[0]}};
      if (c.attrs().has("padding_idx")) attrs.set("padding_idx", c.attrs().get_int("padding_idx"));
      c.din[0] = c.b.emit1(OpKind::embedding_backward, {c.dout[0], c.in(1)}, attrs);
    },
    .cpu = [](const KernelArgs& a) {
      const Shape& w = a.in_shape(0);
      check_ids(a.in<int32_t>(1), a.in_numel(1), w[0]);
      cpu::embedding_forward(a.in(0), a.in<int32_t>(1), a.in_numel(1), w[1], a.out(0));
    },
    // rows follow the tokens: out dim d is tokens' dim d
    .shard = [](const Shardings& in, const Types&, const Attrs&) -> Shardings {
      require(is_replicated(in[0]), "the table must be replicated");
      require(!is_partial(in[1]), "token ids cannot be partial");
      return {in[1]};
    },
    .cpu_per_isa = true,
    .cuda = {.name = "embedding_fused", .run = AUTOSP_CUDA_RUN(cuda_embedding)},
};

// embedding_backward(dy[..., H], tokens i32[...]) {vocab, padding_idx?} -> dW[vocab, H] of dy's
// dtype; row padding_idx zero
extern const OpDef embedding_backward_op = {
    .num_inputs = 2,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      require_floating(in[0], "dy");
      require_dtype(in[1], DType::i32, "tokens");
      require(attrs.has("vocab") && attrs.get_int("vocab") > 0, "needs a positive 'vocab'");
      check_padding_idx(attrs, attrs.get_int("vocab"));
      Shape expect = in[1].shape;
      expect.push_back(in[0].shape.empty() ? -1 : in[0].shape.back());
      require(in[0].shape == expect, "dy must be tokens' shape + [H]");
      return {{in[0].dtype, {attrs.get_int("vocab"), in[0].shape.back()}}};
    },
    .cost = [](const Types& in, const Types&, const Attrs&) {
      return Cost{double(numel(in[0].shape)), 0};
    },
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) {
      const Shape& w = a.out_shape(0);
      check_ids(a.in<int32_t>(1), a.in_numel(1), w[0]);
      cpu::embedding_backward(a.in(0), a.in<int32_t>(1), a.in_numel(1), w[1], w[0], a.out(0));
      if (a.attrs->has("padding_idx")) std::fill_n(a.out(0) + a.attrs->get_int("padding_idx") * w[1], w[1], 0.0f);
    },
    .cpu_per_isa = true,
    .cuda = {.name = "embedding_backward_fused",
             .run = AUTOSP_CUDA_RUN(cuda_embedding_backward),
             .workspace_bytes = cuda_embedding_backward_workspace},
};

}  // namespace autosp
