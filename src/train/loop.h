// The training loop: optimizer steps from the trainer's current step up to a target step, and
// the decisions around them that are not display: when a checkpoint is saved, when the data
// wraps into another epoch, and the profile's reset after the first step. Showing any of it
// (progress lines, the metrics file, gathering the ranks' numbers) is the caller's, in hooks.
//
// Invariants:
//  - The steps taken are state().step + 1 .. target, in order, each once; a trainer at or
//    past the target takes none.
//  - After each step, in this order: after_step, stop_requested, save (when due), and the
//    return when a stop was requested. Every rank of a job runs the same steps and calls the
//    hooks in the same order, so hooks may be collectives.
//  - A checkpoint is saved (once) after step s when there is a save hook and s is the target,
//    or a multiple of save_every, or a stop was requested after it. A run with nothing to
//    train saves once, the state it was given. save_at_target false: neither at the target.
//  - AUTOSP_PROFILE=1: the profile is reset after the loop's first step when more steps
//    follow (that step pays one-time costs, e.g. the arena's first touch).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>

#include "train/data.h"
#include "train/trainer.h"

namespace autosp::train {

struct LoopOptions {
  int64_t target_step = 0;  // the step the loop ends after
  int64_t save_every = 0;   // also save after every step that is a multiple of it (0: no)
  // false: no save at the target (the caller saves after what follows the loop).
  bool save_at_target = true;
  // The data's distinct samples (DataSource::num_samples), to say where an epoch begins;
  // 0: endless generated data, no epochs.
  int64_t epoch_samples = 0;
};

// What after_step is told about the step just taken.
struct StepEvent {
  const StepStats& stats;
  int64_t steps_done = 0;  // steps this loop has taken, this one included
  double elapsed = 0;      // seconds since the loop began
  bool last = false;       // the target step
  // The step read past the end of the data: the 1-based number of the epoch it began.
  std::optional<int64_t> epoch_begins;
};

struct LoopHooks {
  std::function<void(const StepEvent&)> after_step;
  // After each step: a stop request (the signal's number) or 0. In a job of several ranks
  // every rank must get the same answer (a collective), so that all stop after one step.
  std::function<int()> stop_requested;
  // Saves a checkpoint of the trainer's state; empty: the run saves nothing.
  std::function<void()> save;
};

struct LoopResult {
  enum class End { reached_target, stopped };
  End end = End::reached_target;
  int signal = 0;           // End::stopped: the stop request's signal
  int64_t first_step = 0;   // the loop's first step (state().step + 1 when it began)
  int64_t steps_done = 0;   // steps taken: first_step .. first_step + steps_done - 1
  StepStats last_stats;     // the last step's (steps_done > 0)
  double seconds = 0;       // the whole loop, saves included
};

// Trains `trainer` on `data` up to options.target_step (see the invariants above).
LoopResult run_loop(Trainer& trainer, const DataSource& data, const LoopOptions& options, const LoopHooks& hooks);

}  // namespace autosp::train
