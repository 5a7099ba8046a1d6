// Runs a graph on the CPU, node by node in graph order: each node's results are
// allocated just before it runs, and a buffer is freed after its last use (a graph
// output is kept until the next run). Inputs are bound to caller memory and not copied.
// A reshape is a view: its result shares its operand's buffer, which lives until the last
// use of either. CPU kernels are fp32: a graph that gives a bf16 value to an op without a
// bf16 kernel (every op but convert, reshape and transpose) is refused at construction.
#pragma once
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "ir/graph.h"
#include "runtime/allocator.h"

namespace autosp {

class CpuExecutor {
 public:
  // threads: OpenMP threads for the kernels (0 = OpenMP's default). groups: the
  // communicators collectives run on (none: a graph without collectives).
  CpuExecutor(const Graph& graph, Allocator& allocator, int threads = 0,
              const ProcessGroups* groups = nullptr);
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

 private:
  void release_all();
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
};

}  // namespace autosp
