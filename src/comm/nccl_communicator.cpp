#include "comm/nccl_communicator.h"

#include <cstdlib>

#include "comm/cuda_staged_communicator.h"
#include "comm/device_comm.h"
#include "comm/mpi_communicator.h"
#include "util/error.h"

namespace autosp {

namespace {

ncclDataType_t nccl_type(cuda::Dt dt) { return dt == cuda::Dt::bf16 ? ncclBfloat16 : ncclFloat32; }

void check_cuda_call(cudaError_t rc, const char* call, const std::string& group) {
  if (rc != cudaSuccess)
    throw NcclError(str(call, " failed on ", group, ": ", cudaGetErrorString(rc),
                        " (is the CUDA device this rank uses present and healthy? nvidia-smi says)"));
}

}  // namespace

void NcclCommunicator::check(ncclResult_t rc, const char* call) const {
  if (rc == ncclSuccess) return;
  const char* detail = comm_ ? ncclGetLastError(comm_) : nullptr;
  throw NcclError(str(call, " failed on ", name_, " (rank ", rank_, " of ", size_, "): ", ncclGetErrorString(rc),
                      detail && *detail ? str(": ", detail) : std::string(),
                      " (every rank of a group must make the same collective calls with the same sizes, one "
                      "GPU per rank; NCCL_DEBUG=WARN says more)"));
}

NcclCommunicator::NcclCommunicator(std::string name, int rank, int size, const ncclUniqueId& id)
    : name_(std::move(name)), rank_(rank), size_(size) {
  init(id);
}

NcclCommunicator::NcclCommunicator(MPI_Comm mpi_comm, std::string name) : name_(std::move(name)) {
  check_mpi(MPI_Comm_rank(mpi_comm, &rank_), "MPI_Comm_rank", name_);
  check_mpi(MPI_Comm_size(mpi_comm, &size_), "MPI_Comm_size", name_);
  ncclUniqueId id{};
  if (rank_ == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  check_mpi(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi_comm), "MPI_Bcast (the ncclUniqueId)", name_);
  init(id);
}

void NcclCommunicator::init(const ncclUniqueId& id) {
  check(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
  check_cuda_call(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", name_);
  check_cuda_call(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc", name_);
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::single(std::string name) {
  ncclUniqueId id;
  ncclResult_t rc = ncclGetUniqueId(&id);
  if (rc != ncclSuccess) throw NcclError(str("ncclGetUniqueId failed on ", name, ": ", ncclGetErrorString(rc)));
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(std::move(name), 0, 1, id));
}

NcclCommunicator::~NcclCommunicator() {
  // Destructors cannot throw; a failure to free here has nothing left to act on.
  if (comm_) ncclCommDestroy(comm_);
  if (stream_) cudaStreamDestroy(stream_);
  if (scratch_) cudaFree(scratch_);
}

void NcclCommunicator::sync(const char* call) const {
  check_cuda_call(cudaStreamSynchronize(stream_), call, name_);
}

void NcclCommunicator::all_reduce_sum(float* data, int64_t n) {
  check(ncclAllReduce(data, data, size_t(n), ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
  sync("ncclAllReduce (cudaStreamSynchronize)");
}

void NcclCommunicator::all_reduce_sum(double* data, int64_t n) {
  check(ncclAllReduce(data, data, size_t(n), ncclFloat64, ncclSum, comm_, stream_), "ncclAllReduce");
  sync("ncclAllReduce (cudaStreamSynchronize)");
}

void NcclCommunicator::all_to_all(const float* send, float* recv, int64_t chunk) {
  all_to_all_async(send, recv, chunk * int64_t(sizeof(float)), stream_);
  sync("all_to_all (cudaStreamSynchronize)");
}

void NcclCommunicator::all_gather(const float* send, float* recv, int64_t n) {
  all_gather_async(send, recv, n * int64_t(sizeof(float)), stream_);
  sync("ncclAllGather (cudaStreamSynchronize)");
}

void NcclCommunicator::reduce_scatter_sum(const float* send, float* recv, int64_t n) {
  reduce_scatter_sum_async(send, recv, n, cuda::Dt::f32, stream_);
  sync("ncclReduceScatter (cudaStreamSynchronize)");
}

void NcclCommunicator::broadcast(void* data, int64_t bytes, int root) {
  check(ncclBroadcast(data, data, size_t(bytes), ncclInt8, root, comm_, stream_), "ncclBroadcast");
  sync("ncclBroadcast (cudaStreamSynchronize)");
}

void NcclCommunicator::barrier() {
  check(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce (barrier)");
  sync("barrier (cudaStreamSynchronize)");
}

void NcclCommunicator::all_reduce_sum_async(void* data, int64_t n, cuda::Dt dt, cudaStream_t stream) {
  check(ncclAllReduce(data, data, size_t(n), nccl_type(dt), ncclSum, comm_, stream), "ncclAllReduce");
}

void NcclCommunicator::all_to_all_async(const void* send, void* recv, int64_t chunk_bytes, cudaStream_t stream) {
  check(ncclGroupStart(), "ncclGroupStart");
  for (int p = 0; p < size_; ++p) {
    check(ncclSend(static_cast<const char*>(send) + p * chunk_bytes, size_t(chunk_bytes), ncclInt8, p, comm_, stream),
          "ncclSend");
    check(ncclRecv(static_cast<char*>(recv) + p * chunk_bytes, size_t(chunk_bytes), ncclInt8, p, comm_, stream),
          "ncclRecv");
  }
  check(ncclGroupEnd(), "ncclGroupEnd (all_to_all)");
}

void NcclCommunicator::all_gather_async(const void* send, void* recv, int64_t bytes, cudaStream_t stream) {
  check(ncclAllGather(send, recv, size_t(bytes), ncclInt8, comm_, stream), "ncclAllGather");
}

void NcclCommunicator::reduce_scatter_sum_async(const void* send, void* recv, int64_t n, cuda::Dt dt,
                                                cudaStream_t stream) {
  check(ncclReduceScatter(send, recv, size_t(n), nccl_type(dt), ncclSum, comm_, stream), "ncclReduceScatter");
}

namespace {

std::unique_ptr<Communicator> nccl_over(const Communicator* group, const std::string& what) {
  AUTOSP_CHECK(group, "make_nccl_groups: no ", what, " group");
  if (group->size() == 1) return NcclCommunicator::single("nccl " + what + " group of one");
  const auto* mpi = dynamic_cast<const MpiCommunicator*>(group);
  AUTOSP_CHECK(mpi, "make_nccl_groups: the ", what, " group (", group->size(), " ranks) is not an MpiCommunicator");
  return std::make_unique<NcclCommunicator>(mpi->comm(), "nccl " + mpi->name());
}

}  // namespace

ProcessGroups make_nccl_groups(const ProcessGroups& mpi_groups) {
  ProcessGroups g;
  g.sp_size = mpi_groups.sp_size;
  g.dp_size = mpi_groups.dp_size;
  g.sp_rank = mpi_groups.sp_rank;
  g.dp_rank = mpi_groups.dp_rank;
  g.world = nccl_over(mpi_groups.world.get(), "world");
  g.sp = nccl_over(mpi_groups.sp.get(), "sp");
  g.dp = nccl_over(mpi_groups.dp.get(), "dp");
  return g;
}

ProcessGroups make_device_groups(const ProcessGroups& mpi_groups) {
  // Whether any node runs more ranks than it has devices, the same answer on every rank.
  bool shared = false;
  if (mpi_groups.world->size() > 1) {
    const auto* mpi = dynamic_cast<const MpiCommunicator*>(mpi_groups.world.get());
    AUTOSP_CHECK(mpi, "make_device_groups: the world (", mpi_groups.world->size(), " ranks) is not an MpiCommunicator");
    MPI_Comm node = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split_type(mpi->comm(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type",
              mpi->name());
    int local = 1;
    check_mpi(MPI_Comm_size(node, &local), "MPI_Comm_size", "this node's ranks");
    check_mpi(MPI_Comm_free(&node), "MPI_Comm_free", "this node's ranks");
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
    double over = local > devices ? 1.0 : 0.0;
    mpi_groups.world->all_reduce_sum(&over, 1);
    shared = over > 0;
  }
  const char* env = std::getenv("AUTOSP_COMM");
  const std::string asked = env && *env ? env : mpi_groups.device_comm;
  return device_comm_choice(asked, shared) == DeviceComm::staged ? make_staged_groups(mpi_groups)
                                                                 : make_nccl_groups(mpi_groups);
}

int select_local_device() {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess || count == 0)
    user_error("cuda backend: no CUDA device (cudaGetDeviceCount: ",
               rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices",
               "); run on a machine with an NVIDIA GPU and its driver, or use --backend cpu");
  int local = 0;
  if (const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) local = std::atoi(v);
  else if (const char* w = std::getenv("MPI_LOCALRANKID")) local = std::atoi(w);
  else if (const char* s = std::getenv("SLURM_LOCALID")) local = std::atoi(s);
  const int device = local % count;
  check_cuda_call(cudaSetDevice(device), "cudaSetDevice", str("device ", device));
  return device;
}

}  // namespace autosp
