// Cross-entropy loss, as a sum over labelled tokens; the mean divides it by count_valid
// (kept separate so the autosp pass can all-reduce the count across ranks).
// linear_cross_entropy fuses the LM head into it, so training never holds [T, V] logits.
//
// Types: logits (or x and weight) are f32 or bf16; the loss sum and the per-token lse are
// f32 whatever they are, as bf16 cross-entropy kernels (Liger, FlashAttention's) compute
// the row max, sum of exponentials and loss in fp32 and keep the lse in fp32: a loss summed
// over S tokens in bf16 would lose all but 8 bits of it. Gradients have the operands' dtype.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/fused.h"
#include "kernels/cpu/linear_cross_entropy.h"
#include "ops/op.h"
#ifdef AUTOSP_HAVE_CUDA
#include "ops/cuda_kernels.h"
#endif

namespace autosp {

namespace {

constexpr int64_t kDefaultIgnoreIndex = -100;  // as torch.nn.CrossEntropyLoss

void check_labels(const int32_t* labels, int64_t n, int64_t V, int64_t ignore, const char* op) {
  for (int64_t i = 0; i < n; ++i)
    if (labels[i] != ignore && (labels[i] < 0 || labels[i] >= V))
      user_error(op, ": label ", labels[i], " at position ", i, " is outside [0, ", V,
                 ") and is not the ignore index ", ignore);
}

void check_logits_labels(const TensorType& logits, const TensorType& labels) {
  require_floating(logits, "logits");
  require_dtype(labels, DType::i32, "labels");
  require(!logits.shape.empty() &&
              labels.shape == Shape(logits.shape.begin(), logits.shape.end() - 1),
          "labels must have logits' shape without the class dim");
}

// Rows per chunk of linear_cross_entropy: the "chunk" attribute, or as many rows as fit in
// 64 MiB of fp32 logits. Chunks should not be small on the CPU: every chunk reads and
// writes all of dW (V x H) for 2 r V H FLOPs, i.e. r / 4 FLOPs per byte for r rows.
constexpr int64_t kLinearCrossEntropyChunkBytes = int64_t{64} << 20;

int64_t chunk_rows(const Attrs& attrs, int64_t V) {
  const int64_t fit = kLinearCrossEntropyChunkBytes / (int64_t{sizeof(float)} * std::max<int64_t>(V, 1));
  return attrs.get_int("chunk", std::max<int64_t>(fit, 1));
}

void check_linear_labels(const TensorType& x, const TensorType& w, const TensorType& labels,
                         const Attrs& attrs) {
  require_floating(x, "x");
  require_floating(w, "weight");
  require_same_dtype(x, "x", w, "weight");
  require_dtype(labels, DType::i32, "labels");
  require(!x.shape.empty(), "x must have rank >= 1");
  require_rank(w, 2, "weight");
  require(x.shape.back() == w.shape[1], "x's last dim (", x.shape.back(),
          ") must equal weight's in-features (dim 1 = ", w.shape[1], ")");
  require(w.shape[0] >= 1, "weight must have at least one class (row)");
  require(labels.shape == Shape(x.shape.begin(), x.shape.end() - 1),
          "labels must have x's shape without the hidden dim");
  if (attrs.has("chunk"))
    require(attrs.get_int("chunk") >= 1, "chunk (rows per chunk) must be >= 1, got ",
            attrs.get_int("chunk"));
  const double cap = attrs.get_float("softcap", 0.0);
  require(std::isfinite(cap) && cap >= 0, "'softcap' must be positive (or 0: none), got ", cap);
}

// The final logit softcap c (attribute "softcap", absent: 0 = none): the loss is of the logits
// c tanh(x W^T / c) (Gemma 2's final_logit_softcapping).
float softcap_of(const Attrs& attrs) { return float(attrs.get_float("softcap", 0.0)); }

}  // namespace

namespace {

int32_t ignore_index(const Attrs& attrs) {
  return static_cast<int32_t>(attrs.get_int("ignore_index", kDefaultIgnoreIndex));
}

// A CPU kernel's ignore index, once every label of input `labels` is checked to lie in [0, V)
// or be it (a UserError naming `op` otherwise).
int32_t checked_ignore_index(const KernelArgs& a, int labels, int64_t V, const char* op) {
  const int32_t ignore = ignore_index(*a.attrs);
  check_labels(a.in<int32_t>(labels), a.in_numel(labels), V, ignore, op);
  return ignore;
}

// linear_cross_entropy's rows per chunk on the GPU: the "chunk" attribute, or as many rows
// as fit in 256 MiB of fp32 logits (a GPU gemm wants large chunks; the CPU's default is
// 64 MiB because every chunk rereads all of dW there).
constexpr int64_t kCudaChunkLogitsBytes = int64_t{256} << 20;
int64_t cuda_chunk_rows(const Attrs& attrs, int64_t T, int64_t V) {
  const int64_t fit = std::max<int64_t>(kCudaChunkLogitsBytes / (4 * std::max<int64_t>(V, 1)), 1);
  return std::max<int64_t>(std::min(attrs.get_int("chunk", fit), std::max<int64_t>(T, 1)), 1);
}

// Device scratch: the rows' losses (summed in a fixed order after).
int64_t cuda_cross_entropy_workspace(const Types& in, const Types&, const Attrs&) {
  return 4 * rows_of(in[0].shape);
}
// A chunk's fp32 logits, then the rows' losses.
int64_t cuda_linear_cross_entropy_workspace(const Types& in, const Types&, const Attrs& attrs) {
  const int64_t T = rows_of(in[0].shape), V = in[1].shape[0];
  return 4 * (cuda_chunk_rows(attrs, T, V) * V + T);
}
// A chunk's fp32 logits; for bf16 also its dz in bf16 and dW's fp32 sums.
int64_t cuda_linear_cross_entropy_backward_workspace(const Types& in, const Types&, const Attrs& attrs) {
  const int64_t T = rows_of(in[1].shape), V = in[2].shape[0], H = in[2].shape[1];
  const int64_t chunk = cuda_chunk_rows(attrs, T, V);
  if (in[1].dtype == DType::f32) return 4 * chunk * V;
  return cuda_aligned(4 * chunk * V) + cuda_aligned(2 * chunk * V) + 4 * V * H;
}

// The composition's: the rows' lse, then the larger of the two kernels' scratch (they run
// one after the other).
int64_t cuda_linear_cross_entropy_with_grad_workspace(const Types& in, const Types&, const Attrs& attrs) {
  const TensorType lse{DType::f32, in[2].shape};
  const int64_t forward = cuda_linear_cross_entropy_workspace({in[0], in[1], in[2]}, {}, attrs);
  const int64_t backward = cuda_linear_cross_entropy_backward_workspace({in[3], in[0], in[1], in[2], lse}, {}, attrs);
  return cuda_aligned(4 * numel(lse.shape)) + std::max(forward, backward);
}

#ifdef AUTOSP_HAVE_CUDA
void cuda_cross_entropy(const KernelArgs& a, const CudaContext& c) {
  const Shape& x = a.in_shape(0);
  float* row_loss = static_cast<float*>(a.workspace);
  cuda::cross_entropy_rows(cuda_in_dt(a, 0), a.in<void>(0), a.in<int32_t>(1), rows_of(x), x.back(),
                           ignore_index(*a.attrs), a.out<float>(1), row_loss, c.error, c.stream);
  cuda::sum_rows(row_loss, rows_of(x), a.out<float>(0), c.stream);
}
// cross_entropy_backward(dloss, logits, labels, lse) -> dlogits
void cuda_cross_entropy_backward(const KernelArgs& a, const CudaContext& c) {
  const Shape& x = a.in_shape(1);
  cuda::cross_entropy_backward_rows(cuda_in_dt(a, 1), a.in<void>(1), a.in<int32_t>(2), a.in<float>(3),
                                    a.in<float>(0), rows_of(x), x.back(), ignore_index(*a.attrs), cuda_out_dt(a, 0),
                                    a.out<void>(0), c.stream);
}
// linear_cross_entropy(x, W, labels): per chunk of rows, fp32 logits = x_c W^T (cuBLAS,
// fp32 accumulation and result), then the row-wise loss on them.
void cuda_linear_cross_entropy(const KernelArgs& a, const CudaContext& c) {
  const Shape& w = a.in_shape(1);
  const int64_t T = rows_of(a.in_shape(0)), V = w[0], H = w[1], chunk = cuda_chunk_rows(*a.attrs, T, V);
  const cuda::Dt dt = cuda_in_dt(a, 0);
  float* logits = static_cast<float*>(a.workspace);
  float* row_loss = logits + chunk * V;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t r = std::min(chunk, T - t0);
    cuda_gemm(c, dt, cuda::Dt::f32, false, true, r, V, H, a.in<char>(0) + t0 * H * cuda::dt_size(dt),
              a.in<void>(1), logits, false, "linear_cross_entropy");
    cuda::cross_entropy_rows(cuda::Dt::f32, logits, a.in<int32_t>(2) + t0, r, V, ignore_index(*a.attrs),
                             a.out<float>(1) + t0, row_loss + t0, c.error, c.stream, softcap_of(*a.attrs));
  }
  cuda::sum_rows(row_loss, T, a.out<float>(0), c.stream);
}
// linear_cross_entropy_backward(dloss, x, W, labels, lse) -> (dx, dW): per chunk the fp32
// logits again, dz = dloss (softmax - onehot) in the operands' dtype, dx_c = dz W and
// dW += dz^T x_c (accumulated in fp32: in dW itself for f32, in the workspace for bf16).
void cuda_linear_cross_entropy_backward(const KernelArgs& a, const CudaContext& c) {
  const Shape& w = a.in_shape(2);
  const int64_t T = rows_of(a.in_shape(1)), V = w[0], H = w[1], chunk = cuda_chunk_rows(*a.attrs, T, V);
  const cuda::Dt dt = cuda_in_dt(a, 1);
  const int64_t es = cuda::dt_size(dt);
  char* ws = static_cast<char*>(a.workspace);
  float* logits = reinterpret_cast<float*>(ws);
  void* dz = dt == cuda::Dt::f32 ? static_cast<void*>(logits) : static_cast<void*>(ws + cuda_aligned(4 * chunk * V));
  float* dw_acc = dt == cuda::Dt::f32
                      ? a.out<float>(1)
                      : reinterpret_cast<float*>(ws + cuda_aligned(4 * chunk * V) + cuda_aligned(2 * chunk * V));
  if (T == 0)
    check_cuda(cudaMemsetAsync(dw_acc, 0, size_t(4 * V * H), c.stream), "cudaMemsetAsync",
               "linear_cross_entropy_backward");
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t r = std::min(chunk, T - t0);
    const void* xc = a.in<char>(1) + t0 * H * es;
    cuda_gemm(c, dt, cuda::Dt::f32, false, true, r, V, H, xc, a.in<void>(2), logits, false,
              "linear_cross_entropy_backward");
    cuda::cross_entropy_backward_rows(cuda::Dt::f32, logits, a.in<int32_t>(3) + t0, a.in<float>(4) + t0,
                                      a.in<float>(0), r, V, ignore_index(*a.attrs), dt, dz, c.stream,
                                      softcap_of(*a.attrs));
    cuda_gemm(c, dt, dt, false, false, r, H, V, dz, a.in<void>(2), a.out<char>(0) + t0 * H * es, false,
              "linear_cross_entropy_backward");
    cuda_gemm(c, dt, cuda::Dt::f32, true, false, V, H, r, dz, xc, dw_acc, t0 > 0, "linear_cross_entropy_backward");
  }
  if (dt != cuda::Dt::f32) cuda::convert(cuda::Dt::f32, dt, dw_acc, V * H, a.out<void>(1), c.stream);
}
// linear_cross_entropy_with_grad(x, W, labels, dloss) -> (loss_sum, dx, dW): on the device the
// forward kernel (its lse into the workspace), then the backward kernel reading it: the two
// ops' numbers, without the CPU kernel's saved gemm. The fuse pass makes this op for the cpu
// backend only, so no cuda graph holds it yet.
void cuda_linear_cross_entropy_with_grad(const KernelArgs& a, const CudaContext& c) {
  const TensorType lse_type{DType::f32, a.in_shape(2)};
  char* ws = static_cast<char*>(a.workspace);
  float* lse = reinterpret_cast<float*>(ws);
  void* rest = ws + cuda_aligned(4 * numel(lse_type.shape));
  KernelArgs f = a;
  f.inputs = {a.inputs.at(0), a.inputs.at(1), a.inputs.at(2)};
  f.in_types = {a.in_types.at(0), a.in_types.at(1), a.in_types.at(2)};
  f.outputs = {a.outputs.at(0), lse};
  f.out_types = {a.out_types.at(0), &lse_type};
  f.workspace = rest;
  cuda_linear_cross_entropy(f, c);
  KernelArgs b = a;
  b.inputs = {a.inputs.at(3), a.inputs.at(0), a.inputs.at(1), a.inputs.at(2), lse};
  b.in_types = {a.in_types.at(3), a.in_types.at(0), a.in_types.at(1), a.in_types.at(2), &lse_type};
  b.outputs = {a.outputs.at(1), a.outputs.at(2)};
  b.out_types = {a.out_types.at(1), a.out_types.at(2)};
  b.workspace = rest;
  cuda_linear_cross_entropy_backward(b, c);
}
void cuda_count_valid(const KernelArgs& a, const CudaContext& c) {
  cuda::count_valid(a.in<int32_t>(0), a.in_numel(0), ignore_index(*a.attrs), a.out<float>(0), c.stream);
}
#endif

}  // namespace

// cross_entropy(logits[..., V], labels i32[...]) {ignore_index}
//   -> (loss_sum [], lse [...]),  loss_sum = sum over labelled rows of lse - logit[label]
extern const OpDef cross_entropy_op = {
    .num_inputs = 2,
    .num_outputs = 2,
    .infer = [](const Types& in, const Attrs&) -> Types {
      check_logits_labels(in[0], in[1]);
      return {{DType::f32, {}}, {DType::f32, in[1].shape}};
    },
    .cost = [](const Types& in, const Types&, const Attrs&) {
      return Cost{4.0 * numel(in[0].shape), 0};
    },
    // d loss_sum / d logits = softmax(logits) - onehot(label), on labelled rows
    .grad = [](GradContext& c) {
      AUTOSP_CHECK(c.dout[1] < 0, "nothing differentiates through the log-sum-exp");
      AUTOSP_CHECK(!c.needs[1], "labels have no gradient");
      c.din[0] = c.b.emit1(OpKind::cross_entropy_backward, {c.dout[0], c.in(0), c.in(1), c.out(1)},
                           c.attrs());
    },
    .cpu = [](const KernelArgs& a) {
      const Shape& x = a.in_shape(0);
      const int32_t ignore = checked_ignore_index(a, 1, x.back(), "cross_entropy");
      cpu::cross_entropy_forward(a.in(0), a.in<int32_t>(1), rows_of(x), x.back(), ignore, a.out(0), a.out(1));
    },
    // rows split alike: each rank's loss_sum is its part of the whole sum
    .shard = [](const Shardings& in, const Types& t, const Attrs& a) -> Shardings {
      Shardings rows = shard_rowwise({in[0]}, {t[0]}, a);
      require(in[1] == rows[0], "labels must be split like the logits' rows");
      return {is_replicated(rows[0]) ? replicated() : partial(), rows[0]};
    },
    .cpu_per_isa = true,
    .cuda = {.name = "cross_entropy_rows",
             .run = AUTOSP_CUDA_RUN(cuda_cross_entropy),
             .workspace_bytes = cuda_cross_entropy_workspace},
};

// cross_entropy_backward(dloss_sum [], logits, labels, lse) {ignore_index} -> dlogits
extern const OpDef cross_entropy_backward_op = {
    .num_inputs = 4,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) -> Types {
      require(in[0] == TensorType{DType::f32, {}}, "dloss must be f32[]");
      check_logits_labels(in[1], in[2]);
      require(in[3] == TensorType{DType::f32, in[2].shape}, "lse must be f32 with labels' shape");
      return {in[1]};
    },
    .cost = [](const Types& in, const Types&, const Attrs&) {
      return Cost{3.0 * numel(in[1].shape), 0};
    },
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) {
      const Shape& x = a.in_shape(1);
      const int32_t ignore = checked_ignore_index(a, 2, x.back(), "cross_entropy");
      cpu::cross_entropy_backward(a.in(0), a.in(1), a.in<int32_t>(2), a.in(3), rows_of(x), x.back(), ignore,
                                  a.out(0));
    },
    .cpu_per_isa = true,
    .cuda = {.name = "cross_entropy_backward_rows", .run = AUTOSP_CUDA_RUN(cuda_cross_entropy_backward)},
};

// linear_cross_entropy(x[..., H], weight[V, H], labels i32[...]) {ignore_index, chunk[, softcap]}
//   -> (loss_sum [], lse [...]):  cross_entropy(linear(x, weight), labels) without the
// [..., V] logits: they are made `chunk` rows at a time in the workspace (and remade by the
// backward). chunk defaults to the rows of 64 MiB of logits. softcap c > 0: the loss is of
// c tanh(logits / c), capped by the row passes (no more memory).
extern const OpDef linear_cross_entropy_op = {
    .num_inputs = 3,
    .num_outputs = 2,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      check_linear_labels(in[0], in[1], in[2], attrs);
      return {{DType::f32, {}}, {DType::f32, in[2].shape}};
    },
    // logits gemm + cross_entropy's 4 per logit
    .cost = [](const Types& in, const Types&, const Attrs&) {
      const double TV = double(rows_of(in[0].shape)) * double(in[1].shape[0]);
      return Cost{2.0 * TV * double(in[1].shape[1]) + 4.0 * TV, 0};
    },
    // z = x W^T, dz = dloss_sum (softmax(z) - onehot(label)) on labelled rows:
    //   dx = dz W,  dW = dz^T x   (one backward op, recomputing z from x, W and lse)
    .grad = [](GradContext& c) {
      AUTOSP_CHECK(c.dout[1] < 0, "nothing differentiates through the log-sum-exp");
      AUTOSP_CHECK(!c.needs[2], "labels have no gradient");
      auto d = c.b.emit(OpKind::linear_cross_entropy_backward,
                        {c.dout[0], c.in(0), c.in(1), c.in(2), c.out(1)}, c.attrs());
      if (c.needs[0]) c.din[0] = d[0];
      if (c.needs[1]) c.din[1] = d[1];
    },
    .cpu = [](const KernelArgs& a) {
      const Shape& w = a.in_shape(1);
      const int32_t ignore = checked_ignore_index(a, 2, w[0], "linear_cross_entropy");
      cpu::linear_cross_entropy_forward(a.in(0), a.in(1), a.in<int32_t>(2), rows_of(a.in_shape(0)), w[1], w[0],
                                        ignore, chunk_rows(*a.attrs, w[0]), a.out(0), a.out(1),
                                        static_cast<float*>(a.workspace), softcap_of(*a.attrs));
    },
    .cpu_workspace_bytes = [](const Types& in, const Attrs& attrs, int) -> int64_t {
      const int64_t V = in[1].shape[0];
      return int64_t{sizeof(float)} * cpu::linear_cross_entropy_forward_workspace_floats(
                                          rows_of(in[0].shape), V, chunk_rows(attrs, V));
    },
    // rows split alike, weight whole: each rank's loss_sum is its part of the whole sum
    .shard = [](const Shardings& in, const Types& t, const Attrs& a) -> Shardings {
      require(is_replicated(in[1]), "the weight must be replicated");
      Shardings rows = shard_rowwise({in[0]}, {t[0]}, a);
      require(in[2] == rows[0], "labels must be split like x's rows");
      return {is_replicated(rows[0]) ? replicated() : partial(), rows[0]};
    },
    .cuda = {.name = "linear_cross_entropy",
             .run = AUTOSP_CUDA_RUN(cuda_linear_cross_entropy),
             .workspace_bytes = cuda_linear_cross_entropy_workspace},
};

// linear_cross_entropy_backward(dloss_sum [], x, weight, labels, lse) {ignore_index, chunk}
//   -> (dx, dweight)
extern const OpDef linear_cross_entropy_backward_op = {
    .num_inputs = 5,
    .num_outputs = 2,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      require(in[0] == TensorType{DType::f32, {}}, "dloss must be f32[]");
      check_linear_labels(in[1], in[2], in[3], attrs);
      require(in[4] == TensorType{DType::f32, in[3].shape}, "lse must be f32 with labels' shape");
      return {in[1], in[2]};
    },
    // three gemms (the logits again, dx, dW) + cross_entropy_backward's 3 per logit
    .cost = [](const Types& in, const Types&, const Attrs&) {
      const double TV = double(rows_of(in[1].shape)) * double(in[2].shape[0]);
      return Cost{6.0 * TV * double(in[2].shape[1]) + 3.0 * TV, 0};
    },
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) {
      const Shape& w = a.in_shape(2);
      const int32_t ignore = checked_ignore_index(a, 3, w[0], "linear_cross_entropy_backward");
      cpu::linear_cross_entropy_backward(a.in(0), a.in(1), a.in(2), a.in<int32_t>(3), a.in(4), rows_of(a.in_shape(1)),
                                         w[1], w[0], ignore, chunk_rows(*a.attrs, w[0]), a.out(0), a.out(1),
                                         static_cast<float*>(a.workspace), softcap_of(*a.attrs));
    },
    .cpu_workspace_bytes = [](const Types& in, const Attrs& attrs, int) -> int64_t {
      const int64_t V = in[2].shape[0];
      return int64_t{sizeof(float)} * cpu::linear_cross_entropy_backward_workspace_floats(
                                          rows_of(in[1].shape), V, chunk_rows(attrs, V));
    },
    .cuda = {.name = "linear_cross_entropy_backward",
             .run = AUTOSP_CUDA_RUN(cuda_linear_cross_entropy_backward),
             .workspace_bytes = cuda_linear_cross_entropy_backward_workspace},
};

// linear_cross_entropy_with_grad(x, weight, labels, dloss_sum []) {ignore_index, chunk}
//   -> (loss_sum [], dx, dweight): linear_cross_entropy and its backward in one pass over the
// chunks (the logits made once, not again by the backward), for a step whose dloss_sum does
// not depend on the loss: the fuse pass makes it from the pair (passes/fuse.h). The same
// numbers as the pair, bit for bit (kernels/cpu/linear_cross_entropy.h).
extern const OpDef linear_cross_entropy_with_grad_op = {
    .num_inputs = 4,
    .num_outputs = 3,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      check_linear_labels(in[0], in[1], in[2], attrs);
      require(in[3] == TensorType{DType::f32, {}}, "dloss must be f32[]");
      return {{DType::f32, {}}, in[0], in[1]};
    },
    // the logits gemm, dx and dW + cross_entropy's 4 per logit forward and 3 backward
    .cost = [](const Types& in, const Types&, const Attrs&) {
      const double TV = double(rows_of(in[0].shape)) * double(in[1].shape[0]);
      return Cost{6.0 * TV * double(in[1].shape[1]) + 7.0 * TV, 0};
    },
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) {
      const Shape& w = a.in_shape(1);
      const int32_t ignore = checked_ignore_index(a, 2, w[0], "linear_cross_entropy");
      cpu::linear_cross_entropy_with_grad(a.in(0), a.in(1), a.in<int32_t>(2), a.in(3), rows_of(a.in_shape(0)), w[1],
                                          w[0], ignore, chunk_rows(*a.attrs, w[0]), a.out(0), a.out(1), a.out(2),
                                          static_cast<float*>(a.workspace), softcap_of(*a.attrs));
    },
    .cpu_workspace_bytes = [](const Types& in, const Attrs& attrs, int) -> int64_t {
      const int64_t V = in[1].shape[0];
      return int64_t{sizeof(float)} * cpu::linear_cross_entropy_with_grad_workspace_floats(
                                          rows_of(in[0].shape), V, chunk_rows(attrs, V));
    },
    .cuda = {.name = "linear_cross_entropy_with_grad",
             .run = AUTOSP_CUDA_RUN(cuda_linear_cross_entropy_with_grad),
             .workspace_bytes = cuda_linear_cross_entropy_with_grad_workspace},
};

// count_valid(labels i32[...]) {ignore_index} -> f32[]: how many labels are not ignored
extern const OpDef count_valid_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) -> Types {
      require_dtype(in[0], DType::i32, "labels");
      return {{DType::f32, {}}};
    },
    .cost = nullptr,
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) {
      const int32_t ignore = ignore_index(*a.attrs);
      const int32_t* labels = a.in<int32_t>(0);
      int64_t count = 0;
      for (int64_t i = 0; i < a.in_numel(0); ++i) count += labels[i] != ignore;
      a.out(0)[0] = float(count);
    },
    .shard = [](const Shardings& in, const Types&, const Attrs&) -> Shardings {
      require(!is_partial(in[0]), "labels cannot be partial");
      return {is_replicated(in[0]) ? replicated() : partial()};
    },
    .cuda = {.name = "count_valid", .run = AUTOSP_CUDA_RUN(cuda_count_valid)},
};

}  // namespace autosp
