// plan_memory: one arena per rank and an offset in it for every buffer of the step, so the
// step's activation memory is known before it runs and the executor allocates it once.
//
// A buffer lives from the node that writes it to the last node that reads it, positions
// taken from the graph's node order (the schedule). Buffers are placed one at a time, each
// into the smallest gap of the arena that is free over its whole lifetime (best fit, as
// TFLite's greedy-by-size and XLA's global decreasing-size best-fit heap do), or above the
// highest buffer live with it where no gap fits; this is done in a few orders (largest
// first, time order, longest-lived first) and the smallest arena is kept.
//
// Invariants kept:
//  - The graph is unchanged (same nodes, values, order and outputs) except for two
//    attributes on the nodes that own memory:
//      mem_offsets=[o0, o1, ...]  one arena offset per result, -1 for a result of 0 bytes;
//      mem_workspace=[offset, bytes]  the kernel's scratch (the lowered `workspace`), on
//                                     nodes that need any.
//    Input nodes and reshape nodes carry neither.
//  - Not in the arena: graph inputs (parameters, tokens, labels, ... are bound caller
//    memory), and reshape results, which are views sharing their operand's storage (a view
//    keeps its base buffer alive until the view's own last use).
//  - Graph outputs (loss, gradients) stay alive past the last node, until the next run, so
//    the caller can read them after the step.
//  - Two buffers live at the same node never share a byte. The one exception is in-place
//    reuse: a result may take the buffer of an operand that dies at its node, when both
//    have the same type and the node's kernel allows it (the lowered `inplace`).
//  - Offsets and sizes are multiples of 64 bytes; the arena is the highest buffer end.
// Replanning a planned graph replaces its plan.
#pragma once
#include <cstdint>
#include <vector>

#include "ir/graph.h"
#include "ops/op.h"

namespace autosp {

inline constexpr int64_t kArenaAlignment = 64;
inline int64_t aligned_to_arena(int64_t bytes) { return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

// What each node's kernel needs comes from its lowering (passes/lower.h: the workspace and
// inplace attributes) when the graph is lowered; otherwise from the kernels of `backend` at
// `threads`, as lower would bind them (schedule compares orders of an unlowered graph so).
struct PlanMemoryOptions {
  int threads = 1;       // the executor's kernel threads (CPU workspace sizes depend on them)
  bool inplace = true;   // reuse a dying operand's buffer where the kernel allows it
  Backend backend = Backend::cpu;  // for a graph not lowered yet
  // The executors overlap collectives that can (the all-to-alls: OpDef::cpu_start on the CPU,
  // CudaKernelRules::overlappable on cuda) with the compute after them: such a node gets the
  // attribute async_wait=W, the first node that
  // reads a result of it (through views too; the node count when none does), and its
  // workspace (where the exchange sends and receives) lives until W. Results and operands
  // are as without it: the operand is read at the node, the result written before W.
  bool overlap = false;
};

Graph plan_memory(const Graph& graph, const PlanMemoryOptions& options);

// The arena plan_memory(graph, options) plans, without making the plan. With stop_above >= 0
// only a result up to stop_above is exact: a larger one says the arena is above it (the
// packing stops as soon as that is known).
int64_t planned_arena_bytes(const Graph& graph, const PlanMemoryOptions& options, int64_t stop_above = -1);

// The plan a graph carries, read back from its attributes.
struct MemoryPlan {
  int64_t arena_bytes = 0;  // the planned peak: the arena the executor allocates
  // The most bytes (rounded to the alignment) live at one node: no packing of this order
  // can use less. arena_bytes / live_peak_bytes - 1 is the packing's fragmentation.
  int64_t live_peak_bytes = 0;
  // Where the live peak is reached (the first such node), and the buffers live there: per
  // distinct arena range one value, the latest written (of an in-place operand and result,
  // the result); their aligned sizes and the node's workspace sum to live_peak_bytes.
  NodeId live_peak_node = -1;
  std::vector<ValueId> live_at_peak;
  std::vector<int64_t> offsets;            // per value: arena offset, -1 if not in the arena
                                           // (inputs, views, empty results)
  std::vector<int64_t> workspace_offsets;  // per node, -1 without a workspace
  std::vector<int64_t> workspace_bytes;    // per node
};

// Whether every node that needs a plan carries one.
bool has_memory_plan(const Graph& graph);
// The plan of a planned graph; an InternalError if a node lacks its attributes or an
// offset is misaligned.
MemoryPlan read_memory_plan(const Graph& graph);

}  // namespace autosp
