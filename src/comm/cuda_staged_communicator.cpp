#include "comm/cuda_staged_communicator.h"

#include <algorithm>

#include "util/error.h"

namespace autosp {

namespace {

DType host_dtype(cuda::Dt dt) { return dt == cuda::Dt::bf16 ? DType::bf16 : DType::f32; }

// Pinned host memory of at least `bytes` in *p (capacity *cap), kept when large enough.
void reserve_pinned(char** p, int64_t* cap, int64_t bytes, const std::string& name) {
  if (bytes <= *cap) return;
  if (*p) cudaFreeHost(*p);
  *p = nullptr;
  *cap = 0;
  const cudaError_t rc = cudaMallocHost(reinterpret_cast<void**>(p), size_t(bytes));
  if (rc != cudaSuccess)
    throw std::runtime_error(str("cudaMallocHost of ", bytes, " bytes for ", name, "'s staging failed: ",
                                 cudaGetErrorString(rc)));
  *cap = bytes;
}

}  // namespace

StagedDeviceCommunicator::StagedDeviceCommunicator(Communicator& host, std::string name)
    : host_(host), name_(std::move(name)), staged_(host) {
  check(cudaEventCreateWithFlags(&copied_back_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
}

StagedDeviceCommunicator::~StagedDeviceCommunicator() {
  // Destructors cannot throw: failures here have nothing left to act on.
  if (copied_back_) cudaEventSynchronize(copied_back_);
  if (send_) cudaFreeHost(send_);
  if (recv_) cudaFreeHost(recv_);
  if (copied_back_) cudaEventDestroy(copied_back_);
  if (stream_) cudaStreamDestroy(stream_);
}

void StagedDeviceCommunicator::check(cudaError_t rc, const char* call) const {
  if (rc != cudaSuccess)
    throw std::runtime_error(str(call, " failed in the staged collectives of ", name_, ": ", cudaGetErrorString(rc)));
}

void StagedDeviceCommunicator::stage_in(const void* src, int64_t bytes, int64_t send_bytes, int64_t recv_bytes,
                                        cudaStream_t stream) {
  check(cudaEventSynchronize(copied_back_), "cudaEventSynchronize (the last copy back)");
  reserve_pinned(&send_, &send_capacity_, std::max<int64_t>(send_bytes, 1), name_);
  reserve_pinned(&recv_, &recv_capacity_, std::max<int64_t>(recv_bytes, 1), name_);
  if (bytes > 0) check(cudaMemcpyAsync(send_, src, size_t(bytes), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  // The kernels before the collective, and the copy, have run: the host may read send_.
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (the copy to the host)");
}

void StagedDeviceCommunicator::stage_out(void* dst, const char* src, int64_t bytes, cudaStream_t stream) {
  if (bytes > 0) check(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
  check(cudaEventRecord(copied_back_, stream), "cudaEventRecord");
}

void StagedDeviceCommunicator::all_reduce_sum_async(void* data, int64_t n, cuda::Dt dt, cudaStream_t stream) {
  const int64_t bytes = n * cuda::dt_size(dt);
  stage_in(data, bytes, bytes, 0, stream);
  staged_.all_reduce_sum(send_, n, host_dtype(dt));
  stage_out(data, send_, bytes, stream);
}

void StagedDeviceCommunicator::all_to_all_async(const void* send, void* recv, int64_t chunk_bytes,
                                                cudaStream_t stream) {
  const int64_t bytes = chunk_bytes * size();
  stage_in(send, bytes, bytes, bytes, stream);
  staged_.all_to_all(send_, recv_, chunk_bytes);
  stage_out(recv, recv_, bytes, stream);
}

void StagedDeviceCommunicator::all_gather_async(const void* send, void* recv, int64_t bytes, cudaStream_t stream) {
  stage_in(send, bytes, bytes, bytes * size(), stream);
  staged_.all_gather(send_, recv_, bytes);
  stage_out(recv, recv_, bytes * size(), stream);
}

void StagedDeviceCommunicator::reduce_scatter_sum_async(const void* send, void* recv, int64_t n, cuda::Dt dt,
                                                        cudaStream_t stream) {
  const int64_t bytes = n * cuda::dt_size(dt);
  stage_in(send, bytes * size(), bytes * size(), bytes, stream);
  staged_.reduce_scatter_sum(send_, recv_, n, host_dtype(dt));
  stage_out(recv, recv_, bytes, stream);
}

void StagedDeviceCommunicator::all_reduce_sum(float* data, int64_t n) {
  all_reduce_sum_async(data, n, cuda::Dt::f32, stream_);
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void StagedDeviceCommunicator::all_reduce_sum(double* data, int64_t n) {
  stage_in(data, 8 * n, 8 * n, 0, stream_);
  host_.all_reduce_sum(reinterpret_cast<double*>(send_), n);
  stage_out(data, send_, 8 * n, stream_);
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void StagedDeviceCommunicator::all_to_all(const float* send, float* recv, int64_t chunk) {
  all_to_all_async(send, recv, 4 * chunk, stream_);
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void StagedDeviceCommunicator::all_gather(const float* send, float* recv, int64_t n) {
  all_gather_async(send, recv, 4 * n, stream_);
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void StagedDeviceCommunicator::reduce_scatter_sum(const float* send, float* recv, int64_t n) {
  reduce_scatter_sum_async(send, recv, n, cuda::Dt::f32, stream_);
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void StagedDeviceCommunicator::broadcast(void* data, int64_t bytes, int root) {
  stage_in(data, bytes, bytes, 0, stream_);
  host_.broadcast(send_, bytes, root);
  stage_out(data, send_, bytes, stream_);
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

ProcessGroups make_staged_groups(const ProcessGroups& host) {
  ProcessGroups g;
  g.sp_size = host.sp_size;
  g.dp_size = host.dp_size;
  g.sp_rank = host.sp_rank;
  g.dp_rank = host.dp_rank;
  g.world = std::make_unique<StagedDeviceCommunicator>(*host.world, "staged world");
  g.sp = std::make_unique<StagedDeviceCommunicator>(*host.sp, "staged sp group");
  g.dp = std::make_unique<StagedDeviceCommunicator>(*host.dp, "staged dp group");
  return g;
}

}  // namespace autosp
