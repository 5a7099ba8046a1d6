// How the model state (parameters, AdamW's exp_avg and exp_avg_sq) is spread over the ranks
// under ZeRO: what the optimizer keeps, and what a checkpoint writes and reads in bounded
// pieces (train/checkpoint.h), so that no rank ever holds the whole state to save or load it.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace autosp::train {

enum class StateKind { params = 0, exp_avg = 1, exp_avg_sq = 2 };
inline constexpr std::array<StateKind, 3> kStateKinds = {StateKind::params, StateKind::exp_avg, StateKind::exp_avg_sq};

// Bucket k concatenates whole parameter tensors (indices into ModelState::specs, in bucket
// order), padded with zeros to world x shard elements; rank r holds bucket positions
// [r shard, (r + 1) shard). Every parameter is in exactly one bucket. ZeRO-1: one bucket of
// every parameter in spec order; ZeRO-2 and 3: the compiled step's buckets
// (passes/grad_sync.h).
struct ShardLayout {
  struct Bucket {
    std::vector<size_t> tensors;
    std::vector<int64_t> offsets;  // each tensor's first position in the bucket, then the bucket's size
    int64_t shard = 0;
  };
  std::vector<Bucket> buckets;
};

// Calls f(i, e, at, len) for each piece of the flat range [lo, hi) inside tensor i: its
// elements [e, e + len) are flat positions [at, at + len). `offsets` holds each tensor's
// first flat position and then the total; positions past the total (padding) are skipped.
template <class F>
void for_each_piece(const std::vector<int64_t>& offsets, int64_t lo, int64_t hi, F&& f) {
  hi = std::min(hi, offsets.back());
  if (lo >= hi) return;
  // The last tensor starting at or before lo (with empty tensors, several start there).
  size_t i = static_cast<size_t>(std::upper_bound(offsets.begin(), offsets.end(), lo) - offsets.begin()) - 1;
  for (int64_t at = lo; at < hi; ++i) {
    const int64_t end = std::min(hi, offsets[i + 1]);
    if (end > at) f(i, at - offsets[i], at, end - at);
    at = std::max(at, end);
  }
}

// This rank's part of the model state, as a checkpoint saves it. Per kind, either `whole`
// (one pointer per parameter tensor: every rank holds them all) or `shards` (this rank's
// shard of each bucket of `layout`).
struct StateShards {
  ShardLayout layout;
  std::array<std::vector<const float*>, 3> whole, shards;
  // Elements per rank in one round of a save: rank 0 receives world x this many at a time.
  int64_t round_elements = 1;
};

}  // namespace autosp::train
