#include "train/planner.h"

#include <algorithm>
#include <limits>

#include "passes/autodiff.h"
#include "passes/autosp.h"
#include "passes/grad_sync.h"
#include "passes/pipeline.h"
#include "passes/plan_memory.h"
#include "passes/tile.h"
#include "train/sharded_adamw.h"
#include "train/step_options.h"
#include "util/error.h"

namespace autosp::train {

namespace {

// A CUDA context with cuBLAS/cuDNN workspaces and NCCL's buffers: 0.5-1 GiB on a recent GPU.
constexpr int64_t kGpuRuntimeReserveBytes = int64_t{1} << 30;

// The forward graph a plan compiles: the program's, or the Llama family's of `model`.
Graph forward_graph(const PlanSetup& s, int64_t S) {
  const models::LlamaTraceOptions o{.batch = s.micro_batch, .seq_len = S, .dtype = s.dtype};
  return s.program ? s.program->forward(o) : models::llama_forward(s.model, o);
}

int64_t num_parameters(const PlanSetup& s) {
  if (!s.program) return models::llama_num_parameters(s.model);
  int64_t n = 0;
  for (const models::ParameterSpec& p : s.program->parameters) n += numel(p.shape);
  return n;
}

bool starts_with_any(const std::string& name, std::initializer_list<const std::string*> prefixes) {
  for (const std::string* p : prefixes)
    if (name.starts_with(*p)) return true;
  return false;
}

}  // namespace

ArenaParts arena_parts(const Graph& g, const MemoryPlan& plan) {
  const auto N = static_cast<NodeId>(g.nodes().size());
  const auto V = static_cast<ValueId>(g.values().size());
  // Gradient buckets: back from each gradient output through its reduction (all_reduce,
  // reduce_scatter), the bucket's concat ("grad_bucket:<k>", whose padding is a fill), the
  // gradients' flattening views and accumulation's "grad_total:" add, to the values the
  // backward made final (grad_sync.h).
  std::vector<char> bucket(V, 0), gathered(V, 0), forward(N, 0);
  std::vector<ValueId> stack;
  for (const GraphOutput& o : g.outputs())
    if (starts_with_any(o.name, {&kGradPrefix, &kGradShardPrefix, &kGradReducedPrefix})) {
      const Node& p = g.node(g.value(o.value).producer);
      bucket[o.value] = 1;
      if (p.op == OpKind::all_reduce || p.op == OpKind::reduce_scatter) stack.push_back(p.inputs[0]);
      else stack.push_back(o.value);
    }
  while (!stack.empty()) {
    const ValueId v = stack.back();
    stack.pop_back();
    if (g.is_input(v)) continue;
    bucket[v] = 1;
    const Node& p = g.node(g.value(v).producer);
    const std::string& name = g.value(v).name;
    if (p.op == OpKind::reshape || (p.op == OpKind::concat && name.starts_with("grad_bucket:")) ||
        (p.op == OpKind::add && name.starts_with("grad_total:")))
      for (ValueId in : p.inputs)
        if (!bucket[in]) stack.push_back(in);
  }
  // Gathered parameters: all_gather of a parameter shard (ZeRO-3), and the slices and views of it.
  for (NodeId n = 0; n < N; ++n) {
    const Node& node = g.node(n);
    const bool of_gathered = !node.inputs.empty() && gathered[node.inputs[0]];
    if ((node.op == OpKind::all_gather && g.is_input(node.inputs[0]) && g.role(node.inputs[0]) == Role::parameter) ||
        ((node.op == OpKind::slice || node.op == OpKind::reshape) && of_gathered))
      for (ValueId out : node.outputs) gathered[out] = 1;
  }
  // The forward: the nodes the step's other outputs (the loss) depend on.
  for (const GraphOutput& o : g.outputs())
    if (!starts_with_any(o.name, {&kGradPrefix, &kGradShardPrefix, &kGradReducedPrefix}))
      stack.push_back(o.value);
  while (!stack.empty()) {
    const NodeId n = g.value(stack.back()).producer;
    stack.pop_back();
    if (forward[n]) continue;
    forward[n] = 1;
    for (ValueId in : g.node(n).inputs) stack.push_back(in);
  }

  ArenaParts parts;
  parts.peak_node = plan.live_peak_node;
  if (plan.live_peak_node >= 0) parts.workspaces = aligned_to_arena(plan.workspace_bytes[plan.live_peak_node]);
  for (ValueId v : plan.live_at_peak) {
    const int64_t bytes = aligned_to_arena(g.type(v).bytes());
    if (bucket[v]) parts.gradient_buckets += bytes;
    else if (gathered[v]) parts.gathered_parameters += bytes;
    else if (forward[g.value(v).producer] || g.value(v).name.starts_with("recompute:")) parts.activations += bytes;
    else parts.activation_gradients += bytes;
  }
  AUTOSP_CHECK(parts.total() == plan.live_peak_bytes, "arena_parts: the buffers live at node ", plan.live_peak_node,
               " sum to ", parts.total(), " bytes, the plan's live peak is ", plan.live_peak_bytes);
  parts.fragmentation = plan.arena_bytes - plan.live_peak_bytes;
  return parts;
}

std::string describe_precision(const PlanSetup& setup) {
  if (setup.dtype == DType::bf16)
    return "bf16 parameters, activations and gradients (reduced in the step, in the plan's arena); fp32 master "
           "weights and AdamW moments, sharded 1/W from ZeRO-1 on; with gradient accumulation (and "
           "always on one GPU, where every micro batch's gradients add into it) the fp32 sum of a step's micro "
           "batches beside the step (whole under ZeRO 0 and 1, 1/W under 2 and 3); the bf16 "
           "parameters sharded too under ZeRO-3, each layer's gathered in the arena; runtime reserve 1 GiB per GPU "
           "(CUDA context, cuBLAS and NCCL buffers)";
  return "fp32 parameters, activations, gradients and AdamW moments (the CPU runtime; gradients reduced in the "
         "step, in the plan's arena; moments sharded 1/W from ZeRO-1 on; with gradient accumulation the sum of a "
         "step's micro batches beside the step, whole under ZeRO 0 and 1, 1/W under 2 and 3; parameters sharded "
         "too under ZeRO-3); runtime reserve as measured for the CPU runtime";
}

Backend plan_backend(const PlanSetup& setup) {
  if (setup.backend) return *setup.backend;
  return setup.dtype == DType::bf16 ? Backend::cuda : Backend::cpu;
}

TrainConfig plan_config(const PlanSetup& setup) {
  TrainConfig config;  // DeepSpeed's default bucket sizes
  config.sequence_parallel_size = setup.sp;
  config.compile = {.deepcompile = true, .passes = {"autosp"}};
  config.zero_stage = config.zero.stage = setup.zero;
  config.train_micro_batch_size_per_gpu = setup.micro_batch;
  config.gradient_accumulation_steps = setup.accumulation_steps;
  config.backend = backend_name(plan_backend(setup));
  return config;
}

MemoryBreakdown plan_step(const PlanSetup& setup, const MemoryStrategy& strategy, int64_t S) {
  AUTOSP_CHECK(S > 0 && setup.world % setup.sp == 0, "S=", S, " world=", setup.world, " sp=", setup.sp);
  Graph forward = forward_graph(setup, S);
  const TrainConfig config = plan_config(setup);
  const int64_t N = num_parameters(setup), W = setup.world;
  const CompiledStep step =
      compile_step(forward, step_compile_options(config, W, setup.threads, strategy), setup.accumulation_steps);

  MemoryBreakdown b;
  const ModelStateBytes state = model_state_bytes(config, W, N, read_grad_buckets(step.last), setup.dtype);
  b.parameters = state.parameters;
  if (setup.program) b.parameters += constant_bytes(setup.program->constants, setup.dtype);  // (beside them)
  b.gradient_sum = state.gradient_sum;
  b.optimizer_state = state.optimizer_state;
  b.communication = state.communication;
  // With accumulation the two programs share the arena: its parts are the larger plan's.
  const MemoryPlan last = read_memory_plan(step.last);
  const MemoryPlan earlier = step.has_earlier() ? read_memory_plan(step.earlier) : MemoryPlan{};
  const bool earlier_larger = earlier.arena_bytes > last.arena_bytes;
  b.arena = std::max(last.arena_bytes, earlier.arena_bytes);
  b.arena_parts = earlier_larger ? arena_parts(step.earlier, earlier) : arena_parts(step.last, last);
  if (setup.dtype == DType::bf16) {
    b.runtime_reserve = kGpuRuntimeReserveBytes;
  } else {
    const int64_t local = split_sequence(S, setup.sp).local;
    b.runtime_reserve = runtime_reserve_bytes(setup.threads) + reduction_staging_bytes(step.last, W) +
                        4 * (setup.micro_batch * (3 * S + 6 * local) + S + 1);  // as Trainer::staging_bytes
  }
  return b;
}

MemoryBreakdown PlanCache::plan(const PlanSetup& setup, const MemoryStrategy& strategy, int64_t S) {
  MemoryStrategy effective = strategy;
  if (strategy.tile.tile_rows > 0 || strategy.tile.budget_bytes > 0) {
    const Graph sharded = autosp(forward_graph(setup, S), {setup.sp});
    if (tile(sharded, strategy.tile) == sharded) effective.tile = {};
  }
  const TileOptions& t = effective.tile;
  const Key key{setup.sp, int(effective.checkpoint.policy), effective.checkpoint.recompute_matmuls,
                t.tile_rows, t.budget_bytes, t.budget_fraction, t.min_rows, S};
  std::promise<MemoryBreakdown> made;
  std::shared_future<MemoryBreakdown> made_before;
  {
    std::lock_guard lock(mutex_);
    if (!setup_) setup_ = setup;
    const PlanSetup& first = *setup_;
    AUTOSP_CHECK(first.world == setup.world && first.zero == setup.zero && first.dtype == setup.dtype &&
                     first.micro_batch == setup.micro_batch && first.accumulation_steps == setup.accumulation_steps &&
                     first.threads == setup.threads && plan_backend(first) == plan_backend(setup) &&
                     first.program == setup.program &&
                     (setup.program || models::llama_config_json(first.model) == models::llama_config_json(setup.model)),
                 "PlanCache: a setup other than the one it holds plans of (only sp may differ)");
    if (auto it = plans_.find(key); it != plans_.end()) made_before = it->second;
    else plans_.emplace(key, made.get_future().share());
  }
  if (made_before.valid()) return made_before.get();  // waits while another thread makes it
  try {
    const MemoryBreakdown b = plan_step(setup, effective, S);
    made.set_value(b);
    return b;
  } catch (...) {
    made.set_exception(std::current_exception());
    throw;
  }
}

StrategyResult longest_sequence(const PlanSetup& setup, const MemoryStrategy& strategy, int64_t device_bytes,
                                int64_t granularity, PlanCache* cache) {
  StrategyResult r;
  r.strategy = strategy;
  r.name = strategy_name(strategy);
  r.sp = setup.sp;
  r.zero = setup.zero;
  r.checkpoint = strategy_name({strategy.checkpoint, {}});
  r.tiled = strategy.tile.tile_rows > 0 || strategy.tile.budget_bytes > 0;
  auto peak = [&](int64_t S) {
    int64_t p = 0;
    try {
      p = (cache ? cache->plan(setup, strategy, S) : plan_step(setup, strategy, S)).total();
    } catch (const UserError& e) {
      if (!setup.program) throw;
      // A length the program refuses (its position table is shorter) does not fit.
      if (r.refused.empty()) r.refused = e.what();
      return std::numeric_limits<int64_t>::max();
    }
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
