#include "ops/cuda_kernels.h"

#include <climits>

#include "comm/nccl_communicator.h"
#include "runtime/cuda_blas.h"

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
  throw CudaError(str("cuda backend: ", call, " failed in ", where, ": ", cublas().status_name(rc), " (",
                      cublas().status_string(rc), ")"));
}

cuda::Dt cuda_dt(const TensorType& t) {
  AUTOSP_CHECK(t.dtype == DType::f32 || t.dtype == DType::bf16, "cuda kernel given ", type_str(t));
  return t.dtype == DType::bf16 ? cuda::Dt::bf16 : cuda::Dt::f32;
}

namespace {
cudaDataType_t cublas_type(cuda::Dt dt) { return dt == cuda::Dt::bf16 ? CUDA_R_16BF : CUDA_R_32F; }
}  // namespace

// Row-major C is column-major C^T = op(B)^T op(A)^T, so cuBLAS is called with the operands
// swapped and each one's row-major leading dimension.
void cuda_gemm(const CudaContext& c, cuda::Dt ab_dt, cuda::Dt c_dt, bool ta, bool tb, int64_t M, int64_t N,
               int64_t K, float alpha, const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C,
               int64_t ldc, const char* op) {
  if (M == 0 || N == 0) return;
  for (int64_t x : {M, N, K, lda, ldb, ldc})
    if (x > INT_MAX)
      user_error("cuda backend: ", op, ": a matmul of ", M, " x ", N, " x ", K, " exceeds cuBLAS's int dimensions");
  check_cublas(cublas().gemm_ex(c.cublas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                            static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, B,
                            cublas_type(ab_dt), static_cast<int>(ldb), A, cublas_type(ab_dt), static_cast<int>(lda),
                            &beta, C, cublas_type(c_dt), static_cast<int>(ldc), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx", op);
}

void cuda_gemm(const CudaContext& c, cuda::Dt ab_dt, cuda::Dt c_dt, bool ta, bool tb, int64_t M, int64_t N,
               int64_t K, const void* A, const void* B, void* C, bool accumulate, const char* op) {
  cuda_gemm(c, ab_dt, c_dt, ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, accumulate ? 1.0f : 0.0f, C, N, op);
}

void cuda_copy_bytes(void* dst, const void* src, int64_t bytes, const CudaContext& c, const char* op) {
  if (dst == src || bytes == 0) return;
  check_cuda(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToDevice, c.stream), "cudaMemcpyAsync", op);
}

DeviceCollectives& cuda_collectives(const KernelArgs& a, const char* op) {
  auto* d = dynamic_cast<DeviceCollectives*>(a.comm);
  if (!d)
    user_error("cuda backend: ", op, " on group '", a.attrs->get_str("group"),
               "' needs a device communicator (NCCL or staged: comm/nccl_communicator.h, make_device_groups)");
  return *d;
}

}  // namespace autosp
