#include "train/loop.h"

#include <chrono>

#include "runtime/profile.h"

namespace autosp::train {

namespace {

// Whether step `s` read past the end of the data: the epoch it began (1-based), if so.
std::optional<int64_t> epoch_begun(const StepStats& s, int64_t epoch_samples) {
  if (epoch_samples <= 0) return std::nullopt;
  const int64_t before = s.first_sample > 0 ? (s.first_sample - 1) / epoch_samples : 0;
  const int64_t now = (s.consumed_samples - 1) / epoch_samples;
  if (now > before) return now + 1;
  return std::nullopt;
}

}  // namespace

LoopResult run_loop(Trainer& trainer, const DataSource& data, const LoopOptions& options, const LoopHooks& hooks) {
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  LoopResult result;
  result.first_step = trainer.state().step + 1;
  if (trainer.state().step >= options.target_step) {
    if (hooks.save && options.save_at_target) hooks.save();
    result.seconds = seconds();
    return result;
  }
  while (trainer.state().step < options.target_step) {
    const StepStats s = trainer.train_step(data);
    ++result.steps_done;
    result.last_stats = s;
    const bool last = s.step == options.target_step;
    if (profile_enabled() && result.steps_done == 1 && !last) global_profile().reset();
    if (hooks.after_step)
      hooks.after_step({.stats = s, .steps_done = result.steps_done, .elapsed = seconds(), .last = last,
                        .epoch_begins = epoch_begun(s, options.epoch_samples)});
    const int signal = hooks.stop_requested ? hooks.stop_requested() : 0;
    const bool every = options.save_every > 0 && s.step % options.save_every == 0;
    if (hooks.save && (signal != 0 || every || (last && options.save_at_target))) hooks.save();
    if (signal != 0) {
      result.end = LoopResult::End::stopped;
      result.signal = signal;
      break;
    }
  }
  result.seconds = seconds();
  return result;
}

}  // namespace autosp::train
