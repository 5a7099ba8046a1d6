// The cuda backend's collectives on host copies of their device buffers, over a host
// Communicator (MPI): what the staging communicator (comm/cuda_staged_communicator.h) runs
// between its copy from the device and its copy back, so that ranks sharing one GPU (which
// NCCL refuses) still run sequence parallelism. Host code only: tested with real MPI
// processes on machines without a GPU (tests/comm/comm_mpi_main.cpp).
//
// The calls and their layouts are the NCCL ones the cuda ops make (NcclCommunicator's
// *_async): dtype f32 or bf16 for reductions, bytes for moves. The Communicator interface
// moves fp32 words, so moves of any byte count go as whole words: each rank's block is padded
// to a multiple of 4 bytes on the way and unpacked after. bf16 reductions add in fp32 (every
// rank's values widened exactly) and round once, to nearest even, as torch's .to(bfloat16).
#pragma once
#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "ir/types.h"

namespace autosp {

class StagedCollectives {
 public:
  explicit StagedCollectives(Communicator& host) : host_(host) {}
  int rank() const { return host_.rank(); }
  int size() const { return host_.size(); }

  // n elements of dtype (f32 or bf16) at data: the sum over the group, in place.
  void all_reduce_sum(void* data, int64_t n, DType dtype);
  // send holds size() blocks of chunk_bytes; block p goes to rank p, recv's block p comes from
  // rank p.
  void all_to_all(const void* send, void* recv, int64_t chunk_bytes);
  // recv (size() x bytes) = every rank's send (bytes), in rank order.
  void all_gather(const void* send, void* recv, int64_t bytes);
  // recv (n elements) = the sum over the group of each rank's block number rank() of send
  // (size() x n elements).
  void reduce_scatter_sum(const void* send, void* recv, int64_t n, DType dtype);

 private:
  Communicator& host_;
  std::vector<float> a_, b_;  // word scratch, kept between calls
};

}  // namespace autosp
