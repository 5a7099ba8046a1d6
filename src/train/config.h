// The training config: a DeepSpeed JSON file, read with DeepSpeed's key names, defaults and
// batch-size rules (deepspeed/runtime/config.py), restricted to what autosp implements.
//
//   train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps
//                         integers >= 1; any two (or one of the first two) determine the rest
//                         (resolve_batch)
//   gradient_clipping     number >= 0, 0 = off (default 0)
//   optimizer             {type: "AdamW" (any case), params: {lr, betas: [b1, b2], eps,
//                         weight_decay}} with torch.optim.AdamW's defaults; absent = AdamW
//   scheduler             {type: WarmupLR | WarmupDecayLR | WarmupCosineLR, params: {...}}
//                         (see lr_schedule.h); absent = constant lr
//   compile               {deepcompile: bool, passes: [ "z1" | "z3" | "autosp" ... ],
//                         checkpoint: "none" | "full" | "sac" (passes/checkpoint.h; default
//                         sac with autosp, else none)}
//   sequence_parallel_size integer >= 1 (default 1)
//   zero_optimization     {stage: 0..3} (or DeepSpeed's legacy bool); autosp runs 0 and 1
//   steps_per_print       integer >= 1 (default 10, as DeepSpeed)
//   seed                  integer >= 0 (autosp's own key; default 42)
//
// A value of the wrong type or out of range is a UserError naming the file and key path,
// e.g. `config.json: optimizer.params.betas: expected an array of 2 numbers, got "x"`.
// A key autosp does not know is not an error (DeepSpeed configs carry many): it yields a
// warning naming the key path, returned to the caller.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/adamw.h"
#include "train/lr_schedule.h"

namespace autosp::train {

struct CompileConfig {
  bool deepcompile = false;
  std::vector<std::string> passes;  // in the order given
  // compile.checkpoint: "none", "full" or "sac"; absent: sac with the autosp pass, else none.
  std::optional<std::string> checkpoint;
};

struct TrainConfig {
  // As given; resolve_batch fills in the missing ones and checks
  // train_batch_size == micro x accumulation x data-parallel size.
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> train_micro_batch_size_per_gpu;
  std::optional<int64_t> gradient_accumulation_steps;
  double gradient_clipping = 0.0;  // max global grad norm; 0 = no clipping
  AdamWParams optimizer;           // optimizer.params (the type is always AdamW)
  SchedulerConfig scheduler;
  CompileConfig compile;
  int64_t sequence_parallel_size = 1;
  int zero_stage = 0;  // 0 or 1 (2 and 3 are rejected when parsing)
  int64_t steps_per_print = 10;
  uint64_t seed = 42;
};

// Reads a DeepSpeed config object. `source` names it in messages (usually the file path).
// Unknown keys are appended to *warnings (if not null) as "<source>: <key path>: ...".
TrainConfig parse_train_config(const nlohmann::json& json, const std::string& source,
                               std::vector<std::string>* warnings);

// Reads and parses the file at `path`; unreadable files, invalid JSON and duplicate keys
// (which DeepSpeed also rejects) are UserErrors naming the path.
TrainConfig load_train_config(const std::string& path, std::vector<std::string>* warnings);

// DeepSpeed's _set_batch_related_parameters + _batch_assertion with world size = dp_size
// (data-parallel replicas; the ranks of one sequence-parallel group share a batch):
//   all three given                 -> only checked
//   batch + micro                   -> accumulation = batch / micro / dp   (integer division)
//   batch + accumulation            -> micro = batch / dp / accumulation
//   micro + accumulation            -> batch = micro * accumulation * dp
//   batch only                      -> accumulation = 1, micro = batch / dp
//   micro only                      -> accumulation = 1, batch = micro * dp
//   neither batch nor micro         -> UserError
// then every value must be >= 1 and batch == micro * accumulation * dp, else a UserError.
void resolve_batch(TrainConfig& config, int dp_size, const std::string& source);

}  // namespace autosp::train
