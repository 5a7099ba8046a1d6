// The optimizer step across ranks: reduce every rank's partial parameter gradients over
// the whole data x sequence world, clip by the global norm, and apply AdamW.
//
//  ZeRO stage 0: all-reduce the gradients; every rank updates every parameter.
//  ZeRO stage 1: rank w owns 1/W of the flattened parameters (the concatenation of all
//                parameter tensors, padded with zeros to a multiple of W) and their AdamW
//                state. The gradients are reduce-scattered, rank w updates its shard, and
//                the parameters are all-gathered. The global norm sums the shards' squares
//                over the world.
//
// Memory (stage 1): between steps this object holds only the two moment shards (2/W of
// the parameter count). The collectives run in rounds over the flattened space through a
// scratch buffer allocated for the step and freed after it; the reduced gradient shard is
// written back into the gradient vectors at this rank's positions, so nothing full-size is
// ever allocated here (a checkpoint streams the shards to rank 0 in bounded rounds,
// train/checkpoint.h). The scratch is (W + 1) x chunk floats, where
// chunk is this rank's elements per round: at most min(total / 8, kMaxScratchFloats,
// reduce_bucket_size, allgather_bucket_size) floats in all (total padded to W; but at least one element per rank and round, which only a
// model of under 8 (W + 1) parameters exceeds), so it stays a small fraction of the model
// and a step takes about 8 (W + 1) / W rounds per collective until the 4 MiB cap binds; at
// W = 1 there are no collectives and no scratch.
//
//  ZeRO stage 2: the compiled step reduce-scatters each micro batch's gradients in buckets
//                (passes/grad_sync.h); rank r keeps shard r of every bucket: elements
//                [r c, (r + 1) c) of the bucket's concatenated gradients. This object holds,
//                per bucket, the accumulation of those shards over the micro batches
//                (accumulate) and the AdamW moments of the same elements; the step scales,
//                clips and updates this rank's parameter elements, and the parameters are
//                all-gathered bucket by bucket in rounds of at most
//                min(allgather_bucket_size, kMaxScratchFloats, total / 8) elements through a
//                scratch of (W + 1) x round / W floats allocated for the step. No full-size
//                gradient exists outside the compiled step: between micro batches and steps
//                a rank holds 3/W of the parameter count (plus padding to W per bucket) and
//                the parameters themselves.
//
//  ZeRO stage 3: as stage 2, with the buckets the compiled step's parameter groups
//                (passes/grad_sync.h): this object also holds rank r's shard of every
//                group's parameters (bound as the step's "param_shard:<k>" inputs); the
//                step updates them in place and gathers nothing (the next step gathers each
//                group where it needs it). Between steps a rank holds 4/W of the parameter
//                count (plus padding): parameters, accumulated gradients, two moments.
//
// Scaling: the sequence ranks of one replica hold parts of one loss (their gradients add
// up); data-parallel replicas average, as DeepSpeed does. So grad = (sum over the world) / D.
#pragma once
#include <vector>

#include "comm/communicator.h"
#include "passes/grad_sync.h"
#include "train/config.h"
#include "train/trainer.h"

namespace autosp::train {

class ShardedAdamW {
 public:
  // 4 MiB of fp32 scratch at most: large enough that a round's message to each peer
  // (4 MiB / (W + 1)) is well past where MPI reaches its bandwidth for the W of a CPU
  // cluster, small next to any model worth sharding.
  static constexpr int64_t kMaxScratchFloats = int64_t{1} << 20;

  // Under stages 2 and 3, `buckets` is the layout of the compiled step's gradient buckets
  // (read_grad_buckets); other stages ignore it. The shards start at zero: load() fills them.
  ShardedAdamW(const TrainConfig& config, ProcessGroups& groups, const std::vector<models::ParameterSpec>& specs,
               const std::vector<GradBucket>& buckets = {});

  // Fills this rank's shards (moments; under stage 3 also the parameters) from `state`: its
  // whole tensors, or what it has stored (a checkpoint: only this rank's elements are read).
  void load(const ModelState& state);

  // For a checkpoint (stages 1-3): how the shards map to the parameters, and this rank's
  // shard of each bucket of `kind` (empty where this object does not shard that kind: the
  // parameters below stage 3, everything at stage 0).
  ShardLayout layout() const;
  std::vector<const float*> shards(StateKind kind) const;

  // What bytes() will be under stage 2 for these buckets on `world` ranks.
  static int64_t planned_bytes_stage2(const std::vector<GradBucket>& buckets, int64_t world,
                                      int64_t allgather_bucket_size, int zero_stage = 2);

  // Stage 3: this rank's shard of parameter group k (the compiled step's "param_shard:<k>"
  // input, updated in place by step()).
  const float* param_shard(size_t k) const { return param_shard_.at(k).data(); }

  // Stage 2: adds one micro batch's reduced shards (shard(k): bucket k's "grad_shard:<k>"
  // output) times `scale` into the accumulation; `first` overwrites it instead.
  template <class ShardOf>
  void accumulate(ShardOf&& shard, float scale, bool first) {
    for (size_t k = 0; k < acc_.size(); ++k) {
      const float* d = shard(k);
      float* acc = acc_[k].data();
      const auto n = static_cast<int64_t>(acc_[k].size());
      if (first) {
        for (int64_t e = 0; e < n; ++e) acc[e] = scale == 1.0f ? d[e] : d[e] * scale;
      } else {
        for (int64_t e = 0; e < n; ++e) acc[e] += d[e] * scale;
      }
    }
  }

  // This rank's elements per round of a chunked collective over `world` ranks for a shard
  // of `shard` elements (0 at world 1: no collectives, no scratch).
  // A round moves fewer than max_round elements in all (zero_optimization's
  // reduce_bucket_size and allgather_bucket_size, the smaller of the two).
  static int64_t chunk_elements(int64_t shard, int64_t world, int64_t max_round = kMaxScratchFloats);
  // What bytes() will be for `num_params` parameters on `world` ranks at `zero_stage`, for
  // planning without building one.
  static int64_t planned_bytes(int64_t num_params, int64_t world, int zero_stage,
                               int64_t max_round = kMaxScratchFloats);

  // grads: this rank's partial gradients (one per parameter), overwritten (under stage 1
  // only this rank's shard positions end up reduced; under stage 2 unused: the
  // accumulated shards are the gradients). Updates state.params (and, under stage 0, the
  // moments in state). Returns the global gradient norm before clipping.
  double step(ModelState& state, std::vector<std::vector<float>>& grads, double lr);

  // Bytes this object holds at its peak: under stage 1 the moment shards plus the scratch
  // each step allocates for its collectives; under stage 0 none (the moments live in
  // ModelState).
  int64_t bytes() const {
    int64_t n = static_cast<int64_t>(exp_avg_.size() + exp_avg_sq_.size()) + scratch_floats_;
    for (const auto& b : acc_) n += static_cast<int64_t>(b.size());
    for (const auto& b : bucket_avg_) n += 2 * static_cast<int64_t>(b.size());  // exp_avg and exp_avg_sq
    for (const auto& b : param_shard_) n += static_cast<int64_t>(b.size());
    return 4 * n;
  }

 private:
  // Copies flat positions [at, at + len) of `tensors` into buf (positions past the
  // parameters, the padding, read as 0) or, with to_tensors, from buf into `tensors`
  // (padding positions are dropped).
  void copy_flat(std::vector<std::vector<float>>& tensors, int64_t at, int64_t len, float* buf,
                 bool to_tensors) const;

  double step_stage2(ModelState& state, double lr);
  // Stage 2: copies bucket k's positions [at, at + len) of `tensors` into buf (padding reads
  // as 0) or, with to_tensors, from buf into `tensors`.
  void copy_bucket(size_t k, std::vector<std::vector<float>>& tensors, int64_t at, int64_t len, float* buf,
                   bool to_tensors) const;

  TrainConfig config_;
  ProcessGroups& groups_;
  std::vector<int64_t> offsets_;  // flat position of each parameter tensor, then the count
  size_t tensors_ = 0;            // parameter tensors
  int64_t count_ = 0;             // parameters in all (flattened, unpadded)
  int64_t shard_ = 0;             // flattened elements per rank (count_ padded to W, / W)
  int64_t chunk_ = 0;             // this rank's elements per round of a chunked collective
  int64_t scratch_floats_ = 0;    // (W + 1) * chunk_ when W > 1, else 0
  std::vector<float> exp_avg_, exp_avg_sq_;  // stage 1: this rank's shard
  // Stage 2, per bucket: its parameters (indices into ModelState), their positions in the
  // bucket (prefix sums, then the bucket's elements), the shard c, and this rank's
  // accumulated gradient shard and moment shards.
  std::vector<std::vector<size_t>> bucket_params_;
  std::vector<std::vector<int64_t>> bucket_offsets_;
  std::vector<int64_t> bucket_shard_;
  std::vector<std::vector<float>> acc_, bucket_avg_, bucket_avg_sq_;
  std::vector<std::vector<float>> param_shard_;  // stage 3: the parameters' shards (their master copy)
};

}  // namespace autosp::train
