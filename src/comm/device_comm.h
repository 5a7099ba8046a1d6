// Which communicator the cuda backend's collectives run on (comm/nccl_communicator.h,
// make_device_groups): NCCL, one GPU per rank, or staging through pinned host memory over MPI
// (comm/cuda_staged_communicator.h), for ranks that share a GPU, which NCCL refuses.
// Host code only, tested without a GPU.
#pragma once
#include <string>

namespace autosp {

enum class DeviceComm { nccl, staged };

// What was asked (AUTOSP_COMM, else the config's comm key): "nccl" or "mpi" force one; "" or
// "auto" take staging when `ranks_share_a_device` (some node of the job runs more ranks than
// it has GPUs), else NCCL. Anything else is a UserError naming the values it takes.
DeviceComm device_comm_choice(const std::string& autosp_comm, bool ranks_share_a_device);

const char* device_comm_name(DeviceComm comm);

}  // namespace autosp
