#include "ops/cuda_kernels.h"
#include "ops/rope.h"

#include <algorithm>
#include <climits>
#include <iterator>

#include "comm/nccl_communicator.h"
#include "kernels/cpu/fused.h"
#include "kernels/cuda/kernels.h"

namespace autosp {

void check_cuda(cudaError_t rc, const char* call, const std::string& where) {
  if (rc == cudaSuccess) return;
  throw CudaError(str("cuda backend: ", call, " failed in ", where, ": ", cudaGetErrorName(rc), " (",
                      cudaGetErrorString(rc), ")",
                      rc == cudaErrorMemoryAllocation
                          ? "; the step needs more device memory than is free: use a shorter sequence, a "
                            "checkpoint policy that keeps less (compile.checkpoint), or more ranks"
                          : "; CUDA_LAUNCH_BLOCKING=1 makes the failing kernel report itself"));
}

void check_cublas(cublasStatus_t rc, const char* call, const std::string& where) {
  if (rc == CUBLAS_STATUS_SUCCESS) return;
  throw CudaError(str("cuda backend: ", call, " failed in ", where, ": ", cublasGetStatusName(rc), " (",
                      cublasGetStatusString(rc), ")"));
}

namespace {

using cuda::Dt;

Dt dt_of(const TensorType& t) {
  AUTOSP_CHECK(t.dtype == DType::f32 || t.dtype == DType::bf16, "cuda kernel given ", type_str(t));
  return t.dtype == DType::bf16 ? Dt::bf16 : Dt::f32;
}
Dt in_dt(const KernelArgs& a, int i) { return dt_of(*a.in_types.at(i)); }
Dt out_dt(const KernelArgs& a, int i) { return dt_of(*a.out_types.at(i)); }
int64_t esize(const TensorType& t) { return dtype_size(t.dtype); }

constexpr int64_t kDefaultIgnoreIndex = -100;  // as the CPU rules (cross_entropy.cpp)
int32_t ignore_index(const Attrs& attrs) {
  return static_cast<int32_t>(attrs.get_int("ignore_index", kDefaultIgnoreIndex));
}

// Workspace pieces start at 256-byte boundaries (cudaMalloc's alignment), as cuBLAS's
// fastest kernels want their operands.
int64_t aligned256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

cudaDataType_t cublas_type(Dt dt) { return dt == Dt::bf16 ? CUDA_R_16BF : CUDA_R_32F; }

// C[M, N] (of c_dt) = op(A) op(B) (+ C when accumulate), row-major, A and B of ab_dt, fp32
// accumulation. Row-major C is column-major C^T = op(B)^T op(A)^T, so cuBLAS is called with
// the operands swapped and each one's row-major leading dimension.
void gemm(const CudaContext& c, Dt ab_dt, Dt c_dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A,
          const void* B, void* C, bool accumulate, const char* op) {
  if (M == 0 || N == 0) return;
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
    user_error("cuda backend: ", op, ": a matmul of ", M, " x ", N, " x ", K, " exceeds cuBLAS's int dimensions");
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const int lda = static_cast<int>(ta ? M : K), ldb = static_cast<int>(tb ? K : N);
  check_cublas(cublasGemmEx(c.cublas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                            static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, B,
                            cublas_type(ab_dt), ldb, A, cublas_type(ab_dt), lda, &beta, C, cublas_type(c_dt),
                            static_cast<int>(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx", op);
}

void copy_bytes(void* dst, const void* src, int64_t bytes, const CudaContext& c, const char* op) {
  if (dst == src || bytes == 0) return;
  check_cuda(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToDevice, c.stream), "cudaMemcpyAsync", op);
}

NcclCommunicator& nccl_of(const KernelArgs& a, const char* op) {
  auto* n = dynamic_cast<NcclCommunicator*>(a.comm);
  if (!n)
    user_error("cuda backend: ", op, " on group '", a.attrs->get_str("group"),
               "' needs an NCCL communicator (comm/nccl_communicator.h, make_nccl_groups)");
  return *n;
}

// ---- matmul shapes, as linear.cpp's rule reads them ------------------------------------------
struct MatmulDims {
  bool ta, tb;
  int64_t M, N, K;
};
MatmulDims matmul_dims(const KernelArgs& a) {
  const bool ta = a.attrs->get_int("trans_a", 0) != 0, tb = a.attrs->get_int("trans_b", 0) != 0;
  const Shape &x = a.in_shape(0), &y = a.in_shape(1);
  return {ta, tb, ta ? x[1] : rows_of(x), tb ? y[0] : y[1], ta ? x[0] : x.back()};
}

cuda::AttentionDims attention_dims(const Shape& q, const Shape& k) { return {q[0], q[1], q[2], k[2], q[3]}; }

void check_head_dim(int64_t D, const char* op) {
  if (D > cuda::kAttentionMaxD)
    user_error("cuda backend: ", op, ": head dim D = ", D, " exceeds the reference kernel's ",
               cuda::kAttentionMaxD);
}

// linear_cross_entropy's rows per chunk on the GPU: the "chunk" attribute, or as many rows
// as fit in 256 MiB of fp32 logits (a GPU gemm wants large chunks; the CPU's default is
// 64 MiB because every chunk rereads all of dW there).
constexpr int64_t kChunkLogitsBytes = int64_t{256} << 20;
int64_t lce_chunk(const Attrs& attrs, int64_t T, int64_t V) {
  const int64_t fit = std::max<int64_t>(kChunkLogitsBytes / (4 * std::max<int64_t>(V, 1)), 1);
  return std::max<int64_t>(std::min(attrs.get_int("chunk", fit), std::max<int64_t>(T, 1)), 1);
}

using Run = void (*)(const KernelArgs&, const CudaContext&);
using Workspace = int64_t (*)(const Types&, const Types&, const Attrs&);

// ---- the kernels, by op ---------------------------------------------------------------------

void run_fill(const KernelArgs& a, const CudaContext& c) {
  cuda::fill(out_dt(a, 0), a.out<void>(0), a.out_numel(0), float(a.attrs->get_float("value")), c.stream);
}
void run_expand(const KernelArgs& a, const CudaContext& c) {
  cuda::expand(in_dt(a, 0), a.in<void>(0), a.out<void>(0), a.out_numel(0), c.stream);
}
void run_embedding(const KernelArgs& a, const CudaContext& c) {
  const Shape& w = a.in_shape(0);
  cuda::embedding_forward(in_dt(a, 0), a.in<void>(0), a.in<int32_t>(1), a.in_numel(1), w[1], w[0], a.out<void>(0),
                          c.error, c.stream);
}
void run_embedding_backward(const KernelArgs& a, const CudaContext& c) {
  const Shape& w = a.out_shape(0);
  float* acc = out_dt(a, 0) == Dt::f32 ? a.out<float>(0) : static_cast<float*>(a.workspace);
  cuda::embedding_backward(in_dt(a, 0), a.in<void>(0), a.in<int32_t>(1), a.in_numel(1), w[1], w[0], a.out<void>(0),
                           acc, c.error, c.stream);
}
int64_t ws_embedding_backward(const Types&, const Types& out, const Attrs&) {
  return out[0].dtype == DType::f32 ? 0 : 4 * numel(out[0].shape);
}
void run_linear(const KernelArgs& a, const CudaContext& c) {
  const Shape& w = a.in_shape(1);
  gemm(c, in_dt(a, 0), out_dt(a, 0), false, true, rows_of(a.in_shape(0)), w[0], w[1], a.in<void>(0), a.in<void>(1),
       a.out<void>(0), false, "linear");
}
void run_matmul(const KernelArgs& a, const CudaContext& c) {
  const MatmulDims d = matmul_dims(a);
  gemm(c, in_dt(a, 0), out_dt(a, 0), d.ta, d.tb, d.M, d.N, d.K, a.in<void>(0), a.in<void>(1), a.out<void>(0), false,
       "matmul");
}
void run_add(const KernelArgs& a, const CudaContext& c) {
  cuda::add(in_dt(a, 0), a.in<void>(0), a.in<void>(1), a.out_numel(0), a.out<void>(0), c.stream);
}
void run_mul(const KernelArgs& a, const CudaContext& c) {
  cuda::mul(in_dt(a, 0), a.in<void>(0), a.in<void>(1), a.out_numel(0), a.out<void>(0), c.stream);
}
void run_scale(const KernelArgs& a, const CudaContext& c) {
  cuda::scale(in_dt(a, 0), a.in<void>(0), a.out_numel(0), float(a.attrs->get_float("alpha")), a.out<void>(0),
              c.stream);
}
void run_sum(const KernelArgs& a, const CudaContext& c) {
  cuda::sum(in_dt(a, 0), a.in<void>(0), a.in_numel(0), a.out<void>(0), c.stream);
}
void run_div_scalar(const KernelArgs& a, const CudaContext& c) {
  cuda::div_scalar(in_dt(a, 0), a.in<void>(0), a.out_numel(0), a.in<void>(1), a.out<void>(0), c.stream);
}
void run_convert(const KernelArgs& a, const CudaContext& c) {
  cuda::convert(in_dt(a, 0), out_dt(a, 0), a.in<void>(0), a.in_numel(0), a.out<void>(0), c.stream);
}
void run_silu(const KernelArgs& a, const CudaContext& c) {
  cuda::silu_forward(in_dt(a, 0), a.in<void>(0), a.in_numel(0), a.out<void>(0), c.stream);
}
void run_silu_backward(const KernelArgs& a, const CudaContext& c) {
  cuda::silu_backward(in_dt(a, 0), a.in<void>(0), a.in<void>(1), a.in_numel(0), a.out<void>(0), c.stream);
}
void run_swiglu(const KernelArgs& a, const CudaContext& c) {
  cuda::swiglu_forward(in_dt(a, 0), a.in<void>(0), a.in<void>(1), a.in_numel(0), a.out<void>(0), c.stream);
}
void run_swiglu_backward(const KernelArgs& a, const CudaContext& c) {
  cuda::swiglu_backward(in_dt(a, 0), a.in<void>(0), a.in<void>(1), a.in<void>(2), a.in_numel(0), a.out<void>(0),
                        a.out<void>(1), c.stream);
}
void run_rms_norm(const KernelArgs& a, const CudaContext& c) {
  const Shape& x = a.in_shape(0);
  cuda::rms_norm_forward(in_dt(a, 0), a.in<void>(0), a.in<void>(1), rows_of(x), x.back(),
                         float(a.attrs->get_float("eps")), a.out<void>(0), a.out<float>(1), c.stream);
}
void run_rms_norm_backward(const KernelArgs& a, const CudaContext& c) {
  const Shape& x = a.in_shape(1);
  float* acc = out_dt(a, 1) == Dt::f32 ? a.out<float>(1) : static_cast<float*>(a.workspace);
  cuda::rms_norm_backward(in_dt(a, 1), a.in<void>(0), a.in<void>(1), a.in<void>(2), a.in<float>(3), rows_of(x),
                          x.back(), a.out<void>(0), a.out<void>(1), acc, c.stream);
}
int64_t ws_rms_norm_backward(const Types& in, const Types&, const Attrs&) { return 4 * in[1].shape.back(); }
void run_rope(const KernelArgs& a, const CudaContext& c) {
  const Shape& x = a.in_shape(0);
  const int64_t D = x[3];
  if (D > cuda::kRopeMaxD) user_error("cuda backend: rope: head dim D = ", D, " exceeds ", cuda::kRopeMaxD);
  std::vector<double> inv_freq(D / 2);
  cpu::rope_inv_freq(D, a.attrs->get_float("theta"), rope_scaling(*a.attrs), inv_freq.data());
  cuda::rope_forward(in_dt(a, 0), a.in<void>(0), a.in<int32_t>(1), inv_freq.data(), x[0] * x[1], x[2], D,
                     a.attrs->get_int("inverse", 0) != 0, a.out<void>(0), c.stream);
}
void run_attention(const KernelArgs& a, const CudaContext& c) {
  const cuda::AttentionDims d = attention_dims(a.in_shape(0), a.in_shape(1));
  check_head_dim(d.D, "attention");
  const int32_t* doc = a.inputs.size() == 4 ? a.in<int32_t>(3) : nullptr;
  cuda::attention_forward(in_dt(a, 0), d, a.attrs->get_int("causal") != 0, float(a.attrs->get_float("scale")),
                          a.in<void>(0), a.in<void>(1), a.in<void>(2), doc, a.out<void>(0), a.out<float>(1), c.stream);
}
// attention_backward(dout, q, k, v, out, lse[, doc]) -> (dq, dk, dv)
void run_attention_backward(const KernelArgs& a, const CudaContext& c) {
  const cuda::AttentionDims d = attention_dims(a.in_shape(1), a.in_shape(2));
  check_head_dim(d.D, "attention_backward");
  const int32_t* doc = a.inputs.size() == 7 ? a.in<int32_t>(6) : nullptr;
  cuda::attention_backward(in_dt(a, 1), d, a.attrs->get_int("causal") != 0, float(a.attrs->get_float("scale")),
                           a.in<void>(1), a.in<void>(2), a.in<void>(3), a.in<void>(4), a.in<float>(5), a.in<void>(0),
                           doc, a.out<void>(0), a.out<void>(1), a.out<void>(2), static_cast<float*>(a.workspace),
                           c.stream);
}
int64_t ws_attention_backward(const Types& in, const Types&, const Attrs&) {
  const Shape& q = in[1].shape;
  return 4 * q[0] * q[1] * q[2];  // delta [B, NH, S]
}
void run_cross_entropy(const KernelArgs& a, const CudaContext& c) {
  const Shape& x = a.in_shape(0);
  float* row_loss = static_cast<float*>(a.workspace);
  cuda::cross_entropy_rows(in_dt(a, 0), a.in<void>(0), a.in<int32_t>(1), rows_of(x), x.back(), ignore_index(*a.attrs),
                           a.out<float>(1), row_loss, c.error, c.stream);
  cuda::sum_rows(row_loss, rows_of(x), a.out<float>(0), c.stream);
}
int64_t ws_cross_entropy(const Types& in, const Types&, const Attrs&) { return 4 * rows_of(in[0].shape); }
// cross_entropy_backward(dloss, logits, labels, lse) -> dlogits
void run_cross_entropy_backward(const KernelArgs& a, const CudaContext& c) {
  const Shape& x = a.in_shape(1);
  cuda::cross_entropy_backward_rows(in_dt(a, 1), a.in<void>(1), a.in<int32_t>(2), a.in<float>(3), a.in<float>(0),
                                    rows_of(x), x.back(), ignore_index(*a.attrs), out_dt(a, 0), a.out<void>(0),
                                    c.stream);
}
// linear_cross_entropy(x, W, labels): per chunk of rows, fp32 logits = x_c W^T (cuBLAS,
// fp32 accumulation and result), then the row-wise loss on them.
void run_linear_cross_entropy(const KernelArgs& a, const CudaContext& c) {
  const Shape& w = a.in_shape(1);
  const int64_t T = rows_of(a.in_shape(0)), V = w[0], H = w[1], chunk = lce_chunk(*a.attrs, T, V);
  const Dt dt = in_dt(a, 0);
  float* logits = static_cast<float*>(a.workspace);
  float* row_loss = logits + chunk * V;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t r = std::min(chunk, T - t0);
    gemm(c, dt, Dt::f32, false, true, r, V, H, a.in<char>(0) + t0 * H * cuda::dt_size(dt), a.in<void>(1), logits,
         false, "linear_cross_entropy");
    cuda::cross_entropy_rows(Dt::f32, logits, a.in<int32_t>(2) + t0, r, V, ignore_index(*a.attrs),
                             a.out<float>(1) + t0, row_loss + t0, c.error, c.stream);
  }
  cuda::sum_rows(row_loss, T, a.out<float>(0), c.stream);
}
int64_t ws_linear_cross_entropy(const Types& in, const Types&, const Attrs& attrs) {
  const int64_t T = rows_of(in[0].shape), V = in[1].shape[0];
  return 4 * (lce_chunk(attrs, T, V) * V + T);
}
// linear_cross_entropy_backward(dloss, x, W, labels, lse) -> (dx, dW): per chunk the fp32
// logits again, dz = dloss (softmax - onehot) in the operands' dtype, dx_c = dz W and
// dW += dz^T x_c (accumulated in fp32: in dW itself for f32, in a workspace for bf16).
void run_linear_cross_entropy_backward(const KernelArgs& a, const CudaContext& c) {
  const Shape& w = a.in_shape(2);
  const int64_t T = rows_of(a.in_shape(1)), V = w[0], H = w[1], chunk = lce_chunk(*a.attrs, T, V);
  const Dt dt = in_dt(a, 1);
  const int64_t es = cuda::dt_size(dt);
  char* ws = static_cast<char*>(a.workspace);
  float* logits = reinterpret_cast<float*>(ws);
  void* dz = dt == Dt::f32 ? static_cast<void*>(logits) : static_cast<void*>(ws + aligned256(4 * chunk * V));
  float* dw_acc = dt == Dt::f32 ? a.out<float>(1)
                                : reinterpret_cast<float*>(ws + aligned256(4 * chunk * V) + aligned256(2 * chunk * V));
  if (T == 0) check_cuda(cudaMemsetAsync(dw_acc, 0, size_t(4 * V * H), c.stream), "cudaMemsetAsync",
                         "linear_cross_entropy_backward");
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t r = std::min(chunk, T - t0);
    const void* xc = a.in<char>(1) + t0 * H * es;
    gemm(c, dt, Dt::f32, false, true, r, V, H, xc, a.in<void>(2), logits, false, "linear_cross_entropy_backward");
    cuda::cross_entropy_backward_rows(Dt::f32, logits, a.in<int32_t>(3) + t0, a.in<float>(4) + t0, a.in<float>(0), r,
                                      V, ignore_index(*a.attrs), dt, dz, c.stream);
    gemm(c, dt, dt, false, false, r, H, V, dz, a.in<void>(2), a.out<char>(0) + t0 * H * es, false,
         "linear_cross_entropy_backward");
    gemm(c, dt, Dt::f32, true, false, V, H, r, dz, xc, dw_acc, t0 > 0, "linear_cross_entropy_backward");
  }
  if (dt != Dt::f32) cuda::convert(Dt::f32, dt, dw_acc, V * H, a.out<void>(1), c.stream);
}
int64_t ws_linear_cross_entropy_backward(const Types& in, const Types&, const Attrs& attrs) {
  const int64_t T = rows_of(in[1].shape), V = in[2].shape[0], H = in[2].shape[1], chunk = lce_chunk(attrs, T, V);
  if (in[1].dtype == DType::f32) return 4 * chunk * V;
  return aligned256(4 * chunk * V) + aligned256(2 * chunk * V) + 4 * V * H;
}
void run_count_valid(const KernelArgs& a, const CudaContext& c) {
  cuda::count_valid(a.in<int32_t>(0), a.in_numel(0), ignore_index(*a.attrs), a.out<float>(0), c.stream);
}
void run_reshape(const KernelArgs& a, const CudaContext& c) {
  copy_bytes(a.out<void>(0), a.in<void>(0), a.out_types[0]->bytes(), c, "reshape");
}
void run_transpose(const KernelArgs& a, const CudaContext& c) {
  const Shape& x = a.in_shape(0);
  const auto& perm = a.attrs->get_ints("perm");
  cuda::permute(a.in<void>(0), x.data(), perm.data(), static_cast<int>(x.size()), esize(*a.in_types[0]),
                a.out<void>(0), c.stream);
}
void run_slice(const KernelArgs& a, const CudaContext& c) {
  const int64_t dim = a.attrs->get_int("dim"), start = a.attrs->get_int("start");
  const Shape& x = a.in_shape(0);
  const Slab s = slab_of(x, dim);
  const int64_t count = a.out_shape(0)[dim];
  cuda::copy_slab(a.in<void>(0), s.outer, x[dim], start, s.inner, count, a.out<void>(0), count, 0,
                  esize(*a.in_types[0]), c.stream);
}
void run_slice_backward(const KernelArgs& a, const CudaContext& c) {
  const int64_t dim = a.attrs->get_int("dim"), start = a.attrs->get_int("start");
  const Shape& dy = a.in_shape(0);
  const Slab s = slab_of(dy, dim);
  check_cuda(cudaMemsetAsync(a.out<void>(0), 0, size_t(a.out_types[0]->bytes()), c.stream), "cudaMemsetAsync",
             "slice_backward");
  cuda::copy_slab(a.in<void>(0), s.outer, dy[dim], 0, s.inner, dy[dim], a.out<void>(0), a.out_shape(0)[dim], start,
                  esize(*a.in_types[0]), c.stream);
}
void run_concat(const KernelArgs& a, const CudaContext& c) {
  const int64_t dim = a.attrs->get_int("dim");
  const Shape& y = a.out_shape(0);
  const Slab s = slab_of(y, dim);
  int64_t offset = 0;
  for (size_t i = 0; i < a.inputs.size(); ++i) {
    const int64_t len = a.in_shape(static_cast<int>(i))[dim];
    cuda::copy_slab(a.in<void>(static_cast<int>(i)), s.outer, len, 0, s.inner, len, a.out<void>(0), y[dim], offset,
                    esize(*a.out_types[0]), c.stream);
    offset += len;
  }
}
// The collectives, as collectives.cpp's CPU kernels, with device copies and NCCL calls
// enqueued on the executor's stream.
void run_all_to_all(const KernelArgs& a, const CudaContext& c) {
  NcclCommunicator& comm = nccl_of(a, "all_to_all");
  const int64_t P = a.attrs->get_int("size"), s = a.attrs->get_int("scatter_dim"), g = a.attrs->get_int("gather_dim");
  const int64_t es = esize(*a.in_types[0]), bytes = a.in_types[0]->bytes(), chunk = bytes / P;
  char* send = static_cast<char*>(a.workspace);
  char* recv = send + bytes;
  const Slab xs = slab_of(a.in_shape(0), s);
  const int64_t cnt = xs.len / P;
  for (int64_t p = 0; p < P; ++p)
    cuda::copy_slab(a.in<void>(0), xs.outer, xs.len, p * cnt, xs.inner, cnt, send + p * chunk, cnt, 0, es, c.stream);
  comm.all_to_all_async(send, recv, chunk, c.stream);
  Shape block = a.in_shape(0);
  block[s] = cnt;
  const Slab bs = slab_of(block, g);
  for (int64_t p = 0; p < P; ++p)
    cuda::copy_slab(recv + p * chunk, bs.outer, bs.len, 0, bs.inner, bs.len, a.out<void>(0), bs.len * P, p * bs.len,
                    es, c.stream);
}
int64_t ws_all_to_all(const Types& in, const Types&, const Attrs&) { return 2 * in[0].bytes(); }
void run_all_reduce(const KernelArgs& a, const CudaContext& c) {
  NcclCommunicator& comm = nccl_of(a, "all_reduce");
  copy_bytes(a.out<void>(0), a.in<void>(0), a.out_types[0]->bytes(), c, "all_reduce");
  comm.all_reduce_sum_async(a.out<void>(0), a.out_numel(0), out_dt(a, 0), c.stream);
}
void run_all_gather(const KernelArgs& a, const CudaContext& c) {
  NcclCommunicator& comm = nccl_of(a, "all_gather");
  const int64_t P = a.attrs->get_int("size"), d = a.attrs->get_int("dim"), es = esize(*a.in_types[0]);
  const Slab xs = slab_of(a.in_shape(0), d);
  if (xs.outer == 1) {  // rank p's block is where the rank order puts it
    comm.all_gather_async(a.in<void>(0), a.out<void>(0), a.in_types[0]->bytes(), c.stream);
    return;
  }
  char* recv = static_cast<char*>(a.workspace);
  comm.all_gather_async(a.in<void>(0), recv, a.in_types[0]->bytes(), c.stream);
  for (int64_t p = 0; p < P; ++p)
    cuda::copy_slab(recv + p * a.in_types[0]->bytes(), xs.outer, xs.len, 0, xs.inner, xs.len, a.out<void>(0),
                    xs.len * P, p * xs.len, es, c.stream);
}
int64_t ws_all_gather(const Types& in, const Types&, const Attrs& attrs) {
  return slab_of(in[0].shape, dim_attr(attrs, "dim", in[0])).outer == 1 ? 0 : in[0].bytes() * attrs.get_int("size");
}
void run_reduce_scatter(const KernelArgs& a, const CudaContext& c) {
  NcclCommunicator& comm = nccl_of(a, "reduce_scatter");
  const int64_t P = a.attrs->get_int("size"), d = a.attrs->get_int("dim"), es = esize(*a.in_types[0]);
  const Slab xs = slab_of(a.in_shape(0), d);
  const int64_t cnt = xs.len / P, chunk = a.out_numel(0);
  if (xs.outer == 1) {
    comm.reduce_scatter_sum_async(a.in<void>(0), a.out<void>(0), chunk, in_dt(a, 0), c.stream);
    return;
  }
  char* send = static_cast<char*>(a.workspace);
  for (int64_t p = 0; p < P; ++p)
    cuda::copy_slab(a.in<void>(0), xs.outer, xs.len, p * cnt, xs.inner, cnt, send + p * chunk * es, cnt, 0, es,
                    c.stream);
  comm.reduce_scatter_sum_async(send, a.out<void>(0), chunk, in_dt(a, 0), c.stream);
}
int64_t ws_reduce_scatter(const Types& in, const Types&, const Attrs& attrs) {
  return slab_of(in[0].shape, dim_attr(attrs, "dim", in[0])).outer == 1 ? 0 : in[0].bytes();
}

struct Entry {
  OpKind op;
  CudaOpKernel kernel;
};

// In AUTOSP_OPS order; an op missing here has no CUDA kernel.
const Entry kEntries[] = {
    {OpKind::input, {}},  // bound by the executor
    {OpKind::fill, {run_fill}},
    {OpKind::expand, {run_expand}},
    {OpKind::embedding, {run_embedding}},
    {OpKind::embedding_backward, {run_embedding_backward, ws_embedding_backward}},
    {OpKind::linear, {run_linear}},
    {OpKind::matmul, {run_matmul}},
    {OpKind::add, {run_add}},
    {OpKind::mul, {run_mul}},
    {OpKind::scale, {run_scale}},
    {OpKind::sum, {run_sum}},
    {OpKind::div_scalar, {run_div_scalar}},
    {OpKind::convert, {run_convert}},
    {OpKind::silu, {run_silu}},
    {OpKind::silu_backward, {run_silu_backward}},
    {OpKind::swiglu, {run_swiglu}},
    {OpKind::swiglu_backward, {run_swiglu_backward}},
    {OpKind::rms_norm, {run_rms_norm}},
    {OpKind::rms_norm_backward, {run_rms_norm_backward, ws_rms_norm_backward}},
    {OpKind::rope, {run_rope}},
    {OpKind::attention, {run_attention}},
    {OpKind::attention_backward, {run_attention_backward, ws_attention_backward}},
    {OpKind::cross_entropy, {run_cross_entropy, ws_cross_entropy}},
    {OpKind::cross_entropy_backward, {run_cross_entropy_backward}},
    {OpKind::linear_cross_entropy, {run_linear_cross_entropy, ws_linear_cross_entropy}},
    {OpKind::linear_cross_entropy_backward, {run_linear_cross_entropy_backward, ws_linear_cross_entropy_backward}},
    {OpKind::count_valid, {run_count_valid}},
    {OpKind::reshape, {run_reshape}},
    {OpKind::transpose, {run_transpose}},
    {OpKind::slice, {run_slice}},
    {OpKind::slice_backward, {run_slice_backward}},
    {OpKind::concat, {run_concat}},
    {OpKind::all_to_all, {run_all_to_all, ws_all_to_all}},
    {OpKind::all_reduce, {run_all_reduce}},
    {OpKind::all_gather, {run_all_gather, ws_all_gather}},
    {OpKind::reduce_scatter, {run_reduce_scatter, ws_reduce_scatter}},
};
static_assert(std::size(kEntries) == kNumOps, "every op kind has one entry in the cuda kernel table");

}  // namespace

const CudaOpKernel& cuda_kernel(OpKind op) {
  const Entry& e = kEntries[static_cast<int>(op)];
  AUTOSP_CHECK(e.op == op, "cuda kernel table out of order at ", op_name(op));
  return e.kernel;
}

int64_t cuda_node_workspace_bytes(const Graph& g, const Node& node) {
  const CudaOpKernel& k = cuda_kernel(node.op);
  if (!k.workspace_bytes) return 0;
  Types ins, outs;
  for (ValueId v : node.inputs) ins.push_back(g.type(v));
  for (ValueId v : node.outputs) outs.push_back(g.type(v));
  return k.workspace_bytes(ins, outs, node.attrs);
}

std::vector<OpKind> cuda_missing_kernels() {
  std::vector<OpKind> missing;
  for (const Entry& e : kEntries)
    if (e.op != OpKind::input && !e.kernel.run) missing.push_back(e.op);
  return missing;
}

}  // namespace autosp
