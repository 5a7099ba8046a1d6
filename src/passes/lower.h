// lower: binds every node to its backend's kernel, after grad_sync and before plan_memory
// (DESIGN.md "The pipeline"), so that what a backend cannot run is refused at compile time
// and the memory plan is the backend's own.
//
// For each node but the inputs it writes (replacing a previous lowering's):
//   kernel="<backend>.<name>"  the kernel that runs it: "cpu.avx512.attention" (a CPU kernel
//                              compiled per instruction set: the active set's copy),
//                              "cpu.linear", "cuda.attention_forward", "cuda.cublas_gemm";
//   workspace=<bytes>          its scratch, when it needs any (the CPU's at `threads`);
//   inplace=1                  when a result may take the buffer of an operand that dies
//                              at the node (the kernel reads before it writes).
// plan_memory reads workspace and inplace; the executors check a graph is lowered for
// their backend (and, on the CPU, for the active instruction set).
//
// Refused, as a UserError naming the backend, the op and the node: an op without a kernel on
// the backend, a dtype its kernels do not read (bf16 on the CPU), operands beyond a kernel's
// limits (a cuda head dim above kernels/cuda/limits.h's). Nothing else changes: same nodes,
// values, order and outputs. Lowering for cuda needs no GPU and no nvcc.
#pragma once
#include <optional>

#include "ir/graph.h"
#include "ops/op.h"

namespace autosp {

struct LowerOptions {
  Backend backend = Backend::cpu;
  int threads = 1;  // the CPU executor's kernel threads (CPU workspaces depend on them)
};

Graph lower(const Graph& graph, const LowerOptions& options);

// The backend every non-input node of `graph` is lowered for; nullopt when some node is not
// lowered (or the graph has no nodes to lower). InternalError for a graph lowered for two.
std::optional<Backend> lowered_backend(const Graph& graph);

// The binding a lowered node carries (kernel, workspace, inplace), read back.
KernelBinding lowered_binding(const Node& node);

}  // namespace autosp
