// The cuda backend's kernel per op: a table indexed by OpKind (static_assert on the count),
// kept beside the op definitions rather than inside them so that src/ops/<op>.cpp stay the
// CPU backend's and shared rules' alone. Shape, cost, gradient and sharding logic is the
// op definitions'; an entry here only runs a node on the device (kernels/cuda/kernels.h,
// cuBLAS for the matmuls, NCCL for the collectives).
//
// An entry with run == nullptr is an op without a CUDA kernel: the cuda executor refuses a
// graph that has one, naming it (cuda_missing_kernels lists them).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "ops/op.h"

namespace autosp {

// What a CUDA kernel runs with: the executor's stream and cuBLAS handle (bound to that
// stream), and a device int for data errors (kernels/cuda/kernels.h, ErrorCode).
struct CudaContext {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  int* error = nullptr;
};

struct CudaOpKernel {
  // args' buffers are device pointers; args.workspace holds workspace_bytes(...) bytes.
  void (*run)(const KernelArgs& args, const CudaContext& ctx) = nullptr;
  int64_t (*workspace_bytes)(const Types& inputs, const Types& outputs, const Attrs& attrs) = nullptr;
};

const CudaOpKernel& cuda_kernel(OpKind op);
// Device scratch the node's CUDA kernel needs (0 for none).
int64_t cuda_node_workspace_bytes(const Graph& graph, const Node& node);
// The ops without a CUDA kernel (empty when every op has one).
std::vector<OpKind> cuda_missing_kernels();

// A failed CUDA or cuBLAS call: the device, its driver or its memory failed, or a kernel
// faulted. Neither the user's input nor (necessarily) an autosp bug, as MpiError.
struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Checked calls: a failure throws CudaError naming the call, where it was made and CUDA's
// (cuBLAS's) own string.
void check_cuda(cudaError_t rc, const char* call, const std::string& where);
void check_cublas(cublasStatus_t rc, const char* call, const std::string& where);

}  // namespace autosp
