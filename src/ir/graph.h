// The graph IR: a list of nodes in topological order, each defining SSA values.
//
// A graph input is a node of kind `input` with a `role` attribute; every other value is
// defined by exactly one node, after the nodes that define its operands. Values carry a
// static type (dtype + shape), an optional name and a sharding annotation that passes
// fill. Ids are dense indices: value v is values()[v], node n is nodes()[n].
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "ir/op_kind.h"
#include "ir/types.h"

namespace autosp {

using ValueId = int32_t;
using NodeId = int32_t;

using AttrValue = std::variant<int64_t, double, std::vector<int64_t>, std::string, std::vector<double>>;

// Named op attributes, kept sorted so that printing is canonical.
class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<const std::string, AttrValue>> init) : map_(init) {}

  bool has(const std::string& key) const { return map_.count(key) != 0; }
  void set(const std::string& key, AttrValue value) { map_[key] = std::move(value); }
  void erase(const std::string& key) { map_.erase(key); }
  const std::map<std::string, AttrValue>& all() const { return map_; }

  // Typed getters; a missing key or another type is an internal error naming the key
  // (op checks report user-facing problems before kernels ever read attributes).
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;  // accepts an int too
  const std::vector<int64_t>& get_ints(const std::string& key) const;
  const std::vector<double>& get_floats(const std::string& key) const;  // a float list
  const std::string& get_str(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key, double fallback) const;

  bool operator==(const Attrs&) const = default;

 private:
  std::map<std::string, AttrValue> map_;
};

struct Value {
  TensorType type;
  Sharding sharding;
  std::string name;      // optional; parameters use their Hugging Face names
  NodeId producer = -1;  // the node that defines it
  int output_index = 0;  // which output of the producer
};

struct Node {
  OpKind op = OpKind::input;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  Attrs attrs;
};

struct GraphOutput {
  std::string name;
  ValueId value;
};

class Graph {
 public:
  // Appends a node whose outputs get the given types; returns the node id. The caller
  // (GraphBuilder) is responsible for the types being the op's inferred ones.
  NodeId add_node(OpKind op, std::vector<ValueId> inputs, Attrs attrs,
                  const std::vector<TensorType>& output_types);
  ValueId add_input(Role role, const TensorType& type, const std::string& name);
  void add_output(const std::string& name, ValueId value) { outputs_.push_back({name, value}); }

  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Value>& values() const { return values_; }
  const std::vector<GraphOutput>& outputs() const { return outputs_; }
  const Node& node(NodeId id) const { return nodes_.at(id); }
  const Value& value(ValueId id) const { return values_.at(id); }
  Value& mutable_value(ValueId id) { return values_.at(id); }
  // A node's attributes, for passes that annotate nodes (lower, plan_memory) without
  // changing what they compute.
  Attrs& mutable_attrs(NodeId id) { return nodes_.at(id).attrs; }
  const TensorType& type(ValueId id) const { return values_.at(id).type; }
  const Shape& shape(ValueId id) const { return values_.at(id).type.shape; }

  // Inputs in definition order, and their roles.
  std::vector<ValueId> inputs() const;
  std::vector<ValueId> inputs_with_role(Role role) const;
  Role role(ValueId input) const;  // internal error if `input` is not a graph input
  bool is_input(ValueId id) const { return nodes_.at(values_.at(id).producer).op == OpKind::input; }

  // The value of the output (or input) with this name; internal error if absent.
  ValueId output(const std::string& name) const;
  ValueId find_input(const std::string& name) const;  // -1 if absent

  bool operator==(const Graph&) const;

 private:
  std::vector<Node> nodes_;
  std::vector<Value> values_;
  std::vector<GraphOutput> outputs_;
};

// Text form. `print_graph` and `parse_graph` round-trip exactly:
//   graph {
//     %0 = input() {role="tokens"} : i32[2, 16] "tokens"
//     %1 = input() {role="parameter"} : f32[100, 32] "model.embed_tokens.weight"
//     %2 = embedding(%1, %0) : f32[2, 16, 32]
//     %3, %4 = rms_norm(%2, %5) {eps=1e-05} : f32[2, 16, 32] @shard(1), f32[2, 16]
//     output "loss" = %9
//   }
std::string print_graph(const Graph& graph);
// Parses the text form; a syntax error is a UserError naming `source`, the line and column.
// Types are taken as written (run `verify` to check them against the op rules).
Graph parse_graph(const std::string& text, const std::string& source = "<string>");

// Appends to `to` a copy of `from`'s node n: its op, attributes, result types, names and
// shardings, its operands read through `map` (a value of `from` -> its value in `to`, which
// must be made already), its results recorded in `map`. Returns the new node. For the passes
// that rebuild a graph node by node.
NodeId copy_node(const Graph& from, NodeId n, Graph& to, std::vector<ValueId>& map);

// Structural checks: ids in range, every operand defined before use, each value defined
// once by the node that claims it, input nodes well-formed, outputs refer to values.
// Throws InternalError naming the node and the broken invariant.
void verify_structure(const Graph& graph);

}  // namespace autosp
