#include "train/planner.h"

#include <algorithm>

#include "passes/autosp.h"
#include "passes/pipeline.h"
#include "passes/plan_memory.h"
#include "train/grad_sync.h"
#include "util/error.h"

namespace autosp::train {

namespace {

// A CUDA context with cuBLAS/cuDNN workspaces and NCCL's buffers: 0.5-1 GiB on a recent GPU.
constexpr int64_t kGpuRuntimeReserveBytes = int64_t{1} << 30;

}  // namespace

std::string describe_precision(const PlanSetup& setup) {
  if (setup.dtype == DType::bf16)
    return "bf16 parameters, activations and gradients (reduced in the step, in the plan's arena); fp32 master "
           "weights and AdamW moments, sharded 1/W from ZeRO-1 on; with gradient accumulation the fp32 sum of a "
           "step's micro batches beside the step (whole under ZeRO 0 and 1, 1/W under 2 and 3); the bf16 "
           "parameters sharded too under ZeRO-3, each layer's gathered in the arena; runtime reserve 1 GiB per GPU "
           "(CUDA context, cuBLAS and NCCL buffers)";
  return "fp32 parameters, activations, gradients and AdamW moments (the CPU runtime; gradients reduced in the "
         "step, in the plan's arena; moments sharded 1/W from ZeRO-1 on; with gradient accumulation the sum of a "
         "step's micro batches beside the step, whole under ZeRO 0 and 1, 1/W under 2 and 3; parameters sharded "
         "too under ZeRO-3); runtime reserve as measured for the CPU runtime";
}

MemoryBreakdown plan_step(const PlanSetup& setup, const MemoryStrategy& strategy, int64_t S) {
  AUTOSP_CHECK(S > 0 && setup.world % setup.sp == 0, "S=", S, " world=", setup.world, " sp=", setup.sp);
  Graph forward = models::llama_forward(setup.model, {.batch = setup.micro_batch, .seq_len = S, .dtype = setup.dtype});
  CompileOptions options{setup.sp, {"autosp"}, true, setup.threads};
  options.checkpoint = strategy.checkpoint;
  options.tile = strategy.tile;
  const int64_t N = models::llama_num_parameters(setup.model), W = setup.world;
  // DeepSpeed's default bucket sizes (reduce_bucket_size, allgather_bucket_size).
  constexpr int64_t kBucket = 500000000;
  options.grad_sync = {.zero_stage = setup.zero, .world_size = W, .bucket_elements = kBucket,
                       .prefetch_elements = 50000000};  // stage3_prefetch_bucket_size's default
  const CompiledStep step = compile_step(forward, options, setup.accumulation_steps);

  MemoryBreakdown b;
  int64_t shard = N;  // this rank's elements of the step's gradient buckets (stage 3: parameter groups)
  if (setup.zero >= 1) {
    shard = 0;
    for (const GradBucket& bucket : read_grad_buckets(step.last)) shard += bucket.shard;
  }
  // Gradients kept beside the step (the reduced ones are the step's outputs, in the arena):
  // with accumulation, the whole sum of the earlier micro batches (stages 0 and 1) or this
  // rank's shards of it (stages 2 and 3).
  const bool accumulating = setup.accumulation_steps > 1;
  const int64_t accumulated = !accumulating ? 0 : setup.zero < 2 ? N : shard;
  const int64_t params = setup.zero == 3 ? shard : N;  // of the parameters
  b.activations = read_memory_plan(step.last).arena_bytes;
  if (step.has_earlier()) b.activations = std::max(b.activations, read_memory_plan(step.earlier).arena_bytes);
  b.communication = setup.zero == 1 || setup.zero == 2 ? 4 * (W + 1) * ShardedAdamW::chunk_elements(shard, W, kBucket) : 0;
  if (setup.dtype == DType::bf16) {
    b.parameters = 2 * params;
    b.gradients = 4 * accumulated;     // fp32 accumulation of the graph's bf16 gradients
    b.optimizer_state = 12 * shard;    // fp32 master weights + two moments (stage 0: shard = N)
    b.runtime_reserve = kGpuRuntimeReserveBytes;
  } else {
    b.parameters = 4 * params;
    b.gradients = 4 * accumulated;
    b.optimizer_state = 8 * shard;
    const int64_t local = split_sequence(S, setup.sp).local;
    b.runtime_reserve = runtime_reserve_bytes(setup.threads) + reduction_staging_bytes(step.last, W) +
                        4 * (setup.micro_batch * (3 * S + 6 * local) + S + 1);  // as Trainer::staging_bytes
  }
  return b;
}

StrategyResult longest_sequence(const PlanSetup& setup, const MemoryStrategy& strategy, int64_t device_bytes,
                                int64_t granularity) {
  StrategyResult r;
  r.strategy = strategy;
  r.name = strategy_name(strategy);
  r.sp = setup.sp;
  r.zero = setup.zero;
  r.checkpoint = strategy_name({strategy.checkpoint, {}});
  r.tiled = strategy.tile.tile_rows > 0 || strategy.tile.budget_bytes > 0;
  auto peak = [&](int64_t S) {
    const int64_t p = plan_step(setup, strategy, S).total();
    r.samples.emplace_back(S, p);
    return p;
  };
  const int64_t g = std::max<int64_t>(granularity, 1);
  // Bracket: lo fits (or is 0), hi does not; steps of 4x from the granularity.
  int64_t lo = 0, lo_peak = 0, hi = g, hi_peak = peak(hi);
  constexpr int64_t kMaxSeqLen = int64_t{1} << 28;
  while (hi_peak <= device_bytes && hi < kMaxSeqLen) {
    lo = hi, lo_peak = hi_peak;
    hi = std::min(hi * 4, kMaxSeqLen);
    hi_peak = peak(hi);
  }
  if (hi_peak <= device_bytes) {  // fits at the cap
    r.max_seq_len = hi, r.peak_bytes = hi_peak;
    return r;
  }
  // The plan is close to linear in S (every activation is): interpolate, and bisect after a
  // step that did not halve the bracket.
  bool midpoint = lo == 0;
  while (hi - lo > g) {
    const int64_t width = hi - lo;
    int64_t S = midpoint ? lo + width / 2
                         : lo + int64_t(double(device_bytes - lo_peak) / double(hi_peak - lo_peak) * double(width));
    S = std::clamp<int64_t>(S / g * g, lo + g, std::max(lo + g, (hi - 1) / g * g));
    const int64_t p = peak(S);
    if (p <= device_bytes) lo = S, lo_peak = p;
    else hi = S, hi_peak = p;
    midpoint = 2 * (hi - lo) > width;
  }
  r.max_seq_len = lo;
  r.peak_bytes = lo_peak;
  return r;
}

}  // namespace autosp::train
