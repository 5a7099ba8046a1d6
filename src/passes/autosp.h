// autosp: the single-device forward graph -> one rank's sequence-parallel forward graph
// (DeepSpeed-Ulysses), for a sequence-parallel group of P ranks. The program is the same on
// every rank (SPMD); ranks differ only in the slice of the sequence they are fed.
//
// Invariants kept (DESIGN.md "Sequence parallelism"):
//  1. Sequence inputs (roles tokens, labels, positions, mask: [B, S, ...]) become
//     [B, S_local, ...] with S_local = ceil(S / P), @shard(1); rank r holds positions
//     [r * S_local, (r + 1) * S_local) of the sequence padded to P * S_local (see
//     SequenceSplit). Labels are aligned to inputs before the split (the data loader's
//     labels[i] is the token after inputs[i]), so no target crosses a chunk boundary.
//     Parameters and constants stay whole, @replicated.
//  2. Every other value's sharding comes from its op's rule (OpDef::shard); a value is
//     @shard(dim), @replicated or @partial (this rank's part of a sum over the group).
//  3. Before each attention, one all_to_all per q, k and v turns @shard(1) (sequence) into
//     @shard(2) (heads); after it, one all_to_all turns the output back. With fewer KV
//     heads than P (P % NKV == 0), KV heads are repeated to P so every rank holds the KV
//     heads its query heads use. RoPE runs before the exchange, on global positions.
//  4. The loss divisor (count_valid, @partial) is all-reduced over the group, so the loss
//     is (sum of this rank's token losses) / (global count of labelled tokens), @partial:
//     the group's losses sum to the single-device loss. Padding (label -100, at the end of
//     the sequence, after every real token, so causal attention never sees it from a real
//     query) therefore changes nothing.
//  5. The load-balancing statistics of a mixture-of-experts model (moe_balance: expert counts
//     and probability sums over the rows, @partial) are all-reduced over the group, so the
//     load-balancing loss is the single-device one, @replicated; added to the @partial loss,
//     each rank adds 1/P of it. It needs S to be a multiple of P (padding would count).
//  6. No other collective is inserted in the forward graph; autodiff turns each collective
//     into its inverse, and parameter gradients come out @partial, to be summed by grad_sync.
// P = 1 returns the graph unchanged.
#pragma once
#include <cstdint>
#include <vector>

#include "ir/graph.h"

namespace autosp {

struct AutospOptions {
  int64_t sp_size = 1;
};

// How a sequence of length S is split over P ranks.
struct SequenceSplit {
  int64_t global = 0;  // S
  int64_t local = 0;   // ceil(S / P), each rank's length
  int64_t padded = 0;  // P * local >= S
  int64_t begin(int64_t rank) const { return rank * local; }
};
SequenceSplit split_sequence(int64_t S, int64_t P);

Graph autosp(const Graph& forward, const AutospOptions& options);

// The batch of one micro step, [B, S] each, row-major: what the graph's sequence inputs
// (roles tokens, labels, positions, documents) are fed. document_ids may be empty (a graph
// without documents).
struct SequenceBatch {
  int64_t B = 0, S = 0;
  std::vector<int32_t> input_ids, labels, position_ids, document_ids;
};

// The counterpart of DeepSpeed's prepare_autosp_inputs: this rank's slice [B, S_local] of
// a full batch, as the autosp graph expects it. Every rank of an SP group gets the same
// full batch; rank r keeps positions [r * S_local, (r + 1) * S_local). Positions past S are
// padding: token 0, label -100 (ignored), position ids continuing (so RoPE sees global
// positions everywhere), and a document of its own (the last real id + 1), so that no real
// query sees it whatever the attention's mask.
SequenceBatch prepare_autosp_inputs(const SequenceBatch& full, int64_t sp_rank, int64_t sp_size);

}  // namespace autosp
