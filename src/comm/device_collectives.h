// What the cuda backend's collective ops call (ops/collectives.cpp): collectives on device
// buffers, enqueued on the executor's stream in order with the kernels around them. Two
// implementations: NCCL (comm/nccl_communicator.h: one GPU per rank, the production path)
// and staging through pinned host memory over MPI (comm/cuda_staged_communicator.h: ranks
// that share a GPU, which NCCL refuses).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/kernels.h"

namespace autosp {

class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  // For f32 or bf16 elements (dt); byte counts where only bytes move. Layouts as the
  // Communicator interface's (comm/communicator.h).
  virtual void all_reduce_sum_async(void* data, int64_t n, cuda::Dt dt, cudaStream_t stream) = 0;
  virtual void all_to_all_async(const void* send, void* recv, int64_t chunk_bytes, cudaStream_t stream) = 0;
  virtual void all_gather_async(const void* send, void* recv, int64_t bytes, cudaStream_t stream) = 0;
  virtual void reduce_scatter_sum_async(const void* send, void* recv, int64_t n, cuda::Dt dt,
                                        cudaStream_t stream) = 0;
};

}  // namespace autosp
