// Helpers for the memory-planning tests: the tiny Llama of tests/reference compiled for a
// sequence-parallel degree, a random feed for it, the use-count allocator's peak computed
// without running, and an exhaustive check that a plan never overlaps live buffers.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>

#include "models/llama.h"
#include "ops/op.h"
#include "passes/plan_memory.h"
#include "testing/gradcheck.h"

namespace autosp::testing {

// tests/reference/llama_reference.py's model: V 67, H 32, F 48, 2 layers, GQA 4 / 2, D 8.
inline models::LlamaConfig tiny_llama() {
  models::LlamaConfig c;
  c.vocab_size = 67;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  return c;
}

// Tokens, labels (every 10th ignored), positions and seeded parameters for one rank's graph.
inline Feed llama_feed(const Graph& g, uint32_t seed = 11) {
  Feed feed;
  const int64_t n = numel(g.shape(g.find_input("input_ids")));
  const int64_t V = g.shape(g.find_input("model.embed_tokens.weight"))[0];
  for (int64_t i = 0; i < n; ++i) {
    feed.i["input_ids"].push_back(int32_t(i * 7919 % V));
    feed.i["labels"].push_back(i % 10 == 9 ? -100 : int32_t(i * 104729 % V));
    feed.i["position_ids"].push_back(int32_t(i));
  }
  for (ValueId p : g.inputs_with_role(Role::parameter))
    feed.f[g.value(p).name] = random_normal(numel(g.shape(p)), seed++, 0.02f);
  return feed;
}

// The peak the executor's heap mode reaches (the use-count allocator: results allocated
// before their node, freed after their last use, workspaces around the kernel), counted in
// requested bytes as HeapAllocator does, without running anything.
inline int64_t use_count_peak(const Graph& g, int threads, int64_t round = 1) {
  auto bytes = [&](ValueId v) { return (g.type(v).bytes() + round - 1) / round * round; };
  std::vector<ValueId> root(g.values().size());
  std::vector<int> uses(g.values().size(), 0);
  for (const Node& node : g.nodes()) {
    for (ValueId out : node.outputs) root[out] = node.op == OpKind::reshape ? root[node.inputs[0]] : out;
    for (ValueId in : node.inputs) ++uses[root[in]];
  }
  for (const GraphOutput& o : g.outputs()) ++uses[root[o.value]];
  int64_t live = 0, peak = 0;
  for (const Node& node : g.nodes()) {
    if (node.op == OpKind::input) continue;
    auto owned = [&](ValueId r) { return !g.is_input(r); };
    if (node.op != OpKind::reshape) {
      for (ValueId out : node.outputs) live += bytes(out);
      peak = std::max(peak, live + (node_workspace_bytes(g, node, threads) + round - 1) / round * round);
    }
    for (ValueId in : node.inputs)
      if (--uses[root[in]] == 0 && owned(root[in])) live -= bytes(root[in]);
    if (node.op != OpKind::reshape)
      for (ValueId out : node.outputs)
        if (uses[out] == 0) live -= bytes(out);
  }
  return peak;
}

// Exhaustive: for every pair of values whose arena bytes overlap, their lifetimes (from the
// node that writes each to the last node that reads it, past the end for graph outputs) are
// disjoint, unless the two share one buffer (a reshape view and its base) or the later one
// is an in-place result of the node where the earlier one is last read. Every kernel
// workspace is disjoint from every value live at its node. Everything lies in the arena.
inline void expect_no_live_overlap(const Graph& g) {
  const MemoryPlan plan = read_memory_plan(g);
  const auto N = static_cast<NodeId>(g.nodes().size());
  std::vector<NodeId> last(g.values().size(), -1);
  for (NodeId n = 0; n < N; ++n)
    for (ValueId v : g.node(n).inputs) last[v] = std::max(last[v], n);
  for (const GraphOutput& o : g.outputs()) last[o.value] = N;
  std::vector<ValueId> root(g.values().size());
  for (const Node& node : g.nodes())
    for (ValueId out : node.outputs) root[out] = node.op == OpKind::reshape ? root[node.inputs[0]] : out;

  struct Live {
    ValueId v;
    int64_t lo, hi;
    NodeId def, last;
  };
  std::vector<Live> values;
  for (ValueId v = 0; v < static_cast<ValueId>(g.values().size()); ++v) {
    const ValueId r = root[v];
    if (g.is_input(r)) continue;
    const int64_t bytes = g.type(r).bytes();
    if (plan.offsets[r] < 0) {
      EXPECT_EQ(bytes, 0) << "value %" << v << " has no arena offset";
      continue;
    }
    const NodeId def = g.value(v).producer;
    values.push_back({v, plan.offsets[r], plan.offsets[r] + bytes, def, std::max(def, last[v])});
    EXPECT_LE(values.back().hi, plan.arena_bytes) << "value %" << v << " ends past the arena";
  }
  auto in_place = [&](const Live& a, const Live& b) {  // b overwrites a where a dies
    const Node& node = g.node(b.def);
    return a.last == b.def && op_def(node.op).cpu_inplace && a.lo == b.lo && a.hi == b.hi &&
           std::find(node.inputs.begin(), node.inputs.end(), a.v) != node.inputs.end();
  };
  for (size_t i = 0; i < values.size(); ++i)
    for (size_t j = i + 1; j < values.size(); ++j) {
      const Live &a = values[i], &b = values[j];
      if (a.hi <= b.lo || b.hi <= a.lo || a.last < b.def || b.last < a.def) continue;
      if (root[a.v] == root[b.v] || in_place(a, b) || in_place(b, a)) continue;
      ADD_FAILURE() << "%" << a.v << " [" << a.lo << ", " << a.hi << ") live over nodes [" << a.def << ", "
                    << a.last << "] overlaps %" << b.v << " [" << b.lo << ", " << b.hi << ") live over ["
                    << b.def << ", " << b.last << "]";
    }
  for (NodeId n = 0; n < N; ++n) {
    if (plan.workspace_offsets[n] < 0) continue;
    const int64_t lo = plan.workspace_offsets[n], hi = lo + plan.workspace_bytes[n];
    EXPECT_LE(hi, plan.arena_bytes) << "node " << n << "'s workspace ends past the arena";
    for (const Live& a : values)
      if (a.def <= n && n <= a.last && a.lo < hi && lo < a.hi)
        ADD_FAILURE() << "node " << n << "'s workspace [" << lo << ", " << hi << ") overlaps %" << a.v;
  }
}

}  // namespace autosp::testing
