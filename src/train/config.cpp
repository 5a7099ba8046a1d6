#include "train/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string_view>

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
  user_error(ctx.source, ": ", path, ": expected ", expected, ", got ", shown(got));
}

void warn(const Ctx& ctx, const std::string& path, std::string_view what) {
  if (ctx.warnings) ctx.warnings->push_back(str(ctx.source, ": ", path, ": ", what));
}

const json& object_at(const Ctx& ctx, const json& value, const std::string& path) {
  if (!value.is_object()) bad_value(ctx, path, "an object", value);
  return value;
}

// Warns about every key of `object` not in `known`.
void warn_unknown(const Ctx& ctx, const json& object, const std::string& path,
                  std::initializer_list<std::string_view> known, std::string_view why = "") {
  for (const auto& [key, value] : object.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end())
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

AdamWParams parse_optimizer(const Ctx& ctx, const json& section) {
  const std::string path = "optimizer";
  object_at(ctx, section, path);
  warn_unknown(ctx, section, path, {"type", "params"});
  if (!section.contains("type")) user_error(ctx.source, ": optimizer.type: missing (use \"AdamW\")");
  const std::string type = string_at(ctx, section["type"], "optimizer.type");
  // DeepSpeed lower-cases known optimizer names, so "adamw" and "ADAMW" mean AdamW.
  if (lower(type) != "adamw") {
    std::string hint;
    if (lower(type) == "adam")
      hint = " (DeepSpeed's \"Adam\" defaults to adam_w_mode, i.e. AdamW: write \"AdamW\")";
    user_error(ctx.source, ": optimizer.type: \"", type,
               "\" is not supported; autosp implements \"AdamW\"", hint);
  }
  AdamWParams p;
  if (!section.contains("params")) return p;
  const std::string ppath = "optimizer.params";
  const json& params = object_at(ctx, section["params"], ppath);
  warn_unknown(ctx, params, ppath, {"lr", "betas", "eps", "weight_decay"});
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
  if (params.contains("weight_decay"))
    p.weight_decay = number_at(ctx, params["weight_decay"], child(ppath, "weight_decay"), 0.0);
  return p;
}

SchedulerConfig parse_scheduler(const Ctx& ctx, const json& section) {
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
  warn_unknown(ctx, section, path, {"deepcompile", "passes", "checkpoint", "memory_budget_gb"});
  CompileConfig c;
  if (section.contains("checkpoint")) {
    const std::string policy = string_at(ctx, section["checkpoint"], "compile.checkpoint");
    if (policy == "auto")
      user_error(ctx.source, ": compile.checkpoint: \"auto\" (the cheapest plan under memory_budget_gb) needs the "
                 "static memory planner, which autosp does not have yet; use \"none\", \"full\" or \"sac\"");
    parse_checkpoint_policy(policy, str(ctx.source, ": compile.checkpoint"));
    c.checkpoint = policy;
  }
  if (section.contains("memory_budget_gb"))
    user_error(ctx.source, ": compile.memory_budget_gb: a memory budget needs the static memory planner, which "
               "autosp does not have yet; remove it (compile.checkpoint chooses what backward keeps)");
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

int parse_zero(const Ctx& ctx, const json& section) {
  if (section.is_boolean()) {
    // DeepSpeed's deprecated form: true means stage 1.
    warn(ctx, "zero_optimization", "boolean form is deprecated, use {\"stage\": N}");
    return section.get<bool>() ? 1 : 0;
  }
  const std::string path = "zero_optimization";
  if (!section.is_object()) bad_value(ctx, path, "an object", section);
  warn_unknown(ctx, section, path, {"stage"});
  if (!section.contains("stage")) return 0;
  const json& v = section["stage"];
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 3 ||
      (v.is_number_unsigned() && v.get<uint64_t>() > 3))
    bad_value(ctx, "zero_optimization.stage", "0, 1, 2 or 3", v);
  const int stage = static_cast<int>(v.get<int64_t>());
  if (stage > 1)
    user_error(ctx.source, ": zero_optimization.stage: ZeRO stage ", stage,
               " is not supported; autosp implements stages 0 and 1");
  return stage;
}

}  // namespace

TrainConfig parse_train_config(const nlohmann::json& json, const std::string& source,
                               std::vector<std::string>* warnings) {
  const Ctx ctx{source, warnings};
  if (!json.is_object())
    user_error(source, ": expected a JSON object at the top level, got ", shown(json));
  warn_unknown(ctx, json, "",
               {"train_batch_size", "train_micro_batch_size_per_gpu",
                "gradient_accumulation_steps", "gradient_clipping", "optimizer", "scheduler",
                "compile", "sequence_parallel_size", "zero_optimization", "steps_per_print",
                "seed"});
  TrainConfig c;
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
  if (has("optimizer")) c.optimizer = parse_optimizer(ctx, json["optimizer"]);
  if (has("scheduler")) c.scheduler = parse_scheduler(ctx, json["scheduler"]);
  if (has("compile")) c.compile = parse_compile(ctx, json["compile"]);
  if (has("sequence_parallel_size"))
    c.sequence_parallel_size = int_at(ctx, json["sequence_parallel_size"], "sequence_parallel_size", 1);
  if (has("zero_optimization")) c.zero_stage = parse_zero(ctx, json["zero_optimization"]);
  if (has("steps_per_print"))
    c.steps_per_print = int_at(ctx, json["steps_per_print"], "steps_per_print", 1);
  if (has("seed")) c.seed = static_cast<uint64_t>(int_at(ctx, json["seed"], "seed", 0));
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
  } catch (const json::parse_error& e) {
    user_error(path, ": invalid JSON: ", e.what());
  }
  if (!duplicate.empty()) user_error(path, ": duplicate key \"", duplicate, "\" in the JSON");
  return parse_train_config(parsed, path, warnings);
}

void resolve_batch(TrainConfig& c, int dp_size, const std::string& source) {
  AUTOSP_CHECK(dp_size >= 1, "resolve_batch: dp_size = ", dp_size);
  const int64_t dp = dp_size;
  std::optional<int64_t>& batch = c.train_batch_size;
  std::optional<int64_t>& micro = c.train_micro_batch_size_per_gpu;
  std::optional<int64_t>& accum = c.gradient_accumulation_steps;
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
}

}  // namespace autosp::train
