// Planning a run's memory without running it (`autosp plan`): the same compiler pipeline the
// trainer runs (trace, autosp, tile, autodiff, checkpoint, schedule, plan_memory) on the
// real graph, with the chosen dtype's sizes, and the model state the runtime keeps beside
// it. No data, no kernels: the graph's size does not grow with S, so a plan at millions of
// tokens costs what one at thousands does.
#pragma once
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "models/llama.h"
#include "models/model.h"
#include "passes/plan_memory.h"
#include "train/trainer.h"

namespace autosp::train {

struct PlanSetup {
  models::LlamaConfig model;
  // An imported PyTorch program (frontend/torch_import.h) planned in place of `model`, which is
  // then unused. Its forward at a length it refuses (a position table shorter than S) is a
  // plan that does not fit (longest_sequence).
  std::shared_ptr<const models::Model> program;
  int world = 1, sp = 1, zero = 0;
  DType dtype = DType::f32;  // f32: the CPU runtime; bf16: a bf16 GPU run (see model_state)
  int64_t micro_batch = 1;
  int64_t accumulation_steps = 1;  // gradient_accumulation_steps: ZeRO-1 keeps their whole sum
  int threads = 1;           // kernel workspaces are sized for this many threads (cpu)
  // Whose kernels the step is lowered and planned for; unset: cuda for bf16 (the GPU run a
  // bf16 plan is of; the CPU kernels are fp32), cpu for f32. See plan_backend.
  std::optional<Backend> backend;
};
Backend plan_backend(const PlanSetup& setup);
// The training config a setup stands for (DeepSpeed's defaults for what it does not say):
// the step is compiled from it as the trainer compiles its own (train/step_options.h).
TrainConfig plan_config(const PlanSetup& setup);

// The arena at its live peak (plan_memory.h: the most bytes live at one node), by what
// each buffer live there holds, told from the nodes that produced it:
//  - gradient_buckets: parameter gradients from the node that makes each final to its
//    bucket's reduction, the buckets grad_sync concatenates, and the reduced results the
//    step outputs (under ZeRO-0 each bucket all-reduced whole, from stage 1 this rank's 1/W
//    shard); without grad_sync (accumulation's earlier micro batches) the "grad:" outputs;
//  - gathered_parameters: ZeRO-3's all-gathered parameter groups and the parameters sliced
//    from them, in forward and again in backward;
//  - activations: values the forward computes (the ones backward reads are saved until it
//    does) and the checkpoint pass's recomputed copies of them;
//  - activation_gradients: every other value of the backward (gradients of activations and
//    the temporaries of gradient rules; partial sums of a parameter's gradient too);
//  - workspaces: the kernel scratch of the node at the peak;
//  - fragmentation: the arena above the live peak, gaps best-fit packing could not fill.
// The parts sum to the arena.
struct ArenaParts {
  int64_t gradient_buckets = 0, gathered_parameters = 0, activations = 0, activation_gradients = 0;
  int64_t workspaces = 0, fragmentation = 0;
  NodeId peak_node = -1;  // where the live peak is, in the graph of the plan with the larger arena
  int64_t total() const {
    return gradient_buckets + gathered_parameters + activations + activation_gradients + workspaces + fragmentation;
  }
};

// Per-rank bytes of one training step.
struct MemoryBreakdown {
  int64_t parameters = 0, optimizer_state = 0;  // model state (parameters: the model's constants too)
  int64_t gradient_sum = 0;    // the fp32 sum of micro batches' gradients (step_options.h says when)
  int64_t arena = 0;           // plan_memory's arena: the step's buffers (arena_parts says which)
  ArenaParts arena_parts;
  int64_t communication = 0;   // ZeRO-1's and ZeRO-2's bounded scratch for the parameters' all-gather
  int64_t runtime_reserve = 0; // what the runtime holds beside the plan (see describe_precision)
  int64_t total() const {
    return parameters + gradient_sum + optimizer_state + arena + communication + runtime_reserve;
  }
};

// The parts of a memory-planned training graph's arena (`plan` is read_memory_plan(graph)).
ArenaParts arena_parts(const Graph& graph, const MemoryPlan& plan);

// What the model state is made of for this setup, in words (printed by `autosp plan`).
std::string describe_precision(const PlanSetup& setup);

// The plan of one step at sequence length S under `strategy`.
MemoryBreakdown plan_step(const PlanSetup& setup, const MemoryStrategy& strategy, int64_t S);

// Plans already made, shared by the searches of one `autosp plan`: one model, dtype, world,
// ZeRO stage, batch and thread count (checked), any SP degree and strategy. A strategy
// whose tiles leave the graph as it is at S (every MLP within one tile) compiles what the
// strategy without tiles compiles there, so both get one plan; and the breakdown printed
// at the longest S is a plan its search made. Thread-safe: a plan asked for while another
// thread makes it is waited for, not made twice.
class PlanCache {
 public:
  MemoryBreakdown plan(const PlanSetup& setup, const MemoryStrategy& strategy, int64_t S);

 private:
  using Key = std::tuple<int, int, bool, int64_t, int64_t, double, int64_t, int64_t>;
  std::mutex mutex_;
  std::optional<PlanSetup> setup_;  // the first caller's; later ones must match but for sp
  std::map<Key, std::shared_future<MemoryBreakdown>> plans_;
};

struct StrategyResult {
  MemoryStrategy strategy;
  std::string name;
  int sp = 1, zero = 0;
  std::string checkpoint;
  bool tiled = false;
  int64_t max_seq_len = 0;  // longest S whose plan fits; 0 if none does
  int64_t peak_bytes = 0;   // the plan at max_seq_len
  std::string refused;      // an imported program's refusal of a length the search tried (the first)
  std::vector<std::pair<int64_t, int64_t>> samples;  // (S, planned peak) evaluated on the way
};

// The longest S (a multiple of `granularity`) whose planned peak fits `device_bytes`, by
// bracketing and bisection on the real plans.
// With a cache, the plans are taken from it.
StrategyResult longest_sequence(const PlanSetup& setup, const MemoryStrategy& strategy, int64_t device_bytes,
                                int64_t granularity, PlanCache* cache = nullptr);

}  // namespace autosp::train
