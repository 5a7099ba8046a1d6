#include "train/grad_sync.h"

#include <cmath>

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

ShardedAdamW::ShardedAdamW(const TrainConfig& config, ProcessGroups& groups, const ModelState& state)
    : config_(config), groups_(groups) {
  if (config.zero_stage != 1) return;
  int64_t n = 0;
  for (const auto& p : state.params) n += static_cast<int64_t>(p.size());
  const int64_t W = groups.world->size();
  shard_ = (n + W - 1) / W;
  total_ = shard_ * W;
  flat_.assign(total_, 0.0f);
  flat_grads_.assign(total_, 0.0f);
  grad_shard_.assign(shard_, 0.0f);
  // This rank's slice of the (possibly resumed) moments.
  exp_avg_.assign(shard_, 0.0f);
  exp_avg_sq_.assign(shard_, 0.0f);
  const int64_t begin = groups.world->rank() * shard_;
  int64_t offset = 0;
  for (size_t i = 0; i < state.params.size(); ++i) {
    const auto len = static_cast<int64_t>(state.params[i].size());
    for (int64_t e = 0; e < len; ++e) {
      const int64_t at = offset + e - begin;
      if (at < 0 || at >= shard_) continue;
      exp_avg_[at] = state.exp_avg[i][e];
      exp_avg_sq_[at] = state.exp_avg_sq[i][e];
    }
    offset += len;
  }
}

double ShardedAdamW::step(ModelState& state, std::vector<std::vector<float>>& grads, double lr) {
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

  // Stage 1: flatten, reduce-scatter, update this rank's shard, all-gather.
  int64_t offset = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    std::copy(grads[i].begin(), grads[i].end(), flat_grads_.begin() + offset);
    std::copy(state.params[i].begin(), state.params[i].end(), flat_.begin() + offset);
    offset += static_cast<int64_t>(grads[i].size());
  }
  groups_.world->reduce_scatter_sum(flat_grads_.data(), grad_shard_.data(), shard_);
  double sq = 0;
  for (float& g : grad_shard_) {
    if (groups_.dp_size > 1) g *= inv_dp;
    sq += double(g) * double(g);
  }
  groups_.world->all_reduce_sum(&sq, 1);
  const double norm = std::sqrt(sq);
  const float coef = clip_coef(norm, config_.gradient_clipping);
  if (config_.gradient_clipping > 0)
    for (float& g : grad_shard_) g *= coef;
  float* my_params = flat_.data() + groups_.world->rank() * shard_;
  adamw_step(my_params, grad_shard_.data(), exp_avg_.data(), exp_avg_sq_.data(), shard_, config_.optimizer, t, lr);
  std::vector<float> mine(my_params, my_params + shard_);
  groups_.world->all_gather(mine.data(), flat_.data(), shard_);
  offset = 0;
  for (auto& p : state.params) {
    std::copy(flat_.begin() + offset, flat_.begin() + offset + static_cast<int64_t>(p.size()), p.begin());
    offset += static_cast<int64_t>(p.size());
  }
  return norm;
}

void ShardedAdamW::gather_moments(ModelState& state) {
  if (config_.zero_stage != 1) return;
  for (auto [shard, full] : {std::pair{&exp_avg_, &state.exp_avg}, std::pair{&exp_avg_sq_, &state.exp_avg_sq}}) {
    groups_.world->all_gather(shard->data(), flat_.data(), shard_);
    full->resize(state.params.size());
    int64_t offset = 0;
    for (size_t i = 0; i < state.params.size(); ++i) {
      const auto len = static_cast<int64_t>(state.params[i].size());
      (*full)[i].assign(flat_.begin() + offset, flat_.begin() + offset + len);
      offset += len;
    }
  }
}

}  // namespace autosp::train
