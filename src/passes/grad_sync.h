// grad_sync: the reduction of parameter gradients over the whole data x sequence world,
// inside the compiled step, placed as soon as each gradient is final (every ZeRO stage).
//
// Runs on the scheduled joint graph, after checkpoint (so every backward node,
// recomputation included, is in place) and schedule, and before plan_memory (so the planner
// sees the collectives and the lifetimes they give gradients and gathered parameters).
// After schedule, not before it: schedule issues every ready collective first, and would
// move each stage-3 parameter gather (ready from the start) to the front of the step.
//
// Stages 1 and 2 (zero_stage 1 or 2): the graph outputs "grad:<name>" are grouped into
// buckets in the order their gradients become final (the node order of backward: last layer
// first). A bucket takes gradients while its elements stay <= bucket_elements (DeepSpeed's
// reduce_bucket_size); a gradient larger than that is a bucket of its own. Right after the
// node that finalises the bucket's last gradient, the pass emits
//     %f_i = reshape(%grad_i) {shape=[n_i]}           "grad:<name_i>"   (views, no copy)
//     %z   = fill() {shape=[pad], value=0}            (only when pad > 0)
//     %b   = concat(%f_0, ..., %f_k, %z) {dim=0}     "grad_bucket:<k>"  [W c]
//     %s   = reduce_scatter(%b) {dim=0, group="world", size=W}          [c]
// with c = ceil(sum n_i / W) and pad = W c - sum n_i, and the graph output "grad_shard:<k>"
// = %s in place of the bucket's "grad:<name>" outputs. Rank r's shard of bucket k is the
// sum over the world of elements [r c, (r + 1) c) of the bucket's concatenated gradients
// (read_grad_buckets says which parameter elements those are). Gradients are no longer
// graph outputs, so each lives from its production to its bucket's concat, and only the
// 1/W shards stay alive to the end of the step. Stage 1 and stage 2 differ in what the
// trainer keeps between micro batches (train/sharded_adamw.h), not in the graph.
//
// Stage 3 (zero_stage == 3): the parameters themselves are sharded. They are grouped by
// layer (the parameters named "model.layers.N.*" form group "layer N"; every other
// parameter is a group of its own), groups in the order of the graph's parameter inputs,
// a group's parameters in input order. Group k's parameters, concatenated and padded with
// zeros to W c_k elements, are held 1/W per rank: rank r holds elements [r c_k, (r+1) c_k)
// as the graph input "param_shard:<k>" f32[c_k] (role parameter), which replaces the
// parameter inputs. The pass emits
//   forward:  before the first forward node that reads a parameter of group k (a node the
//             loss depends on):
//               %g = all_gather(%shard_k) {dim=0, group="world", size=W}   "param_gather:<k>"
//               %p = reshape(slice(%g) {dim=0, start=o, end=o+n}) {shape}   "gathered:<name>"
//             and forward nodes read %p; the gather of the group used next in forward is
//             issued at the same place (prefetched one group ahead) when it has at most
//             prefetch_elements elements (stage3_prefetch_bucket_size), else at its own
//             first use;
//   backward: the same again before the first backward node (recomputation included) that
//             reads the group ("regathered:<name>"), prefetched one group ahead in backward
//             order, and backward nodes read those;
//   gradients: as stage 2, with group k as bucket k: one concat + reduce_scatter of the
//             group's gradients (same order, same padding) right after its last gradient is
//             final, so "grad_shard:<k>" holds exactly the gradient of "param_shard:<k>".
// A gathered value dies after its last reader (plan_memory frees it): a group's full
// parameters are alive from its gather to its last use in forward, and again in backward.
// A forward-only graph (an evaluation's, whose outputs are logits) gets the forward gathers
// alone, so evaluating never holds more than a layer or two of gathered parameters either.
// Stage 3 ignores bucket_elements (the groups are the buckets).
//
// Stage 0: the same buckets, each all-reduced instead (no padding):
//     %b   = concat(%f_0, ..., %f_k) {dim=0}                            "grad_bucket:<k>"
//     %s   = all_reduce(%b) {group="world", size=W}                     (in place)
// and the graph output "grad_reduced:<k>" = %s, the bucket's gradients summed over the world.
// With W = 1 there is nothing to reduce, and every gradient is a bucket of its own (whatever
// bucket_elements says): no concat, so no second, model-sized copy of the gradients and no
// pass over them (the all_reduce of one rank works in place and moves nothing).
//
// Gradient accumulation (stages 0 and 1, as DeepSpeed and torch DDP's no_sync): the
// gradients of a step's micro batches are summed on each rank and reduced once, by the step
// of the last micro batch. Its graph is made with `accumulated`: per parameter an input
//     %a = input() "grad_acc:<name>" (role gradient, the parameter's type)
// holds the sum of the earlier micro batches' gradients, and right after the node that makes
// a gradient final the pass adds it,
//     %t = add(%grad, %a)                                              "grad_total:<name>"
// so the bucket reduces %t. The earlier micro batches run the graph made without `reduce`:
// the graph unchanged, whose "grad:<name>" outputs the trainer adds up
// (train/trainer.h). Stages 2 and 3 reduce every micro batch (as DeepSpeed's stage 2: the
// 1/W shards are what a rank accumulates) and ignore both options.
//
// Invariants kept:
//  - Every node of the input graph is kept, with its op, attributes, operands, result types,
//    shardings and names, in the same relative order (under stage 3 but the parameter
//    inputs, whose readers read the gathered values instead); the new nodes of a bucket
//    follow the node that finalises its last gradient directly (an accumulation's add
//    follows the node that finalises its gradient).
//  - The graph outputs other than "grad:*" are kept, in order; the "grad_shard:<k>" (stage
//    0: "grad_reduced:<k>") outputs follow, k in bucket order.
//  - Buckets partition the parameters: each "grad:<name>" output is in exactly one bucket.
//  - Every rank builds the same buckets (a function of the graph alone), so the collectives
//    match across the SPMD program.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace autosp {

struct GradSyncOptions {
  int zero_stage = 0;
  // Stages 0 and 1: reduce in the graph (a training step's last micro batch; compile_step
  // sets it). false leaves the graph unchanged, its "grad:<name>" outputs this rank's
  // gradients (the micro batches before the last, and graphs not compiled for training).
  // `accumulated` adds the inputs "grad_acc:<name>" to the gradients before reducing them.
  bool reduce = false;
  bool accumulated = false;
  int64_t world_size = 1;                   // ranks the gradients are reduce-scattered over
  int64_t bucket_elements = 500000000;      // DeepSpeed's reduce_bucket_size default
  int64_t prefetch_elements = 50000000;     // stage 3: stage3_prefetch_bucket_size's default
};

Graph grad_sync(const Graph& joint, const GradSyncOptions& options);

// One bucket of a graph grad_sync rewrote: its parameters in concatenation order (their
// names, without the "grad:" prefix) and element counts, and the shard each rank keeps.
struct GradBucket {
  std::vector<std::string> params;
  std::vector<int64_t> numel;
  int64_t shard = 0;   // c: elements per rank (the bucket's elements padded to W, / W); stage 0: all of them
  bool whole = false;  // stage 0: all-reduced, every rank has the whole bucket ("grad_reduced:<k>")
};

// The buckets of a graph grad_sync rewrote (after any later pass), in the order of their
// "grad_shard:<k>" (or, stage 0, "grad_reduced:<k>") outputs; empty for a graph it left
// unchanged.
std::vector<GradBucket> read_grad_buckets(const Graph& graph);

inline const std::string kGradShardPrefix = "grad_shard:";
inline const std::string kGradReducedPrefix = "grad_reduced:";
inline const std::string kParamShardPrefix = "param_shard:";
inline const std::string kGradAccPrefix = "grad_acc:";

// Stage 3's parameter group of a parameter: "model.layers.N" for "model.layers.N.*", else
// the name itself.
std::string parameter_group(const std::string& name);

}  // namespace autosp
