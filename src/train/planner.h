// Planning a run's memory without running it (`autosp plan`): the same compiler pipeline the
// trainer runs (trace, autosp, tile, autodiff, checkpoint, schedule, plan_memory) on the
// real graph, with the chosen dtype's sizes, and the model state the runtime keeps beside
// it. No data, no kernels: the graph's size does not grow with S, so a plan at millions of
// tokens costs what one at thousands does.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/llama.h"
#include "train/trainer.h"

namespace autosp::train {

struct PlanSetup {
  models::LlamaConfig model;
  int world = 1, sp = 1, zero = 0;
  DType dtype = DType::f32;  // f32: the CPU runtime; bf16: a bf16 GPU run (see model_state)
  int64_t micro_batch = 1;
  int64_t accumulation_steps = 1;  // gradient_accumulation_steps: ZeRO-1 keeps their whole sum
  int threads = 1;           // kernel workspaces are sized for this many threads
};

// Per-rank bytes of one training step.
struct MemoryBreakdown {
  int64_t parameters = 0, gradients = 0, optimizer_state = 0;  // model state
  int64_t activations = 0;     // plan_memory's arena: activations, collectives' buffers, workspaces
  int64_t communication = 0;   // ZeRO-1's and ZeRO-2's bounded scratch for the parameters' all-gather
  int64_t runtime_reserve = 0; // what the runtime holds beside the plan (see describe_precision)
  int64_t total() const {
    return parameters + gradients + optimizer_state + activations + communication + runtime_reserve;
  }
};

// What the model state is made of for this setup, in words (printed by `autosp plan`).
std::string describe_precision(const PlanSetup& setup);

// The plan of one step at sequence length S under `strategy`.
MemoryBreakdown plan_step(const PlanSetup& setup, const MemoryStrategy& strategy, int64_t S);

struct StrategyResult {
  MemoryStrategy strategy;
  std::string name;
  int sp = 1, zero = 0;
  std::string checkpoint;
  bool tiled = false;
  int64_t max_seq_len = 0;  // longest S whose plan fits; 0 if none does
  int64_t peak_bytes = 0;   // the plan at max_seq_len
  std::vector<std::pair<int64_t, int64_t>> samples;  // (S, planned peak) evaluated on the way
};

// The longest S (a multiple of `granularity`) whose planned peak fits `device_bytes`, by
// bracketing and bisection on the real plans.
StrategyResult longest_sequence(const PlanSetup& setup, const MemoryStrategy& strategy, int64_t device_bytes,
                                int64_t granularity);

}  // namespace autosp::train
