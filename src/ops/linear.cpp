// linear (x W^T + b, the layer) and matmul (op(A) op(B), what its gradients are made of).
#include <algorithm>

#include "kernels/cpu/basic.h"
#include "ops/op.h"
#ifdef AUTOSP_HAVE_CUDA
#include "ops/cuda_kernels.h"
#endif

namespace autosp {

namespace {

// Flattens all but the last dim: [..., K] -> [rows, K].
ValueId as_2d(GraphBuilder& b, ValueId x) {
  const Shape& s = b.shape(x);
  if (s.size() == 2) return x;
  return b.emit1(OpKind::reshape, {x}, {{"shape", Shape{rows_of(s), s.back()}}});
}

}  // namespace

ValueId column_sums(GraphBuilder& b, ValueId dy, int64_t n) {
  const TensorType t = b.type(dy);  // a copy: emitting grows the graph
  const int64_t rows = numel(t.shape) / std::max<int64_t>(n, 1);
  const ValueId dy2 = t.shape == Shape{rows, n} ? dy : b.emit1(OpKind::reshape, {dy}, {{"shape", Shape{rows, n}}});
  Attrs ones{{"shape", Shape{rows, 1}}, {"value", 1.0}};
  if (t.dtype != DType::f32) ones.set("dtype", std::string(dtype_name(t.dtype)));
  const ValueId ones_col = b.emit1(OpKind::fill, {}, ones);
  const ValueId sums = b.emit1(OpKind::matmul, {ones_col, dy2}, {{"trans_a", int64_t{1}}});
  return b.emit1(OpKind::reshape, {sums}, {{"shape", Shape{n}}});
}

namespace {

struct MatmulDims {
  bool ta, tb;
  int64_t M, N, K;
};

// a: [..., M, K] (or [K, M] when trans_a, which needs rank 2); b: [K, N] (or [N, K]).
// Leading dims of a are flattened into M.
MatmulDims matmul_dims(const Types& in, const Attrs& attrs) {
  const bool ta = attrs.get_int("trans_a", 0) != 0, tb = attrs.get_int("trans_b", 0) != 0;
  const Shape &a = in[0].shape, &b = in[1].shape;
  require(a.size() >= 2, "a must have rank >= 2");
  require(b.size() == 2, "b must have rank 2");
  require(!ta || a.size() == 2, "trans_a needs a of rank 2");
  const int64_t M = ta ? a[1] : rows_of(a), Ka = ta ? a[0] : a.back();
  const int64_t Kb = tb ? b[1] : b[0], N = tb ? b[0] : b[1];
  require(Ka == Kb, "inner dims differ (", Ka, " vs ", Kb, ")");
  return {ta, tb, M, N, Ka};
}

}  // namespace

#ifdef AUTOSP_HAVE_CUDA
namespace {
// Both are one cublasGemmEx (fp32 accumulation; the result in the operands' dtype).
// With a bias, the result rows start as the bias and the gemm adds x W^T to them (beta 1):
// one rounding of x W^T + b to the result's dtype, as the CPU kernel's one fp32 sum.
void cuda_linear(const KernelArgs& a, const CudaContext& c) {
  const Shape& w = a.in_shape(1);
  const int64_t rows = rows_of(a.in_shape(0));
  const bool bias = a.inputs.size() == 3;
  if (bias) cuda::broadcast_rows(cuda_in_dt(a, 2), a.in<void>(2), rows, w[0], a.out<void>(0), c.stream);
  cuda_gemm(c, cuda_in_dt(a, 0), cuda_out_dt(a, 0), false, true, rows, w[0], w[1], a.in<void>(0), a.in<void>(1),
            a.out<void>(0), bias, "linear");
}
void cuda_matmul(const KernelArgs& a, const CudaContext& c) {
  const MatmulDims d = matmul_dims({*a.in_types[0], *a.in_types[1]}, *a.attrs);
  cuda_gemm(c, cuda_in_dt(a, 0), cuda_out_dt(a, 0), d.ta, d.tb, d.M, d.N, d.K, a.in<void>(0), a.in<void>(1),
            a.out<void>(0), false, "matmul");
}
}  // namespace
#endif

// linear(x[..., K], W[N, K][, b[N]]) = x W^T (+ b) : [..., N], every operand of one dtype (a
// bf16 GPU gemm accumulates in fp32 and rounds its result to bf16). The bias (Qwen2's q, k
// and v projections) is added to every row.
extern const OpDef linear_op = {
    .num_inputs = -1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs&) -> Types {
      require(in.size() == 2 || in.size() == 3, "expected x, weight and an optional bias, got ", in.size(),
              " operands");
      require_floating(in[0], "x");
      require_floating(in[1], "weight");
      require_same_dtype(in[0], "x", in[1], "weight");
      require(!in[0].shape.empty(), "x must have rank >= 1");
      require_rank(in[1], 2, "weight");
      require(in[0].shape.back() == in[1].shape[1], "x's last dim (", in[0].shape.back(),
              ") must equal weight's in-features (dim 1 = ", in[1].shape[1], ")");
      if (in.size() == 3) {
        require_same_dtype(in[0], "x", in[2], "bias");
        require(in[2].shape == Shape{in[1].shape[0]}, "bias must be [", in[1].shape[0],
                "] (weight's out-features), got ", shape_str(in[2].shape));
      }
      return {{in[0].dtype, with_last(in[0].shape, in[1].shape[0])}};
    },
    .cost = [](const Types& in, const Types&, const Attrs&) {
      const double rows = double(rows_of(in[0].shape)), N = double(in[1].shape[0]);
      return Cost{2.0 * rows * N * double(in[1].shape[1]) + (in.size() == 3 ? rows * N : 0.0), 0};
    },
    // dx = dy W ;  dW = dy^T x  (rows flattened) ;  db = sum over rows of dy = 1^T dy
    .grad = [](GradContext& c) {
      if (c.needs[0]) c.din[0] = c.b.emit1(OpKind::matmul, {c.dout[0], c.in(1)});
      if (c.needs[1])
        c.din[1] = c.b.emit1(OpKind::matmul, {as_2d(c.b, c.dout[0]), as_2d(c.b, c.in(0))},
                             {{"trans_a", int64_t{1}}});
      if (c.node.inputs.size() == 3 && c.needs[2]) c.din[2] = column_sums(c.b, c.dout[0], c.b.shape(c.in(2))[0]);
    },
    .cpu = [](const KernelArgs& a) {
      const Shape& w = a.in_shape(1);
      const int64_t rows = rows_of(a.in_shape(0));
      const bool bias = a.inputs.size() == 3;
      if (bias)  // C starts as the bias rows; the gemm adds x W^T (beta 1)
        for (int64_t r = 0; r < rows; ++r) std::copy_n(a.in(2), w[0], a.out(0) + r * w[0]);
      cpu::gemm(false, true, rows, w[0], w[1], a.in(0), a.in(1), a.out(0), bias);
    },
    .shard = [](const Shardings& in, const Types& t, const Attrs& a) -> Shardings {
      require(is_replicated(in[1]), "the weight must be replicated");
      require(in.size() < 3 || is_replicated(in[2]), "the bias must be replicated");
      return shard_rowwise(in, t, a);
    },
    .recompute = Recompute::matmul,
    .cuda = {.name = "cublas_gemm", .run = AUTOSP_CUDA_RUN(cuda_linear)},
};

// matmul(a, b) {trans_a, trans_b} = op(a) op(b)
extern const OpDef matmul_op = {
    .num_inputs = 2,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      require_floating(in[0], "a");
      require_floating(in[1], "b");
      require_same_dtype(in[0], "a", in[1], "b");
      MatmulDims d = matmul_dims(in, attrs);
      Shape out = d.ta ? Shape{d.M, d.N} : with_last(in[0].shape, d.N);
      return {{in[0].dtype, out}};
    },
    .cost = [](const Types& in, const Types&, const Attrs& attrs) {
      MatmulDims d = matmul_dims(in, attrs);
      return Cost{2.0 * d.M * d.N * d.K, 0};
    },
    // C = op(A) op(B):  d op(A) = dC op(B)^T,  d op(B) = op(A)^T dC; undo the op on each.
    .grad = [](GradContext& c) {
      const int64_t ta = c.attrs().get_int("trans_a", 0), tb = c.attrs().get_int("trans_b", 0);
      ValueId dC = c.dout[0];
      if (c.needs[0]) {
        c.din[0] = ta ? c.b.emit1(OpKind::matmul, {c.in(1), dC}, {{"trans_a", tb}, {"trans_b", int64_t{1}}})
                      : c.b.emit1(OpKind::matmul, {dC, c.in(1)}, {{"trans_b", 1 - tb}});
      }
      if (c.needs[1]) {
        ValueId a2 = as_2d(c.b, c.in(0)), dC2 = as_2d(c.b, dC);
        c.din[1] = tb ? c.b.emit1(OpKind::matmul, {dC2, a2}, {{"trans_a", int64_t{1}}, {"trans_b", ta}})
                      : c.b.emit1(OpKind::matmul, {a2, dC2}, {{"trans_a", 1 - ta}});
      }
    },
    .cpu = [](const KernelArgs& a) {
      MatmulDims d = matmul_dims({*a.in_types[0], *a.in_types[1]}, *a.attrs);
      cpu::gemm(d.ta, d.tb, d.M, d.N, d.K, a.in(0), a.in(1), a.out(0));
    },
    .recompute = Recompute::matmul,
    .cuda = {.name = "cublas_gemm", .run = AUTOSP_CUDA_RUN(cuda_matmul)},
};

}  // namespace autosp
