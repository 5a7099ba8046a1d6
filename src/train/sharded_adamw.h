// The optimizer step across ranks: the compiled step has reduced the parameter gradients over
// the whole data x sequence world (passes/grad_sync.h), in buckets; this object scales them
// to the mean, clips them by the global norm and applies AdamW where the step left them.
//
//  ZeRO stage 0: the step all-reduces each bucket ("grad_reduced:<k>"); every rank updates
//                every parameter, with whole moments (ModelState's). This object holds
//                nothing.
//  ZeRO stages 1 and 2: the step reduce-scatters each bucket ("grad_shard:<k>"); rank r
//                keeps shard r of every bucket: elements [r c, (r + 1) c) of the bucket's
//                concatenated gradients. This object holds the AdamW moments of those
//                elements; the step updates this rank's parameter elements, and the
//                parameters are all-gathered bucket by bucket in rounds of at most
//                min(allgather_bucket_size, kMaxScratchFloats, total / 8) elements through a
//                scratch of (W + 1) x round / W floats allocated for the step and freed after
//                it. The stages differ in a step's micro batches: under stage 1 each rank sums
//                their whole gradients (the trainer keeps the sum, as DeepSpeed's stage 1) and
//                the last micro batch's program adds it to its own and reduces once; stage 2
//                reduces every micro batch and the shards add up here (accumulate), so no
//                full-size gradient exists outside the compiled step. Between steps a rank
//                holds the parameters and 2/W (stage 1) or 3/W (stage 2) of the parameter
//                count, plus padding to W per bucket.
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

  // `buckets` is the layout of the compiled step's gradient buckets (read_grad_buckets). The
  // shards start at zero: load() fills them.
  ShardedAdamW(const TrainConfig& config, ProcessGroups& groups, const std::vector<models::ParameterSpec>& specs,
               const std::vector<GradBucket>& buckets);

  // Fills this rank's shards (moments; under stage 3 also the parameters) from `state`: its
  // whole tensors, or what it has stored (a checkpoint: only this rank's elements are read).
  void load(const ModelState& state);

  // For a checkpoint (stages 1-3): how the shards map to the parameters, and this rank's
  // shard of each bucket of `kind` (empty where this object does not shard that kind: the
  // parameters below stage 3, everything at stage 0).
  ShardLayout layout() const;
  std::vector<const float*> shards(StateKind kind) const;

  // What bytes() will be is planned by train::model_state_bytes (train/step_options.h).

  // Stages 2 and 3 with gradient accumulation: the reduced shards of a step's micro batches
  // add up here (accumulate, accumulated). Otherwise step() takes the last program's outputs.
  bool accumulates() const {
    return config_.zero_stage >= 2 && config_.gradient_accumulation_steps.value_or(1) > 1;
  }

  // Stage 3: this rank's shard of parameter group k (the compiled step's "param_shard:<k>"
  // input, updated in place by step()).
  const float* param_shard(size_t k) const { return param_shard_.at(k).data(); }

  // accumulates(): adds one micro batch's reduced shards (shard(k): bucket k's
  // "grad_shard:<k>" output) times `scale` into the accumulation; `first` overwrites it.
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
  // allgather_bucket_size).
  static int64_t chunk_elements(int64_t shard, int64_t world, int64_t max_round = kMaxScratchFloats);

  // One AdamW step from the step's reduced gradients: reduced[k] is this rank's part of
  // bucket k (stage 0: the whole bucket; stages 1-3: its shard), summed over the world and
  // `scale` times the sum over the micro batches (1/g for a sum of g). They are scaled,
  // clipped and applied in place. Updates the parameters (and, under stage 0, the moments in
  // state; under stages 1 and 2 all-gathers the parameters). Returns the global gradient
  // norm before clipping.
  double step(ModelState& state, double lr, const std::vector<float*>& reduced, float scale);
  // accumulates(): the accumulated shards, for step().
  std::vector<float*> accumulated();

  // Bytes this object holds at its peak: the shards (accumulated gradients, moments; stage 3
  // the parameters) plus the scratch each step allocates for its collectives; under stage 0
  // none (the moments live in ModelState).
  int64_t bytes() const {
    int64_t n = scratch_floats_;
    for (const auto& b : acc_) n += static_cast<int64_t>(b.size());
    for (const auto& b : bucket_avg_) n += 2 * static_cast<int64_t>(b.size());  // exp_avg and exp_avg_sq
    for (const auto& b : param_shard_) n += static_cast<int64_t>(b.size());
    return 4 * n;
  }

 private:
  // Copies bucket k's positions [at, at + len) of `tensors` into buf (padding reads
  // as 0) or, with to_tensors, from buf into `tensors`.
  void copy_bucket(size_t k, std::vector<std::vector<float>>& tensors, int64_t at, int64_t len, float* buf,
                   bool to_tensors) const;

  TrainConfig config_;
  ProcessGroups& groups_;
  size_t tensors_ = 0;            // parameter tensors
  int64_t chunk_ = 0;             // this rank's elements per round of a chunked collective
  int64_t scratch_floats_ = 0;    // (W + 1) * chunk_ when W > 1 (stages 1, 2), else 0
  // Per bucket: its parameters (indices into ModelState), their positions in the bucket
  // (prefix sums, then the bucket's elements), the shard c, and this rank's accumulated
  // gradient shard and moment shards.
  std::vector<std::vector<size_t>> bucket_params_;
  std::vector<std::vector<int64_t>> bucket_offsets_;
  std::vector<int64_t> bucket_shard_;
  std::vector<std::vector<float>> acc_, bucket_avg_, bucket_avg_sq_;
  std::vector<std::vector<float>> param_shard_;  // stage 3: the parameters' shards (their master copy)
};

}  // namespace autosp::train
