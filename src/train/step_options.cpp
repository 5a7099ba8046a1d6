#include "train/step_options.h"

namespace autosp::train {

CompileOptions step_compile_options(const TrainConfig& config, int64_t world, int threads,
                                    const MemoryStrategy& strategy) {
  CompileOptions options{config.sequence_parallel_size, config.compile.passes, config.compile.deepcompile, threads};
  options.backend = parse_backend(config.backend);
  options.checkpoint = strategy.checkpoint;
  options.tile = strategy.tile;
  options.grad_sync = {.zero_stage = config.zero_stage, .world_size = world,
                       .bucket_elements = config.zero.reduce_bucket_size,
                       .prefetch_elements = config.zero.stage3_prefetch_bucket_size};
  return options;
}

}  // namespace autosp::train
