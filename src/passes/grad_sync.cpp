#include "passes/grad_sync.h"

#include <algorithm>
#include <map>

#include "ops/op.h"
#include "passes/autodiff.h"
#include "util/error.h"

namespace autosp {

namespace {

const std::string kBucketPrefix = "grad_bucket:";

struct Bucket {
  std::vector<size_t> outputs;  // indices into the graph's outputs, in concatenation order
  int64_t elements = 0;
  NodeId last = -1;             // the node that finalises its last gradient
};

}  // namespace

std::string parameter_group(const std::string& name) {
  static const std::string kLayers = "model.layers.";
  if (!name.starts_with(kLayers)) return name;
  const size_t dot = name.find('.', kLayers.size());
  return dot == std::string::npos ? name : name.substr(0, dot);
}

namespace {

// Emits the concat + reduction of one bucket's gradients (flattened views `grads`, in
// order): a reduce_scatter of them padded to W c, or with `whole` (stage 0) an all_reduce.
// Returns the reduced value.
ValueId reduce_bucket(Graph& g, GraphBuilder& b, const std::vector<std::pair<ValueId, std::string>>& grads,
                      int64_t W, size_t k, bool whole) {
  std::vector<ValueId> parts;
  int64_t elements = 0;
  for (const auto& [value, name] : grads) {
    const int64_t n = numel(g.shape(value));
    const ValueId flat = b.emit1(OpKind::reshape, {value}, {{"shape", Shape{n}}});
    g.mutable_value(flat).name = name;
    parts.push_back(flat);
    elements += n;
  }
  const int64_t shard = (elements + W - 1) / W, pad = whole ? 0 : shard * W - elements;
  const DType dtype = g.type(parts[0]).dtype;
  if (pad > 0) {
    Attrs zeros{{"shape", Shape{pad}}, {"value", 0.0}};
    if (dtype != DType::f32) zeros.set("dtype", std::string(dtype_name(dtype)));
    parts.push_back(b.emit1(OpKind::fill, {}, zeros));
  }
  const ValueId all = parts.size() == 1 ? parts[0] : b.emit1(OpKind::concat, parts, {{"dim", int64_t{0}}});
  if (parts.size() > 1) g.mutable_value(all).name = str(kBucketPrefix, k);
  if (whole) return b.emit1(OpKind::all_reduce, {all}, {{"group", std::string("world")}, {"size", W}});
  return b.emit1(OpKind::reduce_scatter, {all}, {{"dim", int64_t{0}}, {"group", std::string("world")}, {"size", W}});
}

struct ParamGroup {
  std::vector<ValueId> params;  // the joint graph's parameter inputs, in input order
  std::vector<int64_t> offsets; // each one's first element in the group, then the total
  int64_t shard = 0;
};

Graph zero3(const Graph& joint, const GradSyncOptions& options) {
  const int64_t W = options.world_size;
  const auto& nodes = joint.nodes();
  const NodeId N = NodeId(nodes.size());

  // Groups, in parameter input order.
  std::vector<ParamGroup> groups;
  std::map<std::string, size_t> group_index;
  std::vector<int> group_of(joint.values().size(), -1), index_in_group(joint.values().size(), -1);
  for (ValueId p : joint.inputs_with_role(Role::parameter)) {
    const std::string key = parameter_group(joint.value(p).name);
    auto [it, fresh] = group_index.emplace(key, groups.size());
    if (fresh) groups.push_back({{}, {0}, 0});
    ParamGroup& grp = groups[it->second];
    group_of[p] = int(it->second);
    index_in_group[p] = int(grp.params.size());
    grp.params.push_back(p);
    grp.offsets.push_back(grp.offsets.back() + numel(joint.shape(p)));
  }
  for (ParamGroup& grp : groups) grp.shard = (grp.offsets.back() + W - 1) / W;

  // Forward nodes: those the outputs other than gradients (the loss; an evaluation graph's
  // logits) depend on. Every other node is backward (recomputation included).
  std::vector<bool> fwd(N, false);
  {
    std::vector<NodeId> stack;
    for (const GraphOutput& out : joint.outputs())
      if (!out.name.starts_with(kGradPrefix)) stack.push_back(joint.value(out.value).producer);
    while (!stack.empty()) {
      const NodeId n = stack.back();
      stack.pop_back();
      if (fwd[n]) continue;
      fwd[n] = true;
      for (ValueId in : nodes[n].inputs) stack.push_back(joint.value(in).producer);
    }
  }
  // First use of each group in forward and in backward; where its gather is issued.
  const size_t G = groups.size();
  std::vector<NodeId> first[2];
  for (auto& f : first) f.assign(G, N);
  for (NodeId n = 0; n < N; ++n) {
    if (nodes[n].op == OpKind::input) continue;
    for (ValueId in : nodes[n].inputs)
      if (group_of[in] >= 0) first[fwd[n] ? 0 : 1][group_of[in]] = std::min(first[fwd[n] ? 0 : 1][group_of[in]], n);
  }
  std::vector<NodeId> trigger[2];
  for (int phase = 0; phase < 2; ++phase) {
    std::vector<size_t> order;
    for (size_t k = 0; k < G; ++k)
      if (first[phase][k] < N) order.push_back(k);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return first[phase][a] < first[phase][b]; });
    trigger[phase].assign(G, N);
    for (size_t i = 0; i < order.size(); ++i) {
      const size_t k = order[i];
      const bool prefetch = i > 0 && groups[k].offsets.back() <= options.prefetch_elements;
      trigger[phase][k] = prefetch ? first[phase][order[i - 1]] : first[phase][k];
    }
  }
  // The node after which each group's gradients are all final.
  std::vector<NodeId> last_grad(G, -1);
  std::vector<std::vector<std::pair<ValueId, std::string>>> grads_of(G);  // (joint value, output name)
  for (size_t k = 0; k < G; ++k) grads_of[k].resize(groups[k].params.size());
  for (const GraphOutput& out : joint.outputs()) {
    if (!out.name.starts_with(kGradPrefix)) continue;
    const ValueId p = joint.find_input(out.name.substr(kGradPrefix.size()));
    AUTOSP_CHECK(p >= 0 && group_of[p] >= 0, "grad_sync: ", out.name, " is not a parameter's gradient");
    grads_of[group_of[p]][index_in_group[p]] = {out.value, out.name};
    last_grad[group_of[p]] = std::max(last_grad[group_of[p]], joint.value(out.value).producer);
  }

  Graph g;
  GraphBuilder b(g);
  std::vector<ValueId> map(joint.values().size(), -1), gathered[2];
  for (auto& v : gathered) v.assign(joint.values().size(), -1);
  std::vector<ValueId> shard_input(G);
  for (size_t k = 0; k < G; ++k)
    shard_input[k] = g.add_input(Role::parameter, {joint.type(groups[k].params[0]).dtype, {groups[k].shard}},
                                 str(kParamShardPrefix, k));
  auto gather = [&](size_t k, int phase) {
    const ParamGroup& grp = groups[k];
    const ValueId all = b.emit1(OpKind::all_gather, {shard_input[k]},
                                {{"dim", int64_t{0}}, {"group", std::string("world")}, {"size", W}});
    g.mutable_value(all).name = str("param_gather:", k);
    const bool whole = grp.params.size() == 1 && grp.shard * W == grp.offsets.back();
    for (size_t i = 0; i < grp.params.size(); ++i) {
      const ValueId p = grp.params[i];
      const ValueId part = whole ? all
                                 : b.emit1(OpKind::slice, {all},
                                           {{"dim", int64_t{0}}, {"start", grp.offsets[i]}, {"end", grp.offsets[i + 1]}});
      const ValueId v = b.emit1(OpKind::reshape, {part}, {{"shape", joint.shape(p)}});
      g.mutable_value(v).name = str(phase == 0 ? "gathered:" : "regathered:", joint.value(p).name);
      gathered[phase][p] = v;
    }
  };
  std::vector<ValueId> shard_out(G, -1);
  for (NodeId n = 0; n < N; ++n) {
    const Node& node = nodes[n];
    if (node.op == OpKind::input && group_of[node.outputs[0]] >= 0) continue;  // replaced by the shards
    for (int phase = 0; phase < 2; ++phase)
      for (size_t k = 0; k < G; ++k)
        if (trigger[phase][k] == n) gather(k, phase);
    std::vector<ValueId> inputs;
    for (ValueId in : node.inputs) {
      const ValueId v = group_of[in] >= 0 ? gathered[fwd[n] ? 0 : 1][in] : map[in];
      AUTOSP_CHECK(v >= 0, "grad_sync: node ", n, " reads %", in, " before it is gathered");
      inputs.push_back(v);
    }
    std::vector<TensorType> types;
    for (ValueId out : node.outputs) types.push_back(joint.type(out));
    const NodeId id = node.op == OpKind::input ? -1 : g.add_node(node.op, std::move(inputs), node.attrs, types);
    if (node.op == OpKind::input) {
      const ValueId in = g.add_input(joint.role(node.outputs[0]), joint.type(node.outputs[0]),
                                     joint.value(node.outputs[0]).name);
      map[node.outputs[0]] = in;
      continue;
    }
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      const ValueId old = node.outputs[i], now = g.node(id).outputs[i];
      g.mutable_value(now).sharding = joint.value(old).sharding;
      g.mutable_value(now).name = joint.value(old).name;
      map[old] = now;
    }
    for (size_t k = 0; k < G; ++k)
      if (last_grad[k] == n) {
        std::vector<std::pair<ValueId, std::string>> grads;
        for (const auto& [v, name] : grads_of[k]) grads.emplace_back(map[v], name);
        shard_out[k] = reduce_bucket(g, b, grads, W, k, false);
      }
  }
  for (const GraphOutput& out : joint.outputs())
    if (!out.name.starts_with(kGradPrefix)) g.add_output(out.name, map[out.value]);
  // A forward-only graph (evaluation) has no gradients to reduce; a training graph has every
  // group's.
  const bool training = std::any_of(joint.outputs().begin(), joint.outputs().end(),
                                    [](const GraphOutput& o) { return o.name.starts_with(kGradPrefix); });
  for (size_t k = 0; training && k < G; ++k) {
    AUTOSP_CHECK(shard_out[k] >= 0, "grad_sync: group ", k, " has no gradients");
    g.add_output(str(kGradShardPrefix, k), shard_out[k]);
  }
  return g;
}

}  // namespace

Graph grad_sync(const Graph& joint, const GradSyncOptions& options) {
  AUTOSP_CHECK(options.zero_stage >= 0 && options.zero_stage <= 3, "grad_sync: ZeRO stage ", options.zero_stage);
  if (options.zero_stage == 3) return zero3(joint, options);
  const bool accumulated = options.zero_stage < 2 && options.accumulated;
  if (options.zero_stage < 2 && !options.reduce) {
    AUTOSP_CHECK(!accumulated, "grad_sync: an accumulated step reduces");
    return joint;
  }
  AUTOSP_CHECK(options.world_size >= 1 && options.bucket_elements >= 1, "grad_sync: world ", options.world_size,
               ", bucket ", options.bucket_elements);
  const int64_t W = options.world_size;
  const bool whole = options.zero_stage == 0;
  // A world of one reduces nothing: with stage 0 each gradient is a bucket of its own, so no
  // concat copies the gradients into a second, model-sized buffer (grad_sync.h).
  const int64_t bucket_elements = W == 1 && whole ? 1 : options.bucket_elements;

  // The gradient outputs in the order they become final (ties: output order).
  std::vector<size_t> grads;
  for (size_t i = 0; i < joint.outputs().size(); ++i)
    if (joint.outputs()[i].name.starts_with(kGradPrefix)) grads.push_back(i);
  auto producer = [&](size_t i) { return joint.value(joint.outputs()[i].value).producer; };
  std::stable_sort(grads.begin(), grads.end(), [&](size_t a, size_t b) { return producer(a) < producer(b); });
  std::vector<Bucket> buckets;
  for (size_t i : grads) {
    const int64_t n = numel(joint.shape(joint.outputs()[i].value));
    if (buckets.empty() || (!buckets.back().outputs.empty() && buckets.back().elements + n > bucket_elements))
      buckets.emplace_back();
    buckets.back().outputs.push_back(i);
    buckets.back().elements += n;
    buckets.back().last = producer(i);
  }

  Graph g;
  GraphBuilder b(g);
  std::vector<ValueId> map(joint.values().size(), -1);
  // Accumulation: each gradient output's input "grad_acc:<name>" (in output order, before
  // every other node), and the sum the bucket reduces in place of the gradient.
  std::vector<ValueId> acc(joint.outputs().size(), -1), total(joint.outputs().size(), -1);
  for (size_t i = 0; accumulated && i < joint.outputs().size(); ++i) {
    const GraphOutput& out = joint.outputs()[i];
    if (out.name.starts_with(kGradPrefix))
      acc[i] = g.add_input(Role::gradient, joint.type(out.value), kGradAccPrefix + out.name.substr(kGradPrefix.size()));
  }
  std::vector<ValueId> reduced(buckets.size(), -1);
  size_t next = 0, next_grad = 0;  // the next bucket to emit (buckets are ordered by `last`), the next add
  for (NodeId n = 0; n < NodeId(joint.nodes().size()); ++n) {
    copy_node(joint, n, g, map);
    for (; accumulated && next_grad < grads.size() && producer(grads[next_grad]) == n; ++next_grad) {
      const size_t i = grads[next_grad];
      const GraphOutput& out = joint.outputs()[i];
      total[i] = b.emit1(OpKind::add, {map[out.value], acc[i]}, {});
      g.mutable_value(total[i]).name = "grad_total:" + out.name.substr(kGradPrefix.size());
    }
    for (; next < buckets.size() && buckets[next].last == n; ++next) {
      std::vector<std::pair<ValueId, std::string>> parts;
      for (size_t i : buckets[next].outputs)
        parts.emplace_back(accumulated ? total[i] : map[joint.outputs()[i].value], joint.outputs()[i].name);
      reduced[next] = reduce_bucket(g, b, parts, W, next, whole);
    }
  }
  AUTOSP_CHECK(next == buckets.size(), "grad_sync: ", buckets.size() - next, " buckets were never emitted");
  for (const GraphOutput& out : joint.outputs())
    if (!out.name.starts_with(kGradPrefix)) g.add_output(out.name, map[out.value]);
  for (size_t k = 0; k < buckets.size(); ++k)
    g.add_output(str(whole ? kGradReducedPrefix : kGradShardPrefix, k), reduced[k]);
  return g;
}

std::vector<GradBucket> read_grad_buckets(const Graph& g) {
  std::vector<GradBucket> buckets;
  for (const GraphOutput& out : g.outputs()) {
    const bool whole = out.name.starts_with(kGradReducedPrefix);
    if (!whole && !out.name.starts_with(kGradShardPrefix)) continue;
    AUTOSP_CHECK(out.name == str(whole ? kGradReducedPrefix : kGradShardPrefix, buckets.size()),
                 "read_grad_buckets: output ", out.name, " out of order");
    const Node& reduce = g.node(g.value(out.value).producer);
    const OpKind op = whole ? OpKind::all_reduce : OpKind::reduce_scatter;
    AUTOSP_CHECK(reduce.op == op, "read_grad_buckets: ", out.name, " is not an ", op_name(op));
    const Node& all = g.node(g.value(reduce.inputs[0]).producer);
    std::vector<ValueId> parts = all.op == OpKind::concat ? all.inputs : std::vector<ValueId>{reduce.inputs[0]};
    GradBucket bucket;
    bucket.shard = numel(g.shape(out.value));
    bucket.whole = whole;
    for (ValueId p : parts) {
      const std::string& name = g.value(p).name;
      if (!name.starts_with(kGradPrefix)) {
        AUTOSP_CHECK(g.node(g.value(p).producer).op == OpKind::fill, "read_grad_buckets: ", out.name,
                     " concatenates a value that is neither a gradient nor padding");
        continue;
      }
      bucket.params.push_back(name.substr(kGradPrefix.size()));
      bucket.numel.push_back(numel(g.shape(p)));
    }
    buckets.push_back(std::move(bucket));
  }
  return buckets;
}

}  // namespace autosp
