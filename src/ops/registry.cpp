#include <iterator>

#include "ops/op.h"

#include "kernels/cpu/isa.h"

namespace autosp {

#define AUTOSP_OP_DECL(name) extern const OpDef name##_op;
AUTOSP_OPS(AUTOSP_OP_DECL)
#undef AUTOSP_OP_DECL

namespace {
const OpDef* const kOpDefs[] = {
#define AUTOSP_OP_PTR(name) &name##_op,
    AUTOSP_OPS(AUTOSP_OP_PTR)
#undef AUTOSP_OP_PTR
};
static_assert(std::size(kOpDefs) == kNumOps, "every op kind has exactly one definition");
}  // namespace

const OpDef& op_def(OpKind op) { return *kOpDefs[static_cast<int>(op)]; }

std::string types_str(const Types& types) {
  std::string s;
  for (size_t i = 0; i < types.size(); ++i) s += (i ? ", " : "") + type_str(types[i]);
  return s;
}

// These checks run for every operand of every node a pass emits: their messages are built
// only when they fail (require() takes them built).
void require_dtype(const TensorType& t, DType dtype, const char* operand) {
  if (t.dtype != dtype) shape_error(operand, " must be ", dtype_name(dtype), ", got ", type_str(t));
}

bool is_floating(DType dtype) { return dtype == DType::f32 || dtype == DType::bf16; }

void require_floating(const TensorType& t, const char* operand) {
  if (!is_floating(t.dtype)) shape_error(operand, " must be f32 or bf16, got ", type_str(t));
}

void require_same_dtype(const TensorType& a, const char* a_name, const TensorType& b,
                        const char* b_name) {
  if (a.dtype != b.dtype)
    shape_error(a_name, " and ", b_name, " must have the same dtype, got ", a_name, " ", type_str(a), " and ", b_name,
                " ", type_str(b), " (mixed f32 and bf16 needs an explicit convert)");
}

DType dtype_attr(const Attrs& attrs, const char* key) {
  require(attrs.has(key), "needs a '", key, "' attribute (\"f32\" or \"bf16\")");
  const AttrValue& v = attrs.all().at(key);
  const std::string* name = std::get_if<std::string>(&v);
  require(name != nullptr, key, " must be a dtype name (\"f32\" or \"bf16\")");
  std::optional<DType> d = parse_dtype(*name);
  require(d && is_floating(*d), key, "=\"", *name, "\" is not a floating dtype (f32 or bf16)");
  return *d;
}

void require_rank(const TensorType& t, size_t rank, const char* operand) {
  if (t.shape.size() != rank) shape_error(operand, " must have rank ", rank, ", got ", type_str(t));
}

Shape with_last(Shape shape, int64_t last) {
  shape.back() = last;
  return shape;
}

int64_t dim_attr(const Attrs& attrs, const char* key, const TensorType& t) {
  require(attrs.has(key), "needs a '", key, "' attribute");
  const int64_t d = attrs.get_int(key);
  require(d >= 0 && d < static_cast<int64_t>(t.shape.size()), key, "=", d, " is out of range for ",
          type_str(t));
  return d;
}

Slab slab_of(const Shape& shape, int64_t dim) {
  Slab v;
  v.len = shape[dim];
  for (int64_t i = 0; i < dim; ++i) v.outer *= shape[i];
  for (size_t i = dim + 1; i < shape.size(); ++i) v.inner *= shape[i];
  return v;
}

int64_t rows_of(const Shape& shape) {
  int64_t n = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) n *= shape[i];
  return n;
}

namespace {

std::string attrs_str(const Attrs& attrs) {
  if (attrs.all().empty()) return "";
  std::string s = " {";
  bool first = true;
  for (const auto& [k, v] : attrs.all()) {
    s += (first ? "" : ", ") + k + "=";
    first = false;
    if (auto* i = std::get_if<int64_t>(&v)) s += std::to_string(*i);
    else if (auto* d = std::get_if<double>(&v)) s += str(*d);
    else if (auto* t = std::get_if<std::string>(&v)) s += "\"" + *t + "\"";
    else if (auto* f = std::get_if<std::vector<double>>(&v)) s += str("[", f->size(), " floats]");
    else s += shape_str(std::get<std::vector<int64_t>>(v));
  }
  return s + "}";
}

Types infer_checked(OpKind op, const Types& inputs, const Attrs& attrs) {
  const OpDef& def = op_def(op);
  try {
    if (def.num_inputs >= 0)
      require(static_cast<int>(inputs.size()) == def.num_inputs, "expected ", def.num_inputs,
              " operands, got ", inputs.size());
    else
      require(!inputs.empty(), "expected at least one operand");
    Types out = def.infer(inputs, attrs);
    AUTOSP_CHECK(def.num_outputs < 0 ? !out.empty() : static_cast<int>(out.size()) == def.num_outputs, op_name(op),
                 ": rule returned ", out.size(), " results");
    return out;
  } catch (const ShapeError& e) {
    user_error(op_name(op), "(", types_str(inputs), ")", attrs_str(attrs), ": ", e.what());
  }
}

}  // namespace

std::vector<ValueId> GraphBuilder::emit(OpKind op, std::vector<ValueId> inputs, Attrs attrs) {
  AUTOSP_CHECK(op != OpKind::input, "use Graph::add_input for inputs");
  Types in_types;
  for (ValueId v : inputs) in_types.push_back(graph_.type(v));
  Types out_types = infer_checked(op, in_types, attrs);
  NodeId n = graph_.add_node(op, std::move(inputs), std::move(attrs), out_types);
  return graph_.node(n).outputs;
}

ValueId GraphBuilder::emit1(OpKind op, std::vector<ValueId> inputs, Attrs attrs) {
  auto outs = emit(op, std::move(inputs), std::move(attrs));
  AUTOSP_CHECK(outs.size() == 1, op_name(op), " has ", outs.size(), " results, not one");
  return outs[0];
}

namespace {
// The one sharded dim shared by all sharded operands, or -1 if none is sharded.
int common_shard_dim(const Shardings& in) {
  int dim = -1;
  for (const Sharding& s : in) {
    require(!is_partial(s), "a partial sum cannot flow into this op");
    if (!is_shard(s)) continue;
    require(dim < 0 || dim == s.dim, "operands are sharded on different dims (", dim, " and ", s.dim, ")");
    dim = s.dim;
  }
  return dim;
}
}  // namespace

Shardings shard_rowwise(const Shardings& in, const Types& types, const Attrs&) {
  const int dim = common_shard_dim(in);
  if (dim < 0) return {replicated()};
  for (size_t i = 0; i < in.size(); ++i)
    if (is_shard(in[i]))
      require(dim + 1 < static_cast<int>(types[i].shape.size()),
              "cannot shard the feature (last) dim of a row-wise op");
  return {shard(dim)};
}

Shardings shard_elementwise(const Shardings& in, const Types&, const Attrs&) {
  for (const Sharding& s : in)
    require(s == in[0], "elementwise operands must be sharded alike, got ", sharding_str(in[0]),
            " and ", sharding_str(s));
  return {in[0]};
}

Cost node_cost(const Graph& g, const Node& node) {
  Types ins, outs;
  for (ValueId v : node.inputs) ins.push_back(g.type(v));
  for (ValueId v : node.outputs) outs.push_back(g.type(v));
  const OpDef& def = op_def(node.op);
  Cost c = def.cost ? def.cost(ins, outs, node.attrs) : Cost{};
  if (c.bytes == 0) {
    for (const auto& t : ins) c.bytes += double(t.bytes());
    for (const auto& t : outs) c.bytes += double(t.bytes());
  }
  return c;
}

int64_t node_workspace_bytes(const Graph& g, const Node& node, int threads) {
  const OpDef& def = op_def(node.op);
  if (!def.cpu_workspace_bytes) return 0;
  Types ins;
  for (ValueId v : node.inputs) ins.push_back(g.type(v));
  return def.cpu_workspace_bytes(ins, node.attrs, threads);
}

Backend parse_backend(const std::string& name) {
  if (name == "cpu") return Backend::cpu;
  if (name == "cuda") return Backend::cuda;
  user_error("unknown backend '", name, "' (cpu or cuda)");
}

const char* backend_name(Backend backend) { return backend == Backend::cuda ? "cuda" : "cpu"; }

namespace {

// CPU kernels read floating buffers as float: a bf16 value reaching one would be read as
// garbage, so lowering refuses it, naming the op and the value.
void check_cpu_dtypes(const Graph& g, NodeId n) {
  const Node& node = g.node(n);
  if (op_def(node.op).cpu_any_dtype) return;
  auto check = [&](ValueId v, const char* what, size_t i) {
    const TensorType& t = g.type(v);
    if (t.dtype == DType::f32 || t.dtype == DType::i32) return;
    user_error("cpu backend: ", op_name(node.op), " (node ", n, ") has ", what, " ", i, " of type ", type_str(t),
               ", but CPU kernels are fp32: ", dtype_name(t.dtype),
               " graphs are for GPU runs and `autosp plan`; trace the model with dtype f32 to run it on the CPU");
  };
  for (size_t i = 0; i < node.inputs.size(); ++i) check(node.inputs[i], "operand", i);
  for (size_t i = 0; i < node.outputs.size(); ++i) check(node.outputs[i], "result", i);
}

}  // namespace

KernelBinding bind_kernel(const Graph& g, NodeId n, Backend backend, int threads) {
  const Node& node = g.node(n);
  AUTOSP_CHECK(node.op != OpKind::input, "node ", n, " is an input: inputs are bound, not run");
  const OpDef& def = op_def(node.op);
  if (backend == Backend::cpu) {
    AUTOSP_CHECK(def.cpu, op_name(node.op), " has no CPU kernel");
    check_cpu_dtypes(g, n);
    const std::string isa = def.cpu_per_isa ? std::string(cpu::isa_name(cpu::active_isa())) + "." : "";
    return {"cpu." + isa + op_name(node.op), node_workspace_bytes(g, node, threads), def.cpu_inplace};
  }
  const CudaKernelRules& k = def.cuda;
  if (!k.name)
    user_error("cuda backend: ", op_name(node.op), " (node ", n, ") has no CUDA kernel yet; run this graph with "
               "--backend cpu");
  Types ins, outs;
  for (ValueId v : node.inputs) ins.push_back(g.type(v));
  for (ValueId v : node.outputs) outs.push_back(g.type(v));
  if (k.check) {
    try {
      k.check(ins, node.attrs);
    } catch (const ShapeError& e) {
      user_error("cuda backend: ", op_name(node.op), " (node ", n, ", ", types_str(ins), ") cannot run on the ",
                 k.name, " kernel: ", e.what());
    }
  }
  return {str("cuda.", k.name), k.workspace_bytes ? k.workspace_bytes(ins, outs, node.attrs) : 0, k.inplace};
}

void verify(const Graph& g) {
  verify_structure(g);
  for (NodeId n = 0; n < static_cast<NodeId>(g.nodes().size()); ++n) {
    const Node& node = g.node(n);
    if (node.op == OpKind::input) continue;
    Types ins, recorded;
    for (ValueId v : node.inputs) ins.push_back(g.type(v));
    for (ValueId v : node.outputs) recorded.push_back(g.type(v));
    Types inferred;
    try {
      inferred = infer_checked(node.op, ins, node.attrs);
    } catch (const UserError& e) {
      internal_error("node ", n, ": ", e.what());
    }
    if (inferred != recorded)
      internal_error("node ", n, " (", op_name(node.op), "): results are typed ",
                     types_str(recorded), " but the op's rule gives ", types_str(inferred));
  }
}

}  // namespace autosp
