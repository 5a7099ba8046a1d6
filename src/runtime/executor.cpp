#include "runtime/executor.h"

#include <omp.h>

#include <malloc.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <new>

#include "ops/op.h"
#include "passes/lower.h"
#include "passes/plan_memory.h"
#ifdef AUTOSP_HAVE_CUDA
#include "runtime/cuda_executor.h"
#endif
#include "runtime/node_loop.h"
#include "runtime/profile.h"
#include "util/error.h"

namespace autosp {

HeapAllocator::HeapAllocator() {
  static const bool configured = [] {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);  // the largest value glibc accepts (32 MiB on 32-bit)
    mallopt(M_TRIM_THRESHOLD, INT_MAX);
    return true;
  }();
  (void)configured;
}

void* HeapAllocator::allocate(int64_t bytes) {
  if (bytes == 0) return nullptr;
  const auto rounded = static_cast<size_t>((bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, rounded);
  if (!p)
    user_error("out of host memory: could not allocate ", bytes, " bytes (", live_bytes(),
               " bytes already live); use a shorter sequence or more ranks");
  count_allocate(bytes);
  return p;
}

void HeapAllocator::release(void* ptr, int64_t bytes) {
  if (!ptr) return;
  std::free(ptr);
  count_release(bytes);
}

CpuExecutor::CpuExecutor(const Graph& graph, Allocator& allocator, int threads,
                         const ProcessGroups* groups, BufferMode mode, const CpuExecutor* arena_of)
    : graph_(graph),
      allocator_(allocator),
      threads_(threads > 0 ? threads : omp_get_max_threads()),
      groups_(groups),
      data_(graph.values().size(), nullptr),
      owned_(graph.values().size(), false),
      buffer_uses_(graph.values().size(), 0),
      mode_(mode) {
  // A graph lowered for the CPU must be lowered for the active instruction set's kernels
  // (their workspaces differ); an unlowered one is bound here, refusing what the CPU cannot
  // run (bf16 operands) before anything runs.
  const std::optional<Backend> lowered = lowered_backend(graph);
  if (lowered && *lowered != Backend::cpu)
    user_error("cpu backend: this graph is lowered for the ", backend_name(*lowered),
               " backend; compile it with backend cpu");
  for (NodeId n = 0; n < static_cast<NodeId>(graph.nodes().size()); ++n) {
    const Node& node = graph.node(n);
    if (node.op != OpKind::input) {
      const KernelBinding kernel = bind_kernel(graph, n, Backend::cpu, threads_);
      if (lowered && lowered_binding(node).kernel != kernel.kernel)
        user_error("cpu backend: node ", n, " is lowered for kernel ", lowered_binding(node).kernel, " but this "
                   "process runs ", kernel.kernel, " (AUTOSP_ISA or the CPU differs from the compile's); compile "
                   "the graph where it runs");
    }
  }
  check_collective_groups(graph, groups_);
  root_ = view_roots(graph);
  for (const Node& node : graph.nodes())
    for (ValueId v : node.inputs) ++buffer_uses_[root_[v]];
  for (const GraphOutput& o : graph.outputs()) ++buffer_uses_[root_[o.value]];
  if (profile_enabled()) profiler_ = std::make_unique<NodeProfiler>(graph, threads_, global_profile());
  if (mode_ != BufferMode::arena) return;

  // The graph's plan if the pipeline made one, else one for this graph and thread count.
  const MemoryPlan plan = has_memory_plan(graph) ? read_memory_plan(graph)
                                                 : read_memory_plan(plan_memory(graph, {.threads = threads_}));
  for (NodeId n = 0; n < static_cast<NodeId>(graph.nodes().size()); ++n) {
    const Node& node = graph.node(n);
    const int64_t need = node_workspace_bytes(graph, node, threads_);
    AUTOSP_CHECK(need <= plan.workspace_bytes[n], "node ", n, " (", op_name(node.op), ") needs ", need,
                 " workspace bytes on ", threads_, " threads but its plan has ", plan.workspace_bytes[n],
                 " (plan_memory ran for another thread count)");
  }
  offsets_ = plan.offsets;
  workspace_offsets_ = plan.workspace_offsets;
  arena_bytes_ = plan.arena_bytes;
  if (arena_of) {
    AUTOSP_CHECK(arena_of->mode_ == BufferMode::arena && arena_of->arena_bytes_ >= arena_bytes_,
                 "a shared arena of ", arena_of->arena_bytes_, " bytes for a plan of ", arena_bytes_);
    arena_ = arena_of->arena_;
    owns_arena_ = false;
    return;
  }
  arena_ = allocator_.allocate(arena_bytes_);
}

CpuExecutor::~CpuExecutor() {
  release_all();
  if (owns_arena_) allocator_.release(arena_, arena_bytes_);
}

Communicator* group_communicator(const ProcessGroups* groups, const std::string& group) {
  AUTOSP_CHECK(groups, "a collective on group '", group, "' but the executor has no communicators");
  Communicator* c = group == "sp" ? groups->sp.get() : group == "dp" ? groups->dp.get()
                    : group == "world" ? groups->world.get() : nullptr;
  AUTOSP_CHECK(c, "no communicator for group '", group, "'");
  return c;
}

void check_collective_groups(const Graph& graph, const ProcessGroups* groups) {
  for (const Node& node : graph.nodes())
    if (node.attrs.has("group"))
      AUTOSP_CHECK(group_communicator(groups, node.attrs.get_str("group"))->size() == node.attrs.get_int("size"),
                   op_name(node.op), " expects group '", node.attrs.get_str("group"), "' of size ",
                   node.attrs.get_int("size"));
}

std::vector<ValueId> view_roots(const Graph& graph) {
  std::vector<ValueId> root(graph.values().size(), -1);
  for (const Node& node : graph.nodes())
    for (size_t i = 0; i < node.outputs.size(); ++i)
      root[node.outputs[i]] = node.op == OpKind::reshape ? root[node.inputs[0]] : node.outputs[i];
  return root;
}

void CpuExecutor::release_all() {
  for (size_t v = 0; v < data_.size(); ++v) {
    if (owned_[v]) allocator_.release(const_cast<void*>(data_[v]), graph_.values()[v].type.bytes());
    if (owned_[v]) data_[v] = nullptr;
    owned_[v] = false;
  }
}

void CpuExecutor::bind(ValueId input, const void* data) {
  AUTOSP_CHECK(graph_.is_input(input), "%", input, " is not a graph input");
  data_[input] = data;
}

void Executor::bind(const std::string& input_name, const void* data) {
  ValueId v = graph().find_input(input_name);
  if (v < 0) internal_error("graph has no input named '", input_name, "'");
  bind(v, data);
}

// Heap mode's memory (run_nodes): each result allocated just before its node runs and freed
// after the last use of its buffer (use counts per view root), each workspace around its
// kernel. What it allocated is marked owned, so that release_all frees it after a throw.
class CpuExecutor::HeapMemory {
 public:
  explicit HeapMemory(CpuExecutor& ex) : ex_(ex), remaining_(ex.buffer_uses_) {}

  const void* result(ValueId v) {
    ex_.data_[v] = ex_.allocator_.allocate(ex_.graph_.type(v).bytes());
    ex_.owned_[v] = true;
    return ex_.data_[v];
  }
  void* workspace(NodeId n) {
    workspace_bytes_ = node_workspace_bytes(ex_.graph_, ex_.graph_.node(n), ex_.threads_);
    return ex_.allocator_.allocate(workspace_bytes_);
  }
  void release_workspace(NodeId, void* ws) { ex_.allocator_.release(ws, workspace_bytes_); }
  // Frees what this node was the last user of, and its results nobody uses.
  void node_done(const Node& node) {
    for (ValueId v : node.inputs) {
      const ValueId root = ex_.root_[v];
      if (--remaining_[root] == 0 && ex_.owned_[root]) release(root);
    }
    for (ValueId v : node.outputs)
      if (remaining_[v] == 0 && ex_.owned_[v]) release(v);
  }

 private:
  void release(ValueId root) {
    ex_.allocator_.release(const_cast<void*>(ex_.data_[root]), ex_.graph_.type(root).bytes());
    ex_.data_[root] = nullptr;
    ex_.owned_[root] = false;
  }

  CpuExecutor& ex_;
  std::vector<int> remaining_;  // per root: uses of its buffer still to run
  int64_t workspace_bytes_ = 0;  // the running node's
};

void CpuExecutor::run() {
  release_all();
  for (ValueId v : graph_.inputs())
    if (!data_[v] && graph_.type(v).bytes() > 0)
      internal_error("input %", v, " '", graph_.value(v).name, "' is not bound");

  omp_set_num_threads(threads_);
  // Collectives the plan overlaps (plan_memory's async_wait, arena mode only: the plan keeps
  // their workspace to that node): started at their node, moved along before every later
  // node, finished before the node that reads them (or after the last node).
  using clock = std::chrono::steady_clock;
  struct Started {
    NodeId wait;
    StartedKernel kernel;
    clock::time_point start, done;
    bool finished_early = false;
  };
  std::vector<Started> started;
  auto finish = [&](Started& s) {
    const auto t0 = clock::now();
    s.kernel.finish();
    const auto t1 = clock::now();
    if (profile_enabled()) {
      const double blocked = std::chrono::duration<double>(t1 - t0).count();
      const double in_flight = std::chrono::duration<double>((s.finished_early ? s.done : t1) - s.start).count();
      global_profile().add_overlap(in_flight, s.finished_early ? 0.0 : blocked);
    }
  };
  auto finish_due = [&](NodeId n) {
    for (auto it = started.begin(); it != started.end();) {
      if (!it->finished_early && it->kernel.progress()) {
        it->finished_early = true;
        it->done = clock::now();
      }
      if (it->wait > n) {
        ++it;
        continue;
      }
      finish(*it);
      it = started.erase(it);
    }
  };
  auto launch = [&](NodeId n, const Node& node, KernelArgs& args) {
    if (!started.empty()) finish_due(n);
    args.threads = threads_;
    const OpDef& def = op_def(node.op);
    if (def.cpu_start && mode_ == BufferMode::arena && node.attrs.has("async_wait")) {
      started.push_back({static_cast<NodeId>(node.attrs.get_int("async_wait")), def.cpu_start(args), clock::now(),
                         {}, false});
      return;
    }
    def.cpu(args);
  };
  try {
    if (mode_ == BufferMode::heap) {
      HeapMemory memory(*this);
      run_nodes(graph_, groups_, data_, memory, launch, profiler_.get());
    } else {
      ArenaMemory memory{static_cast<char*>(arena_), offsets_, workspace_offsets_};
      run_nodes(graph_, groups_, data_, memory, launch, profiler_.get());
    }
    for (Started& s : started) finish(s);  // results read by no node: the graph's outputs
  } catch (...) {
    release_all();
    throw;
  }
}

const void* CpuExecutor::output_data(const std::string& name) const {
  ValueId v = graph_.output(name);
  return data_[v];
}

std::vector<float> Executor::output_vector(const std::string& name) const {
  ValueId v = graph().output(name);
  AUTOSP_CHECK(graph().type(v).dtype == DType::f32, "output '", name, "' is not f32");
  const auto* p = static_cast<const float*>(output_data(name));
  return std::vector<float>(p, p + numel(graph().shape(v)));
}

Graph executable_graph(const Graph& graph, Backend backend, int threads) {
  if (lowered_backend(graph) == backend && has_memory_plan(graph)) return graph;
  return plan_memory(lower(graph, {.backend = backend, .threads = threads}), {.threads = threads});
}

int64_t cuda_arena_bytes(const Graph& graph) {
  return read_memory_plan(executable_graph(graph, Backend::cuda, 1)).arena_bytes;
}

bool cuda_backend_built() {
#ifdef AUTOSP_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Executor> make_executor(Backend backend, const Graph& graph, Allocator& allocator, int threads,
                                        const ProcessGroups* groups, const Executor* arena_of) {
  if (backend == Backend::cpu) {
    const auto* shared = dynamic_cast<const CpuExecutor*>(arena_of);
    AUTOSP_CHECK(!arena_of || shared, "a cpu executor shares the arena of another cpu executor");
    return std::make_unique<CpuExecutor>(graph, allocator, threads, groups, BufferMode::arena, shared);
  }
#ifdef AUTOSP_HAVE_CUDA
  return make_cuda_executor(graph, groups, arena_of);
#else
  user_error("backend cuda: this autosp was built without the cuda backend (no nvcc at configure time, or "
             "-DAUTOSP_CUDA=OFF); rebuild with the CUDA toolkit installed, or use --backend cpu");
#endif
}

}  // namespace autosp
