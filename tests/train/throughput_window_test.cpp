// train::ThroughputWindow, the step line's tok/s: tokens over the seconds of the last N steps.
#include "train/throughput_window.h"

#include <gtest/gtest.h>

namespace autosp::train {
namespace {

TEST(ThroughputWindowTest, RateOverTheStepsSoFarThenTheLastN) {
  ThroughputWindow w(3);
  EXPECT_EQ(w.tokens_per_s(), 0);
  EXPECT_EQ(w.steps(), 0);
  // Per step 1000, 10000, 2000 tok/s (1000 tokens in 1 s, 0.1 s, 0.5 s), as under mpirun.
  w.add(1000, 1.0);
  EXPECT_DOUBLE_EQ(w.tokens_per_s(), 1000);
  w.add(1000, 0.1);
  EXPECT_DOUBLE_EQ(w.tokens_per_s(), 2000 / 1.1);
  w.add(1000, 0.5);
  EXPECT_DOUBLE_EQ(w.tokens_per_s(), 3000 / 1.6);
  EXPECT_EQ(w.steps(), 3);
  // The fourth step pushes out the first: tokens and seconds of steps 2..4 only.
  w.add(1000, 0.4);
  EXPECT_EQ(w.steps(), 3);
  EXPECT_DOUBLE_EQ(w.tokens_per_s(), 3000 / 1.0);
}

TEST(ThroughputWindowTest, WeighsStepsByTheirTimeNotAveragingRates) {
  // 100 tok/s for 9 s then 10000 tok/s for 1 s: 10900 tokens in 10 s, not the 5050 mean.
  ThroughputWindow w(10);
  w.add(900, 9.0);
  w.add(10000, 1.0);
  EXPECT_DOUBLE_EQ(w.tokens_per_s(), 1090);
}

TEST(ThroughputWindowTest, AWindowOfOneOrLessIsTheLastStep) {
  for (int64_t n : {int64_t{0}, int64_t{1}}) {
    ThroughputWindow w(n);
    w.add(100, 1.0);
    w.add(100, 0.5);
    EXPECT_DOUBLE_EQ(w.tokens_per_s(), 200) << n;
  }
}

}  // namespace
}  // namespace autosp::train
