// The cuda backend's collectives for ranks that share one GPU (NCCL refuses two ranks on one
// device): each call copies its device buffer to pinned host memory on the caller's stream,
// waits for the copy, runs the collective on the host over MPI (comm/staged_collectives.h,
// which the CPU tests check with real MPI processes), and copies the result back on the same
// stream. Slower than NCCL (two copies and a host synchronisation per call): for sequence
// parallelism on one GPU, which a single-GPU machine can then test; NCCL stays the production
// path.
//
// Invariants:
//  - Calls are collective over the group, in the same order on every rank (as NCCL's).
//  - A call returns with its copy back enqueued on the stream, not done; the next call first
//    waits for that copy, so its pinned buffers are never rewritten while a copy reads them.
//  - The Communicator interface (fp32 / double device buffers) is synchronous, on a stream of
//    its own.
#pragma once
#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/device_collectives.h"
#include "comm/staged_collectives.h"

namespace autosp {

class StagedDeviceCommunicator final : public Communicator, public DeviceCollectives {
 public:
  // Over `host` (an MPI group, or a group of one), which must outlive this object.
  StagedDeviceCommunicator(Communicator& host, std::string name);
  ~StagedDeviceCommunicator() override;
  StagedDeviceCommunicator(const StagedDeviceCommunicator&) = delete;
  StagedDeviceCommunicator& operator=(const StagedDeviceCommunicator&) = delete;

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }

  void all_reduce_sum_async(void* data, int64_t n, cuda::Dt dt, cudaStream_t stream) override;
  void all_to_all_async(const void* send, void* recv, int64_t chunk_bytes, cudaStream_t stream) override;
  void all_gather_async(const void* send, void* recv, int64_t bytes, cudaStream_t stream) override;
  void reduce_scatter_sum_async(const void* send, void* recv, int64_t n, cuda::Dt dt, cudaStream_t stream) override;

  // The Communicator interface on device buffers, synchronous.
  void all_reduce_sum(float* data, int64_t n) override;
  void all_reduce_sum(double* data, int64_t n) override;
  void all_to_all(const float* send, float* recv, int64_t chunk) override;
  void all_gather(const float* send, float* recv, int64_t n) override;
  void reduce_scatter_sum(const float* send, float* recv, int64_t n) override;
  void broadcast(void* data, int64_t bytes, int root) override;
  void barrier() override { host_.barrier(); }

 private:
  // Waits for the last copy back, then copies `bytes` at device `src` into the send buffer
  // (grown to at least send_bytes) and waits for it; the receive buffer grows to recv_bytes.
  void stage_in(const void* src, int64_t bytes, int64_t send_bytes, int64_t recv_bytes, cudaStream_t stream);
  // Enqueues the copy of `bytes` at host `src` (one of the pinned buffers) to device `dst`.
  void stage_out(void* dst, const char* src, int64_t bytes, cudaStream_t stream);
  void check(cudaError_t rc, const char* call) const;

  Communicator& host_;
  std::string name_;
  StagedCollectives staged_;
  char* send_ = nullptr;  // pinned
  char* recv_ = nullptr;  // pinned
  int64_t send_capacity_ = 0, recv_capacity_ = 0;
  cudaEvent_t copied_back_ = nullptr;
  cudaStream_t stream_ = nullptr;  // the synchronous interface's
};

// Staging communicators over each of `host`'s groups (world, sp, dp), which they refer to.
ProcessGroups make_staged_groups(const ProcessGroups& host);

}  // namespace autosp
