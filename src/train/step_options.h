// A training step's compile options, built in ONE place from the training config (DeepSpeed
// JSON, train/config.h) for the three that compile a step: the trainer, `autosp plan`
// (train/planner.h) and `autosp dump`. What a strategy chooses (checkpoint policy, tiles)
// comes with it; the rest (the autosp pass, SP size, ZeRO stage and its buckets, the backend
// whose kernels lower binds, the kernel threads) from the config and the launch.
#pragma once
#include <cstdint>

#include "passes/pipeline.h"
#include "train/config.h"
#include "train/trainer.h"

namespace autosp::train {

// `world`: ranks the gradients are reduced over (data parallel x sequence parallel);
// `threads`: the CPU executor's kernel threads (0: OpenMP's default), which size CPU
// workspaces.
CompileOptions step_compile_options(const TrainConfig& config, int64_t world, int threads,
                                    const MemoryStrategy& strategy);

}  // namespace autosp::train
