#include "passes/checkpoint.h"

#include <algorithm>
#include <cctype>
#include <functional>

#include "ops/op.h"
#include "passes/tile.h"

namespace autosp {

CheckpointPolicy parse_checkpoint_policy(const std::string& text, const std::string& key) {
  if (text == "none") return CheckpointPolicy::none;
  if (text == "full") return CheckpointPolicy::full;
  if (text == "sac") return CheckpointPolicy::sac;
  user_error(key, ": \"", text, "\" is not a checkpoint policy (none, full, sac or auto)");
}

const char* checkpoint_policy_name(CheckpointPolicy policy) {
  switch (policy) {
    case CheckpointPolicy::none: return "none";
    case CheckpointPolicy::full: return "full";
    case CheckpointPolicy::sac: return "sac";
  }
  return "?";
}

namespace {

constexpr int kNoLayer = -1;

// The layer a parameter belongs to: N in "<prefix>.<N>.<rest>" (the first all-digit part of
// a dotted name with something after it), or kNoLayer.
int parameter_layer(const std::string& name) {
  size_t at = 0;
  while (at < name.size()) {
    const size_t dot = name.find('.', at);
    if (dot == std::string::npos) break;
    const std::string part = name.substr(at, dot - at);
    if (!part.empty() && part.size() < 9 && std::all_of(part.begin(), part.end(), ::isdigit) && at > 0)
      return std::stoi(part);
    at = dot + 1;
  }
  return kNoLayer;
}

// Forward nodes: those the graph's non-gradient outputs (the loss) depend on. autodiff put
// them first, so this is a prefix of the node list.
std::vector<bool> forward_nodes(const Graph& g) {
  std::vector<bool> fwd(g.nodes().size(), false);
  std::vector<ValueId> stack;
  for (const GraphOutput& out : g.outputs())
    if (!out.name.starts_with("grad:")) stack.push_back(out.value);
  while (!stack.empty()) {
    const NodeId n = g.value(stack.back()).producer;
    stack.pop_back();
    if (fwd[n]) continue;
    fwd[n] = true;
    for (ValueId in : g.node(n).inputs) stack.push_back(in);
  }
  return fwd;
}

}  // namespace

Graph checkpoint(const Graph& joint, const CheckpointOptions& options) {
  const auto& nodes = joint.nodes();
  const std::vector<bool> fwd = forward_nodes(joint);
  auto tiled = [&](NodeId n) { return fwd[n] && nodes[n].attrs.has(kTileAttribute); };
  bool any_tiled = false;
  for (NodeId n = 0; n < NodeId(nodes.size()); ++n) any_tiled = any_tiled || tiled(n);
  if (options.policy == CheckpointPolicy::none && !any_tiled) return joint;

  // The layer of every forward node.
  std::vector<int> layer(nodes.size(), kNoLayer);
  for (NodeId n = 0; n < NodeId(nodes.size()); ++n) {
    if (!fwd[n] || nodes[n].op == OpKind::input) continue;
    bool reads_parameter = false;
    int from_params = kNoLayer, from_operands = kNoLayer;
    for (ValueId in : nodes[n].inputs) {
      if (joint.is_input(in)) {
        if (joint.role(in) != Role::parameter && joint.role(in) != Role::constant) continue;  // (a frozen weight)
        reads_parameter = true;
        from_params = std::max(from_params, parameter_layer(joint.value(in).name));
      } else {
        from_operands = std::max(from_operands, layer[joint.value(in).producer]);
      }
    }
    // A node reading a parameter outside any layer (final norm, head) is outside them too.
    layer[n] = reads_parameter ? from_params : from_operands;
  }

  // Values kept whatever the policy: those read by a forward node of another layer.
  std::vector<bool> crosses(joint.values().size(), false);
  for (NodeId n = 0; n < NodeId(nodes.size()); ++n) {
    if (!fwd[n]) continue;
    for (ValueId in : nodes[n].inputs)
      if (!joint.is_input(in) && layer[joint.value(in).producer] != layer[n]) crosses[in] = true;
  }
  auto recomputed = [&](NodeId n) {
    if (!fwd[n] || nodes[n].op == OpKind::input) return false;
    for (ValueId out : nodes[n].outputs)
      if (crosses[out]) return false;
    if (tiled(n)) return true;
    if (layer[n] == kNoLayer || options.policy == CheckpointPolicy::none) return false;
    if (options.policy == CheckpointPolicy::full) return true;
    const Recompute r = op_def(nodes[n].op).recompute;
    return r == Recompute::cheap || (r == Recompute::matmul && options.recompute_matmuls);
  };

  Graph g;
  std::vector<ValueId> map(joint.values().size(), -1), copy(joint.values().size(), -1);
  auto emit = [&](const Node& node, std::vector<ValueId> inputs, std::vector<ValueId>& into, bool is_copy) {
    std::vector<TensorType> types;
    for (ValueId out : node.outputs) types.push_back(joint.type(out));
    const NodeId id = g.add_node(node.op, std::move(inputs), node.attrs, types);
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      const ValueId old = node.outputs[i], now = g.node(id).outputs[i];
      Value& v = g.mutable_value(now);
      v.sharding = joint.value(old).sharding;
      v.name = is_copy ? str("recompute:%", old) : joint.value(old).name;
      into[old] = now;
    }
  };
  // The copy of forward value v, emitted (with the copies it needs) on first use.
  std::function<ValueId(ValueId)> materialize = [&](ValueId v) {
    if (copy[v] >= 0) return copy[v];
    const Node& node = joint.node(joint.value(v).producer);
    std::vector<ValueId> inputs;
    for (ValueId in : node.inputs) inputs.push_back(recomputed(joint.value(in).producer) ? materialize(in) : map[in]);
    emit(node, std::move(inputs), copy, true);
    return copy[v];
  };

  for (NodeId n = 0; n < NodeId(nodes.size()); ++n) {
    std::vector<ValueId> inputs;
    for (ValueId in : nodes[n].inputs)
      inputs.push_back(!fwd[n] && recomputed(joint.value(in).producer) ? materialize(in) : map[in]);
    emit(nodes[n], std::move(inputs), map, false);
  }
  for (const GraphOutput& out : joint.outputs()) g.add_output(out.name, map[out.value]);
  return g;
}

}  // namespace autosp
