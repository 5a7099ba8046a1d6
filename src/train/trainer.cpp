#include "train/trainer.h"

#include <malloc.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "comm/mpi_communicator.h"
#include "passes/autodiff.h"
#include "passes/autosp.h"
#include "passes/pipeline.h"
#include "passes/plan_memory.h"
#include "runtime/profile.h"
#include "train/device_layout.h"
#include "train/sharded_adamw.h"
#include "train/lr_schedule.h"
#include "train/step_options.h"
#include "util/error.h"
#include "util/rss.h"

namespace autosp::train {

void require_host_memory(double bytes, const std::string& what) {
  const double total = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (total > 0 && bytes > total)
    user_error(what, " needs at least ", bytes / double(1 << 30), " GiB, but this machine has ",
               total / double(1 << 30), " GiB (a smaller model, a shorter sequence, a smaller micro "
               "batch or more ranks would need less)");
}

std::vector<MemoryStrategy> strategy_candidates(const CompileConfig& compile, int64_t budget_bytes) {
  const TileOptions tiles{.tile_rows = compile.tile_rows};
  if (compile.checkpoint == "auto") {
    // Cost order: sac recomputes only linear-cost ops; tiles recompute the MLP's matmuls
    // (every policy recomputes a tiled region); +matmuls all matmuls; full every layer.
    const TileOptions by_budget{.tile_rows = compile.tile_rows, .budget_bytes = budget_bytes};
    using P = CheckpointPolicy;
    return {{{P::none}, tiles},      {{P::sac}, tiles},      {{P::sac}, by_budget},
            {{P::sac, true}, tiles}, {{P::full}, tiles},     {{P::full}, by_budget}};
  }
  if (compile.checkpoint) return {{{parse_checkpoint_policy(*compile.checkpoint, "compile.checkpoint")}, tiles}};
  const bool autosp = std::find(compile.passes.begin(), compile.passes.end(), "autosp") != compile.passes.end();
  return {{{autosp ? CheckpointPolicy::sac : CheckpointPolicy::none}, tiles}};
}

std::string strategy_name(const MemoryStrategy& s) {
  std::string name = str(checkpoint_policy_name(s.checkpoint.policy), s.checkpoint.recompute_matmuls ? "+matmuls" : "");
  if (s.tile.tile_rows > 0) name += str("+tiles(", s.tile.tile_rows, " rows)");
  else if (s.tile.budget_bytes > 0) name += "+tiles(from the budget)";
  return name;
}

ModelState ModelState::initial(const models::LlamaConfig& config, uint64_t seed) {
  ModelState s;
  s.specs = models::llama_parameters(config);
  for (const auto& spec : s.specs) {
    s.params.push_back(models::llama_init(config, spec, seed));
    s.exp_avg.emplace_back(s.params.back().size(), 0.0f);
    s.exp_avg_sq.emplace_back(s.params.back().size(), 0.0f);
  }
  return s;
}

ModelState ModelState::with_weights(std::vector<models::ParameterSpec> specs, std::vector<std::vector<float>> params) {
  AUTOSP_CHECK(specs.size() == params.size(), specs.size(), " specs, ", params.size(), " tensors");
  ModelState s;
  s.specs = std::move(specs);
  s.params = std::move(params);
  for (size_t i = 0; i < s.specs.size(); ++i) {
    AUTOSP_CHECK(int64_t(s.params[i].size()) == numel(s.specs[i].shape), s.specs[i].name);
    s.exp_avg.emplace_back(s.params[i].size(), 0.0f);
    s.exp_avg_sq.emplace_back(s.params[i].size(), 0.0f);
  }
  return s;
}

void ModelState::read(StateKind kind, size_t i, int64_t begin, int64_t n, float* out) const {
  const auto& whole = kind == StateKind::params ? params : kind == StateKind::exp_avg ? exp_avg : exp_avg_sq;
  if (i < whole.size()) {
    AUTOSP_CHECK(begin >= 0 && begin + n <= int64_t(whole[i].size()), specs.at(i).name, ": [", begin, ", ", begin + n,
                 ") of ", whole[i].size());
    std::copy_n(whole[i].begin() + begin, n, out);
    return;
  }
  AUTOSP_CHECK(stored != nullptr, "tensor ", i, " of the state is neither held nor stored");
  stored->read(kind, i, begin, n, out);
}

int64_t reduction_staging_bytes(const Graph& step, int64_t world) {
  if (world <= 1) return 0;
  int64_t largest = 0;
  for (const Node& node : step.nodes())
    if (node.op == OpKind::all_reduce || node.op == OpKind::reduce_scatter)
      largest = std::max(largest, step.type(node.inputs[0]).bytes());
  return 3 * std::min(largest, MpiCommunicator::kMaxReductionCallBytes);
}

Trainer::Trainer(const models::LlamaConfig& model, const TrainConfig& config, int64_t seq_len,
                 ModelState state, ProcessGroups* groups)
    : Trainer(models::llama_model(model), config, seq_len, std::move(state), groups) {
  model_ = model;
}

Trainer::Trainer(const models::Model& model, const TrainConfig& config, int64_t seq_len, ModelState state,
                 ProcessGroups* groups)
    : program_(model),
      config_(config),
      seq_len_(seq_len),
      micro_batch_(config.train_micro_batch_size_per_gpu.value()),
      state_(std::move(state)),
      groups_(groups) {
  AUTOSP_CHECK(config.gradient_accumulation_steps.has_value(), "resolve_batch has not run");
  if (!groups_) {
    own_groups_.world = make_single_communicator();
    own_groups_.sp = make_single_communicator();
    own_groups_.dp = make_single_communicator();
    groups_ = &own_groups_;
  }
  AUTOSP_CHECK(groups_->sp_size == config.sequence_parallel_size, "groups were made for sp_size ",
               groups_->sp_size, ", the config says ", config.sequence_parallel_size);
  int64_t num_params = 0;
  std::vector<int64_t> numels;
  for (const auto& spec : state_.specs) numels.push_back(numel(spec.shape));
  for (int64_t n : numels) num_params += n;
  const int64_t W = groups_->world->size();
  // bf16 on the cuda backend: the step and its state live on the device (device_step.h).
  const bool on_device = config_.backend == "cuda" && config_.requested_precision == "bf16";
  if (on_device && W > 1 && config_.zero_stage > 0)
    user_error("zero_optimization.stage ", config_.zero_stage, " with bf16 on the cuda backend across ", W,
               " ranks: the device-resident step keeps the whole state on every rank so far (ZeRO stage 0); set "
               "stage 0, or leave bf16 off for the fp32 step, which shards it");
  const int64_t g = config.gradient_accumulation_steps.value();
  // Model state as it will be once the optimizer holds its shards (built after compiling):
  // the parameters (whole below stage 3), the sum of a step's earlier micro batches (stages
  // 0 and 1 with accumulation: the step has a second program), whole moments (stage 0), and
  // the optimizer's shards and scratch, which depend on the buckets of the compiled step.
  auto model_state_of = [&](const CompiledStep& step) -> int64_t {
    const int64_t constants = constant_bytes(program_.constants, on_device ? DType::bf16 : DType::f32);
    if (on_device) return device_state_bytes(numels) + constants;
    return train::model_state_bytes(config_, W, num_params, read_grad_buckets(step.last), DType::f32).total() +
           constants;
  };
  int64_t model_state = 0;
  threads_ = omp_get_max_threads();  // what the executor (threads 0) and the plan use
  local_len_ = split_sequence(seq_len_, groups_->sp_size).local;

  // The model's constants, read before the heap is measured for the program's own bytes (they
  // are model state, counted there).
  AUTOSP_CHECK(program_.constants.empty() || program_.read_constant, program_.name, ": constants without values");
  for (size_t i = 0; i < program_.constants.size(); ++i) {
    constants_.push_back(program_.read_constant(i));
    AUTOSP_CHECK(int64_t(constants_.back().size()) == numel(program_.constants[i].shape), "constant ",
                 program_.constants[i].name);
  }

  // The step's plan: the first candidate (cheapest to run) whose planned peak fits the
  // budget. Every rank compiles the same graphs (the last SP rank's slice is padded to the
  // others' size), so all ranks choose alike, or all fail here, before the first step.
  const size_t heap_before = mallinfo2().uordblks;
  Graph forward = program_.forward({.batch = micro_batch_, .seq_len = seq_len_,
                                                 .dtype = on_device ? DType::bf16 : DType::f32,
                                                 .documents = config_.data.packed});
  for (ValueId c : forward.inputs_with_role(Role::constant))  // (each bound to the model's values below)
    AUTOSP_CHECK(std::any_of(program_.constants.begin(), program_.constants.end(),
                             [&](const models::ParameterSpec& s) { return s.name == forward.value(c).name; }),
                 program_.name, ": the graph reads the constant ", forward.value(c).name, ", which the model lists not");
  const double budget = config.compile.memory_budget_gb.value_or(0) * double(1 << 30);  // 0: none
  std::string tried;
  int64_t smallest = INT64_MAX;
  for (const MemoryStrategy& candidate : strategy_candidates(config.compile, int64_t(budget))) {
    // Lowered for config.backend: the plan holds its kernels' workspaces.
    // The device path sums the micro batches' gradients in fp32 itself: one program for
    // every micro batch, whose "grad:<name>" outputs on one rank need no reduction (ZeRO
    // stages differ in nothing on one rank), so the graph has no collectives at all.
    CompileOptions options = step_compile_options(config, W, threads_, candidate);
    CompiledStep step;
    if (on_device) {
      options.grad_sync = {};  // reduce false: the graph's gradients are left as they are
      step.last = compile(forward, options);
    } else {
      step = compile_step(forward, options, g);
    }
    const int64_t arena = std::max(read_memory_plan(step.last).arena_bytes,
                                   step.has_earlier() ? read_memory_plan(step.earlier).arena_bytes : 0);
    model_state = model_state_of(step);
    reduction_staging_ = reduction_staging_bytes(step.last, W);  // the earlier program does not reduce more
    // On the device path: device bytes (the state, the arena, two slots of the batch).
    const int64_t planned = on_device ? model_state + arena + device_batch_bytes(micro_batch_ * local_len_,
                                                                                 config_.data.packed)
                                      : model_state + arena + staging_bytes() + runtime_reserve();
    tried += str(tried.empty() ? "" : ", ", strategy_name(candidate), " ", double(planned) / double(1 << 30), " GiB");
    smallest = std::min(smallest, planned);
    if (budget > 0 && double(planned) > budget) continue;
    joint_ = std::move(step.last);
    earlier_ = std::move(step.earlier);
    strategy_ = candidate;
    arena_ = arena;
    planned_peak_ = planned;
    break;
  }
  if (planned_peak_ == 0)
    user_error("compile.memory_budget_gb ", *config.compile.memory_budget_gb, ": micro batch ", micro_batch_, " x ",
               seq_len_, " tokens does not fit on this rank (planned peak with ", tried,
               "; each is model state ", double(model_state) / double(1 << 30), " GiB + activations + batch staging "
               "and a runtime reserve of ", double(staging_bytes() + runtime_reserve()) / double(1 << 30),
               " GiB); the smallest budget that fits is ",
               double(smallest) / double(1 << 30),
               config.compile.checkpoint == "auto" ? "" : " for this policy (\"auto\" tries every policy)");
  if (!on_device)
    require_host_memory(double(planned_peak_), str("training with micro batch ", micro_batch_, " x ", seq_len_, " tokens"));
  // Compiling freed what it used, but glibc keeps freed heap resident (HeapAllocator turns
  // trimming off so steps reuse pages): hand it back now, or it stays in the resident set
  // beside the arena, outside the plan (measured: +0.75 MB for a tiled graph of 9k nodes).
  malloc_trim(0);

  // The backend runs the step the plan was made for (lowered for it: its kernels' workspaces
  // are in the plan). The two programs of a step
  // with accumulation run one after the other: the one with the larger arena allocates it,
  // the other works in it.
  const Backend backend = parse_backend(config_.backend);
  if (on_device) {
    device_ = make_device_step(joint_, state_.specs, {program_.constants, constants_}, micro_batch_ * local_len_,
                               config_.data.packed, groups_);
  } else if (earlier_.nodes().empty()) {
    executor_ = make_executor(backend, joint_, allocator_, 0, groups_);
  } else if (read_memory_plan(joint_).arena_bytes >= read_memory_plan(earlier_).arena_bytes) {
    executor_ = make_executor(backend, joint_, allocator_, 0, groups_);
    earlier_executor_ = make_executor(backend, earlier_, allocator_, 0, groups_, executor_.get());
    earlier_shares_arena_ = true;
  } else {
    earlier_executor_ = make_executor(backend, earlier_, allocator_, 0, groups_);
    executor_ = make_executor(backend, joint_, allocator_, 0, groups_, earlier_executor_.get());
  }
  double last_flops = 0, earlier_flops = 0;
  for (const Node& node : joint_.nodes()) last_flops += node_cost(joint_, node).flops;
  for (const Node& node : earlier_.nodes()) earlier_flops += node_cost(earlier_, node).flops;
  step_flops_ = last_flops + double(g - 1) * (earlier_.nodes().empty() ? last_flops : earlier_flops);
  // The compiled program itself (the graph and the executor's per-value tables) grows with
  // the graph's size, not the sequence's: counted as the allocator has it now, before the
  // first step (the arena excluded: it is in the plan already).
  program_bytes_ = std::max<int64_t>(0, int64_t(mallinfo2().uordblks - heap_before) - arena_);
  planned_peak_ += program_bytes_;
  // The optimizer takes this rank's shards of the moments (and, under stages 2 and 3, the
  // layout of the step's gradient buckets); the full moments are dropped. A resumed state
  // is read here, each rank reading only what it keeps: the whole parameters below stage 3,
  // the whole moments at stage 0, else its shards. Every buffer it fills exists before the
  // reading starts, so the resident peak while reading measures what reading itself costs.
  if (device_) {
    // Tensor by tensor onto the device, from the whole state or a checkpoint's files; the
    // host keeps none of it.
    const RssPhase phase;
    const auto start = std::chrono::steady_clock::now();
    device_->load(state_);
    if (state_.stored) {
      state_load_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      state_load_.rss_growth = phase.peak_growth();
    }
    state_.stored.reset();
    state_.params = {};
    state_.exp_avg = {};
    state_.exp_avg_sq = {};
    constants_ = {};  // (on the device, since make_device_step)
  } else {
    load_host_state();
  }
  // A fresh state was whole on every rank until here: glibc keeps what was freed resident
  // (HeapAllocator turns trimming off), so it is handed back.
  malloc_trim(0);
  // The sum of a step's earlier micro batches (stages 0 and 1 with accumulation); otherwise
  // no gradient is kept beside the step: the optimizer works on its reduced outputs.
  if (!earlier_.nodes().empty())
    for (const auto& spec : state_.specs) grads_.emplace_back(numel(spec.shape), 0.0f);
  AUTOSP_CHECK(model_state_bytes() == model_state, "planned model state ", model_state, " != held ",
               model_state_bytes());
  const int64_t n = micro_batch_ * local_len_;
  inputs_.resize(n);
  labels_.resize(n);
  positions_.resize(n);
  if (config_.data.packed) documents_.resize(n);
  if (executor_) bind_step(*executor_);
  if (earlier_executor_) bind_step(*earlier_executor_);
}

void Trainer::load_host_state() {
  optimizer_ = std::make_unique<ShardedAdamW>(config_, *groups_, state_.specs, read_grad_buckets(joint_));
  if (state_.stored) {
    std::vector<std::pair<StateKind, std::vector<std::vector<float>>*>> whole;
    if (config_.zero_stage < 3) whole.emplace_back(StateKind::params, &state_.params);
    if (config_.zero_stage == 0) {
      whole.emplace_back(StateKind::exp_avg, &state_.exp_avg);
      whole.emplace_back(StateKind::exp_avg_sq, &state_.exp_avg_sq);
    }
    for (auto& [kind, tensors] : whole)
      for (const auto& spec : state_.specs) tensors->emplace_back(numel(spec.shape), 0.0f);
    const RssPhase phase;
    const auto start = std::chrono::steady_clock::now();
    for (auto& [kind, tensors] : whole)
      for (size_t i = 0; i < tensors->size(); ++i)
        state_.stored->read(kind, i, 0, int64_t((*tensors)[i].size()), (*tensors)[i].data());
    optimizer_->load(state_);
    state_load_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state_load_.rss_growth = phase.peak_growth();
    state_.stored.reset();  // closes the checkpoint's files
  } else {
    optimizer_->load(state_);
  }
  if (config_.zero_stage >= 1) {
    state_.exp_avg.clear();
    state_.exp_avg_sq.clear();
  }
  if (config_.zero_stage == 3) state_.params = {};  // the optimizer holds this rank's shards of them
}

Trainer::~Trainer() {
  // The executor working in the other's arena goes first.
  if (earlier_shares_arena_) earlier_executor_.reset();
  executor_.reset();
  earlier_executor_.reset();
}

void Trainer::bind_step(Executor& ex) {
  bind_parameters(ex);
  bind_constants(ex);
  ex.bind("input_ids", inputs_.data());
  ex.bind("labels", labels_.data());
  ex.bind("position_ids", positions_.data());
  if (config_.data.packed) ex.bind("document_ids", documents_.data());
  for (ValueId in : ex.graph().inputs_with_role(Role::gradient)) {
    const std::string& name = ex.graph().value(in).name;
    AUTOSP_CHECK(name.starts_with(kGradAccPrefix), "gradient input ", name);
    const std::string param = name.substr(kGradAccPrefix.size());
    const auto it = std::find_if(state_.specs.begin(), state_.specs.end(),
                                 [&](const models::ParameterSpec& s) { return s.name == param; });
    AUTOSP_CHECK(it != state_.specs.end() && grads_.size() == state_.specs.size(), "no gradient sum for ", name);
    ex.bind(in, grads_[size_t(it - state_.specs.begin())].data());
  }
}

int64_t Trainer::staging_bytes() const {
  // load_micro_batch: the full batch and this rank's slice (3 int32 each per token), the
  // trainer's bound inputs (3 per local token), one sample's S + 1 token ids being read.
  const int64_t per_token = config_.data.packed ? 4 : 3;  // + document ids
  return 4 * (micro_batch_ * per_token * (seq_len_ + 2 * local_len_) + seq_len_ + 1);
}

void Trainer::bind_parameters(Executor& ex) const {
  if (config_.zero_stage == 3) {  // every program of this rank reads its shards
    const std::vector<GradBucket> buckets = read_grad_buckets(joint_);
    const std::vector<ValueId> shards = ex.graph().inputs_with_role(Role::parameter);
    AUTOSP_CHECK(shards.size() == buckets.size(), shards.size(), " parameter shards for ", buckets.size(), " groups");
    for (size_t k = 0; k < buckets.size(); ++k) {
      AUTOSP_CHECK(numel(ex.graph().shape(shards[k])) == buckets[k].shard, "parameter shard ", k);
      ex.bind(str(kParamShardPrefix, k), optimizer_->param_shard(k));
    }
    return;
  }
  AUTOSP_CHECK(state_.params.size() == state_.specs.size(), "the parameters are sharded (ZeRO-3)");
  for (size_t i = 0; i < state_.specs.size(); ++i) ex.bind(state_.specs[i].name, state_.params[i].data());
}

void Trainer::bind_constants(Executor& ex) const {
  AUTOSP_CHECK(constants_.size() == program_.constants.size(), "the constants are on the device");
  for (size_t i = 0; i < constants_.size(); ++i) ex.bind(program_.constants[i].name, constants_[i].data());
}

// Every rank of an SP group reads the same samples and keeps its slice of the sequence;
// the tail past S (when P does not divide S) is padding: token 0, no label.
BatchBuffers Trainer::host_batch() {
  return {inputs_.data(), labels_.data(), positions_.data(), config_.data.packed ? documents_.data() : nullptr};
}

void Trainer::load_micro_batch(const DataSource& data, int64_t consumed, int64_t micro, const BatchBuffers& dst) {
  AUTOSP_CHECK(data.packed() == config_.data.packed, "the step was compiled for ",
               config_.data.packed ? "packed" : "unpacked", " samples");
  SequenceBatch full{micro_batch_, seq_len_, {}, {}, {}, {}};
  full.input_ids.resize(micro_batch_ * seq_len_);
  full.labels.resize(micro_batch_ * seq_len_);
  full.position_ids.resize(micro_batch_ * seq_len_);
  full.document_ids.resize(micro_batch_ * seq_len_);
  for (int64_t j = 0; j < micro_batch_; ++j) {
    const int64_t k = io::TokenFile::sample_index(consumed, micro, groups_->dp_rank,
                                                  groups_->dp_size, j, micro_batch_);
    const int64_t row = j * seq_len_;
    data.read_sample(k, seq_len_, full.input_ids.data() + row, full.labels.data() + row);
    data.read_layout(k, seq_len_, full.position_ids.data() + row, full.document_ids.data() + row);
  }
  SequenceBatch local = prepare_autosp_inputs(full, groups_->sp_rank, groups_->sp_size);
  std::copy(local.input_ids.begin(), local.input_ids.end(), dst.input_ids);
  std::copy(local.labels.begin(), local.labels.end(), dst.labels);
  std::copy(local.position_ids.begin(), local.position_ids.end(), dst.position_ids);
  if (config_.data.packed) std::copy(local.document_ids.begin(), local.document_ids.end(), dst.document_ids);
}

StepStats Trainer::train_step(const DataSource& data) {
  if (device_) return train_step_on_device(data);
  const auto start = std::chrono::steady_clock::now();
  const int64_t g = config_.gradient_accumulation_steps.value();
  const int64_t t = state_.step;
  allocator_.reset_peak();
  double loss_sum = 0;
  // DeepSpeed scales each micro batch's loss by 1/g: the step's gradient is the mean.
  const float inv_g = g == 1 ? 1.0f : 1.0f / float(g);
  for (int64_t m = 0; m < g; ++m) {
    load_micro_batch(data, state_.consumed_samples, m, host_batch());
    if (earlier_executor_ && m + 1 < g) {
      // Before the last micro batch (stages 0 and 1): the gradients add up on the rank, and
      // the last program adds them to its own and reduces the sum once.
      earlier_executor_->run();
      loss_sum += earlier_executor_->output("loss")[0];  // this rank's part of its replica's loss
      for (size_t i = 0; i < grads_.size(); ++i) {
        const float* d = earlier_executor_->output(kGradPrefix + state_.specs[i].name);
        float* acc = grads_[i].data();
        const auto n = static_cast<int64_t>(grads_[i].size());
        if (m == 0) {
          std::copy_n(d, n, acc);
        } else {
          for (int64_t e = 0; e < n; ++e) acc[e] += d[e];
        }
      }
      continue;
    }
    executor_->run();
    loss_sum += executor_->output("loss")[0];
    // Stages 2 and 3 reduce each micro batch, and the shards add up in the optimizer.
    if (optimizer_->accumulates())
      optimizer_->accumulate([&](size_t k) { return executor_->output(str(kGradShardPrefix, k)); }, inv_g, m == 0);
  }
  // The replica's loss is the sum of its SP ranks' parts; the step's is the DP mean.
  groups_->world->all_reduce_sum(&loss_sum, 1);
  const double loss = loss_sum / double(g) / double(groups_->dp_size);

  // Every rank sees the same (reduced) loss and norm, so all stop here together.
  if (!std::isfinite(loss))
    user_error("step ", t + 1, ": the loss is ", loss, " (a micro batch with no labelled tokens gives 0/0; "
               "otherwise the model diverged: lower the learning rate); no update was applied");
  const double lr = lr_at(config_.scheduler, config_.optimizer.lr, t);
  // Otherwise the last program's outputs are the step's reduced gradients (stages 0 and 1:
  // of the sum of every micro batch); the optimizer takes them where the program left them
  // (they are this rank's until the next run).
  std::vector<float*> reduced;
  float scale = 1.0f;
  if (optimizer_->accumulates()) {
    reduced = optimizer_->accumulated();
  } else {
    for (size_t k = 0; k < read_grad_buckets(joint_).size(); ++k)
      reduced.push_back(executor_->mutable_output(str(config_.zero_stage == 0 ? kGradReducedPrefix : kGradShardPrefix, k)));
    scale = inv_g;
  }
  const auto optimizer_start = std::chrono::steady_clock::now();
  const double norm = optimizer_->step(state_, lr, reduced, scale);
  if (profile_enabled())
    global_profile().add_outside("optimizer", std::chrono::duration<double>(std::chrono::steady_clock::now() - optimizer_start).count());
  if (!std::isfinite(norm))
    user_error("step ", t + 1, ": the gradient norm is ", norm, "; the parameters are no longer finite "
               "(checkpoints already written are intact)");
  state_.step = t + 1;
  const int64_t first_sample = state_.consumed_samples;
  state_.consumed_samples += g * micro_batch_ * groups_->dp_size;
  StepStats s = step_stats(first_sample, loss, lr, norm, start);
  s.activation_bytes = allocator_.peak_bytes();
  s.peak_bytes = s.activation_bytes + s.model_state_bytes;
  return s;
}

StepStats Trainer::step_stats(int64_t first_sample, double loss, double lr, double norm,
                              std::chrono::steady_clock::time_point start) const {
  const int64_t g = config_.gradient_accumulation_steps.value();
  StepStats s;
  s.first_sample = first_sample;
  s.consumed_samples = state_.consumed_samples;
  s.step = state_.step;
  s.loss = loss;
  s.lr = lr;
  s.grad_norm = norm;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  s.tokens_per_s = double(g * micro_batch_ * seq_len_ * groups_->dp_size) / s.seconds;
  if (profile_enabled()) global_profile().add_step(s.seconds);
  s.model_state_bytes = model_state_bytes();
  s.planned_peak_bytes = planned_peak_;
  s.flops = step_flops_;
  return s;
}

// The device path (device_step.h): everything is enqueued, and the host waits once, at the
// end, for the loss and the norm. While the device runs a micro batch, the host reads the
// next one from the data and its copy is enqueued on the copy stream; after the optimizer,
// the next step's first micro batch is read and copied the same way.
StepStats Trainer::train_step_on_device(const DataSource& data) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t g = config_.gradient_accumulation_steps.value();
  const int64_t t = state_.step;
  // A checkpoint's host copy of the state (checkpoint_shards) is not kept past it.
  state_.params = {};
  state_.exp_avg = {};
  state_.exp_avg_sq = {};
  auto stage = [&](int64_t consumed, int64_t micro) {
    load_micro_batch(data, consumed, micro, device_->staging());
    device_->upload();
  };
  if (prefetched_from_ != &data || prefetched_at_ != state_.consumed_samples) stage(state_.consumed_samples, 0);
  prefetched_from_ = nullptr;
  // DeepSpeed scales each micro batch's loss by 1/g: the step's gradient is the mean. The
  // world's sum (reduce_gradients) is then over the sequence ranks' parts of each replica's
  // gradient and the data-parallel replicas, which average: 1/D as well.
  const int64_t D = groups_->dp_size;
  const float scale = g * D == 1 ? 1.0f : float(1.0 / double(g * D));
  for (int64_t m = 0; m < g; ++m) {
    device_->micro_batch(m == 0, scale);
    if (m + 1 < g) stage(state_.consumed_samples, m + 1);
  }
  const double lr = lr_at(config_.scheduler, config_.optimizer.lr, t);
  device_->optimizer(config_.optimizer, lr, t + 1, config_.gradient_clipping);
  const int64_t next = state_.consumed_samples + g * micro_batch_ * D;
  stage(next, 0);
  prefetched_from_ = &data;
  prefetched_at_ = next;
  const DeviceStepResult r = device_->finish();
  // The replica's loss is the sum of its SP ranks' parts; the step's is the DP mean.
  double loss_sum = r.loss_sum;
  groups_->world->all_reduce_sum(&loss_sum, 1);
  const double loss = loss_sum / double(g) / double(D);
  if (!std::isfinite(loss))
    user_error("step ", t + 1, ": the loss is ", loss, " (a micro batch with no labelled tokens gives 0/0; "
               "otherwise the model diverged: lower the learning rate); ",
               r.applied ? "the update of its finite gradients was applied on the device (checkpoints already "
                           "written are intact)"
                         : "no update was applied");
  if (!r.applied || !std::isfinite(r.grad_norm))
    user_error("step ", t + 1, ": the gradient norm is ", r.grad_norm, "; no update was applied "
               "(checkpoints already written are intact)");
  state_.step = t + 1;
  const int64_t first_sample = state_.consumed_samples;
  state_.consumed_samples = next;
  StepStats s = step_stats(first_sample, loss, lr, r.grad_norm, start);
  s.activation_bytes = device_->arena_bytes();
  s.peak_bytes = s.activation_bytes + s.model_state_bytes;
  return s;
}

StateShards Trainer::checkpoint_shards() {
  StateShards out;
  if (device_) {
    // Every rank holds the whole state (ZeRO stage 0) and only rank 0 writes it
    // (train::save_checkpoint): the others pass no tensors, which the writer never reads.
    const bool lead = groups_->world->rank() == 0;
    if (lead) device_->download(state_, true);
    for (StateKind kind : kStateKinds) {
      const auto& whole = kind == StateKind::params ? state_.params
                          : kind == StateKind::exp_avg ? state_.exp_avg : state_.exp_avg_sq;
      for (size_t i = 0; i < state_.specs.size(); ++i)
        out.whole[static_cast<size_t>(kind)].push_back(lead ? whole[i].data() : nullptr);
    }
    out.round_elements = std::max<int64_t>(
        1, std::min(config_.zero.allgather_bucket_size, ShardedAdamW::kMaxScratchFloats) / groups_->world->size());
    return out;
  }
  if (config_.zero_stage >= 1) out.layout = optimizer_->layout();
  for (StateKind kind : kStateKinds) {
    const size_t q = static_cast<size_t>(kind);
    out.shards[q] = optimizer_->shards(kind);
    if (!out.shards[q].empty()) continue;
    const auto& whole = kind == StateKind::params ? state_.params : kind == StateKind::exp_avg ? state_.exp_avg
                                                                                               : state_.exp_avg_sq;
    AUTOSP_CHECK(whole.size() == state_.specs.size(), "state kind ", q, " is neither whole nor sharded");
    for (const auto& t : whole) out.whole[q].push_back(t.data());
  }
  // A round brings rank 0 world x round elements: DeepSpeed's all-gather bucket, at most
  // ShardedAdamW's 4 MiB of scratch.
  const int64_t W = groups_->world->size();
  out.round_elements =
      std::max<int64_t>(1, std::min(config_.zero.allgather_bucket_size, ShardedAdamW::kMaxScratchFloats) / W);
  return out;
}

int64_t Trainer::model_state_bytes() const {
  if (device_) return device_->state_bytes();
  int64_t n = 0;
  for (const auto* tensors : {&state_.params, &grads_, &state_.exp_avg, &state_.exp_avg_sq, &constants_})
    for (const auto& t : *tensors) n += static_cast<int64_t>(t.size());
  return 4 * n + optimizer_->bytes();
}

std::vector<float> Trainer::logits(const int32_t* inputs, int64_t B, int64_t S) {
  AUTOSP_CHECK(S == seq_len_, "evaluation uses the training sequence length");
  const bool sharded = config_.zero_stage == 3;
  if (!eval_executor_ || eval_batch_ != B) {
    eval_executor_.reset();
    eval_graph_ = program_.forward({.batch = B, .seq_len = S, .output_loss = false,
                                                 .output_logits = true});
    // Under ZeRO-3 each layer's parameters are gathered where forward needs them, as in the
    // training step (the same groups, so the same shards), and dropped after their last use.
    if (sharded)
      eval_graph_ = grad_sync(eval_graph_, {.zero_stage = 3, .world_size = groups_->world->size(),
                                            .prefetch_elements = config_.zero.stage3_prefetch_bucket_size});
    verify(eval_graph_);
    eval_batch_ = B;
    eval_executor_ = make_executor(parse_backend(config_.backend), eval_graph_, eval_allocator_, 0,
                                   sharded ? groups_ : nullptr);
    if (!device_) {
      bind_parameters(*eval_executor_);
      bind_constants(*eval_executor_);
    }
  }
  if (device_) {  // the fp32 graph, on the master weights as they are now
    device_->download(state_, false);
    bind_parameters(*eval_executor_);
  }
  std::vector<int32_t> positions(B * S);
  for (int64_t i = 0; i < B * S; ++i) positions[i] = static_cast<int32_t>(i % S);
  eval_executor_->bind("input_ids", inputs);
  eval_executor_->bind("position_ids", positions.data());
  eval_executor_->run();
  return eval_executor_->output_vector("logits");
}

void Trainer::predict(const int32_t* inputs, int64_t B, int64_t S, int32_t* argmax) {
  std::vector<float> l = logits(inputs, B, S);
  const int64_t V = program_.vocab_size;
  for (int64_t r = 0; r < B * S; ++r) {
    const float* row = l.data() + r * V;
    int64_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (row[v] > row[best]) best = v;
    argmax[r] = static_cast<int32_t>(best);
  }
}

double Trainer::loss_and_grads(const int32_t* inputs, const int32_t* labels,
                               std::vector<std::vector<float>>& grads) {
  AUTOSP_CHECK(groups_->world->size() == 1, "loss_and_grads is for one process");
  SequenceBatch full{micro_batch_, seq_len_, {inputs, inputs + micro_batch_ * seq_len_},
                     {labels, labels + micro_batch_ * seq_len_}, std::vector<int32_t>(micro_batch_ * seq_len_), {}};
  for (size_t i = 0; i < full.position_ids.size(); ++i) full.position_ids[i] = static_cast<int32_t>(i % seq_len_);
  if (config_.data.packed) full.document_ids.assign(full.position_ids.size(), 0);  // one document
  return loss_and_grads(full, grads);
}

double Trainer::loss_and_grads(const SequenceBatch& full, std::vector<std::vector<float>>& grads) {
  AUTOSP_CHECK(!device_, "loss_and_grads runs the host path's fp32 step, not the device-resident bf16 one");
  AUTOSP_CHECK(groups_->dp_size == 1, "loss_and_grads runs one replica, not ", groups_->dp_size);
  AUTOSP_CHECK(config_.zero_stage == 0 || (config_.zero_stage == 1 && groups_->world->size() == 1),
               "loss_and_grads reads full gradients, which ZeRO stage ", config_.zero_stage, " on ",
               groups_->world->size(), " ranks does not keep");
  AUTOSP_CHECK(full.B == micro_batch_ && full.S == seq_len_, "the step was compiled for ", micro_batch_, " x ",
               seq_len_, " tokens, not ", full.B, " x ", full.S);
  AUTOSP_CHECK(config_.data.packed == !full.document_ids.empty(), "the step was compiled for ",
               config_.data.packed ? "packed" : "unpacked", " samples");
  const SequenceBatch local = prepare_autosp_inputs(full, groups_->sp_rank, groups_->sp_size);
  std::copy(local.input_ids.begin(), local.input_ids.end(), inputs_.begin());
  std::copy(local.labels.begin(), local.labels.end(), labels_.begin());
  std::copy(local.position_ids.begin(), local.position_ids.end(), positions_.begin());
  std::copy(local.document_ids.begin(), local.document_ids.end(), documents_.begin());
  for (auto& g : grads_) std::fill(g.begin(), g.end(), 0.0f);  // no earlier micro batches
  executor_->run();
  // Every bucket output holds its whole bucket: all-reduced over the ranks (ZeRO-0), or
  // reduce-scattered over one rank.
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < state_.specs.size(); ++i) index[state_.specs[i].name] = i;
  grads.assign(state_.specs.size(), {});
  const std::vector<GradBucket> buckets = read_grad_buckets(joint_);
  for (size_t k = 0; k < buckets.size(); ++k) {
    const float* d = executor_->output(str(buckets[k].whole ? kGradReducedPrefix : kGradShardPrefix, k));
    for (size_t j = 0; j < buckets[k].params.size(); d += buckets[k].numel[j], ++j)
      grads.at(index.at(buckets[k].params[j])).assign(d, d + buckets[k].numel[j]);
  }
  // The replica's loss is the sum of its ranks' parts (each: its tokens' losses over the
  // group's count of labelled tokens).
  double loss = executor_->output("loss")[0];
  groups_->world->all_reduce_sum(&loss, 1);
  return loss;
}

}  // namespace autosp::train
