// The one loop over a lowered graph's nodes that every executor runs: host and device differ
// in memory only (where a result or a workspace lives, and when it is freed) and in how a
// kernel is launched.
//
// Invariants:
//  - Nodes run once each, in graph order; inputs run nothing (the executor placed them).
//  - A reshape is a view: its result is its operand's buffer; nothing runs or is placed.
//  - A node's results are placed (in order) before its workspace, and both before its kernel
//    runs; the workspace is handed back after the kernel, also when the kernel throws.
//  - The memory is told every non-input node has finished (a reshape too) after its
//    workspace went back: heap memory frees there by use counts, an arena does nothing.
//  - With a profiler (AUTOSP_PROFILE, runtime/profile.h) every node is timed, inputs and
//    views included (they cost nothing, and NodeProfiler adds no row for inputs); the time
//    includes the node's memory work (heap mode's allocations and frees).
#pragma once
#include <chrono>
#include <cstdint>
#include <vector>

#include "ir/graph.h"
#include "ops/op.h"
#include "runtime/executor.h"
#include "runtime/profile.h"

namespace autosp {

// Memory, as run_nodes asks it:
//   Buffer result(ValueId v): the buffer of node result v, placed just before its node runs.
//   void* workspace(NodeId n): node n's kernel workspace (null: none).
//   void release_workspace(NodeId n, void* ws): after the kernel ran or threw.
//   void node_done(const Node& node): after the node ran (a reshape too), never after a throw.
// Launch: void(NodeId n, const Node& node, KernelArgs& args) runs node n's kernel with its
//   operands, results and workspace in args (the backend's kernel, and its checks).
// data: per value, its buffer this run (the graph inputs bound by the caller); results and
//   views are written here.
template <class Buffer, class Memory, class Launch>
void run_nodes(const Graph& graph, const ProcessGroups* groups, std::vector<Buffer>& data, Memory& memory,
               const Launch& launch, NodeProfiler* profiler = nullptr) {
  auto run_node = [&](NodeId n) {
    const Node& node = graph.node(n);
    if (node.op == OpKind::input) return;
    if (node.op == OpKind::reshape) {
      data[node.outputs[0]] = data[node.inputs[0]];
      memory.node_done(node);
      return;
    }
    KernelArgs args = node_kernel_args(graph, node, groups, data);
    for (ValueId v : node.outputs) {
      data[v] = memory.result(v);
      args.outputs.push_back(const_cast<void*>(static_cast<const void*>(data[v])));
    }
    args.workspace = memory.workspace(n);
    try {
      launch(n, node, args);
    } catch (...) {
      memory.release_workspace(n, args.workspace);
      throw;
    }
    memory.release_workspace(n, args.workspace);
    memory.node_done(node);
  };
  for (NodeId n = 0; n < static_cast<NodeId>(graph.nodes().size()); ++n) {
    if (!profiler) {
      run_node(n);
      continue;
    }
    const auto start = std::chrono::steady_clock::now();
    run_node(n);
    profiler->add(n, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
}

// Memory that is one planned arena (plan_memory): every result and workspace at its offset,
// placed when the executor is made, freed with it. Offset -1: no bytes (null).
struct ArenaMemory {
  char* arena;
  const std::vector<int64_t>& offsets;            // per value
  const std::vector<int64_t>& workspace_offsets;  // per node

  void* result(ValueId v) const { return offsets[v] >= 0 ? arena + offsets[v] : nullptr; }
  void* workspace(NodeId n) const { return workspace_offsets[n] >= 0 ? arena + workspace_offsets[n] : nullptr; }
  void release_workspace(NodeId, void*) const {}
  void node_done(const Node&) const {}
};

}  // namespace autosp
