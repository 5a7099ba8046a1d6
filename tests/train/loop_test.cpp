// The training loop (train/loop.h) with a real Trainer on the tiny Llama: which steps it takes,
// when it saves and polls for a stop and in which order, where it stops, where an epoch begins,
// and that a trainer resumed at step k takes steps k+1..target and ends where one run would.
#include "train/loop.h"

#include <gtest/gtest.h>

#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include "runtime/profile.h"
#include "testing/counting_data.h"
#include "testing/tiny_llama.h"
#include "train/trainer.h"

namespace autosp::train {
namespace {

constexpr int64_t kSeqLen = 6;

using Counting = testing::CountingData;

// One sample per step (micro batch 1, one rank): step k reads sample k - 1.
std::unique_ptr<Trainer> make_trainer(ModelState state) {
  TrainConfig config;
  config.train_micro_batch_size_per_gpu = 1;
  resolve_batch(config, 1, "test");
  return std::make_unique<Trainer>(testing::tiny_llama(1, 7), config, kSeqLen, std::move(state));
}

ModelState fresh_state() { return ModelState::initial(testing::tiny_llama(1, 7), 3); }

// The hooks of a loop over `trainer`, logging each call with the trainer's step: "step N"
// (after_step; "step N last" for the target), "poll N" (stop_requested), "save N". A stop
// is requested after step `stop_after` (0: never).
struct Log {
  std::vector<std::string> calls;
  std::vector<int64_t> steps_done;  // after_step's count
  std::vector<std::pair<int64_t, int64_t>> epochs;  // (step, epoch it began)

  LoopHooks hooks(const Trainer& trainer, int64_t stop_after = 0, bool save = true) {
    LoopHooks h;
    h.after_step = [this, &trainer](const StepEvent& e) {
      EXPECT_EQ(e.stats.step, trainer.state().step);
      calls.push_back("step " + std::to_string(e.stats.step) + (e.last ? " last" : ""));
      steps_done.push_back(e.steps_done);
      if (e.epoch_begins) epochs.emplace_back(e.stats.step, *e.epoch_begins);
    };
    h.stop_requested = [this, &trainer, stop_after] {
      calls.push_back("poll " + std::to_string(trainer.state().step));
      return stop_after > 0 && trainer.state().step >= stop_after ? SIGTERM : 0;
    };
    if (save) h.save = [this, &trainer] { calls.push_back("save " + std::to_string(trainer.state().step)); };
    return h;
  }
};

using Calls = std::vector<std::string>;

TEST(Loop, TakesEveryStepToTheTargetSavingEveryKAndAtTheTarget) {
  auto trainer = make_trainer(fresh_state());
  Log log;
  const LoopResult r = run_loop(*trainer, Counting(), {.target_step = 5, .save_every = 2}, log.hooks(*trainer));
  EXPECT_EQ(log.calls, (Calls{"step 1", "poll 1", "step 2", "poll 2", "save 2", "step 3", "poll 3", "step 4",
                              "poll 4", "save 4", "step 5 last", "poll 5", "save 5"}));
  EXPECT_EQ(log.steps_done, (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(r.end, LoopResult::End::reached_target);
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(r.first_step, 1);
  EXPECT_EQ(r.steps_done, 5);
  EXPECT_EQ(r.last_stats.step, 5);
  EXPECT_EQ(r.last_stats.consumed_samples, 5);
  EXPECT_GE(r.seconds, 0);
  EXPECT_EQ(trainer->state().step, 5);
}

TEST(Loop, ATargetThatIsAMultipleOfSaveEverySavesOnce) {
  auto trainer = make_trainer(fresh_state());
  Log log;
  run_loop(*trainer, Counting(), {.target_step = 4, .save_every = 2}, log.hooks(*trainer));
  EXPECT_EQ(log.calls, (Calls{"step 1", "poll 1", "step 2", "poll 2", "save 2", "step 3", "poll 3", "step 4 last",
                              "poll 4", "save 4"}));
}

TEST(Loop, WithoutASaveHookNothingIsSavedAndNoSaveAtTargetSavesOnlyEveryK) {
  auto trainer = make_trainer(fresh_state());
  Log log;
  run_loop(*trainer, Counting(), {.target_step = 2, .save_every = 1}, log.hooks(*trainer, 0, /*save=*/false));
  EXPECT_EQ(log.calls, (Calls{"step 1", "poll 1", "step 2 last", "poll 2"}));

  Log log2;
  run_loop(*trainer, Counting(), {.target_step = 5, .save_every = 2, .save_at_target = false}, log2.hooks(*trainer));
  EXPECT_EQ(log2.calls, (Calls{"step 3", "poll 3", "step 4", "poll 4", "save 4", "step 5 last", "poll 5"}));
}

// A stop requested after step k: saved at k (once, though k is also a multiple of
// save_every), and no step after it.
TEST(Loop, AStopRequestedAfterStepKSavesThenStopsAtK) {
  auto trainer = make_trainer(fresh_state());
  Log log;
  const LoopResult r =
      run_loop(*trainer, Counting(), {.target_step = 10, .save_every = 2}, log.hooks(*trainer, /*stop_after=*/4));
  EXPECT_EQ(log.calls, (Calls{"step 1", "poll 1", "step 2", "poll 2", "save 2", "step 3", "poll 3", "step 4",
                              "poll 4", "save 4"}));
  EXPECT_EQ(r.end, LoopResult::End::stopped);
  EXPECT_EQ(r.signal, SIGTERM);
  EXPECT_EQ(r.steps_done, 4);
  EXPECT_EQ(r.last_stats.step, 4);
  EXPECT_EQ(trainer->state().step, 4);

  // Between the multiples, and without a save hook: stopped, nothing saved.
  Log log2;
  const LoopResult r2 = run_loop(*trainer, Counting(), {.target_step = 10, .save_every = 2}, log2.hooks(*trainer, 5));
  EXPECT_EQ(log2.calls, (Calls{"step 5", "poll 5", "save 5"}));
  EXPECT_EQ(r2.end, LoopResult::End::stopped);
  EXPECT_EQ(r2.first_step, 5);
  Log log3;
  const LoopResult r3 = run_loop(*trainer, Counting(), {.target_step = 10}, log3.hooks(*trainer, 6, false));
  EXPECT_EQ(log3.calls, (Calls{"step 6", "poll 6"}));
  EXPECT_EQ(r3.end, LoopResult::End::stopped);
  EXPECT_EQ(trainer->state().step, 6);
}

TEST(Loop, AStopRequestedAfterTheTargetStepSavesOnceAndIsAStop) {
  auto trainer = make_trainer(fresh_state());
  Log log;
  const LoopResult r = run_loop(*trainer, Counting(), {.target_step = 2}, log.hooks(*trainer, 2));
  EXPECT_EQ(log.calls, (Calls{"step 1", "poll 1", "step 2 last", "poll 2", "save 2"}));
  EXPECT_EQ(r.end, LoopResult::End::stopped);
}

// A trainer made from the state of one at step k (what --resume does, without the files)
// takes steps k+1..target, reads on from where the first stopped, and ends where one
// uninterrupted run ends, bit for bit.
TEST(Loop, AResumedTrainerTakesTheStepsAfterItsOwnToTheTarget) {
  auto first = make_trainer(fresh_state());
  Log log1;
  run_loop(*first, Counting(), {.target_step = 3}, log1.hooks(*first));
  EXPECT_EQ(log1.calls, (Calls{"step 1", "poll 1", "step 2", "poll 2", "step 3 last", "poll 3", "save 3"}));

  auto resumed = make_trainer(first->state());
  Log log2;
  const LoopResult r = run_loop(*resumed, Counting(), {.target_step = 6, .save_every = 5}, log2.hooks(*resumed));
  EXPECT_EQ(log2.calls, (Calls{"step 4", "poll 4", "step 5", "poll 5", "save 5", "step 6 last", "poll 6", "save 6"}));
  EXPECT_EQ(log2.steps_done, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(r.first_step, 4);
  EXPECT_EQ(r.steps_done, 3);
  EXPECT_EQ(r.last_stats.first_sample, 5);
  EXPECT_EQ(r.last_stats.consumed_samples, 6);

  auto straight = make_trainer(fresh_state());
  Log log3;
  run_loop(*straight, Counting(), {.target_step = 6}, log3.hooks(*straight, 0, false));
  EXPECT_EQ(resumed->state().step, straight->state().step);
  EXPECT_EQ(resumed->state().consumed_samples, straight->state().consumed_samples);
  EXPECT_EQ(resumed->state().params, straight->state().params);
  EXPECT_EQ(resumed->state().exp_avg, straight->state().exp_avg);
  EXPECT_EQ(resumed->state().exp_avg_sq, straight->state().exp_avg_sq);
}

// At or past the target nothing is trained; the given state is saved once (a checkpoint
// written again under --save), unless the caller saves at the end itself.
TEST(Loop, NothingToTrainSavesTheGivenStateOnce) {
  auto trainer = make_trainer(fresh_state());
  run_loop(*trainer, Counting(), {.target_step = 2}, {});
  for (int64_t target : {2, 1}) {
    Log log;
    const LoopResult r = run_loop(*trainer, Counting(), {.target_step = target, .save_every = 1}, log.hooks(*trainer));
    EXPECT_EQ(log.calls, (Calls{"save 2"})) << "target " << target;
    EXPECT_EQ(r.end, LoopResult::End::reached_target);
    EXPECT_EQ(r.steps_done, 0);
    EXPECT_EQ(r.first_step, 3);
  }
  Log log;
  run_loop(*trainer, Counting(), {.target_step = 2, .save_at_target = false}, log.hooks(*trainer));
  EXPECT_TRUE(log.calls.empty());
  EXPECT_EQ(trainer->state().step, 2);
}

// Data of 3 samples, one read per step: step 4 reads the fourth (the first again), step 7 the
// seventh. A step that ends exactly at the end (step 3) has not wrapped.
TEST(Loop, SaysWhichStepBeginsAnEpoch) {
  auto trainer = make_trainer(fresh_state());
  Log log;
  run_loop(*trainer, Counting(), {.target_step = 7, .epoch_samples = 3}, log.hooks(*trainer));
  EXPECT_EQ(log.epochs, (std::vector<std::pair<int64_t, int64_t>>{{4, 2}, {7, 3}}));
  Log endless;
  run_loop(*trainer, Counting(), {.target_step = 9}, endless.hooks(*trainer));
  EXPECT_TRUE(endless.epochs.empty());
}

// AUTOSP_PROFILE=1: the first step (one-time costs) is left out of the profile when more
// steps follow; a run of one step keeps it.
TEST(Loop, TheProfileLeavesOutTheFirstStepWhenMoreFollow) {
  struct ProfileOn {
    ProfileOn() {
      set_profile_enabled(true);
      global_profile().reset();
    }
    ~ProfileOn() {
      set_profile_enabled(false);
      global_profile().reset();
    }
  } on;
  auto trainer = make_trainer(fresh_state());
  run_loop(*trainer, Counting(), {.target_step = 3}, {});
  EXPECT_EQ(global_profile().steps(), 2);
  global_profile().reset();
  run_loop(*trainer, Counting(), {.target_step = 4}, {});
  EXPECT_EQ(global_profile().steps(), 1);
}

}  // namespace
}  // namespace autosp::train
