#include "passes/autosp.h"

#include <algorithm>
#include <map>

#include "ops/op.h"

namespace autosp {

SequenceSplit split_sequence(int64_t S, int64_t P) {
  AUTOSP_CHECK(S > 0 && P > 0, "S=", S, " P=", P);
  const int64_t local = (S + P - 1) / P;
  return {S, local, local * P};
}

namespace {

bool is_sequence_role(Role r) {
  return r == Role::tokens || r == Role::labels || r == Role::positions || r == Role::mask ||
         r == Role::documents;
}

class AutospPass {
 public:
  AutospPass(const Graph& forward, int64_t P) : fwd_(forward), P_(P), b_(g_), map_(forward.values().size(), -1) {}

  Graph run() {
    find_sequence_length();
    for (NodeId n = 0; n < static_cast<NodeId>(fwd_.nodes().size()); ++n) {
      const Node& node = fwd_.node(n);
      if (node.op == OpKind::input) add_input(node);
      else if (node.op == OpKind::attention) add_attention(n, node);
      else add_op(n, node);
    }
    for (const GraphOutput& o : fwd_.outputs()) g_.add_output(o.name, map_[o.value]);
    verify(g_);
    return std::move(g_);
  }

 private:
  void find_sequence_length() {
    for (ValueId v : fwd_.inputs()) {
      if (!is_sequence_role(fwd_.role(v))) continue;
      const Shape& s = fwd_.shape(v);
      if (s.size() < 2)
        user_error("autosp: sequence input '", fwd_.value(v).name, "' must be [B, S, ...], got ", shape_str(s));
      if (split_.global && s[1] != split_.global)
        user_error("autosp: sequence inputs disagree on S (", split_.global, " vs ", s[1], " for '",
                   fwd_.value(v).name, "')");
      split_ = split_sequence(s[1], P_);
    }
    if (!split_.global) user_error("autosp: the graph has no sequence input (tokens, labels, positions, mask)");
  }

  ValueId emit1(OpKind op, std::vector<ValueId> ins, Attrs attrs, Sharding sharding) {
    ValueId v = b_.emit1(op, std::move(ins), std::move(attrs));
    g_.mutable_value(v).sharding = sharding;
    return v;
  }

  ValueId all_to_all(ValueId x, int64_t scatter_dim, int64_t gather_dim) {
    return emit1(OpKind::all_to_all, {x},
                 {{"group", std::string("sp")}, {"size", P_}, {"scatter_dim", scatter_dim}, {"gather_dim", gather_dim}},
                 shard(static_cast<int>(gather_dim == 1 ? scatter_dim : 1)));
  }

  void add_input(const Node& node) {
    const ValueId v = node.outputs[0];
    const Role role = fwd_.role(v);
    TensorType type = fwd_.type(v);
    if (is_sequence_role(role)) type.shape[1] = split_.local;
    map_[v] = g_.add_input(role, type, fwd_.value(v).name);
    g_.mutable_value(map_[v]).sharding = is_sequence_role(role) ? shard(1) : replicated();
  }

  // Ulysses: exchange q, k, v to head shards, attend over the whole sequence, exchange back.
  void add_attention(NodeId n, const Node& node) {
    ValueId q = map_[node.inputs[0]], k = map_[node.inputs[1]], v = map_[node.inputs[2]];
    const Sharding qs = g_.value(q).sharding;
    if (!(qs == shard(1) && g_.value(k).sharding == qs && g_.value(v).sharding == qs)) {
      add_op(n, node);  // not sequence-sharded: the op's own rule decides
      return;
    }
    // operands after q, k, v: the sinks (attribute "sinks"), then the document ids
    const bool sinks = node.attrs.get_int("sinks", 0) != 0;
    const bool documents = node.inputs.size() == (sinks ? 5u : 4u);
    // Padding sits after every real token; only causal attention, or document ids that put
    // it in a document of its own, keep real queries from seeing it, so padded full
    // attention without them would silently change the result.
    if (node.attrs.get_int("causal") == 0 && split_.padded != split_.global && !documents)
      user_error("autosp: attention (node ", n, ") is not causal and S=", split_.global,
                 " is not divisible by sequence_parallel_size P=", P_,
                 ": the padding would be attended to; use a sequence length divisible by P");
    const int64_t NH = g_.shape(q)[2], NKV = g_.shape(k)[2];
    if (NH % P_ != 0)
      user_error("autosp: attention (node ", n, ") has NH=", NH, " query heads, not divisible by "
                 "sequence_parallel_size P=", P_, "; each rank attends over NH/P heads");
    if (NKV % P_ != 0) {
      if (P_ % NKV != 0)
        user_error("autosp: attention (node ", n, ") has NKV=", NKV, " kv heads; with sequence_parallel_size P=",
                   P_, " they can neither be split (NKV % P != 0) nor repeated (P % NKV != 0)");
      k = repeat_heads(k, P_ / NKV);
      v = repeat_heads(v, P_ / NKV);
    }
    q = all_to_all(q, 2, 1);
    k = all_to_all(k, 2, 1);
    v = all_to_all(v, 2, 1);
    std::vector<ValueId> ins = {q, k, v};
    if (sinks) ins.push_back(map_[node.inputs[3]]);
    if (documents) ins.push_back(whole_documents(node.inputs.back()));
    // ALiBi and sinks: each rank's heads are its part of the model's, so its slopes and sinks are too.
    Attrs attrs = node.attrs;
    if (attrs.has("alibi")) attrs.set("alibi_split", P_);
    if (sinks) attrs.set("sinks_split", P_);
    auto outs = b_.emit(OpKind::attention, ins, attrs);
    g_.mutable_value(outs[0]).sharding = shard(2);
    g_.mutable_value(outs[1]).sharding = shard(1);  // lse [B, NH, S]: its head dim
    map_[node.outputs[0]] = all_to_all(outs[0], 1, 2);
    map_[node.outputs[1]] = outs[1];
  }

  // After the exchange a rank attends over the whole sequence, so it needs the document
  // ids of the whole (padded) sequence: one all_gather of the sharded ids, shared by every
  // attention that reads them.
  ValueId whole_documents(ValueId forward_docs) {
    const ValueId local = map_[forward_docs];
    if (!is_shard(g_.value(local).sharding)) return local;
    auto [it, fresh] = gathered_docs_.try_emplace(local, -1);
    if (fresh)
      it->second = emit1(OpKind::all_gather, {local}, {{"group", std::string("sp")}, {"size", P_}, {"dim", int64_t{1}}},
                         replicated());
    return it->second;
  }

  // [B, s, NKV, D] -> [B, s, NKV * r, D], each kv head repeated r times in place, so query
  // head h still reads (a copy of) kv head h / (NH / NKV).
  ValueId repeat_heads(ValueId x, int64_t r) {
    const Shape s = g_.shape(x);
    ValueId x5 = emit1(OpKind::reshape, {x}, {{"shape", Shape{s[0], s[1], s[2], 1, s[3]}}}, shard(1));
    ValueId copies = emit1(OpKind::concat, std::vector<ValueId>(r, x5), {{"dim", int64_t{3}}}, shard(1));
    return emit1(OpKind::reshape, {copies}, {{"shape", Shape{s[0], s[1], s[2] * r, s[3]}}}, shard(1));
  }

  void add_op(NodeId n, const Node& node) {
    const OpDef& def = op_def(node.op);
    std::vector<ValueId> ins;
    Shardings in_shardings;
    Types global_types;
    const bool adds_to_partial =
        node.op == OpKind::add && std::any_of(node.inputs.begin(), node.inputs.end(), [&](ValueId v) {
          return is_partial(g_.value(map_[v]).sharding);
        });
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      ValueId x = map_[node.inputs[i]];
      // A loss divisor is needed whole: sum this rank's count with the group's.
      if (node.op == OpKind::div_scalar && i == 1 && is_partial(g_.value(x).sharding))
        x = emit1(OpKind::all_reduce, {x}, {{"group", std::string("sp")}, {"size", P_}}, replicated());
      // A whole value added to this rank's part of a sum (the load-balancing loss to the
      // cross-entropy's share): each rank adds 1/P of it, so that the parts sum to it once.
      if (adds_to_partial && is_replicated(g_.value(x).sharding))
        x = emit1(OpKind::scale, {x}, {{"alpha", 1.0 / double(P_)}}, partial());
      ins.push_back(x);
      in_shardings.push_back(g_.value(x).sharding);
      global_types.push_back(fwd_.type(node.inputs[i]));
    }
    if (!def.shard)
      user_error("autosp: ", op_name(node.op), " (node ", n, ") has no sequence-sharding rule");
    Shardings out;
    try {
      out = def.shard(in_shardings, global_types, node.attrs);
    } catch (const ShapeError& e) {
      user_error("autosp: cannot shard ", op_name(node.op), " (node ", n, ") with operands ",
                 shardings_str(in_shardings), ": ", e.what());
    }
    Attrs attrs = node.attrs;
    if (node.op == OpKind::reshape && is_shard(out[0])) {
      Shape shape = attrs.get_ints("shape");
      shape[out[0].dim] = g_.shape(ins[0])[in_shardings[0].dim];  // the local length
      attrs.set("shape", shape);
    }
    if (node.op == OpKind::moe_balance && split_.padded != split_.global)
      user_error("autosp: the load-balancing loss (moe_balance, node ", n, ") needs the sequence length (",
                 split_.global, ") to be a multiple of sequence_parallel_size (", P_,
                 "): padded positions would count as tokens");
    auto results = b_.emit(node.op, ins, attrs);
    for (size_t i = 0; i < results.size(); ++i) {
      g_.mutable_value(results[i]).sharding = out.size() == 1 ? out[0] : out.at(i);
      map_[node.outputs[i]] = results[i];
    }
    // The load-balancing statistics are needed whole: this rank's rows' sums with the group's.
    if (node.op == OpKind::moe_balance && is_partial(out[0]))
      map_[node.outputs[0]] =
          emit1(OpKind::all_reduce, {results[0]}, {{"group", std::string("sp")}, {"size", P_}}, replicated());
  }

  static std::string shardings_str(const Shardings& s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + sharding_str(s[i]);
    return out;
  }

  const Graph& fwd_;
  const int64_t P_;
  Graph g_;
  GraphBuilder b_;
  std::vector<ValueId> map_;
  std::map<ValueId, ValueId> gathered_docs_;  // local document ids -> their all_gather
  SequenceSplit split_;
};

}  // namespace

SequenceBatch prepare_autosp_inputs(const SequenceBatch& full, int64_t sp_rank, int64_t sp_size) {
  AUTOSP_CHECK(0 <= sp_rank && sp_rank < sp_size, "rank ", sp_rank, " of ", sp_size);
  const auto n = static_cast<size_t>(full.B * full.S);
  const bool documents = !full.document_ids.empty();
  AUTOSP_CHECK(full.input_ids.size() == n && full.labels.size() == n && full.position_ids.size() == n &&
                   (!documents || full.document_ids.size() == n),
               "a batch's tensors must all be [B, S]");
  const SequenceSplit split = split_sequence(full.S, sp_size);
  SequenceBatch local{full.B, split.local, {}, {}, {}, {}};
  constexpr int32_t kIgnore = -100;
  for (int64_t b = 0; b < full.B; ++b)
    for (int64_t i = 0; i < split.local; ++i) {
      const int64_t pos = split.begin(sp_rank) + i;
      const bool real = pos < full.S;
      const size_t at = static_cast<size_t>(b * full.S + (real ? pos : 0));
      local.input_ids.push_back(real ? full.input_ids[at] : 0);
      local.labels.push_back(real ? full.labels[at] : kIgnore);
      local.position_ids.push_back(real ? full.position_ids[at] : static_cast<int32_t>(pos));
      if (documents)
        local.document_ids.push_back(real ? full.document_ids[at] : full.document_ids[b * full.S + full.S - 1] + 1);
    }
  return local;
}

Graph autosp(const Graph& forward, const AutospOptions& options) {
  if (options.sp_size == 1) return forward;
  if (options.sp_size < 1) user_error("sequence_parallel_size must be >= 1, got ", options.sp_size);
  return AutospPass(forward, options.sp_size).run();
}

}  // namespace autosp
