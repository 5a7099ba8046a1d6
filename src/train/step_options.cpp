#include "train/step_options.h"

#include <numeric>

#include "train/device_layout.h"
#include "train/sharded_adamw.h"

namespace autosp::train {

CompileOptions step_compile_options(const TrainConfig& config, int64_t world, int threads,
                                    const MemoryStrategy& strategy) {
  CompileOptions options{config.sequence_parallel_size, config.compile.passes, config.compile.deepcompile, threads};
  options.backend = parse_backend(config.backend);
  options.checkpoint = strategy.checkpoint;
  options.tile = strategy.tile;
  options.overlap = config.compile.overlap;
  options.grad_sync = {.zero_stage = config.zero_stage, .world_size = world,
                       .bucket_elements = config.zero.reduce_bucket_size,
                       .prefetch_elements = config.zero.stage3_prefetch_bucket_size};
  return options;
}

ModelStateBytes model_state_bytes(const TrainConfig& config, int64_t world, int64_t num_parameters,
                                  const std::vector<GradBucket>& buckets, DType dtype) {
  const int zero = config.zero_stage;
  const int64_t N = num_parameters;
  int64_t shard = N;
  if (zero >= 1) {
    shard = 0;
    for (const GradBucket& bucket : buckets) shard += bucket.shard;
  }
  const bool accumulating = config.gradient_accumulation_steps.value_or(1) > 1;
  const int64_t param_bytes = dtype == DType::bf16 ? 2 : 4;
  ModelStateBytes b;
  b.parameters = param_bytes * (zero == 3 ? shard : N);
  // bf16 on one GPU (the device-resident step, train/device_step.h): the bf16 gradients of
  // every micro batch add into an fp32 sum, one micro batch or many.
  const bool device_sum = dtype == DType::bf16 && world == 1;
  b.gradient_sum = !accumulating && !device_sum ? 0 : 4 * (zero < 2 ? N : shard);
  b.optimizer_state = (dtype == DType::bf16 ? 12 : 8) * shard;
  if (zero == 1 || zero == 2)
    b.communication = 4 * (world + 1) * ShardedAdamW::chunk_elements(shard, world, config.zero.allgather_bucket_size);
  return b;
}

int64_t constant_bytes(const std::vector<models::ParameterSpec>& constants, DType dtype) {
  std::vector<int64_t> numels;
  for (const models::ParameterSpec& c : constants) numels.push_back(numel(c.shape));
  if (dtype == DType::bf16) return device_constant_bytes(numels);
  return 4 * std::accumulate(numels.begin(), numels.end(), int64_t{0});
}

}  // namespace autosp::train
