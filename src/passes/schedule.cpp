#include "passes/schedule.h"

#include <algorithm>
#include <tuple>

#include "ops/op.h"
#include "passes/plan_memory.h"

namespace autosp {

namespace {

bool is_collective(OpKind op) {
  return op == OpKind::all_to_all || op == OpKind::all_reduce || op == OpKind::all_gather ||
         op == OpKind::reduce_scatter;
}

int64_t aligned(int64_t bytes) { return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

class GreedyScheduler {
 public:
  explicit GreedyScheduler(const Graph& g)
      : g_(g),
        root_(g.values().size()),
        uses_(g.values().size(), 0),
        consumers_(g.values().size()),
        pending_(g.nodes().size(), 0) {
    for (NodeId n = 0; n < static_cast<NodeId>(g.nodes().size()); ++n) {
      const Node& node = g.node(n);
      for (ValueId out : node.outputs) root_[out] = node.op == OpKind::reshape ? root_[node.inputs[0]] : out;
      for (ValueId in : node.inputs) {
        ++uses_[root_[in]];
        consumers_[in].push_back(n);
        ++pending_[n];
      }
    }
    for (const GraphOutput& o : g.outputs()) ++uses_[root_[o.value]];  // kept to the end
  }

  std::vector<NodeId> order() {
    std::vector<NodeId> order, ready;
    for (NodeId n = 0; n < static_cast<NodeId>(g_.nodes().size()); ++n)
      if (g_.node(n).op == OpKind::input) schedule(n, order, ready);
    for (NodeId n = 0; n < static_cast<NodeId>(g_.nodes().size()); ++n)
      if (g_.node(n).op != OpKind::input && g_.node(n).inputs.empty()) ready.push_back(n);  // fill
    while (!ready.empty()) {
      auto key = [&](NodeId n) { return std::make_tuple(!is_collective(g_.node(n).op), added_bytes(n), n); };
      auto best = std::min_element(ready.begin(), ready.end(),
                                   [&](NodeId a, NodeId b) { return key(a) < key(b); });
      const NodeId n = *best;
      ready.erase(best);
      schedule(n, order, ready);
    }
    AUTOSP_CHECK(order.size() == g_.nodes().size(), "schedule: ", g_.nodes().size() - order.size(),
                 " nodes never became ready (the graph is not topologically ordered)");
    return order;
  }

 private:
  // Bytes live after node n runs less bytes live before it (in arena buffers).
  int64_t added_bytes(NodeId n) const {
    const Node& node = g_.node(n);
    int64_t added = 0;
    if (node.op != OpKind::reshape)
      for (ValueId out : node.outputs)
        if (uses_[out] > 0) added += aligned(g_.type(out).bytes());  // an unread result dies at once
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const ValueId r = root_[node.inputs[i]];
      if (g_.is_input(r)) continue;
      bool first = true;
      int here = 0;  // this node's reads of buffer r (it may read one buffer through several values)
      for (size_t j = 0; j < node.inputs.size(); ++j)
        if (root_[node.inputs[j]] == r) {
          first = first && j >= i;
          ++here;
        }
      if (first && here == uses_[r]) added -= aligned(g_.type(r).bytes());
    }
    return added;
  }

  void schedule(NodeId n, std::vector<NodeId>& order, std::vector<NodeId>& ready) {
    order.push_back(n);
    const Node& node = g_.node(n);
    for (ValueId in : node.inputs) --uses_[root_[in]];
    for (ValueId out : node.outputs)
      for (NodeId c : consumers_[out])
        if (--pending_[c] == 0) ready.push_back(c);
  }

  const Graph& g_;
  std::vector<ValueId> root_;               // per value: whose buffer it uses (reshape: a view)
  std::vector<int> uses_;                   // per root: reads not yet scheduled (+1 per graph output)
  std::vector<std::vector<NodeId>> consumers_;  // per value: its readers, once per read
  std::vector<int> pending_;                // per node: operand reads whose producer has not run
};

Graph reorder(const Graph& g, const std::vector<NodeId>& order) {
  Graph out;
  std::vector<ValueId> map(g.values().size(), -1);
  for (NodeId n : order) copy_node(g, n, out, map);
  for (const GraphOutput& o : g.outputs()) out.add_output(o.name, map[o.value]);
  verify_structure(out);
  return out;
}

}  // namespace

Graph schedule(const Graph& g, const ScheduleOptions& options) {
  for (NodeId n = 0; n < static_cast<NodeId>(g.nodes().size()); ++n)
    AUTOSP_CHECK(!g.node(n).attrs.has("mem_offsets"), "schedule: node ", n,
                 " is already memory-planned; schedule runs before plan_memory");
  Graph scheduled = reorder(g, GreedyScheduler(g).order());
  // The input order's arena matters only as far as whether it is above the new order's.
  const PlanMemoryOptions plan{.threads = options.threads, .backend = options.backend};
  const int64_t arena = planned_arena_bytes(scheduled, plan);
  if (arena < planned_arena_bytes(g, plan, arena)) return scheduled;
  return g;
}

}  // namespace autosp
