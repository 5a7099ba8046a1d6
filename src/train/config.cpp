#include "train/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>

#include "models/llama.h"
#include "passes/checkpoint.h"
#include "util/error.h"

namespace autosp::train {

namespace {

using nlohmann::json;

// Where we are in the file: the source name, the key path, and the warnings sink.
struct Ctx {
  const std::string& source;
  std::vector<std::string>* warnings;
};

std::string child(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : str(path, ".", key);
}

// The offending value as JSON, shortened so a huge array does not flood the message.
std::string shown(const json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

[[noreturn]] void bad_value(const Ctx& ctx, const std::string& path, std::string_view expected,
                            const json& got) {
  if (got == "auto")
    user_error(ctx.source, ": ", path, ": expected ", expected, ", got \"auto\" (Hugging Face's Trainer fills this "
               "key in from its own arguments, which autosp does not have: give a value)");
  user_error(ctx.source, ": ", path, ": expected ", expected, ", got ", shown(got));
}

void warn(const Ctx& ctx, const std::string& path, std::string_view what) {
  if (ctx.warnings) ctx.warnings->push_back(str(ctx.source, ": ", path, ": ", what));
}

const json& object_at(const Ctx& ctx, const json& value, const std::string& path) {
  if (!value.is_object()) bad_value(ctx, path, "an object", value);
  return value;
}

// Damerau-Levenshtein distance (the optimal-string-alignment form: insertions, deletions,
// substitutions and transpositions of adjacent characters, each 1), case-insensitive.
size_t edit_distance(std::string_view a, std::string_view b) {
  auto low = [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); };
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = low(a[i - 1]) == low(b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && low(a[i - 1]) == low(b[j - 2]) && low(a[i - 2]) == low(b[j - 1]))
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

// The known key `key` is most likely a misspelling of: within 2 edits (1 for keys of up to 4
// characters, where 2 edits reach unrelated words: "aio" is 2 from "amp"), or "" if none is.
std::string_view misspelt_key(std::string_view key, const std::vector<std::string_view>& known) {
  const size_t limit = key.size() <= 4 ? 1 : 2;
  std::string_view best;
  size_t best_distance = limit + 1;
  for (std::string_view k : known)
    if (const size_t d = edit_distance(key, k); d < best_distance) {
      best = k;
      best_distance = d;
    }
  return best;
}

// Warns about every key of `object` not in `known`. A key a small edit away from a known one
// is an error instead: `gradient_acumulation_steps` would otherwise train, with a warning
// easily missed, at the default accumulation.
void warn_unknown(const Ctx& ctx, const json& object, const std::string& path,
                  const std::vector<std::string_view>& known, std::string_view why = "") {
  for (const auto& [key, value] : object.items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    if (const std::string_view near = misspelt_key(key, known); !near.empty())
      user_error(ctx.source, ": ", child(path, key), ": unknown key; did you mean \"", near, "\"?");
    warn(ctx, child(path, key), why.empty() ? "unknown key, ignored" : why);
  }
}

int64_t int_at(const Ctx& ctx, const json& value, const std::string& path, int64_t min) {
  const std::string expected = str("an integer >= ", min);
  if (!value.is_number_integer()) bad_value(ctx, path, expected, value);
  if (value.is_number_unsigned() &&
      value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    bad_value(ctx, path, expected, value);
  const int64_t v = value.get<int64_t>();
  if (v < min) bad_value(ctx, path, expected, value);
  return v;
}

double number_at(const Ctx& ctx, const json& value, const std::string& path, double min) {
  const std::string expected = str("a number >= ", min);
  if (!value.is_number()) bad_value(ctx, path, expected, value);
  const double v = value.get<double>();
  if (!(v >= min)) bad_value(ctx, path, expected, value);
  return v;
}

bool bool_at(const Ctx& ctx, const json& value, const std::string& path) {
  if (!value.is_boolean()) bad_value(ctx, path, "true or false", value);
  return value.get<bool>();
}

std::string string_at(const Ctx& ctx, const json& value, const std::string& path) {
  if (!value.is_string()) bad_value(ctx, path, "a string", value);
  return value.get<std::string>();
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// DeepSpeed's engine (_configure_basic_optimizer) for "Adam" and "AdamW": torch_adam only
// picks the implementation (torch.optim or DeepSpeed's fused kernels, the same maths), and
// the update is AdamW's when type is AdamW or adam_w_mode (default true) is set, otherwise
// torch.optim.Adam's with L2 weight decay.
// `defaults` receives the params left to their defaults (for describe_optimizer).
AdamWParams parse_optimizer(const Ctx& ctx, const json& section, std::vector<std::string>& defaults) {
  const std::string path = "optimizer";
  object_at(ctx, section, path);
  warn_unknown(ctx, section, path, {"type", "params"});
  if (!section.contains("type")) user_error(ctx.source, ": optimizer.type: missing (use \"AdamW\")");
  const std::string type = string_at(ctx, section["type"], "optimizer.type");
  // DeepSpeed lower-cases known optimizer names, so "adamw" and "ADAMW" mean AdamW.
  if (lower(type) != "adamw" && lower(type) != "adam")
    user_error(ctx.source, ": optimizer.type: \"", type, "\" is not supported; autosp implements \"AdamW\" and \"Adam\"");
  const bool is_adamw = lower(type) == "adamw";
  AdamWParams p;
  bool adam_w_mode = true;  // DeepSpeed's ADAM_W_MODE_DEFAULT
  bool weight_decay_given = false;
  if (section.contains("params")) {
    const std::string ppath = "optimizer.params";
    const json& params = object_at(ctx, section["params"], ppath);
    warn_unknown(ctx, params, ppath,
                 {"lr", "betas", "eps", "weight_decay", "torch_adam", "adam_w_mode", "amsgrad", "bias_correction",
                  "max_grad_norm"});
    // Ranges are torch.optim.AdamW's argument checks.
    if (params.contains("lr")) p.lr = number_at(ctx, params["lr"], child(ppath, "lr"), 0.0);
    if (params.contains("betas")) {
      const std::string bpath = child(ppath, "betas");
      const json& betas = params["betas"];
      if (!betas.is_array() || betas.size() != 2 || !betas[0].is_number() ||
          !betas[1].is_number())
        bad_value(ctx, bpath, "an array of 2 numbers", betas);
      for (int i = 0; i < 2; ++i) {
        const double b = betas[i].get<double>();
        if (!(b >= 0.0 && b < 1.0)) bad_value(ctx, str(bpath, "[", i, "]"), "a number in [0, 1)", betas[i]);
      }
      p.beta1 = betas[0].get<double>();
      p.beta2 = betas[1].get<double>();
    }
    if (params.contains("eps")) p.eps = number_at(ctx, params["eps"], child(ppath, "eps"), 0.0);
    if (params.contains("weight_decay")) {
      p.weight_decay = number_at(ctx, params["weight_decay"], child(ppath, "weight_decay"), 0.0);
      weight_decay_given = true;
    }
    // Only chooses torch.optim over DeepSpeed's fused kernels: the same update.
    if (params.contains("torch_adam")) bool_at(ctx, params["torch_adam"], child(ppath, "torch_adam"));
    if (params.contains("adam_w_mode")) {
      adam_w_mode = bool_at(ctx, params["adam_w_mode"], child(ppath, "adam_w_mode"));
      if (is_adamw && !adam_w_mode)
        warn(ctx, child(ppath, "adam_w_mode"),
             str("false has no effect with optimizer.type \"", type, "\": DeepSpeed applies AdamW's decoupled "
                 "weight decay for AdamW whatever adam_w_mode says (for torch.optim.Adam's L2 weight decay use "
                 "type \"Adam\" with adam_w_mode false)"));
    }
    if (params.contains("amsgrad") && bool_at(ctx, params["amsgrad"], child(ppath, "amsgrad")))
      user_error(ctx.source, ": ", child(ppath, "amsgrad"), ": true is not supported; autosp implements Adam and "
                 "AdamW without AMSGrad (as DeepSpeed's fused Adam, which refuses it too)");
    if (params.contains("bias_correction") && !bool_at(ctx, params["bias_correction"], child(ppath, "bias_correction")))
      user_error(ctx.source, ": ", child(ppath, "bias_correction"), ": false is not supported; autosp's Adam and "
                 "AdamW always apply bias correction (as torch.optim does)");
    // DeepSpeed refuses it the same way.
    if (params.contains("max_grad_norm"))
      user_error(ctx.source, ": ", child(ppath, "max_grad_norm"), ": not an optimizer parameter; clip with the "
                 "top-level \"gradient_clipping\" instead");
  }
  for (const char* key : {"lr", "betas", "eps", "weight_decay"})
    if (!section.contains("params") || !section["params"].contains(key)) defaults.push_back(key);
  p.decoupled_weight_decay = is_adamw || adam_w_mode;
  // The default is that of the torch class with the same update (torch.optim.Adam: 0;
  // torch.optim.AdamW: 0.01, kept in AdamWParams).
  if (!p.decoupled_weight_decay && !weight_decay_given) p.weight_decay = 0.0;
  return p;
}

// `defaults` receives the params of its type left to their defaults (for describe_scheduler).
SchedulerConfig parse_scheduler(const Ctx& ctx, const json& section, std::vector<std::string>& defaults) {
  const std::string path = "scheduler";
  object_at(ctx, section, path);
  warn_unknown(ctx, section, path, {"type", "params"});
  if (!section.contains("type"))
    user_error(ctx.source, ": scheduler.type: missing (WarmupLR, WarmupDecayLR or WarmupCosineLR)");
  const std::string type = string_at(ctx, section["type"], "scheduler.type");
  SchedulerConfig c;
  // Case-sensitive, as DeepSpeed looks the class up by name.
  if (type == "WarmupLR") {
    c.type = SchedulerType::kWarmupLR;
  } else if (type == "WarmupDecayLR") {
    c.type = SchedulerType::kWarmupDecayLR;
  } else if (type == "WarmupCosineLR") {
    c.type = SchedulerType::kWarmupCosineLR;
  } else {
    user_error(ctx.source, ": scheduler.type: \"", type,
               "\" is not supported; expected WarmupLR, WarmupDecayLR or WarmupCosineLR");
  }

  json empty = json::object();
  const std::string ppath = "scheduler.params";
  const json& params = section.contains("params") ? object_at(ctx, section["params"], ppath) : empty;
  const std::string not_a_param = str("not a parameter of ", type, ", ignored");
  switch (c.type) {
    case SchedulerType::kWarmupLR:
      warn_unknown(ctx, params, ppath,
                   {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"},
                   not_a_param);
      break;
    case SchedulerType::kWarmupDecayLR:
      warn_unknown(ctx, params, ppath,
                   {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                    "total_num_steps"},
                   not_a_param);
      break;
    case SchedulerType::kWarmupCosineLR:
      warn_unknown(ctx, params, ppath,
                   {"warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type",
                    "total_num_steps"},
                   not_a_param);
      break;
    case SchedulerType::kNone: internal_error("parse_scheduler: no type");
  }

  auto has = [&](const char* key) { return params.contains(key); };
  auto at = [&](const char* key) { return child(ppath, key); };
  const std::vector<const char*> own =
      c.type == SchedulerType::kWarmupCosineLR
          ? std::vector<const char*>{"warmup_min_ratio", "warmup_num_steps", "warmup_type", "cos_min_ratio"}
          : std::vector<const char*>{"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"};
  for (const char* key : own)
    if (!has(key)) defaults.push_back(key);
  if (c.type != SchedulerType::kWarmupCosineLR) {
    if (has("warmup_min_lr"))
      c.warmup_min_lr = number_at(ctx, params["warmup_min_lr"], at("warmup_min_lr"), 0.0);
    if (has("warmup_max_lr"))
      c.warmup_max_lr = number_at(ctx, params["warmup_max_lr"], at("warmup_max_lr"), 0.0);
  } else {
    if (has("warmup_min_ratio"))
      c.warmup_min_ratio = number_at(ctx, params["warmup_min_ratio"], at("warmup_min_ratio"), 0.0);
    if (has("cos_min_ratio"))
      c.cos_min_ratio = number_at(ctx, params["cos_min_ratio"], at("cos_min_ratio"), 0.0);
  }
  // DeepSpeed: "warmup_num_steps must be a positive integer".
  if (has("warmup_num_steps"))
    c.warmup_num_steps = int_at(ctx, params["warmup_num_steps"], at("warmup_num_steps"), 1);
  if (has("warmup_type")) {
    // DeepSpeed falls back to "log" with a logged warning; a typo here silently changes the
    // warmup curve, so autosp refuses it.
    const json& v = params["warmup_type"];
    if (v == "log") {
      c.warmup_type = WarmupType::kLog;
    } else if (v == "linear") {
      c.warmup_type = WarmupType::kLinear;
    } else {
      bad_value(ctx, at("warmup_type"), "\"log\" or \"linear\"", v);
    }
  }
  if (c.type != SchedulerType::kWarmupLR) {
    if (!has("total_num_steps"))
      user_error(ctx.source, ": ", at("total_num_steps"), ": missing (", type, " requires it)");
    c.total_num_steps = int_at(ctx, params["total_num_steps"], at("total_num_steps"), 1);
    const int64_t warmup = std::max<int64_t>(2, c.warmup_num_steps);
    if (c.total_num_steps < warmup)
      warn(ctx, at("total_num_steps"),
           str(c.total_num_steps, " is less than warmup_num_steps ", warmup));
  }
  return c;
}

CompileConfig parse_compile(const Ctx& ctx, const json& section) {
  const std::string path = "compile";
  object_at(ctx, section, path);
  warn_unknown(ctx, section, path, {"deepcompile", "passes", "checkpoint", "memory_budget_gb", "tile_rows", "overlap"});
  CompileConfig c;
  if (section.contains("checkpoint")) {
    const std::string policy = string_at(ctx, section["checkpoint"], "compile.checkpoint");
    if (policy != "auto") parse_checkpoint_policy(policy, str(ctx.source, ": compile.checkpoint"));
    c.checkpoint = policy;
  }
  if (section.contains("memory_budget_gb")) {
    c.memory_budget_gb = number_at(ctx, section["memory_budget_gb"], "compile.memory_budget_gb", 0.0);
    if (!(*c.memory_budget_gb > 0)) bad_value(ctx, "compile.memory_budget_gb", "a number > 0", section["memory_budget_gb"]);
  }
  if (c.checkpoint == "auto" && !c.memory_budget_gb)
    user_error(ctx.source, ": compile.checkpoint: \"auto\" picks the cheapest plan that fits compile.memory_budget_gb, "
               "which is missing");
  if (section.contains("tile_rows")) c.tile_rows = int_at(ctx, section["tile_rows"], "compile.tile_rows", 0);
  if (section.contains("overlap")) c.overlap = bool_at(ctx, section["overlap"], "compile.overlap");
  if (section.contains("deepcompile"))
    c.deepcompile = bool_at(ctx, section["deepcompile"], "compile.deepcompile");
  if (section.contains("passes")) {
    const json& passes = section["passes"];
    if (!passes.is_array()) bad_value(ctx, "compile.passes", "an array of pass names", passes);
    for (size_t i = 0; i < passes.size(); ++i) {
      const std::string at = str("compile.passes[", i, "]");
      // DeepSpeed's CompileConfig.passes is a list of Literal["z1", "z3", "autosp"].
      const json& v = passes[i];
      if (v != "z1" && v != "z3" && v != "autosp") bad_value(ctx, at, "\"z1\", \"z3\" or \"autosp\"", v);
      c.passes.push_back(v.get<std::string>());
    }
  }
  return c;
}

// An element count >= min, or "auto" (recorded in zero.auto_keys) where `auto_ok`.
int64_t zero_size_at(const Ctx& ctx, const json& section, const char* key, int64_t fallback, int64_t min,
                     bool auto_ok, ZeroConfig& z) {
  if (!section.contains(key)) return fallback;
  const json& v = section[key];
  const std::string path = child("zero_optimization", key);
  if (auto_ok && v == "auto") {
    z.auto_keys.push_back(key);
    return fallback;
  }
  // DeepSpeed configs write sizes as 5e8: a float with an integral value is an integer here.
  if (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()) && v.get<double>() >= double(min) &&
      v.get<double>() < 9.2e18)
    return static_cast<int64_t>(v.get<double>());
  return int_at(ctx, v, path, min);
}

// offload_optimizer / offload_param: the CPU backend keeps everything in host memory already.
void check_offload(const Ctx& ctx, const json& section, const char* key) {
  const std::string path = child("zero_optimization", key);
  const json& s = object_at(ctx, section[key], path);
  warn_unknown(ctx, s, path, {"device", "pin_memory", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu",
                              "fast_init", "ratio", "pipeline_read", "pipeline_write", "pipeline"});
  if (!s.contains("device")) return;
  const std::string device = lower(string_at(ctx, s["device"], child(path, "device")));
  if (device == "none") return;
  if (device == "cpu" || device == "nvme")
    user_error(ctx.source, ": ", child(path, "device"), ": \"", s["device"].get<std::string>(),
               "\" is not supported on the CPU backend: parameters, gradients and optimizer state already live in "
               "host memory, so there is nothing to offload ",
               device == "nvme" ? "(and autosp has no NVMe offload)" : "to", "; remove ", path,
               " or set its device to \"none\"");
  bad_value(ctx, child(path, "device"), "\"none\", \"cpu\" or \"nvme\"", s["device"]);
}

ZeroConfig parse_zero(const Ctx& ctx, const json& section) {
  ZeroConfig z;
  if (section.is_boolean()) {
    // DeepSpeed's deprecated form: true means stage 1.
    warn(ctx, "zero_optimization", "boolean form is deprecated, use {\"stage\": N}");
    z.stage = section.get<bool>() ? 1 : 0;
    return z;
  }
  const std::string path = "zero_optimization";
  if (!section.is_object()) bad_value(ctx, path, "an object", section);
  warn_unknown(ctx, section, path,
               {"stage", "reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size",
                "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
                "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
                "overlap_comm", "contiguous_gradients", "reduce_scatter", "allgather_partitions",
                "round_robin_gradients", "sub_group_size", "elastic_checkpoint", "load_from_fp32_weights",
                "ignore_unused_parameters", "offload_optimizer", "offload_param", "cpu_offload",
                "zero_quantized_weights", "zero_quantized_gradients", "zero_hpz_partition_size"});
  if (section.contains("stage")) {
    const json& v = section["stage"];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 3 ||
        (v.is_number_unsigned() && v.get<uint64_t>() > 3))
      bad_value(ctx, "zero_optimization.stage", "0, 1, 2 or 3", v);
    z.stage = static_cast<int>(v.get<int64_t>());
  }
  // DeepSpeed's defaults (deepspeed/runtime/zero/config.py).
  z.reduce_bucket_size = zero_size_at(ctx, section, "reduce_bucket_size", 500000000, 1, true, z);
  z.allgather_bucket_size = zero_size_at(ctx, section, "allgather_bucket_size", 500000000, 1, false, z);
  z.stage3_prefetch_bucket_size = zero_size_at(ctx, section, "stage3_prefetch_bucket_size", 50000000, 0, true, z);
  z.stage3_param_persistence_threshold =
      zero_size_at(ctx, section, "stage3_param_persistence_threshold", 100000, 0, true, z);
  for (const char* key : {"stage3_max_live_parameters", "stage3_max_reuse_distance", "sub_group_size"})
    zero_size_at(ctx, section, key, 0, 0, false, z);
  if (z.stage == 3) {
    // autosp's stage 3 partitions every parameter and keeps gathered only what its layer
    // schedule needs; these DeepSpeed knobs have no counterpart, so a given value is named.
    if (section.contains("stage3_param_persistence_threshold") && z.stage3_param_persistence_threshold > 0)
      warn(ctx, "zero_optimization.stage3_param_persistence_threshold",
           "ignored: autosp's stage 3 shards every parameter (as with threshold 0), small ones included; they are "
           "gathered with their layer");
    for (const char* key : {"stage3_max_live_parameters", "stage3_max_reuse_distance"})
      if (section.contains(key))
        warn(ctx, child(path, key),
             "ignored: autosp's stage 3 gathers each layer's parameters before its first use (prefetching one layer "
             "ahead within stage3_prefetch_bucket_size) and frees them after its last use, in forward and again in "
             "backward");
  }
  if (section.contains("zero_hpz_partition_size") &&
      zero_size_at(ctx, section, "zero_hpz_partition_size", 1, 1, false, z) != 1)
    user_error(ctx.source, ": zero_optimization.zero_hpz_partition_size: ZeRO++'s hierarchical partitioning is "
               "not implemented; autosp partitions over the whole data x sequence world (use 1)");
  auto flag = [&](const char* key, bool fallback) {
    return section.contains(key) ? bool_at(ctx, section[key], child(path, key)) : fallback;
  };
  z.overlap_comm = flag("overlap_comm", false);
  z.contiguous_gradients = flag("contiguous_gradients", true);
  if (z.overlap_comm && z.stage >= 2)
    warn(ctx, "zero_optimization.overlap_comm",
         "true: the grad_sync pass issues each bucket's reduce-scatter as soon as its gradients are final, but the "
         "CPU executor runs one node at a time, so on this backend communication does not overlap backward");
  if (!z.contiguous_gradients)
    warn(ctx, "zero_optimization.contiguous_gradients",
         "false has no effect: autosp plans every buffer in one arena, and stage 2 copies each bucket's gradients "
         "into one contiguous buffer to reduce it");
  for (const char* key : {"reduce_scatter", "allgather_partitions", "round_robin_gradients", "elastic_checkpoint",
                          "load_from_fp32_weights", "ignore_unused_parameters",
                          "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
                          "cpu_offload"})
    if (section.contains(key)) flag(key, false);
  if (flag("cpu_offload", false))
    user_error(ctx.source, ": zero_optimization.cpu_offload: true is not supported on the CPU backend: the "
               "optimizer state already lives in host memory, so there is nothing to offload to");
  for (const char* key : {"offload_optimizer", "offload_param"})
    if (section.contains(key)) check_offload(ctx, section, key);
  for (const char* key : {"zero_quantized_weights", "zero_quantized_gradients"})
    if (flag(key, false))
      user_error(ctx.source, ": ", child(path, key), ": true is not supported: ZeRO++ quantizes what it "
                 "communicates, which changes the numbers; autosp communicates in fp32");
  return z;
}

DataConfig parse_data(const Ctx& ctx, const json& section) {
  const std::string path = "data";
  object_at(ctx, section, path);
  warn_unknown(ctx, section, path, {"pack", "eos_token_id", "shuffle", "seed"});
  DataConfig d;
  if (section.contains("pack")) d.pack = bool_at(ctx, section["pack"], "data.pack");
  if (section.contains("shuffle")) d.shuffle = bool_at(ctx, section["shuffle"], "data.shuffle");
  if (section.contains("seed")) d.seed = static_cast<uint64_t>(int_at(ctx, section["seed"], "data.seed", 0));
  if (section.contains("eos_token_id")) {
    // A token id: the model's ids are int32 (and the vocabulary is checked when the data is opened).
    const int64_t eos = int_at(ctx, section["eos_token_id"], "data.eos_token_id", 0);
    if (eos > std::numeric_limits<int32_t>::max())
      bad_value(ctx, "data.eos_token_id", "an integer in [0, 2^31)", section["eos_token_id"]);
    d.eos_token_id = eos;
  }
  return d;
}

// `section.enabled` as a bool, false when absent (DeepSpeed's default for every section that
// has the key). `section` must be an object.
bool enabled_at(const Ctx& ctx, const json& section, const std::string& path) {
  object_at(ctx, section, path);
  return section.contains("enabled") && bool_at(ctx, section["enabled"], child(path, "enabled"));
}

// The path of the first "enabled": true in `value` or any object inside it, or "": some
// DeepSpeed features switch on by a sub-section alone (data_efficiency.data_sampling.enabled).
std::string first_enabled(const Ctx& ctx, const json& value, const std::string& path) {
  if (!value.is_object()) return "";
  if (value.contains("enabled") && bool_at(ctx, value["enabled"], child(path, "enabled"))) return child(path, "enabled");
  for (const auto& [key, inner] : value.items()) {
    if (key == "enabled") continue;
    const std::string found = first_enabled(ctx, inner, child(path, key));
    if (!found.empty()) return found;
  }
  return "";
}

// DeepSpeed's mixed-precision sections. autosp runs bf16 on the cuda backend (the bf16
// section) and fp32 otherwise; what runs depends on --backend, which the config does not
// know, so the parse records what was asked (and where) and precision_warning says what runs.
// The sections' other keys (which only steer the mixed-precision machinery, loss scaling above
// all) are accepted as part of them.
struct PrecisionSection {
  const char* key;
  const char* precision;  // TrainConfig::requested_precision when enabled
  std::vector<std::string_view> keys;  // DeepSpeed's documented keys; empty: any
};

const std::vector<PrecisionSection> kPrecisionSections = {
    {"bf16", "bf16",
     {"enabled", "immediate_grad_update", "check_grad_overflow", "check_overflow", "bf16_master_weights_and_grads",
      "bf16_optimizer_states"}},
    {"bfloat16", "bf16",  // DeepSpeed's older name for bf16
     {"enabled", "immediate_grad_update", "check_grad_overflow", "check_overflow", "bf16_master_weights_and_grads",
      "bf16_optimizer_states"}},
    {"fp16", "fp16",
     {"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
      "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads"}},
    {"amp", "amp", {}},  // every other key is passed to apex's amp.initialize
    {"torch_autocast", "torch_autocast", {"enabled", "dtype", "lower_precision_safe_modules"}},
};

std::pair<std::string, std::string> parse_precision(const Ctx& ctx, const json& config) {
  std::string requested = "fp32", requested_by;
  for (const PrecisionSection& p : kPrecisionSections) {
    if (!config.contains(p.key)) continue;
    const json& section = config[p.key];
    const bool enabled = enabled_at(ctx, section, p.key);
    if (!p.keys.empty()) warn_unknown(ctx, section, p.key, p.keys);
    if (!enabled) continue;
    const std::string path = child(p.key, "enabled");
    if (!requested_by.empty())
      user_error(ctx.source, ": ", requested_by, " and ", path, " are both true; DeepSpeed runs one mixed-precision "
                 "mode at a time: enable at most one");
    requested = p.precision;
    requested_by = path;
  }
  return {requested, requested_by};
}

}  // namespace

std::optional<std::string> precision_warning(const TrainConfig& config, const std::string& source) {
  if (config.requested_precision == "fp32") return std::nullopt;
  if (config.requested_precision == "bf16" && config.backend == "cuda") return std::nullopt;
  const std::string fp32 =
      "this run is fp32 throughout (fp32 compute, fp32 master weights, gradients and optimizer state), so its "
      "numbers are those of an fp32 run";
  const std::string no_scaling = config.requested_precision == "bf16" ? "" : ", without loss scaling (fp32 needs none)";
  if (config.backend == "cuda")
    return str(source, ": ", config.precision_key, ": true, but the cuda backend's mixed precision is bf16 (the bf16 "
               "section): ", fp32, no_scaling);
  return str(source, ": ", config.precision_key, ": true, but the cpu backend runs fp32 (its kernels are fp32 only; "
             "--backend cuda runs bf16): ", fp32, no_scaling);
}

namespace {

// communication_data_type and its kin: fp32 (or null, DeepSpeed's "decide from the rest")
// is what autosp does; a 16-bit type would round what is communicated, so it is refused.
void require_fp32_dtype(const Ctx& ctx, const json& value, const std::string& path, std::string_view what) {
  if (value.is_null()) return;
  if (!value.is_string()) bad_value(ctx, path, "\"fp32\", \"fp16\" or \"bf16\"", value);
  const std::string type = lower(value.get<std::string>());
  if (type == "fp32") return;
  if (type == "fp16" || type == "bf16")
    user_error(ctx.source, ": ", path, ": \"", value.get<std::string>(), "\" is not supported: autosp ", what,
               " in fp32 (", type, " would round them and change the numbers)");
  bad_value(ctx, path, "\"fp32\", \"fp16\" or \"bf16\"", value);
}

// DeepSpeed features that change what is computed; autosp implements none of them, so a
// config that turns one on is refused rather than trained on different maths.
struct RefusedFeature {
  const char* key;
  bool on_when_present;  // true: the section's presence turns it on (it has no "enabled")
  const char* why;
};

const RefusedFeature kRefusedFeatures[] = {
    {"sparse_attention", true,
     "DeepSpeed's block-sparse attention changes which tokens attend to which; autosp computes dense causal "
     "attention"},
    {"progressive_layer_drop", false, "progressive layer drop skips transformer layers at random during training"},
    {"curriculum_learning", false,
     "curriculum learning shortens or reorders the training samples; autosp trains on every sample as given"},
    {"data_efficiency", false,
     "data efficiency (curriculum data sampling, random layerwise token dropping) changes which data and tokens "
     "a step trains on"},
    {"quantize_training", false, "quantize_training (MoQ) quantizes the weights during training"},
    {"compression_training", false,
     "compression training quantizes, prunes or drops parts of the model during training"},
    {"elasticity", false,
     "elastic training picks the batch size from the number of ranks; autosp uses the batch keys as given"},
};

void refuse_math_changes(const Ctx& ctx, const json& config) {
  for (const RefusedFeature& f : kRefusedFeatures) {
    if (!config.contains(f.key)) continue;
    const std::string on = f.on_when_present ? f.key : first_enabled(ctx, object_at(ctx, config[f.key], f.key), f.key);
    if (!on.empty())
      user_error(ctx.source, ": ", on, f.on_when_present ? ": not supported: " : ": true is not supported: ", f.why);
  }
  if (config.contains("communication_data_type"))
    require_fp32_dtype(ctx, config["communication_data_type"], "communication_data_type",
                       "reduces and gathers gradients and parameters");
  if (config.contains("seq_parallel_communication_data_type"))
    require_fp32_dtype(ctx, config["seq_parallel_communication_data_type"], "seq_parallel_communication_data_type",
                       "runs the sequence-parallel all-to-alls and reductions");
  if (config.contains("data_types")) {
    const json& types = object_at(ctx, config["data_types"], "data_types");
    warn_unknown(ctx, types, "data_types", {"grad_accum_dtype"});
    if (types.contains("grad_accum_dtype"))
      require_fp32_dtype(ctx, types["grad_accum_dtype"], "data_types.grad_accum_dtype", "accumulates gradients");
  }
}

// DeepSpeed keys that cannot change the training numbers. Off, they are accepted silently;
// on, they warn that autosp ignores them (a user waiting for a TensorBoard log should know).
void check_no_effect_keys(const Ctx& ctx, const json& config) {
  static constexpr std::string_view kMonitor =
      "autosp does not implement it, ignored (it cannot change the training numbers; --metrics writes "
      "autosp's own per-step metrics)";
  for (const char* key : {"wall_clock_breakdown", "memory_breakdown", "dump_state"})
    if (config.contains(key) && bool_at(ctx, config[key], key)) warn(ctx, key, str("true, but ", kMonitor));
  for (const char* key : {"flops_profiler", "tensorboard", "wandb", "csv_monitor", "comms_logger"})
    if (config.contains(key) && enabled_at(ctx, config[key], key))
      warn(ctx, child(key, "enabled"), str("true, but ", kMonitor));
  static constexpr std::string_view kScaling =
      "has no effect in autosp, ignored: gradients are summed in fp32 and divided by the data-parallel size once, "
      "and scaling them before the sum would differ only by fp32 rounding";
  if (config.contains("prescale_gradients") && bool_at(ctx, config["prescale_gradients"], "prescale_gradients"))
    warn(ctx, "prescale_gradients", str("true ", kScaling));
  if (config.contains("gradient_predivide_factor")) {
    const json& v = config["gradient_predivide_factor"];
    const double factor = number_at(ctx, v, "gradient_predivide_factor", 0.0);
    if (factor == 0.0) bad_value(ctx, "gradient_predivide_factor", "a number > 0", v);
    if (factor != 1.0) warn(ctx, "gradient_predivide_factor", str(shown(v), " ", kScaling));
  }
  // Lets DeepSpeed pair ZeRO with a client optimizer; autosp's optimizer is built in.
  if (config.contains("zero_allow_untested_optimizer"))
    bool_at(ctx, config["zero_allow_untested_optimizer"], "zero_allow_untested_optimizer");
}

// DeepSpeed's activation_checkpointing configures deepspeed.checkpointing.checkpoint, which
// model code calls around each layer. autosp's model code never checkpoints: the compiler
// decides what to recompute, from compile.checkpoint. So the section is ignored, and the
// warning says what this run recomputes and how to choose.
void explain_activation_checkpointing(const Ctx& ctx, const json& section, const CompileConfig& compile) {
  object_at(ctx, section, "activation_checkpointing");
  const bool autosp = std::find(compile.passes.begin(), compile.passes.end(), "autosp") != compile.passes.end();
  const std::string policy = compile.checkpoint.value_or(autosp ? "sac" : "none");
  warn(ctx, "activation_checkpointing",
       str("ignored: autosp's compiler chooses what to recompute, set by compile.checkpoint: \"full\" recomputes "
           "each layer from its input in backward (what checkpointing every layer with DeepSpeed does), \"sac\" "
           "keeps attention's and the matmuls' results and recomputes the cheap elementwise rest, \"none\" keeps everything, \"auto\" picks "
           "the cheapest that fits compile.memory_budget_gb; this run uses \"", policy, "\"",
           compile.checkpoint ? "" : (autosp ? " (the default with the autosp pass)" : " (the default without the autosp pass)")));
}

// Hugging Face's "auto" values (config.h), filled in before parsing as its integration
// does with a default TrainingArguments; the batch keys become absent (resolve_batch derives
// them) and are listed in `auto_batch_keys`. Each filled value is reported.
json fill_auto(const Ctx& ctx, const json& config, std::vector<std::string>& auto_batch_keys) {
  if (!config.is_object()) return config;
  json c = config;
  auto note = [&](const std::string& path, const json& value, std::string_view why) {
    warn(ctx, path, str("\"auto\" -> ", value.dump(), " (", why, ")"));
  };
  for (const char* key : {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"})
    if (c.contains(key) && c[key] == "auto") {
      c.erase(key);
      auto_batch_keys.push_back(key);
    }
  if (c.contains("gradient_clipping") && c["gradient_clipping"] == "auto") {
    c["gradient_clipping"] = 1.0;
    note("gradient_clipping", 1.0, "Hugging Face's max_grad_norm default");
  }
  double lr = 5e-5;  // TrainingArguments.learning_rate's default
  if (c.contains("optimizer") && c["optimizer"].is_object() && c["optimizer"].contains("params") &&
      c["optimizer"]["params"].is_object()) {
    json& p = c["optimizer"]["params"];
    const std::pair<const char*, json> defaults[] = {
        {"lr", 5e-5}, {"betas", json::array({0.9, 0.999})}, {"eps", 1e-8}, {"weight_decay", 0.0}};
    for (const auto& [key, value] : defaults)
      if (p.contains(key) && p[key] == "auto") {
        p[key] = value;
        note(str("optimizer.params.", key), value, "Hugging Face's TrainingArguments default");
      }
    if (p.contains("lr") && p["lr"].is_number()) lr = p["lr"].get<double>();
  }
  if (c.contains("scheduler") && c["scheduler"].is_object() && c["scheduler"].contains("params") &&
      c["scheduler"]["params"].is_object()) {
    json& p = c["scheduler"]["params"];
    if (p.contains("warmup_min_lr") && p["warmup_min_lr"] == "auto") {
      p["warmup_min_lr"] = 0.0;
      note("scheduler.params.warmup_min_lr", 0.0, "as Hugging Face's integration sets it");
    }
    if (p.contains("warmup_max_lr") && p["warmup_max_lr"] == "auto") {
      p["warmup_max_lr"] = lr;
      note("scheduler.params.warmup_max_lr", lr, "the optimizer's learning rate");
    }
  }
  for (const char* key : {"bf16", "bfloat16", "fp16"})
    if (c.contains(key) && c[key].is_object() && c[key].contains("enabled") && c[key]["enabled"] == "auto") {
      c[key]["enabled"] = false;
      note(str(key, ".enabled"), false, str("Hugging Face's --", std::string_view(key) == "fp16" ? "fp16" : "bf16",
                                            " flag defaults to off"));
    }
  return c;
}

// checkpoint: how --save writes the weights (the optimizer state is autosp's own).
int64_t parse_checkpoint(const Ctx& ctx, const json& section) {
  object_at(ctx, section, "checkpoint");
  warn_unknown(ctx, section, "checkpoint", {"max_shard_size"});
  if (!section.contains("max_shard_size")) return io::kDefaultMaxShardBytes;
  return io::parse_shard_size(section["max_shard_size"], str(ctx.source, ": checkpoint.max_shard_size"));
}

}  // namespace

TrainConfig parse_train_config(const nlohmann::json& json_in, const std::string& source,
                               std::vector<std::string>* warnings) {
  const Ctx ctx{source, warnings};
  if (!json_in.is_object())
    user_error(source, ": expected a JSON object at the top level, got ", shown(json_in));
  std::vector<std::string> auto_batch_keys;
  const nlohmann::json json = fill_auto(ctx, json_in, auto_batch_keys);
  warn_unknown(ctx, json, "",
               {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                "gradient_clipping", "optimizer", "scheduler", "compile", "sequence_parallel_size",
                "zero_optimization", "steps_per_print", "seed", "data", "checkpoint", "comm",
                // mixed precision (parse_precision)
                "bf16", "bfloat16", "fp16", "amp", "torch_autocast",
                // refused when on (refuse_math_changes)
                "sparse_attention", "progressive_layer_drop", "curriculum_learning", "data_efficiency",
                "quantize_training", "compression_training", "elasticity", "communication_data_type",
                "seq_parallel_communication_data_type", "data_types",
                // no effect on the numbers (check_no_effect_keys)
                "wall_clock_breakdown", "memory_breakdown", "dump_state", "flops_profiler", "tensorboard",
                "wandb", "csv_monitor", "comms_logger", "prescale_gradients", "gradient_predivide_factor",
                "zero_allow_untested_optimizer",
                // DeepSpeed's own checkpointing, pointed to compile.checkpoint (explain_activation_checkpointing)
                "activation_checkpointing"});
  refuse_math_changes(ctx, json);
  check_no_effect_keys(ctx, json);
  TrainConfig c;
  c.auto_batch_keys = auto_batch_keys;
  std::tie(c.requested_precision, c.precision_key) = parse_precision(ctx, json);
  auto has = [&](const char* key) { return json.contains(key); };
  for (const char* key :
       {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}) {
    if (!has(key)) continue;
    const int64_t v = int_at(ctx, json[key], key, 1);
    if (key == std::string_view("train_batch_size")) c.train_batch_size = v;
    else if (key == std::string_view("train_micro_batch_size_per_gpu")) c.train_micro_batch_size_per_gpu = v;
    else c.gradient_accumulation_steps = v;
  }
  if (has("gradient_clipping"))
    c.gradient_clipping = number_at(ctx, json["gradient_clipping"], "gradient_clipping", 0.0);
  if (has("optimizer")) c.optimizer = parse_optimizer(ctx, json["optimizer"], c.optimizer_defaults);
  else c.optimizer_defaults = {"optimizer"};
  if (has("scheduler")) c.scheduler = parse_scheduler(ctx, json["scheduler"], c.scheduler_defaults);
  if (has("compile")) c.compile = parse_compile(ctx, json["compile"]);
  if (has("activation_checkpointing")) explain_activation_checkpointing(ctx, json["activation_checkpointing"], c.compile);
  if (has("sequence_parallel_size"))
    c.sequence_parallel_size = int_at(ctx, json["sequence_parallel_size"], "sequence_parallel_size", 1);
  if (has("zero_optimization")) {
    c.zero = parse_zero(ctx, json["zero_optimization"]);
    c.zero_stage = c.zero.stage;
  }
  if (has("steps_per_print"))
    c.steps_per_print = int_at(ctx, json["steps_per_print"], "steps_per_print", 1);
  if (has("seed")) c.seed = static_cast<uint64_t>(int_at(ctx, json["seed"], "seed", 0));
  if (has("comm")) {
    c.comm = string_at(ctx, json["comm"], "comm");
    if (c.comm != "auto" && c.comm != "nccl" && c.comm != "mpi")
      user_error(ctx.source, ": comm: expected \"auto\", \"nccl\" or \"mpi\" (the cuda backend's collectives: NCCL, "
                 "one GPU per rank; or staged through host memory over MPI, for ranks that share a GPU), got \"",
                 c.comm, "\"");
  }
  if (has("data")) c.data = parse_data(ctx, json["data"]);
  if (has("checkpoint")) c.max_shard_bytes = parse_checkpoint(ctx, json["checkpoint"]);
  return c;
}

TrainConfig load_train_config(const std::string& path, std::vector<std::string>* warnings) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    user_error(path, ": cannot open the config file (", std::strerror(errno),
               "); check the path given for the DeepSpeed config");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) user_error(path, ": cannot read the config file (", std::strerror(errno), ")");

  // DeepSpeed loads configs with object_pairs_hook=dict_raise_error_on_duplicate_keys;
  // nlohmann would silently keep the last value, so duplicates are caught while parsing.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: open_objects.emplace_back(); break;
      case json::parse_event_t::object_end: open_objects.pop_back(); break;
      case json::parse_event_t::key:
        if (!open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty())
          duplicate = parsed.get<std::string>();
        break;
      default: break;
    }
    return true;
  };
  json parsed;
  try {
    parsed = json::parse(text.str(), callback);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e999
    user_error(path, ": invalid JSON: ", e.what());
  }
  if (!duplicate.empty()) user_error(path, ": duplicate key \"", duplicate, "\" in the JSON");
  return parse_train_config(parsed, path, warnings);
}

void resolve_batch(TrainConfig& c, int dp_size, const std::string& source, std::vector<std::string>* notes) {
  AUTOSP_CHECK(dp_size >= 1, "resolve_batch: dp_size = ", dp_size);
  const int64_t dp = dp_size;
  std::optional<int64_t>& batch = c.train_batch_size;
  std::optional<int64_t>& micro = c.train_micro_batch_size_per_gpu;
  std::optional<int64_t>& accum = c.gradient_accumulation_steps;
  auto is_auto = [&](std::string_view key) {
    return std::find(c.auto_batch_keys.begin(), c.auto_batch_keys.end(), key) != c.auto_batch_keys.end();
  };
  // Nothing to derive the micro batch from: Hugging Face's per_device_train_batch_size default.
  if (!batch && !micro && is_auto("train_micro_batch_size_per_gpu")) micro = 8;
  if (!batch && !micro)
    user_error(source, ": train_batch_size or train_micro_batch_size_per_gpu must be set");
  // DeepSpeed's order of cases; integer division where it uses //, and the check at the end
  // catches any remainder.
  std::string derived;  // how a value was derived from train_batch_size, for messages
  if (batch && micro && !accum) {
    accum = *batch / *micro / dp;
    derived = str("gradient_accumulation_steps = train_batch_size / train_micro_batch_size_per_gpu"
                  " / data-parallel size = ", *batch, " / ", *micro, " / ", dp, " = ", *accum);
  } else if (batch && !micro && accum) {
    micro = *batch / dp / *accum;
    derived = str("train_micro_batch_size_per_gpu = train_batch_size / data-parallel size / "
                  "gradient_accumulation_steps = ", *batch, " / ", dp, " / ", *accum, " = ", *micro);
  } else if (batch && !micro) {
    accum = 1;
    micro = *batch / dp;
    derived = str("train_micro_batch_size_per_gpu = train_batch_size / data-parallel size = ",
                  *batch, " / ", dp, " = ", *micro);
  } else if (!batch && !accum) {
    accum = 1;
  }
  if (*micro < 1 || *accum < 1)
    user_error(source, ": train_batch_size (", *batch, ") is too small: derived ", derived,
               ", which must be >= 1");
  int64_t product;
  if (__builtin_mul_overflow(*micro, *accum, &product) ||
      __builtin_mul_overflow(product, dp, &product))
    user_error(source, ": train_micro_batch_size_per_gpu (", *micro,
               ") x gradient_accumulation_steps (", *accum, ") x data-parallel size (", dp,
               ") overflows");
  if (!batch) batch = product;
  if (*batch != product)
    user_error(source, ": train_batch_size (", *batch,
               ") must equal train_micro_batch_size_per_gpu (", *micro,
               ") x gradient_accumulation_steps (", *accum, ") x data-parallel size (", dp,
               ") = ", product, derived.empty() ? "" : str(" (derived ", derived, ")"));
  if (notes)
    for (const std::string& key : c.auto_batch_keys) {
      const int64_t v = key == "train_batch_size" ? *batch : key == "train_micro_batch_size_per_gpu" ? *micro : *accum;
      notes->push_back(str(source, ": ", key, ": \"auto\" -> ", v, " (train_batch_size ", *batch,
                           " = train_micro_batch_size_per_gpu ", *micro, " x gradient_accumulation_steps ", *accum,
                           " x data-parallel size ", dp, ")"));
    }
}

void resolve_model_auto(TrainConfig& c, int64_t hidden, const std::string& source, std::vector<std::string>* notes) {
  // transformers.integrations.deepspeed: HfDeepSpeedConfig.trainer_config_finalize.
  for (const std::string& key : c.zero.auto_keys) {
    int64_t v = 0;
    std::string how;
    if (key == "reduce_bucket_size") {
      v = c.zero.reduce_bucket_size = hidden * hidden;
      how = "hidden_size^2";
    } else if (key == "stage3_prefetch_bucket_size") {
      v = c.zero.stage3_prefetch_bucket_size = int64_t(0.9 * double(hidden) * double(hidden));
      how = "0.9 x hidden_size^2";
    } else if (key == "stage3_param_persistence_threshold") {
      v = c.zero.stage3_param_persistence_threshold = 10 * hidden;
      how = "10 x hidden_size";
    } else {
      internal_error("resolve_model_auto: zero_optimization.", key);
    }
    if (notes)
      notes->push_back(str(source, ": zero_optimization.", key, ": \"auto\" -> ", v, " (", how, ", hidden_size ",
                           hidden, ", as Hugging Face's integration)"));
  }
  c.zero.auto_keys.clear();
}

void check_heads_layout(const models::LlamaConfig& model, int64_t sp, const std::string& sp_source,
                        const std::string& model_source) {
  const int64_t NH = model.num_attention_heads, NKV = model.num_key_value_heads;
  if (sp <= 1 || NH <= 0 || NKV <= 0) return;  // nothing to split (the model's own checks cover the rest)
  auto fits = [&](int64_t P) { return NH % P == 0 && (NKV % P == 0 || P % NKV == 0); };
  if (fits(sp)) return;
  std::string sizes;
  for (int64_t P = 1; P <= NH; ++P)
    if (fits(P)) sizes += str(sizes.empty() ? "" : ", ", P);
  const std::string usable = str("; sequence-parallel sizes this model can use: ", sizes);
  if (NH % sp != 0)
    user_error(model_source, ": num_attention_heads ", NH, " is not divisible by ", sp_source,
               ": Ulysses sequence parallelism gives each rank whole attention heads (NH / P of them)", usable);
  user_error(model_source, ": num_key_value_heads ", NKV, " cannot be shared out over ", sp_source,
             ": Ulysses splits the key-value heads over the ranks (P must divide NKV) or repeats them (NKV must "
             "divide P), and ", NKV, " and ", sp, " allow neither", usable);
}

namespace {

// A hyperparameter as a person writes it: 0.001, 1e-08 -> 1e-8, 0.9.
std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  std::string t = buf;
  for (const char* exp : {"e-0", "e+0"})
    if (const size_t at = t.find(exp); at != std::string::npos) t.erase(at + 2, 1);
  return t;
}

std::string defaults_text(const std::vector<std::string>& defaults) {
  std::string t;
  for (const std::string& d : defaults) t += (t.empty() ? "" : ", ") + d;
  return t;
}

}  // namespace

std::string describe_optimizer(const TrainConfig& c) {
  const AdamWParams& p = c.optimizer;
  std::string text = str("optimizer: ", p.decoupled_weight_decay ? "AdamW" : "Adam (L2 weight decay, as torch.optim.Adam)",
                         " lr ", number_text(p.lr), " betas (", number_text(p.beta1), ", ", number_text(p.beta2),
                         ") eps ", number_text(p.eps), " weight_decay ", number_text(p.weight_decay));
  if (c.optimizer_defaults == std::vector<std::string>{"optimizer"}) return text + " (defaults: no optimizer section)";
  if (!c.optimizer_defaults.empty()) text += str(" (defaults: ", defaults_text(c.optimizer_defaults), ")");
  return text;
}

std::string describe_scheduler(const TrainConfig& c) {
  const SchedulerConfig& s = c.scheduler;
  if (s.type == SchedulerType::kNone) return str("scheduler: constant lr ", number_text(c.optimizer.lr), " (no scheduler section)");
  // As lr_at computes it (lr_schedule.h): warmup over max(2, warmup_num_steps) steps.
  const int64_t warmup = std::max<int64_t>(2, s.warmup_num_steps);
  const char* curve = s.warmup_type == WarmupType::kLog ? "log" : "linear";
  std::string text = str("scheduler: ", scheduler_type_name(s.type), ": ");
  if (s.type == SchedulerType::kWarmupCosineLR) {
    text += str(curve, " warmup from ", number_text(s.warmup_min_ratio), " x lr to lr ", number_text(c.optimizer.lr),
                " over ", warmup, " steps, then cosine decay to ", number_text(s.cos_min_ratio), " x lr at step ",
                s.total_num_steps);
  } else {
    const double max_lr = s.warmup_max_lr.value_or(s.type == SchedulerType::kWarmupLR ? c.optimizer.lr : 0.001);
    text += str(curve, " warmup from ", number_text(s.warmup_min_lr), " to ", number_text(max_lr), " over ", warmup,
                " steps, then ",
                s.type == SchedulerType::kWarmupLR
                    ? std::string("constant")
                    : str("linear decay to ", number_text(s.warmup_min_lr), " at step ", s.total_num_steps));
    if (!s.warmup_max_lr && s.type == SchedulerType::kWarmupDecayLR && max_lr != c.optimizer.lr)
      text += str(" (warmup_max_lr defaults to 0.001 as in DeepSpeed, not optimizer.params.lr ",
                  number_text(c.optimizer.lr), ")");
  }
  if (!c.scheduler_defaults.empty()) text += str(" (defaults: ", defaults_text(c.scheduler_defaults), ")");
  return text;
}

}  // namespace autosp::train
