// A training step's compile options and the model state beside it, each built in ONE place from the training config (DeepSpeed
// JSON, train/config.h) for the three that compile a step: the trainer, `autosp plan`
// (train/planner.h) and `autosp dump`. What a strategy chooses (checkpoint policy, tiles)
// comes with it; the rest (the autosp pass, SP size, ZeRO stage and its buckets, the backend
// whose kernels lower binds, the kernel threads) from the config and the launch.
#pragma once
#include <cstdint>

#include <vector>

#include "passes/grad_sync.h"
#include "passes/pipeline.h"
#include "train/config.h"
#include "train/trainer.h"

namespace autosp::train {

// `world`: ranks the gradients are reduced over (data parallel x sequence parallel);
// `threads`: the CPU executor's kernel threads (0: OpenMP's default), which size CPU
// workspaces.
CompileOptions step_compile_options(const TrainConfig& config, int64_t world, int threads,
                                    const MemoryStrategy& strategy);

// The model state a rank holds beside its step's arena: what the trainer allocates and
// `autosp plan` plans, from the compiled step's gradient buckets (their shards are this
// rank's share of every parameter under ZeRO 1-3; whole under ZeRO 0).
//   parameters       whole below ZeRO-3 (fp32, or bf16 for a bf16 run), this rank's shard at 3
//   gradient_sum     with accumulation: the fp32 sum of the earlier micro batches, whole under
//                    ZeRO 0 and 1 (the step's second program adds it), the shard under 2 and 3;
//                    bf16 on one rank (the device-resident step): the fp32 sum every micro
//                    batch's bf16 gradients add into, with or without accumulation
//   optimizer_state  the two fp32 moments (and a bf16 run's fp32 master weights): whole under
//                    ZeRO 0, the shard from 1 on
//   communication    ZeRO 1 and 2: the parameters' all-gather after the update, in bounded
//                    rounds of allgather_bucket_size (ShardedAdamW::chunk_elements)
struct ModelStateBytes {
  int64_t parameters = 0, gradient_sum = 0, optimizer_state = 0, communication = 0;
  int64_t total() const { return parameters + gradient_sum + optimizer_state + communication; }
};
ModelStateBytes model_state_bytes(const TrainConfig& config, int64_t world, int64_t num_parameters,
                                  const std::vector<GradBucket>& buckets, DType dtype);
// The model's constants (models::Model::constants: frozen weights, stored tables) as the
// trainer holds them beside that state: fp32 on the host (dtype f32), or the device step's bf16
// copy (bf16: device_constant_bytes).
int64_t constant_bytes(const std::vector<models::ParameterSpec>& constants, DType dtype);

}  // namespace autosp::train
