#include "models/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "util/error.h"

namespace autosp::models {

using nlohmann::json;

namespace {

struct Reader {
  const json& j;
  const std::string& source;

  [[noreturn]] void bad(const std::string& key, const std::string& what) const {
    user_error(source, ": ", key, ": ", what);
  }
  const json* find(const std::string& key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  int64_t positive_int(const std::string& key, std::optional<int64_t> fallback = {}) const {
    const json* v = find(key);
    if (!v) {
      if (fallback) return *fallback;
      bad(key, "missing (a positive integer is required)");
    }
    if (!v->is_number_integer() || v->get<int64_t>() <= 0)
      bad(key, str("expected a positive integer, got ", v->dump()));
    return v->get<int64_t>();
  }
  double positive_number(const std::string& key, double fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_number() || !(v->get<double>() > 0)) bad(key, str("expected a positive number, got ", v->dump()));
    return v->get<double>();
  }
  bool boolean(const std::string& key, bool fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_boolean()) bad(key, str("expected true or false, got ", v->dump()));
    return v->get<bool>();
  }
  std::string string(const std::string& key) const {
    const json* v = find(key);
    if (!v) return "";
    if (!v->is_string()) bad(key, str("expected a string, got ", v->dump()));
    return v->get<std::string>();
  }
};

}  // namespace

namespace {

// The architectures autosp trains: one decoder, parameterised (LlamaConfig). Each reads the
// config keys every one of them reads (kModelKeys) and its own (keys): autosp implements
// each, or refuses a value it does not implement, naming the key.
struct Architecture {
  const char* name;        // config.json's architectures[0]
  const char* model_type;  // and its model_type
  std::set<std::string> keys;
};
const Architecture kArchitectures[] = {
    {"LlamaForCausalLM", "llama", {"attention_bias", "mlp_bias", "pretraining_tp"}},
    // transformers' Qwen2 and Qwen3 read use_sliding_window, sliding_window and
    // max_window_layers (into layer_types, which newer versions write too).
    {"Qwen2ForCausalLM", "qwen2", {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"}},
    {"Qwen3ForCausalLM",
     "qwen3",
     {"attention_bias", "use_sliding_window", "sliding_window", "max_window_layers", "layer_types"}},
    {"MistralForCausalLM", "mistral", {"sliding_window"}},
};

// config.json keys that every architecture above reads.
const std::set<std::string> kModelKeys = {
    "architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "rope_theta",
    "rope_scaling", "rope_parameters", "tie_word_embeddings", "max_position_embeddings", "initializer_range",
    "attention_dropout", "partial_rotary_factor", "torch_dtype", "dtype", "quantization_config",
    "original_max_position_embeddings"};
// Keys transformers writes (or wrote: older versions kept the generation settings here,
// before generation_config.json) that change nothing in a training step: known, so not
// warned about.
const std::set<std::string> kInertKeys = {
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "use_cache",
    "transformers_version", "_name_or_path", "output_attentions", "output_hidden_states", "return_dict",
    "torchscript", "use_bfloat16", "tf_legacy_loss", "is_decoder", "is_encoder_decoder", "add_cross_attention",
    "tie_encoder_decoder", "cross_attention_hidden_size", "chunk_size_feed_forward", "pruned_heads", "id2label",
    "label2id", "problem_type", "finetuning_task", "tokenizer_class", "prefix", "task_specific_params",
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
    "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
    "output_scores", "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
    "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens"};
// Keys inside rope_parameters (transformers 5) or rope_scaling (transformers 4) that every
// rope type reads, and those its type reads (transformers ignores the others).
const std::set<std::string> kRopeKeys = {"rope_theta", "rope_type", "type", "partial_rotary_factor"};
const std::map<std::string, std::set<std::string>> kRopeTypeKeys = {
    {"default", {}},
    {"linear", {"factor"}},
    {"llama3", {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}},
    {"yarn",
     {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
      "mscale_all_dim", "truncate"}}};

// The rope settings, which config.json may give in two places: transformers 5 writes them
// all inside `rope_parameters` (rope_theta, rope_type, the scaling factors) and nothing at
// the top level; transformers 4 writes `rope_theta` at the top level and the scaling in
// `rope_scaling` (null without). transformers 5 still reads the older keys. Where a setting
// is given in both places the two must agree: each version of transformers would read a
// different one, so a disagreement is a model that trains differently depending on who
// loads it.
struct RopeKeys {
  const Reader& r;
  const json* params;   // rope_parameters, or null
  const json* scaling;  // rope_scaling, or null

  // The value of setting `key` inside rope_parameters and at its older place (`legacy`
  // in `legacy_in`, named `legacy_name`), checked to agree; nullopt when neither gives it.
  std::optional<double> number(const std::string& key, const json* legacy_in, const std::string& legacy,
                               const std::string& legacy_name) const {
    const json* a = params ? Reader{*params, r.source}.find(key) : nullptr;
    const json* b = legacy_in ? Reader{*legacy_in, r.source}.find(legacy) : nullptr;
    auto value = [&](const json* v, const std::string& name) {
      if (!v->is_number() || !(v->get<double>() > 0)) r.bad(name, str("expected a positive number, got ", v->dump()));
      return v->get<double>();
    };
    std::optional<double> pa, pb;
    if (a) pa = value(a, "rope_parameters." + key);
    if (b) pb = value(b, legacy_name);
    if (pa && pb && *pa != *pb)
      r.bad(str("rope_parameters.", key, " and ", legacy_name),
            str("disagree (", a->dump(), " and ", b->dump(),
                "); transformers 5 reads the first, transformers 4 the second: make them equal or remove one"));
    return pa ? pa : pb;
  }

  std::string type() const {
    auto type_in = [&](const json* obj) -> std::optional<std::string> {
      if (!obj) return std::nullopt;
      Reader o{*obj, r.source};
      const std::string name = obj == params ? "rope_parameters" : "rope_scaling";
      // "type" is the older spelling of "rope_type".
      for (const char* key : {"rope_type", "type"})
        if (const json* v = o.find(key)) {
          if (!v->is_string()) r.bad(str(name, ".", key), str("expected a string, got ", v->dump()));
          return v->get<std::string>();
        }
      if (obj == params) return "default";  // rope_theta alone
      r.bad("rope_scaling.rope_type", "missing (rope_scaling without a rope_type; null for no scaling)");
    };
    const std::optional<std::string> a = type_in(params), b = type_in(scaling);
    if (a && b && *a != *b)
      r.bad("rope_parameters.rope_type and rope_scaling.rope_type",
            str("disagree (\"", *a, "\" and \"", *b,
                "\"); transformers 5 reads the first, transformers 4 the second: make them equal or remove one"));
    return a ? *a : b ? *b : "default";
  }
};

void parse_rope(const Reader& r, LlamaConfig& c, std::vector<std::string>& unknown) {
  const json* params = r.find("rope_parameters");
  const json* scaling = r.find("rope_scaling");
  if (params && !params->is_object()) r.bad("rope_parameters", str("expected an object or null, got ", params->dump()));
  if (scaling && !scaling->is_object()) r.bad("rope_scaling", str("expected an object or null, got ", scaling->dump()));
  for (const json* obj : {params, scaling}) {
    if (!obj) continue;
    const std::string name = obj == params ? "rope_parameters" : "rope_scaling";
    for (const auto& [key, v] : obj->items()) {
      // transformers 5 nests one set per attention type ({"full_attention": {...}, ...}) for
      // models that mix them; the architectures autosp trains have one.
      if (v.is_object()) r.bad(str(name, ".", key), "per-attention-type rope settings are not supported (one set)");
    }
  }
  const RopeKeys keys{r, params, scaling};
  const std::string type = keys.type();
  if (const auto known = kRopeTypeKeys.find(type); known != kRopeTypeKeys.end())
    for (const json* obj : {params, scaling})
      if (obj)
        for (const auto& [key, v] : obj->items())
          if (!kRopeKeys.count(key) && !known->second.count(key))
            unknown.push_back(str(obj == params ? "rope_parameters" : "rope_scaling", ".", key));
  // A rotary embedding over part of each head (transformers reads it for every rope type).
  if (std::optional<double> f = keys.number("partial_rotary_factor", &r.j, "partial_rotary_factor",
                                            "partial_rotary_factor");
      f && *f != 1.0)
    r.bad(params && params->contains("partial_rotary_factor") ? "rope_parameters.partial_rotary_factor"
                                                              : "partial_rotary_factor",
          str(*f, " is not supported (autosp rotates the whole head: 1)"));
  c.rope.theta = keys.number("rope_theta", &r.j, "rope_theta", "rope_theta").value_or(10000.0);

  if (type == "llama3") {
    auto need = [&](const char* key) {
      std::optional<double> v = keys.number(key, scaling, key, str("rope_scaling.", key));
      if (!v) r.bad(str(params ? "rope_parameters." : "rope_scaling.", key), "missing (rope_type llama3 needs it)");
      return *v;
    };
    c.rope.rope_type = "llama3";
    c.rope.factor = need("factor");
    c.rope.low_freq_factor = need("low_freq_factor");
    c.rope.high_freq_factor = need("high_freq_factor");
    c.rope.original_max_position_embeddings = need("original_max_position_embeddings");
    if (c.rope.high_freq_factor <= c.rope.low_freq_factor)
      r.bad(str(params ? "rope_parameters" : "rope_scaling", ".high_freq_factor"), "must be greater than low_freq_factor");
  } else if (type == "linear") {
    c.rope.rope_type = "linear";
    const std::optional<double> factor = keys.number("factor", scaling, "factor", "rope_scaling.factor");
    if (!factor) r.bad(str(params ? "rope_parameters." : "rope_scaling.", "factor"), "missing (rope_type linear needs it)");
    c.rope.factor = *factor;
  } else if (type == "yarn") {
    // As transformers 5 reads it (_compute_yarn_parameters, standardize_rope_params): the
    // original positions from the top-level key where given, else the rope settings', else
    // max_position_embeddings; factor, where missing, their ratio.
    c.rope.rope_type = "yarn";
    const std::string where = params ? "rope_parameters." : "rope_scaling.";
    auto get = [&](const char* key) { return keys.number(key, scaling, key, str("rope_scaling.", key)); };
    std::optional<double> orig = get("original_max_position_embeddings");
    if (const json* top = r.find("original_max_position_embeddings")) {
      if (!top->is_number() || !(top->get<double>() > 0))
        r.bad("original_max_position_embeddings", str("expected a positive number, got ", top->dump()));
      if (orig && *orig != top->get<double>())
        r.bad(str(where, "original_max_position_embeddings and original_max_position_embeddings"),
              str("disagree (", *orig, " and ", top->dump(), "); transformers reads the second"));
      orig = top->get<double>();
    }
    c.rope.original_max_position_embeddings = orig.value_or(double(c.max_position_embeddings));
    c.rope.factor = get("factor").value_or(double(c.max_position_embeddings) / c.rope.original_max_position_embeddings);
    // transformers takes a missing or zero beta as its default.
    c.rope.beta_fast = get("beta_fast").value_or(32.0);
    c.rope.beta_slow = get("beta_slow").value_or(1.0);
    for (const json* obj : {params, scaling})
      if (const json* t = obj ? Reader{*obj, r.source}.find("truncate") : nullptr) {
        if (!t->is_boolean()) r.bad(str(obj == params ? "rope_parameters" : "rope_scaling", ".truncate"), "expected true or false");
        c.rope.truncate = t->get<bool>();
      }
    const auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
    const std::optional<double> attention = get("attention_factor"), mscale = get("mscale"),
                                mscale_all_dim = get("mscale_all_dim");
    c.rope.attention_factor = attention ? *attention
                              : mscale && mscale_all_dim
                                  ? get_mscale(c.rope.factor, *mscale) / get_mscale(c.rope.factor, *mscale_all_dim)
                                  : get_mscale(c.rope.factor, 1.0);
  } else if (type != "default") {
    r.bad(params ? "rope_parameters.rope_type" : "rope_scaling.rope_type",
          str("\"", type, "\" is not supported (autosp implements \"default\", \"linear\", \"llama3\" and \"yarn\")"));
  }
}

// The architecture config.json names (architectures[0], else its model_type; neither:
// Llama), checked against its model_type.
const Architecture& architecture_of(const Reader& r) {
  auto supported = [] {
    std::string names;
    for (const Architecture& a : kArchitectures) names += str(names.empty() ? "" : ", ", a.name);
    return names;
  };
  const std::string type = r.string("model_type");
  const Architecture* arch = nullptr;
  if (const json* list = r.find("architectures")) {
    if (!list->is_array() || list->empty() || !(*list)[0].is_string()) r.bad("architectures", "expected a list of names");
    const std::string name = (*list)[0].get<std::string>();
    for (const Architecture& a : kArchitectures)
      if (name == a.name) arch = &a;
    if (!arch) r.bad("architectures", str("\"", name, "\" is not supported (autosp trains ", supported(), ")"));
  } else if (!type.empty()) {
    for (const Architecture& a : kArchitectures)
      if (type == a.model_type) arch = &a;
    if (!arch) r.bad("model_type", str("\"", type, "\" is not supported (autosp trains ", supported(), ")"));
  } else {
    arch = &kArchitectures[0];
  }
  if (!type.empty() && type != arch->model_type)
    r.bad("model_type", str("\"", type, "\" does not match architectures \"", arch->name, "\" (expected \"",
                            arch->model_type, "\")"));
  return *arch;
}

// The sliding window as the architecture reads it (LlamaConfig::sliding_window).
int64_t parse_sliding_window(const Reader& r, const Architecture& arch, int64_t layers) {
  const std::string name = arch.name;
  if (name == "MistralForCausalLM") {
    // Every layer; null is none, and a config without the key gets MistralConfig's default.
    if (!r.j.contains("sliding_window")) return 4096;
    if (!r.find("sliding_window")) return 0;
    return r.positive_int("sliding_window");
  }
  if (name == "Qwen2ForCausalLM" || name == "Qwen3ForCausalLM") {
    // transformers windows the layers from max_window_layers on (its layer_types), and its
    // attention implementations have not always agreed on which (4.46's eager and sdpa
    // masks windowed every layer): autosp trains these models with full attention only.
    if (r.boolean("use_sliding_window", false))
      r.bad("use_sliding_window", str("true is not supported (autosp trains ", name,
                                      " with full attention in every layer: false; the window is ignored then)"));
    if (const json* types = r.find("layer_types")) {
      if (!types->is_array() || int64_t(types->size()) != layers)
        r.bad("layer_types", str("expected a list of num_hidden_layers = ", layers, " attention types"));
      for (size_t i = 0; i < types->size(); ++i)
        if ((*types)[i] != "full_attention")
          r.bad(str("layer_types[", i, "]"), str((*types)[i].dump(), " is not supported (autosp trains ", name,
                                                 " with \"full_attention\" in every layer)"));
    }
  }
  return 0;
}

}  // namespace

LlamaConfig parse_llama_config(const json& j, const std::string& source, std::vector<std::string>* warnings) {
  if (!j.is_object()) user_error(source, ": expected a JSON object");
  Reader r{j, source};
  const Architecture& arch = architecture_of(r);
  const std::string name = arch.name;
  // Llama's attention_bias puts a bias on all four projections, Qwen3's too; Qwen2's q, k and
  // v always have one (it reads no key for it) and Mistral's never do.
  if (arch.keys.count("attention_bias") && r.boolean("attention_bias", false))
    r.bad("attention_bias", str("true is not supported (", name, " without projection biases: false)"));
  if (arch.keys.count("mlp_bias") && r.boolean("mlp_bias", false)) r.bad("mlp_bias", "true is not supported");
  if (std::string act = r.string("hidden_act"); !act.empty() && act != "silu")
    r.bad("hidden_act", str("\"", act, "\" is not supported (expected \"silu\")"));
  if (const json* tp = arch.keys.count("pretraining_tp") ? r.find("pretraining_tp") : nullptr;
      tp && !(tp->is_number_integer() && tp->get<int64_t>() == 1))
    r.bad("pretraining_tp", "only 1 is supported");
  // transformers applies attention dropout in training mode; autosp has no dropout.
  if (const json* p = r.find("attention_dropout"); p && !(p->is_number() && p->get<double>() == 0))
    r.bad("attention_dropout", str(p->dump(), " is not supported (autosp trains without dropout: 0.0)"));
  if (r.find("quantization_config"))
    r.bad("quantization_config", "quantized models are not supported (autosp trains F32, BF16 or F16 weights)");

  LlamaConfig c;
  c.architecture = name;
  c.qkv_bias = name == "Qwen2ForCausalLM";
  c.qk_norm = name == "Qwen3ForCausalLM";
  c.vocab_size = r.positive_int("vocab_size");
  c.hidden_size = r.positive_int("hidden_size");
  c.intermediate_size = r.positive_int("intermediate_size");
  c.num_hidden_layers = r.positive_int("num_hidden_layers");
  c.num_attention_heads = r.positive_int("num_attention_heads");
  c.num_key_value_heads = r.positive_int("num_key_value_heads", c.num_attention_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    r.bad("num_key_value_heads", str(c.num_key_value_heads, " does not divide num_attention_heads = ",
                                     c.num_attention_heads));
  // Qwen3Config's head_dim defaults to 128; the others' to hidden_size / num_attention_heads.
  const bool qwen3 = name == "Qwen3ForCausalLM";
  if (!r.find("head_dim") && !qwen3 && c.hidden_size % c.num_attention_heads != 0)
    r.bad("hidden_size", str(c.hidden_size, " is not a multiple of num_attention_heads = ",
                             c.num_attention_heads, " (and no head_dim is given)"));
  // Any head_dim: the projections are [NH * D, H], as transformers makes them.
  c.head_dim = r.positive_int("head_dim", qwen3 ? 128 : c.hidden_size / c.num_attention_heads);
  if (c.head_dim % 2 != 0) r.bad("head_dim", str(c.head_dim, " must be even for rotary embeddings"));
  if (c.vocab_size > INT32_MAX) r.bad("vocab_size", "must fit in 32 bits");
  // Dimensions up to 2^24 keep every product below in range; real models are far smaller.
  for (const auto& [key, v] : {std::pair{"hidden_size", c.hidden_size}, {"intermediate_size", c.intermediate_size},
                               {"num_hidden_layers", c.num_hidden_layers}, {"num_attention_heads", c.num_attention_heads},
                               {"head_dim", c.head_dim}})
    if (v > (int64_t{1} << 24)) r.bad(key, str(v, " is larger than autosp supports (2^24)"));
  c.sliding_window = parse_sliding_window(r, arch, c.num_hidden_layers);
  c.rms_norm_eps = r.positive_number("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  c.max_position_embeddings = r.positive_int("max_position_embeddings", 2048);
  c.initializer_range = r.positive_number("initializer_range", 0.02);

  // The dtype the weights were saved in: transformers 5 writes "dtype", 4 "torch_dtype".
  const std::string torch_dtype = r.string("torch_dtype"), dtype = r.string("dtype");
  if (!torch_dtype.empty() && !dtype.empty() && torch_dtype != dtype)
    r.bad("dtype and torch_dtype", str("disagree (\"", dtype, "\" and \"", torch_dtype, "\")"));
  c.torch_dtype = dtype.empty() ? torch_dtype : dtype;
  if (!c.torch_dtype.empty() && c.torch_dtype != "float32" && c.torch_dtype != "bfloat16" &&
      c.torch_dtype != "float16" && c.torch_dtype != "float64")
    r.bad(dtype.empty() ? "torch_dtype" : "dtype",
          str("\"", c.torch_dtype, "\" is not a dtype autosp reads (float32, bfloat16, float16)"));

  c.hf_config_text = j.dump();

  std::vector<std::string> unknown;
  parse_rope(r, c, unknown);
  for (const auto& [key, v] : j.items())
    if (!kModelKeys.count(key) && !arch.keys.count(key) && !kInertKeys.count(key)) unknown.push_back(key);
  if (warnings && !unknown.empty()) {
    std::string list;
    for (const std::string& key : unknown) list += (list.empty() ? "" : ", ") + key;
    warnings->push_back(str(source, ": ignoring keys that autosp does not know (nor does transformers' ", name,
                            " read them): ", list));
  }
  return c;
}

LlamaConfig load_llama_config(const std::string& path, std::vector<std::string>* warnings) {
  std::ifstream in(path);
  if (!in) user_error(path, ": cannot open the model config (", std::strerror(errno), ")");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e999
    user_error(path, ": not valid JSON: ", e.what());
  }
  LlamaConfig c = parse_llama_config(j, path, warnings);
  c.source_dir = std::filesystem::path(path).parent_path().string();
  if (c.source_dir.empty()) c.source_dir = ".";
  return c;
}

namespace {

json integral_or_number(double v) {
  if (v == std::floor(v) && std::abs(v) < 9.0e15) return static_cast<int64_t>(v);
  return v;
}

}  // namespace

json llama_config_json(const LlamaConfig& c) {
  const Architecture* arch = nullptr;
  for (const Architecture& a : kArchitectures)
    if (c.architecture == a.name) arch = &a;
  AUTOSP_CHECK(arch, "no architecture ", c.architecture);
  json j = {
      {"architectures", {c.architecture}},
      {"model_type", arch->model_type},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"hidden_act", "silu"},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope.theta},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"max_position_embeddings", c.max_position_embeddings},
      {"initializer_range", c.initializer_range},
      {"torch_dtype", "float32"},
  };
  // Each architecture's own keys, as its transformers config class writes them.
  if (arch->keys.count("attention_bias")) j["attention_bias"] = false;
  if (arch->keys.count("mlp_bias")) j["mlp_bias"] = false;
  if (arch->keys.count("use_sliding_window")) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_hidden_layers;
  } else if (arch->keys.count("sliding_window")) {
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  }
  if (c.rope.rope_type == "llama3")
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope.factor},
                         {"low_freq_factor", c.rope.low_freq_factor},
                         {"high_freq_factor", c.rope.high_freq_factor},
                         // A count of positions: an integer, as transformers writes it (it
                         // warns about 8192.0).
                         {"original_max_position_embeddings", integral_or_number(c.rope.original_max_position_embeddings)}};
  else if (c.rope.rope_type == "linear")
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope.factor}};
  else if (c.rope.rope_type == "yarn")
    j["rope_scaling"] = {{"rope_type", "yarn"},
                         {"factor", c.rope.factor},
                         {"original_max_position_embeddings", integral_or_number(c.rope.original_max_position_embeddings)},
                         {"beta_fast", c.rope.beta_fast},
                         {"beta_slow", c.rope.beta_slow},
                         {"truncate", c.rope.truncate},
                         {"attention_factor", c.rope.attention_factor}};
  else
    j["rope_scaling"] = nullptr;
  return j;
}

std::vector<ParameterSpec> llama_parameters(const LlamaConfig& c) {
  const int64_t H = c.hidden_size, F = c.intermediate_size, D = c.head_dim;
  const int64_t NH = c.num_attention_heads, NKV = c.num_key_value_heads;
  std::vector<ParameterSpec> params = {{"model.embed_tokens.weight", {c.vocab_size, H}}};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = str("model.layers.", i, ".");
    params.push_back({p + "input_layernorm.weight", {H}});
    for (const auto& [name, heads] : {std::pair{"q_proj", NH}, {"k_proj", NKV}, {"v_proj", NKV}}) {
      params.push_back({str(p, "self_attn.", name, ".weight"), {heads * D, H}});
      if (c.qkv_bias) params.push_back({str(p, "self_attn.", name, ".bias"), {heads * D}});
    }
    params.push_back({p + "self_attn.o_proj.weight", {H, NH * D}});
    if (c.qk_norm) {
      params.push_back({p + "self_attn.q_norm.weight", {D}});
      params.push_back({p + "self_attn.k_norm.weight", {D}});
    }
    params.push_back({p + "post_attention_layernorm.weight", {H}});
    params.push_back({p + "mlp.gate_proj.weight", {F, H}});
    params.push_back({p + "mlp.up_proj.weight", {F, H}});
    params.push_back({p + "mlp.down_proj.weight", {H, F}});
  }
  params.push_back({"model.norm.weight", {H}});
  if (!c.tie_word_embeddings) params.push_back({"lm_head.weight", {c.vocab_size, H}});
  return params;
}

std::vector<size_t> llama_state_dict_order(const LlamaConfig& c) {
  // A decoder layer registers self_attn (q, k, v, o projections, each weight then bias, then
  // q_norm, k_norm), mlp (gate, up, down), then its two norms; llama_parameters puts the
  // norms first and second to last.
  static const std::vector<std::string> kLayerOrder = {
      "self_attn.q_proj.weight", "self_attn.q_proj.bias",  "self_attn.k_proj.weight", "self_attn.k_proj.bias",
      "self_attn.v_proj.weight", "self_attn.v_proj.bias",  "self_attn.o_proj.weight", "self_attn.q_norm.weight",
      "self_attn.k_norm.weight", "mlp.gate_proj.weight",   "mlp.up_proj.weight",      "mlp.down_proj.weight",
      "input_layernorm.weight",  "post_attention_layernorm.weight"};
  const std::string kLayers = "model.layers.";
  auto position = [&](const std::string& name) {
    const size_t dot = name.find('.', kLayers.size());
    const auto it = std::find(kLayerOrder.begin(), kLayerOrder.end(), name.substr(dot + 1));
    AUTOSP_CHECK(it != kLayerOrder.end(), "llama_state_dict_order does not know ", name);
    return it - kLayerOrder.begin();
  };
  const std::vector<ParameterSpec> params = llama_parameters(c);
  std::vector<size_t> order(params.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Each layer's run of tensors (they are consecutive) sorted by kLayerOrder; embed_tokens
  // first, norm and lm_head last, stay where they are.
  for (size_t begin = 1; begin < params.size() && params[begin].name.starts_with(kLayers);) {
    const std::string layer = params[begin].name.substr(0, params[begin].name.find('.', kLayers.size()) + 1);
    size_t end = begin;
    while (end < params.size() && params[end].name.starts_with(layer)) ++end;
    std::stable_sort(order.begin() + long(begin), order.begin() + long(end),
                     [&](size_t a, size_t b) { return position(params[a].name) < position(params[b].name); });
    begin = end;
  }
  return order;
}

int64_t llama_num_parameters(const LlamaConfig& c) {
  int64_t n = 0;
  for (const ParameterSpec& p : llama_parameters(c)) {
    int64_t count = 1;
    for (int64_t d : p.shape)
      if (__builtin_mul_overflow(count, d, &count)) user_error("model: ", p.name, " has too many elements");
    if (__builtin_add_overflow(n, count, &n)) user_error("model: the parameter count overflows 64 bits");
  }
  return n;
}

std::vector<float> llama_init(const LlamaConfig& c, const ParameterSpec& param, uint64_t seed) {
  std::vector<float> values(numel(param.shape));
  if (param.name.ends_with(".bias")) return values;  // zeros
  if (param.shape.size() == 1) {                      // norm weights
    std::fill(values.begin(), values.end(), 1.0f);
    return values;
  }
  uint64_t name_hash = 1469598103934665603ull;  // FNV-1a: the same on every platform
  for (unsigned char ch : param.name) name_hash = (name_hash ^ ch) * 1099511628211ull;
  std::seed_seq seq{uint32_t(seed), uint32_t(seed >> 32), uint32_t(name_hash), uint32_t(name_hash >> 32)};
  std::mt19937_64 rng(seq);
  std::normal_distribution<double> normal(0.0, c.initializer_range);
  for (float& v : values) v = float(normal(rng));
  return values;
}

Graph llama_forward(const LlamaConfig& c, const LlamaTraceOptions& o) {
  const int64_t B = o.batch, S = o.seq_len, D = c.head_dim;
  const int64_t NH = c.num_attention_heads, NKV = c.num_key_value_heads;
  if (B <= 0 || S <= 0) user_error("batch and sequence length must be positive, got B=", B, " S=", S);
  if (!is_floating(o.dtype))
    user_error("model dtype must be f32 or bf16, got ", dtype_name(o.dtype));
  const int64_t widest = std::max({c.vocab_size, c.hidden_size, c.intermediate_size, NH * D});
  int64_t bytes = 0;
  if (__builtin_mul_overflow(B, S, &bytes) || __builtin_mul_overflow(bytes, 4 * widest, &bytes))
    user_error("micro batch ", B, " x sequence length ", S, " is too large to address");
  Tracer t;
  Tensor input_ids = t.input(Role::tokens, "input_ids", DType::i32, {B, S});
  Tensor position_ids = t.input(Role::positions, "position_ids", DType::i32, {B, S});
  std::optional<Tensor> document_ids;
  if (o.documents) document_ids = t.input(Role::documents, "document_ids", DType::i32, {B, S});
  std::map<std::string, Tensor> w;
  for (const ParameterSpec& p : llama_parameters(c)) w[p.name] = t.parameter(p.name, p.shape, o.dtype);

  // yarn's attention factor scales cos and sin, so both q and k: their product by its square.
  const double eps = c.rms_norm_eps,
               scale = c.rope.attention_factor * c.rope.attention_factor / std::sqrt(double(D));
  Tensor x = t.embedding(w["model.embed_tokens.weight"], input_ids);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = str("model.layers.", i, ".");
    Tensor h = t.rms_norm(x, w[p + "input_layernorm.weight"], eps);
    auto project = [&](const char* name, int64_t heads) {
      const std::string proj = str(p, "self_attn.", name);
      Tensor y = c.qkv_bias ? t.linear(h, w[proj + ".weight"], w[proj + ".bias"]) : t.linear(h, w[proj + ".weight"]);
      return t.reshape(y, {B, S, heads, D});
    };
    Tensor q = project("q_proj", NH), k = project("k_proj", NKV), v = project("v_proj", NKV);
    if (c.qk_norm) {  // over each head's D features, before rope
      q = t.rms_norm(q, w[p + "self_attn.q_norm.weight"], eps);
      k = t.rms_norm(k, w[p + "self_attn.k_norm.weight"], eps);
    }
    q = t.rope(q, position_ids, c.rope);
    k = t.rope(k, position_ids, c.rope);
    Tensor attn = document_ids ? t.attention(q, k, v, *document_ids, /*causal=*/true, scale, c.sliding_window)
                               : t.attention(q, k, v, /*causal=*/true, scale, c.sliding_window);
    Tensor a = t.reshape(attn, {B, S, NH * D});
    x = t.add(x, t.linear(a, w[p + "self_attn.o_proj.weight"]));

    h = t.rms_norm(x, w[p + "post_attention_layernorm.weight"], eps);
    Tensor gate = t.linear(h, w[p + "mlp.gate_proj.weight"]);
    Tensor up = t.linear(h, w[p + "mlp.up_proj.weight"]);
    x = t.add(x, t.linear(t.swiglu(gate, up), w[p + "mlp.down_proj.weight"]));
  }
  x = t.rms_norm(x, w["model.norm.weight"], eps);
  Tensor head = w[c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"];
  auto labels = [&] { return t.input(Role::labels, "labels", DType::i32, {B, S}); };
  if (o.output_logits) {
    Tensor logits = t.linear(x, head);
    if (o.output_loss) t.output("loss", t.cross_entropy(logits, labels()));
    t.output("logits", logits);
  } else if (o.output_loss) {
    // Training: the fused head + loss never holds the [B, S, V] logits.
    t.output("loss", t.linear_cross_entropy(x, head, labels()));
  }
  return t.finish();
}

}  // namespace autosp::models
