#include "frontend/torch_import.h"

#include <cmath>
#include <limits>
#include <cstring>
#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <numeric>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "frontend/tracer.h"
#include "kernels/cpu/fused.h"
#include "ops/rope.h"
#include "io/zip_archive.h"
#include "util/error.h"
#include "util/hash.h"

namespace autosp {

using nlohmann::json;

namespace {

// torch's ScalarType numbering as torch.export serialises it (torch/_export/serde/schema.py).
enum TorchDType : int { kUint8 = 1, kInt8 = 2, kInt16 = 3, kInt32 = 4, kInt64 = 5, kFloat16 = 6, kFloat32 = 7,
                        kFloat64 = 8, kComplexFloat = 10, kBool = 12, kBFloat16 = 13 };

int64_t torch_item_size(int dtype) {
  switch (dtype) {
    case kUint8: case kInt8: case kBool: return 1;
    case kInt16: case kFloat16: case kBFloat16: return 2;
    case kInt32: case kFloat32: return 4;
    case kInt64: case kFloat64: case kComplexFloat: return 8;
    default: return 0;
  }
}

float bf16_to_f32(uint16_t v) {
  uint32_t bits = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      uint32_t m = mant;
      do { ++e; m <<= 1; } while ((m & 0x400) == 0);
      bits = sign | uint32_t(127 - 15 - e) << 23 | (m & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// One node of the exported graph (torch/_export/serde/schema.py's Node), arguments kept as JSON.
struct FxNode {
  std::string name, target, stack_trace;
  std::vector<std::pair<std::string, json>> args;  // (schema name, Argument)
  std::vector<std::string> outputs;                // the names it defines, in order
  const json* subgraph = nullptr;  // wrap_with_set_grad_enabled's graph, in `args` (a copy must point at its own)
};

// A stored tensor of the archive: a parameter, buffer or constant.
struct StoredTensor {
  std::string entry;  // zip entry of its bytes
  int dtype = 0;
  Shape shape;
  bool requires_grad = true;  // a parameter's flag (false: frozen by the user)
  std::string key;            // its name in the program's signature (a state-dict name, a constant's)
};

}  // namespace

struct TorchProgram::Impl {
  std::string path, prefix;  // prefix: the archive's top folder ("model/")
  io::ZipArchive zip;
  json program;
  std::vector<FxNode> nodes;
  std::map<std::string, size_t> producer;  // value name -> node index
  std::map<std::string, int> dtype_of;     // value name -> torch dtype code (the graph's tensor_values)
  std::map<std::string, std::vector<std::string>> sizes;  // value name -> its recorded sizes (read_sizes)
  std::map<std::string, std::vector<size_t>> readers;  // value name -> the nodes that read it, in order
  std::map<std::string, std::string> symbols;  // sym_int value name -> its expression ("s27")
  std::vector<std::string> user_inputs;        // placeholder names of input_ids, labels
  std::string loss;                            // the output's value name
  std::map<std::string, std::string> parameter_of;  // placeholder -> state-dict name (prefix-free)
  std::map<std::string, StoredTensor> stored;       // placeholder -> its bytes (params, buffers, constants)
  std::vector<models::ParameterSpec> specs;
  std::vector<std::string> spec_placeholders;
  std::vector<models::ParameterSpec> frozen;  // TorchProgram::frozen
  std::vector<std::string> frozen_placeholders;
  // TorchProgram::constants: the frozen parameters the loss reads (known at load), then the
  // stored tables an import made inputs of (stored_constant), as imports find them.
  mutable std::vector<models::ParameterSpec> constants;
  mutable std::vector<std::string> constant_placeholders;
  std::set<std::string> frozen_read;  // the frozen parameters the loss reads, by name
  // Whether every parameter's name starts with export.py's wrapper attribute "model."; the
  // names autosp gives (state_name) drop it then.
  bool wrapped = false;
  std::string state_name(const std::string& key) const {
    return wrapped && key.rfind("model.", 0) == 0 ? key.substr(6) : key;
  }
  uint64_t graph_hash = 0;
  std::string hf_config;  // extra/config.json, or empty
  mutable int64_t vocab = 0;

  explicit Impl(const std::string& p) : path(p), zip(p) {}

  [[noreturn]] void fail_at(const FxNode& n, const std::string& why) const {
    std::string where = n.stack_trace;
    // The model's own line is the last frame of the trace: keep the last two lines.
    size_t cut = where.size();
    for (int lines = 0; lines < 2 && cut != std::string::npos && cut > 0; ++lines) cut = where.rfind("\n  File", cut - 1);
    if (cut != std::string::npos && cut < where.size()) where = where.substr(cut + 3);  // from "File"
    user_error(path, ": node '", n.name, "' (", n.target, "): ", why,
               where.empty() ? std::string() : str("\n  at ", where));
  }
  std::vector<float> read_floats(const StoredTensor& t, const std::string& name) const;
  // `count` floats from float `at` of a float32 tensor, or of a complex64 one as (real, imaginary)
  // pairs: a part of a large table.
  std::vector<float> read_float32s(const StoredTensor& t, int64_t at, int64_t count, const std::string& name) const;
};

namespace {

const json& field(const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) user_error(where, ": the exported program has no '", key, "'");
  return j.at(key);
}

// A float argument: a number, or the strings torch.export writes for the non-finite ones.
double float_of(const json& v) {
  if (v.is_string()) {
    const std::string t = v.get<std::string>();
    if (t == "Infinity" || t == "inf") return INFINITY;
    if (t == "-Infinity" || t == "-inf") return -INFINITY;
    return NAN;
  }
  return v.get<double>();
}

std::string tensor_name(const json& arg) {
  if (arg.is_object() && arg.contains("as_tensor")) return arg["as_tensor"].value("name", "");
  return "";
}

void read_nodes(const json& graph, std::vector<FxNode>& out, const std::string& where) {
  for (const json& n : field(graph, "nodes", where)) {
    FxNode node;
    node.target = n.value("target", "");
    for (const json& in : n.value("inputs", json::array())) node.args.emplace_back(in.value("name", ""), in.value("arg", json()));
    for (const json& o : n.value("outputs", json::array())) {
      if (o.contains("as_tensor")) node.outputs.push_back(o["as_tensor"].value("name", ""));
      else if (o.contains("as_tensors"))
        for (const json& t : o["as_tensors"]) node.outputs.push_back(t.value("name", ""));
      else if (o.contains("as_sym_int") && o["as_sym_int"].contains("as_name"))
        node.outputs.push_back(o["as_sym_int"]["as_name"].get<std::string>());
    }
    node.name = n.value("name", node.outputs.empty() ? std::string("?") : node.outputs[0]);
    if (const json* meta = n.contains("metadata") ? &n["metadata"] : nullptr; meta && meta->contains("stack_trace") &&
                                                                              (*meta)["stack_trace"].is_string())
      node.stack_trace = (*meta)["stack_trace"].get<std::string>();
    for (const auto& [name, arg] : node.args)
      if (arg.is_object() && arg.contains("as_graph")) node.subgraph = &arg["as_graph"]["graph"];
    out.push_back(std::move(node));
  }
}

// The values an argument names (a tensor, a list of them, symbolic ints), each given to f as a
// reference it may rename: `J` is json or const json.
template <typename J, typename F>
void each_value(J& arg, F&& f) {
  if (!arg.is_object()) return;
  auto one = [&](auto& t) {
    for (const char* k : {"name", "as_name"})
      if (t.is_object() && t.contains(k) && t[k].is_string()) f(t[k]);
  };
  for (const char* k : {"as_tensor", "as_optional_tensor", "as_sym_int"})
    if (arg.contains(k)) one(arg[k]);
  for (const char* k : {"as_tensors", "as_optional_tensors", "as_sym_ints"})
    if (arg.contains(k) && arg[k].is_array())
      for (auto& t : arg[k]) {
        one(t);
        if (t.is_object() && t.contains("as_tensor")) one(t["as_tensor"]);
      }
}

// Ops whose result shares the storage of their operand (and any op not aten's, conservatively).
bool is_view(const FxNode& n) {
  static const std::set<std::string> views = {
      "view.default", "reshape.default", "_unsafe_view.default", "permute.default", "transpose.int", "t.default",
      "numpy_T.default", "slice.Tensor", "select.int", "expand.default", "unsqueeze.default", "squeeze.dim",
      "alias.default", "as_strided.default", "split.Tensor", "chunk.default", "split_with_sizes.default",
      "flatten.using_ints", "unflatten.int", "diagonal.default", "detach.default"};
  const std::string prefix = "torch.ops.aten.";
  return n.target.rfind(prefix, 0) != 0 || views.count(n.target.substr(prefix.size())) ||
         n.target == "<built-in function getitem>" || n.target == "_operator.getitem";
}

// The nodes after an in-place op that read its operand directly (OLMo's q.clamp_(...), then
// q.view(...)) read the op's result instead: they see the changed value, which the result is
// (torch's in-place ops return their operand). The op is then imported as its out-of-place form.
// A view of the operand taken before the op is not renamed: the importer refuses one read after.
void rename_reads_after_inplace(std::vector<FxNode>& nodes) {
  static const std::set<std::string> inplace = {"torch.ops.aten.add_.Tensor", "torch.ops.aten.mul_.Tensor",
                                                "torch.ops.aten.clamp_.default"};
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!inplace.count(nodes[i].target) || nodes[i].outputs.size() != 1 || nodes[i].args.empty()) continue;
    std::string self;
    each_value(nodes[i].args[0].second, [&](const json& v) { self = v.get<std::string>(); });
    if (self.empty()) continue;
    for (size_t j = i + 1; j < nodes.size(); ++j)
      for (auto& [k, a] : nodes[j].args)
        each_value(a, [&](json& v) {
          if (v.get<std::string>() == self) v = nodes[i].outputs[0];
        });
  }
}

// A value's sizes as the program records them (its graph's tensor_values): each an integer or
// a symbolic expression, as text ("16", "Symbol('s38', ...)"); equal texts, equal sizes.
using Sizes = std::vector<std::string>;
void read_sizes(const json& graph, const std::function<std::string(const std::string&)>& rename,
                std::map<std::string, Sizes>& sizes, std::map<std::string, int>& dtypes) {
  const json& values = graph.value("tensor_values", json::object());
  for (auto it = values.begin(); it != values.end(); ++it) {
    if (it.value().contains("dtype")) dtypes[rename(it.key())] = it.value()["dtype"].get<int>();
    Sizes s;
    for (const json& d : it.value().value("sizes", json::array()))
      s.push_back(d.contains("as_int") ? std::to_string(d["as_int"].get<int64_t>())
                                       : d.value("as_expr", json::object()).value("expr_str", "?"));
    sizes[rename(it.key())] = std::move(s);
  }
}

// A two-operand einsum node's equation, spaces dropped, as its operands' subscripts a and b and
// the result's y, with the operands' names; nullopt for anything else (one operand or three, an
// ellipsis, a node that is no einsum).
struct EinsumEquation {
  std::string a, b, y, x0, x1;
};
std::optional<EinsumEquation> einsum_equation(const FxNode& n) {
  if (n.target != "torch.ops.aten.einsum.default" || n.args.size() != 2 || n.outputs.size() != 1 ||
      !n.args[0].second.contains("as_string") || !n.args[1].second.contains("as_tensors") ||
      n.args[1].second["as_tensors"].size() != 2)
    return std::nullopt;
  std::string eq;
  for (char c : n.args[0].second["as_string"].get<std::string>())
    if (c != ' ') eq += c;
  const size_t comma = eq.find(','), arrow = eq.find("->");
  if (comma == std::string::npos || arrow == std::string::npos || arrow < comma || eq.find('.') != std::string::npos)
    return std::nullopt;
  const json& ops = n.args[1].second["as_tensors"];
  return EinsumEquation{eq.substr(0, comma), eq.substr(comma + 1, arrow - comma - 1), eq.substr(arrow + 2),
                        ops[0].value("name", ""), ops[1].value("name", "")};
}

// An einsum that is a matrix product (research code's attention, `einsum('b h i d, b h j d -> b h
// i j', q, k)` and `einsum('b h i j, b h j d -> b h i d', p, v)`; a product by a weight matrix,
// `einsum('b n d, d e -> b n e', x, w)`) is written as the matmul it is, each operand's last two
// dims transposed where its contracted dim is not where matmul reads it: the importer then reads
// it as it reads a matmul (the attention written out, x @ W). Its equation: two operands, one
// contracted letter, at most one free letter of each, the batch letters (in both operands and
// the result, or the first operand's alone for a weight matrix) leading in one order. Any other
// einsum is left as it is (refused when the loss reads it).
std::vector<FxNode> einsum_as_matmul(std::vector<FxNode> nodes, std::map<std::string, int>& dtype_of) {
  std::vector<FxNode> out;
  for (FxNode& n : nodes) {
    auto keep = [&] { out.push_back(std::move(n)); };
    const std::optional<EinsumEquation> e = einsum_equation(n);
    if (!e) {
      keep();
      continue;
    }
    const std::string &a = e->a, &b = e->b, &y = e->y;
    auto has = [](const std::string& s, char c) { return s.find(c) != std::string::npos; };
    std::string contracted, a_free, b_free, batch;
    auto repeats = [](const std::string& s) {
      return std::any_of(s.begin(), s.end(), [&](char c) { return std::count(s.begin(), s.end(), c) != 1; });
    };
    if (repeats(a) || repeats(b) || repeats(y)) {  // (a diagonal or a trace)
      keep();
      continue;
    }
    for (char c : a) {
      if (has(b, c) && !has(y, c)) contracted += c;
      else if (has(b, c) && has(y, c)) batch += c;
      else if (has(y, c)) a_free += c;
    }
    for (char c : b)
      if (!has(a, c) && has(y, c)) b_free += c;
    // b a weight matrix (no batch letters): a's letters but the last two are leading dims, as
    // batch ones, the result's first (x @ W over every row)
    if (batch.empty() && a_free.size() > 1 && b.size() == 2 && a.back() == contracted[0]) {
      batch = a_free.substr(0, a_free.size() - 1);
      a_free = a_free.substr(a_free.size() - 1);
    }
    // batch leading in a and y (and in b unless b has none), then the two matrix dims
    const bool b_batched = b.size() == batch.size() + 2;
    const bool ok = contracted.size() == 1 && a_free.size() == 1 && b_free.size() == 1 &&
                    a.size() == batch.size() + 2 && a.compare(0, batch.size(), batch) == 0 &&
                    (b_batched ? b.compare(0, batch.size(), batch) == 0 : b.size() == 2) &&
                    y == batch + a_free + b_free;
    if (!ok) {
      keep();
      continue;
    }
    const std::string mat_a = a.substr(batch.size()), mat_b = b.substr(b_batched ? batch.size() : 0);
    const char c = contracted[0];
    std::string operands[2] = {e->x0, e->x1};
    // a [..., i, c] and b [..., c, j] as matmul reads them: a transpose of the last two where not
    const bool flip[2] = {mat_a[1] != c, mat_b[0] != c};
    for (int k = 0; k < 2; ++k) {
      if (!flip[k]) continue;
      FxNode t;
      t.target = "torch.ops.aten.transpose.int";
      t.name = n.name + (k ? "/b^T" : "/a^T");
      t.outputs = {t.name};
      t.stack_trace = n.stack_trace;
      t.args = {{"self", json{{"as_tensor", {{"name", operands[k]}}}}}, {"dim0", json{{"as_int", -2}}},
                {"dim1", json{{"as_int", -1}}}};
      if (auto d = dtype_of.find(operands[k]); d != dtype_of.end()) dtype_of[t.name] = d->second;
      operands[k] = t.name;
      out.push_back(std::move(t));
    }
    FxNode mm;
    mm.target = "torch.ops.aten.matmul.default";
    mm.name = n.name;
    mm.outputs = n.outputs;
    mm.stack_trace = n.stack_trace;
    mm.args = {{"self", json{{"as_tensor", {{"name", operands[0]}}}}},
               {"other", json{{"as_tensor", {{"name", operands[1]}}}}}};
    out.push_back(std::move(mm));
  }
  return out;
}

// The forms research code writes that the importer reads otherwise, rewritten at load, each
// exactly what it replaces (lucidrains' rotary embedding, x-transformers', is all of them):
//  - x * 1, x / 1 and x - 0: a copy of x (clone: a value of its own, as the product is);
//  - an outer-product einsum ('bi,j->bij': the result's letters a's then b's, none shared):
//    a with b's dims added last (unsqueeze -1), times b;
//  - stack([x, x], -1) viewed with its last two dims merged: each element of x twice in a row,
//    repeat_interleave(x, 2, -1); stack([a, b], -1) so viewed: flatten(stack, -2, -1);
//  - unbind(view(x, [..., d, 2]), -1) (the last dim split into pairs): x[..., 0::2] and
//    x[..., 1::2].
// Sizes come from the program's record of each value (`sizes`); a form whose sizes are not all
// known is left as it is.
std::vector<FxNode> canonical_forms(std::vector<FxNode> nodes, const std::map<std::string, Sizes>& sizes,
                                    const std::map<std::string, int>& dtypes) {
  auto same_dtype = [&](const std::string& a, const std::string& b) {
    auto i = dtypes.find(a), j = dtypes.find(b);
    return i != dtypes.end() && j != dtypes.end() && i->second == j->second;
  };
  auto arg_of = [](const FxNode& n, size_t i) -> const json& { return n.args.at(i).second; };
  auto number = [](const json& a, double v) {
    return (a.contains("as_float") && a["as_float"].is_number() && a["as_float"].get<double>() == v) ||
           (a.contains("as_int") && a["as_int"].get<int64_t>() == v);
  };
  auto tensor = [](const std::string& name) { return json{{"as_tensor", {{"name", name}}}}; };
  auto rank_of = [&](const std::string& v) -> int64_t {
    auto it = sizes.find(v);
    return it == sizes.end() ? -1 : int64_t(it->second.size());
  };
  auto size_list = [](const json& a) -> const json* {
    for (const char* k : {"as_ints", "as_sym_ints"})
      if (a.contains(k)) return &a[k];
    return nullptr;
  };
  std::map<std::string, const FxNode*> producer;
  for (const FxNode& n : nodes)
    for (const std::string& o : n.outputs) producer[o] = &n;
  auto last_dim_minus_one = [](const json& a) { return a.contains("as_int") && a["as_int"].get<int64_t>() == -1; };
  std::vector<FxNode> out;
  for (const FxNode& n : nodes) {  // (copied out: `producer` points into `nodes`)
    const std::string t = n.target;
    auto make = [&](const std::string& target, std::vector<std::pair<std::string, json>> args, std::string name) {
      FxNode m;
      m.target = target;
      m.args = std::move(args);
      m.name = std::move(name);
      m.outputs = {m.name};
      m.stack_trace = n.stack_trace;
      return m;
    };
    // x * 1, x / 1, x - 0
    if ((t == "torch.ops.aten.mul.Tensor" || t == "torch.ops.aten.div.Tensor" || t == "torch.ops.aten.sub.Tensor") &&
        n.args.size() >= 2 && n.outputs.size() == 1 && !tensor_name(arg_of(n, 0)).empty() &&
        number(arg_of(n, 1), t == "torch.ops.aten.sub.Tensor" ? 0.0 : 1.0) &&
        same_dtype(tensor_name(arg_of(n, 0)), n.outputs[0])) {  // (an integer tensor / 1 is a float one)
      out.push_back(make("torch.ops.aten.clone.default", {{"self", arg_of(n, 0)}}, n.outputs[0]));
      continue;
    }
    // an outer-product einsum
    if (const std::optional<EinsumEquation> e = einsum_equation(n)) {
      const bool disjoint = std::none_of(e->a.begin(), e->a.end(), [&](char c) { return e->b.find(c) != std::string::npos; });
      if (disjoint && !e->a.empty() && !e->b.empty() && e->y == e->a + e->b) {
        std::string x = e->x0;
        for (size_t k = 0; k < e->b.size(); ++k) {
          FxNode u = make("torch.ops.aten.unsqueeze.default", {{"self", tensor(x)}, {"dim", json{{"as_int", -1}}}},
                          n.name + "/unsqueeze" + std::to_string(k));
          x = u.name;
          out.push_back(std::move(u));
        }
        out.push_back(make("torch.ops.aten.mul.Tensor", {{"self", tensor(x)}, {"other", tensor(e->x1)}}, n.outputs[0]));
        continue;
      }
    }
    // stack(-1) viewed with its last two dims merged
    if ((t == "torch.ops.aten.view.default" || t == "torch.ops.aten.reshape.default") && n.args.size() >= 2 &&
        n.outputs.size() == 1) {
      const std::string st = tensor_name(arg_of(n, 0));
      auto p = producer.find(st);
      const json* size = size_list(arg_of(n, 1));
      // (the view's sizes the stack's but the last two, merged)
      auto ss = sizes.find(st), vs = sizes.find(n.outputs[0]);
      if (p != producer.end() && p->second->target == "torch.ops.aten.stack.default" && size &&
          p->second->args.size() >= 2 && last_dim_minus_one(p->second->args[1].second) &&
          int64_t(size->size()) + 1 == rank_of(st) && ss != sizes.end() && vs != sizes.end() &&
          vs->second.size() + 1 == ss->second.size() && !vs->second.empty() &&
          std::equal(vs->second.begin(), vs->second.end() - 1, ss->second.begin())) {
        const json& parts = p->second->args[0].second;
        if (parts.contains("as_tensors") && parts["as_tensors"].size() == 2) {
          const std::string x0 = parts["as_tensors"][0].value("name", ""), x1 = parts["as_tensors"][1].value("name", "");
          if (x0 == x1) {
            out.push_back(make("torch.ops.aten.repeat_interleave.self_int",
                               {{"self", tensor(x0)}, {"repeats", json{{"as_int", 2}}}, {"dim", json{{"as_int", -1}}}},
                               n.outputs[0]));
          } else {
            out.push_back(make("torch.ops.aten.flatten.using_ints",
                               {{"self", tensor(st)}, {"start_dim", json{{"as_int", -2}}}, {"end_dim", json{{"as_int", -1}}}},
                               n.outputs[0]));
          }
          continue;
        }
      }
    }
    // unbind of the last dim split into pairs
    if (t == "torch.ops.aten.unbind.int" && n.args.size() >= 2 && n.outputs.size() == 2 &&
        last_dim_minus_one(arg_of(n, 1))) {
      auto p = producer.find(tensor_name(arg_of(n, 0)));
      if (p != producer.end() && (p->second->target == "torch.ops.aten.view.default" ||
                                  p->second->target == "torch.ops.aten.reshape.default")) {
        const std::string x = tensor_name(p->second->args.at(0).second), v = p->second->outputs.at(0);
        auto xs = sizes.find(x), vs = sizes.find(v);
        if (xs != sizes.end() && vs != sizes.end() && vs->second.size() == xs->second.size() + 1 &&
            vs->second.back() == "2" &&
            std::equal(xs->second.begin(), xs->second.end() - 1, vs->second.begin())) {
          for (int64_t k = 0; k < 2; ++k)
            out.push_back(make("torch.ops.aten.slice.Tensor",
                               {{"self", tensor(x)}, {"dim", json{{"as_int", -1}}}, {"start", json{{"as_int", k}}},
                                {"end", json{{"as_int", INT64_MAX}}}, {"step", json{{"as_int", 2}}}},
                               n.outputs[size_t(k)]));
          continue;
        }
      }
    }
    out.push_back(n);
    // (its graph, if it holds one, is in its own arguments: the copy's, not the original's)
    out.back().subgraph = nullptr;
    for (auto& [name, a] : out.back().args)
      if (a.is_object() && a.contains("as_graph")) out.back().subgraph = &a["as_graph"]["graph"];
  }
  return out;
}

// An in-place aten op (`add_`, `copy_`, ...) whose result the loss does not read, on a view of a
// value the loss reads after it (h[..., :4].add_(1), then h): the change reaches the loss only
// through that value, which the importer reads as it was. Refused, named.
template <typename Impl>
void refuse_lost_inplace_changes(const Impl& m, const std::set<std::string>& reached) {
  const std::string aten = "torch.ops.aten.";
  for (size_t i = 0; i < m.nodes.size(); ++i) {
    const FxNode& n = m.nodes[i];
    const size_t dot = n.target.rfind('.');
    if (n.target.rfind(aten, 0) != 0 || dot == std::string::npos || dot <= aten.size() ||
        n.target[dot - 1] != '_' || n.target[aten.size()] == '_' || n.args.empty() ||
        std::any_of(n.outputs.begin(), n.outputs.end(), [&](const std::string& o) { return reached.count(o); }))
      continue;
    std::string v;
    each_value(n.args[0].second, [&](const json& u) { v = u.get<std::string>(); });
    for (auto p = m.producer.find(v); p != m.producer.end() && is_view(m.nodes[p->second]) &&
                                      m.nodes[p->second].target.rfind(aten, 0) == 0;
         p = m.producer.find(v)) {
      each_value(m.nodes[p->second].args.at(0).second, [&](const json& u) { v = u.get<std::string>(); });
      auto r = m.readers.find(v);
      if (r != m.readers.end() && reached.count(v) &&
          std::any_of(r->second.begin(), r->second.end(), [&](size_t k) { return k > i; }))
        m.fail_at(n, str("an in-place op on a view of '", v, "', which the loss reads after it: autosp would read '", v,
                         "' unchanged (write the change out of place)"));
    }
  }
}

// An autocast block that is off (torch.autocast(enabled=False): Nemotron's LayerNorm1P, which
// keeps its norm in the input's type) is its graph's nodes in line (inline_autocast): its inputs
// are the block's arguments, its outputs the block's outputs, the names inside it made unique by
// the block's. One that is on computes in another type than the program, which autosp does not
// copy.
// A no-grad block (torch.no_grad() in the forward; wrap_with_set_grad_enabled(False)) other than
// a rotary embedding's tables (which rope_tables reads whole: a block with a cos or a sin) is
// likewise in line, each of its outputs detached: no gradient flows through what it computes
// (the importer's detach, a stop_gradient where the value comes from the parameters).
bool inlined_no_grad_block(const FxNode& n) {
  if (n.target != "torch.ops.higher_order.wrap_with_set_grad_enabled" || !n.subgraph || n.args.size() < 2 ||
      !n.args[0].second.contains("as_bool") || n.args[0].second["as_bool"].get<bool>())
    return false;
  for (const json& s : n.subgraph->value("nodes", json::array())) {
    const std::string t = s.value("target", "");
    if (t == "torch.ops.aten.cos.default" || t == "torch.ops.aten.sin.default" || t.rfind("torch.ops.higher_order.", 0) == 0)
      return false;
  }
  return true;
}

std::vector<FxNode> inline_autocast(std::vector<FxNode> nodes, const std::string& where,
                                    std::map<std::string, Sizes>& sizes, std::map<std::string, int>& dtypes) {
  std::vector<FxNode> out;
  for (FxNode& n : nodes) {
    const bool no_grad = inlined_no_grad_block(n);
    if (n.target != "torch.ops.higher_order.wrap_with_autocast" && !no_grad) {
      out.push_back(std::move(n));
      continue;
    }
    auto fail = [&](const std::string& why) {
      user_error(where, ": node '", n.name, "' (", n.target, "): ", why);
    };
    const size_t first = no_grad ? 2 : 5;  // (the block's own arguments before its inputs)
    if (!no_grad) {
      if (n.args.size() < 5 || !n.subgraph) fail("an autocast block without its graph");
      if (!n.args[2].second.contains("as_bool") || n.args[2].second["as_bool"].get<bool>())
        fail("an autocast block that is on computes in another type than the program; autosp keeps the program's");
    }
    const json& graph = *n.subgraph;
    const json& inputs = field(graph, "inputs", where), &outputs = field(graph, "outputs", where);
    if (inputs.size() != n.args.size() - first || outputs.size() != n.outputs.size())
      fail("a block whose graph's inputs or outputs do not match its arguments");
    std::map<std::string, std::string> to;
    // (a tensor's name, or a symbolic size's: the sequence length the block's code reads)
    auto name_of = [](const json& a) {
      if (a.is_object() && a.contains("as_sym_int") && a["as_sym_int"].contains("as_name"))
        return a["as_sym_int"]["as_name"].get<std::string>();
      return tensor_name(a);
    };
    for (size_t i = 0; i < inputs.size(); ++i) to[name_of(inputs[i])] = name_of(n.args[first + i].second);
    std::vector<FxNode> detached;  // (a no-grad block's outputs, after its nodes)
    for (size_t i = 0; i < outputs.size(); ++i) {
      const std::string inner = name_of(outputs[i]);
      if (outputs[i].contains("as_sym_int")) {  // a size the block computes (x-transformers' -S)
        if (!to.count(inner)) to[inner] = n.outputs[i];
        continue;
      }
      if (no_grad) {  // detach(the value inside), named as the block's output
        FxNode d;
        d.target = "torch.ops.aten.detach.default";
        d.args.emplace_back("self", json{{"as_tensor", {{"name", to.count(inner) ? to[inner] : n.name + "/" + inner}}}});
        d.outputs = {n.outputs[i]};
        d.name = n.outputs[i];
        d.stack_trace = n.stack_trace;
        detached.push_back(std::move(d));
        continue;
      }
      if (to.count(inner)) {  // an input handed straight out: an alias of it
        FxNode alias;
        alias.target = "torch.ops.aten.alias.default";
        alias.args.emplace_back("self", json{{"as_tensor", {{"name", to[inner]}}}});
        alias.outputs = {n.outputs[i]};
        alias.name = n.outputs[i];
        alias.stack_trace = n.stack_trace;
        out.push_back(std::move(alias));
        continue;
      }
      to[inner] = n.outputs[i];
    }
    auto rename = [&](const std::string& s) {
      auto it = to.find(s);
      return it != to.end() ? it->second : n.name + "/" + s;
    };
    std::vector<FxNode> inner;
    read_nodes(graph, inner, where);
    read_sizes(graph, rename, sizes, dtypes);
    for (FxNode& s : inner) {
      if (s.subgraph && s.target != "torch.ops.higher_order.wrap_with_autocast")
        fail("an autocast block holding another higher-order op");
      for (auto& [k, a] : s.args) each_value(a, [&](json& v) { v = rename(v.get<std::string>()); });
      for (std::string& o : s.outputs) o = rename(o);
      s.name = s.outputs.empty() ? n.name + "/" + s.name : s.outputs[0];
    }
    for (FxNode& s : inline_autocast(std::move(inner), where, sizes, dtypes)) out.push_back(std::move(s));
    for (FxNode& d : detached) out.push_back(std::move(d));
  }
  return out;
}

StoredTensor stored_tensor(const json& config, const std::string& key, const std::string& folder,
                           const std::string& where) {
  const json& c = field(config, key.c_str(), where);
  if (c.value("use_pickle", false))
    user_error(where, ": tensor ", key, " is pickled; autosp reads the raw tensors torch.export.save writes");
  StoredTensor t;
  t.key = key;
  t.entry = folder + c.value("path_name", "");
  const json& meta = field(c, "tensor_meta", where + " " + key);
  t.dtype = meta.value("dtype", 0);
  t.requires_grad = meta.value("requires_grad", true);
  for (const json& d : meta.value("sizes", json::array())) {
    if (!d.contains("as_int")) user_error(where, ": tensor ", key, " has a symbolic size");
    t.shape.push_back(d["as_int"].get<int64_t>());
  }
  // Stored contiguous: strides row-major, offset 0 (what torch.export.save writes for a parameter).
  int64_t expect = 1;
  const json& strides = meta.value("strides", json::array());
  for (int64_t i = int64_t(t.shape.size()) - 1; i >= 0; --i) {
    if (size_t(i) < strides.size() && t.shape[i] > 1 && strides[i].value("as_int", int64_t{-1}) != expect)
      user_error(where, ": tensor ", key, " is stored non-contiguous");
    expect *= t.shape[i];
  }
  if (torch_item_size(t.dtype) == 0) user_error(where, ": tensor ", key, " has dtype code ", t.dtype, ", which autosp does not read");
  return t;
}

}  // namespace

std::vector<float> TorchProgram::Impl::read_floats(const StoredTensor& t, const std::string& name) const {
  const int64_t n = numel(t.shape), item = torch_item_size(t.dtype);
  const io::ZipArchive::Entry& e = zip.entry(t.entry);
  if (e.size < uint64_t(n * item))
    user_error(path, ": ", name, " is ", shape_str(t.shape), " of ", item, "-byte elements, but its entry ", t.entry,
               " has ", e.size, " bytes");
  std::vector<uint8_t> bytes(n * item);
  zip.read(t.entry, 0, bytes.data(), bytes.size());
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* p = &bytes[i * item];
    switch (t.dtype) {
      case kFloat32: std::memcpy(&out[i], p, 4); break;
      case kFloat64: { double d; std::memcpy(&d, p, 8); out[i] = float(d); break; }
      case kBFloat16: { uint16_t v; std::memcpy(&v, p, 2); out[i] = bf16_to_f32(v); break; }
      case kFloat16: { uint16_t v; std::memcpy(&v, p, 2); out[i] = f16_to_f32(v); break; }
      case kInt64: { int64_t v; std::memcpy(&v, p, 8); out[i] = float(v); break; }
      case kInt32: { int32_t v; std::memcpy(&v, p, 4); out[i] = float(v); break; }
      case kInt16: { int16_t v; std::memcpy(&v, p, 2); out[i] = float(v); break; }
      case kInt8: out[i] = float(int8_t(*p)); break;
      case kUint8: out[i] = float(*p); break;
      case kBool: out[i] = *p != 0 ? 1.0f : 0.0f; break;  // GPT-Neo's stored causal masks
      default: user_error(path, ": ", name, " has dtype code ", t.dtype, ", not a number autosp reads");
    }
  }
  return out;
}

std::vector<float> TorchProgram::Impl::read_float32s(const StoredTensor& t, int64_t at, int64_t count,
                                                     const std::string& name) const {
  if (t.dtype != kFloat32 && t.dtype != kComplexFloat)
    user_error(path, ": ", name, " has dtype code ", t.dtype, ", not float32 or complex64");
  const int64_t floats = numel(t.shape) * (t.dtype == kComplexFloat ? 2 : 1);
  AUTOSP_CHECK(at >= 0 && count >= 0 && at + count <= floats, "read of floats [", at, ", ", at + count, ") of ",
               floats);
  const io::ZipArchive::Entry& e = zip.entry(t.entry);
  if (e.size < uint64_t(floats * 4))
    user_error(path, ": ", name, " is ", shape_str(t.shape), " of dtype code ", t.dtype, ", but its entry ", t.entry,
               " has ", e.size, " bytes");
  std::vector<float> out(count);
  zip.read(t.entry, uint64_t(at) * 4, out.data(), uint64_t(count) * 4);
  return out;
}

TorchProgram::TorchProgram(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TorchProgram::~TorchProgram() = default;
TorchProgram::TorchProgram(TorchProgram&&) noexcept = default;
TorchProgram& TorchProgram::operator=(TorchProgram&&) noexcept = default;
const std::string& TorchProgram::path() const { return impl_->path; }
const std::vector<models::ParameterSpec>& TorchProgram::parameters() const { return impl_->specs; }
uint64_t TorchProgram::graph_hash() const { return impl_->graph_hash; }
const std::string& TorchProgram::hf_config() const { return impl_->hf_config; }
int64_t TorchProgram::vocab_size() const {
  if (impl_->vocab == 0) forward({.batch = 1, .seq_len = 2});
  return impl_->vocab;
}

std::vector<float> TorchProgram::read_parameter(size_t i) const {
  AUTOSP_CHECK(i < impl_->specs.size(), "parameter ", i, " of ", impl_->specs.size());
  return impl_->read_floats(impl_->stored.at(impl_->spec_placeholders[i]), impl_->specs[i].name);
}

const std::vector<models::ParameterSpec>& TorchProgram::frozen() const { return impl_->frozen; }
const std::vector<models::ParameterSpec>& TorchProgram::constants() const {
  vocab_size();  // (a forward imported: the stored tables it reads are known)
  return impl_->constants;
}

std::vector<float> TorchProgram::read_constant(size_t k) const {
  AUTOSP_CHECK(k < impl_->constants.size(), "constant ", k, " of ", impl_->constants.size());
  return impl_->read_floats(impl_->stored.at(impl_->constant_placeholders[k]), impl_->constants[k].name);
}

models::Model TorchProgram::model() const {
  return {impl_->path, parameters(), vocab_size(), [this](const models::LlamaTraceOptions& o) { return forward(o); },
          constants(), [this](size_t k) { return read_constant(k); }};
}

std::vector<float> TorchProgram::read_frozen(size_t i) const {
  AUTOSP_CHECK(i < impl_->frozen.size(), "frozen tensor ", i, " of ", impl_->frozen.size());
  return impl_->read_floats(impl_->stored.at(impl_->frozen_placeholders[i]), impl_->frozen[i].name);
}

TorchProgram TorchProgram::load(const std::string& path) {
  auto impl = std::make_unique<Impl>(path);
  Impl& m = *impl;
  // The archive's folder: "<name>/models/model.json" (torch 2.6+'s pt2 archive format).
  std::string model_json;
  for (const auto& [name, entry] : m.zip.entries()) {
    const std::string suffix = "models/model.json";
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        name.find('/') == name.size() - suffix.size() - 1) {
      model_json = name;
      m.prefix = name.substr(0, name.size() - suffix.size());
    }
  }
  if (model_json.empty())
    user_error(path, ": no <name>/models/model.json in the archive: not a program torch.export.save (torch >= 2.6) "
               "wrote; export with python/autosp/export.py");
  try {
    m.program = json::parse(m.zip.read_text(model_json));
  } catch (const json::exception& e) {
    user_error(path, ": ", model_json, " is not JSON: ", e.what());
  }
  const std::string where = path + " (" + model_json + ")";
  try {
    const json& gm = field(m.program, "graph_module", where);
    const json& graph = field(gm, "graph", where);
    {
      json semantic = {graph, gm.value("signature", json())};
      std::function<void(json&)> strip = [&](json& j) {
        if (j.is_object()) {
          if (j.contains("target") && j.contains("metadata")) j.erase("metadata");
          for (auto& [k, v] : j.items()) strip(v);
        } else if (j.is_array()) {
          for (json& v : j) strip(v);
        }
      };
      strip(semantic);
      m.graph_hash = fnv1a(semantic.dump());
    }
    std::vector<FxNode> top;
    read_nodes(graph, top, where);
    read_sizes(graph, [](const std::string& s) { return s; }, m.sizes, m.dtype_of);
    m.nodes = canonical_forms(einsum_as_matmul(inline_autocast(std::move(top), where, m.sizes, m.dtype_of), m.dtype_of),
                              m.sizes, m.dtype_of);
    rename_reads_after_inplace(m.nodes);
    for (size_t i = 0; i < m.nodes.size(); ++i) {
      for (const std::string& o : m.nodes[i].outputs) m.producer[o] = i;
      for (const auto& [k, a] : m.nodes[i].args)
        each_value(a, [&](const json& v) {
          std::vector<size_t>& r = m.readers[v.get<std::string>()];
          if (r.empty() || r.back() != i) r.push_back(i);
        });
    }
    const json sym_ints = graph.value("sym_int_values", json::object());  // held: items() views it
    for (const auto& [name, v] : sym_ints.items())
      if (v.contains("as_expr")) m.symbols[name] = v["as_expr"].value("expr_str", "");
    const json& outs = field(graph, "outputs", where);
    if (outs.size() != 1 || tensor_name(outs[0]).empty())
      user_error(where, ": the program returns ", outs.size(), " values; autosp imports forward(input_ids, labels) -> "
                 "loss (one scalar)");
    m.loss = tensor_name(outs[0]);

    // export.py's transformers config.json (kept as text; checked to be a JSON object).
    if (const std::string extra = m.prefix + "extra/config.json"; m.zip.contains(extra)) {
      m.hf_config = m.zip.read_text(extra);
      const json parsed = json::parse(m.hf_config, nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_object()) user_error(path, ": ", extra, " is not a JSON object (a transformers config.json)");
    }
    const json weights = json::parse(m.zip.read_text(m.prefix + "data/weights/model_weights_config.json"));
    json constants = json::object();
    if (m.zip.contains(m.prefix + "data/constants/model_constants_config.json"))
      constants = json::parse(m.zip.read_text(m.prefix + "data/constants/model_constants_config.json"));
    const json& wconfig = field(weights, "config", where + " weights");
    const json& cconfig = constants.value("config", json::object());

    // The values the loss reads, back from it through every node's operands.
    std::set<std::string> reached;
    for (std::vector<std::string> todo{m.loss}; !todo.empty();) {
      const std::string v = todo.back();
      todo.pop_back();
      if (!reached.insert(v).second) continue;
      if (auto it = m.producer.find(v); it != m.producer.end())
        for (const auto& [k, a] : m.nodes[it->second].args)
          each_value(a, [&](const json& u) { todo.push_back(u.get<std::string>()); });
    }
    refuse_lost_inplace_changes(m, reached);
    const json& sig = field(gm, "signature", where);
    std::vector<std::pair<std::string, std::string>> params;  // placeholder, state-dict name
    std::vector<std::pair<std::string, std::string>> kept;     // persistent buffers: placeholder, name
    for (const json& spec : field(sig, "input_specs", where)) {
      if (spec.contains("parameter")) {
        const std::string ph = spec["parameter"]["arg"].value("name", ""), key = spec["parameter"].value("parameter_name", "");
        m.stored[ph] = stored_tensor(wconfig, key, m.prefix + "data/weights/", where);
        params.emplace_back(ph, key);
      } else if (spec.contains("buffer")) {
        const std::string ph = spec["buffer"]["arg"].value("name", ""), key = spec["buffer"].value("buffer_name", "");
        const json& cfg = wconfig.contains(key) ? wconfig : cconfig;
        m.stored[ph] = stored_tensor(cfg, key, m.prefix + (&cfg == &wconfig ? "data/weights/" : "data/constants/"), where);
        if (spec["buffer"].value("persistent", false)) kept.emplace_back(ph, key);
      } else if (spec.contains("tensor_constant")) {
        const std::string ph = spec["tensor_constant"]["arg"].value("name", ""), key = spec["tensor_constant"].value("tensor_constant_name", "");
        m.stored[ph] = stored_tensor(cconfig, key, m.prefix + "data/constants/", where);
      } else if (spec.contains("constant_input")) {
        // a Python constant folded into the signature: nothing to read
      } else if (spec.contains("user_input")) {
        const std::string name = tensor_name(spec["user_input"]["arg"]);
        if (name.empty()) user_error(where, ": a user input that is not a tensor");
        m.user_inputs.push_back(name);
      } else {
        user_error(where, ": an input of kind ", spec.begin().key(), ", which autosp does not import");
      }
    }
    if (m.user_inputs.size() != 2)
      user_error(where, ": the program takes ", m.user_inputs.size(), " inputs; autosp imports forward(input_ids, "
                 "labels) -> loss");
    // The export wrapper's attribute ("model." of python/autosp/export.py) is not part of the model's names.
    m.wrapped = !params.empty();
    for (const auto& [ph, key] : params) m.wrapped = m.wrapped && key.rfind("model.", 0) == 0;
    // A parameter the loss never reads (the correction bias of a router export.py made a moe op
    // of), or one exported with requires_grad=False (frozen by the user), is not trained: it is
    // kept as the program has it, as PyTorch keeps a parameter without a gradient. A frozen one
    // the loss reads is a constant of the graph.
    std::map<std::string, std::string> name_of_entry;  // a tied weight: one entry, two names
    std::set<std::string> read_entries;
    for (const auto& [ph, key] : params)
      if (reached.count(ph)) read_entries.insert(m.stored[ph].entry);
    for (const auto& [ph, key] : params) {
      const StoredTensor& t = m.stored[ph];
      auto [it, first] = name_of_entry.emplace(t.entry, m.state_name(key));
      const std::string& name = it->second;  // the first name of a tied weight (the embedding's)
      m.parameter_of[ph] = name;
      if (!first) continue;
      if (t.dtype != kFloat32 && t.dtype != kBFloat16 && t.dtype != kFloat16)
        user_error(where, ": parameter ", name, " has dtype code ", t.dtype, "; autosp trains f32, bf16 or f16 weights");
      const bool read = read_entries.count(t.entry) != 0;
      if (!read || !t.requires_grad) {
        if (read) {
          m.constants.push_back({name, t.shape});
          m.constant_placeholders.push_back(ph);
          m.frozen_read.insert(name);
        }
        m.frozen.push_back({name, t.shape});
        m.frozen_placeholders.push_back(ph);
        continue;
      }
      m.specs.push_back({name, t.shape});
      m.spec_placeholders.push_back(ph);
    }
    // Persistent floating buffers belong to the model's state dict too (DeepSeek-V3's and
    // GLM-4.5's router correction bias).
    for (const auto& [ph, key] : kept) {
      const StoredTensor& t = m.stored[ph];
      if (t.dtype != kFloat32 && t.dtype != kBFloat16 && t.dtype != kFloat16) continue;
      m.frozen.push_back({m.state_name(key), t.shape});
      m.frozen_placeholders.push_back(ph);
    }
  } catch (const json::exception& e) {
    user_error(where, ": malformed exported program: ", e.what());
  }
  return TorchProgram(std::move(impl));
}

// ---------------------------------------------------------------------------------------------
// The import proper: from the loss back to the inputs, each needed node once.

namespace {

// What a value of the exported graph is, as the importer sees it.
struct Imported {
  enum Kind { tensor, positions, labels_raw, labels_padded, host, rope_table, tuple, integer, none } kind = none;
  Tensor t;                    // tensor: the IR value
  std::vector<int64_t> perm;   // tensor: torch's value is transpose(t, perm) (empty: t itself)
  Shape shape;                 // the torch shape (tensor, positions, host)
  int64_t offset = 0;          // positions: the value is the positions plus this (OPT's learned offset 2)
  // tensor: a table read at the positions (a learned position embedding), [S, H] or [1, S, H]
  // in torch and [B, S, H] in the IR, where it adds to [B, S, H] alike (its rows are not merged).
  bool per_position = false;
  std::vector<float> data;     // host: the values (a buffer or constant); rope_table: inv_freq
  double number = 0;           // integer; rope_table: attention scaling
  bool is_cos = false;         // rope_table
  bool interleaved = false;    // rope_table: each frequency twice in a row (repeat_interleave), not cat(f, f)
  // rope_table of a stored sin/cos table read at the positions (GPT-J's embed_positions): `sincos`
  // both halves [sin(p f) | cos(p f)], split into the `half`s (each frequency once), is_cos says which.
  bool sincos = false, half = false;
  std::vector<std::string> items;  // tuple: the value names it holds
  // rope_table of a stored cos or sin table [R, 2F] (cat(freqs, freqs)) read at the positions:
  // its name; the frequencies (data) come from the pair, when the rope finds both (match_rope).
  std::string cached;
};

bool is_identity(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != int64_t(i)) return false;
  return true;
}

}  // namespace

// (torch_import.h) The table is all the graph says of the rope, so the scaling's parameters are
// solved from it, and a candidate is kept only if its theta and factor are round (a model's
// are: a whole theta, a factor in steps of 1e-3, and llama3's band edges alike; yarn's betas are
// solved for any original length) and every frequency cpu::rope_inv_freq gives for it (the
// kernels' own, in double) is within 1e-6 of torch's, which is fp32's rounding of the exact
// ones (~1e-7). Anything else, a non-round fit included (a few frequencies fit many a
// parameter set to 1e-5), is nullopt: the table itself is then exact, and the importer takes it.
// An llama3 table with fewer than two frequencies between its bands is solved as yarn's ramp,
// which gives it the same values.
std::optional<RopeOptions> rope_from_inv_freq(const std::vector<float>& f, int64_t D) {
  constexpr double kTolerance = 1e-5, kRound = 1e-6, kPi = 3.14159265358979323846;
  const size_t n = f.size();
  if (n < 2 || int64_t(n) * 2 != D) return std::nullopt;
  for (float x : f)
    if (!(x > 0) || !std::isfinite(x)) return std::nullopt;
  // The round candidate whose frequencies are nearest torch's.
  std::optional<RopeOptions> best;
  double best_error = kRound;
  auto consider = [&](const RopeOptions& o) {
    if (!(o.theta > 1) || !std::isfinite(o.theta)) return;
    std::vector<double> g(n);
    try {
      cpu::rope_inv_freq(D, o.theta, rope_scaling(rope_attrs(o)), g.data());
    } catch (const std::exception&) {
      return;
    }
    double error = 0;
    for (size_t i = 0; i < n; ++i) {
      const double e = std::abs(double(f[i]) - g[i]) / g[i];
      if (!(e <= kRound)) return;  // (NaN too)
      error = std::max(error, e);
    }
    if (!best || error < best_error) best = o, best_error = error;
  };
  auto round_to = [](double x, double unit) { return std::round(x / unit) * unit; };
  // Two frequencies scaled alike (both unscaled, or both divided by the factor) i and k apart are
  // theta^(2 (k - i) / D) apart: frequency 0 against each in the high band, each in the low band
  // against the last. The farther apart, the nearer the estimate.
  std::vector<double> thetas;
  for (size_t k = 1; k < n; ++k) {
    thetas.push_back(std::pow(double(f[0]) / double(f[k]), double(D) / (2.0 * double(k))));
    thetas.push_back(std::pow(double(f[n - 1 - k]) / double(f[n - 1]), double(D) / (2.0 * double(k))));
  }
  std::sort(thetas.begin(), thetas.end());
  thetas.erase(std::unique(thetas.begin(), thetas.end()), thetas.end());
  for (const double estimate : thetas) {
    RopeOptions o;
    o.theta = std::round(estimate);
    consider(o);
    o.rope_type = "linear";
    o.factor = round_to(1.0 / double(f[0]), 1e-3);
    consider(o);
    // llama3 and yarn: frequency 0 unscaled, the last divided by the factor, and between them
    // each scaled by a share s of (1 - 1 / factor): f / f_default = 1 - s (1 - 1 / factor).
    std::vector<double> def(n), share(n);
    for (size_t i = 0; i < n; ++i) def[i] = 1.0 / std::pow(o.theta, double(2 * i) / double(D));
    const double fitted_factor = def[n - 1] / double(f[n - 1]);
    if (!(fitted_factor > 1 + kTolerance)) continue;
    const double factor = round_to(fitted_factor, 1e-3);
    std::vector<size_t> between;  // 0 < s < 1
    for (size_t i = 0; i < n; ++i) {
      share[i] = (1.0 - double(f[i]) / def[i]) / (1.0 - 1.0 / factor);
      if (share[i] > kTolerance * factor && share[i] < 1 - kTolerance * factor) between.push_back(i);
    }
    RopeOptions scaled = o;
    scaled.factor = factor;
    if (between.size() >= 2) {
      // llama3: 1 - s = (orig / wavelen - low) / (high - low) with wavelen = 2 pi / f_default,
      // linear in f_default: A f_default + C. With low = 1: high = 1 - 1 / C, orig = -2 pi A / C.
      const size_t i1 = between.front(), i2 = between.back();
      const double A = (share[i1] - share[i2]) / (def[i2] - def[i1]), C = 1.0 - share[i1] - A * def[i1];
      RopeOptions l = scaled;
      l.rope_type = "llama3";
      l.low_freq_factor = 1.0;
      l.high_freq_factor = round_to(1.0 - 1.0 / C, 1e-3);
      l.original_max_position_embeddings = std::round(-2 * kPi * A / C);
      consider(l);
    }
    // yarn: s is a ramp over the index, (i - low) / (high - low) clamped to [0, 1]; its ends
    // are where correction_dim(beta) = D ln(orig / (2 pi beta)) / (2 ln theta) falls.
    double low = 0, high = 0;
    if (between.size() >= 2) {
      const size_t i1 = between.front(), i2 = between.back();
      const double slope = (share[i2] - share[i1]) / double(i2 - i1);
      low = double(i1) - share[i1] / slope;
      high = low + 1.0 / slope;
    } else if (between.size() == 1) {
      low = double(between[0]) - share[between[0]];
      high = low + 1.0;
    } else {
      size_t j = 0;
      while (j < n && share[j] < 0.5) ++j;
      low = double(j) - 1.0;
      high = double(j);
    }
    if (low < 0) continue;
    // The ends whole where they are near (transformers truncates them): the ramp's own.
    if (std::abs(low - std::round(low)) < 1e-3 && std::abs(high - std::round(high)) < 1e-3)
      low = std::round(low), high = std::round(high);
    RopeOptions y = scaled;
    y.rope_type = "yarn";
    y.truncate = false;
    y.original_max_position_embeddings = 4096.0;  // any: the betas are solved for it
    const auto beta = [&](double at) {
      return y.original_max_position_embeddings / (2 * kPi) * std::exp(-at * 2.0 * std::log(o.theta) / double(D));
    };
    y.beta_fast = beta(low);
    y.beta_slow = beta(high);
    consider(y);
  }
  return best;
}

// A value the graph computes from sizes and constants alone (an attention mask), evaluated on
// the host at a given batch and sequence length; nullopt for anything that reads the data or
// an op it does not know. Arrays are float (indices, bools as 0 / 1, fill values); each is
// capped at 2^24 elements.
struct HostArray {
  Shape shape;
  std::vector<float> v;
};

class HostEvaluator {
 public:
  // max_elements caps every array (an op that would make a larger one is not evaluated).
  // max_stored caps the stored tensors it reads (default: max_elements).
  HostEvaluator(const TorchProgram::Impl& m, int64_t batch, int64_t seq, int64_t max_elements = int64_t(1) << 24,
                int64_t max_stored = 0)
      : m_(m), batch_(batch), seq_(seq), max_elements_(max_elements), max_stored_(max_stored ? max_stored : max_elements) {}

  const HostArray* eval(const std::string& name) {
    auto it = memo_.find(name);
    if (it == memo_.end()) {
      const bool stored = read_stored;
      const double largest = largest_constant;
      read_stored = false, largest_constant = 0;
      Entry e{make(name), false, 0};
      if (e.value && numel(e.value->shape) != int64_t(e.value->v.size())) e.value.reset();
      e.read_stored = read_stored, e.largest_constant = largest_constant;
      read_stored = stored, largest_constant = largest;
      it = memo_.emplace(name, std::move(e)).first;
    }
    read_stored = read_stored || it->second.read_stored;
    largest_constant = std::max(largest_constant, it->second.largest_constant);
    return it->second.value ? &*it->second.value : nullptr;
  }
  // Whether the evaluations since the last reset read a stored tensor, and the largest
  // magnitude of a constant they computed with (fill values excluded): what decides whether a
  // mask checked at one length is the mask at another.
  bool read_stored = false;
  double largest_constant = 0;
  void reset() { read_stored = false, largest_constant = 0; }

 private:
  const TorchProgram::Impl& m_;
  const int64_t batch_, seq_;
  struct Entry {
    std::optional<HostArray> value;
    bool read_stored;
    double largest_constant;
  };
  std::map<std::string, Entry> memo_;
  const int64_t max_elements_, max_stored_;

  static const json* arg(const FxNode& n, const std::string& name, size_t position) {
    for (const auto& [k, v] : n.args)
      if (k == name) return &v;
    return position < n.args.size() && n.args[position].first.empty() ? &n.args[position].second : nullptr;
  }
  const FxNode* node_of(const std::string& name) const {
    auto it = m_.producer.find(name);
    return it == m_.producer.end() ? nullptr : &m_.nodes[it->second];
  }
  void constant(double c) { largest_constant = std::max(largest_constant, std::abs(c)); }

  std::optional<int64_t> sym(const std::string& name) {
    const FxNode* n = node_of(name);
    if (!n) return std::nullopt;
    const std::string& t = n->target;
    if (t == "torch.ops.aten.sym_size.int") {
      const json* x = arg(*n, "self", 0);
      std::optional<int64_t> d = x ? integer(arg(*n, "dim", 1)) : std::nullopt;
      if (!d) return std::nullopt;
      const std::string xs = tensor_name(*x);
      if (xs == m_.user_inputs[0] || xs == m_.user_inputs[1]) {
        if (*d == 0 || *d == -2) return batch_;
        if (*d == 1 || *d == -1) return seq_;
        return std::nullopt;
      }
      const HostArray* a = eval(xs);
      const int64_t r = a ? int64_t(a->shape.size()) : 0;
      if (!a || *d < -r || *d >= r) return std::nullopt;
      return a->shape[*d < 0 ? *d + r : *d];
    }
    std::vector<int64_t> xs;
    for (const auto& [k, a] : n->args) {
      std::optional<int64_t> v = integer(&a);
      if (!v) return std::nullopt;
      xs.push_back(*v);
    }
    if (xs.size() == 2 && t == "_operator.add") return xs[0] + xs[1];
    if (xs.size() == 2 && t == "_operator.sub") return xs[0] - xs[1];
    if (xs.size() == 2 && t == "_operator.mul") return xs[0] * xs[1];
    if (xs.size() == 2 && t == "_operator.floordiv" && xs[1] != 0) return xs[0] / xs[1];
    if (xs.size() == 1 && t == "_operator.neg") return -xs[0];
    if (xs.size() == 2 && t == "torch.sym_max") return std::max(xs[0], xs[1]);  // MPT's slice bounds
    if (xs.size() == 2 && t == "torch.sym_min") return std::min(xs[0], xs[1]);
    return std::nullopt;
  }
  std::optional<int64_t> integer(const json* a) {
    if (!a) return std::nullopt;
    if (a->contains("as_int")) return (*a)["as_int"].get<int64_t>();
    if (a->contains("as_sym_int")) {
      const json& s = (*a)["as_sym_int"];
      if (s.contains("as_int")) return s["as_int"].get<int64_t>();
      if (s.contains("as_name")) return sym(s["as_name"].get<std::string>());
    }
    return std::nullopt;
  }
  std::optional<std::vector<int64_t>> integers(const json* a) {
    if (!a) return std::nullopt;
    if (a->contains("as_ints")) return (*a)["as_ints"].get<std::vector<int64_t>>();
    if (!a->contains("as_sym_ints")) return std::nullopt;
    std::vector<int64_t> out;
    for (const json& s : (*a)["as_sym_ints"]) {
      std::optional<int64_t> v = s.contains("as_int") ? std::optional<int64_t>(s["as_int"].get<int64_t>())
                                                      : sym(s.value("as_name", ""));
      if (!v) return std::nullopt;
      out.push_back(*v);
    }
    return out;
  }
  // A number argument, or a tensor one evaluated.
  std::optional<HostArray> operand(const json* a, bool fill = false) {
    if (!a) return std::nullopt;
    double c;
    if (a->contains("as_float")) c = float_of((*a)["as_float"]);
    else if (a->contains("as_int")) c = double((*a)["as_int"].get<int64_t>());
    else if (a->contains("as_bool")) c = (*a)["as_bool"].get<bool>() ? 1.0 : 0.0;
    else if (a->contains("as_sym_int")) {
      std::optional<int64_t> v = integer(a);
      if (!v) return std::nullopt;
      c = double(*v);
    } else {
      const HostArray* t = eval(tensor_name(*a));
      return t ? std::optional<HostArray>(*t) : std::nullopt;
    }
    if (!fill) constant(c);
    return HostArray{{}, {float(c)}};
  }

  static std::optional<Shape> broadcast_shape(const Shape& a, const Shape& b) {
    Shape out(std::max(a.size(), b.size()), 1);
    for (size_t i = 0; i < out.size(); ++i) {
      const int64_t x = i < out.size() - a.size() ? 1 : a[i - (out.size() - a.size())];
      const int64_t y = i < out.size() - b.size() ? 1 : b[i - (out.size() - b.size())];
      if (x != y && x != 1 && y != 1) return std::nullopt;
      out[i] = std::max(x, y);
    }
    return out;
  }
  std::optional<HostArray> expand(const HostArray& a, const Shape& to) const {
    if (numel(to) > max_elements_ || to.size() < a.shape.size()) return std::nullopt;
    const size_t r = to.size(), pad = r - a.shape.size();
    std::vector<int64_t> stride(r, 0);
    for (int64_t i = int64_t(r) - 1, st = 1; i >= int64_t(pad); --i) {
      const int64_t d = a.shape[i - pad];
      if (d != to[i] && d != 1) return std::nullopt;
      stride[i] = d == 1 ? 0 : st;
      st *= d;
    }
    HostArray out{to, std::vector<float>(numel(to))};
    std::vector<int64_t> idx(r, 0);
    for (size_t k = 0; k < out.v.size(); ++k) {
      int64_t off = 0;
      for (size_t i = 0; i < r; ++i) off += idx[i] * stride[i];
      out.v[k] = a.v[off];
      for (int64_t i = int64_t(r) - 1; i >= 0 && ++idx[i] == to[i]; --i) idx[i] = 0;
    }
    return out;
  }
  template <typename F>
  std::optional<HostArray> elementwise(std::vector<HostArray> xs, F f) const {
    Shape shape;
    for (const HostArray& x : xs) {
      std::optional<Shape> s = broadcast_shape(shape, x.shape);
      if (!s) return std::nullopt;
      shape = *s;
    }
    for (HostArray& x : xs)
      if (x.shape != shape) {
        std::optional<HostArray> e = expand(x, shape);
        if (!e) return std::nullopt;
        x = std::move(*e);
      }
    HostArray out{shape, std::vector<float>(numel(shape))};
    for (size_t k = 0; k < out.v.size(); ++k) out.v[k] = f(xs, k);
    return out;
  }
  static std::optional<HostArray> permuted(const HostArray& a, const std::vector<int64_t>& p) {
    const size_t r = a.shape.size();
    if (p.size() != r) return std::nullopt;
    Shape to(r);
    std::vector<int64_t> in_stride(r, 1);
    for (int64_t i = int64_t(r) - 2; i >= 0; --i) in_stride[i] = in_stride[i + 1] * a.shape[i + 1];
    for (size_t i = 0; i < r; ++i) to[i] = a.shape[p[i]];
    HostArray out{to, std::vector<float>(a.v.size())};
    std::vector<int64_t> idx(r, 0);
    for (size_t k = 0; k < out.v.size(); ++k) {
      int64_t off = 0;
      for (size_t i = 0; i < r; ++i) off += idx[i] * in_stride[p[i]];
      out.v[k] = a.v[off];
      for (int64_t i = int64_t(r) - 1; i >= 0 && ++idx[i] == to[i]; --i) idx[i] = 0;
    }
    return out;
  }

  std::optional<HostArray> make(const std::string& name) {
    if (m_.stored.count(name) && !m_.parameter_of.count(name)) {
      read_stored = true;
      const StoredTensor& t = m_.stored.at(name);
      if (numel(t.shape) > max_stored_) return std::nullopt;
      return HostArray{t.shape, m_.read_floats(t, name)};
    }
    const FxNode* np = node_of(name);
    if (!np) return std::nullopt;  // a parameter or the data
    const FxNode& n = *np;
    const std::string prefix = "torch.ops.aten.";
    if (n.target.rfind(prefix, 0) != 0) return std::nullopt;
    const std::string op = n.target.substr(prefix.size());
    auto in = [&](const char* a, size_t pos) -> const HostArray* {
      const json* j = arg(n, a, pos);
      return j ? eval(tensor_name(*j)) : nullptr;
    };
    auto num = [&](const char* a, size_t pos, double def) {
      const json* j = arg(n, a, pos);
      if (!j || j->contains("as_none")) return def;
      std::optional<HostArray> o = operand(j);
      return o && o->v.size() == 1 ? double(o->v[0]) : std::nan("");
    };
    if (op == "contiguous.default" || op == "alias.default" || op == "clone.default" || op == "detach.default" ||
        op == "detach_.default" || op == "lift_fresh_copy.default") {
      const HostArray* x = in("self", 0);
      return x ? std::optional<HostArray>(*x) : std::nullopt;
    }
    if (op == "to.dtype" || op == "_to_copy.default" || op == "to.dtype_layout" || op == "to.device") {
      const HostArray* x = in("self", 0);
      if (!x) return std::nullopt;
      HostArray out = *x;
      const json* d = arg(n, "dtype", op == "to.device" ? 2 : 1);
      const int dt = d && d->contains("as_scalar_type") ? (*d)["as_scalar_type"].get<int>() : kFloat32;
      for (float& f : out.v)
        f = dt == kBool ? float(f != 0) : (dt == kFloat32 || dt == kFloat64 || dt == kBFloat16 || dt == kFloat16) ? f : std::trunc(f);
      return out;
    }
    if (op == "arange.default" || op == "arange.start" || op == "arange.start_step") {
      const bool with_start = op != "arange.default";
      std::optional<int64_t> start = with_start ? integer(arg(n, "start", 0)) : std::optional<int64_t>(0);
      std::optional<int64_t> end = integer(arg(n, "end", with_start ? 1 : 0));
      std::optional<int64_t> step = op == "arange.start_step" ? integer(arg(n, "step", 2)) : std::optional<int64_t>(1);
      if (!start || !end || !step || *step == 0) return std::nullopt;
      if ((double(*end) - double(*start)) / double(*step) > double(max_elements_)) return std::nullopt;
      constant(double(*start)), constant(double(*step));
      HostArray out;
      for (int64_t i = *start; *step > 0 ? i < *end : i > *end; i += *step) out.v.push_back(float(i));
      out.shape = {int64_t(out.v.size())};
      return out;
    }
    if (op == "full.default" || op == "ones.default" || op == "zeros.default" || op == "new_ones.default" ||
        op == "new_zeros.default" || op == "new_full.default") {
      const bool is_new = op.rfind("new_", 0) == 0;
      std::optional<std::vector<int64_t>> size = integers(arg(n, "size", is_new ? 1 : 0));
      if (!size || numel(*size) > max_elements_) return std::nullopt;
      double fill = op.find("ones") != std::string::npos ? 1.0 : 0.0;
      if (op == "full.default" || op == "new_full.default") {
        std::optional<HostArray> f = operand(arg(n, "fill_value", is_new ? 2 : 1), /*fill=*/true);
        if (!f || f->v.size() != 1) return std::nullopt;
        fill = f->v[0];
      }
      return HostArray{*size, std::vector<float>(numel(*size), float(fill))};
    }
    if (op == "ones_like.default" || op == "zeros_like.default" || op == "full_like.default") {
      const HostArray* x = in("self", 0);
      if (!x) return std::nullopt;
      double fill = op == "ones_like.default" ? 1.0 : 0.0;
      if (op == "full_like.default") {
        std::optional<HostArray> f = operand(arg(n, "fill_value", 1), /*fill=*/true);
        if (!f || f->v.size() != 1) return std::nullopt;
        fill = f->v[0];
      }
      return HostArray{x->shape, std::vector<float>(x->v.size(), float(fill))};
    }
    if (op == "triu.default" || op == "tril.default") {
      const HostArray* x = in("self", 0);
      std::optional<int64_t> k = arg(n, "diagonal", 1) ? integer(arg(n, "diagonal", 1)) : std::optional<int64_t>(0);
      if (!x || !k || x->shape.size() < 2) return std::nullopt;
      constant(double(*k));
      HostArray out = *x;
      const int64_t R = x->shape[x->shape.size() - 2], C = x->shape.back();
      const bool upper = op == "triu.default";
      for (size_t k0 = 0; k0 < out.v.size(); ++k0) {
        const int64_t i = int64_t(k0 / C) % R, j = int64_t(k0 % C);
        if (upper ? j - i < *k : j - i > *k) out.v[k0] = 0;
      }
      return out;
    }
    // Elementwise, with broadcasting; the second operand a tensor or a number.
    using Fn = float (*)(float, float);
    static const std::map<std::string, Fn> binary = {
        {"add", [](float a, float b) { return a + b; }},  {"sub", [](float a, float b) { return a - b; }},
        {"mul", [](float a, float b) { return a * b; }},  {"div", [](float a, float b) { return a / b; }},
        {"rsub", [](float a, float b) { return b - a; }},  // other - self (BERT's 1 - mask)
        {"gt", [](float a, float b) { return float(a > b); }}, {"lt", [](float a, float b) { return float(a < b); }},
        {"ge", [](float a, float b) { return float(a >= b); }}, {"le", [](float a, float b) { return float(a <= b); }},
        {"eq", [](float a, float b) { return float(a == b); }}, {"ne", [](float a, float b) { return float(a != b); }},
        {"bitwise_and", [](float a, float b) { return float(a != 0 && b != 0); }},
        {"bitwise_or", [](float a, float b) { return float(a != 0 || b != 0); }},
        {"logical_and", [](float a, float b) { return float(a != 0 && b != 0); }},
        {"logical_or", [](float a, float b) { return float(a != 0 || b != 0); }},
        {"__and__", [](float a, float b) { return float(a != 0 && b != 0); }},
        {"__or__", [](float a, float b) { return float(a != 0 || b != 0); }},
        {"maximum", [](float a, float b) { return std::max(a, b); }},
        {"minimum", [](float a, float b) { return std::min(a, b); }}};
    const std::string base = op.substr(0, op.find('.')), overload = op.substr(op.find('.') + 1);
    std::string fn = base;
    if (!fn.empty() && fn.back() == '_' && fn.front() != '_') fn.pop_back();  // in place: the graph's order is kept
    if (auto f = binary.find(fn); f != binary.end() && (overload == "Tensor" || overload == "Scalar")) {
      const HostArray* a = in("self", 0);
      std::optional<HostArray> b = operand(arg(n, "other", 1));
      if (!a || !b) return std::nullopt;
      const double alpha = num("alpha", 2, 1.0);
      if (std::isnan(alpha)) return std::nullopt;
      if (alpha != 1.0 && (fn == "add" || fn == "sub"))
        for (float& v : b->v) v = float(v * alpha);
      HostArray self = *a;
      if (alpha != 1.0 && fn == "rsub")  // other - alpha self
        for (float& v : self.v) v = float(v * alpha);
      Fn g = f->second;
      return elementwise({std::move(self), *b}, [g](const std::vector<HostArray>& x, size_t k) { return g(x[0].v[k], x[1].v[k]); });
    }
    // Powers (MPT's and BLOOM's ALiBi slopes, 1 / 2^x and base^k): a tensor or a number to a
    // tensor or a number, in float as torch computes them; and reciprocals.
    if (op == "pow.Tensor_Scalar" || op == "pow.Scalar" || op == "pow.Tensor_Tensor") {
      std::optional<HostArray> a = operand(arg(n, "self", 0)), b = operand(arg(n, "exponent", 1));
      if (!a || !b) return std::nullopt;
      return elementwise({*a, *b},
                         [](const std::vector<HostArray>& x, size_t k) { return std::pow(x[0].v[k], x[1].v[k]); });
    }
    // x[i_0, ..., i_{k-1}] of k index tensors broadcast together, over x's first k dims (transformers
    // 5's masks: the positions and document ids read at [batch, query] and [batch, key]).
    if (op == "index.Tensor") {
      const HostArray* x = in("self", 0);
      const json* list = arg(n, "indices", 1);
      // (torch writes a list with no None as_tensors of names, else as_optional_tensors)
      const char* key = list && list->contains("as_tensors") ? "as_tensors" : "as_optional_tensors";
      if (!x || !list || !list->contains(key)) return std::nullopt;
      std::vector<HostArray> idx;
      Shape shape;
      for (const json& t : (*list)[key]) {
        const std::string name = t.contains("as_tensor") ? t["as_tensor"].value("name", "") : t.value("name", "");
        const HostArray* i = name.empty() ? nullptr : eval(name);
        if (!i) return std::nullopt;  // (a None: a slice kept whole, not evaluated here)
        std::optional<Shape> b = broadcast_shape(shape, i->shape);
        if (!b) return std::nullopt;
        shape = *b;
        idx.push_back(*i);
      }
      const size_t k = idx.size();
      if (k == 0 || k > x->shape.size()) return std::nullopt;
      for (HostArray& i : idx)
        if (i.shape != shape) {
          std::optional<HostArray> e = expand(i, shape);
          if (!e) return std::nullopt;
          i = std::move(*e);
        }
      int64_t inner = 1;
      for (size_t d = k; d < x->shape.size(); ++d) inner *= x->shape[d];
      Shape to = shape;
      to.insert(to.end(), x->shape.begin() + int64_t(k), x->shape.end());
      if (numel(to) > max_elements_) return std::nullopt;
      HostArray out{to, {}};
      out.v.reserve(numel(to));
      for (int64_t b = 0; b < numel(shape); ++b) {
        int64_t at = 0;
        for (size_t d = 0; d < k; ++d) {
          const int64_t size = x->shape[d];
          int64_t i = int64_t(idx[d].v[b]);
          if (i < 0) i += size;
          if (i < 0 || i >= size) return std::nullopt;
          at = at * size + i;
        }
        out.v.insert(out.v.end(), x->v.begin() + at * inner, x->v.begin() + (at + 1) * inner);
      }
      return out;
    }
    // x[..., j + 1] - x[..., j] along a dim, after prepend and before append (n = 1): transformers
    // 5's test of the positions for packed documents.
    if (op == "diff.default") {
      const HostArray* x = in("self", 0);
      if (!x || x->shape.empty()) return std::nullopt;
      if (arg(n, "n", 1) && integer(arg(n, "n", 1)) != 1) return std::nullopt;
      const int64_t r = int64_t(x->shape.size());
      std::optional<int64_t> d0 = arg(n, "dim", 2) ? integer(arg(n, "dim", 2)) : std::optional<int64_t>(-1);
      if (!d0 || *d0 < -r || *d0 >= r) return std::nullopt;
      const int64_t d = *d0 < 0 ? *d0 + r : *d0;
      std::vector<const HostArray*> parts;
      for (const auto& [name, pos] : {std::pair<const char*, size_t>{"prepend", 3}, {"", 0}, {"append", 4}}) {
        if (!*name) {
          parts.push_back(x);
          continue;
        }
        const json* a = arg(n, name, pos);
        if (!a || a->contains("as_none")) continue;
        const HostArray* p = a->contains("as_tensor") ? eval((*a)["as_tensor"].value("name", "")) : nullptr;
        if (!p || p->shape.size() != x->shape.size()) return std::nullopt;
        for (int64_t i = 0; i < r; ++i)
          if (i != d && p->shape[i] != x->shape[i]) return std::nullopt;
        parts.push_back(p);
      }
      int64_t outer = 1, inner = 1, len = 0;
      for (int64_t i = 0; i < d; ++i) outer *= x->shape[i];
      for (int64_t i = d + 1; i < r; ++i) inner *= x->shape[i];
      for (const HostArray* p : parts) len += p->shape[d];
      if (len < 1) return std::nullopt;
      std::vector<float> joined;  // [outer, len, inner]
      joined.reserve(size_t(outer * len * inner));
      for (int64_t o = 0; o < outer; ++o)
        for (const HostArray* p : parts) {
          const int64_t block = p->shape[d] * inner;
          joined.insert(joined.end(), p->v.begin() + o * block, p->v.begin() + (o + 1) * block);
        }
      Shape to = x->shape;
      to[d] = len - 1;
      HostArray out{to, std::vector<float>(size_t(numel(to)))};
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t j = 0; j + 1 < len; ++j)
          for (int64_t i = 0; i < inner; ++i)
            out.v[(o * (len - 1) + j) * inner + i] =
                joined[(o * len + j + 1) * inner + i] - joined[(o * len + j) * inner + i];
      return out;
    }
    // out[i] = x[i with i_d replaced by index[i]] along dim d (transformers 5's BERT: its token
    // types gathered at the positions)
    if (op == "gather.default") {
      const HostArray* x = in("self", 0);
      const HostArray* index = in("index", 2);
      if (!x || !index || x->shape.size() != index->shape.size() || x->shape.empty()) return std::nullopt;
      const int64_t r = int64_t(x->shape.size());
      std::optional<int64_t> d0 = integer(arg(n, "dim", 1));
      if (!d0 || *d0 < -r || *d0 >= r) return std::nullopt;
      const int64_t d = *d0 < 0 ? *d0 + r : *d0;
      for (int64_t i = 0; i < r; ++i)
        if (i != d && index->shape[i] > x->shape[i]) return std::nullopt;
      HostArray out{index->shape, std::vector<float>(index->v.size())};
      std::vector<int64_t> idx(r, 0), stride(r, 1);
      for (int64_t i = r - 2; i >= 0; --i) stride[i] = stride[i + 1] * x->shape[i + 1];
      for (size_t k = 0; k < out.v.size(); ++k) {
        int64_t at = 0;
        for (int64_t i = 0; i < r; ++i) {
          int64_t j = idx[i];
          if (i == d) {
            j = int64_t(index->v[k]);
            if (j < 0) j += x->shape[d];
            if (j < 0 || j >= x->shape[d]) return std::nullopt;
          }
          at += j * stride[i];
        }
        out.v[k] = x->v[at];
        for (int64_t i = r - 1; i >= 0 && ++idx[i] == index->shape[i]; --i) idx[i] = 0;
      }
      return out;
    }
    if (op == "copy_.default") {  // all of self overwritten by src (BLOOM's causal mask): src as self's shape
      const HostArray* self = in("self", 0);
      const HostArray* src = in("src", 1);
      if (!self || !src) return std::nullopt;
      return expand(*src, self->shape);
    }
    if (op == "reciprocal.default") {
      const HostArray* x = in("self", 0);
      if (!x) return std::nullopt;
      HostArray out = *x;
      for (float& f : out.v) f = 1.0f / f;
      return out;
    }
    // along one dim, operands of one rank (MPT's slopes of 6 heads)
    if (op == "cat.default" || op == "concat.default") {
      const json* ts = arg(n, "tensors", 0);
      if (!ts || !ts->contains("as_tensors") || (*ts)["as_tensors"].empty()) return std::nullopt;
      std::vector<const HostArray*> xs;
      for (const json& t : (*ts)["as_tensors"]) {
        const HostArray* x = eval(t.value("name", ""));
        if (!x || (!xs.empty() && x->shape.size() != xs[0]->shape.size())) return std::nullopt;
        xs.push_back(x);
      }
      const int64_t r = int64_t(xs[0]->shape.size());
      std::optional<int64_t> d0 = arg(n, "dim", 1) ? integer(arg(n, "dim", 1)) : std::optional<int64_t>(0);
      if (r == 0 || !d0 || *d0 < -r || *d0 >= r) return std::nullopt;
      const int64_t d = *d0 < 0 ? *d0 + r : *d0;
      Shape to = xs[0]->shape;
      to[d] = 0;
      for (const HostArray* x : xs) {
        for (int64_t i = 0; i < r; ++i)
          if (i != d && x->shape[i] != xs[0]->shape[i]) return std::nullopt;
        to[d] += x->shape[d];
      }
      if (numel(to) > max_elements_) return std::nullopt;
      int64_t outer = 1;
      for (int64_t i = 0; i < d; ++i) outer *= to[i];
      HostArray out{to, {}};
      out.v.reserve(numel(to));
      for (int64_t o = 0; o < outer; ++o)
        for (const HostArray* x : xs) {
          const int64_t block = int64_t(x->v.size()) / std::max<int64_t>(outer, 1);
          out.v.insert(out.v.end(), x->v.begin() + o * block, x->v.begin() + (o + 1) * block);
        }
      return out;
    }
    if (op == "neg.default" || op == "logical_not.default" || op == "bitwise_not.default") {
      const HostArray* x = in("self", 0);
      if (!x) return std::nullopt;
      HostArray out = *x;
      for (float& f : out.v) f = op == "neg.default" ? -f : float(f == 0);
      return out;
    }
    if (op == "where.self" || op == "where.ScalarOther" || op == "where.ScalarSelf" || op == "where.Scalar") {
      const HostArray* c = in("condition", 0);
      std::optional<HostArray> a = operand(arg(n, "self", 1), true), b = operand(arg(n, "other", 2), true);
      if (!c || !a || !b) return std::nullopt;
      return elementwise({*c, *a, *b}, [](const std::vector<HostArray>& x, size_t k) {
        return x[0].v[k] != 0 ? x[1].v[k] : x[2].v[k];
      });
    }
    if (op == "masked_fill.Scalar" || op == "masked_fill.Tensor" || op == "masked_fill_.Scalar" ||
        op == "masked_fill_.Tensor") {
      const HostArray *x = in("self", 0), *mask = in("mask", 1);
      std::optional<HostArray> value = operand(arg(n, "value", 2), true);
      if (!x || !mask || !value || value->v.size() != 1) return std::nullopt;
      return elementwise({*x, *mask, *value}, [](const std::vector<HostArray>& y, size_t k) {
        return y[1].v[k] != 0 ? y[2].v[k] : y[0].v[k];
      });
    }
    // Shapes. (Any other op is not evaluated, nor what it reads: the scores, the model.)
    // And cumsum along a dim (OPT's positions: the cumsum of a mask of ones).
    static const std::set<std::string> shapes = {"unsqueeze.default", "squeeze.dim", "expand.default", "view.default",
                                                 "reshape.default", "_unsafe_view.default", "permute.default",
                                                 "transpose.int", "slice.Tensor", "select.int", "cumsum.default",
                                                 "repeat.default"};
    if (!shapes.count(op)) return std::nullopt;
    const HostArray* x = in("self", 0);
    if (!x) return std::nullopt;
    const int64_t r = int64_t(x->shape.size());
    auto dim_arg = [&](const char* a, size_t pos, int64_t rank) -> std::optional<int64_t> {
      std::optional<int64_t> d = integer(arg(n, a, pos));
      if (!d || *d < -rank || *d >= rank) return std::nullopt;
      return *d < 0 ? *d + rank : *d;
    };
    if (op == "cumsum.default") {
      std::optional<int64_t> d = dim_arg("dim", 1, r);
      if (!d) return std::nullopt;
      int64_t inner = 1;
      for (int64_t i = *d + 1; i < r; ++i) inner *= x->shape[i];
      const int64_t len = x->shape[*d];
      HostArray out = *x;
      for (size_t k = 0; k < out.v.size(); ++k)  // each element adds the one before it along d
        if ((int64_t(k) / inner) % len != 0) out.v[k] += out.v[k - inner];
      return out;
    }
    if (op == "unsqueeze.default") {
      std::optional<int64_t> d = dim_arg("dim", 1, r + 1);
      if (!d) return std::nullopt;
      HostArray out = *x;
      out.shape.insert(out.shape.begin() + *d, 1);
      return out;
    }
    if (op == "squeeze.dim") {
      std::optional<int64_t> d = dim_arg("dim", 1, r);
      if (!d) return std::nullopt;
      HostArray out = *x;
      if (out.shape[*d] == 1) out.shape.erase(out.shape.begin() + *d);
      return out;
    }
    if (op == "expand.default") {
      std::optional<std::vector<int64_t>> size = integers(arg(n, "size", 1));
      if (!size || size->size() < x->shape.size()) return std::nullopt;
      for (size_t i = 0; i < size->size(); ++i) {
        const size_t pad = size->size() - x->shape.size();
        if ((*size)[i] == -1 && i >= pad) (*size)[i] = x->shape[i - pad];
      }
      return expand(*x, *size);
    }
    // x.repeat(repeats): x (its shape padded with leading 1s) tiled repeats[i] times along dim i
    // (transformers 5's BLOOM: its ALiBi bias [H, 1, S] repeated over the batch).
    if (op == "repeat.default") {
      std::optional<std::vector<int64_t>> repeats = integers(arg(n, "repeats", 1));
      if (!repeats || repeats->size() < x->shape.size()) return std::nullopt;
      Shape from(repeats->size() - x->shape.size(), 1), to(repeats->size());
      from.insert(from.end(), x->shape.begin(), x->shape.end());
      for (size_t i = 0; i < to.size(); ++i) {
        if ((*repeats)[i] < 0) return std::nullopt;
        to[i] = from[i] * (*repeats)[i];
      }
      if (numel(to) > max_elements_) return std::nullopt;
      HostArray out{to, std::vector<float>(size_t(numel(to)))};
      for (int64_t k = 0; k < numel(to); ++k) {
        int64_t rest = k, at = 0, stride = 1;
        for (int64_t i = int64_t(to.size()) - 1; i >= 0; --i) {
          at += (rest % to[i]) % from[i] * stride;
          rest /= to[i];
          stride *= from[i];
        }
        out.v[k] = x->v[at];
      }
      return out;
    }
    if (op == "view.default" || op == "reshape.default" || op == "_unsafe_view.default") {
      std::optional<std::vector<int64_t>> size = integers(arg(n, arg(n, "size", 1) ? "size" : "shape", 1));
      if (!size) return std::nullopt;
      int64_t known = 1, infer = -1;
      for (size_t i = 0; i < size->size(); ++i) ((*size)[i] == -1 ? infer = int64_t(i) : known *= (*size)[i]);
      if (infer >= 0 && known != 0) (*size)[infer] = int64_t(x->v.size()) / known;
      if (numel(*size) != int64_t(x->v.size())) return std::nullopt;
      return HostArray{*size, x->v};
    }
    if (op == "permute.default" || op == "transpose.int") {
      std::vector<int64_t> p(r);
      for (int64_t i = 0; i < r; ++i) p[i] = i;
      if (op == "transpose.int") {
        std::optional<int64_t> a = dim_arg("dim0", 1, r), b = dim_arg("dim1", 2, r);
        if (!a || !b) return std::nullopt;
        std::swap(p[*a], p[*b]);
      } else {
        std::optional<std::vector<int64_t>> dims = integers(arg(n, "dims", 1));
        if (!dims || int64_t(dims->size()) != r) return std::nullopt;
        for (int64_t i = 0; i < r; ++i) p[i] = (*dims)[i] < 0 ? (*dims)[i] + r : (*dims)[i];
      }
      return permuted(*x, p);
    }
    if (op == "slice.Tensor" || op == "select.int") {
      const bool select = op == "select.int";
      std::optional<int64_t> d = arg(n, "dim", 1) ? dim_arg("dim", 1, r) : std::optional<int64_t>(0);
      if (!d) return std::nullopt;
      const int64_t size = x->shape[*d];
      int64_t start = 0, end = size, step = 1;
      auto opt = [&](const char* a, size_t pos, int64_t def) -> std::optional<int64_t> {
        const json* j = arg(n, a, pos);
        return !j || j->contains("as_none") ? std::optional<int64_t>(def) : integer(j);
      };
      std::optional<int64_t> s0 = opt(select ? "index" : "start", 2, 0), e0 = opt("end", 3, INT64_MAX),
                             st = opt("step", 4, 1);
      if (!s0 || !e0 || !st || *st <= 0) return std::nullopt;
      start = *s0 < 0 ? *s0 + size : *s0, end = select ? start + 1 : (*e0 < 0 ? *e0 + size : std::min(*e0, size));
      start = std::clamp<int64_t>(start, 0, size), end = std::clamp<int64_t>(end, start, size), step = *st;
      if (select && start >= size) return std::nullopt;
      Shape to = x->shape;
      to[*d] = (end - start + step - 1) / step;
      int64_t outer = 1, inner = 1;
      for (int64_t i = 0; i < *d; ++i) outer *= x->shape[i];
      for (int64_t i = *d + 1; i < r; ++i) inner *= x->shape[i];
      HostArray out{to, {}};
      out.v.reserve(numel(to));
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = start; i < end; i += step)
          out.v.insert(out.v.end(), x->v.begin() + (o * size + i) * inner, x->v.begin() + (o * size + i + 1) * inner);
      if (select) out.shape.erase(out.shape.begin() + *d);
      return out;
    }
    return std::nullopt;
  }
};

class TorchImporter {
 public:
  TorchImporter(const TorchProgram::Impl& m, const models::LlamaTraceOptions& o) : m_(m), o_(o) {}

  Graph run() {
    if (o_.output_logits || !o_.output_loss) user_error(m_.path, ": an imported program gives its loss only");
    // The inputs the trainer binds, in its order, whether or not the model reads positions.
    tokens_ = t_.input(Role::tokens, "input_ids", DType::i32, {o_.batch, o_.seq_len});
    positions();
    // Packed documents: the positions restart at each document (the rope's and learned
    // positions' alike, as transformers' packing with position ids does), and every attention
    // keeps each query within its document.
    if (o_.documents) documents_ = t_.input(Role::documents, "document_ids", DType::i32, {o_.batch, o_.seq_len});
    Tensor loss = tensor_of(m_.loss);
    t_.output("loss", loss);
    Graph g = without_dead_nodes(t_.finish());
    // Every parameter must reach the loss: the optimizer steps the gradients the graph gives, and
    // one the program never reads would have none.
    std::vector<char> read(g.values().size(), 0);
    for (const Node& node : g.nodes())
      for (ValueId v : node.inputs) read[v] = 1;
    for (const models::ParameterSpec& spec : m_.specs)
      if (const ValueId v = g.find_input(spec.name); v < 0 || !read[v])
        user_error(m_.path, ": parameter ", spec.name, " does not reach the loss (the program never reads it); autosp "
                   "trains every parameter of a program, so a model with an unused parameter is not supported yet");
    return g;
  }

  // The graph without the nodes none of whose results anything reads, transitively. A matcher
  // that looks at an operand's kind imports it, and then may not use it (Gemma 2's head linear,
  // looked at before the fused loss took it: [B, S, V] logits made every step and dropped).
  // Every input stays (the trainer binds them by name and role).
  static Graph without_dead_nodes(const Graph& g) {
    std::vector<char> read(g.values().size(), 0), keep(g.nodes().size(), 0);
    for (const GraphOutput& o : g.outputs()) read[o.value] = 1;
    for (NodeId n = static_cast<NodeId>(g.nodes().size()) - 1; n >= 0; --n) {
      const Node& node = g.node(n);
      bool live = node.op == OpKind::input;
      for (ValueId v : node.outputs) live = live || read[v];
      if (!live) continue;
      keep[n] = 1;
      for (ValueId v : node.inputs) read[v] = 1;
    }
    Graph out;
    std::vector<ValueId> map(g.values().size(), -1);
    for (NodeId n = 0; n < static_cast<NodeId>(g.nodes().size()); ++n)
      if (keep[n]) copy_node(g, n, out, map);
    for (const GraphOutput& o : g.outputs()) out.add_output(o.name, map[o.value]);
    return out;
  }

 private:
  const TorchProgram::Impl& m_;
  const models::LlamaTraceOptions& o_;
  Tracer t_;
  std::map<std::string, Imported> values_;
  std::optional<Tensor> positions_, tokens_, labels_, documents_;
  std::map<std::string, Tensor> params_;
  std::map<std::string, Tensor> stored_constants_;  // stored_constant's, by name
  std::map<std::string, std::vector<float>> host_cache_;

  // ---- the node that defines a value, and its arguments ----
  const FxNode* node_of(const std::string& name) const {
    auto it = m_.producer.find(name);
    return it == m_.producer.end() ? nullptr : &m_.nodes[it->second];
  }
  static const json* arg(const FxNode& n, const std::string& name, size_t position) {
    for (const auto& [k, v] : n.args)
      if (k == name) return &v;
    return position < n.args.size() && n.args[position].first.empty() ? &n.args[position].second : nullptr;
  }
  static std::string arg_tensor(const FxNode& n, const std::string& name, size_t position) {
    const json* a = arg(n, name, position);
    return a ? tensor_name(*a) : "";
  }
  const std::string& target(const std::string& value) const {
    static const std::string none;
    const FxNode* n = node_of(value);
    return n ? n->target : none;
  }
  static bool is(const FxNode* n, const char* op) { return n && n->target == std::string("torch.ops.aten.") + op; }

  int64_t int_arg(const FxNode& n, const std::string& name, size_t position, std::optional<int64_t> def = {}) {
    const json* a = arg(n, name, position);
    if (!a || a->contains("as_none")) {
      if (def) return *def;
      m_.fail_at(n, str("argument '", name, "' is missing"));
    }
    return int_value(n, *a);
  }
  int64_t int_value(const FxNode& n, const json& a) {
    if (a.contains("as_int")) return a["as_int"].get<int64_t>();
    if (a.contains("as_sym_int")) {
      const json& s = a["as_sym_int"];
      if (s.contains("as_int")) return s["as_int"].get<int64_t>();
      if (s.contains("as_name")) return sym_int(n, s["as_name"].get<std::string>());
    }
    m_.fail_at(n, str("expected an integer argument, got ", a.dump()));
  }
  std::vector<int64_t> ints_arg(const FxNode& n, const std::string& name, size_t position) {
    const json* a = arg(n, name, position);
    if (!a) m_.fail_at(n, str("argument '", name, "' is missing"));
    std::vector<int64_t> out;
    if (a->contains("as_ints")) return (*a)["as_ints"].get<std::vector<int64_t>>();
    if (a->contains("as_sym_ints")) {
      for (const json& s : (*a)["as_sym_ints"]) {
        if (s.contains("as_int")) out.push_back(s["as_int"].get<int64_t>());
        else out.push_back(sym_int(n, s.value("as_name", "")));
      }
      return out;
    }
    if (a->contains("as_int") || a->contains("as_sym_int")) return {int_value(n, *a)};
    m_.fail_at(n, str("expected a list of integers for '", name, "', got ", a->dump()));
  }
  double float_arg(const FxNode& n, const std::string& name, size_t position, std::optional<double> def = {}) {
    const json* a = arg(n, name, position);
    if (!a || a->contains("as_none")) {
      if (def) return *def;
      m_.fail_at(n, str("argument '", name, "' is missing"));
    }
    if (a->contains("as_float")) return float_of((*a)["as_float"]);
    if (a->contains("as_int")) return double((*a)["as_int"].get<int64_t>());
    if (a->contains("as_bool")) return (*a)["as_bool"].get<bool>() ? 1.0 : 0.0;
    m_.fail_at(n, str("expected a number for '", name, "', got ", a->dump()));
  }
  bool bool_arg(const FxNode& n, const std::string& name, size_t position, bool def) {
    const json* a = arg(n, name, position);
    if (!a || !a->contains("as_bool")) return def;
    return (*a)["as_bool"].get<bool>();
  }
  // A scalar operand: a number, or a host constant of one element.
  std::optional<double> scalar(const FxNode& n, const std::string& name, size_t position) {
    const json* a = arg(n, name, position);
    if (!a) return std::nullopt;
    if (a->contains("as_float")) return float_of((*a)["as_float"]);
    if (a->contains("as_int")) return double((*a)["as_int"].get<int64_t>());
    const std::string t = tensor_name(*a);
    if (t.empty()) return std::nullopt;
    const Imported& v = value(t);
    if (v.kind == Imported::host && v.data.size() == 1) return double(v.data[0]);
    return std::nullopt;
  }

  // The sequence and batch sizes by their symbols: sym_size(input_ids, d) in the graph, or the
  // symbol the first user input's dim d has.
  int64_t sym_int(const FxNode& n, const std::string& name) {
    auto v = values_.find(name);
    if (v != values_.end() && v->second.kind == Imported::integer) return int64_t(v->second.number);
    const FxNode* def = node_of(name);
    if (!def) m_.fail_at(n, str("symbolic size ", name, " has no definition"));
    Imported out;
    out.kind = Imported::integer;
    if (def->target == "torch.ops.aten.sym_size.int") {
      const Imported& x = value(arg_tensor(*def, "self", 0));
      const int64_t d = int_arg(*def, "dim", 1);
      const int64_t r = int64_t(x.shape.size());
      if (d < -r || d >= r) m_.fail_at(*def, "dim out of range");
      out.number = double(x.shape[d < 0 ? d + r : d]);
    } else {
      m_.fail_at(*def, "symbolic size arithmetic is not supported: export with the batch and sequence as the only "
                       "dynamic dims");
    }
    values_[name] = out;
    return int64_t(out.number);
  }

  // ---- values ----
  const Imported& value(const std::string& name) {
    if (auto it = values_.find(name); it != values_.end()) return it->second;
    if (name.empty()) {
      // An argument the node should have (a tensor) is missing or of another kind.
      if (!making_.empty() && node_of(making_.back())) m_.fail_at(*node_of(making_.back()), "an operand is not a tensor");
      user_error(m_.path, ": an operand is not a tensor");
    }
    making_.push_back(name);
    Imported v = make(name);
    making_.pop_back();
    return values_[name] = std::move(v);
  }
  std::vector<std::string> making_;  // the values being imported, innermost last
  Tensor tensor_of(const std::string& name) { return materialize(value(name), name); }
  // Rows merged: torch's [R, H] is the IR's [B, S, ..., H] with its leading dims merged (OPT's
  // reshape(-1, H) before its MLP, Conv1D's addmm), kept unmerged in the IR so that the
  // sequence stays a dim the autosp pass can shard. Row-wise ops (rowwise_of) take the IR value
  // as it is and give rows merged again (rowwise); any other op gets torch's [R, H].
  bool rows_merged(const Imported& v) const {
    if (v.kind != Imported::tensor || !v.perm.empty() || v.shape.size() != 2 || v.per_position) return false;
    const Shape& s = t_.shape(v.t);
    return s.size() > 2 && s.back() == v.shape[1] && numel(s) == numel(v.shape);
  }
  Tensor rowwise_of(const std::string& name) {
    const Imported& v = value(name);
    return rows_merged(v) ? v.t : materialize(v, name);
  }
  Imported rowwise(Tensor y, const std::string& operand) {
    Imported v = ir(y);
    if (rows_merged(value(operand))) v.shape = {numel(v.shape) / v.shape.back(), v.shape.back()};
    return v;
  }
  Tensor materialize(const Imported& v, const std::string& name) {
    switch (v.kind) {
      case Imported::tensor:
        if (rows_merged(v)) return t_.reshape(v.t, v.shape);
        return v.perm.empty() || is_identity(v.perm) ? v.t : t_.transpose(v.t, v.perm);
      case Imported::positions:
        if (v.offset == 0) return positions();
        if (const FxNode* n = node_of(name))
          m_.fail_at(*n, str("positions plus ", v.offset, " used other than as the rows an embedding reads"));
        break;
      case Imported::host: {
        // A buffer or tensor constant read whole as a tensor (VeRA's shared projections, the
        // weights of a linear): an input of role constant.
        const std::string table = stored_table(name);
        if (!table.empty() && !m_.parameter_of.count(table) && m_.stored.at(table).shape == v.shape)
          return stored_constant(node_of(name), table);
        break;
      }
      default: break;
    }
    const FxNode* n = node_of(name);
    if (n) m_.fail_at(*n, "this value is used as a tensor, in a way autosp does not import");
    user_error(m_.path, ": value ", name, " is used as a tensor, in a way autosp does not import");
  }
  Tensor positions() {
    if (!positions_) positions_ = t_.input(Role::positions, "position_ids", DType::i32, {o_.batch, o_.seq_len});
    return *positions_;
  }

  // Positions computed from the sizes alone by arithmetic on them, as OPT's are: a mask of
  // ones, its cumsum along the sequence, times the mask, minus 1, plus the table's offset 2.
  // The value, evaluated on the host at this batch and length, is the positions (plus an
  // offset) when each row is offset, offset + 1, ..., offset + S - 1: [B, S], [1, S] or [S];
  // and evaluated at S + 1 as well, it must be those of S + 1 (so it is a function of the
  // length, not a constant that happens to look like positions, as any integer would at S = 1).
  // Only for the index arithmetic ops. A stored table of positions (transformers' position_ids
  // buffer, arange(max_positions), which BERT's and GPT-1's embeddings slice to the length) is
  // positions where its slice at S is, for S >= 2: it may end at S, so S + 1 is not evaluated.
  std::optional<Imported> host_positions(const FxNode& n, const std::string& name) {
    static const std::set<std::string> arithmetic = {
        "torch.ops.aten.add.Tensor", "torch.ops.aten.sub.Tensor", "torch.ops.aten.mul.Tensor",
        "torch.ops.aten.cumsum.default", "torch.ops.aten.slice.Tensor"};
    if (!arithmetic.count(n.target)) return std::nullopt;
    // Capped at the positions' own size: a mask ([.., S, S]) is not evaluated on the way.
    if (!sizes_) {
      sizes_.emplace(m_, o_.batch, o_.seq_len, o_.batch * o_.seq_len, kStoredPositions);
      longer_.emplace(m_, o_.batch, o_.seq_len + 1, o_.batch * (o_.seq_len + 1), kStoredPositions);
    }
    std::optional<int64_t> offset = positions_offset(*sizes_, name, o_.seq_len);
    if (!offset) {
      stored_positions_too_short(n, name);
      return std::nullopt;
    }
    if (sizes_->read_stored ? o_.seq_len < 2 : positions_offset(*longer_, name, o_.seq_len + 1) != offset)
      return std::nullopt;
    Imported v;
    v.kind = Imported::positions;
    v.shape = sizes_->eval(name)->shape;
    v.offset = *offset;
    return v;
  }
  // The offset c when `name` evaluates (by `h`, at length S) to rows
  // c, c + 1, ..., c + S - 1 of shape [B, S], [1, S] or [S].
  std::optional<int64_t> positions_offset(HostEvaluator& h, const std::string& name, int64_t S) const {
    h.reset();
    const HostArray* a = h.eval(name);
    if (!a) return std::nullopt;
    const Shape& s = a->shape;
    if (s.empty() || s.back() != S || s.size() > 2 || (s.size() == 2 && s[0] != 1 && s[0] != o_.batch))
      return std::nullopt;
    const double offset = a->v.empty() ? 0 : double(a->v[0]);
    if (offset != std::round(offset) || std::abs(offset) > 1e9) return std::nullopt;
    for (size_t k = 0; k < a->v.size(); ++k)
      if (double(a->v[k]) != offset + double(int64_t(k) % S)) return std::nullopt;
    return int64_t(offset);
  }
  // An embedding read at ids computed from the sizes and stored tensors alone, the same id k at
  // every [batch, position] (BERT's token types: its token_type_ids buffer, zeros, sliced to the
  // length; RemBERT's zeros): row k of the table for every token, the broadcast of that row
  // over the tokens' [B, S] (so it is split as they are; [1, S] ids add to [B, S] alike).
  std::optional<Imported> constant_rows(const FxNode& n, const std::string& weight, const std::string& idx) {
    // (its arrays as large as the stored tensors: transformers 5's BERT expands its buffer of
    // max_position_embeddings token types over the batch before gathering them)
    if (!constants_) constants_.emplace(m_, o_.batch, o_.seq_len, kStoredPositions, kStoredPositions);
    constants_->reset();
    const HostArray* ids = constants_->eval(idx);
    // (ids that differ are not these: the positions, or ids the embedding's own rules refuse)
    if (!ids || ids->v.empty() || std::any_of(ids->v.begin(), ids->v.end(), [&](float v) { return v != ids->v[0]; }))
      return std::nullopt;
    if (ids->shape != Shape{o_.batch, o_.seq_len} && ids->shape != Shape{1, o_.seq_len})
      m_.fail_at(n, str("an embedding read at constant ids of shape ", shape_str(ids->shape), ", not [B, S] = [",
                        o_.batch, ", ", o_.seq_len, "] or [1, S]"));
    const float k = ids->v[0];
    const Tensor table = tensor_of(weight);
    const int64_t rows = t_.shape(table)[0];
    if (k < 0 || k >= float(rows) || k != std::floor(k))
      m_.fail_at(n, str("an embedding read at the constant id ", k, ", not a row of its table of ", rows));
    // (torch keeps the padding row's gradient zero: that row would be trained here)
    if (const json* pad = arg(n, "padding_idx", 2); pad && pad->contains("as_int") && (*pad)["as_int"] == int64_t(k))
      m_.fail_at(n, str("an embedding read at its padding_idx ", int64_t(k), " for every token"));
    const Tensor row = t_.reshape(t_.slice(table, 0, int64_t(k), int64_t(k) + 1), {t_.shape(table)[1]});
    if (!tokens_) tokens_ = t_.input(Role::tokens, "input_ids", DType::i32, {o_.batch, o_.seq_len});
    Imported v = ir(t_.broadcast(row, *tokens_, 2));
    v.shape = {o_.batch, o_.seq_len, t_.shape(table)[1]};
    return v;
  }
  std::optional<HostEvaluator> constants_;  // constant_rows' evaluator: at this batch and length
  // A stored table of positions read at a length past its end: its slice is the positions of
  // the table's length, shorter than S. A clear error, not the op's.
  void stored_positions_too_short(const FxNode& n, const std::string& name) {
    const HostArray* a = sizes_->eval(name);
    if (!a || !sizes_->read_stored || a->shape.empty() || a->shape.back() >= o_.seq_len || a->shape.back() < 2) return;
    const int64_t rows = a->shape.back();
    for (size_t k = 0; k < a->v.size(); ++k)
      if (double(a->v[k]) != double(a->v[0]) + double(int64_t(k) % rows)) return;
    m_.fail_at(n, str("a stored table of positions read at S = ", o_.seq_len, " holds ", rows,
                      " of them: the model has positions for ", rows, " tokens (train at most that long)"));
  }
  // host_positions' evaluators: at this batch and length, and S + 1. Their arrays are capped at
  // the positions' size, the stored tensors they read at this many elements.
  static constexpr int64_t kStoredPositions = int64_t(1) << 22;
  std::optional<HostEvaluator> sizes_, longer_;
  static Imported tensor_value(Tensor t, Shape shape) {
    Imported v;
    v.kind = Imported::tensor;
    v.t = t;
    v.shape = std::move(shape);
    return v;
  }
  Imported ir(Tensor t) { return tensor_value(t, t_.shape(t)); }

  // Looks through the no-ops (casts to the float type, contiguous, alias, clone, detach) to
  // the value they pass on.
  std::string through(std::string name) {
    for (;;) {
      const FxNode* n = node_of(name);
      if (!n || !passes_through(*n)) return name;
      name = tensor_name(n->args.at(0).second);
    }
  }
  bool passes_through(const FxNode& n) {
    const std::string& t = n.target;
    if (t == "torch.ops.aten.contiguous.default" || t == "torch.ops.aten.alias.default" ||
        t == "torch.ops.aten.clone.default" || t == "torch.ops.aten.detach.default" ||
        t == "torch.ops.aten.detach_.default" || t == "torch.ops.aten.lift_fresh_copy.default" ||
        t == "torch.ops.aten.type_as.default")
      return true;
    if (t == "torch.ops.aten.to.dtype" || t == "torch.ops.aten.to.dtype_layout" ||
        t == "torch.ops.aten._to_copy.default" || t == "torch.ops.aten.to.device") {
      const json* d = arg(n, "dtype", t == "torch.ops.aten.to.device" ? 2 : 1);
      if (!d || !d->contains("as_scalar_type")) return true;
      const int dt = (*d)["as_scalar_type"].get<int>();
      return dt == kFloat32 || dt == kBFloat16 || dt == kInt64 || dt == kInt32;
    }
    if (t == "torch.ops.aten.dropout.default") return float_arg(n, "p", 1, 0.0) == 0.0 || !bool_arg(n, "train", 2, true);
    return false;
  }

  Tensor parameter(const std::string& placeholder) {
    const std::string& name = m_.parameter_of.at(placeholder);  // tied placeholders share it
    if (auto it = params_.find(name); it != params_.end()) return it->second;
    const Shape& shape = m_.stored.at(placeholder).shape;
    // (a frozen parameter the loss reads: an input of role constant, bound by the trainer)
    Tensor p = m_.frozen_read.count(name) ? t_.input(Role::constant, name, o_.dtype, shape)
                                             : t_.parameter(name, shape, o_.dtype);
    return params_[name] = p;
  }

  Imported make(const std::string& name) {
    // Graph inputs.
    if (m_.parameter_of.count(name)) return ir(parameter(name));
    if (m_.stored.count(name)) {
      Imported v;
      v.kind = Imported::host;
      v.shape = m_.stored.at(name).shape;
      v.data = m_.read_floats(m_.stored.at(name), name);
      return v;
    }
    if (name == m_.user_inputs[0]) {
      if (!tokens_) tokens_ = t_.input(Role::tokens, "input_ids", DType::i32, {o_.batch, o_.seq_len});
      return ir(*tokens_);
    }
    if (name == m_.user_inputs[1]) {
      Imported v;
      v.kind = Imported::labels_raw;
      v.shape = {o_.batch, o_.seq_len};
      return v;
    }
    const FxNode* np = node_of(name);
    if (!np) user_error(m_.path, ": value ", name, " has no definition in the program");
    const FxNode& n = *np;
    const std::string& op = n.target;
    auto A = [&](const char* arg_name, size_t pos) { return arg_tensor(n, arg_name, pos); };
    auto unsupported = [&]() -> Imported {
      m_.fail_at(n, "autosp has no mapping for this op (python/autosp/export.py says what it imports)");
    };
    // A detach of a value the parameters' gradients would flow through (DoRA's detached weight
    // norm; a parameter detached): the IR's stop_gradient, the same value with no gradient
    // through it. Of anything else (tables, positions, a value already stopped): nothing to stop.
    if (op == "torch.ops.aten.detach.default" || op == "torch.ops.aten.detach_.default") {
      Imported x = value(tensor_name(n.args.at(0).second));
      if (x.kind == Imported::tensor && x.t.id >= 0 && from_parameters(x.t)) x.t = t_.stop_gradient(x.t);
      return x;
    }
    if (passes_through(n)) return value(tensor_name(n.args.at(0).second));  // "self", dropout's "input"
    if (op == "torch.ops.aten.dropout.default")  // (one that drops nothing passes through)
      m_.fail_at(n, str("dropout of p = ", float_arg(n, "p", 1, 0.0), " while training: autosp trains without dropout "
                        "(set the model's dropout probabilities to 0: its config's, or LoRA's lora_dropout)"));
    // The token ids compared (RoBERTa's positions, cumsum(ids != padding_idx); a padding mask):
    // a value of the data, which no op but an embedding reads.
    static const std::set<std::string> compare = {"ne", "eq", "lt", "le", "gt", "ge"};
    static const std::string aten = "torch.ops.aten.";
    if (const size_t dot = op.rfind('.'); op.rfind(aten, 0) == 0 && dot > aten.size() &&
                                          compare.count(op.substr(aten.size(), dot - aten.size())) &&
                                          through(A("self", 0)) == m_.user_inputs[0])
      m_.fail_at(n, "the token ids compared: a value computed from the data other than by an embedding (RoBERTa's "
                    "positions, cumsum(ids != padding_idx), or a padding mask); autosp computes positions from the "
                    "sequence length and packs documents instead of padding them");


    // getitem of a tuple (split, chunk, the rope tables).
    if (op == "<built-in function getitem>" || op == "_operator.getitem") {
      const Imported& tuple = value(tensor_name(n.args.at(0).second));
      const int64_t i = int_value(n, n.args.at(1).second);
      if (tuple.kind != Imported::tuple || i < 0 || size_t(i) >= tuple.items.size()) m_.fail_at(n, "not an item of a tuple");
      return value(tuple.items[i]);
    }
    if (op == "torch.ops.aten.cos.default" || op == "torch.ops.aten.sin.default") return angle_table(n);
    if (op == "torch.ops.higher_order.wrap_with_set_grad_enabled") {
      // Its outputs are the tables themselves (or a tuple that getitem takes apart).
      Imported tuple = rope_tables(n);
      for (size_t i = 0; i < n.outputs.size() && i < tuple.items.size(); ++i)
        if (n.outputs[i] == name) return values_.at(tuple.items[i]);
      return tuple;
    }
    // Splits: each piece a node of its own, named by the outputs.
    if (op == "torch.ops.aten.split.Tensor" || op == "torch.ops.aten.chunk.default" ||
        op == "torch.ops.aten.split_with_sizes.default") {
      // A multi-output node's value is its first output; the tuple is registered for all of them.
      return split(n, name);
    }

    if (auto p = host_positions(n, name)) return *p;
    if (op == "torch.ops.aten.arange.start" || op == "torch.ops.aten.arange.default") {
      const bool with_start = op == "torch.ops.aten.arange.start";
      const int64_t start = with_start ? int_arg(n, "start", 0) : 0, end = int_arg(n, "end", with_start ? 1 : 0);
      if (start != 0 || end != o_.seq_len)
        m_.fail_at(n, str("arange(", start, ", ", end, ") is not the positions 0..S-1 (S = ", o_.seq_len,
                          "); autosp imports positions only"));
      Imported v;
      v.kind = Imported::positions;
      v.shape = {o_.seq_len};
      return v;
    }
    if (op == "torch.ops.aten.unsqueeze.default" || op == "torch.ops.aten.expand.default") {
      const Imported& x = value(A("self", 0));
      if (x.kind == Imported::positions) {
        Imported v = x;
        if (op == "torch.ops.aten.unsqueeze.default") {
          if (int_arg(n, "dim", 1) != 0 || v.shape.size() != 1) m_.fail_at(n, "positions unsqueezed on another dim than 0");
          v.shape = {1, o_.seq_len};
        } else {
          std::vector<int64_t> size = ints_arg(n, "size", 1);
          if (size.size() != 2 || (size[0] != o_.batch && size[0] != 1 && size[0] != -1))
            m_.fail_at(n, "positions expanded to a shape other than [B, S]");
          v.shape = {o_.batch, o_.seq_len};
        }
        return v;
      }
      if (op == "torch.ops.aten.unsqueeze.default" && x.kind == Imported::tensor) {
        int64_t d = int_arg(n, "dim", 1);
        Shape s = x.shape;
        if (d < 0) d += int64_t(s.size()) + 1;
        s.insert(s.begin() + d, 1);
        return tensor_value(t_.reshape(materialize(x, A("self", 0)), s), s);
      }
      if (x.kind == Imported::tensor) return expand(n, x);
      return unsupported();
    }
    if (op == "torch.ops.aten.repeat.default") {  // the positions repeated over the batch (arange(T).repeat(B, 1))
      const Imported& x = value(A("self", 0));
      const std::vector<int64_t> r = ints_arg(n, "repeats", 1);
      if (x.kind != Imported::positions || x.offset != 0 || r.size() != 2 || r[1] != 1 ||
          (x.shape.size() == 2 && x.shape[0] != 1) || (r[0] != 1 && r[0] != o_.batch))
        return unsupported();
      Imported v = x;
      v.shape = {r[0], o_.seq_len};
      return v;
    }
    if (op == "torch.ops.aten.expand_as.default") {  // (F.normalize's norm, [..., 1], to x's shape)
      const Imported& x = value(A("self", 0));
      const Imported& like = value(A("other", 1));
      if (x.kind != Imported::tensor || like.kind != Imported::tensor) return unsupported();
      return expand(n, x, like.shape);
    }
    if (op == "torch.ops.aten.squeeze.dim") {  // a dim of size 1 dropped (any other size: no change)
      const Imported& x = value(A("self", 0));
      const int64_t rank = int64_t(x.shape.size());
      int64_t dim = int_arg(n, "dim", 1);
      if (dim < 0) dim += rank;
      if (x.kind != Imported::tensor || dim < 0 || dim >= rank) return unsupported();
      if (x.shape[dim] != 1) return x;
      Shape s = x.shape;
      s.erase(s.begin() + dim);
      return tensor_value(t_.reshape(materialize(x, A("self", 0)), s), s);
    }
    if (op == "torch.ops.aten.pad.default") {
      const Imported& x = value(A("self", 0));
      if (x.kind == Imported::labels_raw && ints_arg(n, "pad", 1) == std::vector<int64_t>{0, 1} &&
          float_arg(n, "value", 3, 0.0) == -100.0) {
        Imported v = x;
        v.kind = Imported::labels_padded;
        return v;
      }
      m_.fail_at(n, "a pad autosp does not import (it reads transformers' label shift, pad(labels, (0, 1), -100)[:, 1:])");
    }
    if (op == "torch.ops.aten.select.int") {  // x[..., i, ...]: a slice of one, its dim dropped (Persimmon's qkv)
      const Imported& x = value(A("self", 0));
      const int64_t rank = int64_t(x.shape.size());
      int64_t dim = int_arg(n, "dim", 1), index = int_arg(n, "index", 2);
      if (dim < 0) dim += rank;
      if (x.kind != Imported::tensor || dim < 0 || dim >= rank) return unsupported();
      if (index < 0) index += x.shape[dim];
      if (index < 0 || index >= x.shape[dim]) m_.fail_at(n, str("index ", index, " out of range of dim ", dim));
      Shape s = x.shape;
      s.erase(s.begin() + dim);
      Tensor one = t_.slice(materialize(x, A("self", 0)), dim, index, index + 1);
      return tensor_value(t_.reshape(one, s), s);
    }
    if (op == "torch.ops.aten.slice.Tensor") {
      const Imported& x = value(A("self", 0));
      const int64_t rank = int64_t(x.shape.size());
      int64_t dim = int_arg(n, "dim", 1, 0);
      if (dim < 0) dim += rank;
      if (x.kind == Imported::labels_padded) {
        if (dim == 1 && int_arg(n, "start", 2, 0) == 1 && int_arg(n, "end", 3, INT64_MAX) >= o_.seq_len + 1)
          return labels_value();
        m_.fail_at(n, "a slice of the padded labels other than [:, 1:]");
      }
      if (auto rows = stored_rows_cut(n, name)) return *rows;
      // (a stored table's slice: of the constant it is as a tensor, materialize's; VeRA's shared
      // projections cut to each layer's sizes)
      const bool table = x.kind == Imported::host && !stored_table(A("self", 0)).empty();
      if ((x.kind != Imported::tensor && !table) || dim < 0 || dim >= rank) return unsupported();
      const int64_t size = x.shape[dim];
      int64_t start = int_arg(n, "start", 2, 0), end = int_arg(n, "end", 3, INT64_MAX);
      if (start < 0) start += size;
      if (end < 0) end += size;
      start = std::clamp<int64_t>(start, 0, size), end = std::clamp<int64_t>(end, start, size);
      if (const json* step = arg(n, "step", 4); step && int_value(n, *step) != 1) m_.fail_at(n, "a strided slice");
      if (start == 0 && end == size) return x;
      Shape s = x.shape;
      s[dim] = end - start;
      if (end == start) {
        Imported v;
        v.kind = Imported::tensor;
        v.shape = s;
        v.t = Tensor{-1};  // empty: only a cat may take it
        return v;
      }
      return tensor_value(t_.slice(materialize(x, A("self", 0)), dim, start, end), s);
    }
    if (op == "torch.ops.aten.embedding.default") {
      const std::string w = A("weight", 0), idx = A("indices", 1);
      if (auto r = constant_rows(n, w, idx)) return *r;
      const Imported& ids = value(idx);
      int64_t padding_idx = -1;
      if (const json* pad = arg(n, "padding_idx", 2); pad && pad->contains("as_int"))
        padding_idx = (*pad)["as_int"].get<int64_t>();
      Tensor weight = tensor_of(w);
      if (padding_idx >= t_.shape(weight)[0]) m_.fail_at(n, str("padding_idx ", padding_idx, " is not a row of the table"));
      if (ids.kind == Imported::positions) return rows_at_positions(n, weight, ids, padding_idx);
      return ir(padding_idx >= 0 ? t_.embedding(weight, tensor_of(idx), padding_idx) : t_.embedding(weight, tensor_of(idx)));
    }
    if (op == "torch.ops.aten.linear.default") {
      if (auto wt = linear_of_identity(n)) return *wt;
      Tensor x = rowwise_of(A("input", 0)), w = tensor_of(A("weight", 1));
      const std::string b = A("bias", 2);
      return rowwise(b.empty() ? t_.linear(x, w) : t_.linear(x, w, tensor_of(b)), A("input", 0));
    }
    if (op == "torch.ops.aten.addmm.default") {  // bias + mat1 @ mat2: Conv1D's weight is [in, out]
      if (float_arg(n, "beta", 3, 1.0) != 1.0 || float_arg(n, "alpha", 4, 1.0) != 1.0) return unsupported();
      Tensor w = tensor_of(A("mat2", 2)), b = tensor_of(A("self", 0));
      // Conv1D flattens [B, S, K] to [B * S, K] for the product and views the result back: the
      // product is taken on the unflattened rows, so the sequence dim stays one the autosp pass
      // can shard; the value keeps torch's 2-D shape, and the view back costs nothing.
      const std::string mat1 = A("mat1", 1);
      Tensor x{-1};
      if (const FxNode* flat = node_of(through(mat1));
          flat && (is(flat, "view.default") || is(flat, "reshape.default") || is(flat, "_unsafe_view.default"))) {
        const Imported& rows = value(arg_tensor(*flat, "self", 0));
        const std::vector<int64_t> size = ints_arg(*flat, arg(*flat, "size", 1) ? "size" : "shape", 1);
        if (rows.kind == Imported::tensor && rows.perm.empty() && rows.shape.size() >= 3 && size.size() == 2 &&
            size[1] == rows.shape.back() && (size[0] == -1 || size[0] * size[1] == numel(rows.shape)) &&
            t_.shape(rows.t) == rows.shape)
          x = rows.t;
      }
      if (x.id < 0) return ir(t_.linear(tensor_of(mat1), t_.transpose(w, {1, 0}), b));
      Tensor y = t_.linear(x, t_.transpose(w, {1, 0}), b);
      const Shape& ys = t_.shape(y);
      return tensor_value(y, {numel(ys) / ys.back(), ys.back()});
    }
    if (op == "torch.ops.aten.view.default" || op == "torch.ops.aten.reshape.default" ||
        op == "torch.ops.aten._unsafe_view.default" || op == "torch.ops.aten.flatten.using_ints") {
      if (op != "torch.ops.aten.flatten.using_ints") {
        if (auto att = match_bmm_attention(n)) return *att;  // BLOOM's heads, read back from [B H, S, D]
      } else if (auto rope = match_complex_rope(n)) {
        return *rope;
      }
      const Imported& x = value(A("self", 0));
      std::vector<int64_t> size;
      if (op == "torch.ops.aten.flatten.using_ints") {
        const int64_t r = int64_t(x.shape.size());
        int64_t a = int_arg(n, "start_dim", 1, 0), b = int_arg(n, "end_dim", 2, -1);
        if (a < 0) a += r;
        if (b < 0) b += r;
        for (int64_t i = 0; i < r; ++i) {
          if (i <= a || i > b) size.push_back(x.shape[i]);
          else size.back() *= x.shape[i];
        }
      } else {
        size = ints_arg(n, arg(n, "size", 1) ? "size" : "shape", 1);  // view's name, reshape's
      }
      if (x.kind == Imported::positions && x.shape.size() <= 2 && numel(x.shape) == o_.seq_len &&
          (size == Shape{1, -1} || size == Shape{1, o_.seq_len} || size == Shape{-1} || size == Shape{o_.seq_len})) {
        Imported v = x;  // the positions [S] as [1, S] (arange(T).view(1, -1)), or back
        v.shape = size.size() == 2 ? Shape{1, o_.seq_len} : Shape{o_.seq_len};
        return v;
      }
      if (x.kind != Imported::tensor) {
        if (x.kind == Imported::labels_raw) m_.fail_at(n, "the labels are reshaped before transformers' shift");
        return unsupported();
      }
      int64_t known = 1, infer = -1;
      for (size_t i = 0; i < size.size(); ++i) {
        if (size[i] == -1) infer = int64_t(i);
        else known *= size[i];
      }
      const int64_t total = numel(x.shape);
      if (infer >= 0) size[infer] = known == 0 ? 0 : total / known;
      if (numel(size) != total) m_.fail_at(n, str("a view of ", shape_str(x.shape), " as ", shape_str(size)));
      if (size == x.shape) return x;
      if (x.perm.empty() && t_.shape(x.t) == size) return tensor_value(x.t, size);  // back to the IR's own shape
      // [B, S, ..., H] to rows [R, H]: rows merged (rows_merged), no reshape in the IR.
      if (x.perm.empty() && t_.shape(x.t) == x.shape && x.shape.size() > 2 && size.size() == 2 &&
          size[1] == x.shape.back())
        return tensor_value(x.t, size);
      return tensor_value(t_.reshape(materialize(x, A("self", 0)), size), size);
    }
    if (op == "torch.ops.aten.transpose.int" || op == "torch.ops.aten.permute.default") {
      const Imported& x = value(A("self", 0));
      if (x.kind != Imported::tensor) return unsupported();
      const int64_t r = int64_t(x.shape.size());
      std::vector<int64_t> p(r);
      for (int64_t i = 0; i < r; ++i) p[i] = i;
      if (op == "torch.ops.aten.transpose.int") {
        int64_t a = int_arg(n, "dim0", 1), b = int_arg(n, "dim1", 2);
        if (a < 0) a += r;
        if (b < 0) b += r;
        std::swap(p[a], p[b]);
      } else {
        p = ints_arg(n, "dims", 1);
        for (int64_t& d : p)
          if (d < 0) d += r;
      }
      // Composed lazily: torch's value is x.t permuted by x.perm, then by p.
      Imported v = x;
      std::vector<int64_t> base = x.perm.empty() ? std::vector<int64_t>(p.size()) : x.perm;
      if (x.perm.empty())
        for (int64_t i = 0; i < r; ++i) base[i] = i;
      v.perm.assign(r, 0);
      for (int64_t i = 0; i < r; ++i) v.perm[i] = base[p[i]];
      for (int64_t i = 0; i < r; ++i) v.shape[i] = x.shape[p[i]];
      return v;
    }
    if (op == "torch.ops.aten.numpy_T.default" || op == "torch.ops.aten.t.default") {  // W.T of a matrix
      const Imported& x = value(A("self", 0));
      if (x.kind != Imported::tensor || x.shape.size() != 2) return unsupported();
      Imported v = x;
      v.perm = x.perm.empty() || is_identity(x.perm) ? std::vector<int64_t>{1, 0} : std::vector<int64_t>{x.perm[1], x.perm[0]};
      std::swap(v.shape[0], v.shape[1]);
      return v;
    }
    if (op == "torch.ops.aten.matmul.default") return matmul(n);
    if (op == "torch.ops.aten.index.Tensor" || op == "torch.ops.aten.gather.default") {
      if (op == "torch.ops.aten.index.Tensor")
        if (auto t = stored_rows(n, name)) return *t;
      if (auto t = sincos_table(n)) return *t;
      if (op == "torch.ops.aten.gather.default") return unsupported();
      if (auto t = cached_table(n)) return *t;
      return index(n);
    }
    if (op == "torch.ops.aten.mul.Tensor") return mul(n);
    // In place on a value of its own (Falcon's add_ of its parallel branches, OLMo's clamp_ of q,
    // k and v): as the op, whose result the later nodes read (load renamed their reads:
    // rename_reads_after_inplace). A view of the operand read after the op would see the change:
    // refused.
    const bool inplace = op == "torch.ops.aten.add_.Tensor" || op == "torch.ops.aten.mul_.Tensor" ||
                         op == "torch.ops.aten.clamp_.default";
    if (inplace) {
      const std::string self = A("self", 0);
      const FxNode* def = node_of(self);
      if (!def || is_view(*def)) m_.fail_at(n, "an in-place op on a view (autosp imports one on a value of its own)");
      if (!unseen_after(self, m_.producer.at(name)))
        m_.fail_at(n, "an in-place op on a value that is read afterwards through a view taken before it: autosp "
                      "imports in-place ops whose operand is read after them only as their result");
      if (op == "torch.ops.aten.add_.Tensor") return add(n);
      if (op == "torch.ops.aten.mul_.Tensor") return mul(n);
      // (clamp_: the clamp below)
    }
    if (op == "torch.ops.aten.div.Tensor") {  // by a constant (Granite's logits_scaling): a scale by 1 / c
      const std::string a = A("self", 0), b = A("other", 1);
      if (!a.empty() && !b.empty() && value(a).kind == Imported::tensor && value(b).kind == Imported::tensor) {
        // by a tensor of one element (AdaLoRA's rank count, ranknum + eps): div_scalar
        const Imported &av = value(a), &bv = value(b);
        if (numel(bv.shape) == 1 && numel(av.shape) != 1) {
          Imported out = ir(t_.div_scalar(materialize(av, a), t_.reshape(materialize(bv, b), {})));
          out.shape = av.shape;
          return out;
        }
        if (auto y = div_by_column(a, b)) return *y;
        return same_shape(n, a, b, [&](Tensor x, Tensor y) { return t_.div(x, y); });  // DoRA's m / |W|
      }
      std::optional<double> c = scalar(n, "other", 1);
      if (!c || value(A("self", 0)).kind == Imported::host) m_.fail_at(n, "a division by something else than a scalar");
      if (*c == 0.0) m_.fail_at(n, "a division by zero");
      Imported out = ir(t_.scale(tensor_of(A("self", 0)), 1.0 / *c));
      out.shape = value(A("self", 0)).shape;
      out.per_position = value(A("self", 0)).per_position;
      return out;
    }
    if (op == "torch.ops.aten.add.Tensor") return add(n);
    if (op == "torch.ops.aten.sub.Tensor") return sub(n);
    if (op == "torch.ops.aten.linalg_vector_norm.default" || op == "torch.ops.aten.linalg_norm.default")
      return vector_norm(n);
    if (op == "torch.ops.aten.neg.default") {
      Tensor x = tensor_of(A("self", 0));
      return ir(t_.scale(x, -1.0));
    }
    if (op == "torch.ops.aten.silu.default") return rowwise(t_.silu(rowwise_of(A("self", 0))), A("self", 0));
    if (op == "torch.ops.aten.relu.default") return rowwise(t_.relu(rowwise_of(A("self", 0))), A("self", 0));
    if (op == "torch.ops.aten.tanh.default") return ir(t_.tanh(tensor_of(A("self", 0))));
    if (op == "torch.ops.aten.clamp.default" || op == "torch.ops.aten.clamp_.default") {  // numbers for bounds (clip_qkv)
      const std::optional<double> lo = scalar(n, "min", 1), hi = scalar(n, "max", 2);
      auto given = [&](const char* name, size_t at) {
        const json* b = arg(n, name, at);
        return b && !b->contains("as_none");
      };
      if ((given("min", 1) && !lo) || (given("max", 2) && !hi))
        m_.fail_at(n, "a clamp whose bounds are not numbers (autosp imports clamps to constants)");
      if (!lo && !hi) return value(A("self", 0));  // neither bound: x itself
      return rowwise(t_.clamp(rowwise_of(A("self", 0)), lo, hi), A("self", 0));
    }
    if (op == "torch.ops.aten.clamp_min.default" || op == "torch.ops.aten.clamp_max.default") {  // F.normalize's eps
      const bool min = op == "torch.ops.aten.clamp_min.default";
      const std::optional<double> bound = scalar(n, min ? "min" : "max", 1);
      if (!bound) m_.fail_at(n, "a clamp whose bound is not a number (autosp imports clamps to constants)");
      const std::optional<double> none;
      return rowwise(t_.clamp(rowwise_of(A("self", 0)), min ? bound : none, min ? none : bound), A("self", 0));
    }
    if (op == "torch.ops.aten.sigmoid.default") {  // 1 / (1 + e^-x) = (1 + tanh(x / 2)) / 2
      const Tensor x = rowwise_of(A("self", 0));
      return rowwise(t_.scale(t_.tanh(t_.scale(x, 0.5)), 0.5, 0.5), A("self", 0));
    }
    if (op == "torch.ops.aten.where.self") {
      if (auto y = match_xielu(n)) return *y;
      return unsupported();
    }
    if (op == "torch.ops.aten.square.default") {  // x * x (the squared relu's square)
      Tensor x = tensor_of(A("self", 0));
      Imported out = ir(t_.mul(x, x));
      out.shape = value(A("self", 0)).shape;
      return out;
    }
    if (op == "torch.ops.aten.gelu.default") {
      const json* a = arg(n, "approximate", 1);
      const std::string approx = a && a->contains("as_string") ? (*a)["as_string"].get<std::string>() : "none";
      if (approx != "none" && approx != "tanh") m_.fail_at(n, str("gelu approximate='", approx, "'"));
      return rowwise(t_.gelu(rowwise_of(A("self", 0)), approx == "tanh"), A("self", 0));
    }
    if (op == "torch.ops.aten.rms_norm.default") {  // torch.nn.RMSNorm, F.rms_norm
      const std::vector<int64_t> shape = ints_arg(n, "normalized_shape", 1);
      const Imported& x = value(A("input", 0));
      if (shape.size() != 1 || x.shape.empty() || shape[0] != x.shape.back())
        m_.fail_at(n, "rms_norm over more than the last dim");
      // No weight is a weight of ones; no eps is torch's, the input dtype's epsilon (fp32's here).
      const std::string w = A("weight", 2);
      const json* e = arg(n, "eps", 3);
      const double eps = !e || e->contains("as_none") ? double(std::numeric_limits<float>::epsilon())
                                                      : float_arg(n, "eps", 3);
      const Tensor weight = w.empty() ? t_.fill({shape[0]}, 1.0, o_.dtype) : tensor_of(w);
      return rowwise(t_.rms_norm(rowwise_of(A("input", 0)), weight, eps), A("input", 0));
    }
    if (op == "torch.ops.aten.layer_norm.default") {
      const std::vector<int64_t> shape = ints_arg(n, "normalized_shape", 1);
      const Imported& x = value(A("input", 0));
      if (shape.size() != 1 || x.shape.empty() || shape[0] != x.shape.back())
        m_.fail_at(n, "layer_norm over more than the last dim");
      // No weight (OLMo's non-parametric norm) is a weight of ones, no bias (Cohere's) one of zeros:
      // x * 1 + 0 is x exactly.
      const std::string w = A("weight", 2), b = A("bias", 3);
      const Shape h = {shape[0]};
      return rowwise(t_.layer_norm(rowwise_of(A("input", 0)), w.empty() ? t_.fill(h, 1.0, o_.dtype) : tensor_of(w),
                                   b.empty() ? t_.fill(h, 0.0, o_.dtype) : tensor_of(b), float_arg(n, "eps", 4, 1e-5)),
                     A("input", 0));
    }
    if (op == "torch.ops.aten.cat.default") return cat(n);
    if (op == "torch.ops.autosp.moe.default" || op == "torch.ops.autosp.moe_stacked.default" ||
        op == "torch.ops.autosp.moe_gpt_oss.default" || op == "torch.ops.autosp.moe_apart.default" ||
        op == "torch.ops.autosp.moe_llama4.default")
      return moe(n);
    if (op == "torch.ops.autosp.moe_balance.default") return moe_balance(n);
    if (op == "torch.ops.autosp.attention.default") {
      // softcap: Gemma 2's attn_logit_softcapping; sinks: gpt-oss's; chunk and temperature: Llama
      // 4's (archives written before any of them have no such argument)
      std::vector<double> temperature;
      if (const json* t = arg(n, "temperature", 9); t && t->contains("as_floats"))
        for (const json& f : (*t)["as_floats"]) temperature.push_back(float_of(f));
      if (!temperature.empty() && (temperature.size() != 2 || !(temperature[0] > 0)))
        m_.fail_at(n, "an attention temperature that is not [floor_scale > 0, attn_scale]");
      const int64_t chunk = int_arg(n, "chunk", 8, 0);
      if (chunk < 0) m_.fail_at(n, "a negative attention chunk");
      return attention(n, A("q", 0), A("k", 1), A("v", 2), bool_arg(n, "causal", 3, true), float_arg(n, "scale", 4),
                       int_arg(n, "window", 5, 0), float_arg(n, "softcap", 6, 0.0), {}, A("sinks", 7), chunk,
                       temperature);
    }
    if (op == "torch.ops.aten.scaled_dot_product_attention.default") {
      // A mask tensor is imported where it is the causal mask (a bool keeps where true, a float adds).
      if (const std::string mask = A("attn_mask", 3); !mask.empty()) {
        auto dtype = m_.dtype_of.find(mask);
        if (dtype == m_.dtype_of.end()) m_.fail_at(n, "an attention mask of unknown dtype");
        const int64_t window =
            require_causal(n, mask, dtype->second == kBool ? MaskUse::keep_where_true : MaskUse::additive, 1.0);
        const Imported& q = value(A("query", 0));
        const double scale = float_arg(n, "scale", 6, 1.0 / std::sqrt(double(q.shape.back())));
        if (float_arg(n, "dropout_p", 4, 0.0) != 0.0) m_.fail_at(n, "attention dropout");
        return attention(n, A("query", 0), A("key", 1), A("value", 2), true, scale, window);
      }
      if (float_arg(n, "dropout_p", 4, 0.0) != 0.0) m_.fail_at(n, "attention dropout");
      const Imported& q = value(A("query", 0));
      const double scale = float_arg(n, "scale", 6, 1.0 / std::sqrt(double(q.shape.back())));
      return attention(n, A("query", 0), A("key", 1), A("value", 2), bool_arg(n, "is_causal", 5, false), scale, 0);
    }
    if (op == "torch.ops.aten.cross_entropy_loss.default") return cross_entropy(n);
    // nll_loss of log_softmax over the classes: the cross entropy it is (its arguments have
    // cross_entropy_loss's places; no label smoothing)
    if (op == "torch.ops.aten.nll_loss_nd.default" || op == "torch.ops.aten.nll_loss.default")
      return cross_entropy(n, true);
    return unsupported();
  }

  // Whether no node after node `at` reads `value`, or a view of it: then an in-place op at `at`
  // changes nothing another node sees, and is the op itself.
  bool unseen_after(const std::string& value, size_t at) const {
    auto it = m_.readers.find(value);
    if (it == m_.readers.end()) return true;
    for (size_t r : it->second) {
      if (r > at) return false;
      if (is_view(m_.nodes[r]))
        for (const std::string& o : m_.nodes[r].outputs)
          if (!unseen_after(o, at)) return false;
    }
    return true;
  }

  // Ops whose result shares the storage of their operand.

  // ---- attention written out: softmax(q @ k^T * scale + causal mask) @ v ----
  // The masks are evaluated on the host (HostEvaluator) at the sequence length, up to
  // kMaskCheckLength; beyond it, at that length, and only a mask computed from the sizes with
  // constants of magnitude at most kMaskConstant (so that its form cannot change at a longer
  // one: a sliding window would need its width as a constant) and no stored tensor.
  static constexpr int64_t kMaskCheckLength = 2048;
  static constexpr double kMaskConstant = 64;
  // A masked score: at most this, times the scaling after the mask (softmax then gives it an
  // exact 0 in fp32 for scores within 1e4 of each other), or -inf.
  static constexpr double kMasked = -1e4;
  std::optional<HostEvaluator> masks_;
  std::map<std::string, int64_t> causal_masks_;  // checked, by "<name>/<how it is applied>": the window

  // multiplied: scores times the mask, 1 kept and 0 masked (GPT-1's w * b, a mask added after it
  // masking the zeros)
  enum class MaskUse { additive, keep_where_true, masked_where_true, multiplied };
  // Fails unless `name` is a causal mask as `use` applies it (with `factor` the scaling of the
  // scores after it): keep (i, j) iff j <= i, and i - j < W with a sliding window (GPT-Neo's
  // local layers), over the last two dims, every leading index. Returns W (0: none, or one no
  // shorter than the sequence, which hides nothing).
  int64_t require_causal(const FxNode& at, const std::string& name, MaskUse use, double factor) {
    const std::string key = str(name, "/", int(use), "/", factor);
    if (auto it = causal_masks_.find(key); it != causal_masks_.end()) return it->second;
    const int64_t S = std::min<int64_t>(o_.seq_len, kMaskCheckLength);
    if (!masks_) masks_.emplace(m_, 1, S);
    masks_->reset();
    const HostArray* mask = masks_->eval(name);
    if (!mask)
      m_.fail_at(at, "an attention mask autosp cannot evaluate: it imports causal masks computed from the sequence "
                     "length and constants (not from the data: padding masks are not imported)");
    if (o_.seq_len > S && (masks_->read_stored || masks_->largest_constant > kMaskConstant))
      m_.fail_at(at, str("an attention mask checked at ", S, " positions, which could differ at ", o_.seq_len, " (it ",
                         masks_->read_stored ? "reads a stored tensor" : "computes with a constant above 64",
                         "): use scaled_dot_product_attention(is_causal=True) or python/autosp/export.py's attention"));
    const Shape& sh = mask->shape;
    if (sh.size() < 2 || sh[sh.size() - 1] != S || sh[sh.size() - 2] != S)
      m_.fail_at(at, str("an attention mask of shape ", shape_str(sh), " at S = ", S, ", not [..., S, S]"));
    auto keeps = [&](float v) {
      return use == MaskUse::additive          ? v == 0.0f
             : use == MaskUse::keep_where_true ? v != 0.0f
             : use == MaskUse::multiplied      ? v == 1.0f
                                               : v == 0.0f;
    };
    // The window: the keys the last query keeps (all S: none), then every pair checked against it.
    int64_t window = 0;
    for (int64_t j = 0; j < S; ++j) window += keeps(mask->v[(S - 1) * S + j]);
    if (window == S) window = 0;
    for (size_t k = 0; k < mask->v.size(); ++k) {
      const int64_t i = int64_t(k / S) % S, j = int64_t(k % S);
      const float v = mask->v[k];
      const bool keep = keeps(v);
      const bool masked = use == MaskUse::additive     ? double(v) * factor <= kMasked
                          : use == MaskUse::multiplied ? v == 0.0f
                                                       : !keep;
      if (keep != (j <= i && (window == 0 || i - j < window)) || keep == masked)
        m_.fail_at(at, str("an attention mask that is not causal: at S = ", S, ", query ", i, " and key ", j, " it is ", v,
                           use == MaskUse::additive     ? " (added to the scores)"
                           : use == MaskUse::multiplied ? " (multiplying the scores: 1 kept, 0 masked)"
                                                        : " (a boolean mask)",
                           "; autosp imports causal attention (keys up to the query's position, or a sliding window "
                           "of them, masked scores at most -1e4)"));
    }
    causal_masks_.emplace(key, window);
    return window;
  }

  // ALiBi (MPT's position_bias, BLOOM's alibi): a value computed from the sizes and constants
  // of shape [..., H, R, S] (R = 1 or S, leading dims 1) that is, in each head h and each row,
  // a_h (j - c) for some constant c of the row: the bias a_h (j - i) up to a constant per row,
  // which the softmax does not see. a_h is read where the row's multiplier is 0 and 1 (exact in
  // fp32: a x 0 and a x 1), the rest must agree with it to fp32 rounding. Looked at first at the
  // masks' length (min(S, 2048), as a mask would be); a bias of one row per head (R = 1, H x S
  // values) is then read at the run's length, so a bias cut from a table shorter than the run
  // is an error saying so (at `at`), and one of S rows only where S is the masks' length. The
  // slopes, or nullopt for anything else (all slopes 0: no bias at all).
  std::optional<std::vector<double>> alibi_slopes(const FxNode& at, const std::string& name) {
    const int64_t S = o_.seq_len;
    if (S < 2) return std::nullopt;
    if (!masks_) masks_.emplace(m_, 1, std::min<int64_t>(S, kMaskCheckLength));
    const HostArray* small = masks_->eval(name);
    if (!small || small->shape.size() < 3) return std::nullopt;
    const bool one_row = small->shape[small->shape.size() - 2] == 1;
    if (!one_row && S > kMaskCheckLength) return std::nullopt;
    if (!alibi_) alibi_.emplace(m_, 1, S, int64_t(1) << 27);
    const HostArray* a = one_row ? alibi_->eval(name) : small;
    if (!a) return std::nullopt;
    const Shape& sh = a->shape;
    if (one_row && sh.size() >= 3 && sh.back() != S && sh[sh.size() - 2] == 1)
      m_.fail_at(at, str("an attention bias of shape ", shape_str(sh), " at S = ", S, ": the model makes it for ",
                         sh.back(), " positions, fewer than the sequence (a table of its config's length: train at "
                         "most that long)"));
    if (sh.size() < 3 || sh.back() != S) return std::nullopt;
    const int64_t R = sh[sh.size() - 2], H = sh[sh.size() - 3];
    if (R != 1 && R != S) return std::nullopt;
    for (size_t i = 0; i + 3 < sh.size(); ++i)
      if (sh[i] != 1) return std::nullopt;
    std::vector<double> slopes(H);
    bool any = false;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t r = 0; r < R; ++r) {
        const float* row = a->v.data() + (h * R + r) * S;
        const int64_t j0 = std::find(row, row + S, 0.0f) - row;
        if (j0 == S) return std::nullopt;
        const double slope = j0 + 1 < S ? double(row[j0 + 1]) : -double(row[j0 - 1]);
        if (r > 0 && slope != slopes[h]) return std::nullopt;
        slopes[h] = slope;
        for (int64_t j = 0; j < S; ++j) {
          const double want = slope * double(j - j0);
          if (!(std::abs(double(row[j]) - want) <= 1e-6 * std::abs(want))) return std::nullopt;
        }
        any = any || slope != 0.0;
      }
    if (!any) return std::nullopt;
    return slopes;
  }
  std::optional<HostEvaluator> alibi_;

  // A scalar factor of a mul or div node (either side for mul): the factor and the other operand.
  std::optional<std::pair<double, std::string>> scaling(const FxNode* n) {
    if (!is(n, "mul.Tensor") && !is(n, "div.Tensor")) return std::nullopt;
    const std::string a = arg_tensor(*n, "self", 0), b = arg_tensor(*n, "other", 1);
    const bool div = is(n, "div.Tensor");
    auto host = [&](const std::string& v) { return v.empty() || value(v).kind == Imported::host; };
    if (!a.empty() && host(b)) {
      std::optional<double> c = scalar(*n, "other", 1);
      if (c && *c != 0.0) return std::make_pair(div ? 1.0 / *c : *c, a);
    } else if (!div && !b.empty() && host(a)) {
      std::optional<double> c = scalar(*n, "self", 0);
      if (c) return std::make_pair(*c, b);
    }
    return std::nullopt;
  }

  // A product of the scores and a mask [.., S, S] the host evaluates (either operand): the mask's
  // name and the scores'. nullopt for anything else (a scaling by a number, say).
  std::optional<std::pair<std::string, std::string>> multiplying_mask(const FxNode* n) {
    if (!is(n, "mul.Tensor")) return std::nullopt;
    const std::string a = arg_tensor(*n, "self", 0), b = arg_tensor(*n, "other", 1);
    if (a.empty() || b.empty()) return std::nullopt;
    const int64_t S = std::min<int64_t>(o_.seq_len, kMaskCheckLength);
    if (!masks_) masks_.emplace(m_, 1, S);
    for (const auto& [mask, scores] : {std::pair{b, a}, std::pair{a, b}}) {
      const HostArray* h = masks_->eval(mask);
      if (h && h->shape.size() >= 2 && h->shape.back() == S && h->shape[h->shape.size() - 2] == S)
        return std::make_pair(mask, scores);
    }
    return std::nullopt;
  }

  // The scores a softmax over the last dim reads: q k^T scaled and masked in any order (scalar
  // mul/div, + an additive mask, masked_fill or where with a fill of at most -1e4), with at
  // most one added ALiBi bias (alibi_slopes); down to the product, either a matmul (q and k^T
  // each possibly scaled) or BLOOM's baddbmm(bias, q, k^T, beta, alpha) on [B H, S, .] read
  // back through a view to [B, H, S, S]. nullopt where the scores are something else.
  struct Scores {
    double scale = 1.0;          // of q . k
    int masks = 0;
    int64_t window = 0;          // the narrowest of the masks' sliding windows (0: none)
    std::vector<double> alibi;   // the slopes (empty: none), times the scaling after the bias
    std::string q, kt;           // the product's operands, through scalings
    bool merged = false;         // baddbmm's [B H, S, D] q and [B H, D, S] k^T
  };
  std::optional<Scores> scores_of(const FxNode& sm) {
    const int64_t dim = int_arg(sm, "dim", 1, 0);
    if (dim != -1 && dim != 3) return std::nullopt;
    Scores r;
    auto add_mask = [&](int64_t window) {
      ++r.masks;
      if (window > 0) r.window = r.window > 0 ? std::min(r.window, window) : window;
    };
    auto add_alibi = [&](const FxNode& at, const std::string& bias, double factor) {
      std::optional<std::vector<double>> slopes = alibi_slopes(at, bias);
      if (!slopes) return false;
      if (!r.alibi.empty()) m_.fail_at(at, "attention written out with two ALiBi biases");
      for (double& slope : *slopes) slope *= factor;
      r.alibi = std::move(*slopes);
      return true;
    };
    std::string x = arg_tensor(sm, "self", 0);
    const FxNode* mm = nullptr;
    for (int guard = 0; guard < 16 && !mm; ++guard) {
      x = through(x);
      const FxNode* s = node_of(x);
      if (!s) return std::nullopt;
      if (is(s, "matmul.default")) {
        mm = s;
      } else if (is(s, "view.default") || is(s, "reshape.default") || is(s, "_unsafe_view.default")) {
        // BLOOM: the [B H, S, S] scores of baddbmm(bias, q, k^T, beta, alpha) = beta bias + alpha q k^T
        const FxNode* bb = node_of(through(arg_tensor(*s, "self", 0)));
        if (!is(bb, "baddbmm.default")) return std::nullopt;
        const double beta = float_arg(*bb, "beta", 3, 1.0), alpha = float_arg(*bb, "alpha", 4, 1.0);
        if (!add_alibi(*bb, arg_tensor(*bb, "self", 0), beta * r.scale))
          m_.fail_at(*bb, "a baddbmm whose added term is no ALiBi bias autosp can read (it reads BLOOM's: a_h j per "
                          "head, computed from the sequence length and constants)");
        r.scale *= alpha;
        r.q = through(arg_tensor(*bb, "batch1", 1)), r.kt = through(arg_tensor(*bb, "batch2", 2));
        r.merged = true;
        return r;
      } else if (auto m = multiplying_mask(s); m && r.masks > 0) {
        // Scores times a 0/1 mask (GPT-1's w * b + -1e4 (1 - b)): the zeros it leaves are masked
        // only by a mask applied after it, which must keep the same keys.
        if (require_causal(*s, m->first, MaskUse::multiplied, r.scale) != r.window)
          m_.fail_at(*s, "a mask multiplying the attention scores that keeps other keys than the mask applied after it");
        x = m->second;
      } else if (auto f = scaling(s)) {
        r.scale *= f->first;
        x = f->second;
      } else if (is(s, "add.Tensor") || is(s, "add_.Tensor")) {
        if (float_arg(*s, "alpha", 2, 1.0) != 1.0) return std::nullopt;
        const std::string a = arg_tensor(*s, "self", 0), b = arg_tensor(*s, "other", 1);
        // The mask is the operand computed without the scores (the one the host evaluates).
        if (!masks_) masks_.emplace(m_, 1, std::min<int64_t>(o_.seq_len, kMaskCheckLength));
        const bool b_mask = masks_->eval(b) != nullptr, a_mask = !b_mask && masks_->eval(a) != nullptr;
        if (!a_mask && !b_mask) m_.fail_at(*s, "an attention mask autosp cannot evaluate: it imports causal masks "
                                               "computed from the sequence length and constants");
        x = a_mask ? b : a;
        if (add_alibi(*s, a_mask ? a : b, r.scale)) continue;  // times the scaling of the scores after it
        add_mask(require_causal(*s, a_mask ? a : b, MaskUse::additive, r.scale));
      } else if (is(s, "masked_fill.Scalar") || is(s, "masked_fill_.Scalar")) {
        const std::optional<double> fill = scalar(*s, "value", 2);
        if (!fill || *fill * r.scale > kMasked)
          m_.fail_at(*s, "a masked_fill of the attention scores with more than -1e4");
        add_mask(require_causal(*s, arg_tensor(*s, "mask", 1), MaskUse::masked_where_true, r.scale));
        x = arg_tensor(*s, "self", 0);
      } else if (is(s, "where.self") || is(s, "where.ScalarOther") || is(s, "where.ScalarSelf")) {
        // where(keep, scores, fill) or where(masked, fill, scores); the fill a number or a host
        // constant (GPT-Neo's tensor of the lowest float), so the scores are the operand the
        // host cannot evaluate (asked without importing them)
        const std::string a = arg_tensor(*s, "self", 1);
        if (!masks_) masks_.emplace(m_, 1, std::min<int64_t>(o_.seq_len, kMaskCheckLength));
        const bool scores_first = !a.empty() && masks_->eval(a) == nullptr;
        const std::optional<double> fill = scalar(*s, scores_first ? "other" : "self", scores_first ? 2 : 1);
        if (!fill || *fill * r.scale > kMasked)
          m_.fail_at(*s, "a where on the attention scores with a fill above -1e4");
        add_mask(require_causal(*s, arg_tensor(*s, "condition", 0),
                                scores_first ? MaskUse::keep_where_true : MaskUse::masked_where_true, r.scale));
        x = scores_first ? a : arg_tensor(*s, "other", 2);
      } else {
        return std::nullopt;
      }
    }
    if (!mm) return std::nullopt;
    r.q = through(arg_tensor(*mm, "self", 0)), r.kt = through(arg_tensor(*mm, "other", 1));
    for (std::string* side : {&r.q, &r.kt})
      for (int guard = 0; guard < 4; ++guard) {
        auto f = scaling(node_of(*side));
        if (!f) break;
        r.scale *= f->first;
        *side = through(f->second);
      }
    return r;
  }

  // k of k^T: transpose(k, rank - 2, rank - 1) or permute(k, [0, 1, 3, 2]); "" for anything else.
  std::string untransposed(const std::string& kt, int64_t rank) {
    const FxNode* t = node_of(kt);
    if (is(t, "transpose.int")) {
      int64_t a = int_arg(*t, "dim0", 1), b = int_arg(*t, "dim1", 2);
      a = a < 0 ? a + rank : a, b = b < 0 ? b + rank : b;
      if (std::min(a, b) == rank - 2 && std::max(a, b) == rank - 1) return arg_tensor(*t, "self", 0);
    } else if (rank == 4 && is(t, "permute.default") && ints_arg(*t, "dims", 1) == std::vector<int64_t>{0, 1, 3, 2}) {
      return arg_tensor(*t, "self", 0);
    }
    return "";
  }

  // The masks and ALiBi of scores that make one causal attention over `heads` query heads: at
  // least one mask, each causal (several, as GPT-Neo's stored one and transformers' own, keep
  // what all keep: the narrowest window).
  void require_causal_masks(const FxNode& n, const Scores& sc, int64_t heads) {
    if (sc.masks == 0) m_.fail_at(n, "attention written out without a mask: autosp trains causal language models");
    if (!sc.alibi.empty() && int64_t(sc.alibi.size()) != heads)
      m_.fail_at(n, str("an ALiBi bias of ", sc.alibi.size(), " heads on attention of ", heads));
  }

  // matmul(P, v) with P = softmax(scores, -1) (through casts and dropout 0), scores_of a matmul
  // q @ k^T -> attention(q, k, v, causal, scale) when the mask is causal (GPT-J, CodeGen,
  // nanoGPT's written-out attention); with an added ALiBi bias (MPT's), its slopes.
  std::optional<Imported> match_attention(const FxNode& n) {
    const std::string p = arg_tensor(n, "self", 0), v = arg_tensor(n, "other", 1);
    const FxNode* sm = node_of(through(p));
    if (!is(sm, "softmax.int") && !is(sm, "_softmax.default")) return std::nullopt;
    std::optional<Scores> sc = scores_of(*sm);
    if (!sc || sc->merged) return std::nullopt;
    std::string k = untransposed(sc->kt, 4);
    // or k^T made from [B, S, H, D] in one permute (GPT-1's split_heads(k, k=True)): that value is k
    const FxNode* kt = node_of(sc->kt);
    const bool k_bshd = k.empty() && is(kt, "permute.default") &&
                        ints_arg(*kt, "dims", 1) == std::vector<int64_t>{0, 2, 3, 1} &&
                        value(arg_tensor(*kt, "self", 0)).shape.size() == 4;
    if (k_bshd) k = arg_tensor(*kt, "self", 0);
    if (k.empty() || value(sc->q).shape.size() != 4 || value(v).shape.size() != 4) return std::nullopt;
    require_causal_masks(n, *sc, value(sc->q).shape[1]);
    return attention(n, sc->q, through(k), through(v), true, sc->scale, sc->window, 0, sc->alibi, "", 0, {}, k_bshd);
  }

  // BLOOM's attention on [B H, S, .] batches of heads, read back by its caller, a view to
  // [B, H, S, D]: view(bmm(P, v3)) with P = view(softmax(scores), [B H, S, S]) (through casts
  // and dropout 0) and scores_of a baddbmm; q3, k3 (under k^T) and v3 reshapes of [B, H, S, D]
  // values to [B H, S, D]. -> attention(q, k, v, causal, alpha, ALiBi): the [B H, ...] values
  // (copies of the transposed heads in torch) are never made.
  std::optional<Imported> match_bmm_attention(const FxNode& n) {
    const FxNode* bmm = node_of(arg_tensor(n, "self", 0));
    if (!is(bmm, "bmm.default")) return std::nullopt;
    const Shape out = ints_arg(n, arg(n, "size", 1) ? "size" : "shape", 1);
    if (out.size() != 4 || std::count(out.begin(), out.end(), -1) > 0) return std::nullopt;
    const FxNode* pv = node_of(through(arg_tensor(*bmm, "self", 0)));
    if (!is(pv, "view.default") && !is(pv, "reshape.default") && !is(pv, "_unsafe_view.default")) return std::nullopt;
    const FxNode* sm = node_of(through(arg_tensor(*pv, "self", 0)));
    if (!is(sm, "softmax.int") && !is(sm, "_softmax.default")) return std::nullopt;
    std::optional<Scores> sc = scores_of(*sm);
    if (!sc || !sc->merged) return std::nullopt;
    // [B, H, S, D] of a reshape to [B H, S, D]: the name of the 4-D value, or "".
    auto heads_of = [&](const std::string& x3) -> std::string {
      const FxNode* r = node_of(x3);
      if (!is(r, "view.default") && !is(r, "reshape.default") && !is(r, "_unsafe_view.default")) return "";
      const std::string x = arg_tensor(*r, "self", 0);
      const Imported& xv = value(x);
      if (xv.kind != Imported::tensor || xv.shape.size() != 4 || xv.shape[0] != out[0] || xv.shape[1] != out[1] ||
          xv.shape[2] != out[2])
        return "";
      return x;
    };
    const std::string q = heads_of(sc->q), k = heads_of(untransposed(sc->kt, 3)),
                      v = heads_of(through(arg_tensor(*bmm, "mat2", 1)));
    if (q.empty() || k.empty() || v.empty() || value(v).shape[3] != out[3]) return std::nullopt;
    require_causal_masks(n, *sc, out[1]);
    return attention(n, q, k, v, true, sc->scale, sc->window, 0, sc->alibi);
  }

  // x @ M with M a matrix: linear(x, M^T) (Falcon's x @ W.T is linear(x, W)). 4-D products are
  // attention written out (match_attention).
  Imported matmul(const FxNode& n) {
    const std::string a = arg_tensor(n, "self", 0), b = arg_tensor(n, "other", 1);
    if (auto att = match_attention(n)) return *att;
    const Imported& x = value(a);
    const Imported& m = value(b);
    if (x.kind != Imported::tensor || m.kind != Imported::tensor || m.shape.size() != 2 || x.shape.size() < 2)
      m_.fail_at(n, "a matrix product autosp does not import (it reads x @ W for a matrix W, and attention written out "
                    "as softmax(q @ k^T * scale + causal mask) @ v)");
    Tensor w = m.perm == std::vector<int64_t>{1, 0} ? m.t : t_.transpose(materialize(m, b), {1, 0});
    Imported out = ir(t_.linear(materialize(x, a), w));
    out.shape = x.shape;
    out.shape.back() = m.shape[1];
    if (numel(out.shape) != numel(t_.shape(out.t))) out.shape = t_.shape(out.t);
    return out;
  }

  // index's indices, one name per dim ("" for None): as_tensors, or as_optional_tensors with Nones.
  std::vector<std::string> index_list(const FxNode& n) const {
    std::vector<std::string> out;
    const json* list = arg(n, "indices", 1);
    if (list && list->contains("as_tensors"))
      for (const json& t : (*list)["as_tensors"]) out.push_back(t.value("name", ""));
    if (list && list->contains("as_optional_tensors"))
      for (const json& t : (*list)["as_optional_tensors"])
        out.push_back(t.contains("as_tensor") ? t["as_tensor"].value("name", "") : "");
    return out;
  }

  // Rows of `weight` [R, H] read at the positions (ids: Imported::positions, maybe offset): an
  // embedding of the positions, the IR's [B, S, H], which adds to [B, S, H] as torch's [S, H]
  // or [1, S, H] does (per_position). `what`: the table, for messages.
  Imported rows_at_positions(const FxNode& n, Tensor weight, const Imported& ids, int64_t padding_idx,
                             const char* what = "a learned position table") {
    if (ids.offset == 0 && o_.seq_len > t_.shape(weight)[0])
      m_.fail_at(n, str(what, " of ", t_.shape(weight)[0], " rows read at the positions of S = ",
                        o_.seq_len, ": the model has positions for ", t_.shape(weight)[0],
                        " tokens (train at most that long)"));
    if (ids.offset != 0) {
      // Rows offset + p of the table (OPT's learned positions start at row 2): the positions
      // read the table from its row `offset`. Position p < S, so the rows must reach offset + S.
      const int64_t rows = t_.shape(weight)[0];
      if (ids.offset < 0 || ids.offset + o_.seq_len > rows)
        m_.fail_at(n, str("positions plus ", ids.offset, " read rows up to ", ids.offset + o_.seq_len - 1,
                          " of a table of ", rows, " (S = ", o_.seq_len, ")"));
      if (padding_idx >= 0) m_.fail_at(n, "a learned position table with a padding_idx");
      weight = t_.slice(weight, 0, ids.offset, rows);
    }
    Tensor e = padding_idx >= 0 ? t_.embedding(weight, positions(), padding_idx) : t_.embedding(weight, positions());
    // torch's [1, S, H] (or [S, H]); autosp's [B, S, H] adds alike
    Shape s = ids.shape;
    s.push_back(t_.shape(weight)[1]);
    Imported v = ir(e);
    v.shape = s;
    v.per_position = true;
    return v;
  }

  // A table the program stores beside its state (a buffer, a tensor constant: not a parameter)
  // read by the graph as a tensor: an input of role constant (TorchProgram::constants), by its
  // name in the program (the export wrapper's "model." removed).
  // n: the node that reads it (null: the graph reads the placeholder itself), for messages.
  Tensor stored_constant(const FxNode* n, const std::string& placeholder) {
    const StoredTensor& t = m_.stored.at(placeholder);
    if (t.dtype != kFloat32) {
      const std::string why = str("a stored table of dtype code ", t.dtype, " read as a tensor (autosp reads float32 ones)");
      if (n) m_.fail_at(*n, why);
      user_error(m_.path, ": ", placeholder, ": ", why);
    }
    const std::string name = m_.state_name(t.key);
    if (auto it = stored_constants_.find(name); it != stored_constants_.end()) return it->second;
    const auto& known = m_.constant_placeholders;
    if (std::find(known.begin(), known.end(), placeholder) == known.end()) {
      m_.constants.push_back({name, t.shape});
      m_.constant_placeholders.push_back(placeholder);
    }
    return stored_constants_[name] = t_.input(Role::constant, name, o_.dtype, t.shape);
  }

  // Whether `name` is only added to something, through no-ops: how a table of positions is used
  // (x + pe[:, :T]), unlike a rotary table (cut in halves) or a mask (cut again, or applied).
  bool only_added(const std::string& name) {
    bool any = false;
    for (std::vector<std::string> todo{name}; !todo.empty();) {
      const std::string v = todo.back();
      todo.pop_back();
      auto it = m_.readers.find(v);
      if (it == m_.readers.end()) continue;
      for (size_t r : it->second) {
        const FxNode& reader = m_.nodes[r];
        if (passes_through(reader)) {
          todo.insert(todo.end(), reader.outputs.begin(), reader.outputs.end());
        } else if (is(&reader, "add.Tensor") || is(&reader, "add_.Tensor")) {
          any = true;
        } else {
          return false;
        }
      }
    }
    return any;
  }
  // A stored table [R, H] read at the positions and added (CTRL's sinusoidal
  // pos_encoding[position_ids], added to the embeddings): its rows at the positions, as a
  // position embedding's, of the table as a constant. (GPT-J's table of the same layout is cut
  // in halves: a rotary one, sincos_table.)
  std::optional<Imported> stored_rows(const FxNode& n, const std::string& name) {
    const std::vector<std::string> items = index_list(n);
    const std::string table = through(arg_tensor(n, "self", 0));
    if (!m_.stored.count(table) || m_.parameter_of.count(table) || m_.stored.at(table).shape.size() != 2 ||
        items.empty() || items[0].empty() ||
        !std::all_of(items.begin() + 1, items.end(), [](const std::string& i) { return i.empty(); }) ||
        !only_added(name))
      return std::nullopt;
    const Imported& pos = value(items[0]);
    if (pos.kind != Imported::positions) return std::nullopt;
    return rows_at_positions(n, stored_constant(&n, table), pos, -1, "a stored position table");
  }

  // The stored tensor (a parameter, buffer or tensor constant) `name` is, through no-ops and
  // whole slices (which keep its shape); "" if none.
  std::string stored_table(const std::string& name) {
    const std::string v = through(name);
    if (m_.stored.count(v)) return v;
    const FxNode* s = node_of(v);
    if (!is(s, "slice.Tensor") || int_arg(*s, "start", 2, 0) != 0 || int_arg(*s, "step", 4, 1) != 1) return "";
    const std::string table = stored_table(arg_tensor(*s, "self", 0));
    if (table.empty()) return "";
    const Shape& shape = m_.stored.at(table).shape;
    int64_t dim = int_arg(*s, "dim", 1, 0);
    if (dim < 0) dim += int64_t(shape.size());
    if (dim < 0 || dim >= int64_t(shape.size()) || int_arg(*s, "end", 3, INT64_MAX) < shape[dim]) return "";
    return table;
  }
  // A stored table [R, H] (or [1, R, H]) cut to its first S rows, S the sequence length: its rows
  // at the positions 0..S-1, as a position embedding's. A parameter (minGPT's learned positions,
  // x + pos_emb[:, :t, :]), or a buffer or constant (the sinusoidal PositionalEncoding of
  // PyTorch's tutorials, x + pe[:, :x.size(1)]), then a constant of the graph.
  std::optional<Imported> stored_rows_cut(const FxNode& n, const std::string& name) {
    const std::string table = stored_table(arg_tensor(n, "self", 0));
    if (table.empty() || !only_added(name)) return std::nullopt;
    const Shape& ts = m_.stored.at(table).shape;
    const int64_t rank = int64_t(ts.size());
    int64_t dim = int_arg(n, "dim", 1, 0);
    if (dim < 0) dim += rank;
    if (!(rank == 2 || (rank == 3 && ts[0] == 1)) || dim != rank - 2 || int_arg(n, "start", 2, 0) != 0 ||
        int_arg(n, "step", 4, 1) != 1)
      return std::nullopt;
    // (the end a size of the program's inputs, not a number: the length whatever it is)
    const json* e = arg(n, "end", 3);
    if (!e || !e->contains("as_sym_int") || !(*e)["as_sym_int"].contains("as_name")) return std::nullopt;
    const int64_t end = int_arg(n, "end", 3, INT64_MAX);
    if (end != o_.seq_len) return std::nullopt;
    const bool learned = m_.parameter_of.count(table) != 0;
    const char* what = learned ? "a learned position table" : "a stored position table";
    if (ts[dim] < o_.seq_len)
      m_.fail_at(n, str(what, " of ", ts[dim], " rows cut to S = ", o_.seq_len, ": the model has positions for ",
                        ts[dim], " tokens (train at most that long)"));
    Tensor t = learned ? parameter(table) : stored_constant(&n, table);
    if (rank == 3) t = t_.reshape(t, {ts[1], ts[2]});
    Imported pos;
    pos.kind = Imported::positions;
    pos.shape = rank == 3 ? Shape{1, o_.seq_len} : Shape{o_.seq_len};
    return rows_at_positions(n, t, pos, -1, what);
  }

  // Whether the IR value t is computed from a trained parameter through operands a gradient
  // flows to (not through a stop_gradient, nor an operand read for its shape).
  bool from_parameters(Tensor t) const {
    const Graph& g = t_.graph();
    std::vector<ValueId> todo{t.id};
    std::set<ValueId> seen;
    while (!todo.empty()) {
      const ValueId v = todo.back();
      todo.pop_back();
      if (!seen.insert(v).second) continue;
      const Node& node = g.node(g.value(v).producer);
      if (node.op == OpKind::input) {
        if (g.role(v) == Role::parameter) return true;
        continue;
      }
      const uint32_t stopped = op_def(node.op).no_gradient_inputs;
      for (size_t i = 0; i < node.inputs.size(); ++i)
        if (!(stopped >> i & 1u)) todo.push_back(node.inputs[i]);
    }
    return false;
  }

  // x[..., idx, ...] with idx a constant list of consecutive indices (Falcon's qkv[..., [-2], :]):
  // the slice it is.
  Imported index(const FxNode& n) {
    const std::string x = arg_tensor(n, "self", 0);
    const Imported& xv = value(x);
    const std::vector<std::string> items = index_list(n);
    if (xv.kind != Imported::tensor)
      m_.fail_at(n, "an index autosp does not import (it reads a constant list of consecutive indices on one dim)");
    int64_t dim = -1;
    std::vector<int64_t> at;
    for (size_t d = 0; d < items.size(); ++d) {
      if (items[d].empty()) continue;
      const Imported& idx = value(items[d]);
      if (dim >= 0 || idx.kind != Imported::host || idx.shape.size() != 1 || idx.data.empty() || d >= xv.shape.size())
        m_.fail_at(n, "an index by something else than one constant list of indices");
      dim = int64_t(d);
      for (float f : idx.data) at.push_back(int64_t(f) < 0 ? int64_t(f) + xv.shape[d] : int64_t(f));
    }
    if (dim < 0) m_.fail_at(n, "an index without indices");
    for (size_t i = 0; i < at.size(); ++i)
      if (at[i] < 0 || at[i] >= xv.shape[dim] || at[i] != at[0] + int64_t(i))
        m_.fail_at(n, str("indices on dim ", dim, " that are not consecutive indices of its ", xv.shape[dim]));
    Shape s = xv.shape;
    s[dim] = int64_t(at.size());
    return tensor_value(t_.slice(materialize(xv, x), dim, at[0], at[0] + int64_t(at.size())), s);
  }

  Tensor labels() {
    if (!labels_) labels_ = t_.input(Role::labels, "labels", DType::i32, {o_.batch, o_.seq_len});
    return *labels_;
  }
  Imported labels_value() { return ir(labels()); }

  Imported split(const FxNode& n, const std::string& name) {
    const Imported& x = value(arg_tensor(n, "self", 0));
    if (x.kind == Imported::rope_table && x.sincos) return split_sincos(n, x, name);
    if (x.kind != Imported::tensor) m_.fail_at(n, "a split of a value that is not a tensor");
    const int64_t r = int64_t(x.shape.size());
    int64_t dim = int_arg(n, "dim", 2, 0);
    if (dim < 0) dim += r;
    const int64_t size = x.shape[dim];
    std::vector<int64_t> sizes;
    if (n.target == "torch.ops.aten.chunk.default") {
      const int64_t chunks = int_arg(n, "chunks", 1);
      const int64_t each = (size + chunks - 1) / chunks;
      for (int64_t at = 0; at < size; at += each) sizes.push_back(std::min(each, size - at));
    } else if (n.target == "torch.ops.aten.split.Tensor") {
      const int64_t each = int_arg(n, "split_size", 1);
      for (int64_t at = 0; at < size; at += each) sizes.push_back(std::min(each, size - at));
    } else {
      sizes = ints_arg(n, "split_sizes", 1);
    }
    if (sizes.size() != n.outputs.size()) m_.fail_at(n, "the split's pieces and outputs differ in number");
    Tensor whole = materialize(x, arg_tensor(n, "self", 0));
    int64_t at = 0;
    Imported first;
    for (size_t i = 0; i < sizes.size(); ++i) {
      Shape s = x.shape;
      s[dim] = sizes[i];
      Imported piece = tensor_value(t_.slice(whole, dim, at, at + sizes[i]), s);
      at += sizes[i];
      if (n.outputs[i] == name) first = piece;
      else values_[n.outputs[i]] = piece;
    }
    // The outputs are getitem'd through a tuple named by the node when it is an as_tensors output.
    Imported tuple;
    tuple.kind = Imported::tuple;
    tuple.items = n.outputs;
    values_[n.name] = tuple;
    return first.kind == Imported::none ? tuple : first;
  }

  // A stored table of sin and cos of p * f read at the positions p: index(table, [positions])
  // (CodeGen's) or gather(table.repeat(1, 1, 1), 1, positions[..., None].repeat(1, 1, 2F))
  // (GPT-J's). The frequencies are read back from the table and every row the sequence reads is
  // checked (rotation_frequencies); nullopt for an index or gather of anything else.
  std::optional<Imported> sincos_table(const FxNode& n) {
    std::string table, positions;
    if (is(&n, "index.Tensor")) {
      const std::vector<std::string> indices = index_list(n);
      if (indices.size() != 1 || indices[0].empty()) return std::nullopt;
      table = through(arg_tensor(n, "self", 0)), positions = indices[0];
    } else if (is(&n, "gather.default")) {
      if (int_arg(n, "dim", 1, -1) != 1) return std::nullopt;
      table = through(arg_tensor(n, "self", 0));
      if (const FxNode* r = node_of(table); is(r, "repeat.default")) {
        const std::vector<int64_t> reps = ints_arg(*r, "repeats", 1);
        if (std::any_of(reps.begin(), reps.end(), [](int64_t k) { return k != 1; })) return std::nullopt;
        table = through(arg_tensor(*r, "self", 0));
      }
      const FxNode* r = node_of(through(arg_tensor(n, "index", 2)));
      const FxNode* u = is(r, "repeat.default") ? node_of(through(arg_tensor(*r, "self", 0))) : nullptr;
      if (!is(u, "unsqueeze.default") || (int_arg(*u, "dim", 1) != -1 && int_arg(*u, "dim", 1) != 2)) return std::nullopt;
      positions = arg_tensor(*u, "self", 0);
    } else {
      return std::nullopt;
    }
    if (positions.empty() || !m_.stored.count(table) || value(positions).kind != Imported::positions) return std::nullopt;
    if (value(positions).offset != 0) m_.fail_at(n, "a rotary table read at the positions plus a constant");
    const Imported& t = value(table);
    Shape ts = t.shape;
    while (ts.size() > 2 && ts[0] == 1) ts.erase(ts.begin());
    if (ts.size() != 2 || ts[1] % 2 != 0 || ts[0] < 2) return std::nullopt;
    const int64_t rows = ts[0], F = ts[1] / 2;
    if (o_.seq_len > rows)
      m_.fail_at(n, str("the rotary table holds ", rows, " positions and the sequence has ", o_.seq_len,
                        " (PyTorch would fail to index it too)"));
    Imported v;
    v.kind = Imported::rope_table;
    v.sincos = true;
    v.number = 1.0;
    v.shape = {1, o_.seq_len, 2 * F};
    // rows of [sin | cos] as (cos, sin) pairs
    const std::vector<double> f = rotation_frequencies(n, rows, F, [&](int64_t first, int64_t count) {
      std::vector<float> pairs(count * F * 2);
      for (int64_t r = 0; r < count; ++r)
        for (int64_t i = 0; i < F; ++i) {
          const float* row = &t.data[(first + r) * 2 * F];
          pairs[(r * F + i) * 2] = row[F + i], pairs[(r * F + i) * 2 + 1] = row[i];
        }
      return pairs;
    });
    v.data.assign(f.begin(), f.end());
    return v;
  }
  Imported split_sincos(const FxNode& n, const Imported& x, const std::string& name) {
    const int64_t F = int64_t(x.data.size());
    const int64_t dim = int_arg(n, "dim", 2, 0);
    const int64_t size = n.target == "torch.ops.aten.split.Tensor" ? int_arg(n, "split_size", 1) : -1;
    if ((dim != -1 && dim != 2) || n.outputs.size() != 2 || (size != F && n.target != "torch.ops.aten.chunk.default"))
      m_.fail_at(n, "a split of a sin/cos table other than into its sin and cos halves");
    Imported tuple;
    tuple.kind = Imported::tuple;
    tuple.items = n.outputs;
    for (int k = 0; k < 2; ++k) {
      Imported h = x;
      h.sincos = false;
      h.half = true;
      h.is_cos = k == 1;
      h.shape.back() = F;
      values_[n.outputs[k]] = h;
    }
    values_[n.name] = tuple;
    return values_[name];
  }

  // ---- elementwise, with the patterns rooted at mul and add ----
  Imported mul(const FxNode& n) {
    const std::string a = arg_tensor(n, "self", 0), b = arg_tensor(n, "other", 1);
    if (auto norm = match_rms_norm(n)) return *norm;
    if (auto norm = match_weightless_rms_norm(n)) return *norm;
    if (auto sw = match_swiglu(a, b)) return *sw;
    if (auto g = match_gelu_tanh(n)) return *g;
    // A rotary table times the attention scaling (a scalar)
    if (!a.empty() && b.empty() && value(a).kind == Imported::rope_table && !value(a).cached.size()) {
      std::optional<double> c = scalar(n, "other", 1);
      if (!c) m_.fail_at(n, "a rotary table times something other than a scalar");
      Imported table = value(a);
      table.number *= *c;
      return table;
    }
    // tensor * scalar
    if (b.empty() || a.empty() || value(b).kind == Imported::host || value(a).kind == Imported::host) {
      const std::string x = a.empty() || value(a).kind == Imported::host ? b : a;
      std::optional<double> c = x == a ? scalar(n, "other", 1) : scalar(n, "self", 0);
      if (!c || x.empty()) m_.fail_at(n, "a product with a constant that is not a scalar");
      const Imported& xv = value(x);
      Imported out = ir(t_.scale(tensor_of(x), *c));
      out.shape = xv.shape;
      out.per_position = xv.per_position;  // (a position table scaled: x-transformers' dim^-0.5)
      return out;
    }
    if (auto y = mul_by_one_element(a, b)) return *y;
    if (auto y = mul_by_column(a, b)) return *y;
    return same_shape(n, a, b, [&](Tensor x, Tensor y) { return t_.mul(x, y); });
  }
  // x times a tensor of one element c ([1] or [], either order: a learned gain): c repeated over
  // every element of x (the broadcast op, like x with a dim of 1 added, then that dim dropped:
  // x's rows stay shardable, and c's gradient sums over them), then the elementwise product.
  std::optional<Imported> mul_by_one_element(const std::string& a, const std::string& b) {
    const Imported &av = value(a), &bv = value(b);
    if (av.kind != Imported::tensor || bv.kind != Imported::tensor) return std::nullopt;
    const bool a_one = numel(av.shape) == 1, b_one = numel(bv.shape) == 1;
    if (a_one == b_one) return std::nullopt;
    const std::string& x = a_one ? b : a;
    const std::string& c = a_one ? a : b;
    const Imported& xv = value(x);
    const bool rows = rows_merged(xv);
    const Tensor xt = rows ? xv.t : tensor_of(x);
    const Shape xs = t_.shape(xt);
    const Tensor cb = t_.reshape(t_.broadcast(t_.reshape(tensor_of(c), {1}), xt, int64_t(xs.size())), xs);
    const Tensor y = a_one ? t_.mul(cb, xt) : t_.mul(xt, cb);
    if (rows) return rowwise(y, x);
    Imported out = ir(y);
    out.shape = xv.shape;
    out.per_position = xv.per_position;
    return out;
  }
  // expand(x, size) of a tensor, dims of 1 made n (DeepSeek-V3's rotary key, one for all heads,
  // [B, 1, S, r] to [B, H, S, r]): each such dim moved last, a linear of it with an [n, 1]
  // weight of ones (exact: each element x 1) and moved back; the gradient sums the n copies.
  Imported expand(const FxNode& n, const Imported& x) { return expand(n, x, ints_arg(n, "size", 1)); }
  Imported expand(const FxNode& n, const Imported& x, const std::vector<int64_t>& size) {
    Shape s = x.shape;
    const int64_t rank = int64_t(s.size());
    if (int64_t(size.size()) != rank)
      m_.fail_at(n, str("expand of a rank-", rank, " tensor to ", size.size(), " dims; autosp expands dims of "
                        "size 1 in place, adding none"));
    Tensor t = materialize(x, arg_tensor(n, "self", 0));
    for (int64_t d = 0; d < rank; ++d) {
      if (size[d] == -1 || size[d] == s[d]) continue;
      if (s[d] != 1 || size[d] < 1)
        m_.fail_at(n, str("expand of dim ", d, " of size ", s[d], " to ", size[d], ": only a dim of size 1 expands"));
      std::vector<int64_t> last(rank);
      std::iota(last.begin(), last.end(), int64_t{0});
      std::swap(last[d], last[rank - 1]);
      Tensor u = d == rank - 1 ? t : t_.transpose(t, last);
      u = t_.linear(u, t_.fill({size[d], 1}, 1.0, o_.dtype));
      t = d == rank - 1 ? u : t_.transpose(u, last);
      s[d] = size[d];
    }
    return tensor_value(t, s);
  }
  // x [..., H] times a column c [..., 1] of the same rows, either order (Qwen2-MoE's shared
  // expert times its sigmoid gate): c broadcast along the row as c 1^T, a linear of c with a
  // [H, 1] weight of ones (exact: each element c_r 1), then the elementwise product; its
  // gradient sums dy x along each row back into c.
  std::optional<Imported> mul_by_column(const std::string& a, const std::string& b) {
    for (int k = 0; k < 2; ++k) {
      const std::string& x = k ? b : a;
      const std::string& c = k ? a : b;
      const Imported &xv = value(x), &cv = value(c);
      if (xv.kind != Imported::tensor || cv.kind != Imported::tensor || xv.shape.size() != cv.shape.size() ||
          xv.shape.empty() || cv.shape.back() != 1 || xv.shape.back() == 1 ||
          !std::equal(xv.shape.begin(), xv.shape.end() - 1, cv.shape.begin()))
        continue;
      // Both rows merged alike: on the IR's rows (the sequence stays shardable); else torch's shapes.
      const bool rows = rows_merged(xv) && rows_merged(cv);
      const Tensor xt = rows ? xv.t : tensor_of(x), ct = rows ? cv.t : tensor_of(c);
      if (t_.shape(xt).size() != t_.shape(ct).size()) continue;
      const int64_t H = xv.shape.back();
      const Tensor y = t_.mul(xt, t_.linear(ct, t_.fill({H, 1}, 1.0, o_.dtype)));
      return rows ? rowwise(y, x) : ir(y);
    }
    return std::nullopt;
  }
  // x [..., H] over a column c [..., 1] of the same rows (x / x.norm(dim=-1, keepdim=True)): c
  // repeated along the row as mul_by_column does (exact), then the elementwise quotient.
  std::optional<Imported> div_by_column(const std::string& a, const std::string& b) {
    const Imported &xv = value(a), &cv = value(b);
    if (xv.kind != Imported::tensor || cv.kind != Imported::tensor || xv.shape.size() != cv.shape.size() ||
        xv.shape.empty() || cv.shape.back() != 1 || xv.shape.back() == 1 ||
        !std::equal(xv.shape.begin(), xv.shape.end() - 1, cv.shape.begin()))
      return std::nullopt;
    const bool rows = rows_merged(xv) && rows_merged(cv);
    const Tensor xt = rows ? xv.t : tensor_of(a), ct = rows ? cv.t : tensor_of(b);
    if (t_.shape(xt).size() != t_.shape(ct).size()) return std::nullopt;
    const Tensor y = t_.div(xt, t_.linear(ct, t_.fill({xv.shape.back(), 1}, 1.0, o_.dtype)));
    if (rows) return rowwise(y, a);
    Imported out = ir(y);
    out.shape = xv.shape;
    return out;
  }
  // x [..., H] and a row vector r ([H], or with leading dims of 1: a layer's scale, Doge's
  // residual weights), either order: r repeated over x's rows (the broadcast op: a whole r,
  // summed back over the rows in the gradient), then the elementwise op. r has no sequence dim,
  // so x's rows stay shardable.
  template <typename F>
  std::optional<Imported> with_row_vector(const std::string& a, const std::string& b, F f) {
    const Imported &av = value(a), &bv = value(b);
    if (av.kind != Imported::tensor || bv.kind != Imported::tensor || av.per_position || bv.per_position)
      return std::nullopt;
    auto is_row = [](const Imported& v) {
      return !v.shape.empty() && std::all_of(v.shape.begin(), v.shape.end() - 1, [](int64_t d) { return d == 1; });
    };
    const bool a_row = is_row(av) && !is_row(bv), b_row = is_row(bv) && !is_row(av);
    if (!a_row && !b_row) return std::nullopt;
    const std::string& x = a_row ? b : a;
    const Imported& xv = value(x);
    const Imported& rv = a_row ? av : bv;
    if (xv.shape.empty() || xv.shape.back() != rv.shape.back() || rv.shape.back() == 1) return std::nullopt;
    const bool rows = rows_merged(xv);
    const Tensor xt = rows ? xv.t : tensor_of(x);
    const Tensor r = t_.reshape(tensor_of(a_row ? a : b), {rv.shape.back()});
    const Tensor rb = t_.broadcast(r, xt, int64_t(t_.shape(xt).size()) - 1);
    const Tensor y = a_row ? f(rb, xt) : f(xt, rb);
    if (rows) return rowwise(y, x);
    Imported out = ir(y);
    out.shape = xv.shape;
    return out;
  }
  Imported add(const FxNode& n) {
    if (float_arg(n, "alpha", 2, 1.0) != 1.0) m_.fail_at(n, "add with alpha");
    const std::string a = arg_tensor(n, "self", 0), b = arg_tensor(n, "other", 1);
    if (auto r = match_rope(n)) return *r;
    if (b.empty()) {
      std::optional<double> c = scalar(n, "other", 1);
      if (!c) m_.fail_at(n, "add of a non-scalar constant");
      const Imported& x = value(a);
      Tensor xt = materialize(x, a);
      return ir(t_.scale(xt, 1.0, *c));  // x + c (no tensor of c: its shape would be the global one)
    }
    return same_shape(n, a, b, [&](Tensor x, Tensor y) { return t_.add(x, y); });
  }
  // torch's sub, a - alpha b: of a scalar c (DoRA's m / |W| - 1), scale's a + beta with beta =
  // -alpha c; of a tensor, a + (-alpha b), exactly torch's.
  Imported sub(const FxNode& n) {
    const double alpha = float_arg(n, "alpha", 2, 1.0);
    const std::string a = arg_tensor(n, "self", 0), b = arg_tensor(n, "other", 1);
    if (a.empty() || value(a).kind != Imported::tensor) m_.fail_at(n, "a subtraction from something else than a tensor");
    if (b.empty()) {
      std::optional<double> c = scalar(n, "other", 1);
      if (!c) m_.fail_at(n, "a subtraction of a non-scalar constant");
      Imported out = ir(t_.scale(materialize(value(a), a), 1.0, -alpha * *c));
      out.shape = value(a).shape;
      out.per_position = value(a).per_position;
      return out;
    }
    if (value(b).kind != Imported::tensor) m_.fail_at(n, "a subtraction of something else than a tensor or a scalar");
    return same_shape(n, a, b, [&](Tensor x, Tensor y) { return t_.add(x, t_.scale(y, -alpha)); });
  }
  // torch.linalg.vector_norm and linalg.norm as a vector's 2-norm (over one dim, or over all
  // the elements): the vector_norm op over the last dim, the dim moved last first; keepdim puts
  // it back as a 1.
  Imported vector_norm(const FxNode& n) {
    const bool linalg_norm = n.target == "torch.ops.aten.linalg_norm.default";
    const std::string xn = arg_tensor(n, "self", 0);
    const Imported& xv = value(xn);
    if (xv.kind != Imported::tensor) m_.fail_at(n, "a norm of something else than a tensor");
    const json* ord = arg(n, "ord", 1);
    const bool ord_none = !ord || ord->contains("as_none");
    const std::optional<double> p = ord_none ? std::optional<double>() : scalar(n, "ord", 1);
    if (!(ord_none ? true : p && *p == 2.0))
      m_.fail_at(n, "a norm other than the 2-norm (autosp imports ord = 2, or None: a vector's)");
    const json* dims_arg = arg(n, "dim", 2);
    const bool all = !dims_arg || dims_arg->contains("as_none");
    const std::vector<int64_t> dims = all ? std::vector<int64_t>{} : ints_arg(n, "dim", 2);
    const int64_t rank = int64_t(xv.shape.size());
    // (linalg.norm of a matrix with ord = 2 and no dim is its spectral norm; with ord None, the
    // 2-norm of its elements)
    if ((!all && dims.size() != 1) || (linalg_norm && !ord_none && all && rank != 1))
      m_.fail_at(n, "a norm over several dims (a matrix norm, or a vector's over more than one dim): autosp imports "
                    "the 2-norm over one dim");
    const bool keepdim = bool_arg(n, "keepdim", 3, false);
    Tensor x = materialize(xv, xn);
    if (all) {
      Tensor y = t_.vector_norm(t_.reshape(x, {numel(xv.shape)}));
      return keepdim ? tensor_value(t_.reshape(y, Shape(size_t(rank), 1)), Shape(size_t(rank), 1)) : ir(y);
    }
    int64_t d = dims[0] < 0 ? dims[0] + rank : dims[0];
    if (d < 0 || d >= rank) m_.fail_at(n, str("a norm over dim ", dims[0], " of a rank-", rank, " tensor"));
    if (d != rank - 1) {
      std::vector<int64_t> last(static_cast<size_t>(rank));
      std::iota(last.begin(), last.end(), int64_t{0});
      last.erase(last.begin() + d);
      last.push_back(d);
      x = t_.transpose(x, last);
    }
    Tensor y = t_.vector_norm(x);
    if (!keepdim) return ir(y);
    Shape kept = xv.shape;
    kept[size_t(d)] = 1;
    return tensor_value(t_.reshape(y, kept), kept);
  }
  // linear(eye(n), W) = W^T exactly (each element 1 w, the rest 0 w): PEFT's DoRA takes its
  // LoRA weight B A so, the identity through lora_A, then lora_B. As numpy_T's view.
  std::optional<Imported> linear_of_identity(const FxNode& n) {
    const FxNode* eye = node_of(through(arg_tensor(n, "input", 0)));
    if (!is(eye, "eye.default") || !arg_tensor(n, "bias", 2).empty()) return std::nullopt;
    const std::string wn = arg_tensor(n, "weight", 1);
    const Imported& w = value(wn);
    if (w.kind != Imported::tensor || w.shape.size() != 2 || int_arg(*eye, "n", 0, -1) != w.shape[1])
      return std::nullopt;
    Imported v = w;
    v.perm = w.perm.empty() || is_identity(w.perm) ? std::vector<int64_t>{1, 0}
                                                    : std::vector<int64_t>{w.perm[1], w.perm[0]};
    std::swap(v.shape[0], v.shape[1]);
    return v;
  }
  template <typename F>
  Imported same_shape(const FxNode& n, const std::string& a, const std::string& b, F f) {
    if (auto r = with_row_vector(a, b, f)) return *r;
    // Both rows merged alike: the op on the IR's rows (their torch shapes are equal too).
    const bool rows = rows_merged(value(a)) && rows_merged(value(b)) && value(a).shape == value(b).shape;
    Tensor x = rows ? value(a).t : tensor_of(a), y = rows ? value(b).t : tensor_of(b);
    if (t_.shape(x) != t_.shape(y))
      m_.fail_at(n, str("operands of shapes ", shape_str(t_.shape(x)), " and ", shape_str(t_.shape(y)),
                        ": autosp imports elementwise ops on equal shapes (a broadcast only where a subgraph pattern "
                        "covers it)"));
    Imported out = ir(f(x, y));
    if (rows) return rowwise(out.t, a);
    out.shape = value(a).shape.size() >= value(b).shape.size() ? value(a).shape : value(b).shape;
    if (numel(out.shape) != numel(t_.shape(out.t))) out.shape = t_.shape(out.t);
    return out;
  }

  // silu(a) * b, either order -> swiglu(a, b)
  std::optional<Imported> match_swiglu(const std::string& a, const std::string& b) {
    for (int k = 0; k < 2; ++k) {
      const std::string s = through(k ? b : a), other = k ? a : b;
      const FxNode* sn = node_of(s);
      if (is(sn, "silu.default")) {
        // Rows merged alike (an MLP on reshape(-1, H)'s rows): on the IR's rows, rows merged again.
        const std::string g = arg_tensor(*sn, "self", 0);
        const bool rows = rows_merged(value(g)) && rows_merged(value(other)) && value(g).shape == value(other).shape;
        Tensor gate = rows ? value(g).t : tensor_of(g), up = rows ? value(other).t : tensor_of(other);
        if (t_.shape(gate) != t_.shape(up)) return std::nullopt;
        return rows ? rowwise(t_.swiglu(gate, up), other) : ir(t_.swiglu(gate, up));
      }
    }
    return std::nullopt;
  }

  // GPT-2's gelu_new: (0.5 * x) * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), and BLOOM's
  // (0.5 * x) * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x))), the same function written
  // otherwise (its constant is sqrt(2/pi) in fp32, as torch uses it).
  std::optional<Imported> match_gelu_tanh(const FxNode& n) {
    const FxNode* half = node_of(arg_tensor(n, "self", 0));
    const FxNode* one_plus = node_of(arg_tensor(n, "other", 1));
    if (!is(half, "mul.Tensor") || !is(one_plus, "add.Tensor")) return std::nullopt;
    const std::string x = arg_tensor(*half, "self", 0);
    if (x.empty() || scalar(*half, "other", 1) != 0.5 || scalar(*one_plus, "other", 1) != 1.0) return std::nullopt;
    const FxNode* th = node_of(arg_tensor(*one_plus, "self", 0));
    if (!is(th, "tanh.default")) return std::nullopt;
    auto is_sqrt_2_over_pi = [](std::optional<double> c) { return c && float(*c) == float(std::sqrt(2.0 / M_PI)); };
    auto gelu = [&] { return ir(t_.gelu(tensor_of(x), /*tanh_approximation=*/true)); };
    const FxNode* c = node_of(arg_tensor(*th, "self", 0));
    if (!is(c, "mul.Tensor")) return std::nullopt;
    if (const FxNode* poly = node_of(arg_tensor(*c, "other", 1)); is(poly, "add.Tensor")) {
      // BLOOM's: mul(mul(x, c), add(mul(mul(x, 0.044715), x), 1)); nothing imported on the way
      // (scalar() would import a tensor operand).
      const FxNode* cx = node_of(arg_tensor(*c, "self", 0));
      if (!is(cx, "mul.Tensor") || arg_tensor(*cx, "self", 0) != x || !arg_tensor(*cx, "other", 1).empty() ||
          !is_sqrt_2_over_pi(scalar(*cx, "other", 1)) || !arg_tensor(*poly, "other", 1).empty() ||
          scalar(*poly, "other", 1) != 1.0)
        return std::nullopt;
      const FxNode* ax2 = node_of(arg_tensor(*poly, "self", 0));
      if (!is(ax2, "mul.Tensor") || arg_tensor(*ax2, "other", 1) != x) return std::nullopt;
      const FxNode* ax = node_of(arg_tensor(*ax2, "self", 0));
      if (!is(ax, "mul.Tensor") || arg_tensor(*ax, "self", 0) != x || !arg_tensor(*ax, "other", 1).empty() ||
          scalar(*ax, "other", 1) != 0.044715)
        return std::nullopt;
      return gelu();
    }
    if (!arg_tensor(*c, "other", 1).empty() || !is_sqrt_2_over_pi(scalar(*c, "other", 1))) return std::nullopt;
    const FxNode* inner = node_of(arg_tensor(*c, "self", 0));
    if (!is(inner, "add.Tensor") || arg_tensor(*inner, "self", 0) != x) return std::nullopt;
    const FxNode* cube = node_of(arg_tensor(*inner, "other", 1));
    if (!is(cube, "mul.Tensor") || scalar(*cube, "other", 1) != 0.044715) return std::nullopt;
    const FxNode* p = node_of(arg_tensor(*cube, "self", 0));
    if (!is(p, "pow.Tensor_Scalar") || arg_tensor(*p, "self", 0) != x || float_arg(*p, "exponent", 1) != 3.0)
      return std::nullopt;
    return gelu();
  }

  // x of x - mean(x, dim=-1, keepdim=True) (through casts), or "".
  std::string centered(const std::string& name) {
    const FxNode* d = node_of(through(name));
    if (!is(d, "sub.Tensor") || float_arg(*d, "alpha", 2, 1.0) != 1.0) return "";
    const std::string x = through(arg_tensor(*d, "self", 0));
    const FxNode* mu = node_of(through(arg_tensor(*d, "other", 1)));
    if (!is(mu, "mean.dim") || ints_arg(*mu, "dim", 1) != std::vector<int64_t>{-1} || !bool_arg(*mu, "keepdim", 2, false) ||
        through(arg_tensor(*mu, "self", 0)) != x)
      return "";
    return x;
  }

  // weight * (x * rsqrt(mean(x^2, -1, keepdim) + eps)), either order, through casts, the weight a
  // parameter [H] or 1 + a parameter (Gemma) -> rms_norm; with x - mean(x) for x (squared and scaled:
  // Cohere's LayerNorm written out) -> layer_norm without a bias.
  std::optional<Imported> match_rms_norm(const FxNode& n) {
    for (int k = 0; k < 2; ++k) {
      const std::string normed = through(arg_tensor(n, k ? "other" : "self", k)), wname = arg_tensor(n, k ? "self" : "other", 1 - k);
      const FxNode* nm = node_of(normed);
      if (!is(nm, "mul.Tensor") || wname.empty()) continue;
      for (int j = 0; j < 2; ++j) {
        const std::string x = through(arg_tensor(*nm, j ? "other" : "self", j));
        const FxNode* rs = node_of(through(arg_tensor(*nm, j ? "self" : "other", 1 - j)));
        if (!is(rs, "rsqrt.default")) continue;
        const FxNode* plus = node_of(arg_tensor(*rs, "self", 0));
        if (!is(plus, "add.Tensor")) continue;
        const std::optional<double> eps = scalar(*plus, "other", 1);
        const FxNode* mean = node_of(arg_tensor(*plus, "self", 0));
        if (!eps || !is(mean, "mean.dim") || ints_arg(*mean, "dim", 1) != std::vector<int64_t>{-1}) continue;
        const FxNode* sq = node_of(arg_tensor(*mean, "self", 0));
        if (!is(sq, "pow.Tensor_Scalar") || float_arg(*sq, "exponent", 1) != 2.0) continue;
        // x - mean(x) in both places is a LayerNorm without a bias written out (Cohere's).
        const std::string squared = through(arg_tensor(*sq, "self", 0)), x0 = centered(x);
        const bool layer = !x0.empty() && (squared == x || centered(squared) == x0);
        if (!layer && squared != x) continue;
        // The weight: a parameter, or parameter + 1.
        std::string w = through(wname);
        bool plus_one = false;
        if (const FxNode* wn = node_of(w); is(wn, "add.Tensor") && scalar(*wn, "other", 1) == 1.0) {
          w = through(arg_tensor(*wn, "self", 0));
          plus_one = true;
        }
        if (!m_.parameter_of.count(w)) continue;
        const std::string in = layer ? x0 : x;
        Tensor xt = tensor_of(in), wt = tensor_of(w);
        if (plus_one) wt = t_.add(wt, t_.fill(t_.shape(wt), 1.0, o_.dtype));
        const Imported& xv = value(in);
        Tensor normed = layer ? t_.layer_norm(xt, wt, t_.fill(t_.shape(wt), 0.0, o_.dtype), *eps) : t_.rms_norm(xt, wt, *eps);
        Imported out = tensor_value(normed, xv.kind == Imported::tensor ? xv.shape : t_.shape(xt));
        if (numel(out.shape) != numel(t_.shape(out.t))) out.shape = t_.shape(out.t);
        return out;
      }
    }
    return std::nullopt;
  }

  // x * rsqrt(mean(x^2, -1, keepdim) + eps), either order, through casts, with no weight after it
  // (Llama 4's L2 norm of q and k, transformers 5's WeightlessRMSNorm) -> rms_norm with a weight of
  // ones. (A weighted norm's inner product is met here only when nothing reads it but its weight's.)
  std::optional<Imported> match_weightless_rms_norm(const FxNode& n) {
    for (int j = 0; j < 2; ++j) {
      const std::string x = through(arg_tensor(n, j ? "other" : "self", j));
      const FxNode* rs = node_of(through(arg_tensor(n, j ? "self" : "other", 1 - j)));
      if (!is(rs, "rsqrt.default")) continue;
      const FxNode* plus = node_of(arg_tensor(*rs, "self", 0));
      if (!is(plus, "add.Tensor")) continue;
      const std::optional<double> eps = scalar(*plus, "other", 1);
      const FxNode* mean = node_of(arg_tensor(*plus, "self", 0));
      if (!eps || !is(mean, "mean.dim") || ints_arg(*mean, "dim", 1) != std::vector<int64_t>{-1} ||
          !bool_arg(*mean, "keepdim", 2, false))
        continue;
      const FxNode* sq = node_of(arg_tensor(*mean, "self", 0));
      if (!is(sq, "pow.Tensor_Scalar") || float_arg(*sq, "exponent", 1) != 2.0 || through(arg_tensor(*sq, "self", 0)) != x)
        continue;
      Tensor xt = tensor_of(x);
      const Imported& xv = value(x);
      Tensor normed = t_.rms_norm(xt, t_.fill({t_.shape(xt).back()}, 1.0, o_.dtype), *eps);
      Imported out = tensor_value(normed, xv.kind == Imported::tensor ? xv.shape : t_.shape(xt));
      if (numel(out.shape) != numel(t_.shape(out.t))) out.shape = t_.shape(out.t);
      return out;
    }
    return std::nullopt;
  }

  // The rotary embedding's inv_freq: a stored table, or one the program computes from stored
  // tables and the sizes (export.py's longrope: its short or long factors by the sequence
  // length), evaluated on the host at this batch and length.
  Imported frequencies(const FxNode& block, const std::string& name) {
    if (!node_of(name)) return value(name);
    HostEvaluator h(m_, o_.batch, o_.seq_len);
    const HostArray* a = h.eval(name);
    if (!a) m_.fail_at(block, "a rotary embedding whose inv_freq autosp cannot evaluate from the sizes and stored "
                              "tensors (" + name + ")");
    Imported v;
    v.kind = Imported::host;
    v.shape = a->shape;
    v.data = a->v;
    return v;
  }

  // The rotary embedding's tables: a no-grad block computing cos and sin of inv_freq x the
  // positions (times an attention scaling).
  Imported rope_tables(const FxNode& n) {
    if (!n.subgraph) m_.fail_at(n, "a higher-order op without its graph");
    // Its nodes, and those of the blocks nested in it (autocast regions): a nested block's
    // outputs are its graph's outputs.
    std::deque<FxNode> sub;
    std::map<std::string, const FxNode*> def;
    std::map<std::string, std::string> alias;
    std::function<void(const json&)> collect = [&](const json& graph) {
      std::vector<FxNode> nodes;
      read_nodes(graph, nodes, m_.path);
      for (FxNode& s : nodes) {
        sub.push_back(std::move(s));
        const FxNode& f = sub.back();
        for (const std::string& o : f.outputs) def[o] = &f;
        if (f.subgraph) {
          const json& outs = (*f.subgraph)["outputs"];
          // (torch names them alike; where it does not, the outer name leads to the inner one)
          for (size_t i = 0; i < f.outputs.size() && i < outs.size(); ++i)
            if (tensor_name(outs[i]) != f.outputs[i]) alias[f.outputs[i]] = tensor_name(outs[i]);
          collect(*f.subgraph);
        }
      }
    };
    collect(*n.subgraph);
    // Arguments after (enabled, graph): inv_freq, positions.
    std::vector<std::string> args;
    for (size_t i = 2; i < n.args.size(); ++i) args.push_back(tensor_name(n.args[i].second));
    const json& sub_inputs = (*n.subgraph)["inputs"];
    if (args.size() != 2 || sub_inputs.size() != 2) m_.fail_at(n, "a no-grad block that is not a rotary embedding's tables");
    const Imported inv = frequencies(n, args[0]);
    const Imported& pos = value(args[1]);
    if (inv.kind != Imported::host || pos.kind != Imported::positions)
      m_.fail_at(n, "a no-grad block that is not a rotary embedding's tables (inv_freq and the positions)");
    if (pos.offset != 0) m_.fail_at(n, str("rotary tables of the positions plus ", pos.offset));
    Imported tuple;
    tuple.kind = Imported::tuple;
    for (const json& out : (*n.subgraph)["outputs"]) {
      std::string o = tensor_name(out);
      double scaling = 1.0;
      bool cos = false, found = false, interleaved = false;
      for (int guard = 0; guard < 32 && def.count(o); ++guard) {
        if (alias.count(o)) {
          o = alias[o];
          continue;
        }
        const FxNode& s = *def[o];
        if (s.target == "torch.ops.aten.cos.default" || s.target == "torch.ops.aten.sin.default") {
          cos = s.target == "torch.ops.aten.cos.default";
          found = true;
          // The angles' layout: cat(freqs, freqs) (Llama's), or each twice in a row (Cohere's).
          std::string e = tensor_name(s.args.at(0).second);
          for (int g = 0; g < 8 && def.count(e) && (def[e]->target.find("to.dtype") != std::string::npos ||
                                                    def[e]->target == "torch.ops.aten.alias.default");
               ++g)
            e = tensor_name(def[e]->args.at(0).second);
          const FxNode* emb = def.count(e) ? def[e] : nullptr;
          if (emb && emb->target == "torch.ops.aten.repeat_interleave.self_int") interleaved = true;
          else if (!emb || emb->target != "torch.ops.aten.cat.default")
            m_.fail_at(n, str("a rotary table whose angles are neither cat(freqs, freqs) nor each frequency twice in a "
                              "row (", emb ? emb->target : e, ")"));
          break;
        }
        if (s.target == "torch.ops.aten.mul.Tensor") {
          const json* c = arg(s, "other", 1);
          if (!c || !(c->contains("as_float") || c->contains("as_int"))) break;
          scaling *= c->contains("as_float") ? float_of((*c)["as_float"]) : double((*c)["as_int"].get<int64_t>());
        } else if (s.target.find("to.dtype") == std::string::npos && s.target.find("_assert") == std::string::npos &&
                   s.target != "torch.ops.aten.alias.default") {
          break;
        }
        o = tensor_name(s.args.at(0).second);
      }
      if (!found) m_.fail_at(n, "a no-grad block whose outputs are not cos and sin tables");
      Imported table;
      table.kind = Imported::rope_table;
      table.is_cos = cos;
      table.interleaved = interleaved;
      table.number = scaling;
      table.data = inv.data;
      const std::string item = n.name + "#" + std::to_string(tuple.items.size());
      values_[item] = table;
      tuple.items.push_back(item);
    }
    return tuple;
  }
  // cos or sin of the rotary angles computed in the graph itself (transformers 5's rotary
  // embeddings, no no-grad block around them): cat(freqs, freqs) or each frequency twice in a
  // row (repeat_interleave), of freqs = positions[..., None] * inv_freq, the positions 0..S-1 and
  // inv_freq a stored table or one the program computes from stored ones and the sizes. The
  // attention scaling that may follow is a product with a scalar (mul).
  // Through no-ops, views that only add or drop dims of 1 and slices that keep every element
  // (the program's recorded sizes say so): what a rotary cos or sin reads (x-transformers'
  // freqs[:, -S:] viewed as [1, 1, S, 2F]).
  std::string through_whole_views(std::string name) {
    for (;;) {
      name = through(name);
      const FxNode* v = node_of(name);
      if (!v) return name;
      const bool view = is(v, "view.default") || is(v, "reshape.default"), slice = is(v, "slice.Tensor");
      if ((!view && !slice) || (slice && int_arg(*v, "step", 4, 1) != 1)) return name;
      const std::string x = arg_tensor(*v, "self", 0);
      auto xs = m_.sizes.find(x), ys = m_.sizes.find(name);
      if (xs == m_.sizes.end() || ys == m_.sizes.end()) return name;
      auto drop_ones = [](std::vector<std::string> s) {
        s.erase(std::remove(s.begin(), s.end(), std::string("1")), s.end());
        return s;
      };
      if (slice ? xs->second != ys->second : drop_ones(xs->second) != drop_ones(ys->second)) return name;
      name = x;
    }
  }
  Imported angle_table(const FxNode& n) {
    const bool cos = n.target == "torch.ops.aten.cos.default";
    const FxNode* emb = node_of(through_whole_views(arg_tensor(n, "self", 0)));
    const bool interleaved = is(emb, "repeat_interleave.self_int");
    std::string f;
    if (interleaved && int_arg(*emb, "repeats", 1) == 2 && int_arg(*emb, "dim", 2, INT64_MIN) == -1) {
      f = through(arg_tensor(*emb, "self", 0));
    } else if (is(emb, "cat.default")) {
      const json& parts = emb->args.at(0).second;
      const int64_t dim = int_arg(*emb, "dim", 1, 0);
      if (parts.contains("as_tensors") && parts["as_tensors"].size() == 2 && dim == -1 &&
          parts["as_tensors"][0].value("name", "") == parts["as_tensors"][1].value("name", ""))
        f = through(parts["as_tensors"][0].value("name", ""));
    }
    const FxNode* freqs = node_of(f);
    if (!is(freqs, "mul.Tensor"))
      m_.fail_at(n, str(cos ? "cos" : "sin", " of something other than rotary angles (cat(freqs, freqs) or each "
                        "frequency twice in a row, of freqs = positions[..., None] * inv_freq)"));
    // One factor the positions with a trailing dim of 1, the other the frequencies.
    for (int k = 0; k < 2; ++k) {
      const std::string p = through(arg_tensor(*freqs, k ? "other" : "self", k)),
                        inv = through(arg_tensor(*freqs, k ? "self" : "other", 1 - k));
      const FxNode* u = node_of(p);
      if (!is(u, "unsqueeze.default") || (int_arg(*u, "dim", 1) != 2 && int_arg(*u, "dim", 1) != -1)) continue;
      const Imported& pos = value(through(arg_tensor(*u, "self", 0)));
      if (pos.kind != Imported::positions || pos.shape.size() != 2) continue;
      if (pos.offset != 0) m_.fail_at(n, str("rotary angles of the positions plus ", pos.offset));
      const Imported freq = frequencies(n, inv);
      if (freq.kind != Imported::host || freq.data.empty() || numel(freq.shape) != int64_t(freq.data.size()))
        m_.fail_at(n, "rotary angles whose inv_freq is not a table autosp can evaluate");
      Imported table;
      table.kind = Imported::rope_table;
      table.is_cos = cos;
      table.interleaved = interleaved;
      table.number = 1.0;
      table.data = freq.data;
      return table;
    }
    m_.fail_at(n, str(cos ? "cos" : "sin", " of angles that are not positions[..., None] * inv_freq (the positions "
                      "0..S-1 of shape [B, S] or [1, S])"));
  }
  // unsqueeze(table, 1) or the table itself
  const Imported* table_of(const std::string& name) {
    std::string s = through(name);
    if (const FxNode* u = node_of(s); is(u, "unsqueeze.default")) s = through(arg_tensor(*u, "self", 0));
    const Imported& v = value(s);
    return v.kind == Imported::rope_table ? &v : nullptr;
  }
  // The table of a repeat_interleave(table[..., :F], 2, dim=-1): the interleaved rope's cos or sin
  // (each of the F frequencies twice in a row); null for anything else.
  // Or repeat_interleave(half.unsqueeze(d), 2, dim=-1) of a half of a stored sin/cos table
  // (GPT-J's): `heads` is then d, the dim of the heads in the q it multiplies (2: [B, S, H, D]).
  const Imported* interleaved_table_of(const std::string& name, int64_t* heads) {
    const FxNode* r = node_of(through(name));
    if (!is(r, "repeat_interleave.self_int") || int_arg(*r, "repeats", 1) != 2) return nullptr;
    const FxNode* s = node_of(through(arg_tensor(*r, "self", 0)));
    if (is(s, "unsqueeze.default")) {
      const Imported& h = value(through(arg_tensor(*s, "self", 0)));
      const int64_t d = int_arg(*s, "dim", 1), dim = int_arg(*r, "dim", 2, INT64_MIN);
      if (h.kind != Imported::rope_table || !h.half || (d != 1 && d != 2) || (dim != -1 && dim != 3)) return nullptr;
      *heads = d;
      return &h;
    }
    if (!is(s, "slice.Tensor") || int_arg(*s, "start", 2, 0) != 0 || int_arg(*s, "step", 4, 1) != 1) return nullptr;
    const Imported* table = table_of(arg_tensor(*s, "self", 0));
    if (!table || table->interleaved) return nullptr;
    // (defaults that match nothing: a matcher declines what it does not recognise, it does not fail)
    const int64_t rank = 4, dim = int_arg(*r, "dim", 2, INT64_MIN), sdim = int_arg(*s, "dim", 1, 0);
    if ((dim != -1 && dim != rank - 1) || (sdim != -1 && sdim != rank - 1)) return nullptr;
    if (int_arg(*s, "end", 3, INT64_MAX) != int64_t(table->data.size())) return nullptr;  // the first copy of F
    return table;
  }
  // x[..., start::2] of `x`: its name, or "" when `n` is not that slice.
  std::string every_second(const FxNode* n, int64_t start) {
    if (!is(n, "slice.Tensor") || int_arg(*n, "start", 2, 0) != start || int_arg(*n, "step", 4, 1) != 2) return "";
    const int64_t dim = int_arg(*n, "dim", 1, 0);
    if (dim != -1 && dim != 3) return "";
    const std::string x = through(arg_tensor(*n, "self", 0));
    const Imported& xv = value(x);
    if (xv.shape.size() != 4 || int_arg(*n, "end", 3, INT64_MAX) < xv.shape[3]) return "";  // to the end
    return x;
  }

  // The complex rotary embedding of Meta's Llama and torchtitan's:
  //   view_as_real(view_as_complex(x.float().reshape(B, S, H, D/2, 2))
  //                * freqs_cis[0:S].view(1, S, 1, D/2)).flatten(3)
  // with freqs_cis a stored complex64 table [R, D/2] whose row p is polar(1, p f_i) (torch.polar of
  // outer(arange(R), inv_freq)): the interleaved rope (pairs 2i, 2i + 1) of x [B, S, H, D] at the
  // positions, frequencies read back from the table (complex_rope_frequencies). nullopt where `n`
  // (a flatten) is not such a product.
  std::optional<Imported> match_complex_rope(const FxNode& n) {
    const int64_t end_dim = int_arg(n, "end_dim", 2, -1);
    if (int_arg(n, "start_dim", 1, 0) != 3 || (end_dim != -1 && end_dim != 4)) return std::nullopt;
    const FxNode* real = node_of(through(arg_tensor(n, "self", 0)));
    if (!is(real, "view_as_real.default")) return std::nullopt;
    const FxNode* m = node_of(through(arg_tensor(*real, "self", 0)));
    if (!is(m, "mul.Tensor")) return std::nullopt;
    std::string table = through(arg_tensor(*m, "other", 1));
    const FxNode* c = node_of(through(arg_tensor(*m, "self", 0)));
    if (!is(c, "view_as_complex.default")) {
      table = through(arg_tensor(*m, "self", 0));
      c = node_of(through(arg_tensor(*m, "other", 1)));
    }
    if (!is(c, "view_as_complex.default")) return std::nullopt;
    const FxNode* r = node_of(through(arg_tensor(*c, "self", 0)));
    if (!is(r, "reshape.default") && !is(r, "view.default") && !is(r, "_unsafe_view.default")) return std::nullopt;
    const std::string x = through(arg_tensor(*r, "self", 0));
    const Imported& xv = value(x);
    if (xv.kind != Imported::tensor || xv.shape.size() != 4 || xv.shape[1] != o_.seq_len) return std::nullopt;
    const int64_t D = xv.shape[3], F = D / 2;
    const std::vector<int64_t> pairs = ints_arg(*r, arg(*r, "size", 1) ? "size" : "shape", 1);
    if (pairs.size() != 5 || pairs[4] != 2 || (pairs[3] != F && pairs[3] != -1) || D % 2 != 0) return std::nullopt;
    // The table: a view [1, S, 1, D/2] of rows [0, S) of a stored tensor.
    const FxNode* view = node_of(table);
    if (!is(view, "view.default") && !is(view, "reshape.default") && !is(view, "_unsafe_view.default"))
      return std::nullopt;
    if (ints_arg(*view, arg(*view, "size", 1) ? "size" : "shape", 1) != std::vector<int64_t>{1, o_.seq_len, 1, F})
      m_.fail_at(*view, str("a complex rotary table not viewed as [1, S, 1, D/2] = [1, ", o_.seq_len, ", 1, ", F, "]"));
    const FxNode* cut = node_of(through(arg_tensor(*view, "self", 0)));
    if (!is(cut, "slice.Tensor") || int_arg(*cut, "dim", 1, 0) != 0 || int_arg(*cut, "start", 2, 0) != 0 ||
        int_arg(*cut, "step", 4, 1) != 1)
      m_.fail_at(*view, "a complex rotary table that is not rows [0, S) of a table");
    const std::string stored = through(arg_tensor(*cut, "self", 0));
    if (!m_.stored.count(stored) || m_.parameter_of.count(stored))
      m_.fail_at(*cut, "a complex rotary table that is not a stored tensor (a buffer)");
    RopeOptions rope = complex_rope_frequencies(*cut, stored, F);
    rope.interleaved = true;
    Imported out = ir(t_.rope(tensor_of(x), positions(), rope));
    out.shape = xv.shape;
    return out;
  }
  // The rope of a stored complex table [R, F] whose row p is polar(1, p f_i) (rotation_frequencies).
  RopeOptions complex_rope_frequencies(const FxNode& at, const std::string& name, int64_t F) {
    const StoredTensor& t = m_.stored.at(name);
    if (t.dtype != kComplexFloat || t.shape.size() != 2 || t.shape[1] != F)
      m_.fail_at(at, str("a rotary table ", name, " that is not complex64 [R, ", F, "] (dtype code ", t.dtype, ", ",
                         shape_str(t.shape), ")"));
    return rope_of(at, rotation_frequencies(at, t.shape[0], F, [&](int64_t first, int64_t rows) {
      return m_.read_float32s(t, first * F * 2, rows * F * 2, name);
    }));
  }
  // The frequencies f_i of a table of rotations whose row p is (cos p f_i, sin p f_i), i < F, for
  // R positions; `rows(first, n)` gives rows first .. first + n - 1, F (cos, sin) pairs each. f_i
  // is read from row 1 (its angle, f_i < pi) and refined at rows 2, 4, ..., R - 1 (each angle
  // unwrapped by the last estimate; at row P the angle's fp32 error is 1/P of a frequency's),
  // then every row the sequence reads (at most 4096) is checked against cos and sin of p f_i,
  // within fp32's rounding of the table's angles p f_i (torch computes them in fp32) and of its cos
  // and sin. The stored sin/cos table of GPT-J, the complex one of torchtitan, the cached cos and
  // sin of older Llamas.
  std::vector<double> rotation_frequencies(const FxNode& at, int64_t R, int64_t F,
                                           const std::function<std::vector<float>(int64_t, int64_t)>& rows) {
    constexpr double kPi = 3.14159265358979323846;
    const int64_t S = o_.seq_len;
    if (R < S)
      m_.fail_at(at, str("a rotary table of ", R, " positions at S = ", S, ": the model makes it for fewer positions "
                         "than the sequence"));
    if (R < 2) m_.fail_at(at, "a rotary table of one position");
    std::vector<double> f(F);
    const std::vector<float> one = rows(1, 1);
    for (int64_t i = 0; i < F; ++i) f[i] = std::atan2(double(one[2 * i + 1]), double(one[2 * i]));
    auto refine = [&](int64_t P) {
      const std::vector<float> rp = rows(P, 1);
      for (int64_t i = 0; i < F; ++i) {
        const double a = std::atan2(double(rp[2 * i + 1]), double(rp[2 * i]));
        const double k = std::round((double(P) * f[i] - a) / (2 * kPi));
        f[i] = (a + 2 * kPi * k) / double(P);
      }
    };
    for (int64_t P = 2; P < R - 1; P *= 2) refine(P);
    if (R > 2) refine(R - 1);
    const int64_t checked = std::min<int64_t>(S, 4096);
    const std::vector<float> table = rows(0, checked);
    for (int64_t p = 0; p < checked; ++p)
      for (int64_t i = 0; i < F; ++i) {
        const double angle = double(p) * f[i], tolerance = 1e-6 + 2.4e-7 * angle;
        const double c = table[(p * F + i) * 2], sn = table[(p * F + i) * 2 + 1];
        if (!(std::abs(c - std::cos(angle)) <= tolerance) || !(std::abs(sn - std::sin(angle)) <= tolerance))
          m_.fail_at(at, str("a rotary table whose row ", p, ", frequency ", i, " is (", c, ", ", sn,
                             "), not (cos, sin) of ", p, " x ", f[i], ": not the rotations of one frequency per pair"));
      }
    return f;
  }
  // The rope of D / 2 frequencies: a theta and scaling whose frequencies are these (the kernels'
  // own, in double) within fp32's rounding, or else the frequencies themselves (longrope's
  // per-dimension factors); each must be positive.
  RopeOptions rope_of(const FxNode& at, const std::vector<double>& f) {
    for (size_t i = 0; i < f.size(); ++i)
      if (!(f[i] > 0) || !std::isfinite(f[i]))
        m_.fail_at(at, str("a rotary embedding whose frequency ", i, " is ", f[i], ", not a positive number"));
    if (std::optional<RopeOptions> rope = rope_from_inv_freq(std::vector<float>(f.begin(), f.end()),
                                                             2 * int64_t(f.size())))
      return *rope;
    RopeOptions rope;
    rope.rope_type = "frequencies";
    rope.inv_freq = f;
    return rope;
  }
  // A stored cos or sin table [R, 2F] of cat(freqs, freqs), cut to the sequence and read at the
  // positions: cos_cached[:S][position_ids] (transformers' Llama before 4.38, and many a model's
  // remote code since). A rope table whose frequencies come with its partner's (match_rope);
  // nullopt for an index of anything else.
  std::optional<Imported> cached_table(const FxNode& n) {
    const std::vector<std::string> indices = index_list(n);
    if (indices.size() != 1 || indices[0].empty()) return std::nullopt;
    const FxNode* cut = node_of(through(arg_tensor(n, "self", 0)));
    if (!is(cut, "slice.Tensor") || int_arg(*cut, "dim", 1, 0) != 0 || int_arg(*cut, "start", 2, 0) != 0 ||
        int_arg(*cut, "step", 4, 1) != 1)
      return std::nullopt;
    const std::string name = through(arg_tensor(*cut, "self", 0));
    if (!m_.stored.count(name) || m_.parameter_of.count(name)) return std::nullopt;
    const Imported& pos = value(indices[0]);  // (a stored table's index only: nothing else is imported here)
    if (pos.kind != Imported::positions) return std::nullopt;
    const StoredTensor& t = m_.stored.at(name);
    if (t.dtype != kFloat32 || t.shape.size() != 2 || t.shape[1] % 2 != 0 || t.shape[0] < 2) return std::nullopt;
    // cos of the angles at position 0 is 1, sin 0
    const std::vector<float> first = m_.read_float32s(t, 0, t.shape[1], name);
    const bool ones = std::all_of(first.begin(), first.end(), [](float v) { return v == 1.0f; });
    const bool zeros = std::all_of(first.begin(), first.end(), [](float v) { return v == 0.0f; });
    if (!ones && !zeros) return std::nullopt;
    if (pos.offset != 0) m_.fail_at(n, "a rotary table read at the positions plus a constant");
    Imported v;
    v.kind = Imported::rope_table;
    v.is_cos = ones;
    v.number = 1.0;
    v.cached = name;
    v.shape = pos.shape;
    v.shape.push_back(t.shape[1]);
    return v;
  }
  // The frequencies of a cached cos table and its sin partner (cached_table), both [R, 2F] with
  // equal halves in every row the sequence reads.
  RopeOptions cached_frequencies(const FxNode& at, const std::string& cos, const std::string& sin) {
    const StoredTensor &c = m_.stored.at(cos), &s = m_.stored.at(sin);
    if (c.shape != s.shape) m_.fail_at(at, str("rotary cos and sin tables of shapes ", shape_str(c.shape), " and ",
                                               shape_str(s.shape)));
    const int64_t W = c.shape[1], F = W / 2;
    return rope_of(at, rotation_frequencies(at, c.shape[0], F, [&](int64_t first, int64_t rows) {
      const std::vector<float> a = m_.read_float32s(c, first * W, rows * W, cos);
      const std::vector<float> b = m_.read_float32s(s, first * W, rows * W, sin);
      std::vector<float> pairs(rows * F * 2);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < F; ++i) {
          if (a[r * W + i] != a[r * W + F + i] || b[r * W + i] != b[r * W + F + i])
            m_.fail_at(at, str("rotary tables whose row ", first + r, " has halves that differ at ", i,
                               " (not cat(freqs, freqs))"));
          pairs[(r * F + i) * 2] = a[r * W + i], pairs[(r * F + i) * 2 + 1] = b[r * W + i];
        }
      return pairs;
    }));
  }

  // q * cos + rotate_half(q) * sin: rotate_half(q) = cat(-q[..., D/2:], q[..., :D/2]) (Llama's), or
  // its interleaved form (GPT-J's, in GLM, Helium, Ernie 4.5, Cohere): pairs (q[2i], q[2i+1]),
  // rotate_half(q) = stack(-q[..., 1::2], q[..., 0::2], -1).flatten(-2), cos and sin each frequency
  // twice in a row (repeat_interleave).
  std::optional<Imported> match_rope(const FxNode& n) {
    const FxNode* m1 = node_of(through(arg_tensor(n, "self", 0)));
    const FxNode* m2 = node_of(through(arg_tensor(n, "other", 1)));
    if (!is(m1, "mul.Tensor") || !is(m2, "mul.Tensor")) return std::nullopt;
    bool interleaved = false;
    int64_t heads = 1;  // the heads' dim in q: 1 ([B, H, S, D]), or 2 ([B, S, H, D])
    auto split_table = [&](const FxNode& m, const Imported*& table) -> std::string {
      for (int k = 0; k < 2; ++k) {
        const std::string t = arg_tensor(m, k ? "self" : "other", 1 - k), x = arg_tensor(m, k ? "other" : "self", k);
        if (t.empty() || x.empty() || !node_of(through(t))) continue;
        if ((table = interleaved_table_of(t, &heads))) {
          interleaved = true;
          return x;
        }
        const FxNode* tn = node_of(through(t));
        // cos or sin itself, of angles already viewed with the heads' dim (x-transformers'
        // [1, 1, S, 2F]): that dim is where the recorded sizes have a 1 against x's heads
        if (is(tn, "cos.default") || is(tn, "sin.default")) {
          auto ts = m_.sizes.find(through(t)), xs = m_.sizes.find(through(x));
          if (ts == m_.sizes.end() || xs == m_.sizes.end() || ts->second.size() != 4 || xs->second.size() != 4)
            continue;
          const auto& a = ts->second;
          const auto& b = xs->second;
          if (a[1] == "1" && b[1] != "1" && a[2] == b[2]) heads = 1;
          else if (a[2] == "1" && b[2] != "1" && a[1] == b[1]) heads = 2;
          else continue;
          if ((table = table_of(t))) {
            interleaved = table->interleaved;
            return x;
          }
          continue;
        }
        if (!is(tn, "unsqueeze.default") && tn->target != "<built-in function getitem>") continue;
        if ((table = table_of(t))) {
          interleaved = table->interleaved;  // a table built interleaved (Cohere's)
          if (is(tn, "unsqueeze.default")) {  // the heads' dim: where the table gains it
            const int64_t d = int_arg(*tn, "dim", 1);
            if (d != 1 && d != 2 && d != -2 && d != -3) continue;
            heads = d < 0 ? d + 4 : d;
          }
          return x;
        }
      }
      return "";
    };
    const Imported *cos = nullptr, *sin = nullptr;
    const std::string x = through(split_table(*m1, cos));
    const bool cos_interleaved = interleaved;
    const int64_t cos_heads = heads;
    interleaved = false;
    heads = 1;
    const std::string rotated = through(split_table(*m2, sin));
    if (x.empty() || rotated.empty() || !cos || !sin || !cos->is_cos || sin->is_cos || heads != cos_heads)
      return std::nullopt;
    if (interleaved != cos_interleaved) return std::nullopt;
    const FxNode* c = node_of(rotated);
    if (interleaved) {
      // flatten(stack([-x[..., 1::2], x[..., 0::2]], dim=-1), start_dim=-2)
      if (!is(c, "flatten.using_ints")) return std::nullopt;
      const int64_t start = int_arg(*c, "start_dim", 1, 0), end = int_arg(*c, "end_dim", 2, -1);
      if ((start != -2 && start != 3) || (end != -1 && end != 4)) return std::nullopt;
      const FxNode* st = node_of(through(arg_tensor(*c, "self", 0)));
      if (!is(st, "stack.default") || (int_arg(*st, "dim", 1, 0) != -1 && int_arg(*st, "dim", 1, 0) != 4))
        return std::nullopt;
      const json* list = arg(*st, "tensors", 0);
      if (!list || !list->contains("as_tensors") || (*list)["as_tensors"].size() != 2) return std::nullopt;
      const FxNode* neg = node_of((*list)["as_tensors"][0].value("name", ""));
      if (!is(neg, "neg.default")) return std::nullopt;
      if (every_second(node_of(arg_tensor(*neg, "self", 0)), 1) != x ||
          every_second(node_of((*list)["as_tensors"][1].value("name", "")), 0) != x)
        return std::nullopt;
    } else {
      if (!is(c, "cat.default")) return std::nullopt;
      const json* list = arg(*c, "tensors", 0);
      if (!list || !list->contains("as_tensors") || (*list)["as_tensors"].size() != 2) return std::nullopt;
      const FxNode* neg = node_of((*list)["as_tensors"][0].value("name", ""));
      const FxNode* lo = node_of((*list)["as_tensors"][1].value("name", ""));
      if (!is(neg, "neg.default") || !is(lo, "slice.Tensor")) return std::nullopt;
      const FxNode* hi = node_of(arg_tensor(*neg, "self", 0));
      if (!is(hi, "slice.Tensor") || through(arg_tensor(*hi, "self", 0)) != x ||
          through(arg_tensor(*lo, "self", 0)) != x)
        return std::nullopt;
    }
    const Imported& xv = value(x);
    if (xv.kind != Imported::tensor || xv.shape.size() != 4) return std::nullopt;
    const int64_t D = xv.shape[3];
    // Cached cos and sin tables (cached_table): the frequencies of the pair; else the tables'.
    RopeOptions rope;
    if (!cos->cached.empty() || !sin->cached.empty()) {
      if (cos->cached.empty() || sin->cached.empty() || interleaved) return std::nullopt;
      if (m_.stored.at(cos->cached).shape[1] != D)
        m_.fail_at(n, str("a rotary embedding whose tables of ", m_.stored.at(cos->cached).shape[1],
                          " columns do not cover the ", D, " dims it rotates"));
      rope = cached_frequencies(n, cos->cached, sin->cached);
    } else {
      if (int64_t(cos->data.size()) * 2 != D)
        m_.fail_at(n, str("a rotary embedding whose ", cos->data.size(), " frequencies do not cover the ", D,
                          " dims it rotates (a partial rotary slices them off first)"));
      if (cos->data != sin->data || cos->number != sin->number) return std::nullopt;
      rope = rope_of(n, std::vector<double>(cos->data.begin(), cos->data.end()));
    }
    // autosp's rope is [B, S, H, D]; torch's q here is [B, H, S, D] (or already [B, S, H, D]).
    Tensor bshd = heads == 2 ? materialize(xv, x) : as_bshd(xv, x);
    RopeOptions options = rope;
    options.interleaved = interleaved;
    Tensor y = t_.rope(bshd, positions(), options);
    // cos and sin times an attention scaling (yarn's): the rotated x times it.
    if (cos->number != 1.0) y = t_.scale(y, cos->number);
    Imported out = ir(y);
    if (heads != 2) out.perm = {0, 2, 1, 3};
    out.shape = xv.shape;
    return out;
  }
  // torch's [B, H, S, D] value as autosp's [B, S, H, D]
  Tensor as_bshd(const Imported& v, const std::string& name) {
    if (v.perm == std::vector<int64_t>{0, 2, 1, 3}) return v.t;
    return t_.transpose(materialize(v, name), {0, 2, 1, 3});
  }

  // autosp::moe, export.py's form of a sparse mixture-of-experts block (Mixtral's, Qwen3-MoE's,
  // OLMoE's): x's rows, its router logits (the block's gate, a linear of the same rows), and each
  // expert's gate, up and down weights, as the moe op takes them.
  // autosp::moe_stacked: the experts stacked as transformers 5 keeps them, gate_up [E, 2 I, H]
  // and down [E, H, I], two operands of the same op.
  Imported moe(const FxNode& n) {
    const std::string x = arg_tensor(n, "x", 0), logits = arg_tensor(n, "router_logits", 1);
    if (rows_merged(value(x)) != rows_merged(value(logits)) || value(x).shape.size() != value(logits).shape.size())
      m_.fail_at(n, "x and the router logits are not rows alike");
    if (n.target == "torch.ops.autosp.moe_gpt_oss.default") {  // gpt-oss's experts, as gpt-oss keeps them
      std::vector<Tensor> experts;
      const char* names[] = {"gate_up", "gate_up_bias", "down", "down_bias"};
      for (size_t i = 0; i < 4; ++i) experts.push_back(tensor_of(arg_tensor(n, names[i], 2 + i)));
      const Attrs form{{"experts", std::string("gpt_oss")}, {"alpha", float_arg(n, "alpha", 7)},
                       {"limit", float_arg(n, "limit", 8)}};
      return rowwise(t_.moe(rowwise_of(x), rowwise_of(logits), experts, int_arg(n, "top_k", 6), true, form), x);
    }
    if (n.target == "torch.ops.autosp.moe_llama4.default") {
      // Llama 4's: gate_up [E, H, 2 I] (the gate's columns, then the up's), down [E, I, H]; its
      // router's sigmoid of the top k logits, unnormalised, weighting each expert's input
      const std::vector<Tensor> experts{tensor_of(arg_tensor(n, "gate_up", 2)), tensor_of(arg_tensor(n, "down", 3))};
      const Attrs form{{"experts", std::string("llama4")}, {"weight_input", int64_t{1}},
                       {"score", std::string("sigmoid")}};
      return rowwise(t_.moe(rowwise_of(x), rowwise_of(logits), experts, int_arg(n, "top_k", 4), false, form), x);
    }
    if (n.target == "torch.ops.autosp.moe_apart.default") {  // DBRX's: gate, up and down [E, I, H]
      std::vector<Tensor> experts;
      const char* names[] = {"gate", "up", "down"};
      for (size_t i = 0; i < 3; ++i) experts.push_back(tensor_of(arg_tensor(n, names[i], 2 + i)));
      return rowwise(t_.moe(rowwise_of(x), rowwise_of(logits), experts, int_arg(n, "top_k", 5),
                            bool_arg(n, "normalize", 6, false)),
                     x);
    }
    if (n.target == "torch.ops.autosp.moe_stacked.default") {
      const std::vector<Tensor> experts{tensor_of(arg_tensor(n, "gate_up", 2)), tensor_of(arg_tensor(n, "down", 3))};
      Attrs routing = moe_routing(n, 6);
      // transposed (Aria's): gate_up [E, H, 2 I] (the gate's columns, then the up's), down [E, I, H],
      // the moe op's "llama4" experts (Llama 4 keeps its experts so)
      if (bool_arg(n, "transposed", 14, false)) routing.set("experts", std::string("llama4"));
      // LongCat-Flash's zero-computation experts: the last of the experts the logits score, no weights
      if (const int64_t zero = int_arg(n, "zero_experts", 15, 0); zero != 0) routing.set("zero_experts", zero);
      return rowwise(t_.moe(rowwise_of(x), rowwise_of(logits), experts, int_arg(n, "top_k", 4),
                            bool_arg(n, "normalize", 5, false), routing),
                     x);
    }
    std::vector<std::vector<std::string>> lists;
    const char* names[] = {"gate", "up", "down"};
    for (size_t i = 0; i < 3; ++i) {
      const json* a = arg(n, names[i], 2 + i);
      if (!a || !a->contains("as_tensors")) m_.fail_at(n, str("the experts' ", names[i], " weights are not a list"));
      lists.emplace_back();
      for (const json& t : (*a)["as_tensors"]) lists.back().push_back(t.value("name", ""));
    }
    if (lists[0].size() != lists[1].size() || lists[0].size() != lists[2].size())
      m_.fail_at(n, str(lists[0].size(), " gate, ", lists[1].size(), " up and ", lists[2].size(),
                        " down weights: one of each per expert"));
    std::vector<Tensor> experts;
    for (size_t e = 0; e < lists[0].size(); ++e)
      for (size_t i = 0; i < 3; ++i) experts.push_back(tensor_of(lists[i][e]));
    const int64_t top_k = int_arg(n, "top_k", 5);
    Attrs routing = moe_routing(n, 7);
    // LongCat-Flash's zero-computation experts: the last of the experts the logits score, no weights
    if (const int64_t zero = int_arg(n, "zero_experts", 15, 0); zero != 0) routing.set("zero_experts", zero);
    return rowwise(t_.moe(rowwise_of(x), rowwise_of(logits), experts, top_k, bool_arg(n, "normalize", 6, false),
                          routing),
                   x);
  }
  // The router's attributes beyond softmax top-k (ops/moe.cpp), where the program gives them: the
  // arguments score, groups, topk_group, group_score, dropped, scale, norm_eps and bias, from
  // position `at` on.
  Attrs moe_routing(const FxNode& n, size_t at) {
    Attrs routing;
    for (const auto& [key, k] : {std::pair<const char*, size_t>{"score", 0}, {"group_score", 3}, {"dropped", 4}})
      if (const json* a = arg(n, key, at + k); a && a->contains("as_string"))
        routing.set(key, (*a)["as_string"].get<std::string>());
    for (const auto& [key, k] : {std::pair<const char*, size_t>{"groups", 1}, {"topk_group", 2}})
      if (const json* a = arg(n, key, at + k); a && a->contains("as_int"))
        routing.set(key, (*a)["as_int"].get<int64_t>());
    for (const auto& [key, k] : {std::pair<const char*, size_t>{"scale", 5}, {"norm_eps", 6}})
      if (const json* a = arg(n, key, at + k); a && !a->contains("as_none"))
        routing.set(key, float_arg(n, key, at + k, 0.0));
    if (const json* a = arg(n, "bias", at + 7); a && a->contains("as_floats") && !(*a)["as_floats"].empty()) {
      std::vector<double> bias;
      for (const json& b : (*a)["as_floats"]) bias.push_back(float_of(b));
      routing.set("bias", bias);
    }
    return routing;
  }

  // autosp::moe_balance, export.py's form of transformers' load_balancing_loss_func (Switch
  // Transformer's): over the N rows of all L layers' router logits, E sum_e (c_e / N) (P_e / N),
  // c_e the rows whose top k include e and P_e the sum of the rows' probabilities of e: the
  // moe_balance op's two sums, then their product summed and scaled by E / N^2.
  Imported moe_balance(const FxNode& n) {
    const json* a = arg(n, "router_logits", 0);
    if (!a || !a->contains("as_tensors") || (*a)["as_tensors"].empty())
      m_.fail_at(n, "the router logits are not a list of tensors");
    std::vector<Tensor> logits;
    int64_t rows = 0;
    for (const json& t : (*a)["as_tensors"]) {
      logits.push_back(rowwise_of(t.value("name", "")));
      rows += rows_of(t_.shape(logits.back()));
    }
    const int64_t E = int_arg(n, "num_experts", 1), k = int_arg(n, "top_k", 2);
    if (t_.shape(logits[0]).back() != E)
      m_.fail_at(n, str("num_experts ", E, " for router logits of ", t_.shape(logits[0]).back(), " experts"));
    const Tensor stats = t_.moe_balance(logits, k);
    const Tensor counts = t_.slice(stats, 0, 0, 1), psum = t_.slice(stats, 0, 1, 2);
    const double N = double(rows);
    return ir(t_.scale(t_.sum(t_.mul(counts, psum)), double(E) / (N * N)));
  }

  Imported cat(const FxNode& n) {
    const json* list = arg(n, "tensors", 0);
    if (!list || !list->contains("as_tensors")) m_.fail_at(n, "cat without a list of tensors");
    std::vector<std::string> parts;
    for (const json& t : (*list)["as_tensors"]) parts.push_back(t.value("name", ""));
    std::vector<Tensor> xs;
    Shape shape;
    int64_t dim = int_arg(n, "dim", 1, 0);
    std::vector<std::string> kept;
    for (const std::string& p : parts) {
      const Imported& v = value(p);
      if (v.kind != Imported::tensor) m_.fail_at(n, "cat of a value that is not a tensor");
      if (dim < 0) dim += int64_t(v.shape.size());
      if (numel(v.shape) == 0) continue;  // an empty piece (Phi3's q_pass of a full rotary)
      kept.push_back(p);
    }
    if (kept.size() == 1) return value(kept[0]);
    for (const std::string& p : kept) xs.push_back(tensor_of(p));
    return ir(t_.concat(xs, dim));
  }

  // K or V heads for autosp's attention, which reads grouped heads without repeating them: a
  // value as torch has it ([B, KV, S, D], bshd false), or one in autosp's [B, S, KV, D] (true).
  struct KvHeads {
    std::string name;
    bool bshd = false;
  };
  // transformers' repeat_kv in a model that calls attention itself (StableLM):
  // x[:, :, None].expand(B, KV, rep, S, D).reshape(B, KV * rep, S, D) is x [B, KV, S, D]; and
  // torchtitan's (Meta's Llama's), before the heads move: x[:, :, :, None].expand(B, S, KV, rep, D)
  // .reshape(B, S, KV * rep, D).transpose(1, 2) is x [B, S, KV, D]. Anything else is `name` itself.
  KvHeads unrepeated_kv(const std::string& name) {
    const FxNode* tr = node_of(through(name));
    const bool bshd = is(tr, "transpose.int") && std::set<int64_t>{int_arg(*tr, "dim0", 1), int_arg(*tr, "dim1", 2)} ==
                                                     std::set<int64_t>{1, 2};
    const FxNode* r = node_of(through(bshd ? arg_tensor(*tr, "self", 0) : name));
    if (!is(r, "reshape.default") && !is(r, "view.default") && !is(r, "_unsafe_view.default")) return {name};
    const FxNode* e = node_of(through(arg_tensor(*r, "self", 0)));
    if (!is(e, "expand.default")) return {name};
    const FxNode* u = node_of(through(arg_tensor(*e, "self", 0)));
    // the new dim: after the heads (2 of [B, KV, S, D]; 3 of [B, S, KV, D])
    const int64_t at = bshd ? 3 : 2;
    if (!is(u, "unsqueeze.default") || (int_arg(*u, "dim", 1) != at && int_arg(*u, "dim", 1) != at - 5)) return {name};
    const std::string x = arg_tensor(*u, "self", 0);
    const Imported& xv = value(x);
    const std::vector<int64_t> size = ints_arg(*e, "size", 1);
    const std::vector<int64_t> shape = ints_arg(*r, arg(*r, "size", 1) ? "size" : "shape", 1);
    if (xv.shape.size() != 4 || size.size() != 5 || shape.size() != 4) return {name};
    // x's dims around the new one: heads at h (1 or 2), the others alike in size, shape and x
    const int64_t h = bshd ? 2 : 1, kv = xv.shape[h], rep = size[at];
    bool repeats = rep >= 1 && shape[h] == kv * rep;
    for (int64_t d = 0; d < 4; ++d) {
      const int64_t sd = d < at ? d : d + 1;  // d's dim in `size`
      repeats = repeats && (size[sd] == xv.shape[d] || size[sd] == -1);
      if (d != h) repeats = repeats && (shape[d] == xv.shape[d] || shape[d] == -1);
    }
    return repeats ? KvHeads{x, bshd} : KvHeads{name};
  }

  Imported attention(const FxNode& n, const std::string& q, const std::string& k_in, const std::string& v_in,
                     bool causal, double scale, int64_t window, double softcap = 0,
                     const std::vector<double>& alibi = {}, const std::string& sinks = "", int64_t chunk = 0,
                     const std::vector<double>& temperature = {}, bool k_bshd = false) {
    const KvHeads k = k_bshd ? KvHeads{k_in, true} : unrepeated_kv(k_in), v = unrepeated_kv(v_in);
    const Imported &qv = value(q), &kv = value(k.name), &vv = value(v.name);
    if (qv.shape.size() != 4 || kv.shape.size() != 4 || vv.shape.size() != 4) m_.fail_at(n, "attention on values not [B, H, S, D]");
    if (!causal) m_.fail_at(n, "non-causal attention: autosp trains causal language models");
    if (!(softcap >= 0) || !std::isfinite(softcap)) m_.fail_at(n, str("attention softcap ", softcap));
    const Tensor qt = as_bshd(qv, q), kt = k.bshd ? tensor_of(k.name) : as_bshd(kv, k.name),
                 vt = v.bshd ? tensor_of(v.name) : as_bshd(vv, v.name);
    std::optional<Tensor> sink_logits;
    if (!sinks.empty()) {
      const Imported& z = value(sinks);
      if (z.shape != std::vector<int64_t>{qv.shape[1]})
        m_.fail_at(n, str("attention sinks of shape ", shape_str(z.shape), " for ", qv.shape[1], " query heads"));
      sink_logits = tensor_of(sinks);
    }
    Tensor out =
        t_.attention(qt, kt, vt, documents_, sink_logits, causal, scale, window, softcap, alibi, chunk, temperature);
    Imported r = ir(out);
    r.perm = {0, 2, 1, 3};
    r.shape = qv.shape;
    r.shape[3] = vv.shape[3];
    return r;
  }

  // transformers' XIELUActivation (Apertus), as torch.export writes it:
  //   where(x > 0, softplus(alpha_p) * x * x + beta * x,
  //         (expm1(min(x, eps)) - x) * (beta + softplus(alpha_n)) + beta * x)
  // with alpha_p, alpha_n parameters and beta, eps stored scalars -> xielu(x, alpha_p, alpha_n).
  std::optional<Imported> match_xielu(const FxNode& n) {
    auto node = [&](const FxNode& m, const char* name, size_t pos) {
      return node_of(through(arg_tensor(m, name, pos)));
    };
    auto tensor = [&](const FxNode& m, const char* name, size_t pos) { return through(arg_tensor(m, name, pos)); };
    const FxNode* gt = node(n, "condition", 0);
    if (!is(gt, "gt.Scalar") || scalar(*gt, "other", 1) != 0.0) return std::nullopt;
    const std::string x = tensor(*gt, "self", 0);
    // beta * x, beta a stored scalar: its value, or nullopt.
    auto beta_times_x = [&](const FxNode* m) -> std::optional<double> {
      if (!is(m, "mul.Tensor") || tensor(*m, "other", 1) != x) return std::nullopt;
      return scalar(*m, "self", 0);
    };
    // softplus(p) of a parameter p (torch's defaults: beta 1, threshold 20): p's placeholder.
    auto softplus_of = [&](const FxNode* m) -> std::string {
      if (!is(m, "softplus.default") || float_arg(*m, "beta", 1, 1.0) != 1.0 ||
          float_arg(*m, "threshold", 2, 20.0) != 20.0)
        return "";
      const std::string p = tensor(*m, "self", 0);
      return m_.parameter_of.count(p) ? p : "";
    };
    // Positive branch: add(mul(mul(softplus(alpha_p), x), x), beta * x).
    const FxNode* pos = node(n, "self", 1);
    if (!is(pos, "add.Tensor") || float_arg(*pos, "alpha", 2, 1.0) != 1.0) return std::nullopt;
    const FxNode* px2 = node(*pos, "self", 0);
    if (!is(px2, "mul.Tensor") || tensor(*px2, "other", 1) != x) return std::nullopt;
    const FxNode* px = node(*px2, "self", 0);
    if (!is(px, "mul.Tensor") || tensor(*px, "other", 1) != x) return std::nullopt;
    const std::string alpha_p = softplus_of(node(*px, "self", 0));
    const std::optional<double> beta = beta_times_x(node(*pos, "other", 1));
    // Negative branch: add(mul(sub(expm1(min(x, eps)), x), add(beta, softplus(alpha_n))), beta * x).
    const FxNode* neg = node(n, "other", 2);
    if (alpha_p.empty() || !beta || !is(neg, "add.Tensor") || float_arg(*neg, "alpha", 2, 1.0) != 1.0 ||
        beta_times_x(node(*neg, "other", 1)) != beta)
      return std::nullopt;
    const FxNode* scaled = node(*neg, "self", 0);
    if (!is(scaled, "mul.Tensor")) return std::nullopt;
    const FxNode* diff = node(*scaled, "self", 0);
    const FxNode* an = node(*scaled, "other", 1);
    if (!is(diff, "sub.Tensor") || float_arg(*diff, "alpha", 2, 1.0) != 1.0 || tensor(*diff, "other", 1) != x)
      return std::nullopt;
    const FxNode* em1 = node(*diff, "self", 0);
    const FxNode* mn = is(em1, "expm1.default") ? node(*em1, "self", 0) : nullptr;
    if (!is(mn, "min.other") && !is(mn, "minimum.default")) return std::nullopt;
    if (tensor(*mn, "self", 0) != x) return std::nullopt;
    const std::optional<double> eps = scalar(*mn, "other", 1);
    if (!eps || !is(an, "add.Tensor") || scalar(*an, "self", 0) != beta) return std::nullopt;
    const std::string alpha_n = softplus_of(node(*an, "other", 1));
    if (alpha_n.empty()) return std::nullopt;
    return rowwise(t_.xielu(rowwise_of(x), tensor_of(alpha_p), tensor_of(alpha_n), *beta, *eps), x);
  }

  // c where `n` is c * tanh(x / c) (mul by c of the tanh of a div by c, the same constant: Gemma
  // 2's final logit softcap), else 0. The tanh is then n's "self" and the div the tanh's.
  double final_softcap(const FxNode* n) {
    if (is(n, "tanh.default")) {  // c = 1
      const std::string x = through(arg_tensor(*n, "self", 0));
      return x.empty() || !node_of(x) ? 0 : 1.0;
    }
    if (!is(n, "mul.Tensor")) return 0;
    const std::optional<double> c = scalar(*n, "other", 1);
    const FxNode* t = node_of(through(arg_tensor(*n, "self", 0)));
    if (!c || !(*c > 0) || !is(t, "tanh.default")) return 0;
    const FxNode* d = node_of(through(arg_tensor(*t, "self", 0)));
    if (!is(d, "div.Tensor") || scalar(*d, "other", 1) != c) return 0;
    const std::string x = arg_tensor(*d, "self", 0);
    return x.empty() || !node_of(x) ? 0 : *c;  // the logits a node makes (not a stored constant), not imported here
  }

  // A model's own label shift, logits[:, :-1] against labels[:, 1:] (nanoGPT's, transformers'
  // older one): position i scored against token i + 1 and the last position unscored, which is
  // what transformers' pad(labels, (0, 1), -100)[:, 1:] does too. autosp's labels are the next
  // tokens already, at every position, so the shift is read as them: the logits unsliced (their
  // name), or nullopt where `logits` and `labels` are not that pair.
  std::optional<std::string> shifted_logits(const std::string& logits, const std::string& labels) {
    const FxNode* l = node_of(logits);
    const FxNode* y = node_of(labels);
    if (!is(l, "slice.Tensor") || !is(y, "slice.Tensor")) return std::nullopt;
    if (through(arg_tensor(*y, "self", 0)) != m_.user_inputs[1]) return std::nullopt;
    const int64_t ydim = int_arg(*y, "dim", 1, 0), ldim = int_arg(*l, "dim", 1, 0);
    const int64_t S = o_.seq_len;
    if ((ydim != 1 && ydim != -1) || int_arg(*y, "start", 2, 0) != 1 || int_arg(*y, "end", 3, INT64_MAX) < S)
      m_.fail_at(*y, "a slice of the labels other than labels[:, 1:] (the next tokens)");
    const int64_t end = int_arg(*l, "end", 3, INT64_MAX);
    if ((ldim != 1 && ldim != -2) || int_arg(*l, "start", 2, 0) != 0 || (end != -1 && end != S - 1))
      m_.fail_at(*l, "labels[:, 1:] against logits other than logits[:, :-1] (every position but the last)");
    if (const json* step = arg(*l, "step", 4); step && int_value(*l, *step) != 1) m_.fail_at(*l, "a strided slice");
    if (const json* step = arg(*y, "step", 4); step && int_value(*y, *step) != 1) m_.fail_at(*y, "a strided slice");
    return through(arg_tensor(*l, "self", 0));
  }

  // cross_entropy_loss(logits.view(-1, V), labels.view(-1)) with the mean over labelled tokens.
  // The logits whose log_softmax over the last dim `name` is (F.log_softmax(logits, -1), or dim
  // 1 of logits.view(-1, V)), for nll_loss `n`; refused otherwise.
  std::string log_softmax_input(const FxNode& n, const std::string& name) {
    const FxNode* ls = node_of(name);
    if (!is(ls, "_log_softmax.default") && !is(ls, "log_softmax.int"))
      m_.fail_at(n, "nll_loss of something else than log_softmax of the logits (autosp imports the cross entropy "
                    "written so)");
    const int64_t dim = int_arg(*ls, "dim", 1, 0);
    const std::string x = arg_tensor(*ls, "self", 0);
    bool last = dim == -1;
    if (const FxNode* view = node_of(through(x)); !last && view &&
        (is(view, "view.default") || is(view, "reshape.default") || is(view, "_unsafe_view.default")))
      if (const json* size = arg(*view, arg(*view, "size", 1) ? "size" : "shape", 1))
        for (const char* list : {"as_ints", "as_sym_ints"})
          if (size->contains(list)) last = dim == int64_t((*size)[list].size()) - 1;
    if (!last) m_.fail_at(*ls, "a log_softmax over a dim other than the last (the classes)");
    return x;
  }
  // log_probs: n is nll_loss, whose input must be log_softmax of the logits over their last dim.
  Imported cross_entropy(const FxNode& n, bool log_probs = false) {
    if (int_arg(n, "reduction", 3, 1) != 1) m_.fail_at(n, "a cross entropy not reduced by its mean");
    // A negative ignore_index (transformers' -100, nanoGPT's -1) is no token id, so it leaves unscored
    // only what autosp's data leaves unscored (its -100 labels); one that is a token id would
    // leave that token unscored too, which autosp's op does not do besides.
    if (const int64_t ignore = int_arg(n, "ignore_index", 4, -100); ignore >= 0)
      m_.fail_at(n, str("a cross entropy with ignore_index ", ignore, ", a token id: autosp leaves unscored only the "
                        "labels its data marks (a negative ignore_index, -100 or -1, is read as those)"));
    if (!log_probs && float_arg(n, "label_smoothing", 5, 0.0) != 0.0) m_.fail_at(n, "label smoothing");
    if (!arg_tensor(n, "weight", 2).empty()) m_.fail_at(n, "class weights");
    // Look through the flattening views to the [B, S, V] logits and [B, S] labels.
    auto unflatten = [&](std::string s) {
      s = through(s);
      while (const FxNode* v = node_of(s)) {
        if (!is(v, "view.default") && !is(v, "reshape.default") && !is(v, "flatten.using_ints")) break;
        s = through(arg_tensor(*v, "self", 0));
      }
      return s;
    };
    std::string logits = unflatten(arg_tensor(n, "self", 0));
    if (log_probs) logits = unflatten(log_softmax_input(n, logits));
    const std::string lab = unflatten(arg_tensor(n, "target", 1));
    Tensor labels_t;
    if (const std::optional<std::string> unshifted = shifted_logits(logits, lab)) {
      logits = *unshifted;
      labels_t = labels();
    } else {
      const Imported& lv = value(lab);
      if (lv.kind == Imported::tensor && lv.t.id == (labels_ ? labels_->id : -2)) labels_t = lv.t;
      else if (lab == m_.user_inputs[1]) labels_t = labels();  // already shifted by the caller
      else m_.fail_at(n, "the loss's labels are not the program's labels (shifted as transformers does, by "
                         "logits[:, :-1] against labels[:, 1:], or as given)");
    }
    // The head: a bias-free linear whose logits nothing else reads -> linear_cross_entropy; logits
    // multiplied or divided by a constant (Granite's logits_scaling, Cohere's logit_scale) are the
    // linear of the hidden states so scaled; capped as c tanh(logits / c) (Gemma 2's
    // final_logit_softcapping), the op's softcap (a cap of 1: tanh(logits), its / 1 and * 1 read as
    // copies, canonical_forms).
    const FxNode* head = node_of(through(logits));
    const double softcap = final_softcap(head);
    if (softcap > 0 && is(head, "tanh.default")) head = node_of(through(arg_tensor(*head, "self", 0)));
    else if (softcap > 0) head = node_of(through(arg_tensor(*node_of(through(arg_tensor(*head, "self", 0))), "self", 0)));
    double factor = 1.0;
    if (is(head, "mul.Tensor") || is(head, "div.Tensor")) {
      const std::string a = arg_tensor(*head, "self", 0), b = arg_tensor(*head, "other", 1);
      const bool div = is(head, "div.Tensor");
      std::optional<double> c;
      std::string inner;
      if (b.empty() || value(b).kind == Imported::host) {
        c = scalar(*head, "other", 1);
        inner = a;
      } else if (!div && (a.empty() || value(a).kind == Imported::host)) {
        c = scalar(*head, "self", 0);
        inner = b;
      }
      const FxNode* lin = inner.empty() ? nullptr : node_of(through(inner));
      if (c && *c != 0.0 && is(lin, "linear.default") && arg_tensor(*lin, "bias", 2).empty()) {
        factor = div ? 1.0 / *c : *c;
        head = lin;
      }
    }
    if (is(head, "linear.default") && arg_tensor(*head, "bias", 2).empty()) {
      Tensor x = tensor_of(arg_tensor(*head, "input", 0)), w = tensor_of(arg_tensor(*head, "weight", 1));
      if (factor != 1.0) x = t_.scale(x, factor);
      m_.vocab = t_.shape(w)[0];
      if (t_.shape(x).size() != 3) m_.fail_at(n, "logits that are not [B, S, V]");
      return ir(t_.linear_cross_entropy(x, w, labels_t, -100, softcap));
    }
    Tensor l = tensor_of(logits);
    if (t_.shape(l).size() != 3) m_.fail_at(n, "logits that are not [B, S, V]");
    m_.vocab = t_.shape(l).back();
    return ir(t_.cross_entropy(l, labels_t));
  }
};

Graph TorchProgram::forward(const models::LlamaTraceOptions& options) const {
  if (options.batch <= 0 || options.seq_len <= 0)
    user_error(impl_->path, ": batch ", options.batch, " and sequence length ", options.seq_len, " must be positive");
  TorchImporter importer(*impl_, options);
  return importer.run();
}

}  // namespace autosp
