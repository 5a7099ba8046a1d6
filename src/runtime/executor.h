// Runs a graph on the CPU, node by node in graph order (run_nodes, runtime/node_loop.h).
// Inputs are bound to caller memory and not copied. A reshape is a view: its result shares
// its operand's buffer, which lives until the last use of either. A graph output is kept
// until the next run.
//
// Memory (BufferMode):
//  - arena (the default): every result and kernel workspace lives at its offset in one
//    arena, planned by plan_memory (the graph's own plan if it carries one, else a plan made
//    here for this executor's thread count). The arena is allocated once, when the executor
//    is made, and held until it is destroyed: a step allocates nothing, and the allocator's
//    peak is the planned arena.
//  - heap: each node's results are allocated just before it runs and freed after their last
//    use (by use counts), kernel workspaces around the kernel. Kept as the reference the
//    plan is measured and checked against.
//
// The graph is lowered for the cpu backend (passes/lower.h) or is bound here: one that gives
// a bf16 value to an op without a bf16 kernel (every op but convert, reshape and transpose)
// is refused at construction, as lowering refuses it.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "ir/graph.h"
#include "ops/op.h"
#include "runtime/allocator.h"

namespace autosp {

class NodeProfiler;  // runtime/profile.h

enum class BufferMode { arena, heap };

// What the trainer and the tests run a compiled graph with, whatever the backend: bind the
// inputs (host memory), run, read the outputs (host memory).
class Executor {
 public:
  virtual ~Executor() = default;
  // Binds a graph input to host memory holding its type's bytes; it must outlive run().
  virtual void bind(ValueId input, const void* data) = 0;
  void bind(const std::string& input_name, const void* data);
  virtual void run() = 0;
  // A graph output's bytes in host memory after run().
  virtual const void* output_data(const std::string& name) const = 0;
  const float* output(const std::string& name) const { return static_cast<const float*>(output_data(name)); }
  // The same host memory, which the caller may update in place until the next run() (the
  // optimizer scales and clips the reduced gradients where the step left them).
  float* mutable_output(const std::string& name) { return const_cast<float*>(output(name)); }
  std::vector<float> output_vector(const std::string& name) const;
  virtual const Graph& graph() const = 0;
  virtual int64_t arena_bytes() const = 0;
};

// What the executors share (host and device differ in memory only): which communicator a
// collective runs on, the graph's views, a node's kernel arguments, and the loop over the
// nodes that uses them (run_nodes, runtime/node_loop.h).
//   group_communicator: the communicator a collective's "group" attribute names ("sp", "dp",
//     "world"); InternalError when `groups` is null or lacks it.
//   check_collective_groups: every collective's group exists with the size it was compiled for.
//   view_roots: per value, the value whose buffer it is (itself; a reshape's, its operand's).
//   node_kernel_args: a node's attributes, communicator, operand buffers (data[v]) and operand
//     and result types; the executor places the results and the workspace.
Communicator* group_communicator(const ProcessGroups* groups, const std::string& group);
void check_collective_groups(const Graph& graph, const ProcessGroups* groups);
std::vector<ValueId> view_roots(const Graph& graph);
template <class Buffer>
KernelArgs node_kernel_args(const Graph& graph, const Node& node, const ProcessGroups* groups,
                            const std::vector<Buffer>& data) {
  KernelArgs args;
  args.attrs = &node.attrs;
  if (node.attrs.has("group")) args.comm = group_communicator(groups, node.attrs.get_str("group"));
  // Attention over the rank's part of the heads reads the rank's ALiBi slopes and sinks
  // (ops/attention.cpp).
  if (node.attrs.has("alibi_split") || node.attrs.has("sinks_split")) args.comm = group_communicator(groups, "sp");
  for (ValueId v : node.inputs) {
    args.inputs.push_back(data[v]);
    args.in_types.push_back(&graph.type(v));
  }
  for (ValueId v : node.outputs) args.out_types.push_back(&graph.type(v));
  return args;
}

// The backends (`autosp train --backend`): cpu, and cuda where it is built (AUTOSP_CUDA).
// (Backend, parse_backend and backend_name: ops/op.h.)
bool cuda_backend_built();
// The graph as an executor of `backend` runs it: lowered for that backend and memory-planned
// with its kernels (`threads`: the CPU's kernel threads). A graph the pipeline compiled for
// the backend is that already and comes back as it is; another is lowered and planned here.
// Needs no device: `autosp plan --backend cuda` and the tests read the cuda arena from it.
Graph executable_graph(const Graph& graph, Backend backend, int threads);
// The arena the cuda executor allocates for `graph` in its one cudaMalloc: the plan of
// executable_graph(graph, cuda). Needs no device and no nvcc.
int64_t cuda_arena_bytes(const Graph& graph);
// An executor of `backend` for `graph` (threads and mode are the CPU's; the cuda backend
// runs in its own device arena). UserError when cuda is asked for and not built, or when no
// CUDA device is present.
//
// Programs that never run at the same time (the micro batches of one optimizer step) share
// one arena: given `arena_of` (an executor of the same backend, whose arena is at least this
// graph's, and which outlives this one), the executor works in that arena instead of
// allocating its own. A run then overwrites the other's buffers and outputs: read a
// program's outputs before the other runs.
std::unique_ptr<Executor> make_executor(Backend backend, const Graph& graph, Allocator& allocator,
                                        int threads = 0, const ProcessGroups* groups = nullptr,
                                        const Executor* arena_of = nullptr);

class CpuExecutor final : public Executor {
 public:
  // threads: OpenMP threads for the kernels (0 = OpenMP's default). groups: the
  // communicators collectives run on (none: a graph without collectives).
  // arena_of: share that executor's arena (make_executor).
  CpuExecutor(const Graph& graph, Allocator& allocator, int threads = 0,
              const ProcessGroups* groups = nullptr, BufferMode mode = BufferMode::arena,
              const CpuExecutor* arena_of = nullptr);
  ~CpuExecutor();
  CpuExecutor(const CpuExecutor&) = delete;
  CpuExecutor& operator=(const CpuExecutor&) = delete;

  // Binds a graph input to memory holding its type's bytes; it must outlive run().
  void bind(ValueId input, const void* data) override;
  using Executor::bind;

  // Runs the whole graph. A UserError (e.g. an out-of-range token) leaves no leak.
  void run() override;

  // A graph output's buffer after run().
  const void* output_data(const std::string& name) const override;

  const Graph& graph() const override { return graph_; }
  // The arena allocated for the whole step (plan_memory's planned peak, workspaces
  // included); 0 in heap mode.
  int64_t arena_bytes() const override { return arena_bytes_; }

 private:
  class HeapMemory;  // heap mode's memory for run_nodes (runtime/node_loop.h)
  void release_all();

  const Graph& graph_;
  Allocator& allocator_;
  int threads_;
  const ProcessGroups* groups_;
  std::vector<const void*> data_;  // per value: where its bytes are (bound or allocated)
  std::vector<bool> owned_;        // per value: allocated by us
  std::vector<ValueId> root_;      // per value: the value whose buffer it uses (itself, or
                                   // a reshape's operand's root)
  std::vector<int> buffer_uses_;   // per root: uses of every value sharing its buffer
  BufferMode mode_;
  // Arena mode: the arena, and per value / per node its offsets (-1: not in the arena).
  void* arena_ = nullptr;
  int64_t arena_bytes_ = 0;
  bool owns_arena_ = true;  // false: another executor's (arena_of)
  std::vector<int64_t> offsets_, workspace_offsets_;
  // AUTOSP_PROFILE=1 when the executor was made: times each node (runtime/profile.h).
  std::unique_ptr<NodeProfiler> profiler_;
};

}  // namespace autosp
