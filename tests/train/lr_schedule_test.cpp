// LR schedules against values worked out by hand from DeepSpeed's lr_schedules.py formulas.
// Remember the step convention (lr_schedule.h): optimizer step k runs with DeepSpeed's
// last_batch_iteration i = k - 1, and n = max(2, warmup_num_steps).
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "train/lr_schedule.h"

namespace autosp::train {
namespace {

SchedulerConfig warmup(SchedulerType type, WarmupType warmup_type, int64_t warmup_num_steps) {
  SchedulerConfig c;
  c.type = type;
  c.warmup_type = warmup_type;
  c.warmup_num_steps = warmup_num_steps;
  return c;
}

TEST(LrSchedule, NoSchedulerIsConstant) {
  SchedulerConfig c;
  for (int64_t k : {0, 1, 7, 100000}) EXPECT_EQ(lr_at(c, 3e-4, k), 3e-4);
}

TEST(LrSchedule, WarmupLRLinear) {
  SchedulerConfig c = warmup(SchedulerType::kWarmupLR, WarmupType::kLinear, 10);
  c.warmup_min_lr = 0.0;
  c.warmup_max_lr = 0.01;
  EXPECT_EQ(lr_at(c, 1.0, 0), 0.0);               // i = -1: min_lr (set at construction)
  EXPECT_EQ(lr_at(c, 1.0, 1), 0.0);               // i = 0: gamma = 0 / 10
  EXPECT_DOUBLE_EQ(lr_at(c, 1.0, 2), 0.001);      // i = 1: 0.01 * 1/10
  EXPECT_DOUBLE_EQ(lr_at(c, 1.0, 6), 0.005);      // i = 5
  EXPECT_DOUBLE_EQ(lr_at(c, 1.0, 10), 0.009);     // i = 9, the last warmup step
  EXPECT_EQ(lr_at(c, 1.0, 11), 0.01);             // i = 10 >= n: gamma = 1
  EXPECT_EQ(lr_at(c, 1.0, 1000000), 0.01);
}

TEST(LrSchedule, WarmupLRLogAndDefaultMaxIsBaseLr) {
  SchedulerConfig c = warmup(SchedulerType::kWarmupLR, WarmupType::kLog, 100);
  c.warmup_min_lr = 0.001;
  // warmup_max_lr unset: DeepSpeed's WarmupLR takes the optimizer's lr (here 0.002).
  EXPECT_EQ(lr_at(c, 0.002, 0), 0.001);               // i = -1: min_lr
  EXPECT_EQ(lr_at(c, 0.002, 1), 0.001);               // i = 0: log(1) = 0
  EXPECT_DOUBLE_EQ(lr_at(c, 0.002, 10), 0.0015);      // i = 9: log(10) / log(100) = 1/2
  EXPECT_DOUBLE_EQ(lr_at(c, 0.002, 100), 0.002);      // i = 99: log(100) / log(100) = 1
  EXPECT_EQ(lr_at(c, 0.002, 101), 0.002);             // after warmup
  // Between: i = 31, gamma = log(32) / log(100) = 5 log 2 / (2 log 10).
  EXPECT_DOUBLE_EQ(lr_at(c, 0.002, 32),
                   0.001 + 0.001 * (5 * std::log(2.0) / (2 * std::log(10.0))));
}

TEST(LrSchedule, WarmupNumStepsBelowTwoBehavesAsTwo) {
  SchedulerConfig c = warmup(SchedulerType::kWarmupLR, WarmupType::kLinear, 1);
  c.warmup_max_lr = 0.4;
  EXPECT_EQ(lr_at(c, 1.0, 1), 0.0);   // i = 0: 0 / 2
  EXPECT_EQ(lr_at(c, 1.0, 2), 0.2);   // i = 1: 1 / 2 (n = max(2, 1))
  EXPECT_EQ(lr_at(c, 1.0, 3), 0.4);
}

TEST(LrSchedule, WarmupDecayLRLinear) {
  SchedulerConfig c = warmup(SchedulerType::kWarmupDecayLR, WarmupType::kLinear, 10);
  c.warmup_max_lr = 0.01;
  c.total_num_steps = 110;
  EXPECT_EQ(lr_at(c, 1.0, 0), 0.0);
  EXPECT_DOUBLE_EQ(lr_at(c, 1.0, 6), 0.005);      // warmup as WarmupLR: i = 5
  EXPECT_EQ(lr_at(c, 1.0, 11), 0.01);             // i = 10: (110 - 10) / (110 - 10) = 1
  EXPECT_DOUBLE_EQ(lr_at(c, 1.0, 61), 0.005);     // i = 60: (110 - 60) / 100 = 1/2
  EXPECT_DOUBLE_EQ(lr_at(c, 1.0, 101), 0.001);    // i = 100: 10 / 100
  EXPECT_EQ(lr_at(c, 1.0, 111), 0.0);             // i = 110: 0
  EXPECT_EQ(lr_at(c, 1.0, 500), 0.0);             // past the end: max(0, negative)
}

TEST(LrSchedule, WarmupDecayLRDefaultMaxIsDeepSpeeds0001) {
  // WarmupDecayLR's own default warmup_max_lr is 0.001, whatever the optimizer's lr.
  SchedulerConfig c = warmup(SchedulerType::kWarmupDecayLR, WarmupType::kLinear, 10);
  c.total_num_steps = 20;
  EXPECT_DOUBLE_EQ(lr_at(c, 0.5, 6), 0.0005);    // i = 5: 0.001 * 5 / 10
  EXPECT_DOUBLE_EQ(lr_at(c, 0.5, 16), 0.0005);   // i = 15: 0.001 * (20 - 15) / 10
}

TEST(LrSchedule, WarmupDecayLRTotalNotAfterWarmup) {
  // total <= n: the denominator is max(1, total - n) = 1.
  SchedulerConfig c = warmup(SchedulerType::kWarmupDecayLR, WarmupType::kLinear, 10);
  c.warmup_max_lr = 0.01;
  c.total_num_steps = 5;
  EXPECT_EQ(lr_at(c, 1.0, 11), 0.0);  // i = 10: max(0, (5 - 10) / 1)
}

TEST(LrSchedule, WarmupCosineLRLinearWarmup) {
  SchedulerConfig c = warmup(SchedulerType::kWarmupCosineLR, WarmupType::kLinear, 10);
  c.total_num_steps = 110;
  c.warmup_min_ratio = 0.1;
  c.cos_min_ratio = 0.0;
  const double base = 0.01;
  EXPECT_EQ(lr_at(c, base, 0), 0.0);                 // i = -1: DeepSpeed returns 0 * lr
  EXPECT_DOUBLE_EQ(lr_at(c, base, 1), 0.001);        // i = 0: ratio = 0.1
  EXPECT_DOUBLE_EQ(lr_at(c, base, 6), 0.0055);       // i = 5: 0.1 + 0.5 * 0.9 = 0.55
  EXPECT_DOUBLE_EQ(lr_at(c, base, 10), 0.0091);      // i = 9: 0.1 + 0.9 * 0.9 = 0.91
  // i = 10: real_last_step = 1, real_total = 100, p = 0.01: ratio = (1 + cos(0.01 pi)) / 2.
  EXPECT_DOUBLE_EQ(lr_at(c, base, 11), base * (1 + std::cos(0.01 * std::numbers::pi)) / 2);
  // i = 59: real_last_step = 59 - 10 + 1 = 50, p = 1/2: ratio = (1 + 0) / 2.
  EXPECT_NEAR(lr_at(c, base, 60), 0.005, 1e-18);
  EXPECT_NEAR(lr_at(c, base, 110), 0.0, 1e-18);      // i = 109: p = 1, ratio = 0
  EXPECT_NEAR(lr_at(c, base, 5000), 0.0, 1e-18);     // p clamped to 1: stays at the floor
}

TEST(LrSchedule, WarmupCosineLRFloorAndLogWarmup) {
  SchedulerConfig c = warmup(SchedulerType::kWarmupCosineLR, WarmupType::kLog, 100);
  c.total_num_steps = 300;
  c.cos_min_ratio = 0.1;  // warmup_min_ratio stays at its default 0
  const double base = 0.01;
  EXPECT_EQ(lr_at(c, base, 1), 0.0);                  // i = 0: log(1) = 0
  EXPECT_DOUBLE_EQ(lr_at(c, base, 10), 0.005);        // i = 9: log(10) / log(100) = 1/2
  // i = 149: real_last_step = 50, real_total = 200, p = 1/4:
  // ratio = 0.1 + 0.9 (1 + cos(pi / 4)) / 2 = 0.1 + 0.9 (1 + sqrt(2) / 2) / 2.
  EXPECT_DOUBLE_EQ(lr_at(c, base, 150), base * (0.1 + 0.9 * (1 + std::sqrt(2.0) / 2) / 2));
  EXPECT_DOUBLE_EQ(lr_at(c, base, 300), base * 0.1);  // i = 299: p = 1
  EXPECT_DOUBLE_EQ(lr_at(c, base, 9000), base * 0.1); // clamped, not oscillating back up
}

TEST(LrSchedule, WarmupCosineLRDefaults) {
  // DeepSpeed's class defaults: warmup_min_ratio 0, warmup_num_steps 1000 (log),
  // cos_min_ratio 0.0001.
  SchedulerConfig c;
  c.type = SchedulerType::kWarmupCosineLR;
  c.total_num_steps = 2000;
  EXPECT_DOUBLE_EQ(lr_at(c, 1.0, 1000), 1.0);         // i = 999: log(1000) / log(1000)
  EXPECT_DOUBLE_EQ(lr_at(c, 1.0, 2000), 0.0001);      // i = 1999: p = 1
}

}  // namespace
}  // namespace autosp::train
