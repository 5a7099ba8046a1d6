// The training loop's core: a compiled training step for one model and one batch shape,
// the parameters and AdamW state it updates, and forward-only prediction for evaluation.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "ir/graph.h"
#include "models/llama.h"
#include "models/model.h"
#include "passes/autosp.h"
#include "passes/checkpoint.h"
#include "passes/tile.h"
#include "runtime/executor.h"
#include "train/config.h"
#include "train/data.h"
#include "train/device_step.h"
#include "train/state_shards.h"

namespace autosp::train {

// Tensors of the model state read on demand, by element range (a checkpoint's files,
// train/checkpoint.h): each rank reads only the elements it keeps.
class StoredState {
 public:
  virtual ~StoredState() = default;
  // Elements [begin, begin + n) of tensor `index` (of ModelState::specs) of `kind`.
  virtual void read(StateKind kind, size_t index, int64_t begin, int64_t n, float* out) const = 0;
};

// Parameters and optimizer state, one entry per models::llama_parameters() tensor.
struct ModelState {
  std::vector<models::ParameterSpec> specs;
  std::vector<std::vector<float>> params, exp_avg, exp_avg_sq;
  int64_t step = 0;              // optimizer steps taken so far
  int64_t consumed_samples = 0;  // global samples read so far: where the data continues
  // A checkpoint being resumed: params and the moments are empty, and the trainer reads from
  // here what this rank keeps (whole tensors or its shards), then drops it.
  std::shared_ptr<const StoredState> stored;

  // Elements [begin, begin + n) of tensor i of `kind`: from the vectors above when they hold
  // it, else from `stored`.
  void read(StateKind kind, size_t i, int64_t begin, int64_t n, float* out) const;

  // Fresh state: seeded init, zero moments.
  static ModelState initial(const models::LlamaConfig& config, uint64_t seed);
  // Given weights (one per spec, in order), zero moments.
  static ModelState with_weights(std::vector<models::ParameterSpec> specs, std::vector<std::vector<float>> params);
};

// How a step trades compute for memory: which activations backward recomputes, and whether
// the MLPs run over sequence tiles.
struct MemoryStrategy {
  CheckpointOptions checkpoint;
  TileOptions tile;
};
std::string strategy_name(const MemoryStrategy& s);  // "sac", "sac+matmuls", "full+tiles(256)", ...

// The strategies the trainer tries, cheapest to run first: the one the config names
// (compile.checkpoint, absent: sac when the autosp pass runs, as DESIGN.md pairs them, else
// none; compile.tile_rows), or for checkpoint "auto" all of them, from keeping everything
// to recomputing whole layers over MLP tiles sized from the budget (`budget_bytes`).
std::vector<MemoryStrategy> strategy_candidates(const CompileConfig& compile, int64_t budget_bytes);

// What the runtime holds beyond the plan's buffers and does not grow with the sequence:
// thread stacks, OpenMP's per-thread state and cpu::gemm's packing workspace (270 KiB a
// thread, kernels/cpu/gemm.h), the executor's bookkeeping. Measured as VmHWM minus (model
// state + arena + batch staging) on the reference Llama: 1.95-2.15 MB with 2 threads (one
// process, S = 1024..16384), 1.35-1.55 MB with 1 thread (each of 2 MPI ranks, S = 8192),
// when OpenBLAS ran the gemms with per-thread buffers of its own (issue 25 replaced it; the
// reserve was kept). The fixed part grew by 128 KiB when the executable's code did (4.8 to 7.0
// MB of text with cuDNN attention and the device-resident step, code an MPI rank's step pages
// in beside the plan): each of 2 MPI ranks at S = 8192 measured 2.9% over its plan on average
// before, 4.1% after (18 runs each, 1.0-7.2%). It grew by 128 KiB again with 7.5 MB of text
// (the torch.export importer, the cuda overlap): 2 ranks at S = 8192 measured 0.3-5.2% over
// their plans (42 rank-steps, mean 2.8%; one process 0-1.4%), and a fresh clone's test failed
// at 5.2%. At 1024 KiB a fresh clone's ranks still measured +0.5-5.2% (mean 2.8%; a warm build
// directory's -0.8-3.2%): the fixed part is 1280 KiB, which centres them. Counted in every
// planned peak.
inline int64_t runtime_reserve_bytes(int threads) { return (int64_t{1280} << 10) + (int64_t{640} << 10) * threads; }

// What MPI stages the step's reductions in, beside the plan, on `world` ranks: 3 x the
// largest all-reduce or reduce-scatter the compiled step makes, each call being at most
// MpiCommunicator::kMaxReductionCallBytes (rank 0's worst case: comm/mpi_communicator.h);
// 0 on one rank. Counted in every planned peak.
int64_t reduction_staging_bytes(const Graph& step, int64_t world);

// A UserError when `bytes` (what `what` needs at least) exceed this machine's memory, so
// an impossible run says so before it allocates instead of dying in the allocator.
void require_host_memory(double bytes, const std::string& what);

struct StepStats {
  int64_t step = 0;  // 1-based number of the optimizer step just taken
  int64_t first_sample = 0, consumed_samples = 0;  // global samples [first, consumed) this step read
  double loss = 0, lr = 0, grad_norm = 0;
  double seconds = 0, tokens_per_s = 0;
  int64_t peak_bytes = 0;        // activations (allocator peak) + parameters, grads, moments
  int64_t activation_bytes = 0;  // the executor's allocator peak alone
  // Parameters, gradients, optimizer state and its scratch held on this rank (under ZeRO-1
  // the moments are this rank's shard): peak_bytes less the activations.
  int64_t model_state_bytes = 0;
  // The plan's peak for this rank, known before the first step: model state + the activation
  // arena (plan_memory, workspaces included) + batch staging + the compiled program's host
  // tables + runtime_reserve_bytes().
  int64_t planned_peak_bytes = 0;
  // Floating-point operations of this rank's step as the ops' cost rules count them (the
  // compiled graph's nodes, once per micro batch; the optimizer update is not counted).
  double flops = 0;
};

class Trainer {
 public:
  // Compiles the training step for micro batch `config.train_micro_batch_size_per_gpu` x
  // seq_len (resolve_batch must have run) on this rank of `groups` (sequence parallel when
  // groups.sp_size > 1). Without groups: one process, one rank.
  Trainer(const models::LlamaConfig& model, const TrainConfig& config, int64_t seq_len,
          ModelState state, ProcessGroups* groups = nullptr);
  // Any model (an imported PyTorch program, frontend/torch_import.h): the same compiler and
  // runtime; model() is then a default LlamaConfig, which nothing of the step reads.
  Trainer(const models::Model& model, const TrainConfig& config, int64_t seq_len, ModelState state,
          ProcessGroups* groups = nullptr);
  ~Trainer();

  // One optimizer step: gradient_accumulation_steps micro batches, clipping, AdamW. Reads the
  // global batch that follows state().consumed_samples.
  StepStats train_step(const DataSource& data);

  // Forward only: the argmax of the logits at every position, for B x S inputs.
  void predict(const int32_t* inputs, int64_t B, int64_t S, int32_t* argmax);
  // Forward only, for tests: logits [B, S, V] and the loss of one micro batch. Under ZeRO-3
  // a collective (every rank calls it): the graph gathers each layer's parameters before its
  // first use and drops them after the last (passes/grad_sync.h), as the training step does.
  std::vector<float> logits(const int32_t* inputs, int64_t B, int64_t S);
  // Runs the step's last program once on one micro batch (one process, no sequence
  // parallelism, ZeRO stage 0 or 1, no earlier micro batches; positions 0..S-1, packed: one
  // document); returns its loss and fills `grads` (one vector per parameter), for tests.
  double loss_and_grads(const int32_t* inputs, const int32_t* labels,
                        std::vector<std::vector<float>>& grads);
  // The same for a micro batch given whole (input ids, labels, positions and, packed, document
  // ids of B x S tokens), on one replica: one process, or under sequence parallelism every
  // rank of the group (a collective; no data parallelism, ZeRO-0 beyond one rank), each
  // keeping its slice as a training step does. The loss and the gradients are the replica's,
  // the same on every rank, for tests.
  double loss_and_grads(const SequenceBatch& full, std::vector<std::vector<float>>& grads);

  // The state's step counters; its tensors, except on the device path (device_resident()),
  // where they live on the GPU and checkpoint_shards() brings them to the host.
  const ModelState& state() const { return state_; }
  // This rank's part of the state for a checkpoint (train::save_checkpoint): the tensors it
  // holds whole, and its shards with their layout. On the device path the whole state is
  // copied to host memory first (kept until the next step).
  StateShards checkpoint_shards();
  // `autosp train --backend cuda` with bf16 enabled: the bf16 step with parameters, gradients
  // and optimizer state resident on the device (train/device_step.h); stats are device bytes.
  bool device_resident() const { return device_ != nullptr; }
  // Reading a resumed state (ModelState::stored) into what this rank keeps, in the
  // constructor: how long it took and how far the resident set's peak rose above the
  // buffers it filled (RssPhase; they are allocated first). Zero when nothing was stored.
  struct StateLoad {
    double seconds = 0;
    int64_t rss_growth = 0;
  };
  const StateLoad& state_load() const { return state_load_; }
  const ProcessGroups& groups() const { return *groups_; }
  // The compiled programs: the step's last micro batch, and (ZeRO 0/1 with gradient
  // accumulation, else no nodes) the micro batches before it (passes/pipeline.h).
  const Graph& joint_graph() const { return joint_; }
  const Graph& earlier_graph() const { return earlier_; }
  const MemoryStrategy& strategy() const { return strategy_; }
  int64_t planned_peak_bytes() const { return planned_peak_; }
  int64_t planned_arena_bytes() const { return arena_; }  // the larger program's: they share it
  // Host buffers a step stages its micro batch in (token ids, labels, positions and, packed,
  // document ids of the whole sequence and of this rank's slice), outside the arena.
  int64_t staging_bytes() const;
  // runtime_reserve_bytes and the step's reduction_staging_bytes.
  int64_t runtime_reserve() const { return runtime_reserve_bytes(threads_) + reduction_staging_; }
  int64_t program_bytes() const { return program_bytes_; }  // the compiled graph and executor tables
  // Parameters, gradients kept between micro batches, optimizer state and its scratch, and the
  // model's constants, on this rank (StepStats::model_state_bytes).
  int64_t model_state_bytes() const;
  const models::LlamaConfig& model() const { return model_; }

 private:
  void bind_parameters(Executor& ex) const;
  void bind_constants(Executor& ex) const;
  void bind_step(Executor& ex);  // parameters, the staged micro batch, the accumulated gradients
  // Micro batch `micro` of the step that begins at global sample `consumed`, this rank's
  // slice, into dst.
  void load_micro_batch(const DataSource& data, int64_t consumed, int64_t micro, const BatchBuffers& dst);
  BatchBuffers host_batch();  // inputs_, labels_, positions_, documents_
  // The host path's optimizer, holding (or reading) the state as ZeRO's stage says.
  void load_host_state();
  StepStats train_step_on_device(const DataSource& data);
  StepStats step_stats(int64_t first_sample, double loss, double lr, double norm,
                       std::chrono::steady_clock::time_point start) const;

  models::LlamaConfig model_;
  models::Model program_;  // what the step is compiled from
  TrainConfig config_;
  int64_t seq_len_, micro_batch_;
  ModelState state_;
  ProcessGroups own_groups_;  // single-rank groups when none are given
  ProcessGroups* groups_;
  std::unique_ptr<class ShardedAdamW> optimizer_;  // null on the device path
  // The device path's step and state (null otherwise), and the step whose first micro batch it
  // has uploaded ahead: the data (by address: the training loop passes one DataSource, whose
  // samples do not change) and the global sample it begins at.
  std::unique_ptr<DeviceStep> device_;
  const DataSource* prefetched_from_ = nullptr;
  int64_t prefetched_at_ = -1;
  int64_t local_len_ = 0;     // this rank's slice of the sequence (autosp SequenceSplit)
  Graph joint_, earlier_;
  MemoryStrategy strategy_;
  int64_t arena_ = 0, planned_peak_ = 0, program_bytes_ = 0, reduction_staging_ = 0;
  double step_flops_ = 0;  // the compiled programs of one optimizer step, this rank
  int threads_ = 1;  // the executor's kernel threads
  HeapAllocator allocator_;
  // The last micro batch's program, and the earlier ones' (null without); the one made
  // second works in the arena of the other, and is destroyed first (~Trainer).
  std::unique_ptr<Executor> executor_, earlier_executor_;
  bool earlier_shares_arena_ = false;
  // Stages 0 and 1 with accumulation: the sum of a step's earlier micro batches' gradients
  // (the last program's "grad_acc:<name>" inputs); empty otherwise.
  std::vector<std::vector<float>> grads_;
  // The model's constants (Model::constants), fp32, bound beside the parameters; on the device
  // path the device step holds them (bf16) instead and this is empty.
  std::vector<std::vector<float>> constants_;
  std::vector<int32_t> inputs_, labels_, positions_, documents_;
  // Forward-only executors for predict/logits, compiled on first use per batch size.
  Graph eval_graph_;
  int64_t eval_batch_ = 0;
  HeapAllocator eval_allocator_;
  std::unique_ptr<Executor> eval_executor_;
  StateLoad state_load_;
};

}  // namespace autosp::train
