// What the ops' CUDA kernels (OpDef::cuda, in each src/ops/<op>.cpp, built with the cuda
// backend only) share: the context they run with, checked CUDA and cuBLAS calls, the dtype
// of an operand as the device kernels name it, the one cuBLAS gemm every matmul is, device
// copies, and the NCCL communicator of a collective. Shape, cost, gradient and sharding logic
// is the op definitions'; a CUDA kernel only runs a node on the device (kernels/cuda/kernels.h,
// cuBLAS for the matmuls, NCCL for the collectives).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/kernels.h"
#include "ops/op.h"

namespace autosp {

class DeviceCollectives;

// What a CUDA kernel runs with: the executor's stream and cuBLAS handle (bound to that
// stream), and a device int for data errors (kernels/cuda/kernels.h, ErrorCode).
struct CudaContext {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  int* error = nullptr;
};

// A failed CUDA or cuBLAS call: the device, its driver or its memory failed, or a kernel
// faulted. Neither the user's input nor (necessarily) an autosp bug, as MpiError.
struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Checked calls: a failure throws CudaError naming the call, where it was made and CUDA's
// (cuBLAS's) own string.
void check_cuda(cudaError_t rc, const char* call, const std::string& where);
void check_cublas(cublasStatus_t rc, const char* call, const std::string& where);

// The device kernels' name for a floating operand's dtype (InternalError for another).
cuda::Dt cuda_dt(const TensorType& t);
inline cuda::Dt cuda_in_dt(const KernelArgs& a, int i) { return cuda_dt(*a.in_types.at(i)); }
inline cuda::Dt cuda_out_dt(const KernelArgs& a, int i) { return cuda_dt(*a.out_types.at(i)); }

// C[M, N] (of c_dt) = op(A) op(B) (+ C when accumulate), row-major, A and B of ab_dt, fp32
// accumulation (cublasGemmEx). `op` names the caller in errors.
void cuda_gemm(const CudaContext& c, cuda::Dt ab_dt, cuda::Dt c_dt, bool ta, bool tb, int64_t M, int64_t N,
               int64_t K, const void* A, const void* B, void* C, bool accumulate, const char* op);
// The general form: C = alpha op(A) op(B) + beta C, each operand a row-major matrix whose
// rows lie ld elements apart (the row length as stored, so the transposed operand's ld counts
// its stored rows' length), e.g. one head's rows inside [S, NH, D] with ld = NH * D.
void cuda_gemm(const CudaContext& c, cuda::Dt ab_dt, cuda::Dt c_dt, bool ta, bool tb, int64_t M, int64_t N,
               int64_t K, float alpha, const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C,
               int64_t ldc, const char* op);
// A device-to-device copy on the context's stream (nothing when dst == src).
void cuda_copy_bytes(void* dst, const void* src, int64_t bytes, const CudaContext& c, const char* op);
// The device communicator of a collective's group (NCCL or staged; UserError when it is
// another kind).
DeviceCollectives& cuda_collectives(const KernelArgs& a, const char* op);

}  // namespace autosp
