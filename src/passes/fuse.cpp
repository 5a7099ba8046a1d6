#include "passes/fuse.h"

#include <functional>
#include <map>

#include "util/error.h"

namespace autosp {

namespace {

// Whether forward node f and backward node b make a pair fuse.h describes.
bool is_pair(const Graph& g, NodeId f, NodeId b, const std::vector<int>& reads) {
  const Node& fwd = g.node(f);
  const Node& bwd = g.node(b);
  if (fwd.op != OpKind::linear_cross_entropy || bwd.op != OpKind::linear_cross_entropy_backward) return false;
  const ValueId lse = fwd.outputs[1];
  return bwd.inputs[4] == lse && reads[lse] == 1 && bwd.inputs[1] == fwd.inputs[0] &&
         bwd.inputs[2] == fwd.inputs[1] && bwd.inputs[3] == fwd.inputs[2] && bwd.attrs == fwd.attrs;
}

}  // namespace

Graph fuse(const Graph& g, const FuseOptions& options) {
  if (options.backend != Backend::cpu) return g;
  const NodeId N = NodeId(g.nodes().size());
  // Reads of each value: by nodes, and one for being a graph output.
  std::vector<int> reads(g.values().size(), 0);
  for (const Node& node : g.nodes())
    for (ValueId v : node.inputs) ++reads[v];
  for (const GraphOutput& o : g.outputs()) ++reads[o.value];

  // Whether node n depends on node f (reads one of its results, transitively).
  auto depends_on = [&](NodeId n, NodeId f) {
    std::vector<int8_t> seen(N, 0);
    std::function<bool(NodeId)> visit = [&](NodeId m) {
      if (m == f) return true;
      if (m < f || seen[m]) return false;  // nodes before f cannot read its results
      seen[m] = 1;
      for (ValueId v : g.node(m).inputs)
        if (visit(g.value(v).producer)) return true;
      return false;
    };
    return visit(n);
  };

  std::map<NodeId, NodeId> pair_of;  // forward node -> its backward node
  for (NodeId b = 0; b < N; ++b) {
    if (g.node(b).op != OpKind::linear_cross_entropy_backward) continue;
    const NodeId f = g.value(g.node(b).inputs[4]).producer;
    if (!is_pair(g, f, b, reads)) continue;
    if (depends_on(g.value(g.node(b).inputs[0]).producer, f)) continue;
    pair_of[f] = b;
  }
  if (pair_of.empty()) return g;

  Graph out;
  std::vector<ValueId> map(g.values().size(), -1);
  std::vector<int8_t> emitted(N, 0);
  auto copy = [&](NodeId n) {
    copy_node(g, n, out, map);
    emitted[n] = 1;
  };
  // The nodes `v` depends on that are not emitted yet (all after the forward node: those
  // before it are), in their order.
  auto emit_producers = [&](ValueId v) {
    std::vector<int8_t> wanted(N, 0);
    std::function<void(NodeId)> visit = [&](NodeId p) {
      if (emitted[p] || wanted[p]) return;
      wanted[p] = 1;
      for (ValueId in : g.node(p).inputs) visit(g.value(in).producer);
    };
    visit(g.value(v).producer);
    for (NodeId p = 0; p < N; ++p)
      if (wanted[p]) copy(p);
  };

  for (NodeId n = 0; n < N; ++n) {
    if (emitted[n]) continue;
    const Node& node = g.node(n);
    if (node.op == OpKind::linear_cross_entropy_backward && pair_of.count(g.value(node.inputs[4]).producer)) {
      emitted[n] = 1;  // made by its forward node's fused node
      continue;
    }
    const auto pair = pair_of.find(n);
    if (pair == pair_of.end()) {
      copy(n);
      continue;
    }
    const Node& bwd = g.node(pair->second);
    emit_producers(bwd.inputs[0]);
    const std::vector<ValueId> inputs = {map[node.inputs[0]], map[node.inputs[1]], map[node.inputs[2]],
                                         map[bwd.inputs[0]]};
    const std::vector<TensorType> types = {g.type(node.outputs[0]), g.type(bwd.outputs[0]), g.type(bwd.outputs[1])};
    const NodeId m = out.add_node(OpKind::linear_cross_entropy_with_grad, inputs, node.attrs, types);
    const ValueId results[3] = {node.outputs[0], bwd.outputs[0], bwd.outputs[1]};
    for (int i = 0; i < 3; ++i) {
      const ValueId w = out.node(m).outputs[i];
      map[results[i]] = w;
      out.mutable_value(w).name = g.value(results[i]).name;
      out.mutable_value(w).sharding = g.value(results[i]).sharding;
    }
    emitted[n] = 1;
  }
  for (const GraphOutput& o : g.outputs()) out.add_output(o.name, map[o.value]);
  verify_structure(out);
  return out;
}

}  // namespace autosp
