// Runs a graph on the CPU, node by node in graph order. Inputs are bound to caller memory
// and not copied. A reshape is a view: its result shares its operand's buffer, which lives
// until the last use of either. A graph output is kept until the next run.
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
// CPU kernels are fp32: a graph that gives a bf16 value to an op without a bf16 kernel
// (every op but convert, reshape and transpose) is refused at construction.
#pragma once
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "ir/graph.h"
#include "runtime/allocator.h"

namespace autosp {

enum class BufferMode { arena, heap };

class CpuExecutor {
 public:
  // threads: OpenMP threads for the kernels (0 = OpenMP's default). groups: the
  // communicators collectives run on (none: a graph without collectives).
  CpuExecutor(const Graph& graph, Allocator& allocator, int threads = 0,
              const ProcessGroups* groups = nullptr, BufferMode mode = BufferMode::arena);
  ~CpuExecutor();
  CpuExecutor(const CpuExecutor&) = delete;
  CpuExecutor& operator=(const CpuExecutor&) = delete;

  // Binds a graph input to memory holding its type's bytes; it must outlive run().
  void bind(ValueId input, const void* data);
  void bind(const std::string& input_name, const void* data);

  // Runs the whole graph. A UserError (e.g. an out-of-range token) leaves no leak.
  void run();

  // A graph output's buffer after run().
  const void* output_data(const std::string& name) const;
  const float* output(const std::string& name) const {
    return static_cast<const float*>(output_data(name));
  }
  std::vector<float> output_vector(const std::string& name) const;

  const Graph& graph() const { return graph_; }
  // The arena allocated for the whole step (plan_memory's planned peak, workspaces
  // included); 0 in heap mode.
  int64_t arena_bytes() const { return arena_bytes_; }

 private:
  void release_all();
  void run_node(NodeId n, std::vector<int>& remaining);
  void check_cpu_dtypes(NodeId n, const Node& node) const;
  Communicator* communicator(const std::string& group) const;

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
  std::vector<int64_t> offsets_, workspace_offsets_;
};

}  // namespace autosp
