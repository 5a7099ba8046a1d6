// autodiff: from a forward graph with a scalar loss, the joint forward + backward graph.
//
// Invariants kept:
//  - The forward part is unchanged: same nodes, same values, same ids, same outputs first.
//  - Gradients are built only where they flow: a node's gradient rule runs only when one of
//    its results has a gradient and one of its operands needs one (depends on a parameter);
//    an operand that does not need a gradient gets none.
//  - Every parameter (input with role `parameter`) gets one output "grad:<name>", in input
//    order; a parameter the loss does not depend on gets zeros.
//  - Every gradient has the type (dtype and shape) of the value it is the gradient of, so a
//    bf16 parameter's "grad:<name>" is bf16; fp32 accumulation of it happens outside the
//    graph, in the runtime's fp32 gradient buffer (src/ops/op.h, "Types"). The loss is f32
//    and its gradient starts as f32 1.0.
//  - Gradients of a value used several times are summed in reverse graph order.
#pragma once
#include <string>

#include "ir/graph.h"

namespace autosp {

struct AutodiffOptions {
  std::string loss = "loss";  // the graph output to differentiate; must be f32[]
};

inline const std::string kGradPrefix = "grad:";

Graph autodiff(const Graph& forward, const AutodiffOptions& options = {});

}  // namespace autosp
