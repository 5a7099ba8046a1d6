#include "train/grad_sync.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "train/adamw.h"
#include "util/error.h"

namespace autosp::train {

namespace {

// torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied when below 1.
float clip_coef(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0f;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? float(coef) : 1.0f;
}

}  // namespace

int64_t ShardedAdamW::chunk_elements(int64_t shard, int64_t world, int64_t max_round) {
  if (world <= 1) return 0;
  // At least one element per round, so a tiny model still makes progress. A round moves
  // world x chunk < budget elements, so max_round (DeepSpeed's bucket sizes) bounds it.
  const int64_t budget = std::min({shard * world / 8, kMaxScratchFloats, max_round});
  return std::clamp<int64_t>(budget / (world + 1), 1, std::max<int64_t>(shard, 1));
}

int64_t ShardedAdamW::planned_bytes(int64_t num_params, int64_t world, int zero_stage, int64_t max_round) {
  if (zero_stage != 1) return 0;
  const int64_t shard = (num_params + world - 1) / world;
  return 4 * (2 * shard + (world + 1) * chunk_elements(shard, world, max_round));
}

int64_t ShardedAdamW::planned_bytes_stage2(const std::vector<GradBucket>& buckets, int64_t world,
                                           int64_t allgather_bucket_size, int zero_stage) {
  int64_t total = 0;
  for (const GradBucket& b : buckets) total += b.shard;
  // Stage 3 also holds the parameters' shards, and gathers nothing after the step.
  if (zero_stage == 3) return 4 * 4 * total;
  return 4 * (3 * total + (world + 1) * chunk_elements(total, world, allgather_bucket_size));
}

ShardedAdamW::ShardedAdamW(const TrainConfig& config, ProcessGroups& groups,
                           const std::vector<models::ParameterSpec>& specs, const std::vector<GradBucket>& buckets)
    : config_(config), groups_(groups), tensors_(specs.size()) {
  int64_t count = 0;
  for (const auto& spec : specs) count += numel(spec.shape);
  if (config.zero_stage >= 2) {
    AUTOSP_CHECK(!buckets.empty(), "ZeRO stage ", config.zero_stage, " needs the compiled step's gradient buckets");
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < specs.size(); ++i) index[specs[i].name] = i;
    const int64_t W = groups.world->size();
    int64_t total = 0, covered = 0;
    for (const GradBucket& b : buckets) {
      std::vector<size_t> params;
      std::vector<int64_t> offsets{0};
      for (size_t j = 0; j < b.params.size(); ++j) {
        const auto it = index.find(b.params[j]);
        AUTOSP_CHECK(it != index.end(), "gradient bucket names an unknown parameter ", b.params[j]);
        AUTOSP_CHECK(numel(specs[it->second].shape) == b.numel[j], "bucket size of ", b.params[j]);
        params.push_back(it->second);
        offsets.push_back(offsets.back() + b.numel[j]);
      }
      AUTOSP_CHECK(b.shard * W >= offsets.back() && (b.shard - 1) * W < offsets.back(), "bucket shard ", b.shard);
      covered += offsets.back();
      total += b.shard;
      bucket_params_.push_back(std::move(params));
      bucket_offsets_.push_back(std::move(offsets));
      bucket_shard_.push_back(b.shard);
      acc_.emplace_back(b.shard, 0.0f);
      bucket_avg_.emplace_back(b.shard, 0.0f);
      bucket_avg_sq_.emplace_back(b.shard, 0.0f);
      if (config.zero_stage == 3) param_shard_.emplace_back(b.shard, 0.0f);
    }
    AUTOSP_CHECK(covered == count, "gradient buckets cover ", covered, " of ", count, " parameters");
    chunk_ = chunk_elements(total, W, config.zero.allgather_bucket_size);
    scratch_floats_ = W > 1 && config.zero_stage == 2 ? (W + 1) * chunk_ : 0;  // stage 3 gathers in the step
    return;
  }
  if (config.zero_stage != 1) return;
  offsets_.push_back(0);
  for (const auto& spec : specs) offsets_.push_back(offsets_.back() + numel(spec.shape));
  count_ = offsets_.back();
  const int64_t W = groups.world->size();
  shard_ = (count_ + W - 1) / W;
  chunk_ = chunk_elements(shard_, W, std::min(config.zero.reduce_bucket_size, config.zero.allgather_bucket_size));
  scratch_floats_ = (W + 1) * chunk_;
  exp_avg_.assign(shard_, 0.0f);
  exp_avg_sq_.assign(shard_, 0.0f);
}

void ShardedAdamW::load(const ModelState& state) {
  AUTOSP_CHECK(state.specs.size() == tensors_, "state of ", state.specs.size(), " tensors for ", tensors_);
  const int64_t r = groups_.world->rank();
  if (config_.zero_stage >= 2) {
    for (size_t k = 0; k < bucket_shard_.size(); ++k) {
      const int64_t begin = r * bucket_shard_[k];
      for_each_piece(bucket_offsets_[k], begin, begin + bucket_shard_[k], [&](size_t i, int64_t e, int64_t at, int64_t len) {
        const size_t t = bucket_params_[k][i];
        state.read(StateKind::exp_avg, t, e, len, bucket_avg_[k].data() + (at - begin));
        state.read(StateKind::exp_avg_sq, t, e, len, bucket_avg_sq_[k].data() + (at - begin));
        if (config_.zero_stage == 3) state.read(StateKind::params, t, e, len, param_shard_[k].data() + (at - begin));
      });
    }
    return;
  }
  if (config_.zero_stage != 1) return;
  const int64_t begin = r * shard_;
  for_each_piece(offsets_, begin, begin + shard_, [&](size_t i, int64_t e, int64_t at, int64_t len) {
    state.read(StateKind::exp_avg, i, e, len, exp_avg_.data() + (at - begin));
    state.read(StateKind::exp_avg_sq, i, e, len, exp_avg_sq_.data() + (at - begin));
  });
}

ShardLayout ShardedAdamW::layout() const {
  ShardLayout layout;
  if (config_.zero_stage == 1) {
    ShardLayout::Bucket b{{}, offsets_, shard_};
    for (size_t i = 0; i < tensors_; ++i) b.tensors.push_back(i);
    layout.buckets.push_back(std::move(b));
  }
  for (size_t k = 0; k < bucket_shard_.size(); ++k)
    layout.buckets.push_back({bucket_params_[k], bucket_offsets_[k], bucket_shard_[k]});
  return layout;
}

std::vector<const float*> ShardedAdamW::shards(StateKind kind) const {
  if (config_.zero_stage == 1) {
    if (kind == StateKind::params) return {};
    return {kind == StateKind::exp_avg ? exp_avg_.data() : exp_avg_sq_.data()};
  }
  const auto& of = kind == StateKind::params ? param_shard_ : kind == StateKind::exp_avg ? bucket_avg_ : bucket_avg_sq_;
  std::vector<const float*> shards;
  for (const auto& s : of) shards.push_back(s.data());
  return shards;  // empty at stage 0, and for the parameters at stage 2
}

void ShardedAdamW::copy_flat(std::vector<std::vector<float>>& tensors, int64_t at, int64_t len, float* buf,
                             bool to_tensors) const {
  if (!to_tensors) {
    // Padding: the part of [at, at + len) past the last parameter.
    const int64_t real = std::clamp<int64_t>(count_ - at, 0, len);
    std::fill(buf + real, buf + len, 0.0f);
  }
  for_each_piece(offsets_, at, at + len, [&](size_t i, int64_t e, int64_t pos, int64_t n) {
    float* t = tensors[i].data() + e;
    float* b = buf + (pos - at);
    if (to_tensors) {
      std::copy_n(b, n, t);
    } else {
      std::copy_n(t, n, b);
    }
  });
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

// Stage 2: the same per-element operations as stage 1 on this rank's elements of each
// bucket (the sums over ranks were done in the compiled step, per micro batch).
double ShardedAdamW::step_stage2(ModelState& state, double lr) {
  const int64_t t = state.step + 1;
  const float inv_dp = 1.0f / float(groups_.dp_size);
  const int W = groups_.world->size();
  const int64_t r = groups_.world->rank();
  double sq = 0;
  for (size_t k = 0; k < acc_.size(); ++k) {
    const int64_t begin = r * bucket_shard_[k];
    for_each_piece(bucket_offsets_[k], begin, begin + bucket_shard_[k], [&](size_t, int64_t, int64_t at, int64_t len) {
      for (float* g = acc_[k].data() + (at - begin); g != acc_[k].data() + (at - begin) + len; ++g) {
        if (groups_.dp_size > 1) *g *= inv_dp;
        sq += double(*g) * double(*g);
      }
    });
  }
  groups_.world->all_reduce_sum(&sq, 1);
  const double norm = std::sqrt(sq);
  const float coef = clip_coef(norm, config_.gradient_clipping);
  for (size_t k = 0; k < acc_.size(); ++k) {
    const int64_t begin = r * bucket_shard_[k];
    for_each_piece(bucket_offsets_[k], begin, begin + bucket_shard_[k], [&](size_t i, int64_t e, int64_t at, int64_t len) {
      float* g = acc_[k].data() + (at - begin);
      if (config_.gradient_clipping > 0)
        for (int64_t j = 0; j < len; ++j) g[j] *= coef;
      float* param = config_.zero_stage == 3 ? param_shard_[k].data() + (at - begin)
                                             : state.params[bucket_params_[k][i]].data() + e;
      adamw_step(param, g, bucket_avg_[k].data() + (at - begin), bucket_avg_sq_[k].data() + (at - begin), len,
                 config_.optimizer, t, lr);
    });
  }
  // Stage 3: the next step gathers each layer's parameters where it needs them.
  if (W > 1 && config_.zero_stage == 2) {
    std::vector<float> scratch(static_cast<size_t>(scratch_floats_));  // freed when the step returns
    float* wide = scratch.data();
    float* narrow = scratch.data() + W * chunk_;
    for (size_t k = 0; k < acc_.size(); ++k) {
      const int64_t c = bucket_shard_[k];
      for (int64_t j = 0; j < c; j += chunk_) {
        const int64_t len = std::min(chunk_, c - j);
        copy_bucket(k, state.params, r * c + j, len, narrow, false);
        groups_.world->all_gather(narrow, wide, len);
        for (int p = 0; p < W; ++p) copy_bucket(k, state.params, p * c + j, len, wide + p * len, true);
      }
    }
  }
  return norm;
}

double ShardedAdamW::step(ModelState& state, std::vector<std::vector<float>>& grads, double lr) {
  if (config_.zero_stage >= 2) return step_stage2(state, lr);
  const int64_t t = state.step + 1;  // AdamW's 1-based step
  const float inv_dp = 1.0f / float(groups_.dp_size);
  if (config_.zero_stage == 0) {
    std::vector<std::pair<float*, int64_t>> spans;
    for (auto& d : grads) {
      groups_.world->all_reduce_sum(d.data(), static_cast<int64_t>(d.size()));
      if (groups_.dp_size > 1)
        for (float& x : d) x *= inv_dp;
      spans.emplace_back(d.data(), static_cast<int64_t>(d.size()));
    }
    double norm;
    if (config_.gradient_clipping > 0) {
      norm = clip_grad_norm(spans, config_.gradient_clipping);
    } else {
      std::vector<std::pair<const float*, int64_t>> c(spans.begin(), spans.end());
      norm = global_grad_norm(c);
    }
    for (size_t i = 0; i < grads.size(); ++i)
      adamw_step(state.params[i].data(), grads[i].data(), state.exp_avg[i].data(), state.exp_avg_sq[i].data(),
                 static_cast<int64_t>(grads[i].size()), config_.optimizer, t, lr);
    return norm;
  }

  // Stage 1. Rank r owns flat positions [begin, begin + shard_). Round k of a collective
  // moves positions [p * shard_ + k, + len) of every rank p, so all ranks agree on len.
  const int W = groups_.world->size();
  const int64_t begin = groups_.world->rank() * shard_;
  std::vector<float> scratch(static_cast<size_t>(scratch_floats_));  // freed when the step returns
  float* wide = scratch.data();                 // W x chunk_: one piece per rank
  float* narrow = scratch.data() + W * chunk_;  // chunk_: this rank's piece
  if (W > 1) {
    // Reduce-scatter; the sums land in grads at this rank's positions. A round reads only
    // positions that no earlier round wrote.
    for (int64_t k = 0; k < shard_; k += chunk_) {
      const int64_t len = std::min(chunk_, shard_ - k);
      for (int p = 0; p < W; ++p) copy_flat(grads, p * shard_ + k, len, wide + p * len, false);
      groups_.world->reduce_scatter_sum(wide, narrow, len);
      copy_flat(grads, begin + k, len, narrow, true);
    }
  }
  // This rank's shard, in flat order: the same operations, element by element and in the
  // same order, as on one contiguous shard (padding contributes 0 to the sum of squares).
  double sq = 0;
  for_each_piece(offsets_, begin, begin + shard_, [&](size_t i, int64_t e, int64_t, int64_t len) {
    for (float* g = grads[i].data() + e; g != grads[i].data() + e + len; ++g) {
      if (groups_.dp_size > 1) *g *= inv_dp;
      sq += double(*g) * double(*g);
    }
  });
  groups_.world->all_reduce_sum(&sq, 1);
  const double norm = std::sqrt(sq);
  const float coef = clip_coef(norm, config_.gradient_clipping);
  for_each_piece(offsets_, begin, begin + shard_, [&](size_t i, int64_t e, int64_t at, int64_t len) {
    float* g = grads[i].data() + e;
    if (config_.gradient_clipping > 0)
      for (int64_t j = 0; j < len; ++j) g[j] *= coef;
    adamw_step(state.params[i].data() + e, g, exp_avg_.data() + (at - begin), exp_avg_sq_.data() + (at - begin),
               len, config_.optimizer, t, lr);
  });
  if (W > 1) {
    for (int64_t k = 0; k < shard_; k += chunk_) {
      const int64_t len = std::min(chunk_, shard_ - k);
      copy_flat(state.params, begin + k, len, narrow, false);
      groups_.world->all_gather(narrow, wide, len);
      for (int p = 0; p < W; ++p) copy_flat(state.params, p * shard_ + k, len, wide + p * len, true);
    }
  }
  return norm;
}

}  // namespace autosp::train
