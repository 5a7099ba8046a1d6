#include "passes/tile.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "ops/op.h"

namespace autosp {

int64_t choose_tile_rows(int64_t S, int64_t bytes_per_row, const TileOptions& o) {
  if (o.tile_rows < 0) user_error("compile.tile_rows must be >= 0 (0 = off), got ", o.tile_rows);
  if (o.tile_rows > 0) return std::min(o.tile_rows, S);
  if (o.budget_bytes <= 0) return S;
  AUTOSP_CHECK(o.budget_fraction > 0 && o.budget_fraction <= 1 && o.min_rows >= 1, "budget_fraction ",
               o.budget_fraction, ", min_rows ", o.min_rows);
  const double per_tile = o.budget_fraction * double(o.budget_bytes);
  const auto tiles = static_cast<int64_t>(std::ceil(double(S) * double(bytes_per_row) / per_tile));
  if (tiles <= 1) return S;
  const int64_t rows = (S + tiles - 1) / tiles;
  return std::min(S, std::max(rows, o.min_rows));
}

namespace {

constexpr int kSeqDim = 1;  // [B, S, ...]

// A row-wise region: nodes (in graph order) that read rows of x, graph inputs (weights) and
// one another, and whose values are used only inside the region except for `result`.
struct Region {
  ValueId x = -1;
  std::vector<NodeId> nodes;
  ValueId result = -1;
};

class TilePass {
 public:
  TilePass(const Graph& forward, const TileOptions& options)
      : fwd_(forward), options_(options), b_(g_), map_(forward.values().size(), -1),
        users_(forward.values().size()) {
    for (NodeId n = 0; n < NodeId(fwd_.nodes().size()); ++n)
      for (ValueId in : fwd_.node(n).inputs) users_[in].push_back(n);
    for (const GraphOutput& o : fwd_.outputs()) users_[o.value].push_back(kGraphOutput);
  }

  Graph run() {
    std::vector<int> last_of(fwd_.nodes().size(), -1);  // region whose last node this is
    std::vector<bool> in_region(fwd_.nodes().size(), false);
    for (NodeId n = 0; n < NodeId(fwd_.nodes().size()); ++n) {
      if (fwd_.node(n).op != OpKind::swiglu) continue;
      std::optional<Region> r = find_mlp(n);
      if (!r) continue;
      const int64_t S = fwd_.shape(r->x)[kSeqDim];
      const int64_t rows = choose_tile_rows(S, bytes_per_row(*r), options_);
      if (rows >= S) continue;
      for (NodeId m : r->nodes) in_region[m] = true;
      last_of[r->nodes.back()] = int(regions_.size());
      regions_.push_back(*r);
      rows_.push_back(rows);
    }
    if (regions_.empty()) return fwd_;

    for (NodeId n = 0; n < NodeId(fwd_.nodes().size()); ++n) {
      const Node& node = fwd_.node(n);
      if (node.op == OpKind::input) {
        const ValueId v = node.outputs[0];
        map_[v] = g_.add_input(fwd_.role(v), fwd_.type(v), fwd_.value(v).name);
        g_.mutable_value(map_[v]).sharding = fwd_.value(v).sharding;
      } else if (last_of[n] >= 0) {
        emit_tiled(regions_[last_of[n]], rows_[last_of[n]]);
      } else if (!in_region[n]) {
        std::vector<ValueId> inputs;
        for (ValueId in : node.inputs) inputs.push_back(map_[in]);
        std::vector<TensorType> types;
        for (ValueId out : node.outputs) types.push_back(fwd_.type(out));
        const NodeId id = g_.add_node(node.op, std::move(inputs), node.attrs, types);
        for (size_t i = 0; i < node.outputs.size(); ++i) keep(node.outputs[i], g_.node(id).outputs[i]);
      }
    }
    for (const GraphOutput& o : fwd_.outputs()) g_.add_output(o.name, map_[o.value]);
    verify(g_);
    return std::move(g_);
  }

 private:
  static constexpr NodeId kGraphOutput = -1;

  void keep(ValueId old, ValueId now) {
    Value& v = g_.mutable_value(now);
    v.sharding = fwd_.value(old).sharding;
    v.name = fwd_.value(old).name;
    map_[old] = now;
  }

  const Node* producer(ValueId v, OpKind op) const {
    if (fwd_.is_input(v)) return nullptr;
    const Node& n = fwd_.node(fwd_.value(v).producer);
    return n.op == op ? &n : nullptr;
  }
  // The only user of v (a node, not a graph output), if it is one `op` node.
  const Node* only_user(ValueId v, OpKind op) const {
    if (users_[v].size() != 1 || users_[v][0] == kGraphOutput) return nullptr;
    const Node& n = fwd_.node(users_[v][0]);
    return n.op == op ? &n : nullptr;
  }
  bool used_only_by(ValueId v, std::initializer_list<const Node*> nodes) const {
    for (NodeId u : users_[v]) {
      if (u == kGraphOutput) return false;
      if (std::none_of(nodes.begin(), nodes.end(), [&](const Node* n) { return n == &fwd_.node(u); }))
        return false;
    }
    return true;
  }
  NodeId id_of(const Node* n) const { return fwd_.value(n->outputs[0]).producer; }

  // rms_norm -> linear (gate), linear (up) -> swiglu -> linear (down) [-> add x], around `sw`.
  std::optional<Region> find_mlp(NodeId swiglu) const {
    const Node& sw = fwd_.node(swiglu);
    const Node* gate = producer(sw.inputs[0], OpKind::linear);
    const Node* up = producer(sw.inputs[1], OpKind::linear);
    if (!gate || !up || gate == up || gate->inputs[0] != up->inputs[0]) return std::nullopt;
    const Node* norm = producer(gate->inputs[0], OpKind::rms_norm);
    if (!norm || norm->outputs[0] != gate->inputs[0]) return std::nullopt;
    const ValueId x = norm->inputs[0];
    if (fwd_.shape(x).size() != 3) return std::nullopt;  // [B, S, H]
    const Node* down = only_user(sw.outputs[0], OpKind::linear);
    if (!down || down->inputs[0] != sw.outputs[0]) return std::nullopt;
    for (const Node* n : {norm, gate, up, down})
      if (!fwd_.is_input(n->inputs[1])) return std::nullopt;  // weights, not rows
    if (!used_only_by(norm->outputs[0], {gate, up}) || !users_[norm->outputs[1]].empty() ||
        !used_only_by(gate->outputs[0], {&sw}) || !used_only_by(up->outputs[0], {&sw}))
      return std::nullopt;
    Region r{x, {id_of(norm), id_of(gate), id_of(up), swiglu, id_of(down)}, down->outputs[0]};
    const Node* add = only_user(down->outputs[0], OpKind::add);
    if (add && (add->inputs[0] == x || add->inputs[1] == x) && add->inputs[0] != add->inputs[1]) {
      r.nodes.push_back(id_of(add));
      r.result = add->outputs[0];
    }
    std::sort(r.nodes.begin(), r.nodes.end());
    return r;
  }

  // Bytes per row of the sequence of everything the region's nodes make.
  int64_t bytes_per_row(const Region& r) const {
    int64_t bytes = 0;
    for (NodeId n : r.nodes)
      for (ValueId v : fwd_.node(n).outputs) bytes += fwd_.type(v).bytes();
    return bytes / fwd_.shape(r.x)[kSeqDim];
  }

  // The region once per tile of `rows` rows, then the concat of the tiles' results.
  void emit_tiled(const Region& r, int64_t rows) {
    const int64_t S = fwd_.shape(r.x)[kSeqDim];
    std::vector<ValueId> results;
    for (int64_t t = 0, start = 0; start < S; ++t, start += rows) {
      std::vector<ValueId> local(fwd_.values().size(), -1);  // the tile of each region value
      // A tile of a value is sharded as the value is (this rank's rows of the tile).
      auto tile_of = [&](ValueId old, ValueId now) {
        g_.mutable_value(now).sharding = fwd_.value(old).sharding;
        local[old] = now;
      };
      tile_of(r.x, b_.emit1(OpKind::slice, {map_[r.x]},
                            {{"dim", int64_t{kSeqDim}}, {"start", start}, {"end", std::min(start + rows, S)},
                             {kTileAttribute, t}}));
      for (NodeId n : r.nodes) {
        const Node& node = fwd_.node(n);
        std::vector<ValueId> inputs;
        for (ValueId in : node.inputs) inputs.push_back(local[in] >= 0 ? local[in] : map_[in]);
        Attrs attrs = node.attrs;
        attrs.set(kTileAttribute, t);
        const std::vector<ValueId> outs = b_.emit(node.op, std::move(inputs), std::move(attrs));
        for (size_t i = 0; i < outs.size(); ++i) tile_of(node.outputs[i], outs[i]);
      }
      results.push_back(local[r.result]);
    }
    const ValueId joined = b_.emit1(OpKind::concat, std::move(results), {{"dim", int64_t{kSeqDim}}});
    AUTOSP_CHECK(g_.type(joined) == fwd_.type(r.result), "tiles of ", type_str(fwd_.type(r.result)),
                 " concatenate to ", type_str(g_.type(joined)));
    keep(r.result, joined);
  }

  const Graph& fwd_;
  const TileOptions& options_;
  Graph g_;
  GraphBuilder b_;
  std::vector<ValueId> map_;
  std::vector<std::vector<NodeId>> users_;
  std::vector<Region> regions_;
  std::vector<int64_t> rows_;
};

}  // namespace

Graph tile(const Graph& forward, const TileOptions& options) {
  if (options.tile_rows < 0) user_error("compile.tile_rows must be >= 0 (0 = off), got ", options.tile_rows);
  if (options.tile_rows == 0 && options.budget_bytes <= 0) return forward;
  return TilePass(forward, options).run();
}

}  // namespace autosp
