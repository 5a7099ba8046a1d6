// The DeepSpeed JSON config: a full config, defaults, every kind of error (the message must
// name the file and the key path), unknown-key warnings, and DeepSpeed's batch-size rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <unistd.h>
#include <vector>

#include "train/config.h"
#include "util/error.h"

namespace autosp::train {
namespace {

using nlohmann::json;

TrainConfig parse(const std::string& text, std::vector<std::string>* warnings = nullptr) {
  return parse_train_config(json::parse(text), "config.json", warnings);
}

// The UserError message of parsing `text` ("" if it parses).
std::string parse_error(const std::string& text) {
  try {
    parse(text);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_PARSE_ERROR(text, ...)                                   \
  do {                                                                  \
    const std::string message = parse_error(text);                      \
    EXPECT_FALSE(message.empty()) << "no error for " << (text);        \
    for (const char* part : {__VA_ARGS__})                              \
      EXPECT_NE(message.find(part), std::string::npos)                  \
          << "message: " << message << "\nmissing: " << part;          \
  } while (0)

TEST(TrainConfig, FullConfig) {
  std::vector<std::string> warnings;
  const TrainConfig c = parse(R"({
    "train_batch_size": 32,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW",
                  "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-6, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupDecayLR",
                  "params": {"warmup_min_lr": 1e-5, "warmup_max_lr": 3e-4, "warmup_num_steps": 100,
                             "warmup_type": "linear", "total_num_steps": 1000}},
    "compile": {"deepcompile": true, "passes": ["autosp"]},
    "sequence_parallel_size": 4,
    "zero_optimization": {"stage": 1},
    "steps_per_print": 5,
    "seed": 7
  })", &warnings);
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  EXPECT_EQ(c.train_batch_size, 32);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 2);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.optimizer.beta1, 0.9);
  EXPECT_EQ(c.optimizer.beta2, 0.95);
  EXPECT_EQ(c.optimizer.eps, 1e-6);
  EXPECT_EQ(c.optimizer.weight_decay, 0.1);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kWarmupDecayLR);
  EXPECT_EQ(c.scheduler.warmup_min_lr, 1e-5);
  EXPECT_EQ(c.scheduler.warmup_max_lr, 3e-4);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 100);
  EXPECT_EQ(c.scheduler.warmup_type, WarmupType::kLinear);
  EXPECT_EQ(c.scheduler.total_num_steps, 1000);
  EXPECT_TRUE(c.compile.deepcompile);
  EXPECT_EQ(c.compile.passes, std::vector<std::string>{"autosp"});
  EXPECT_EQ(c.sequence_parallel_size, 4);
  EXPECT_EQ(c.zero_stage, 1);
  EXPECT_EQ(c.steps_per_print, 5);
  EXPECT_EQ(c.seed, 7u);
}

TEST(TrainConfig, Defaults) {
  const TrainConfig c = parse(R"({"train_micro_batch_size_per_gpu": 1})");
  EXPECT_FALSE(c.train_batch_size.has_value());
  EXPECT_FALSE(c.gradient_accumulation_steps.has_value());
  EXPECT_EQ(c.gradient_clipping, 0.0);
  // torch.optim.AdamW's defaults.
  EXPECT_EQ(c.optimizer.lr, 1e-3);
  EXPECT_EQ(c.optimizer.beta1, 0.9);
  EXPECT_EQ(c.optimizer.beta2, 0.999);
  EXPECT_EQ(c.optimizer.eps, 1e-8);
  EXPECT_EQ(c.optimizer.weight_decay, 0.01);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kNone);
  EXPECT_FALSE(c.compile.deepcompile);
  EXPECT_TRUE(c.compile.passes.empty());
  EXPECT_EQ(c.sequence_parallel_size, 1);
  EXPECT_EQ(c.zero_stage, 0);
  EXPECT_EQ(c.steps_per_print, 10);  // DeepSpeed's default
}

TEST(TrainConfig, OptimizerTypeIsCaseInsensitiveAndParamsOptional) {
  EXPECT_EQ(parse(R"({"optimizer": {"type": "adamw"}})").optimizer.lr, 1e-3);
  EXPECT_EQ(parse(R"({"optimizer": {"type": "ADAMW", "params": {"lr": 0.5}}})").optimizer.lr, 0.5);
}

TEST(TrainConfig, SchedulerDefaultsPerType) {
  // DeepSpeed's class defaults.
  const SchedulerConfig w = parse(R"({"scheduler": {"type": "WarmupLR"}})").scheduler;
  EXPECT_EQ(w.type, SchedulerType::kWarmupLR);
  EXPECT_EQ(w.warmup_min_lr, 0.0);
  EXPECT_FALSE(w.warmup_max_lr.has_value());
  EXPECT_EQ(w.warmup_num_steps, 1000);
  EXPECT_EQ(w.warmup_type, WarmupType::kLog);
  const SchedulerConfig cos =
      parse(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 5000}}})")
          .scheduler;
  EXPECT_EQ(cos.type, SchedulerType::kWarmupCosineLR);
  EXPECT_EQ(cos.total_num_steps, 5000);
  EXPECT_EQ(cos.warmup_min_ratio, 0.0);
  EXPECT_EQ(cos.cos_min_ratio, 0.0001);
  EXPECT_EQ(cos.warmup_num_steps, 1000);
}

TEST(TrainConfig, WrongTypesNameTheKeyPath) {
  EXPECT_PARSE_ERROR(R"({"optimizer": {"type": "AdamW", "params": {"betas": "x"}}})",
                     "config.json: optimizer.params.betas: expected an array of 2 numbers, got \"x\"");
  EXPECT_PARSE_ERROR(R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}})",
                     "optimizer.params.betas: expected an array of 2 numbers, got [0.9]");
  EXPECT_PARSE_ERROR(R"({"train_micro_batch_size_per_gpu": "4"})",
                     "config.json: train_micro_batch_size_per_gpu: expected an integer >= 1, got \"4\"");
  EXPECT_PARSE_ERROR(R"({"gradient_accumulation_steps": 2.5})",
                     "gradient_accumulation_steps: expected an integer >= 1, got 2.5");
  EXPECT_PARSE_ERROR(R"({"gradient_clipping": true})", "gradient_clipping: expected a number");
  EXPECT_PARSE_ERROR(R"({"compile": {"deepcompile": "yes"}})",
                     "compile.deepcompile: expected true or false, got \"yes\"");
  EXPECT_PARSE_ERROR(R"({"compile": {"passes": "autosp"}})", "compile.passes: expected an array");
  EXPECT_PARSE_ERROR(R"({"optimizer": []})", "config.json: optimizer: expected an object, got []");
  EXPECT_PARSE_ERROR(R"({"scheduler": {"type": "WarmupLR", "params": 3}})",
                     "scheduler.params: expected an object, got 3");
  EXPECT_PARSE_ERROR(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10.0}}})",
                     "scheduler.params.warmup_num_steps: expected an integer >= 1, got 10.0");
  EXPECT_PARSE_ERROR(R"([1, 2])", "config.json: expected a JSON object at the top level");
}

TEST(TrainConfig, BadValuesNameTheKeyPath) {
  EXPECT_PARSE_ERROR(R"({"train_batch_size": 0})", "train_batch_size: expected an integer >= 1, got 0");
  EXPECT_PARSE_ERROR(R"({"sequence_parallel_size": 0})", "sequence_parallel_size: expected an integer >= 1");
  EXPECT_PARSE_ERROR(R"({"steps_per_print": 0})", "steps_per_print: expected an integer >= 1");
  EXPECT_PARSE_ERROR(R"({"gradient_clipping": -1})", "gradient_clipping: expected a number >= 0, got -1");
  EXPECT_PARSE_ERROR(R"({"seed": -3})", "seed: expected an integer >= 0, got -3");
  EXPECT_PARSE_ERROR(R"({"comm": "gloo"})", "config.json: comm: expected \"auto\", \"nccl\" or \"mpi\"", "got \"gloo\"");
  EXPECT_PARSE_ERROR(R"({"comm": 1})", "comm: expected a string");
  EXPECT_PARSE_ERROR(R"({"train_batch_size": 99999999999999999999})", "train_batch_size: expected an integer");
  EXPECT_PARSE_ERROR(R"({"optimizer": {"type": "AdamW", "params": {"lr": -0.1}}})",
                     "optimizer.params.lr: expected a number >= 0, got -0.1");
  EXPECT_PARSE_ERROR(R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, 1.0]}}})",
                     "optimizer.params.betas[1]: expected a number in [0, 1), got 1.0");
  EXPECT_PARSE_ERROR(R"({"optimizer": {"type": "AdamW", "params": {"eps": -1e-8}}})",
                     "optimizer.params.eps: expected a number >= 0");
  EXPECT_PARSE_ERROR(R"({"optimizer": {"type": "AdamW", "params": {"weight_decay": -1}}})",
                     "optimizer.params.weight_decay: expected a number >= 0");
  EXPECT_PARSE_ERROR(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}})",
                     "scheduler.params.warmup_num_steps: expected an integer >= 1, got 0");
  EXPECT_PARSE_ERROR(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}})",
                     "scheduler.params.warmup_type: expected \"log\" or \"linear\", got \"cosine\"");
  EXPECT_PARSE_ERROR(R"({"compile": {"passes": ["autosp", "fuse"]}})",
                     "compile.passes[1]: expected \"z1\", \"z3\" or \"autosp\", got \"fuse\"");
}

TEST(TrainConfig, UnsupportedOptimizerSchedulerAndZeroStage) {
  EXPECT_PARSE_ERROR(R"({"optimizer": {"type": "Lamb"}})",
                     "config.json: optimizer.type: \"Lamb\" is not supported", "\"AdamW\" and \"Adam\"");
  EXPECT_PARSE_ERROR(R"({"optimizer": {"params": {}}})", "optimizer.type: missing");
  EXPECT_PARSE_ERROR(R"({"scheduler": {"type": "OneCycle"}})",
                     "scheduler.type: \"OneCycle\" is not supported", "WarmupCosineLR");
  EXPECT_PARSE_ERROR(R"({"scheduler": {"type": "warmuplr"}})", "scheduler.type");  // case matters
  EXPECT_PARSE_ERROR(R"({"scheduler": {"type": "WarmupDecayLR"}})",
                     "scheduler.params.total_num_steps: missing", "WarmupDecayLR");
  EXPECT_PARSE_ERROR(R"({"scheduler": {"type": "WarmupCosineLR", "params": {}}})",
                     "scheduler.params.total_num_steps: missing");
  EXPECT_EQ(parse(R"({"zero_optimization": {"stage": 2}})").zero_stage, 2);
  EXPECT_EQ(parse(R"({"zero_optimization": {"stage": 3}})").zero_stage, 3);
  EXPECT_PARSE_ERROR(R"({"zero_optimization": {"stage": 4}})",
                     "zero_optimization.stage: expected 0, 1, 2 or 3, got 4");
  EXPECT_EQ(parse(R"({"zero_optimization": true})").zero_stage, 1);  // DeepSpeed's legacy form
}

TEST(TrainConfig, UnknownKeysWarnWithTheirPath) {
  std::vector<std::string> warnings;
  const TrainConfig c = parse(R"({
    "train_micro_batch_size_per_gpu": 1,
    "not_a_deepspeed_key": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.1, "set_grad_none": true}},
    "scheduler": {"type": "WarmupLR", "params": {"cos_min_ratio": 0.1}},
    "zero_optimization": {"stage": 0, "overlap_comm": true, "stage3_no_such_key": 1},
    "compile": {"deepcompile": true, "free_activation": true}
  })", &warnings);
  EXPECT_EQ(c.optimizer.lr, 0.1);
  const std::vector<std::string> expected = {
      "config.json: not_a_deepspeed_key: unknown key, ignored",
      "config.json: optimizer.params.set_grad_none: unknown key, ignored",
      "config.json: scheduler.params.cos_min_ratio: not a parameter of WarmupLR, ignored",
      "config.json: zero_optimization.stage3_no_such_key: unknown key, ignored",
      "config.json: compile.free_activation: unknown key, ignored",
  };
  for (const std::string& w : expected)
    EXPECT_NE(std::find(warnings.begin(), warnings.end(), w), warnings.end()) << w;
  EXPECT_EQ(warnings.size(), expected.size());
  // A null sink is allowed.
  EXPECT_NO_THROW(parse(R"({"whatever": 1})", nullptr));
}

// The issue's case: a misspelt accumulation count trained at accumulation 1 with only a warning.
TEST(TrainConfig, TypoedKeysAreErrorsNamingTheKeyMeant) {
  EXPECT_PARSE_ERROR(R"({"train_micro_batch_size_per_gpu": 1, "gradient_acumulation_steps": 4})",
                     "config.json: gradient_acumulation_steps: unknown key; did you mean "
                     "\"gradient_accumulation_steps\"?");
  // A transposition is one edit; case is ignored; the path names the section.
  EXPECT_PARSE_ERROR(R"({"optimizer": {"type": "AdamW", "params": {"weight_deacy": 0.1}}})",
                     "config.json: optimizer.params.weight_deacy: unknown key; did you mean \"weight_decay\"?");
  EXPECT_PARSE_ERROR(R"({"Train_Batch_Size": 8})", "did you mean \"train_batch_size\"?");
  EXPECT_PARSE_ERROR(R"({"zero_optimization": {"stag": 2}})", "zero_optimization.stag", "\"stage\"");
  EXPECT_PARSE_ERROR(R"({"compile": {"checkpoints": "full"}})", "compile.checkpoints", "\"checkpoint\"");
  EXPECT_PARSE_ERROR(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_step": 5}}})",
                     "scheduler.params.warmup_num_step", "\"warmup_num_steps\"");
  // Only keys of the same section are candidates, and short keys allow one edit: "aio" (a
  // DeepSpeed section) is two from "amp", "lrr" one from "lr".
  std::vector<std::string> w;
  parse(R"({"train_micro_batch_size_per_gpu": 1, "aio": {}, "zero_optimization": {"gradient_clipping": 1}})", &w);
  EXPECT_EQ(w, (std::vector<std::string>{"config.json: aio: unknown key, ignored",
                                         "config.json: zero_optimization.gradient_clipping: unknown key, ignored"}));
  EXPECT_PARSE_ERROR(R"({"optimizer": {"type": "AdamW", "params": {"lrr": 0.1}}})", "did you mean \"lr\"?");
  // Two edits away (s and i missing): still a typo at that length.
  EXPECT_PARSE_ERROR(R"({"step_per_prnt": 1, "train_micro_batch_size_per_gpu": 1})", "\"steps_per_print\"");
  // Three: an unrelated key, a warning.
  w.clear();
  parse(R"({"train_micro_batch_size_per_gpu": 1, "step_pr_prnt": 1})", &w);
  EXPECT_EQ(w, (std::vector<std::string>{"config.json: step_pr_prnt: unknown key, ignored"}));
}

TEST(TrainConfig, DeepSpeedActivationCheckpointingPointsToCompileCheckpoint) {
  std::vector<std::string> w;
  parse(R"({"train_micro_batch_size_per_gpu": 1, "compile": {"deepcompile": true, "passes": ["autosp"]},
            "activation_checkpointing": {"partition_activations": true, "number_checkpoints": 4}})", &w);
  ASSERT_EQ(w.size(), 1u) << ::testing::PrintToString(w);
  EXPECT_NE(w[0].find("config.json: activation_checkpointing: ignored"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("compile.checkpoint"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("\"full\" recomputes each layer"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("this run uses \"sac\" (the default with the autosp pass)"), std::string::npos) << w[0];
  w.clear();
  parse(R"({"train_micro_batch_size_per_gpu": 1, "compile": {"checkpoint": "full"}, "activation_checkpointing": {}})", &w);
  ASSERT_EQ(w.size(), 1u) << ::testing::PrintToString(w);
  EXPECT_NE(w[0].find("this run uses \"full\""), std::string::npos) << w[0];
  EXPECT_PARSE_ERROR(R"({"activation_checkpointing": true})", "activation_checkpointing: expected an object");
}

TEST(TrainConfig, TheEffectiveOptimizerAndScheduleAreDescribedWithTheirDefaults) {
  const TrainConfig none = parse(R"({"train_micro_batch_size_per_gpu": 1})");
  EXPECT_EQ(describe_optimizer(none),
            "optimizer: AdamW lr 0.001 betas (0.9, 0.999) eps 1e-8 weight_decay 0.01 (defaults: no optimizer section)");
  EXPECT_EQ(describe_scheduler(none), "scheduler: constant lr 0.001 (no scheduler section)");

  const TrainConfig some = parse(R"({"optimizer": {"type": "Adam", "params": {"lr": 3e-4, "adam_w_mode": false}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100, "warmup_type": "linear"}}})");
  EXPECT_EQ(describe_optimizer(some), "optimizer: Adam (L2 weight decay, as torch.optim.Adam) lr 0.0003 betas "
                                      "(0.9, 0.999) eps 1e-8 weight_decay 0 (defaults: betas, eps, weight_decay)");
  EXPECT_EQ(describe_scheduler(some),
            "scheduler: WarmupDecayLR: linear warmup from 0 to 0.001 over 1000 steps, then linear decay to 0 at step "
            "100 (warmup_max_lr defaults to 0.001 as in DeepSpeed, not optimizer.params.lr 0.0003) (defaults: "
            "warmup_min_lr, warmup_max_lr, warmup_num_steps)");

  const TrainConfig all = parse(R"({"optimizer": {"type": "AdamW",
      "params": {"lr": 0.01, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 50, "warmup_num_steps": 1,
      "warmup_min_ratio": 0.1, "cos_min_ratio": 0.2, "warmup_type": "log"}}})");
  EXPECT_EQ(describe_optimizer(all), "optimizer: AdamW lr 0.01 betas (0.8, 0.95) eps 1e-6 weight_decay 0.1");
  // warmup_num_steps 1 behaves as 2, as lr_at (and DeepSpeed) count it.
  EXPECT_EQ(describe_scheduler(all), "scheduler: WarmupCosineLR: log warmup from 0.1 x lr to lr 0.01 over 2 steps, "
                                     "then cosine decay to 0.2 x lr at step 50");
  const TrainConfig warmup = parse(R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.5}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}})");
  EXPECT_EQ(describe_scheduler(warmup), "scheduler: WarmupLR: log warmup from 0 to 0.5 over 10 steps, then constant "
                                        "(defaults: warmup_min_lr, warmup_max_lr, warmup_type)");
}

// ---- data: how --data's tokens become samples ---------------------------------------------

TEST(TrainConfig, DataSectionPackAndEosTokenId) {
  // Absent: nothing given, the data source decides (an indexed dataset packs).
  const TrainConfig none = parse(R"({"train_micro_batch_size_per_gpu": 1})");
  EXPECT_FALSE(none.data.pack.has_value());
  EXPECT_FALSE(none.data.eos_token_id.has_value());
  EXPECT_FALSE(none.data.packed);
  const TrainConfig c = parse(R"({"data": {"pack": false, "eos_token_id": 2}})");
  EXPECT_EQ(c.data.pack, std::optional<bool>(false));
  EXPECT_EQ(c.data.eos_token_id, std::optional<int64_t>(2));
  EXPECT_FALSE(c.data.packed);  // resolved from the source, never parsed
  EXPECT_EQ(parse(R"({"data": {"pack": true}})").data.pack, std::optional<bool>(true));
  EXPECT_EQ(parse(R"({"data": {"eos_token_id": 0}})").data.eos_token_id, std::optional<int64_t>(0));
  EXPECT_EQ(parse(R"({"data": {"eos_token_id": 2147483647}})").data.eos_token_id,
            std::optional<int64_t>(2147483647));
  EXPECT_EQ(parse(R"({"data": {}})").data.pack, std::nullopt);
}

TEST(TrainConfig, DataSectionShuffleAndSeed) {
  // Shuffled by default; data.seed absent until run_train gives it the top-level seed.
  const TrainConfig none = parse(R"({"seed": 7})");
  EXPECT_TRUE(none.data.shuffle);
  EXPECT_FALSE(none.data.seed.has_value());
  EXPECT_EQ(none.seed, 7u);
  const TrainConfig c = parse(R"({"data": {"shuffle": false, "seed": 0}})");
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.data.seed, std::optional<uint64_t>(0));
  EXPECT_EQ(parse(R"({"data": {"seed": 9223372036854775807}})").data.seed,
            std::optional<uint64_t>(9223372036854775807ULL));
  EXPECT_PARSE_ERROR(R"({"data": {"shuffle": 1}})", "data.shuffle", "expected true or false, got 1");
  EXPECT_PARSE_ERROR(R"({"data": {"seed": -1}})", "data.seed", "an integer >= 0, got -1");
  EXPECT_PARSE_ERROR(R"({"data": {"seed": "42"}})", "data.seed", "an integer >= 0");
  EXPECT_PARSE_ERROR(R"({"data": {"seed": 18446744073709551615}})", "data.seed");
}

TEST(TrainConfig, DataSectionBadValuesNameTheKey) {
  EXPECT_PARSE_ERROR(R"({"data": true})", "config.json: data: expected an object, got true");
  EXPECT_PARSE_ERROR(R"({"data": {"pack": 1}})", "data.pack", "expected true or false, got 1");
  EXPECT_PARSE_ERROR(R"({"data": {"pack": "yes"}})", "data.pack", "true or false");
  EXPECT_PARSE_ERROR(R"({"data": {"eos_token_id": -1}})", "data.eos_token_id", "an integer >= 0, got -1");
  EXPECT_PARSE_ERROR(R"({"data": {"eos_token_id": 2.5}})", "data.eos_token_id", "an integer >= 0");
  EXPECT_PARSE_ERROR(R"({"data": {"eos_token_id": "2"}})", "data.eos_token_id", "an integer >= 0");
  EXPECT_PARSE_ERROR(R"({"data": {"eos_token_id": 2147483648}})", "data.eos_token_id",
                     "an integer in [0, 2^31), got 2147483648");
  EXPECT_PARSE_ERROR(R"({"data": {"eos_token_id": 18446744073709551615}})", "data.eos_token_id");
  EXPECT_PARSE_ERROR(R"({"data": {"eos_token_id": "auto"}})", "data.eos_token_id", "\"auto\"");
}

TEST(TrainConfig, DataSectionUnknownKeysWarn) {
  std::vector<std::string> warnings;
  const TrainConfig c = parse(R"({"data": {"pack": true, "seq_length": 4096}})", &warnings);
  EXPECT_EQ(c.data.pack, std::optional<bool>(true));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "config.json: data.seq_length: unknown key, ignored");
}

// ---- keys that change the maths: implemented, or refused by name --------------------------

// Parses `text`, expecting no error; returns the warnings.
std::vector<std::string> warnings_of(const std::string& text, TrainConfig* out = nullptr) {
  std::vector<std::string> warnings;
  TrainConfig c = parse(text, &warnings);
  if (out) *out = c;
  return warnings;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string all;
  for (const std::string& l : lines) all += l + "\n";
  return all;
}

TEST(TrainConfig, AdamAndAdamWFollowDeepSpeedsAdamWMode) {
  TrainConfig c;
  // AdamW: decoupled weight decay, torch.optim.AdamW's default decay.
  EXPECT_TRUE(warnings_of(R"({"optimizer": {"type": "AdamW"}})", &c).empty());
  EXPECT_TRUE(c.optimizer.decoupled_weight_decay);
  EXPECT_EQ(c.optimizer.weight_decay, 0.01);
  // DeepSpeed's "Adam" defaults to adam_w_mode true: AdamW.
  EXPECT_TRUE(warnings_of(R"({"optimizer": {"type": "Adam", "params": {"weight_decay": 0.1}}})", &c).empty());
  EXPECT_TRUE(c.optimizer.decoupled_weight_decay);
  EXPECT_EQ(c.optimizer.weight_decay, 0.1);
  EXPECT_TRUE(warnings_of(R"({"optimizer": {"type": "adam", "params": {"adam_w_mode": true}}})", &c).empty());
  EXPECT_TRUE(c.optimizer.decoupled_weight_decay);
  // Adam with adam_w_mode false: torch.optim.Adam, L2 decay, whose default decay is 0.
  EXPECT_TRUE(warnings_of(R"({"optimizer": {"type": "ADAM", "params": {"adam_w_mode": false}}})", &c).empty());
  EXPECT_FALSE(c.optimizer.decoupled_weight_decay);
  EXPECT_EQ(c.optimizer.weight_decay, 0.0);
  warnings_of(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false, "weight_decay": 0.1}}})", &c);
  EXPECT_FALSE(c.optimizer.decoupled_weight_decay);
  EXPECT_EQ(c.optimizer.weight_decay, 0.1);
  // torch_adam only picks the implementation: accepted either way, the same maths.
  for (const char* v : {"true", "false"}) {
    const std::string text = str(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false, "torch_adam": )",
                                 v, "}}}");
    EXPECT_TRUE(warnings_of(text, &c).empty()) << text;
    EXPECT_FALSE(c.optimizer.decoupled_weight_decay) << text;
  }
  // AdamW with adam_w_mode false: DeepSpeed still runs AdamW, so it says so.
  const auto w = warnings_of(R"({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})", &c);
  EXPECT_TRUE(c.optimizer.decoupled_weight_decay);
  ASSERT_EQ(w.size(), 1u) << joined(w);
  EXPECT_NE(w[0].find("config.json: optimizer.params.adam_w_mode: false has no effect with optimizer.type \"AdamW\""),
            std::string::npos) << w[0];
  // amsgrad false is plain Adam; bias_correction true is what autosp does.
  EXPECT_TRUE(warnings_of(R"({"optimizer": {"type": "AdamW", "params": {"amsgrad": false, "bias_correction": true}}})")
                  .empty());
}

TEST(TrainConfig, OptimizerKeysThatChangeTheMathsAreRefusedOrTypeChecked) {
  EXPECT_PARSE_ERROR(R"({"optimizer": {"type": "AdamW", "params": {"amsgrad": true}}})",
                     "config.json: optimizer.params.amsgrad: true is not supported", "AMSGrad");
  EXPECT_PARSE_ERROR(R"({"optimizer": {"type": "Adam", "params": {"bias_correction": false}}})",
                     "config.json: optimizer.params.bias_correction: false is not supported");
  EXPECT_PARSE_ERROR(R"({"optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}})",
                     "config.json: optimizer.params.max_grad_norm:", "gradient_clipping");
  EXPECT_PARSE_ERROR(R"({"optimizer": {"type": "Adam", "params": {"torch_adam": "yes"}}})",
                     "config.json: optimizer.params.torch_adam: expected true or false, got \"yes\"");
  EXPECT_PARSE_ERROR(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": 0}}})",
                     "config.json: optimizer.params.adam_w_mode: expected true or false, got 0");
  EXPECT_PARSE_ERROR(R"({"optimizer": {"type": "AdamW", "params": {"amsgrad": "false"}}})",
                     "optimizer.params.amsgrad: expected true or false");
}

// comm: what the cuda backend's collectives run on (comm/device_comm.h), autosp's own key.
TEST(TrainConfig, CommChoosesTheDeviceCollectives) {
  TrainConfig c;
  EXPECT_TRUE(warnings_of("{}", &c).empty());
  EXPECT_EQ(c.comm, "auto");
  for (const char* v : {"auto", "nccl", "mpi"}) {
    EXPECT_TRUE(warnings_of(str(R"({"comm": ")", v, R"("})"), &c).empty()) << v;
    EXPECT_EQ(c.comm, v);
  }
}

TEST(TrainConfig, MixedPrecisionSaysWhatEachBackendRuns) {
  TrainConfig c;
  // Off: accepted silently, with DeepSpeed's documented keys of each section.
  EXPECT_TRUE(warnings_of(R"({"bf16": {"enabled": false, "immediate_grad_update": true},
                              "fp16": {"enabled": false, "auto_cast": false, "loss_scale": 0,
                                       "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2,
                                       "consecutive_hysteresis": false, "min_loss_scale": 1,
                                       "fp16_master_weights_and_grads": false},
                              "amp": {"enabled": false, "opt_level": "O1"},
                              "torch_autocast": {"enabled": false, "dtype": "bfloat16"}})", &c).empty());
  EXPECT_EQ(c.requested_precision, "fp32");
  EXPECT_TRUE(warnings_of(R"({"bf16": {}})", &c).empty());  // enabled defaults to false
  EXPECT_EQ(c.requested_precision, "fp32");

  struct Case {
    const char* text;
    const char* precision;
    const char* path;
  };
  for (const Case& k : {Case{R"({"bf16": {"enabled": true}})", "bf16", "bf16.enabled"},
                        Case{R"({"bfloat16": {"enabled": true}})", "bf16", "bfloat16.enabled"},
                        Case{R"({"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
                                          "loss_scale_window": 500, "hysteresis": 2, "min_loss_scale": 1}})",
                             "fp16", "fp16.enabled"},
                        Case{R"({"amp": {"enabled": true, "opt_level": "O2"}})", "amp", "amp.enabled"},
                        Case{R"({"torch_autocast": {"enabled": true, "dtype": "bfloat16"}})", "torch_autocast",
                             "torch_autocast.enabled"}}) {
    // No warning from the parse (no unknown-key noise for the section's other keys either):
    // what runs depends on the backend, which precision_warning is told.
    const auto w = warnings_of(k.text, &c);
    EXPECT_EQ(c.requested_precision, k.precision) << k.text;
    EXPECT_EQ(c.precision_key, k.path) << k.text;
    EXPECT_TRUE(w.empty()) << k.text << "\n" << joined(w);
    for (const char* backend : {"cpu", "cuda"}) {
      c.backend = backend;
      const std::optional<std::string> warning = train::precision_warning(c, "config.json");
      if (std::string_view(backend) == "cuda" && std::string_view(k.precision) == "bf16") {
        EXPECT_FALSE(warning) << *warning;  // the device-resident bf16 step runs it
        continue;
      }
      ASSERT_TRUE(warning) << k.text << " on " << backend;
      EXPECT_EQ(warning->rfind(str("config.json: ", k.path, ": true, but the ", backend), 0), 0u) << *warning;
      for (const char* part : {"fp32 compute", "fp32 master weights, gradients and optimizer state",
                               "numbers are those of an fp32 run"})
        EXPECT_NE(warning->find(part), std::string::npos) << *warning << "\nmissing: " << part;
      EXPECT_EQ(warning->find("without loss scaling") != std::string::npos, std::string_view(k.precision) != "bf16")
          << *warning;
    }
  }
  c = parse("{}");
  EXPECT_FALSE(train::precision_warning(c, "config.json"));  // fp32 asked, fp32 runs

  // "auto" is Hugging Face's: its --bf16 flag, off by default (AutoValuesResolveAsHuggingFace).
  EXPECT_EQ(parse(R"({"bf16": {"enabled": "auto"}})").requested_precision, "fp32");
  EXPECT_PARSE_ERROR(R"({"torch_autocast": {"enabled": "auto"}})",
                     "config.json: torch_autocast.enabled: expected true or false, got \"auto\"");
  EXPECT_PARSE_ERROR(R"({"fp16": true})", "config.json: fp16: expected an object, got true");
  EXPECT_PARSE_ERROR(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})",
                     "config.json: bf16.enabled and fp16.enabled are both true");
  EXPECT_PARSE_ERROR(R"({"fp16": {"enabled": true}, "amp": {"enabled": true}})",
                     "fp16.enabled and amp.enabled are both true");
  // A key that is not DeepSpeed's is still reported, with its path.
  const auto w = warnings_of(R"({"fp16": {"enabled": false, "loss_scaling": 0}})");
  ASSERT_EQ(w.size(), 1u) << joined(w);
  EXPECT_EQ(w[0], "config.json: fp16.loss_scaling: unknown key, ignored");
  // ... and one a typo away from a DeepSpeed key is an error (TypoedKeysAreErrors).
  EXPECT_PARSE_ERROR(R"({"fp16": {"enabled": false, "loss_scael": 0}})",
                     "config.json: fp16.loss_scael: unknown key; did you mean \"loss_scale\"?");
}

TEST(TrainConfig, DeepSpeedFeaturesThatChangeTheMathsAreRefusedByName) {
  EXPECT_PARSE_ERROR(R"({"sparse_attention": {"mode": "fixed", "block": 16}})",
                     "config.json: sparse_attention: not supported", "dense causal attention");
  EXPECT_PARSE_ERROR(R"({"progressive_layer_drop": {"enabled": true, "theta": 0.5, "gamma": 0.001}})",
                     "config.json: progressive_layer_drop.enabled: true is not supported", "layers");
  EXPECT_PARSE_ERROR(R"({"curriculum_learning": {"enabled": true, "curriculum_type": "seqlen"}})",
                     "config.json: curriculum_learning.enabled: true is not supported");
  EXPECT_PARSE_ERROR(R"({"data_efficiency": {"enabled": true}})",
                     "config.json: data_efficiency.enabled: true is not supported");
  // A sub-feature that switches on by itself is named by its own path.
  EXPECT_PARSE_ERROR(R"({"data_efficiency": {"data_routing": {"random_ltd": {"enabled": true}}}})",
                     "config.json: data_efficiency.data_routing.random_ltd.enabled: true is not supported");
  EXPECT_PARSE_ERROR(R"({"quantize_training": {"enabled": true}})",
                     "config.json: quantize_training.enabled: true is not supported");
  EXPECT_PARSE_ERROR(R"({"compression_training": {"weight_quantization": {"shared_parameters": {"enabled": true}}}})",
                     "config.json: compression_training.weight_quantization.shared_parameters.enabled: true is not "
                     "supported");
  EXPECT_PARSE_ERROR(R"({"elasticity": {"enabled": true, "max_train_batch_size": 64}})",
                     "config.json: elasticity.enabled: true is not supported", "batch size");
  EXPECT_PARSE_ERROR(R"({"communication_data_type": "fp16"})",
                     "config.json: communication_data_type: \"fp16\" is not supported", "fp32");
  EXPECT_PARSE_ERROR(R"({"communication_data_type": "BF16"})",
                     "config.json: communication_data_type: \"BF16\" is not supported");
  EXPECT_PARSE_ERROR(R"({"communication_data_type": "int8"})",
                     "config.json: communication_data_type: expected \"fp32\", \"fp16\" or \"bf16\", got \"int8\"");
  EXPECT_PARSE_ERROR(R"({"seq_parallel_communication_data_type": "bf16"})",
                     "config.json: seq_parallel_communication_data_type: \"bf16\" is not supported",
                     "sequence-parallel");
  EXPECT_PARSE_ERROR(R"({"data_types": {"grad_accum_dtype": "bf16"}})",
                     "config.json: data_types.grad_accum_dtype: \"bf16\" is not supported");
  EXPECT_PARSE_ERROR(R"({"progressive_layer_drop": {"enabled": "yes"}})",
                     "config.json: progressive_layer_drop.enabled: expected true or false");

  // Off, or fp32: what autosp does anyway, accepted silently.
  EXPECT_TRUE(warnings_of(R"({"progressive_layer_drop": {"enabled": false, "theta": 0.5},
                              "curriculum_learning": {"enabled": false},
                              "data_efficiency": {"enabled": false, "data_sampling": {"enabled": false}},
                              "quantize_training": {"enabled": false},
                              "elasticity": {"enabled": false},
                              "communication_data_type": "fp32",
                              "seq_parallel_communication_data_type": "FP32",
                              "data_types": {"grad_accum_dtype": "fp32"}})")
                  .empty());
  EXPECT_TRUE(warnings_of(R"({"communication_data_type": null, "data_types": {"grad_accum_dtype": null}})").empty());
}

TEST(TrainConfig, KeysThatCannotChangeTheNumbersAreSilentOffAndWarnedOn) {
  // Off (or DeepSpeed's defaults): no warnings.
  EXPECT_TRUE(warnings_of(R"({"wall_clock_breakdown": false, "memory_breakdown": false, "dump_state": false,
                              "flops_profiler": {"enabled": false, "profile_step": 1},
                              "tensorboard": {"enabled": false, "output_path": "tb/"},
                              "wandb": {"enabled": false}, "csv_monitor": {"enabled": false},
                              "comms_logger": {"enabled": false}, "prescale_gradients": false,
                              "gradient_predivide_factor": 1.0, "zero_allow_untested_optimizer": true})")
                  .empty());
  // On: each names itself and says it is ignored and cannot change the numbers.
  const auto w = warnings_of(R"({"wall_clock_breakdown": true, "memory_breakdown": true, "dump_state": true,
                                 "flops_profiler": {"enabled": true}, "tensorboard": {"enabled": true},
                                 "wandb": {"enabled": true}, "csv_monitor": {"enabled": true},
                                 "comms_logger": {"enabled": true}, "prescale_gradients": true,
                                 "gradient_predivide_factor": 2.0})");
  ASSERT_EQ(w.size(), 10u) << joined(w);
  for (const char* path : {"wall_clock_breakdown", "memory_breakdown", "dump_state", "flops_profiler.enabled",
                           "tensorboard.enabled", "wandb.enabled", "csv_monitor.enabled", "comms_logger.enabled"}) {
    const std::string prefix = str("config.json: ", path, ": true, but autosp does not implement it, ignored");
    EXPECT_EQ(std::count_if(w.begin(), w.end(), [&](const std::string& x) { return x.rfind(prefix, 0) == 0; }), 1)
        << prefix << "\n" << joined(w);
  }
  for (const char* prefix : {"config.json: prescale_gradients: true has no effect in autosp, ignored",
                             "config.json: gradient_predivide_factor: 2.0 has no effect in autosp, ignored"})
    EXPECT_EQ(std::count_if(w.begin(), w.end(), [&](const std::string& x) { return x.rfind(prefix, 0) == 0; }), 1)
        << prefix << "\n" << joined(w);
  EXPECT_PARSE_ERROR(R"({"wall_clock_breakdown": "yes"})", "config.json: wall_clock_breakdown: expected true or false");
  EXPECT_PARSE_ERROR(R"({"tensorboard": {"enabled": 1}})", "config.json: tensorboard.enabled: expected true or false");
  EXPECT_PARSE_ERROR(R"({"gradient_predivide_factor": 0})", "config.json: gradient_predivide_factor: expected a number > 0");
  EXPECT_PARSE_ERROR(R"({"zero_allow_untested_optimizer": 1})",
                     "config.json: zero_allow_untested_optimizer: expected true or false");
}

TEST(TrainConfig, TotalStepsBelowWarmupWarns) {
  std::vector<std::string> warnings;
  parse(R"({"scheduler": {"type": "WarmupDecayLR",
                          "params": {"warmup_num_steps": 100, "total_num_steps": 50}}})",
        &warnings);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("scheduler.params.total_num_steps: 50 is less than warmup_num_steps 100"),
            std::string::npos)
      << warnings[0];
}

// ---- batch resolution (DeepSpeed's _set_batch_related_parameters) --------------------------

struct Batch {
  int64_t batch, micro, accum;
};

Batch resolve(const std::string& text, int dp) {
  TrainConfig c = parse(text);
  resolve_batch(c, dp, "config.json");
  return {*c.train_batch_size, *c.train_micro_batch_size_per_gpu, *c.gradient_accumulation_steps};
}

std::string resolve_error(const std::string& text, int dp) {
  try {
    resolve(text, dp);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

void expect_batch(const Batch& got, int64_t batch, int64_t micro, int64_t accum) {
  EXPECT_EQ(got.batch, batch);
  EXPECT_EQ(got.micro, micro);
  EXPECT_EQ(got.accum, accum);
}

TEST(TrainConfig, BatchResolution) {
  // All three: checked only.
  expect_batch(resolve(R"({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 2,
                           "gradient_accumulation_steps": 3})", 4), 24, 2, 3);
  // batch + micro -> accumulation = 24 / 2 / 4.
  expect_batch(resolve(R"({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 2})", 4),
               24, 2, 3);
  // batch + accumulation -> micro = 24 / 4 / 3.
  expect_batch(resolve(R"({"train_batch_size": 24, "gradient_accumulation_steps": 3})", 4),
               24, 2, 3);
  // micro + accumulation -> batch = 2 * 3 * 4.
  expect_batch(resolve(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3})", 4),
               24, 2, 3);
  // batch only -> accumulation 1, micro = 24 / 4.
  expect_batch(resolve(R"({"train_batch_size": 24})", 4), 24, 6, 1);
  // micro only -> accumulation 1, batch = 2 * 4.
  expect_batch(resolve(R"({"train_micro_batch_size_per_gpu": 2})", 4), 8, 2, 1);
}

TEST(TrainConfig, BatchResolutionErrors) {
  std::string m = resolve_error(R"({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 2,
                                    "gradient_accumulation_steps": 2})", 4);
  EXPECT_NE(m.find("config.json: train_batch_size (24) must equal train_micro_batch_size_per_gpu (2)"
                   " x gradient_accumulation_steps (2) x data-parallel size (4) = 16"),
            std::string::npos) << m;
  // 10 / 3 / 1 = 3 by integer division, as DeepSpeed, and then 10 != 9.
  m = resolve_error(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3})", 1);
  EXPECT_NE(m.find("train_batch_size (10) must equal"), std::string::npos) << m;
  EXPECT_NE(m.find("derived gradient_accumulation_steps"), std::string::npos) << m;
  // 2 / 4 = 0 micro batch.
  m = resolve_error(R"({"train_batch_size": 2})", 4);
  EXPECT_NE(m.find("train_batch_size (2) is too small"), std::string::npos) << m;
  EXPECT_NE(m.find("train_micro_batch_size_per_gpu = "), std::string::npos) << m;
  m = resolve_error(R"({"gradient_accumulation_steps": 2})", 1);
  EXPECT_NE(m.find("train_batch_size or train_micro_batch_size_per_gpu must be set"),
            std::string::npos) << m;
}

// ---- files ----------------------------------------------------------------------------------

std::string write_temp(const std::string& text) {
  char name[] = "/tmp/autosp_config_test_XXXXXX";
  const int fd = mkstemp(name);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(name) << text;
  return name;
}

std::string load_error(const std::string& path) {
  try {
    load_train_config(path, nullptr);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(TrainConfig, LoadFile) {
  const std::string path = write_temp(R"({"train_micro_batch_size_per_gpu": 3, "extra": 1})");
  std::vector<std::string> warnings;
  const TrainConfig c = load_train_config(path, &warnings);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 3);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], path + ": extra: unknown key, ignored");
  std::remove(path.c_str());
}

TEST(TrainConfig, FileErrorsNameThePath) {
  std::string m = load_error("/nonexistent/ds_config.json");
  EXPECT_NE(m.find("/nonexistent/ds_config.json: cannot open the config file"), std::string::npos) << m;

  std::string path = write_temp(R"({"train_batch_size": 8,})");
  m = load_error(path);
  EXPECT_NE(m.find(path + ": invalid JSON"), std::string::npos) << m;
  std::remove(path.c_str());

  // DeepSpeed rejects duplicate keys; nlohmann alone would keep the last one silently.
  path = write_temp(R"({"optimizer": {"type": "AdamW", "params": {"lr": 1, "lr": 2}}})");
  m = load_error(path);
  EXPECT_NE(m.find(path + ": duplicate key \"lr\""), std::string::npos) << m;
  std::remove(path.c_str());

  path = write_temp(R"({"gradient_clipping": "big"})");
  m = load_error(path);
  EXPECT_NE(m.find(path + ": gradient_clipping: expected a number >= 0, got \"big\""),
            std::string::npos) << m;
  std::remove(path.c_str());
}

// ---- zero_optimization: DeepSpeed's keys ---------------------------------------------------

TEST(TrainConfig, ZeroKeysTakeDeepSpeedsMeaningAndDefaults) {
  TrainConfig c = parse(R"({"zero_optimization": {"stage": 1}})");
  // deepspeed/runtime/zero/config.py's defaults.
  EXPECT_EQ(c.zero.stage, 1);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero.allgather_bucket_size, 500000000);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 50000000);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 100000);
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_TRUE(c.zero.contiguous_gradients);
  // DeepSpeed configs write sizes as floats (2e8); accepted when integral.
  std::vector<std::string> warnings = warnings_of(R"({"zero_optimization": {"stage": 1,
      "reduce_bucket_size": 2e8, "allgather_bucket_size": 1000, "overlap_comm": false,
      "contiguous_gradients": true, "reduce_scatter": true, "allgather_partitions": true,
      "round_robin_gradients": false, "sub_group_size": 1e9, "stage3_prefetch_bucket_size": 5e7,
      "stage3_param_persistence_threshold": 1e5, "stage3_max_live_parameters": 1e9,
      "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": true,
      "offload_optimizer": {"device": "none"}, "offload_param": {"device": "none", "pin_memory": true},
      "zero_quantized_weights": false, "zero_quantized_gradients": false, "zero_hpz_partition_size": 1}})", &c);
  EXPECT_TRUE(warnings.empty()) << joined(warnings);
  EXPECT_EQ(c.zero.reduce_bucket_size, 200000000);
  EXPECT_EQ(c.zero.allgather_bucket_size, 1000);
  // contiguous_gradients false cannot be honoured: warned by name.
  warnings = warnings_of(R"({"zero_optimization": {"stage": 1, "contiguous_gradients": false}})");
  ASSERT_EQ(warnings.size(), 1u) << joined(warnings);
  EXPECT_NE(warnings[0].find("zero_optimization.contiguous_gradients: false has no effect"), std::string::npos);
}

// Stage 3's knobs without a counterpart in autosp are named when given.
TEST(TrainConfig, StageThreeKnobsAutospDoesNotHaveAreWarnedByName) {
  TrainConfig c;
  std::vector<std::string> warnings = warnings_of(R"({"zero_optimization": {"stage": 3,
      "stage3_prefetch_bucket_size": 1000, "stage3_param_persistence_threshold": 1e4,
      "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9}})", &c);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 1000);
  ASSERT_EQ(warnings.size(), 3u) << joined(warnings);
  EXPECT_NE(warnings[0].find("zero_optimization.stage3_param_persistence_threshold: ignored: autosp's stage 3 "
                             "shards every parameter"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[1].find("zero_optimization.stage3_max_live_parameters: ignored"), std::string::npos);
  EXPECT_NE(warnings[2].find("zero_optimization.stage3_max_reuse_distance: ignored"), std::string::npos);
  // Threshold 0 is what autosp does: no warning; under stage 2 none of them matter.
  EXPECT_TRUE(warnings_of(R"({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})").empty());
  EXPECT_TRUE(warnings_of(R"({"zero_optimization": {"stage": 2, "stage3_max_live_parameters": 1e9}})").empty());
}

TEST(TrainConfig, ZeroKeysOutOfRangeOrOffloadAreErrors) {
  EXPECT_PARSE_ERROR(R"({"zero_optimization": {"reduce_bucket_size": 0}})",
                     "config.json: zero_optimization.reduce_bucket_size: expected an integer >= 1, got 0");
  EXPECT_PARSE_ERROR(R"({"zero_optimization": {"allgather_bucket_size": 2.5}})",
                     "zero_optimization.allgather_bucket_size: expected an integer >= 1, got 2.5");
  EXPECT_PARSE_ERROR(R"({"zero_optimization": {"overlap_comm": "yes"}})",
                     "zero_optimization.overlap_comm: expected true or false");
  EXPECT_PARSE_ERROR(R"({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}})",
                     "config.json: zero_optimization.offload_optimizer.device: \"cpu\" is not supported on the "
                     "CPU backend", "nothing to offload", "\"none\"");
  EXPECT_PARSE_ERROR(R"({"zero_optimization": {"offload_param": {"device": "nvme", "nvme_path": "/x"}}})",
                     "zero_optimization.offload_param.device: \"nvme\" is not supported");
  EXPECT_PARSE_ERROR(R"({"zero_optimization": {"offload_param": {"device": "gpu"}}})",
                     "zero_optimization.offload_param.device: expected \"none\", \"cpu\" or \"nvme\"");
  EXPECT_PARSE_ERROR(R"({"zero_optimization": {"cpu_offload": true}})", "zero_optimization.cpu_offload");
  EXPECT_PARSE_ERROR(R"({"zero_optimization": {"zero_quantized_gradients": true}})",
                     "zero_optimization.zero_quantized_gradients: true is not supported");
  EXPECT_PARSE_ERROR(R"({"zero_optimization": {"zero_hpz_partition_size": 8}})",
                     "zero_optimization.zero_hpz_partition_size");
  // "auto" only where Hugging Face fills it in.
  EXPECT_PARSE_ERROR(R"({"zero_optimization": {"allgather_bucket_size": "auto"}})",
                     "zero_optimization.allgather_bucket_size: expected an integer >= 1, got \"auto\"",
                     "give a value");
}

// ---- "auto": Hugging Face's integration -----------------------------------------------------

TEST(TrainConfig, AutoValuesResolveAsHuggingFaceAndSaySo) {
  TrainConfig c;
  std::vector<std::string> warnings = warnings_of(R"({
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": 10}},
    "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 1, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto"}
  })", &c);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.optimizer.lr, 5e-5);
  EXPECT_EQ(c.optimizer.beta1, 0.9);
  EXPECT_EQ(c.optimizer.beta2, 0.999);
  EXPECT_EQ(c.optimizer.eps, 1e-8);
  EXPECT_EQ(c.optimizer.weight_decay, 0.0);
  EXPECT_EQ(c.scheduler.warmup_min_lr, 0.0);
  EXPECT_EQ(c.scheduler.warmup_max_lr, 5e-5);
  EXPECT_EQ(c.requested_precision, "fp32");
  const std::string all = joined(warnings);
  for (const char* part : {"gradient_clipping: \"auto\" -> 1.0", "optimizer.params.lr: \"auto\" -> 5e-05",
                           "optimizer.params.betas: \"auto\" -> [0.9,0.999]",
                           "optimizer.params.weight_decay: \"auto\" -> 0.0",
                           "scheduler.params.warmup_max_lr: \"auto\" -> 5e-05", "bf16.enabled: \"auto\" -> false"})
    EXPECT_NE(all.find(part), std::string::npos) << "missing " << part << " in\n" << all;
  // The batch: from the others, with DP 3; each "auto" key is reported.
  std::vector<std::string> notes;
  resolve_batch(c, 3, "config.json", &notes);
  EXPECT_EQ(c.train_batch_size, 6);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_NE(notes[0].find("config.json: train_batch_size: \"auto\" -> 6"), std::string::npos) << notes[0];
  EXPECT_NE(notes[1].find("gradient_accumulation_steps: \"auto\" -> 1"), std::string::npos) << notes[1];
  // ZeRO's sizes from the hidden size, as transformers' trainer_config_finalize.
  notes.clear();
  resolve_model_auto(c, 64, "config.json", &notes);
  EXPECT_EQ(c.zero.reduce_bucket_size, 64 * 64);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, int64_t(0.9 * 64 * 64));
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 640);
  ASSERT_EQ(notes.size(), 3u);
  EXPECT_NE(notes[0].find("zero_optimization.reduce_bucket_size: \"auto\" -> 4096"), std::string::npos);

  // Everything "auto": Hugging Face's per_device_train_batch_size (8) and accumulation (1).
  c = parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
               "gradient_accumulation_steps": "auto"})");
  resolve_batch(c, 2, "config.json");
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.train_batch_size, 16);
  // A number given with "auto" for the rest: derived from it.
  c = parse(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 2})");
  resolve_batch(c, 2, "config.json");
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 2);
}

TEST(TrainConfig, AutoWhereHuggingFaceNeedsItsOwnArgumentsIsAnError) {
  EXPECT_PARSE_ERROR(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}}})",
                     "scheduler.params.total_num_steps: expected an integer >= 1, got \"auto\"",
                     "Hugging Face's Trainer");
  EXPECT_PARSE_ERROR(R"({"steps_per_print": "auto"})", "steps_per_print", "\"auto\"");
}

// DeepSpeed's AutoSP example (DeepSpeedExamples' benchmark config, with "auto" as the issue
// quotes it) parses: bf16 is recorded (precision_warning then says what each backend runs),
// wall_clock_breakdown false is silent.
TEST(TrainConfig, DeepSpeedAutoSpExampleParses) {
  TrainConfig c;
  const std::vector<std::string> warnings = warnings_of(R"({
    "bf16": {"enabled": true},
    "zero_optimization": {"stage": 1},
    "gradient_accumulation_steps": 1,
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": 1,
    "wall_clock_breakdown": false,
    "sequence_parallel_size": 2,
    "compile": {"deepcompile": true, "passes": ["autosp"]}
  })", &c);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.requested_precision, "bf16");
  EXPECT_EQ(c.steps_per_print, 2000);
  ASSERT_EQ(warnings.size(), 1u) << joined(warnings);  // clipping "auto" -> 1.0
  resolve_batch(c, 2, "config.json");
  EXPECT_EQ(c.train_batch_size, 2);
}

}  // namespace
}  // namespace autosp::train
