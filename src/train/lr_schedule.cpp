#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "util/error.h"

namespace autosp::train {

namespace {

// DeepSpeed's _get_gamma / warmup ratio during warmup (i < n); i >= 0.
double warmup_gamma(WarmupType type, int64_t i, int64_t n) {
  if (type == WarmupType::kLog) {
    const double inverse_log_warm_up = 1.0 / std::log(static_cast<double>(n));
    return inverse_log_warm_up * std::log(static_cast<double>(i + 1));
  }
  return static_cast<double>(i) / static_cast<double>(n);
}

}  // namespace

double lr_at(const SchedulerConfig& c, double base_lr, int64_t step) {
  AUTOSP_CHECK(step >= 0, "lr_at: step is 0-based, got ", step);
  if (c.type == SchedulerType::kNone) return base_lr;
  AUTOSP_CHECK(c.warmup_num_steps > 0, "lr_at: warmup_num_steps = ", c.warmup_num_steps);
  const int64_t i = step - 1;  // DeepSpeed's last_batch_iteration
  const int64_t n = std::max<int64_t>(2, c.warmup_num_steps);
  const int64_t total = c.total_num_steps;

  if (c.type == SchedulerType::kWarmupCosineLR) {
    if (i < 0) return 0.0;  // get_lr() before the first scheduler.step(): org_lr * 0.0
    double ratio;
    if (i < n) {
      ratio = warmup_gamma(c.warmup_type, i, n);
      ratio = c.warmup_min_ratio + ratio * (1.0 - c.warmup_min_ratio);
    } else {
      const double real_last_step = static_cast<double>(i - n + 1);
      const double real_total_steps = static_cast<double>(std::max<int64_t>(1, total - n));
      const double progress = std::min(1.0, real_last_step / real_total_steps);
      ratio = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
      ratio = std::max(0.0, c.cos_min_ratio + (1.0 - c.cos_min_ratio) * ratio);
    }
    return base_lr * ratio;
  }

  const double min_lr = c.warmup_min_lr;
  const double max_lr = c.warmup_max_lr.value_or(
      c.type == SchedulerType::kWarmupLR ? base_lr : 0.001);
  if (i < 0) return min_lr;  // WarmupLR.get_lr() before the first scheduler.step()
  const double delta_lr = max_lr - min_lr;
  double gamma;
  if (i < n) {
    gamma = warmup_gamma(c.warmup_type, i, n);
  } else if (c.type == SchedulerType::kWarmupLR) {
    gamma = 1.0;
  } else {
    AUTOSP_CHECK(c.type == SchedulerType::kWarmupDecayLR);
    gamma = std::max(0.0, static_cast<double>(total - i) /
                              std::max(1.0, static_cast<double>(total - n)));
  }
  return min_lr + delta_lr * gamma;
}

const char* scheduler_type_name(SchedulerType type) {
  switch (type) {
    case SchedulerType::kNone: return "none";
    case SchedulerType::kWarmupLR: return "WarmupLR";
    case SchedulerType::kWarmupDecayLR: return "WarmupDecayLR";
    case SchedulerType::kWarmupCosineLR: return "WarmupCosineLR";
  }
  internal_error("scheduler_type_name: bad SchedulerType ", static_cast<int>(type));
}

}  // namespace autosp::train
