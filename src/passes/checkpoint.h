// checkpoint: which forward activations the backward pass keeps, and which it recomputes.
//
// Runs on the joint graph (after autodiff). A forward value that backward nodes use is
// "saved": it lives from the forward pass to its last backward use, and saved values are
// what fills memory at long context. For each saved value the policy decides:
//   none  keep every saved value (the joint graph unchanged, but for tiled regions);
//   full  keep only values that cross a layer boundary (a layer's input, the residual
//         stream) and those outside layers (embedding, final norm, loss); recompute every
//         other saved value of a layer from its input when that layer's backward needs it;
//   sac   sequence-aware: keep attention results (output and log-sum-exp: O(S^2) FLOPs for
//         O(S) bytes), matmul results and collective results; recompute the linear-cost
//         ops (norms, rope, elementwise, layout); with `recompute_matmuls`, matmul results
//         too (the choice `auto` makes when a budget demands it).
// Tiled regions (passes/tile.h): a forward node with the attribute `tile` is recomputed
// under every policy, matmuls included, unless its result crosses a layer boundary: keeping
// its saved values would keep every tile's, the whole [S, F] that tiling exists to avoid.
// Its copy is emitted before the first backward node of its own tile that reads it, so one
// tile's recomputed values are alive at a time (ALST's TiledMLP keeps only the tile input).
// Layers are found from parameter names: a node that reads a parameter named
// `<prefix>.<N>.<rest>` (Hugging Face's `model.layers.N.`) belongs to layer N; a node that
// reads no parameter belongs to the latest layer among its operands.
//
// Invariants kept:
//  - The forward nodes, their values and ids, and the graph outputs are unchanged; backward
//    nodes keep their relative order.
//  - A recomputed value is a copy of its forward node (same op, attributes and operands,
//    or the operands' own copies), emitted just before the first backward node that reads
//    it; backward nodes read the copy. The copy runs the same kernel on the same inputs,
//    so every number is bitwise what the policy `none` computes.
//  - Copies are named "recompute:%N" after the forward value %N they stand for.
#pragma once
#include <string>

#include "ir/graph.h"

namespace autosp {

enum class CheckpointPolicy { none, full, sac };

struct CheckpointOptions {
  CheckpointPolicy policy = CheckpointPolicy::none;
  bool recompute_matmuls = false;  // sac only
};

// "none" | "full" | "sac"; UserError naming `key` for anything else.
CheckpointPolicy parse_checkpoint_policy(const std::string& text, const std::string& key);
const char* checkpoint_policy_name(CheckpointPolicy policy);

Graph checkpoint(const Graph& joint, const CheckpointOptions& options);

}  // namespace autosp
