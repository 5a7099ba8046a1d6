// Learning-rate schedules, reproducing DeepSpeed's deepspeed/runtime/lr_schedules.py
// (WarmupLR, WarmupDecayLR, WarmupCosineLR; formulas, defaults and step counting as in
// deepspeedai/DeepSpeed master, 2025) as a pure function of the step.
//
// Step convention. DeepSpeed builds the scheduler with last_batch_iteration = -1, which
// already writes get_lr() into the optimizer, and the engine calls scheduler.step()
// (last_batch_iteration += 1) after every optimizer step. So optimizer step k (0-based) runs
// with DeepSpeed's get_lr() at last_batch_iteration = k - 1. autosp calls lr_at(config,
// base_lr, k) for optimizer step k = 0, 1, 2, ... before applying that step. Consequences
// kept on purpose: at k = 0, WarmupLR / WarmupDecayLR give warmup_min_lr and WarmupCosineLR
// gives 0; the log warmup also gives its minimum at k = 1 (log(0 + 1) = 0).
//
// With n = max(2, warmup_num_steps) and i = k - 1 (= last_batch_iteration):
//   warmup gamma (i < n):  log: log(i + 1) / log(n);  linear: i / n
//   WarmupLR:        lr = min_lr + (max_lr - min_lr) * gamma, gamma = 1 after warmup
//   WarmupDecayLR:   as WarmupLR, after warmup gamma = max(0, (T - i) / max(1, T - n))
//   WarmupCosineLR:  lr = base_lr * ratio; warmup ratio = min_ratio + gamma * (1 - min_ratio);
//                    after: p = min(1, (i - n + 1) / max(1, T - n)),
//                    ratio = max(0, cos_min_ratio + (1 - cos_min_ratio) (1 + cos(pi p)) / 2)
//   (T = total_num_steps, base_lr = optimizer.params.lr.)
#pragma once
#include <cstdint>
#include <optional>

namespace autosp::train {

enum class SchedulerType { kNone, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };
enum class WarmupType { kLog, kLinear };

// scheduler.params, with DeepSpeed's names and its class defaults.
struct SchedulerConfig {
  SchedulerType type = SchedulerType::kNone;  // kNone: constant base lr
  // WarmupLR, WarmupDecayLR.
  double warmup_min_lr = 0.0;
  // Unset: WarmupLR uses the optimizer's lr, WarmupDecayLR 0.001 (DeepSpeed's defaults).
  std::optional<double> warmup_max_lr;
  // All three. Positive; values below 2 behave as 2, as in DeepSpeed.
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::kLog;
  // WarmupDecayLR, WarmupCosineLR (required there).
  int64_t total_num_steps = 0;
  // WarmupCosineLR.
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 0.0001;
};

// The learning rate of optimizer step `step` (0-based, see above). base_lr is
// optimizer.params.lr.
double lr_at(const SchedulerConfig& config, double base_lr, int64_t step);

// "WarmupLR", ... (DeepSpeed's spelling), "none" for kNone.
const char* scheduler_type_name(SchedulerType type);

}  // namespace autosp::train
