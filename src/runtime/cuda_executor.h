// Runs a graph on one CUDA device, node by node in graph order on one stream, as the
// CpuExecutor does on the host (runtime/executor.h), with the kernels of the cuda backend
// (ops/cuda_kernels.h).
//
// Memory: the graph as lowered for cuda and planned (executable_graph: the compile's own plan
// when it compiled for cuda, with the CUDA kernels' workspaces and in-place rules), and the
// executor makes ONE cudaMalloc of that arena when it is made; every result and workspace lives at its planned offset. Graph
// inputs live in a second device block (their staging area, sized by the inputs' types):
// bind() gives host memory, copied in at the start of every run(); bind_device() gives
// device memory, used where it is. After run() every graph output is copied back to host
// memory (output_data), so the executor is a drop-in for the CPU one; output_device() reads
// it where it is.
//
// Refused at construction, with the op named: an op without a CUDA kernel (by lower), a collective
// whose group has no device communicator (MPI groups given are turned into NCCL ones here, or
// staging ones where ranks share a GPU: make_device_groups, collectively over the world), and
// no CUDA device at all.
//
// Data errors the kernels find (a token id or a label out of range) are reported by run()
// as a UserError after the step, not at the element (kernels/cuda/kernels.h).
//
// AUTOSP_PROFILE=1 (runtime/profile.h) when the executor is made: each run records a CUDA
// event on the stream before and after each node's kernels (two per node, from a pool made on
// first use and reused: one set per run between two check_errors, e.g. a step's micro
// batches), and check_errors, which the caller calls once the stream has passed the runs,
// adds each node's device time between its events into the process-wide Profile, in the CPU
// executor's rows (phase, op, kernel, FLOPs). A node's time is its stream's: its kernels, and
// any wait for the host to launch them. Off, a run pays a pointer test before and after each
// node.
//
// Overlap (plan_memory's async_wait, compile.overlap): the executor then has a second stream
// for communication, and every collective's communication runs there in graph order (so each
// communicator sees one stream's order on every rank): an overlapped all-to-all packs its
// operand on the compute stream, exchanges and unpacks on the communication stream, and the
// compute stream waits for it only before node async_wait; any other collective runs whole on
// the communication stream and is waited for at once. Under AUTOSP_PROFILE the
// overlapped exchanges' device time, and the compute stream's wait for them, go into the
// profile's overlap line (Profile::add_overlap), as the CPU executor's do.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "ops/cuda_kernels.h"
#include "runtime/executor.h"
#include "runtime/profile.h"

namespace autosp {

// Devices present, 0 when there is no device or no driver; `why` gets CUDA's reason.
int cuda_device_count(std::string* why = nullptr);

class CudaExecutor final : public Executor {
 public:
  // groups: the communicators collectives run on (NcclCommunicators, or MPI ones to make
  // NCCL groups from); none: a graph without collectives.
  // arena_of: share that executor's device arena (make_executor).
  // device_bound: inputs (by name) the caller will only ever bind_device(); they get no room
  // in the inputs' block (a device-resident model's parameters and batch).
  explicit CudaExecutor(const Graph& graph, const ProcessGroups* groups = nullptr,
                        const CudaExecutor* arena_of = nullptr, const std::vector<std::string>& device_bound = {});
  ~CudaExecutor() override;
  CudaExecutor(const CudaExecutor&) = delete;
  CudaExecutor& operator=(const CudaExecutor&) = delete;

  void bind(ValueId input, const void* host_data) override;
  using Executor::bind;
  void bind_device(ValueId input, const void* device_data);
  // run_async() + a synchronisation of the stream + check_errors().
  void run() override;
  // Enqueues the run on stream() and returns without waiting: the inputs' copies, the
  // nodes, and (unless set_copy_outputs(false)) the outputs' copies to host memory, which
  // are only valid once the stream has reached them. Data errors the kernels find are
  // reported by check_errors(), after the caller has synchronised the stream: every run
  // since the last check_errors() is covered (the device flag is cleared only by the first
  // run after a check). Host memory bound with bind() must stay unchanged until the stream
  // has copied it.
  void run_async();
  // After the stream has reached the end of the last run_async(): a UserError for a data
  // error any run since the previous check found.
  void check_errors();
  const void* output_data(const std::string& name) const override;
  const void* output_device(const std::string& name) const;
  // false: run() leaves the outputs on the device (output_device; output_data is refused),
  // for a training loop that keeps gradients there.
  void set_copy_outputs(bool copy) { copy_outputs_ = copy; }
  const Graph& graph() const override { return graph_; }
  int64_t arena_bytes() const override { return arena_bytes_; }
  int64_t input_bytes() const { return input_bytes_; }
  cudaStream_t stream() const { return ctx_.stream; }
  int device() const { return device_; }
  // The kernels' data-error flag (a device int, kernels/cuda/kernels.h ErrorCode): sticky until
  // check_errors, so a kernel enqueued after a run can read it.
  const int* error_flag() const { return ctx_.error; }
  // The groups collectives run on (their communicators are DeviceCollectives), or null.
  const ProcessGroups* device_groups() const { return groups_; }

 private:
  // AUTOSP_PROFILE: the events of one run (node n: 2n before its kernels, 2n + 1 after) and
  // the nodes that launched (not inputs and views).
  struct ProfileRun {
    std::vector<cudaEvent_t> events;
    std::vector<char> timed;
    // Overlapped exchanges (profiled): ready (compute, after the pack), done (communication),
    // and the compute stream around its wait for done; `exchanges` of them this run.
    std::vector<std::array<cudaEvent_t, 4>> overlap;
    size_t exchanges = 0;
  };
  static constexpr size_t kMaxProfileRuns = 64;  // runs without check_errors before a forced read
  ProfileRun& next_profile_run();
  void add_profile();  // the pending runs' node times (the stream has passed them) into the profile

  Graph graph_;  // lowered for cuda and memory-planned (executable_graph)
  const ProcessGroups* groups_;
  ProcessGroups device_groups_;  // made here from MPI groups (make_device_groups)
  int device_ = 0;
  CudaContext ctx_;
  std::vector<int64_t> offsets_, workspace_offsets_;
  std::vector<int64_t> input_offsets_;    // per value: offset in the input block, or -1
  std::vector<const void*> host_input_;   // per value: bound host memory
  std::vector<const void*> device_input_; // per value: bound device memory
  std::vector<void*> data_;               // per value: its device buffer this run
  std::vector<std::vector<char>> host_outputs_;  // per graph output, after run()
  char* arena_ = nullptr;
  bool owns_arena_ = true;  // false: another executor's (arena_of)
  char* inputs_ = nullptr;
  int* error_host_ = nullptr;   // pinned: the device error flag as the last run copied it
  bool errors_checked_ = true;  // the next run clears the device flag
  int64_t arena_bytes_ = 0, input_bytes_ = 0;
  bool copy_outputs_ = true;
  // Overlap: the communication stream's context (its stream; the compute one's cuBLAS and
  // error flag), and a pool of untimed (ready, done) event pairs reused every run.
  bool overlap_ = false;
  CudaContext comm_;
  std::vector<std::array<cudaEvent_t, 2>> comm_events_;
  std::unique_ptr<NodeProfiler> profiler_;  // AUTOSP_PROFILE only, as the events
  std::vector<ProfileRun> profile_runs_;    // reused; the first profile_pending_ await check_errors
  size_t profile_pending_ = 0;
};

std::unique_ptr<Executor> make_cuda_executor(const Graph& graph, const ProcessGroups* groups,
                                             const Executor* arena_of = nullptr);

}  // namespace autosp
