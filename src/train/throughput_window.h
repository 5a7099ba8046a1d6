// The step line's tok/s: tokens per second over the last few optimizer steps rather than
// one. One step's rate swings several-fold under mpirun (1825 to 11134 tok/s in one run,
// the ranks waiting on each other in turn); over a window it reads as the run's throughput.
//
// Invariants: the rate is the window's tokens over the window's step seconds (the steps' own
// time, StepStats::seconds, so a checkpoint save or a metrics write between steps does not
// count); the window holds the last `steps` steps, or all steps so far while there are fewer.
#pragma once
#include <algorithm>
#include <cstdint>
#include <deque>
#include <utility>

namespace autosp::train {

class ThroughputWindow {
 public:
  explicit ThroughputWindow(int64_t steps) : capacity_(std::max<int64_t>(1, steps)) {}

  void add(double tokens, double seconds) {
    steps_.emplace_back(tokens, seconds);
    if (int64_t(steps_.size()) > capacity_) steps_.pop_front();
  }

  // 0 before the first step. Summed afresh each call (a window is tens of steps): a running
  // sum that subtracts the step leaving would drift over a long run.
  double tokens_per_s() const {
    double tokens = 0, seconds = 0;
    for (const auto& [t, s] : steps_) {
      tokens += t;
      seconds += s;
    }
    return seconds > 0 ? tokens / seconds : 0;
  }

  int64_t steps() const { return int64_t(steps_.size()); }

 private:
  int64_t capacity_;
  std::deque<std::pair<double, double>> steps_;  // (tokens, seconds) per step, oldest first
};

}  // namespace autosp::train
