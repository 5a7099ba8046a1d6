// fuse: the training step's loss and its gradient as one node, so the LM head's logits are
// made once per step instead of twice (the backward of linear_cross_entropy remakes them).
//
// Runs on the checkpointed joint graph, before schedule. Each pair
//     %loss, %lse = linear_cross_entropy(%x, %W, %labels) {attrs}
//     %dx, %dW    = linear_cross_entropy_backward(%d, %x, %W, %labels, %lse) {attrs}
// where nothing but the backward reads %lse and %d does not depend on the forward node (in a
// training step it never does: %d is the seed 1 over count_valid's count of the labels,
// all-reduced under sequence parallelism) becomes
//     %loss, %dx, %dW = linear_cross_entropy_with_grad(%x, %W, %labels, %d) {attrs}
// in the forward node's place, with the nodes %d depends on that came after it moved just
// before it, in their order. Per chunk of rows the new node makes the logits, their
// log-sum-exp and loss, the logits' gradient in place, dx and dW: three gemms of the four.
//
// Invariants kept:
//  - Numbers: %loss, %dx and %dW are bit for bit the pair's (the same chunks, gemms and row
//    passes, kernels/cpu/linear_cross_entropy.h); every other value is computed by the same
//    node as before.
//  - Every other node is kept with its op, attributes, operands, result types, shardings and
//    names, in the same relative order; the graph inputs and outputs are kept, in order.
//    %lse is gone (nothing else read it); %loss, %dx and %dW keep their shardings and names.
//  - A pair that does not match (another reader of %lse, different operands or attributes,
//    %d depending on the loss) is left as it is.
//  - Only for the cpu backend, whose kernel saves the gemm: on cuda the op runs the pair's
//    two kernels one after the other (nothing to gain yet), so cuda graphs are unchanged.
#pragma once
#include "ir/graph.h"
#include "ops/op.h"

namespace autosp {

struct FuseOptions {
  Backend backend = Backend::cpu;
};

Graph fuse(const Graph& graph, const FuseOptions& options);

}  // namespace autosp
