// The training config: a DeepSpeed JSON file, read with DeepSpeed's key names, defaults and
// batch-size rules (deepspeed/runtime/config.py), restricted to what autosp implements.
// A key that would change the maths is implemented or refused, never ignored.
//
//   train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps
//                         integers >= 1; any two (or one of the first two) determine the rest
//                         (resolve_batch)
//   gradient_clipping     number >= 0, 0 = off (default 0)
//   optimizer             {type: "AdamW" | "Adam" (any case), params: {lr, betas: [b1, b2],
//                         eps, weight_decay, torch_adam, adam_w_mode, amsgrad,
//                         bias_correction}}; absent = AdamW. As DeepSpeed's engine:
//                         torch_adam (bool) only picks an implementation, the same maths;
//                         adam_w_mode (bool, default true) makes "Adam" AdamW, and "Adam"
//                         with adam_w_mode false is torch.optim.Adam (L2 weight decay added
//                         to the gradient); "AdamW" is AdamW whatever adam_w_mode says (false
//                         warns). Defaults are those of the torch class with the same update
//                         (lr 1e-3, betas [0.9, 0.999], eps 1e-8; weight_decay 0.01 for AdamW,
//                         0 for torch.optim.Adam). Refused: amsgrad true, bias_correction false,
//                         max_grad_norm (use gradient_clipping, as DeepSpeed says).
//   scheduler             {type: WarmupLR | WarmupDecayLR | WarmupCosineLR, params: {...}}
//                         (see lr_schedule.h); absent = constant lr
//   compile               {deepcompile: bool, passes: [ "z1" | "z3" | "autosp" ... ],
//                         checkpoint: "none" | "full" | "sac" | "auto" (passes/checkpoint.h;
//                         default sac with autosp, else none), memory_budget_gb: number > 0
//                         (GiB per rank; "auto" needs it), tile_rows: integer >= 0, rows of
//                         this rank's sequence per MLP tile (passes/tile.h; default 0 = off),
//                         overlap: bool (the CPU executor overlaps the sequence-parallel
//                         all-to-alls with compute; default false)}
//   sequence_parallel_size integer >= 1 (default 1)
//   zero_optimization     {stage: 0..3} (or DeepSpeed's legacy bool; see ZeroConfig for the
//                         other keys, their meaning in autosp, and what is refused)
//   steps_per_print       integer >= 1 (default 10, as DeepSpeed)
//   seed                  integer >= 0 (autosp's own key; default 42)
//   comm                  "auto" | "nccl" | "mpi" (autosp's own key; default "auto"): what the
//                         cuda backend's collectives run on, comm/device_comm.h; AUTOSP_COMM
//                         in the environment overrides it
//   data                  {pack: bool, eos_token_id: integer >= 0 (packed documents; see
//                         train/data.h), shuffle: bool (default true), seed: integer >= 0
//                         (the permutations' seed; default the top-level seed)}
//
// Mixed precision: bf16 (or its old name bfloat16), fp16, amp, torch_autocast, each
// {enabled: bool (default false), ...}. bf16 on the cuda backend runs the bf16 step with fp32
// master weights and optimizer state on the device (train/device_step.h); anything else runs
// the whole step in fp32 (compute, master weights, gradients, optimizer state) on either
// backend: requested_precision records what was asked and precision_warning says what runs.
// The section's other DeepSpeed keys (fp16: auto_cast, loss_scale, initial_scale_power,
// loss_scale_window, hysteresis, consecutive_hysteresis, min_loss_scale,
// fp16_master_weights_and_grads; bf16: immediate_grad_update, check_grad_overflow,
// check_overflow, bf16_master_weights_and_grads, bf16_optimizer_states; torch_autocast:
// dtype, lower_precision_safe_modules; amp: any, as they go to apex) are accepted without a
// warning. Two enabled sections are an error, as in DeepSpeed.
//
// Refused when on (a UserError naming the key and why), accepted silently when off:
//   sparse_attention (on when present), progressive_layer_drop, curriculum_learning,
//   data_efficiency, quantize_training, compression_training, elasticity (on when any
//   "enabled" inside the section is true, named by that path), and
//   communication_data_type, seq_parallel_communication_data_type,
//   data_types.grad_accum_dtype other than "fp32" or null.
//
// Cannot change the numbers:
//   accepted silently: zero_allow_untested_optimizer (bool);
//   silent when off, warned as ignored when on: wall_clock_breakdown, memory_breakdown,
//   dump_state (bools); flops_profiler, tensorboard, wandb, csv_monitor, comms_logger
//   (enabled: true); prescale_gradients true and gradient_predivide_factor != 1 (number
//   > 0; in fp32 they only move rounding).
//
// "auto" (Hugging Face's Trainer fills these in from its TrainingArguments before DeepSpeed
// sees the file; autosp has no TrainingArguments, so it uses their defaults, as
// transformers.integrations.deepspeed.HfTrainerDeepSpeedConfig would with a default Trainer,
// and each choice is reported through the warnings sink as `<key>: "auto" -> <value> (...)`):
//   train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps
//                         "auto" is as if absent: derived from the others (resolve_batch);
//                         where neither train_batch_size nor the micro batch is a number, the
//                         micro batch is per_device_train_batch_size's default 8 and the
//                         accumulation gradient_accumulation_steps' default 1
//   gradient_clipping     1.0 (max_grad_norm's default)
//   optimizer.params      lr 5e-5, betas [0.9, 0.999], eps 1e-8, weight_decay 0.0
//   scheduler.params      warmup_min_lr 0, warmup_max_lr = the optimizer's lr
//   bf16/fp16.enabled     false (bf16 and fp16 default to off)
//   zero_optimization     reduce_bucket_size hidden^2, stage3_prefetch_bucket_size
//                         0.9 hidden^2, stage3_param_persistence_threshold 10 hidden (from the
//                         model: resolve_model_auto)
// Any other "auto" is a UserError naming the key (e.g. scheduler.params.total_num_steps,
// which Hugging Face derives from its own step count).
//
// A value of the wrong type or out of range is a UserError naming the file and key path,
// e.g. `config.json: optimizer.params.betas: expected an array of 2 numbers, got "x"`.
// An unknown key within a small edit distance of a known key of the same section
// (Damerau-Levenshtein <= 2, <= 1 for keys of up to 4 characters; case ignored) is a typo
// that would silently train with a default, so it is a UserError too:
// `config.json: gradient_acumulation_steps: unknown key; did you mean "gradient_accumulation_steps"?`.
// Any other key is not an error (DeepSpeed configs carry many that do not touch the
// maths): it yields a warning naming the key path ("unknown key, ignored"), returned to the
// caller. DeepSpeed's activation_checkpointing section (which configures checkpointing that
// model code calls) is ignored with a warning naming compile.checkpoint, where autosp's
// compiler takes that choice, and the policy this run uses.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/model_weights.h"
#include "train/adamw.h"
#include "train/lr_schedule.h"

namespace autosp::models {
struct LlamaConfig;
}

namespace autosp::train {

struct CompileConfig {
  bool deepcompile = false;
  std::vector<std::string> passes;  // in the order given
  // compile.checkpoint: "none", "full", "sac" or "auto" (the cheapest to run whose plan fits
  // memory_budget_gb); absent: sac with the autosp pass, else none.
  std::optional<std::string> checkpoint;
  // compile.memory_budget_gb: bytes per rank (in GiB, 2^30) the planned peak must fit in,
  // checked before the first step.
  std::optional<double> memory_budget_gb;
  // compile.tile_rows: sequence rows per tile of the row-wise regions; 0 = no tiling.
  int64_t tile_rows = 0;
  // compile.overlap: the executor runs the sequence-parallel all-to-alls while it computes what
  // does not need them (passes/plan_memory.h, overlap; on cuda on a communication stream,
  // runtime/cuda_executor.h); the numbers do not change.
  bool overlap = false;
};

// zero_optimization, with DeepSpeed's keys as DeepSpeed means them (deepspeed/runtime/zero/
// config.py; sizes are element counts, defaults DeepSpeed's):
//   stage                 0: gradients all-reduced, everything replicated; 1: AdamW moments
//                         sharded 1/W over the whole DP x SP world; 2: also the gradients,
//                         reduce-scattered inside the compiled step by the grad_sync pass
//                         (passes/grad_sync.h); 3: also the parameters, gathered per layer
//                         inside the step by the same pass
//   reduce_bucket_size    elements per gradient reduction: stage 2's grad_sync buckets, stage
//                         1's rounds of the optimizer's chunked reduce-scatter (capped by its
//                         4 MiB scratch)
//   allgather_bucket_size elements per round of the parameter all-gather after the step
//                         (stages 1 and 2; capped the same way)
//   overlap_comm          bool. grad_sync always issues each bucket's reduction as soon as its
//                         gradients are final; the CPU executor runs nodes one at a time, so
//                         true warns that nothing overlaps on this backend
//   contiguous_gradients  bool. grad_sync always copies a bucket's gradients into one
//                         contiguous buffer (it is what is reduced); false warns so
//   stage3_prefetch_bucket_size  stage 3: a layer's gather is issued one layer early (at the
//                         first use of the layer before it) when the layer has at most this
//                         many elements
//   stage3_param_persistence_threshold, stage3_max_live_parameters, stage3_max_reuse_distance:
//                         range-checked; under stage 3 a given value warns that it is ignored
//                         (autosp shards every parameter and gathers per layer)
//   stage3_gather_16bit_weights_on_model_save (and its old name ..._fp16_...): accepted; a
//                         checkpoint is always the consolidated model
//   reduce_scatter, allgather_partitions, round_robin_gradients, sub_group_size,
//   elastic_checkpoint, load_from_fp32_weights, ignore_unused_parameters: accepted (they
//   choose between implementations of the same sums)
//   offload_optimizer, offload_param: {device: "none" | "cpu" | "nvme", ...}; "cpu" and "nvme"
//   are a UserError: on the CPU backend the state already lives in host memory
//   zero_quantized_weights, zero_quantized_gradients (ZeRO++): refused when true (they round
//   what is communicated); zero_hpz_partition_size other than 1 refused
struct ZeroConfig {
  int stage = 0;
  int64_t reduce_bucket_size = 500000000;
  int64_t allgather_bucket_size = 500000000;
  int64_t stage3_prefetch_bucket_size = 50000000;
  int64_t stage3_param_persistence_threshold = 100000;
  bool overlap_comm = false;
  bool contiguous_gradients = true;
  // Keys given as "auto", filled in from the model by resolve_model_auto.
  std::vector<std::string> auto_keys;
};

// data (autosp's own key): {pack: bool, eos_token_id: integer >= 0, shuffle: bool, seed:
// integer >= 0}: how --data's tokens become samples, and in which order they are read. An indexed dataset (PREFIX.bin + PREFIX.idx) packs its documents unless
// pack is false; a flat token file packs when eos_token_id is given (each such token ends
// a document) unless pack is false. Packed samples restart positions at each document,
// give a document's last token no label and keep attention within documents
// (DataSource::packed, read_layout).
struct DataConfig {
  std::optional<bool> pack;
  std::optional<int64_t> eos_token_id;
  // Sample order (train::order_samples): shuffled by default, a new permutation of the
  // samples each epoch from (seed, epoch); false reads the file's samples in order.
  bool shuffle = true;
  // data.seed as given; absent, the run's top-level seed (after --seed), which run_train
  // writes here before the data is opened.
  std::optional<uint64_t> seed;
  // Resolved from the data source (DataSource::packed()) before the trainer compiles: the
  // step's graph then takes document ids.
  bool packed = false;
};

struct TrainConfig {
  // As given; resolve_batch fills in the missing ones and checks
  // train_batch_size == micro x accumulation x data-parallel size.
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> train_micro_batch_size_per_gpu;
  std::optional<int64_t> gradient_accumulation_steps;
  std::vector<std::string> auto_batch_keys;  // batch keys given as "auto", for resolve_batch's notes
  double gradient_clipping = 0.0;  // max global grad norm; 0 = no clipping
  AdamWParams optimizer;           // optimizer.type and params (Adam or AdamW)
  SchedulerConfig scheduler;
  CompileConfig compile;
  int64_t sequence_parallel_size = 1;
  int zero_stage = 0;  // zero.stage: 0, 1, 2 or 3
  ZeroConfig zero;
  int64_t steps_per_print = 10;
  std::string comm = "auto";  // the cuda backend's collectives (comm/device_comm.h)
  uint64_t seed = 42;
  DataConfig data;
  // checkpoint.max_shard_size: --save shards the weights above this many bytes, as
  // save_pretrained(max_shard_size=...) does (transformers' default; io::parse_shard_size
  // reads "5GB", "500MiB" or a number of bytes).
  int64_t max_shard_bytes = io::kDefaultMaxShardBytes;
  // "fp32", or the mixed precision a section asked for ("bf16", "fp16", "amp",
  // "torch_autocast"). The CPU backend runs fp32 either way; parsing warns when they differ.
  std::string requested_precision = "fp32";
  std::string precision_key;  // the key that asked for it ("bf16.enabled", ...); empty for fp32
  // Where the step runs: "cpu" or "cuda" (runtime/executor.h, make_executor). Not a
  // DeepSpeed key: `autosp train --backend` sets it.
  std::string backend = "cpu";
  // What the file left to defaults, for the start-up summary (describe_optimizer,
  // describe_scheduler): {"optimizer"} without an optimizer section, else the params of
  // lr, betas, eps, weight_decay it does not give; the scheduler's params likewise (empty
  // without a scheduler section: the lr is constant).
  std::vector<std::string> optimizer_defaults, scheduler_defaults;
};

// One line each, for the start-up log: the optimizer with every hyperparameter it runs with,
// and the learning-rate schedule, naming what came from defaults, e.g.
//   optimizer: AdamW lr 0.001 betas (0.9, 0.999) eps 1e-08 weight_decay 0.01 (defaults: no optimizer section)
//   scheduler: constant lr 0.001 (no scheduler section)
std::string describe_optimizer(const TrainConfig& config);
std::string describe_scheduler(const TrainConfig& config);

// Reads a DeepSpeed config object. `source` names it in messages (usually the file path).
// Unknown keys are appended to *warnings (if not null) as "<source>: <key path>: ...".
TrainConfig parse_train_config(const nlohmann::json& json, const std::string& source,
                               std::vector<std::string>* warnings);

// What runs when the config asked for a precision the backend (config.backend) does not run
// (anything but fp32, or bf16 on cuda): the warning "<source>: <key>: true, but ...", which says
// the run is fp32 throughout.
std::optional<std::string> precision_warning(const TrainConfig& config, const std::string& source);

// Reads and parses the file at `path`; unreadable files, invalid JSON and duplicate keys
// (which DeepSpeed also rejects) are UserErrors naming the path.
TrainConfig load_train_config(const std::string& path, std::vector<std::string>* warnings);

// DeepSpeed's _set_batch_related_parameters + _batch_assertion with world size = dp_size
// (data-parallel replicas; the ranks of one sequence-parallel group share a batch):
//   all three given                 -> only checked
//   batch + micro                   -> accumulation = batch / micro / dp   (integer division)
//   batch + accumulation            -> micro = batch / dp / accumulation
//   micro + accumulation            -> batch = micro * accumulation * dp
//   batch only                      -> accumulation = 1, micro = batch / dp
//   micro only                      -> accumulation = 1, batch = micro * dp
//   neither batch nor micro         -> UserError
// then every value must be >= 1 and batch == micro * accumulation * dp, else a UserError.
// When `notes` is given, a note per batch key the config gave as "auto" says what it became.
void resolve_batch(TrainConfig& config, int dp_size, const std::string& source,
                   std::vector<std::string>* notes = nullptr);

// The model's heads against the sequence-parallel size P, checked before any data or weights
// are read (the autosp pass would find the same at the first step, in compiler terms).
// Ulysses gives each rank NH/P whole query heads, so P must divide NH; the KV heads are
// split over the ranks when P divides NKV and repeated when NKV divides P. A UserError names
// `model_source` (the model's config.json), the keys, `sp_source` (where P came from, e.g.
// "sequence_parallel_size 3 (ds.json)" or "--sp 3") and the sizes that would work.
void check_heads_layout(const models::LlamaConfig& model, int64_t sp, const std::string& sp_source,
                        const std::string& model_source);

// Fills the zero_optimization keys given as "auto" from the model's hidden size, as Hugging
// Face's integration does; a note per key says what it became.
void resolve_model_auto(TrainConfig& config, int64_t hidden_size, const std::string& source,
                        std::vector<std::string>* notes);

}  // namespace autosp::train
