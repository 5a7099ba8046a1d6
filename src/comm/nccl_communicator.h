// Communicator over NCCL, for the cuda backend: collectives on device buffers.
//
// Bootstrap: NCCL needs one ncclUniqueId shared by the group's ranks; rank 0 of the group
// makes it and MPI_Bcast hands it to the others over the group's MPI communicator (so a
// job is started by mpirun as for the CPU backend, one rank per GPU). A group of one needs
// no MPI (NcclCommunicator::single).
//
// Invariants:
//  - Every NCCL and CUDA call is checked; a failure throws NcclError naming the call, the
//    group and NCCL's own string (ncclGetLastError's detail where it has one).
//  - Buffers are device memory of the current CUDA device, which must be the same for the
//    communicator's whole life (cudaSetDevice before constructing it).
//  - The Communicator interface (fp32 / double buffers) is synchronous: each call returns
//    when its collective has finished on this rank. The *_async calls only enqueue on the
//    stream given, in stream order with the kernels around them (the cuda executor's way).
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "comm/communicator.h"
#include "comm/device_collectives.h"
#include "kernels/cuda/kernels.h"

// MPI's C API, as mpi_communicator.h includes it.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

namespace autosp {

struct NcclError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class NcclCommunicator final : public Communicator, public DeviceCollectives {
 public:
  // Collective over the ranks of `mpi_comm` (which is only used to bootstrap; it is not
  // adopted). `name` says which group this is in error messages.
  NcclCommunicator(MPI_Comm mpi_comm, std::string name);
  // A group of this process alone.
  static std::unique_ptr<NcclCommunicator> single(std::string name);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const { return name_; }

  // The Communicator interface, on device buffers, synchronous.
  void all_reduce_sum(float* data, int64_t n) override;
  void all_reduce_sum(double* data, int64_t n) override;
  void all_to_all(const float* send, float* recv, int64_t chunk) override;
  void all_gather(const float* send, float* recv, int64_t n) override;
  void reduce_scatter_sum(const float* send, float* recv, int64_t n) override;
  void broadcast(void* data, int64_t bytes, int root) override;
  void barrier() override;

  // Enqueued on `stream`, for f32 or bf16 elements (dt); byte counts where only bytes move.
  void all_reduce_sum_async(void* data, int64_t n, cuda::Dt dt, cudaStream_t stream) override;
  void all_to_all_async(const void* send, void* recv, int64_t chunk_bytes, cudaStream_t stream) override;
  void all_gather_async(const void* send, void* recv, int64_t bytes, cudaStream_t stream) override;
  void reduce_scatter_sum_async(const void* send, void* recv, int64_t n, cuda::Dt dt, cudaStream_t stream) override;

 private:
  NcclCommunicator(std::string name, int rank, int size, const ncclUniqueId& id);
  void init(const ncclUniqueId& id);
  void check(ncclResult_t rc, const char* call) const;
  void sync(const char* call) const;

  std::string name_;
  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;  // for the synchronous interface
  void* scratch_ = nullptr;        // one float, for barrier()
};

// The device groups the cuda executor runs collectives on, beside the MPI ones: NCCL's
// (make_nccl_groups), or, when ranks share a GPU (NCCL refuses two ranks on one device) or
// AUTOSP_COMM=mpi says so, the staging communicators over the MPI groups
// (comm/cuda_staged_communicator.h), which refer to `mpi_groups` (they must outlive them).
// What is asked: AUTOSP_COMM when set, else mpi_groups.device_comm (the config's comm key);
// "auto" decides from the ranks per node and the devices (device_comm_choice), the same on
// every rank. Collective over the world.
ProcessGroups make_device_groups(const ProcessGroups& mpi_groups);

// NCCL groups beside the MPI ones: world, sp and dp as in `mpi_groups` (whose
// communicators of more than one rank must be MpiCommunicators), each bootstrapped over
// its MPI group; a group of one needs no MPI.
// Collective over the world.
ProcessGroups make_nccl_groups(const ProcessGroups& mpi_groups);

// The CUDA device this rank uses: its node-local rank (OMPI_COMM_WORLD_LOCAL_RANK, or
// MPI's shared-memory split) modulo the devices present; made current here.
int select_local_device();

}  // namespace autosp
