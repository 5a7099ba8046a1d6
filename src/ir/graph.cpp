#include "ir/graph.h"

#include <sstream>

#include "util/error.h"

namespace autosp {

// ---- types ------------------------------------------------------------------------------

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
  }
  internal_error("bad dtype ", int(dtype));
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::i32})
    if (name == dtype_name(d)) return d;
  return std::nullopt;
}

int64_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: case DType::i32: return 4;
    case DType::bf16: case DType::f16: return 2;
  }
  internal_error("bad dtype ", int(dtype));
}

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    AUTOSP_CHECK(!__builtin_mul_overflow(n, d, &n), "element count of ", shape_str(shape), " overflows");
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string type_str(const TensorType& type) { return dtype_name(type.dtype) + shape_str(type.shape); }

std::string sharding_str(const Sharding& sharding) {
  switch (sharding.kind) {
    case Sharding::Kind::none: return "";
    case Sharding::Kind::replicated: return "@replicated";
    case Sharding::Kind::shard: return str("@shard(", sharding.dim, ")");
    case Sharding::Kind::partial: return "@partial";
  }
  internal_error("bad sharding kind");
}

const char* role_name(Role role) {
  switch (role) {
    case Role::parameter: return "parameter";
    case Role::tokens: return "tokens";
    case Role::labels: return "labels";
    case Role::positions: return "positions";
    case Role::mask: return "mask";
    case Role::constant: return "constant";
    case Role::documents: return "documents";
    case Role::gradient: return "gradient";
  }
  internal_error("bad role ", int(role));
}

std::optional<Role> parse_role(std::string_view name) {
  for (Role r : {Role::parameter, Role::tokens, Role::labels, Role::positions, Role::mask, Role::documents,
                 Role::constant, Role::gradient})
    if (name == role_name(r)) return r;
  return std::nullopt;
}

const char* op_name(OpKind kind) {
  static const char* const names[] = {
#define AUTOSP_OP_NAME(name) #name,
      AUTOSP_OPS(AUTOSP_OP_NAME)
#undef AUTOSP_OP_NAME
  };
  static_assert(std::size(names) == kNumOps);
  return names[static_cast<int>(kind)];
}

std::optional<OpKind> parse_op(std::string_view name) {
  for (int i = 0; i < kNumOps; ++i)
    if (name == op_name(static_cast<OpKind>(i))) return static_cast<OpKind>(i);
  return std::nullopt;
}

// ---- attrs ------------------------------------------------------------------------------

namespace {
template <typename T>
const T& get_as(const std::map<std::string, AttrValue>& map, const std::string& key,
                const char* what) {
  auto it = map.find(key);
  if (it == map.end()) internal_error("attribute '", key, "' is missing");
  if (const T* v = std::get_if<T>(&it->second)) return *v;
  internal_error("attribute '", key, "' is not ", what);
}
}  // namespace

int64_t Attrs::get_int(const std::string& key) const { return get_as<int64_t>(map_, key, "an int"); }

double Attrs::get_float(const std::string& key) const {
  auto it = map_.find(key);
  if (it != map_.end())
    if (const int64_t* i = std::get_if<int64_t>(&it->second)) return double(*i);
  return get_as<double>(map_, key, "a float");
}

const std::vector<int64_t>& Attrs::get_ints(const std::string& key) const {
  return get_as<std::vector<int64_t>>(map_, key, "an int list");
}

const std::vector<double>& Attrs::get_floats(const std::string& key) const {
  return get_as<std::vector<double>>(map_, key, "a float list");
}

const std::string& Attrs::get_str(const std::string& key) const {
  return get_as<std::string>(map_, key, "a string");
}

int64_t Attrs::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}
double Attrs::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

// ---- graph ------------------------------------------------------------------------------

NodeId Graph::add_node(OpKind op, std::vector<ValueId> inputs, Attrs attrs,
                       const std::vector<TensorType>& output_types) {
  const auto id = static_cast<NodeId>(nodes_.size());
  Node node{op, std::move(inputs), {}, std::move(attrs)};
  for (size_t i = 0; i < output_types.size(); ++i) {
    node.outputs.push_back(static_cast<ValueId>(values_.size()));
    values_.push_back(Value{output_types[i], {}, "", id, static_cast<int>(i)});
  }
  nodes_.push_back(std::move(node));
  return id;
}

NodeId copy_node(const Graph& from, NodeId n, Graph& to, std::vector<ValueId>& map) {
  const Node& node = from.node(n);
  std::vector<ValueId> inputs;
  for (ValueId v : node.inputs) {
    AUTOSP_CHECK(map.at(v) >= 0, "copy_node: node ", n, " (", op_name(node.op), ") reads %", v,
                 ", not made yet");
    inputs.push_back(map[v]);
  }
  std::vector<TensorType> types;
  for (ValueId v : node.outputs) types.push_back(from.type(v));
  const NodeId m = to.add_node(node.op, std::move(inputs), node.attrs, types);
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    const ValueId v = node.outputs[i], w = to.node(m).outputs[i];
    map[v] = w;
    to.mutable_value(w).name = from.value(v).name;
    to.mutable_value(w).sharding = from.value(v).sharding;
  }
  return m;
}

ValueId Graph::add_input(Role role, const TensorType& type, const std::string& name) {
  NodeId n = add_node(OpKind::input, {}, Attrs{{"role", std::string(role_name(role))}}, {type});
  ValueId v = nodes_[n].outputs[0];
  values_[v].name = name;
  return v;
}

std::vector<ValueId> Graph::inputs() const {
  std::vector<ValueId> result;
  for (const Node& n : nodes_)
    if (n.op == OpKind::input) result.push_back(n.outputs[0]);
  return result;
}

std::vector<ValueId> Graph::inputs_with_role(Role r) const {
  std::vector<ValueId> result;
  for (ValueId v : inputs())
    if (role(v) == r) result.push_back(v);
  return result;
}

Role Graph::role(ValueId input) const {
  const Node& n = nodes_.at(values_.at(input).producer);
  AUTOSP_CHECK(n.op == OpKind::input, "value %", input, " is not a graph input");
  auto r = parse_role(n.attrs.get_str("role"));
  AUTOSP_CHECK(r.has_value(), "input %", input, " has an unknown role");
  return *r;
}

ValueId Graph::output(const std::string& name) const {
  for (const GraphOutput& o : outputs_)
    if (o.name == name) return o.value;
  internal_error("graph has no output named '", name, "'");
}

ValueId Graph::find_input(const std::string& name) const {
  for (ValueId v : inputs())
    if (values_[v].name == name) return v;
  return -1;
}

bool Graph::operator==(const Graph& other) const {
  if (nodes_.size() != other.nodes_.size() || values_.size() != other.values_.size() ||
      outputs_.size() != other.outputs_.size())
    return false;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node &a = nodes_[i], &b = other.nodes_[i];
    if (a.op != b.op || a.inputs != b.inputs || a.outputs != b.outputs || !(a.attrs == b.attrs))
      return false;
  }
  for (size_t i = 0; i < values_.size(); ++i) {
    const Value &a = values_[i], &b = other.values_[i];
    if (!(a.type == b.type) || !(a.sharding == b.sharding) || a.name != b.name ||
        a.producer != b.producer || a.output_index != b.output_index)
      return false;
  }
  for (size_t i = 0; i < outputs_.size(); ++i)
    if (outputs_[i].name != other.outputs_[i].name || outputs_[i].value != other.outputs_[i].value)
      return false;
  return true;
}

// ---- verifier ---------------------------------------------------------------------------

void verify_structure(const Graph& g) {
  const auto num_values = static_cast<ValueId>(g.values().size());
  std::vector<bool> defined(num_values, false);
  for (NodeId n = 0; n < static_cast<NodeId>(g.nodes().size()); ++n) {
    const Node& node = g.node(n);
    auto where = [&] { return str("node ", n, " (", op_name(node.op), ")"); };
    for (ValueId in : node.inputs) {
      if (in < 0 || in >= num_values) internal_error(where(), ": operand %", in, " out of range");
      if (!defined[in]) internal_error(where(), ": operand %", in, " used before its definition");
    }
    if (node.op == OpKind::input) {
      if (!node.inputs.empty() || node.outputs.size() != 1)
        internal_error(where(), ": an input node has no operands and one result");
      if (!node.attrs.has("role") || !std::holds_alternative<std::string>(node.attrs.all().at("role")) ||
          !parse_role(node.attrs.get_str("role")))
        internal_error(where(), ": an input node needs a valid role attribute");
    }
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      ValueId out = node.outputs[i];
      if (out < 0 || out >= num_values) internal_error(where(), ": result %", out, " out of range");
      if (defined[out]) internal_error(where(), ": value %", out, " defined twice");
      const Value& v = g.value(out);
      if (v.producer != n || v.output_index != static_cast<int>(i))
        internal_error(where(), ": value %", out, " does not name this node as its producer");
      for (int64_t d : v.type.shape)
        if (d < 0) internal_error(where(), ": value %", out, " has negative dimension");
      defined[out] = true;
    }
  }
  for (ValueId v = 0; v < num_values; ++v)
    if (!defined[v]) internal_error("value %", v, " is not defined by any node");
  for (const GraphOutput& o : g.outputs())
    if (o.value < 0 || o.value >= num_values) internal_error("output '", o.name, "' out of range");
}

}  // namespace autosp
