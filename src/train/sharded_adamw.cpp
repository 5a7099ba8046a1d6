#include "train/sharded_adamw.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "train/adamw.h"
#include "util/error.h"

namespace autosp::train {

int64_t ShardedAdamW::chunk_elements(int64_t shard, int64_t world, int64_t max_round) {
  if (world <= 1) return 0;
  // At least one element per round, so a tiny model still makes progress. A round moves
  // world x chunk < budget elements, so max_round (DeepSpeed's bucket sizes) bounds it.
  const int64_t budget = std::min({shard * world / 8, kMaxScratchFloats, max_round});
  return std::clamp<int64_t>(budget / (world + 1), 1, std::max<int64_t>(shard, 1));
}

ShardedAdamW::ShardedAdamW(const TrainConfig& config, ProcessGroups& groups,
                           const std::vector<models::ParameterSpec>& specs, const std::vector<GradBucket>& buckets)
    : config_(config), groups_(groups), tensors_(specs.size()) {
  int64_t count = 0;
  for (const auto& spec : specs) count += numel(spec.shape);
  AUTOSP_CHECK(!buckets.empty(), "the optimizer needs the compiled step's gradient buckets");
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < specs.size(); ++i) index[specs[i].name] = i;
  const int64_t W = groups.world->size();
  int64_t total = 0, covered = 0;
  for (const GradBucket& b : buckets) {
    AUTOSP_CHECK(b.whole == (config.zero_stage == 0), "ZeRO stage ", config.zero_stage, " with ",
                 b.whole ? "all-reduced" : "reduce-scattered", " gradient buckets");
    std::vector<size_t> params;
    std::vector<int64_t> offsets{0};
    for (size_t j = 0; j < b.params.size(); ++j) {
      const auto it = index.find(b.params[j]);
      AUTOSP_CHECK(it != index.end(), "gradient bucket names an unknown parameter ", b.params[j]);
      AUTOSP_CHECK(numel(specs[it->second].shape) == b.numel[j], "bucket size of ", b.params[j]);
      params.push_back(it->second);
      offsets.push_back(offsets.back() + b.numel[j]);
    }
    const int64_t ranks = b.whole ? 1 : W;
    AUTOSP_CHECK(b.shard * ranks >= offsets.back() && (b.shard - 1) * ranks < offsets.back(), "bucket shard ", b.shard);
    covered += offsets.back();
    total += b.shard;
    bucket_params_.push_back(std::move(params));
    bucket_offsets_.push_back(std::move(offsets));
    bucket_shard_.push_back(b.shard);
    if (config.zero_stage == 0) continue;  // its moments are whole, in ModelState
    if (accumulates()) acc_.emplace_back(b.shard, 0.0f);
    bucket_avg_.emplace_back(b.shard, 0.0f);
    bucket_avg_sq_.emplace_back(b.shard, 0.0f);
    if (config.zero_stage == 3) param_shard_.emplace_back(b.shard, 0.0f);
  }
  AUTOSP_CHECK(covered == count, "gradient buckets cover ", covered, " of ", count, " parameters");
  chunk_ = chunk_elements(total, W, config.zero.allgather_bucket_size);
  // Stages 1 and 2 all-gather the updated parameters; stage 3 gathers them in the step.
  scratch_floats_ = W > 1 && (config.zero_stage == 1 || config.zero_stage == 2) ? (W + 1) * chunk_ : 0;
}

void ShardedAdamW::load(const ModelState& state) {
  AUTOSP_CHECK(state.specs.size() == tensors_, "state of ", state.specs.size(), " tensors for ", tensors_);
  if (config_.zero_stage == 0) return;
  const int64_t r = groups_.world->rank();
  for (size_t k = 0; k < bucket_shard_.size(); ++k) {
    const int64_t begin = r * bucket_shard_[k];
    for_each_piece(bucket_offsets_[k], begin, begin + bucket_shard_[k], [&](size_t i, int64_t e, int64_t at, int64_t len) {
      const size_t t = bucket_params_[k][i];
      state.read(StateKind::exp_avg, t, e, len, bucket_avg_[k].data() + (at - begin));
      state.read(StateKind::exp_avg_sq, t, e, len, bucket_avg_sq_[k].data() + (at - begin));
      if (config_.zero_stage == 3) state.read(StateKind::params, t, e, len, param_shard_[k].data() + (at - begin));
    });
  }
}

ShardLayout ShardedAdamW::layout() const {
  ShardLayout layout;
  if (config_.zero_stage == 0) return layout;
  for (size_t k = 0; k < bucket_shard_.size(); ++k)
    layout.buckets.push_back({bucket_params_[k], bucket_offsets_[k], bucket_shard_[k]});
  return layout;
}

std::vector<const float*> ShardedAdamW::shards(StateKind kind) const {
  const auto& of = kind == StateKind::params ? param_shard_ : kind == StateKind::exp_avg ? bucket_avg_ : bucket_avg_sq_;
  std::vector<const float*> shards;
  for (const auto& s : of) shards.push_back(s.data());
  return shards;  // empty at stage 0, and for the parameters at stages 1 and 2
}

void ShardedAdamW::copy_bucket(size_t k, std::vector<std::vector<float>>& tensors, int64_t at, int64_t len,
                               float* buf, bool to_tensors) const {
  const std::vector<int64_t>& offsets = bucket_offsets_[k];
  if (!to_tensors) {
    const int64_t real = std::clamp<int64_t>(offsets.back() - at, 0, len);
    std::fill(buf + real, buf + len, 0.0f);
  }
  for_each_piece(offsets, at, at + len, [&](size_t i, int64_t e, int64_t pos, int64_t n) {
    float* t = tensors[bucket_params_[k][i]].data() + e;
    float* b = buf + (pos - at);
    if (to_tensors) {
      std::copy_n(b, n, t);
    } else {
      std::copy_n(t, n, b);
    }
  });
}

double ShardedAdamW::step(ModelState& state, double lr, const std::vector<float*>& reduced, float scale) {
  AUTOSP_CHECK(reduced.size() == bucket_shard_.size(), reduced.size(), " reduced buckets for ", bucket_shard_.size());
  const int64_t t = state.step + 1;  // AdamW's 1-based step
  const float inv_dp = 1.0f / float(groups_.dp_size);
  const int W = groups_.world->size();
  // The elements of bucket k this rank updates: all of them (stage 0), or its shard.
  const int64_t r = config_.zero_stage == 0 ? 0 : groups_.world->rank();
  auto for_each_mine = [&](size_t k, auto&& fn) {
    const int64_t begin = r * bucket_shard_[k];
    for_each_piece(bucket_offsets_[k], begin, begin + bucket_shard_[k], [&](size_t i, int64_t e, int64_t at, int64_t len) {
      fn(bucket_params_[k][i], e, at - begin, reduced[k] + (at - begin), len);
    });
  };
  // Mean over the micro batches and the replicas, then the norm; in the old two-step
  // rounding (the micro-batch mean first), so one micro batch and one replica change nothing.
  std::vector<std::pair<float*, int64_t>> spans;
  for (size_t k = 0; k < reduced.size(); ++k)
    for_each_mine(k, [&](size_t, int64_t, int64_t, float* g, int64_t len) {
      for (int64_t j = 0; j < len; ++j) {
        if (scale != 1.0f) g[j] *= scale;
        if (groups_.dp_size > 1) g[j] *= inv_dp;
      }
      spans.emplace_back(g, len);
    });
  // Clipping multiplies every gradient by coef (clip_grad_norm_'s g *= coef); the step applies
  // it as it reads g (adamw_step's grad_scale), the same rounded product without a pass of
  // its own. 1 without clipping (x * 1 is x).
  const std::vector<std::pair<const float*, int64_t>> views(spans.begin(), spans.end());
  double norm;
  if (config_.zero_stage == 0) {  // every rank has every gradient: torch's clip_grad_norm_
    norm = global_grad_norm(views);
  } else {  // the shards' squares, summed over the world
    double sq = global_grad_sum_of_squares(views);
    groups_.world->all_reduce_sum(&sq, 1);
    norm = std::sqrt(sq);
  }
  const float coef = config_.gradient_clipping > 0 ? clip_coefficient(norm, config_.gradient_clipping) : 1.0f;
  for (size_t k = 0; k < reduced.size(); ++k)
    for_each_mine(k, [&](size_t i, int64_t e, int64_t at, float* g, int64_t len) {
      if (config_.zero_stage == 0) {
        adamw_step(state.params[i].data() + e, g, state.exp_avg[i].data() + e, state.exp_avg_sq[i].data() + e, len,
                   config_.optimizer, t, lr, coef);
        return;
      }
      float* param = config_.zero_stage == 3 ? param_shard_[k].data() + at : state.params[i].data() + e;
      adamw_step(param, g, bucket_avg_[k].data() + at, bucket_avg_sq_[k].data() + at, len, config_.optimizer, t, lr,
                 coef);
    });
  // Stages 1 and 2 gather the updated parameters; stage 3's next step gathers each layer's
  // where it needs them.
  if (W > 1 && (config_.zero_stage == 1 || config_.zero_stage == 2)) {
    std::vector<float> scratch(static_cast<size_t>(scratch_floats_));  // freed when the step returns
    float* wide = scratch.data();
    float* narrow = scratch.data() + W * chunk_;
    const int64_t me = groups_.world->rank();
    for (size_t k = 0; k < bucket_shard_.size(); ++k) {
      const int64_t c = bucket_shard_[k];
      for (int64_t j = 0; j < c; j += chunk_) {
        const int64_t len = std::min(chunk_, c - j);
        copy_bucket(k, state.params, me * c + j, len, narrow, false);
        groups_.world->all_gather(narrow, wide, len);
        for (int p = 0; p < W; ++p) copy_bucket(k, state.params, p * c + j, len, wide + p * len, true);
      }
    }
  }
  return norm;
}

std::vector<float*> ShardedAdamW::accumulated() {
  AUTOSP_CHECK(accumulates(), "ZeRO stage ", config_.zero_stage, " accumulates no shards");
  std::vector<float*> out;
  for (auto& a : acc_) out.push_back(a.data());
  return out;
}

}  // namespace autosp::train
