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
// ever allocated here (gather_moments fills full-size moments into ModelState, for a
// checkpoint, and the caller frees them). The scratch is (W + 1) x chunk floats, where
// chunk is this rank's elements per round: at most min(total / 8, kMaxScratchFloats,
// reduce_bucket_size, allgather_bucket_size) floats in all (total padded to W; but at least one element per rank and round, which only a
// model of under 8 (W + 1) parameters exceeds), so it stays a small fraction of the model
// and a step takes about 8 (W + 1) / W rounds per collective until the 4 MiB cap binds; at
// W = 1 there are no collectives and no scratch.
//
// Scaling: the sequence ranks of one replica hold parts of one loss (their gradients add
// up); data-parallel replicas average, as DeepSpeed does. So grad = (sum over the world) / D.
#pragma once
#include <vector>

#include "comm/communicator.h"
#include "train/config.h"
#include "train/trainer.h"

namespace autosp::train {

class ShardedAdamW {
 public:
  // 4 MiB of fp32 scratch at most: large enough that a round's message to each peer
  // (4 MiB / (W + 1)) is well past where MPI reaches its bandwidth for the W of a CPU
  // cluster, small next to any model worth sharding.
  static constexpr int64_t kMaxScratchFloats = int64_t{1} << 20;

  ShardedAdamW(const TrainConfig& config, ProcessGroups& groups, const ModelState& state);

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
  // only this rank's shard positions end up reduced). Updates state.params (and, under
  // stage 0, the moments in state). Returns the global gradient norm before clipping.
  double step(ModelState& state, std::vector<std::vector<float>>& grads, double lr);

  // Under stage 1 the moments live here, sharded; this gathers them into `state` (a
  // collective: every rank calls it) so a checkpoint can be written.
  void gather_moments(ModelState& state);

  // Bytes this object holds at its peak: under stage 1 the moment shards plus the scratch
  // each step allocates for its collectives; under stage 0 none (the moments live in
  // ModelState).
  int64_t bytes() const {
    return 4 * static_cast<int64_t>(exp_avg_.size() + exp_avg_sq_.size() + scratch_floats_);
  }

 private:
  // Copies flat positions [at, at + len) of `tensors` into buf (positions past the
  // parameters, the padding, read as 0) or, with to_tensors, from buf into `tensors`
  // (padding positions are dropped).
  void copy_flat(std::vector<std::vector<float>>& tensors, int64_t at, int64_t len, float* buf,
                 bool to_tensors) const;

  TrainConfig config_;
  ProcessGroups& groups_;
  std::vector<int64_t> offsets_;  // flat position of each parameter tensor, then the count
  int64_t count_ = 0;             // parameters in all (flattened, unpadded)
  int64_t shard_ = 0;             // flattened elements per rank (count_ padded to W, / W)
  int64_t chunk_ = 0;             // this rank's elements per round of a chunked collective
  int64_t scratch_floats_ = 0;    // (W + 1) * chunk_ when W > 1, else 0
  std::vector<float> exp_avg_, exp_avg_sq_;  // stage 1: this rank's shard
};

}  // namespace autosp::train
