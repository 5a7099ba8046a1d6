// Printer and parser of the graph text form (see graph.h). The printer is canonical:
// attributes sorted, floats in shortest round-trip form, so text equality is graph equality.
#include <cctype>
#include <charconv>
#include <cstring>

#include "ir/graph.h"
#include "util/error.h"

namespace autosp {

namespace {

std::string format_double(double x) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), x);
  AUTOSP_CHECK(ec == std::errc(), "to_chars failed");
  std::string s(buf, end);
  // Mark it as a float so it parses back as one.
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string format_attr(const AttrValue& value) {
  if (auto* i = std::get_if<int64_t>(&value)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&value)) return format_double(*d);
  if (auto* s = std::get_if<std::string>(&value)) return quote(*s);
  if (auto* floats = std::get_if<std::vector<double>>(&value)) {  // each marked a float: [1.0, 0.5]
    std::string out = "[";
    for (size_t i = 0; i < floats->size(); ++i) out += (i ? ", " : "") + format_double((*floats)[i]);
    return out + "]";
  }
  const auto& list = std::get<std::vector<int64_t>>(value);
  std::string out = "[";
  for (size_t i = 0; i < list.size(); ++i) out += (i ? ", " : "") + std::to_string(list[i]);
  return out + "]";
}

}  // namespace

std::string print_graph(const Graph& g) {
  std::string out = "graph {\n";
  for (const Node& node : g.nodes()) {
    out += "  ";
    for (size_t i = 0; i < node.outputs.size(); ++i)
      out += (i ? ", %" : "%") + std::to_string(node.outputs[i]);
    out += str(" = ", op_name(node.op), "(");
    for (size_t i = 0; i < node.inputs.size(); ++i)
      out += (i ? ", %" : "%") + std::to_string(node.inputs[i]);
    out += ")";
    if (!node.attrs.all().empty()) {
      out += " {";
      bool first = true;
      for (const auto& [key, value] : node.attrs.all()) {
        out += (first ? "" : ", ") + key + "=" + format_attr(value);
        first = false;
      }
      out += "}";
    }
    out += " : ";
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      const Value& v = g.value(node.outputs[i]);
      out += (i ? ", " : "") + type_str(v.type);
      if (v.sharding.kind != Sharding::Kind::none) out += " " + sharding_str(v.sharding);
      if (!v.name.empty()) out += " " + quote(v.name);
    }
    out += "\n";
  }
  for (const GraphOutput& o : g.outputs()) out += str("  output ", quote(o.name), " = %", o.value, "\n");
  return out + "}\n";
}

namespace {

class Parser {
 public:
  Parser(const std::string& text, const std::string& source) : text_(text), source_(source) {}

  Graph parse() {
    expect_word("graph");
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      if (peek() == 'o') {
        parse_output();
      } else {
        parse_node();
      }
    }
    expect('}');
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the closing '}'");
    return std::move(graph_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') { ++line; col = 1; } else { ++col; }
    }
    user_error(source_, ":", line, ":", col, ": ", what);
  }

  // Whitespace and '#' comments to the end of the line.
  void skip_space() {
    while (pos_ < text_.size()) {
      if (text_[pos_] == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else if (std::isspace(static_cast<unsigned char>(text_[pos_]))) {
        ++pos_;
      } else {
        break;
      }
    }
  }
  char peek() {
    skip_space();
    return pos_ < text_.size() ? text_[pos_] : '\0';
  }
  void expect(char c) {
    if (peek() != c) fail(str("expected '", c, "'"));
    ++pos_;
  }
  bool accept(char c) {
    if (peek() != c) return false;
    ++pos_;
    return true;
  }
  std::string word() {
    skip_space();
    size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_'))
      ++pos_;
    if (start == pos_) fail("expected a name");
    return text_.substr(start, pos_ - start);
  }
  void expect_word(const char* w) {
    skip_space();
    if (text_.compare(pos_, std::strlen(w), w) != 0) fail(str("expected '", w, "'"));
    word();
  }
  int64_t integer() {
    skip_space();
    int64_t v = 0;
    auto [end, ec] = std::from_chars(text_.data() + pos_, text_.data() + text_.size(), v);
    if (ec != std::errc()) fail("expected an integer");
    pos_ = end - text_.data();
    return v;
  }
  std::string quoted() {
    expect('"');
    std::string s;
    while (pos_ < text_.size() && text_[pos_] != '"') {
      if (text_[pos_] == '\\') ++pos_;
      if (pos_ < text_.size()) s += text_[pos_++];
    }
    if (pos_ >= text_.size()) fail("unterminated string");
    ++pos_;
    return s;
  }
  ValueId value_ref() {
    expect('%');
    int64_t id = integer();
    auto it = ids_.find(id);
    if (it == ids_.end()) fail(str("%", id, " is used before it is defined"));
    return it->second;
  }
  AttrValue attr_value() {
    char c = peek();
    if (c == '"') return quoted();
    if (c == '[') {  // an int list, or a float list when its first element is a float
      ++pos_;
      if (accept(']')) return std::vector<int64_t>{};
      AttrValue first = number();
      if (const double* d = std::get_if<double>(&first)) {
        std::vector<double> list = {*d};
        while (accept(',')) {
          AttrValue x = number();
          if (!std::holds_alternative<double>(x)) fail("a float list with an integer element (write it as 1.0)");
          list.push_back(std::get<double>(x));
        }
        expect(']');
        return list;
      }
      std::vector<int64_t> list = {std::get<int64_t>(first)};
      while (accept(',')) {
        AttrValue x = number();
        if (!std::holds_alternative<int64_t>(x)) fail("an int list with a float element");
        list.push_back(std::get<int64_t>(x));
      }
      expect(']');
      return list;
    }
    return number();
  }
  // An int, or a double when it has a '.', an exponent or is inf / nan.
  AttrValue number() {
    skip_space();
    size_t start = pos_;
    while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) ||
                                   std::strchr("+-.", text_[pos_])))
      ++pos_;
    std::string token = text_.substr(start, pos_ - start);
    if (token.empty()) fail("expected an attribute value");
    const char* b = token.data();
    const char* e = b + token.size();
    if (token.find_first_of(".eEn") == std::string::npos) {
      int64_t v = 0;
      auto [end, ec] = std::from_chars(b, e, v);
      if (ec != std::errc() || end != e) fail(str("bad integer '", token, "'"));
      return v;
    }
    double d = 0;
    auto [end, ec] = std::from_chars(b, e, d);
    if (ec != std::errc() || end != e) fail(str("bad number '", token, "'"));
    return d;
  }
  TensorType tensor_type() {
    std::string dt = word();
    auto dtype = parse_dtype(dt);
    if (!dtype) fail(str("unknown dtype '", dt, "'"));
    TensorType t{*dtype, {}};
    expect('[');
    if (!accept(']')) {
      do {
        int64_t d = integer();
        if (d < 0) fail("negative dimension");
        t.shape.push_back(d);
      } while (accept(','));
      expect(']');
    }
    return t;
  }

  void parse_output() {
    expect_word("output");
    std::string name = quoted();
    expect('=');
    graph_.add_output(name, value_ref());
  }

  void parse_node() {
    std::vector<int64_t> result_ids;
    do {
      expect('%');
      result_ids.push_back(integer());
    } while (accept(','));
    expect('=');
    std::string opname = word();
    auto op = parse_op(opname);
    if (!op) fail(str("unknown op '", opname, "'"));
    expect('(');
    std::vector<ValueId> inputs;
    if (!accept(')')) {
      do inputs.push_back(value_ref());
      while (accept(','));
      expect(')');
    }
    Attrs attrs;
    if (accept('{')) {
      do {
        std::string key = word();
        expect('=');
        attrs.set(key, attr_value());
      } while (accept(','));
      expect('}');
    }
    expect(':');
    std::vector<TensorType> types;
    std::vector<Sharding> shardings;
    std::vector<std::string> names;
    for (size_t i = 0; i < result_ids.size(); ++i) {
      if (i) expect(',');
      types.push_back(tensor_type());
      Sharding sh;
      if (accept('@')) {
        std::string kind = word();
        if (kind == "replicated") sh.kind = Sharding::Kind::replicated;
        else if (kind == "partial") sh.kind = Sharding::Kind::partial;
        else if (kind == "shard") {
          sh.kind = Sharding::Kind::shard;
          expect('(');
          sh.dim = static_cast<int>(integer());
          expect(')');
        } else fail(str("unknown sharding '@", kind, "'"));
      }
      shardings.push_back(sh);
      names.push_back(peek() == '"' ? quoted() : "");
    }
    if (*op == OpKind::input && (!attrs.has("role") ||
                                 !std::holds_alternative<std::string>(attrs.all().at("role")) ||
                                 !parse_role(attrs.get_str("role"))))
      fail("an input needs a role attribute, e.g. {role=\"parameter\"}");
    NodeId n = graph_.add_node(*op, std::move(inputs), std::move(attrs), types);
    const Node& node = graph_.node(n);
    for (size_t i = 0; i < result_ids.size(); ++i) {
      if (!ids_.emplace(result_ids[i], node.outputs[i]).second)
        fail(str("%", result_ids[i], " is defined twice"));
      Value& v = graph_.mutable_value(node.outputs[i]);
      v.sharding = shardings[i];
      v.name = names[i];
    }
  }

  const std::string& text_;
  const std::string& source_;
  size_t pos_ = 0;
  Graph graph_;
  std::map<int64_t, ValueId> ids_;
};

}  // namespace

Graph parse_graph(const std::string& text, const std::string& source) {
  return Parser(text, source).parse();
}

}  // namespace autosp
