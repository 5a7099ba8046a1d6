// schedule: an order of the joint graph's nodes that lowers the step's planned peak memory.
//
// A greedy list scheduler. Among the nodes whose operands are all computed:
//  1. a collective first: communication is issued as early as its operands allow (on a
//     device with a communication stream it then overlaps the compute that follows);
//  2. else the node that adds the fewest bytes to what is live: the results it writes,
//     less the buffers it is the last reader of (an in-place result nets to zero either
//     way). Nodes that only allocate, such as recomputation or gradients kept to the end of
//     the step, therefore run as late as their readers allow, and a node that frees a large
//     buffer runs as soon as it can;
//  3. ties go to the node that comes first in the input order.
// The result is kept only if plan_memory's arena for it is smaller than for the input
// order; otherwise the input order is returned.
//
// Invariants kept:
//  - The same nodes: each has the same op, attributes and operands (as values) and
//    computes the same results with the same kernel, so every number is bitwise what the
//    input order gives. Value ids are renumbered in the new order of definition; names,
//    types, shardings and the graph outputs (in order) are kept.
//  - Graph inputs keep their order among themselves (a new order puts them all first).
//  - The order is topological and a function of the graph alone, so every rank of an SPMD
//    program issues its collectives in the same order.
//  - The planned peak (plan_memory's arena for `backend` at `threads`) is never above the
//    input order's.
//  - The input is not memory-planned yet (schedule runs before plan_memory).
#pragma once
#include "ir/graph.h"
#include "ops/op.h"

namespace autosp {

struct ScheduleOptions {
  int threads = 1;  // the executor's kernel threads, for the workspace sizes of the plans compared
  Backend backend = Backend::cpu;  // whose kernels' workspaces and in-place rules (lower binds them later)
};

Graph schedule(const Graph& graph, const ScheduleOptions& options);

}  // namespace autosp
