// The optimizer step across ranks: reduce every rank's partial parameter gradients over
// the whole data x sequence world, clip by the global norm, and apply AdamW.
//
//  ZeRO stage 0: all-reduce the gradients; every rank updates every parameter.
//  ZeRO stage 1: reduce-scatter the flattened gradients; rank w owns 1/W of the flattened
//                parameters and their AdamW state, updates that shard, and all-gathers the
//                parameters. The global norm sums the shards' squares over the world.
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
  ShardedAdamW(const TrainConfig& config, ProcessGroups& groups, const ModelState& state);

  // grads: this rank's partial gradients (one per parameter), overwritten. Updates
  // state.params (and, under stage 0, the moments in state). Returns the global gradient
  // norm before clipping.
  double step(ModelState& state, std::vector<std::vector<float>>& grads, double lr);

  // Under stage 1 the moments live here, sharded; this gathers them into `state` (a
  // collective: every rank calls it) so a checkpoint can be written.
  void gather_moments(ModelState& state);

  // Bytes this object holds (stage 1: the moment shards and flat scratch; stage 0: none,
  // the moments live in ModelState).
  int64_t bytes() const {
    return 4 * static_cast<int64_t>(flat_.size() + flat_grads_.size() + exp_avg_.size() + exp_avg_sq_.size() +
                                    grad_shard_.size());
  }

 private:
  TrainConfig config_;
  ProcessGroups& groups_;
  int64_t total_ = 0, shard_ = 0;          // flattened element counts (total padded to W)
  std::vector<float> flat_, flat_grads_;   // stage 1 scratch
  std::vector<float> exp_avg_, exp_avg_sq_, grad_shard_;  // stage 1: this rank's shard
};

}  // namespace autosp::train
