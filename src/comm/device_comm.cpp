#include "comm/device_comm.h"

#include "util/error.h"

namespace autosp {

DeviceComm device_comm_choice(const std::string& autosp_comm, bool ranks_share_a_device) {
  if (autosp_comm == "nccl") return DeviceComm::nccl;
  if (autosp_comm == "mpi") return DeviceComm::staged;
  if (autosp_comm.empty() || autosp_comm == "auto")
    return ranks_share_a_device ? DeviceComm::staged : DeviceComm::nccl;
  user_error("comm (AUTOSP_COMM, or the config's comm key) \"", autosp_comm, "\": expected nccl (one GPU per rank), mpi (collectives staged through "
             "host memory over MPI, for ranks that share a GPU) or auto (mpi when ranks share a GPU, else nccl)");
}

const char* device_comm_name(DeviceComm comm) {
  return comm == DeviceComm::nccl ? "nccl" : "mpi (staged through host memory)";
}

}  // namespace autosp
