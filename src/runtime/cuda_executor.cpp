#include "runtime/cuda_executor.h"

#include <algorithm>

#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/kernels.h"
#include "passes/lower.h"
#include "passes/plan_memory.h"
#include "runtime/cuda_blas.h"
#include "runtime/node_loop.h"
#include "util/error.h"

namespace autosp {

namespace {

int64_t aligned(int64_t bytes) { return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

bool has_collectives(const Graph& g) {
  for (const Node& node : g.nodes())
    if (node.attrs.has("group")) return true;
  return false;
}

}  // namespace

int cuda_device_count(std::string* why) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    if (why) *why = str(cudaGetErrorName(rc), ": ", cudaGetErrorString(rc));
    cudaGetLastError();  // clear it: later calls should not see this one
    return 0;
  }
  if (count == 0 && why) *why = "no CUDA devices";
  return count;
}

CudaExecutor::CudaExecutor(const Graph& graph, const ProcessGroups* groups, const CudaExecutor* arena_of,
                           const std::vector<std::string>& device_bound)
    : graph_(executable_graph(graph, Backend::cuda, 1)),
      groups_(groups),
      input_offsets_(graph.values().size(), -1),
      host_input_(graph.values().size(), nullptr),
      device_input_(graph.values().size(), nullptr),
      data_(graph.values().size(), nullptr) {
  std::string why;
  if (cuda_device_count(&why) == 0)
    user_error("backend cuda: no CUDA device is usable here (", why,
               "); run on a machine with an NVIDIA GPU and its driver, or use --backend cpu");
  device_ = select_local_device();

  for (NodeId n = 0; n < static_cast<NodeId>(graph_.nodes().size()); ++n) {
    const Node& node = graph_.node(n);
    AUTOSP_CHECK(node.op == OpKind::input || op_def(node.op).cuda.run, op_name(node.op), " is lowered for cuda ("
                 , lowered_binding(node).kernel, ") but this build has no CUDA kernel for it");
  }
  // Device groups for the graph's collectives, and for a caller's own across several ranks
  // (the device-resident step's gradient reduction): NCCL, or staged over MPI where ranks
  // share a GPU (make_device_groups).
  if (has_collectives(graph_)) AUTOSP_CHECK(groups_, "the graph has collectives but the executor has no communicators");
  if (groups_ && (has_collectives(graph_) || groups_->world->size() > 1) &&
      !dynamic_cast<DeviceCollectives*>(groups_->world.get())) {
    device_groups_ = make_device_groups(*groups_);
    groups_ = &device_groups_;
  }
  if (has_collectives(graph_)) check_collective_groups(graph_, groups_);

  // The plan of the graph as lowered for cuda (the compile's own when it was for cuda).
  const MemoryPlan plan = read_memory_plan(graph_);
  offsets_ = plan.offsets;
  workspace_offsets_ = plan.workspace_offsets;
  arena_bytes_ = plan.arena_bytes;  // cuda_arena_bytes(graph): what `autosp plan --backend cuda` plans
  for (ValueId v : graph_.inputs()) {
    if (std::find(device_bound.begin(), device_bound.end(), graph_.value(v).name) != device_bound.end()) continue;
    input_offsets_[v] = input_bytes_;
    input_bytes_ += aligned(graph_.type(v).bytes());
  }
  const int64_t error_offset = input_bytes_;
  input_bytes_ += kArenaAlignment;  // the kernels' error flag

  check_cuda(cudaStreamCreateWithFlags(&ctx_.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags",
             "the cuda executor");
  check_cublas(cublas().create(&ctx_.cublas), "cublasCreate", "the cuda executor");
  check_cublas(cublas().set_stream(ctx_.cublas, ctx_.stream), "cublasSetStream", "the cuda executor");
  if (arena_of) {
    AUTOSP_CHECK(arena_of->arena_bytes_ >= arena_bytes_, "a shared device arena of ", arena_of->arena_bytes_,
                 " bytes for a plan of ", arena_bytes_);
    arena_ = arena_of->arena_;
    owns_arena_ = false;
  } else if (arena_bytes_ > 0) {
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&arena_), size_t(arena_bytes_)), "cudaMalloc",
               str("the step's arena (", arena_bytes_, " bytes, plan_memory's peak)"));
  }
  check_cuda(cudaMalloc(reinterpret_cast<void**>(&inputs_), size_t(input_bytes_)), "cudaMalloc",
             str("the graph inputs (", input_bytes_, " bytes)"));
  ctx_.error = reinterpret_cast<int*>(inputs_ + error_offset);
  check_cuda(cudaMallocHost(reinterpret_cast<void**>(&error_host_), sizeof(int)), "cudaMallocHost",
             "the cuda executor's error flag");
  *error_host_ = 0;
  host_outputs_.resize(graph_.outputs().size());  // sized by the first run that copies them
  if (profile_enabled()) profiler_ = std::make_unique<NodeProfiler>(graph_, 1, global_profile());
  for (const Node& node : graph_.nodes()) overlap_ = overlap_ || node.attrs.has("async_wait");
  if (overlap_) {
    comm_ = ctx_;
    check_cuda(cudaStreamCreateWithFlags(&comm_.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags",
               "the cuda executor's communication stream");
  }
}

CudaExecutor::~CudaExecutor() {
  // Destructors cannot throw: a failure to free is ignored (the process is ending or the
  // device is already broken, and the error was reported where it happened).
  if (ctx_.stream) cudaStreamSynchronize(ctx_.stream);
  if (comm_.stream) cudaStreamSynchronize(comm_.stream);
  for (const ProfileRun& r : profile_runs_) {
    for (cudaEvent_t e : r.events)
      if (e) cudaEventDestroy(e);
    for (const auto& set : r.overlap)
      for (cudaEvent_t e : set)
        if (e) cudaEventDestroy(e);
  }
  for (const auto& pair : comm_events_)
    for (cudaEvent_t e : pair)
      if (e) cudaEventDestroy(e);
  if (comm_.stream) cudaStreamDestroy(comm_.stream);
  if (arena_ && owns_arena_) cudaFree(arena_);
  if (inputs_) cudaFree(inputs_);
  if (error_host_) cudaFreeHost(error_host_);
  if (ctx_.cublas) cublas().destroy(ctx_.cublas);
  if (ctx_.stream) cudaStreamDestroy(ctx_.stream);
}

void CudaExecutor::bind(ValueId input, const void* host_data) {
  AUTOSP_CHECK(graph_.is_input(input), "%", input, " is not a graph input");
  host_input_[input] = host_data;
  device_input_[input] = nullptr;
}

void CudaExecutor::bind_device(ValueId input, const void* device_data) {
  AUTOSP_CHECK(graph_.is_input(input), "%", input, " is not a graph input");
  device_input_[input] = device_data;
  host_input_[input] = nullptr;
}

void CudaExecutor::run() {
  run_async();
  check_cuda(cudaStreamSynchronize(ctx_.stream), "cudaStreamSynchronize (the step's kernels)",
             "the cuda executor's run");
  check_errors();
}

void CudaExecutor::run_async() {
  const std::string where = "the cuda executor's run";
  if (errors_checked_) {
    check_cuda(cudaMemsetAsync(ctx_.error, 0, sizeof(int), ctx_.stream), "cudaMemsetAsync", where);
    errors_checked_ = false;
  }
  for (ValueId v : graph_.inputs()) {
    const int64_t bytes = graph_.type(v).bytes();
    if (device_input_[v]) {
      data_[v] = const_cast<void*>(device_input_[v]);
      continue;
    }
    if (!host_input_[v] && bytes > 0) internal_error("input %", v, " '", graph_.value(v).name, "' is not bound");
    if (input_offsets_[v] < 0 && bytes > 0)
      internal_error("input '", graph_.value(v).name, "' was declared device-bound but bound to host memory");
    data_[v] = inputs_ + input_offsets_[v];
    if (bytes > 0)
      check_cuda(cudaMemcpyAsync(data_[v], host_input_[v], size_t(bytes), cudaMemcpyHostToDevice, ctx_.stream),
                 "cudaMemcpyAsync", str("copying input '", graph_.value(v).name, "' to the device"));
  }
  // Profiled by device events around each node (a node's host time here would be its launch,
  // not its kernel), read by check_errors once the stream has passed them (add_profile).
  ArenaMemory memory{arena_, offsets_, workspace_offsets_};
  ProfileRun* prof = profiler_ ? &next_profile_run() : nullptr;
  // Overlap: collectives on the communication stream, each joined into the compute stream
  // before node `wait` (an overlapped all-to-all's async_wait, any other's next node).
  struct InFlight {
    NodeId wait;
    cudaEvent_t done;
    int64_t timed;  // a profiled overlapped exchange's events: its index in prof->overlap; else -1
  };
  std::vector<InFlight> in_flight;
  size_t pairs = 0;
  auto join = [&](const InFlight& f) {
    if (f.timed >= 0)
      check_cuda(cudaEventRecord(prof->overlap[f.timed][2], ctx_.stream), "cudaEventRecord", "AUTOSP_PROFILE");
    check_cuda(cudaStreamWaitEvent(ctx_.stream, f.done, 0), "cudaStreamWaitEvent", "joining a collective");
    if (f.timed >= 0)
      check_cuda(cudaEventRecord(prof->overlap[f.timed][3], ctx_.stream), "cudaEventRecord", "AUTOSP_PROFILE");
  };
  auto event = [](bool timing) {
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming), "cudaEventCreate",
               "the cuda executor's communication events");
    return e;
  };
  auto communicate = [&](NodeId n, const Node& node, KernelArgs& args) {
    const CudaKernelRules& rules = op_def(node.op).cuda;
    const bool split = rules.overlappable && rules.pack && rules.exchange && node.attrs.has("async_wait");
    int64_t timed = -1;
    cudaEvent_t ready = nullptr, done = nullptr;
    if (prof && split) {
      if (prof->exchanges == prof->overlap.size())
        prof->overlap.push_back({event(true), event(true), event(true), event(true)});
      timed = int64_t(prof->exchanges++);
      ready = prof->overlap[timed][0], done = prof->overlap[timed][1];
    } else {
      if (pairs == comm_events_.size()) comm_events_.push_back({event(false), event(false)});
      ready = comm_events_[pairs][0], done = comm_events_[pairs][1];
      ++pairs;
    }
    if (split) rules.pack(args, ctx_);
    check_cuda(cudaEventRecord(ready, ctx_.stream), "cudaEventRecord", "starting a collective");
    check_cuda(cudaStreamWaitEvent(comm_.stream, ready, 0), "cudaStreamWaitEvent", "starting a collective");
    if (split) rules.exchange(args, comm_);
    else rules.run(args, comm_);
    check_cuda(cudaEventRecord(done, comm_.stream), "cudaEventRecord", "ending a collective");
    // Not overlapped: waited for at once, so the node's time (AUTOSP_PROFILE) is the collective's.
    if (split) in_flight.push_back({static_cast<NodeId>(node.attrs.get_int("async_wait")), done, timed});
    else join({n, done, -1});
  };
  if (prof) prof->exchanges = 0;
  run_nodes(graph_, groups_, data_, memory, [&](NodeId n, const Node& node, KernelArgs& args) {
    for (auto it = in_flight.begin(); it != in_flight.end();) {
      if (it->wait > n) {
        ++it;
        continue;
      }
      join(*it);
      it = in_flight.erase(it);
    }
    if (prof) check_cuda(cudaEventRecord(prof->events[2 * n], ctx_.stream), "cudaEventRecord", "AUTOSP_PROFILE");
    if (overlap_ && node.attrs.has("group")) communicate(n, node, args);
    else op_def(node.op).cuda.run(args, ctx_);
    check_cuda(cudaGetLastError(), "a kernel launch", str(op_name(node.op), " (node ", n, ")"));
    if (prof) {
      check_cuda(cudaEventRecord(prof->events[2 * n + 1], ctx_.stream), "cudaEventRecord", "AUTOSP_PROFILE");
      prof->timed[n] = 1;
    }
  });
  for (const InFlight& f : in_flight) join(f);  // results read by no node: the graph's outputs
  for (size_t i = 0; i < graph_.outputs().size(); ++i) {
    const ValueId v = graph_.outputs()[i].value;
    if (!copy_outputs_) break;
    // Host memory only for outputs that are copied (a device-resident step's gradients never are).
    host_outputs_[i].resize(size_t(graph_.type(v).bytes()));
    if (host_outputs_[i].empty()) continue;
    check_cuda(cudaMemcpyAsync(host_outputs_[i].data(), data_[v], host_outputs_[i].size(), cudaMemcpyDeviceToHost,
                               ctx_.stream),
               "cudaMemcpyAsync", str("copying output '", graph_.outputs()[i].name, "' to the host"));
  }
  // The flag is sticky until check_errors: a data error of any run since then stays set.
  check_cuda(cudaMemcpyAsync(error_host_, ctx_.error, sizeof(int), cudaMemcpyDeviceToHost, ctx_.stream),
             "cudaMemcpyAsync", where);
}

void CudaExecutor::check_errors() {
  if (profiler_) add_profile();  // the stream has reached the end of the runs: their events are complete
  const int error = *error_host_;
  errors_checked_ = true;
  if (error == cuda::kErrorTokenId)
    user_error("embedding: a token id is outside [0, vocab_size) (found by the cuda backend's embedding kernel)");
  if (error == cuda::kErrorLabel)
    user_error("cross_entropy: a label is outside [0, V) and is not the ignore index (found by the cuda backend)");
  if (error == cuda::kErrorTooManyDocuments)
    user_error("attention: a batch has more documents than cuDNN's attention graph holds (",
               cuda::kCudnnDocumentsPerRow, " per batch row, kernels/cuda/cudnn_attention.h); run with "
               "AUTOSP_ATTENTION=blocks, whose attention has no such bound");
  AUTOSP_CHECK(error == 0, "unknown cuda kernel error code ", error);
}

CudaExecutor::ProfileRun& CudaExecutor::next_profile_run() {
  if (profile_pending_ == kMaxProfileRuns) {
    // A caller that runs this often without check_errors: read what has run so far.
    check_cuda(cudaStreamSynchronize(ctx_.stream), "cudaStreamSynchronize", "AUTOSP_PROFILE (pending runs)");
    add_profile();
  }
  if (profile_pending_ == profile_runs_.size()) {
    ProfileRun r;
    r.events.resize(2 * graph_.nodes().size(), nullptr);
    r.timed.resize(graph_.nodes().size(), 0);
    profile_runs_.push_back(std::move(r));
    for (cudaEvent_t& e : profile_runs_.back().events)
      check_cuda(cudaEventCreate(&e), "cudaEventCreate", "the cuda executor's profile events (AUTOSP_PROFILE=1)");
  }
  ProfileRun& r = profile_runs_[profile_pending_++];
  std::fill(r.timed.begin(), r.timed.end(), 0);
  return r;
}

void CudaExecutor::add_profile() {
  std::vector<double> seconds(graph_.nodes().size());
  for (size_t k = 0; k < profile_pending_; ++k) {
    const ProfileRun& r = profile_runs_[k];
    for (NodeId n = 0; n < static_cast<NodeId>(seconds.size()); ++n) {
      seconds[n] = 0;
      if (!r.timed[n]) continue;  // an input or a view: nothing launched
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, r.events[2 * n], r.events[2 * n + 1]), "cudaEventElapsedTime",
                 str("AUTOSP_PROFILE: the time of ", op_name(graph_.node(n).op), " (node ", n, ")"));
      seconds[n] = 1e-3 * double(ms);
    }
    profiler_->add_run(seconds);
    // Each overlapped exchange: its time on the communication stream, and how long the
    // compute stream waited for it at its reader.
    for (size_t i = 0; i < r.exchanges; ++i) {
      float exchange = 0, waited = 0;
      check_cuda(cudaEventElapsedTime(&exchange, r.overlap[i][0], r.overlap[i][1]), "cudaEventElapsedTime",
                 "AUTOSP_PROFILE: an overlapped exchange");
      check_cuda(cudaEventElapsedTime(&waited, r.overlap[i][2], r.overlap[i][3]), "cudaEventElapsedTime",
                 "AUTOSP_PROFILE: the wait for an overlapped exchange");
      global_profile().add_overlap(1e-3 * double(exchange), 1e-3 * double(std::min(waited, exchange)));
    }
  }
  profile_pending_ = 0;
}

const void* CudaExecutor::output_data(const std::string& name) const {
  AUTOSP_CHECK(copy_outputs_, "output_data('", name, "'): this executor leaves its outputs on the device");
  for (size_t i = 0; i < graph_.outputs().size(); ++i)
    if (graph_.outputs()[i].name == name) return host_outputs_[i].data();
  internal_error("graph has no output named '", name, "'");
}

const void* CudaExecutor::output_device(const std::string& name) const { return data_[graph_.output(name)]; }

std::unique_ptr<Executor> make_cuda_executor(const Graph& graph, const ProcessGroups* groups,
                                             const Executor* arena_of) {
  const auto* shared = dynamic_cast<const CudaExecutor*>(arena_of);
  AUTOSP_CHECK(!arena_of || shared, "a cuda executor shares the arena of another cuda executor");
  return std::make_unique<CudaExecutor>(graph, groups, shared);
}

}  // namespace autosp
