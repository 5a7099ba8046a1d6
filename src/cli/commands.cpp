#include "cli/commands.h"

#include <charconv>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "comm/mpi_communicator.h"
#include "frontend/torch_import.h"
#include "io/model_weights.h"
#include "kernels/cpu/isa.h"
#include "models/llama.h"
#include "passes/autosp.h"
#include "passes/pipeline.h"
#include "runtime/profile.h"
#include "runtime/threads.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/data.h"
#include "train/loop.h"
#include "train/passkey.h"
#include "train/throughput_window.h"
#include "train/step_options.h"
#include "train/trainer.h"
#include "util/atomic_file.h"
#include "util/error.h"
#include "util/rss.h"
#include "util/stop_signal.h"

namespace autosp::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// --model: a PyTorch program (FILE.pt2, frontend/torch_import.h: true) or a model directory
// (config.json: false); empty (a resume without it) is neither. Anything else is refused.
bool is_torch_program(const std::string& model) {
  const bool pt2 = model.size() > 4 && model.compare(model.size() - 4, 4, ".pt2") == 0;
  if (!model.empty() && !pt2 && !fs::is_directory(model))
    user_error("--model ", model, ": neither a model directory (config.json) nor a PyTorch program (.pt2, "
               "python/autosp/export.py)");
  return pt2;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %s", b, units[u]);
  return buf;
}

// Appends one JSON object per step; every line is flushed so a killed run keeps its log.
// A resumed run keeps the lines up to the checkpoint's step and appends after them, so the
// file holds every step once however often the run was restarted.
class MetricsWriter {
 public:
  MetricsWriter() = default;
  // resume_step: the checkpoint's step when resuming (lines past it are dropped).
  MetricsWriter(const std::string& path, std::optional<int64_t> resume_step) : path_(path) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) user_error("--metrics ", path, ": is a directory");
    auto mode = std::ios::trunc;
    if (resume_step && fs::exists(path, ec)) {
      std::ifstream in(path);
      std::string line, kept;
      int64_t dropped = 0;
      while (std::getline(in, line)) {
        const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
        const bool keep = j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
                          j["step"].get<int64_t>() <= *resume_step;
        if (keep) kept += line + "\n";
        else ++dropped;  // past the checkpoint, or a line cut short when the run was killed
      }
      if (dropped > 0) write_file_atomic(path, kept);
      mode = std::ios::app;
    }
    out_.open(path, std::ios::out | mode);
    if (!out_) user_error("--metrics ", path, ": cannot open for writing (", std::strerror(errno), ")");
  }
  // Per rank: peaks (the step's planned/counted peak), model_state, and the resident set
  // before the model was built and its high-water mark so far, as the OS counts them.
  // window_tokens_per_s: the step line's tok/s (throughput_window.h), beside the step's own.
  void write(const train::StepStats& s, double window_tokens_per_s, int64_t epoch_samples,
             const std::vector<int64_t>& peaks,
             const std::vector<int64_t>& model_state, const std::vector<int64_t>& rss_base,
             const std::vector<int64_t>& rss_peak) {
    if (path_.empty()) return;
    json j = {{"step", s.step},         {"loss", s.loss},
              {"lr", s.lr},             {"grad_norm", s.grad_norm},
              {"consumed_samples", s.consumed_samples},
              {"tokens_per_s", s.tokens_per_s}, {"tokens_per_s_window", window_tokens_per_s},
              {"step_time_s", s.seconds},
              {"step_flops", s.flops}, {"step_gflops_per_s", s.flops / s.seconds * 1e-9},
              {"cpu_kernels", cpu::isa_name(cpu::active_isa())},
              {"peak_bytes", *std::max_element(peaks.begin(), peaks.end())},
              {"peak_bytes_per_rank", peaks},
              {"activation_peak_bytes", s.activation_bytes},
              {"model_state_bytes_per_rank", model_state},
              {"planned_peak_bytes", s.planned_peak_bytes},
              {"rss_base_bytes", *std::max_element(rss_base.begin(), rss_base.end())},
              {"rss_peak_bytes", *std::max_element(rss_peak.begin(), rss_peak.end())},
              {"rss_base_bytes_per_rank", rss_base},
              {"rss_peak_bytes_per_rank", rss_peak}};
    // Passes over the data so far, as Hugging Face's Trainer logs it (1.5: half-way through
    // the second); absent for an endless generated source.
    if (epoch_samples > 0) j["epoch"] = double(s.consumed_samples) / double(epoch_samples);
    out_ << j.dump() << "\n" << std::flush;
    if (!out_) user_error("--metrics ", path_, ": write failed (", std::strerror(errno), ")");
  }

 private:
  std::string path_;
  std::ofstream out_;
};

// The ranks of this process's job: MPI groups under mpirun, else one rank.
struct Launch {
  MpiRuntime* mpi = nullptr;
  int world_size = 1, world_rank = 0;
  bool lead() const { return world_rank == 0; }

  ProcessGroups groups(int64_t sp_size) const {
    if (world_size % sp_size != 0)
      user_error("world size ", world_size, " is not divisible by sequence_parallel_size ", sp_size,
                 " (launch a multiple of it with mpirun -np)");
    if (mpi) return mpi->make_groups(static_cast<int>(sp_size));
    ProcessGroups g;
    g.world = make_single_communicator();
    g.sp = make_single_communicator();
    g.dp = make_single_communicator();
    return g;
  }
};

// One number per rank (a step's peak bytes, say), gathered on every rank (a collective).
std::vector<int64_t> rank_peaks(ProcessGroups& groups, int64_t mine) {
  std::vector<double> peaks(groups.world->size(), 0.0);
  peaks[groups.world->rank()] = double(mine);
  groups.world->all_reduce_sum(peaks.data(), static_cast<int64_t>(peaks.size()));
  return std::vector<int64_t>(peaks.begin(), peaks.end());
}

std::string human_seconds(double t) {
  char buf[32];
  if (t < 60) std::snprintf(buf, sizeof(buf), "%.1fs", t);
  else if (t < 3600) std::snprintf(buf, sizeof(buf), "%dm%02ds", int(t) / 60, int(t) % 60);
  else std::snprintf(buf, sizeof(buf), "%dh%02dm", int(t) / 3600, int(t) % 3600 / 60);
  return buf;
}

std::string peak_text(const std::vector<int64_t>& peaks) {
  if (peaks.size() == 1) return human_bytes(double(peaks[0]));
  std::string text = "per rank";
  for (int64_t p : peaks) text += " " + human_bytes(double(p));
  return text;
}

// The steps the step line's tok/s is taken over: those since the previous line, and at
// least 10, so that a line printed every step is not one step's noise.
int64_t throughput_window_steps(int64_t steps_per_print) { return std::max<int64_t>(steps_per_print, 10); }

// The progress line. `tokens_per_s`: over a window of steps (throughput_window.h);
// `elapsed`: seconds since this run's first step began; the ETA assumes the remaining steps
// take as long as this run's steps so far.
void print_step(const train::StepStats& s, double tokens_per_s, int64_t total, const std::vector<int64_t>& peaks,
                double elapsed, int64_t steps_done) {
  const double eta = elapsed / double(steps_done) * double(total - s.step);
  std::printf("step %lld/%lld | loss %.4f | lr %.3e | grad norm %.4f | %.0f tok/s | peak %s | %s elapsed, ETA %s\n",
              (long long)s.step, (long long)total, s.loss, s.lr, s.grad_norm, tokens_per_s, peak_text(peaks).c_str(),
              human_seconds(elapsed).c_str(), human_seconds(eta).c_str());
  std::fflush(stdout);
}

// printf on rank 0 only (format-checked by the compiler).
__attribute__((format(printf, 2, 3))) void say(const Launch& launch, const char* fmt, ...) {
  if (!launch.lead()) return;
  va_list args;
  va_start(args, fmt);
  std::vprintf(fmt, args);
  va_end(args);
  std::fflush(stdout);
}

void warn_all(const Launch& launch, const std::vector<std::string>& warnings) {
  if (launch.lead())
    for (const std::string& w : warnings) std::fprintf(stderr, "autosp: warning: %s\n", w.c_str());
}

// Runs `work` on rank 0 only (it touches what rank 0 alone writes: the checkpoint, the
// metrics) and makes its UserError every rank's, so that all ranks stop together with one
// message instead of the others waiting for rank 0 in a collective. Collective.
void on_lead(const Launch& launch, Communicator& world, const std::function<void()>& work) {
  std::string error;
  if (launch.lead()) {
    try {
      work();
    } catch (const UserError& e) {
      error = e.what();
    }
  }
  const CommTimeoutSuspended io_wait;  // the lead's disk I/O may take long; it is not a hang
  error = agreed_error(world, error);
  if (!error.empty()) throw UserError(error);
}

// Saves a checkpoint (a collective: every rank calls it; `target` is rank 0's, empty on the
// others): rank 0 writes, receiving the other ranks' shards in bounded rounds. Says how
// much the resident set's peak rose on each rank while saving (RssPhase).
void save(const Launch& launch, train::Trainer& trainer, const std::optional<train::SaveTarget>& target,
          const models::LlamaConfig& model, const train::CheckpointInfo& info, ProcessGroups& groups) {
  const CommTimeoutSuspended io_wait;  // rank 0's disk I/O may take long; it is not a hang
  const RssPhase phase;
  const train::SaveStats stats = train::save_checkpoint(target ? &*target : nullptr, *groups.world, model,
                                                        trainer.state(), trainer.checkpoint_shards(), info);
  const std::vector<int64_t> growth = rank_peaks(groups, phase.peak_growth());
  std::string per_rank;
  for (int64_t g : growth) per_rank += " +" + human_bytes(double(g));
  say(launch, "saved %s at step %lld (%s of tensors in %.2f s; resident peak while saving, per rank:%s)\n",
      target ? target->dir().c_str() : "", (long long)trainer.state().step, human_bytes(double(stats.bytes)).c_str(),
      stats.seconds, per_rank.c_str());
}

// The stop signal (SIGTERM, SIGUSR1) any rank has received, or 0: every rank gets the same
// answer (a collective), so all stop after the same step.
int agreed_stop_signal(ProcessGroups& groups) {
  for (int64_t signal : rank_peaks(groups, stop_signal()))
    if (signal != 0) return static_cast<int>(signal);
  return 0;
}

// After a stop signal: what the run did about it, and its exit status. With a checkpoint the
// job did what a preempted job should (0: requeue it with --resume); without one, the steps
// trained are lost and the status says the run was cut short (128 + the signal, as a shell
// reports a process the signal ended).
int stopped_by_signal(const Launch& launch, int signal, int64_t step, int64_t steps, const std::string& save_dir) {
  if (save_dir.empty()) {
    say(launch, "%s: stopped after step %lld of %lld; no --save was given, so no checkpoint was "
        "written and this run's steps are lost\n", signal_name(signal), (long long)step, (long long)steps);
    return 128 + signal;
  }
  say(launch, "%s: stopped after step %lld of %lld; checkpoint saved to %s (continue with --resume %s)\n",
      signal_name(signal), (long long)step, (long long)steps, save_dir.c_str(), save_dir.c_str());
  return 0;
}

bool same_path(const std::string& a, const std::string& b) {
  std::error_code ec1, ec2;
  const fs::path pa = fs::weakly_canonical(fs::absolute(a), ec1), pb = fs::weakly_canonical(fs::absolute(b), ec2);
  if (ec1 || ec2) return fs::path(a).lexically_normal() == fs::path(b).lexically_normal();
  // "ck/" and "ck" are one directory.
  auto strip = [](fs::path p) { return p.has_filename() ? p : p.parent_path(); };
  return strip(pa) == strip(pb);
}

// A fresh run (or one resuming from another checkpoint) must not replace a checkpoint or a
// metrics log without being told to: a requeued job that forgot --resume would silently
// lose days of training. Checked on the lead (it writes both) before anything is read.
void refuse_to_overwrite(const TrainArgs& args) {
  if (args.overwrite) return;
  if (!args.save.empty() && (args.resume.empty() || !same_path(args.resume, args.save)))
    if (const std::optional<int64_t> step = train::existing_checkpoint_step(args.save))
      user_error("--save ", args.save, ": holds an autosp checkpoint",
                 *step >= 0 ? str(" (step ", *step, ")") : std::string(), " that this run ",
                 args.resume.empty() ? "does not resume from" : str("would replace (it resumes from ", args.resume, ")"),
                 "; to continue it pass --resume ", args.save, ", to replace it pass --overwrite");
  std::error_code ec;
  if (!args.metrics.empty() && args.resume.empty() && fs::is_regular_file(args.metrics, ec) &&
      fs::file_size(args.metrics, ec) > 0 && !ec)
    user_error("--metrics ", args.metrics, ": exists and is not empty (the log of an earlier run?); to continue "
               "that run pass --resume CHECKPOINT (the lines up to its step are kept), to replace the file pass "
               "--overwrite, or give another path");
}

// The built-in default: a small Llama learns passkey retrieval from scratch. Under mpirun
// it runs sequence-parallel over all ranks (SP = world size).
int run_demo(const TrainArgs& args, std::optional<uint64_t> seed, const Launch& launch) {
  train::PasskeyTask task({.seed = seed.value_or(1234)});
  // Tuned on 2 cores (2 ranks, about a minute): at S = 128 and lr 5e-3 the loss on the key
  // collapses by step ~650. lr 1e-2 learned it in one run and stalled near 14% accuracy in
  // another (a different fp32 trajectory); S = 256 needs far more steps.
  const int64_t S = args.seq_len > 0 ? args.seq_len : 128;
  const int64_t steps = args.steps >= 0 ? args.steps : 1000;

  models::LlamaConfig model;
  model.vocab_size = task.vocab_size();
  model.hidden_size = 64;
  model.intermediate_size = 128;
  model.num_hidden_layers = 2;
  model.num_attention_heads = 4;
  model.num_key_value_heads = 2;
  model.head_dim = 16;
  model.rms_norm_eps = 1e-5;
  model.rope.theta = 10000.0;
  model.max_position_embeddings = S;

  train::TrainConfig config;
  config.train_micro_batch_size_per_gpu = 16;
  config.gradient_accumulation_steps = 1;
  config.gradient_clipping = 1.0;
  config.optimizer = {.lr = 5e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.01};
  config.scheduler.type = train::SchedulerType::kWarmupCosineLR;
  config.scheduler.warmup_num_steps = 30;
  config.scheduler.total_num_steps = steps;
  config.scheduler.warmup_type = train::WarmupType::kLinear;
  config.scheduler.cos_min_ratio = 0.1;
  config.sequence_parallel_size = launch.world_size;
  config.compile = {.deepcompile = true, .passes = {"autosp"}};
  config.backend = backend_name(parse_backend(args.backend));
  train::resolve_batch(config, 1, "<built-in demo>");
  train::check_heads_layout(model, config.sequence_parallel_size,
                            str("sequence_parallel_size ", launch.world_size, " (the demo is sequence-parallel over "
                                "all ranks: mpirun -np ", launch.world_size, ")"),
                            "the demo's model");
  ProcessGroups groups = launch.groups(config.sequence_parallel_size);
  on_lead(launch, *groups.world, [&] { refuse_to_overwrite(args); });
  const std::vector<int64_t> rss_base = rank_peaks(groups, rss_bytes());

  say(launch, "autosp built-in demo: passkey retrieval, trained from scratch\n\n%s\n\n", task.describe(S).c_str());
  say(launch, "model: Llama, %lld layers, hidden %lld, %lld heads (%lld kv), vocab %lld: %lld parameters\n",
      (long long)model.num_hidden_layers, (long long)model.hidden_size, (long long)model.num_attention_heads,
      (long long)model.num_key_value_heads, (long long)model.vocab_size,
      (long long)models::llama_num_parameters(model));
  say(launch, "%s\n", cpu::kernels_summary().c_str());
  say(launch, "%s\n", threads_summary().c_str());
  say(launch, "training: %lld steps of %lld sequences x %lld tokens, AdamW lr %.0e, warmup + cosine; "
      "sequence parallel over %d rank(s), %lld tokens each\n\n",
      (long long)steps, (long long)*config.train_micro_batch_size_per_gpu, (long long)S, config.optimizer.lr,
      launch.world_size,
      (long long)split_sequence(S, launch.world_size).local);

  std::optional<train::SaveTarget> target;
  MetricsWriter metrics;
  on_lead(launch, *groups.world, [&] {
    std::vector<std::string> warnings;
    if (!args.save.empty()) target.emplace(args.save, &warnings, config.max_shard_bytes);
    if (!args.metrics.empty()) metrics = MetricsWriter(args.metrics, std::nullopt);
    warn_all(launch, warnings);
  });
  train::Trainer trainer(model, config, S, train::ModelState::initial(model, config.seed), &groups);
  auto predict = [&](const int32_t* in, int64_t B, int64_t s, int32_t* out) { trainer.predict(in, B, s, out); };
  const int64_t eval_samples = 200;
  const double before = task.accuracy(predict, S, eval_samples, 20);
  say(launch, "retrieval accuracy before training: %.1f%% (chance %.1f%%, %lld held-out samples)\n\n",
      100 * before, 100 * task.chance_accuracy(), (long long)eval_samples);
  const int64_t print_every = 50;
  train::ThroughputWindow throughput(throughput_window_steps(print_every));
  train::LoopHooks hooks;
  hooks.after_step = [&](const train::StepEvent& e) {
    const train::StepStats& s = e.stats;
    throughput.add(s.tokens_per_s * s.seconds, s.seconds);
    const auto peaks = rank_peaks(groups, s.peak_bytes);
    metrics.write(s, throughput.tokens_per_s(), 0, peaks, rank_peaks(groups, s.model_state_bytes), rss_base,
                  rank_peaks(groups, rss_peak_bytes()));
    if (launch.lead() && (s.step % print_every == 0 || e.last))
      print_step(s, throughput.tokens_per_s(), steps, peaks, e.elapsed, e.steps_done);
  };
  hooks.stop_requested = [&] { return agreed_stop_signal(groups); };
  const train::CheckpointInfo info{.seq_len = S, .seed = config.seed};
  if (!args.save.empty()) hooks.save = [&] { save(launch, trainer, target, model, info, groups); };
  // The last checkpoint is saved after the evaluation below, not at the last step.
  const train::LoopResult run = train::run_loop(trainer, task, {.target_step = steps, .save_at_target = false}, hooks);
  if (run.end == train::LoopResult::End::stopped)
    return stopped_by_signal(launch, run.signal, run.last_stats.step, steps, args.save);
  const double after = task.accuracy(predict, S, eval_samples, 20);
  say(launch, "\nretrieval accuracy after training:  %.1f%% (before %.1f%%, chance %.1f%%)\n", 100 * after,
      100 * before, 100 * task.chance_accuracy());
  if (!args.save.empty()) save(launch, trainer, target, model, info, groups);
  return 0;
}

void require_flag(bool given, const char* flag) {
  if (!given) user_error("autosp train: ", flag, " is required (or give no options for the built-in demo)");
}

std::optional<uint64_t> parse_seed(const std::string& text) {
  if (text.empty()) return std::nullopt;
  int64_t v = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < 0)
    user_error("--seed ", text, ": expected an integer in [0, 2^63)");
  return static_cast<uint64_t>(v);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string layout_text(const train::BatchLayout& l) {
  return str("global batch ", l.global(), " (micro ", l.micro_batch, " x accumulation ", l.grad_accum, " x ",
             l.dp_size, " data-parallel)");
}

// Where a resumed run continues in the data: at the checkpoint's consumed samples, whatever
// this run's batch layout, and only on the data it was trained on unless --allow-new-data,
// which starts at the new data's first sample (the checkpoint's position counts samples of
// other data; wrapped onto the new data it would skip as many of its samples), or with
// --keep-data-position at the checkpoint's position.
//
// Its position indexes the order the checkpoint read its data in (data.shuffle, data.seed):
// in another order the rest of the epoch would not be the samples the epoch has left (some
// read twice, some never), so on the same data a changed order is refused unless
// --allow-new-data, which continues at the checkpoint's position in the new order.
// A model's rope settings and positions, for the context-extension line.
int64_t num_parameters(const std::vector<models::ParameterSpec>& specs) {
  int64_t n = 0;
  for (const models::ParameterSpec& p : specs) n += numel(p.shape);
  return n;
}

std::string rope_text(const models::LlamaConfig& m) {
  const RopeOptions& r = m.rope;
  std::string s = str("rope ", r.rope_type, " theta ", r.theta);
  if (r.rope_type != "default") s += str(" factor ", r.factor);
  if (r.rope_type == "llama3" || r.rope_type == "yarn")
    s += str(" original_max_position_embeddings ", r.original_max_position_embeddings);
  if (r.rope_type == "yarn") s += str(" attention_factor ", r.attention_factor);
  return s + str(", max_position_embeddings ", m.max_position_embeddings);
}

// The checkpoint's data position (samples of its sequence length) at this run's sequence
// length S: as many tokens into the epoch (train::convert_data_position), said in the log.
void convert_position_to(const Launch& launch, const train::LoadedCheckpoint& ckpt, train::ModelState& state,
                         const train::DataSource& data, int64_t S) {
  const int64_t old_S = ckpt.info.seq_len;
  if (old_S == S || state.consumed_samples <= 0) return;
  const train::ConvertedPosition p =
      train::convert_data_position(state.consumed_samples, old_S, data.num_samples(old_S), S, data.num_samples(S));
  say(launch, "context extension: data position %lld samples of %lld tokens -> %lld samples of %lld tokens "
      "(epoch %lld%s)\n", (long long)state.consumed_samples, (long long)old_S, (long long)p.samples, (long long)S,
      (long long)p.epoch,
      p.skipped_tokens > 0 ? str(", skipping ", p.skipped_tokens, " tokens to the next whole sample").c_str() : "");
  state.consumed_samples = p.samples;
}

void resume_data_position(const Launch& launch, const train::LoadedCheckpoint& ckpt, train::ModelState& state,
                          const train::BatchLayout& layout, const TrainArgs& args, const io::DataFingerprint& data,
                          const train::DataOrder& order, const train::DataSource& source, int64_t S) {
  say(launch, "resuming from %s at step %lld\n", ckpt.dir.c_str(), (long long)state.step);
  if (state.consumed_samples < 0) {  // the first checkpoint format kept only the step
    state.consumed_samples = state.step * layout.global();
    if (launch.lead())
      std::fprintf(stderr, "autosp: warning: --resume %s: an older checkpoint without its data position; "
                   "assuming it was trained with this run's %s: continuing at sample %lld\n",
                   ckpt.dir.c_str(), layout_text(layout).c_str(), (long long)state.consumed_samples);
    return;
  }
  if (ckpt.info.data && *ckpt.info.data != data) {
    const std::string what = str("--data ", args.data, ": not the data the checkpoint ", ckpt.dir, " was trained on (",
                                 ckpt.info.data_path, ": ", ckpt.info.data->bytes, " bytes; this file: ", data.bytes,
                                 " bytes", data.bytes == ckpt.info.data->bytes ? ", different contents" : "", ")");
    if (!args.allow_new_data)
      user_error(what, "; pass --allow-new-data to train on it from its first sample (with --keep-data-position: "
                 "from sample ", state.consumed_samples, ", the checkpoint's position)");
    if (args.keep_data_position) {
      if (launch.lead())
        std::fprintf(stderr, "autosp: warning: %s; --allow-new-data --keep-data-position: continuing at sample %lld "
                     "of it\n", what.c_str(), (long long)state.consumed_samples);
    } else {
      if (launch.lead())
        std::fprintf(stderr, "autosp: warning: %s; --allow-new-data: starting at its first sample (the checkpoint "
                     "had consumed %lld samples of its own data; --keep-data-position would continue at sample %lld "
                     "of this one)\n", what.c_str(), (long long)state.consumed_samples,
                     (long long)state.consumed_samples);
      state.consumed_samples = 0;
    }
  }
  if (ckpt.info.data && *ckpt.info.data == data && ckpt.info.order != order) {
    auto order_text = [](const train::DataOrder& o) {
      return o.shuffle ? str("shuffled with data.seed ", o.seed) : std::string("in file order (data.shuffle false)");
    };
    const std::string what = str("--resume ", ckpt.dir, ": the checkpoint read its data ", order_text(ckpt.info.order),
                                 ", and ", args.config, " asks for it ", order_text(order),
                                 ": from sample ", state.consumed_samples, " on, the rest of the epoch would not be "
                                 "the samples it has left (some read twice, some never)");
    if (!args.allow_new_data)
      user_error(what, "; set data.shuffle and data.seed as the checkpoint had them (data.seed defaults to the "
                 "top-level seed), or pass --allow-new-data to continue at sample ", state.consumed_samples,
                 " in the new order");
    if (launch.lead())
      std::fprintf(stderr, "autosp: warning: %s; --allow-new-data: continuing at sample %lld in the new order\n",
                   what.c_str(), (long long)state.consumed_samples);
  }
  if (ckpt.info.layout != layout)
    say(launch, "the batch layout changed: the checkpoint was trained with %s, this run uses %s\n",
        layout_text(ckpt.info.layout).c_str(), layout_text(layout).c_str());
  convert_position_to(launch, ckpt, state, source, S);
  const bool new_data = ckpt.info.data && *ckpt.info.data != data;
  if (new_data)
    say(launch, "continuing with sample %lld of the new data\n", (long long)state.consumed_samples);
  else
    say(launch, "continuing with sample %lld, the first this model has not seen\n", (long long)state.consumed_samples);
}

}  // namespace

int run_train(const TrainArgs& args, MpiRuntime* mpi) {
  Launch launch{mpi, mpi ? mpi->world_size() : 1, mpi ? mpi->world_rank() : 0};
  install_stop_signals(/*announce=*/launch.lead());  // after MPI_Init: ours, not MPI's
  const std::optional<uint64_t> seed = parse_seed(args.seed);
  if (mpi)  // every rank must run the same job
    mpi->check_same_on_all_ranks("the command line",
                                 str(args.config, "|", args.model, "|", args.data, "|", args.seq_len, "|",
                                     args.steps, "|", args.resume, "|", args.seed, "|", args.save, "|",
                                     args.save_every, "|", args.allow_new_data, "|", args.comm_timeout, "|",
                                     args.keep_data_position, "|", args.overwrite));
  if (mpi) set_comm_timeout(args.comm_timeout);
  if (!args.any_given()) return run_demo(args, seed, launch);
  require_flag(!args.config.empty(), "--config");
  require_flag(!args.model.empty() || !args.resume.empty(), "--model (or --resume)");
  require_flag(!args.data.empty(), "--data");
  require_flag(args.seq_len > 0 || !args.resume.empty(), "--seq-len");
  require_flag(args.steps >= 0, "--steps");
  if (args.save_every > 0 && args.save.empty())
    user_error("--save-every ", args.save_every, " needs --save DIR (where to write the checkpoints)");
  if (args.keep_data_position && !args.allow_new_data)
    user_error("--keep-data-position only applies with --allow-new-data (on the checkpoint's own data a resume "
               "always continues at its position)");

  std::vector<std::string> warnings;
  train::TrainConfig config = train::load_train_config(args.config, &warnings);
  if (mpi) mpi->check_same_on_all_ranks(str("the config file ", args.config), read_file(args.config));
  warn_all(launch, warnings);
  // Before anything is read: what the compiler would refuse only after the data and weights.
  try {
    check_compile_options({config.sequence_parallel_size, config.compile.passes, config.compile.deepcompile});
  } catch (const UserError& e) {
    user_error(args.config, ": ", e.what());
  }
  ProcessGroups groups = launch.groups(config.sequence_parallel_size);
  groups.device_comm = config.comm;
  on_lead(launch, *groups.world, [&] { refuse_to_overwrite(args); });
  const std::vector<int64_t> rss_base = rank_peaks(groups, rss_bytes());  // before the model exists
  std::vector<std::string> auto_notes;
  train::resolve_batch(config, groups.dp_size, args.config, &auto_notes);
  if (seed) config.seed = *seed;
  if (!config.data.seed) config.data.seed = config.seed;  // data.seed defaults to the run's seed
  config.backend = backend_name(parse_backend(args.backend));
  if (const auto w = train::precision_warning(config, args.config)) warn_all(launch, {*w});
  const train::BatchLayout layout{*config.train_micro_batch_size_per_gpu, *config.gradient_accumulation_steps,
                                  groups.dp_size};

  models::LlamaConfig model;
  train::ModelState state;
  std::optional<train::LoadedCheckpoint> ckpt;
  int64_t S = args.seq_len;
  const std::string sp_source = str("sequence_parallel_size ", config.sequence_parallel_size, " (", args.config, ")");
  // --model FILE.pt2: a PyTorch program (frontend/torch_import.h) in place of a model directory.
  std::optional<TorchProgram> imported;
  std::optional<train::ImportedProgramId> program_id;  // what its checkpoints record
  const bool pt2 = is_torch_program(args.model);
  // --resume DIR: the checkpoint, verified against its manifest, each file read by one rank.
  auto load_resume = [&] {
    try {
      const CommTimeoutSuspended io_wait;  // the ranks wait for the one reading the largest file
      ckpt = train::load_checkpoint(args.resume, *groups.world);
    } catch (const UserError& e) {
      user_error("--resume ", args.resume, ": ", e.what());
    }
    if (ckpt->verified) {
      // Each byte is read by one rank: the world reads the checkpoint once.
      const std::vector<int64_t> read = rank_peaks(groups, ckpt->verified_bytes);
      std::string per_rank;
      for (int64_t b : read) per_rank += str(" ", b);
      say(launch, "--resume %s: every file matches its manifest (bytes checksummed per rank:%s)\n", ckpt->dir.c_str(),
          per_rank.c_str());
    }
    if (launch.lead())
      for (const std::string& note : ckpt->notes) std::fprintf(stderr, "autosp: warning: --resume: %s\n", note.c_str());
    if (!ckpt->verified && launch.lead())
      std::fprintf(stderr, "autosp: warning: --resume %s: no manifest.json (a checkpoint of an older autosp): "
                   "its files cannot be verified\n", ckpt->dir.c_str());
    if (S > 0 && S != ckpt->info.seq_len)
      say(launch, "context extension: sequence length %lld (checkpoint) -> %lld\n", (long long)ckpt->info.seq_len,
          (long long)S);
    if (S <= 0) S = ckpt->info.seq_len;
  };
  if (pt2) {
    imported.emplace(TorchProgram::load(args.model));
    model.architecture = str("imported PyTorch program ", args.model);
    model.vocab_size = imported->vocab_size();
    for (const models::ParameterSpec& p : imported->parameters())  // the token embedding [V, H]
      if (p.shape.size() == 2 && p.shape[0] == model.vocab_size && model.hidden_size == 0) model.hidden_size = p.shape[1];
    model.max_position_embeddings = INT64_MAX;
    program_id = train::ImportedProgramId{args.model, imported->graph_hash(), imported->parameters(),
                                          imported->hf_config(), imported->frozen(), {}};
    program_id->read_frozen = [&imported](size_t i) { return imported->read_frozen(i); };
    if (!args.resume.empty()) {
      load_resume();
      if (!ckpt->info.program)
        user_error("--resume ", ckpt->dir, ": a checkpoint of ", ckpt->model.architecture, ", not of an imported "
                   "PyTorch program; --model ", args.model, " cannot continue it (pass the model directory it trained)");
      if (!ckpt->info.program->same_program(*program_id))
        user_error("--resume ", ckpt->dir, ": it trained the program ", ckpt->info.program->file, ", not --model ",
                   args.model, " (",
                   ckpt->info.program->graph_hash != program_id->graph_hash ? "another graph"
                                                                            : "other parameters",
                   "); pass the program it trained");
      state = std::move(ckpt->state);
    } else {
      std::vector<std::vector<float>> params;
      for (size_t i = 0; i < imported->parameters().size(); ++i) params.push_back(imported->read_parameter(i));
      state = train::ModelState::with_weights(imported->parameters(), std::move(params));
      say(launch, "loaded %s\n", args.model.c_str());
    }
  } else if (!args.resume.empty()) {
    // The layout is checked before the checkpoint is read (verifying it reads every byte):
    // from --model's config.json or the checkpoint's. One that cannot be read here is
    // load_checkpoint's to report, with its manifest's words; the check is then made after.
    std::string model_config;
    std::optional<models::LlamaConfig> early;
    try {
      model_config = !args.model.empty() ? args.model + "/config.json"
                                         : train::resolve_checkpoint_dir(args.resume) + "/config.json";
      early = models::load_llama_config(model_config);
    } catch (const UserError&) {
    }
    if (early) train::check_heads_layout(*early, config.sequence_parallel_size, sp_source, model_config);
    load_resume();
    if (ckpt->info.program)
      user_error("--resume ", ckpt->dir, ": a checkpoint of the imported PyTorch program ", ckpt->info.program->file,
                 ": pass that program with it (--model ", ckpt->info.program->file, ")");
    model = ckpt->model;
    // Context extension: a --model whose config.json differs from the checkpoint's only in its
    // rope settings and max_position_embeddings trains on with them; any other difference is
    // another model.
    if (!args.model.empty()) {
      models::LlamaConfig given = models::load_llama_config(args.model + "/config.json");
      json a = models::llama_config_json(given), b = models::llama_config_json(ckpt->model);
      if (a != b) {
        for (const char* key : {"rope_theta", "rope_scaling", "max_position_embeddings"}) a.erase(key), b.erase(key);
        for (const auto& [key, value] : a.items())
          if (value != b[key])
            user_error("--resume ", ckpt->dir, ": its config.json describes a different model than --model ",
                       args.model, " (", key, ": ", b[key].dump(), " in the checkpoint, ", value.dump(),
                       " in --model); only the rope settings and max_position_embeddings may change at a resume");
        say(launch, "context extension: %s (checkpoint) -> %s (--model %s)\n", rope_text(ckpt->model).c_str(),
            rope_text(given).c_str(), args.model.c_str());
        model = given;
      }
    }
    train::check_heads_layout(model, config.sequence_parallel_size, sp_source, ckpt->dir + "/config.json");
    state = std::move(ckpt->state);
  } else {
    std::vector<std::string> model_warnings, model_notes;
    model = models::load_llama_config(args.model + "/config.json", &model_warnings);
    warn_all(launch, model_warnings);
    train::check_heads_layout(model, config.sequence_parallel_size, sp_source, args.model + "/config.json");
    train::require_host_memory(16.0 * double(models::llama_num_parameters(model)),
                               "the parameters, gradients and AdamW state of this model");
    // Not read yet: each rank reads what its ZeRO stage keeps when the trainer is built.
    // Weights autosp cannot read are an error (find_model_weights), never a random init.
    const std::string weights = io::find_model_weights(args.model);
    state = train::fresh_state(model, config.seed, weights, &model_notes);
    if (!weights.empty()) {
      say(launch, "loaded %s\n", weights.c_str());
    } else {
      say(launch, "no weights: random init with seed %llu (%s has neither model.safetensors nor "
          "model.safetensors.index.json)\n", (unsigned long long)config.seed, args.model.c_str());
    }
    for (const std::string& note : model_notes) say(launch, "note: %s\n", note.c_str());
  }
  train::resolve_model_auto(config, model.hidden_size, args.config, &auto_notes);
  for (const std::string& n : auto_notes)
    if (launch.lead()) std::fprintf(stderr, "autosp: %s\n", n.c_str());
  if (S > model.max_position_embeddings && launch.lead())
    std::fprintf(stderr, "autosp: warning: --seq-len %lld exceeds the model's max_position_embeddings %lld\n",
                 (long long)S, (long long)model.max_position_embeddings);

  // Everything that can refuse the run does so before the first step.
  // --data: a flat token file or an indexed dataset (train::open_data_source says how it
  // tells them apart); the step's graph takes document ids when its samples are packed.
  std::vector<std::string> data_notes;
  const std::unique_ptr<train::DataSource> source = train::order_samples(
      train::open_data_source(args.data, static_cast<int32_t>(model.vocab_size), config.data, args.config, &data_notes,
                              [&](const std::string& line) { say(launch, "%s\n", line.c_str()); }),
      config.data);
  warn_all(launch, data_notes);
  const train::DataSource& data = *source;
  config.data.packed = data.packed();
  const io::DataFingerprint fingerprint = *data.fingerprint();
  const int64_t epoch_samples = data.num_samples(S);
  const train::DataOrder order{config.data.shuffle, config.data.shuffle ? *config.data.seed : 0};
  if (ckpt) resume_data_position(launch, *ckpt, state, layout, args, fingerprint, order, data, S);
  std::optional<train::SaveTarget> target;
  MetricsWriter metrics;
  on_lead(launch, *groups.world, [&] {
    std::vector<std::string> notes;
    if (!args.save.empty()) target.emplace(args.save, &notes, config.max_shard_bytes);
    if (!args.metrics.empty())
      metrics = MetricsWriter(args.metrics, ckpt ? std::optional<int64_t>(state.step) : std::nullopt);
    warn_all(launch, notes);
  });

  say(launch, "data: %s\n", data.describe(S).c_str());
  say(launch, "%s\n", train::describe_data_order(config.data).c_str());
  say(launch, "%s\n%s\n", train::describe_optimizer(config).c_str(), train::describe_scheduler(config).c_str());
  say(launch, "%s\n", cpu::kernels_summary().c_str());
  say(launch, "%s\n", threads_summary().c_str());
  const int64_t to_train = std::max<int64_t>(0, args.steps - state.step);
  const int64_t last_sample = state.consumed_samples + to_train * layout.global();
  if (epoch_samples > 0 && to_train > 0 && (last_sample - 1) / epoch_samples > state.consumed_samples / epoch_samples)
    say(launch, "data: this run reads samples %lld..%lld of %lld, so it repeats the data (%.2f epochs in all)\n",
        (long long)state.consumed_samples, (long long)last_sample - 1, (long long)epoch_samples,
        double(last_sample) / double(epoch_samples));
  const std::string window =
      model.sliding_window > 0 ? str(", attention within a sliding window of ", model.sliding_window, " tokens") : "";
  say(launch, "model: %s%s, %lld parameters; micro batch %lld x %lld tokens, %lld accumulation steps; "
      "%d rank(s): data parallel %d x sequence parallel %d (%lld tokens per rank), ZeRO stage %d\n",
      model.architecture.c_str(), window.c_str(),
      (long long)(imported ? num_parameters(imported->parameters()) : models::llama_num_parameters(model)),
      (long long)layout.micro_batch, (long long)S,
      (long long)layout.grad_accum, launch.world_size, groups.dp_size, groups.sp_size,
      (long long)split_sequence(S, groups.sp_size).local, config.zero_stage);
  if (imported) {  // the frozen parameters the loss reads (the program's other constants are its tables)
    std::vector<std::string> frozen;
    int64_t values = 0;
    for (const models::ParameterSpec& c : imported->constants())
      for (const models::ParameterSpec& f : imported->frozen())
        if (f.name == c.name) frozen.push_back(c.name), values += numel(c.shape);
    if (!frozen.empty())
      say(launch, "frozen: %zu tensors of %lld values the program exported with requires_grad=False, read and not "
          "trained (the first: %s)\n", frozen.size(), (long long)values, frozen[0].c_str());
  }
  if (to_train == 0) {
    if (ckpt) say(launch, "nothing to train: the checkpoint is at step %lld and --steps is %lld\n",
                  (long long)state.step, (long long)args.steps);
    else say(launch, "nothing to train: --steps 0\n");
    if (args.save.empty()) return 0;
  }

  const train::CheckpointInfo info{S, config.seed, layout, args.data, fingerprint, order, program_id};
  const std::unique_ptr<train::Trainer> trainer_ptr =
      imported ? std::make_unique<train::Trainer>(
                     imported->model(),
                     config, S, std::move(state), &groups)
               : std::make_unique<train::Trainer>(model, config, S, std::move(state), &groups);
  train::Trainer& trainer = *trainer_ptr;
  if (ckpt) {
    std::string per_rank;
    for (int64_t g : rank_peaks(groups, trainer.state_load().rss_growth)) per_rank += " +" + human_bytes(double(g));
    say(launch, "read this rank's part of the checkpoint in %.2f s (resident peak while reading, per rank:%s)\n",
        trainer.state_load().seconds, per_rank.c_str());
  }
  const int64_t runtime = trainer.staging_bytes() + trainer.program_bytes() + trainer.runtime_reserve();
  say(launch, "memory plan per rank: %s; planned peak %s = model state %s + activations %s + batch "
      "staging, program and runtime reserve %s\n", train::strategy_name(trainer.strategy()).c_str(),
      human_bytes(double(trainer.planned_peak_bytes())).c_str(),
      human_bytes(double(trainer.planned_peak_bytes() - trainer.planned_arena_bytes() - runtime)).c_str(),
      human_bytes(double(trainer.planned_arena_bytes())).c_str(), human_bytes(double(runtime)).c_str());
  // The loop (train/loop.h) decides when to save and stop; here is what the run shows.
  std::vector<int64_t> max_peaks(groups.world->size(), 0);
  train::ThroughputWindow throughput(throughput_window_steps(config.steps_per_print));
  train::LoopHooks hooks;
  hooks.after_step = [&](const train::StepEvent& e) {
    const train::StepStats& s = e.stats;
    throughput.add(s.tokens_per_s * s.seconds, s.seconds);  // the step's tokens and time
    const std::vector<int64_t> peaks = rank_peaks(groups, s.peak_bytes);
    for (size_t r = 0; r < peaks.size(); ++r) max_peaks[r] = std::max(max_peaks[r], peaks[r]);
    metrics.write(s, throughput.tokens_per_s(), epoch_samples, peaks, rank_peaks(groups, s.model_state_bytes),
                  rss_base, rank_peaks(groups, rss_peak_bytes()));
    if (launch.lead() && (s.step % config.steps_per_print == 0 || e.last))
      print_step(s, throughput.tokens_per_s(), args.steps, peaks, e.elapsed, e.steps_done);
    if (e.epoch_begins)
      say(launch, "data: step %lld read past the end of %s (%lld samples): epoch %lld begins, samples repeat\n",
          (long long)s.step, args.data.c_str(), (long long)epoch_samples, (long long)*e.epoch_begins);
  };
  hooks.stop_requested = [&] { return agreed_stop_signal(groups); };
  if (!args.save.empty()) hooks.save = [&] { save(launch, trainer, target, model, info, groups); };
  const train::LoopResult run = train::run_loop(
      trainer, data, {.target_step = args.steps, .save_every = args.save_every, .epoch_samples = epoch_samples}, hooks);
  if (run.end == train::LoopResult::End::stopped)
    return stopped_by_signal(launch, run.signal, run.last_stats.step, args.steps, args.save);
  if (run.steps_done == 0) return 0;
  if (profile_enabled() && launch.lead()) {
    const int64_t profiled = global_profile().steps();
    const char* note = profiled < run.steps_done ? " (the first step left out)" : "";
    std::printf("%s", global_profile().report(str("rank 0, steps ", args.steps - profiled + 1, "..", args.steps, note))
                          .c_str());
  }
  const double tokens = double(run.steps_done * layout.global() * S);
  say(launch, "done: steps %lld..%lld, %.0f tokens in %s (%.0f tok/s) | final loss %.4f | peak %s\n",
      (long long)run.first_step, (long long)args.steps, tokens, human_seconds(run.seconds).c_str(),
      tokens / run.seconds, run.last_stats.loss, peak_text(max_peaks).c_str());
  return 0;
}

int run_verify(const std::string& dir) {
  try {
    // The load --resume does: the manifest check, then every file parses and fits the model
    // it describes.
    const train::LoadedCheckpoint ckpt = train::load_checkpoint(dir);
    if (!ckpt.verified)
      user_error(ckpt.dir, ": has no manifest.json (a checkpoint of an older autosp): its files cannot be verified");
    for (const std::string& note : ckpt.notes) std::fprintf(stderr, "autosp: warning: %s\n", note.c_str());
    std::printf("%s: verified: every file matches its manifest; step %lld, %lld samples consumed%s\n",
                ckpt.dir.c_str(), (long long)ckpt.state.step, (long long)ckpt.state.consumed_samples,
                ckpt.dir == dir ? "" : str(" (", dir, " is missing: this is the previous checkpoint of an interrupted save)").c_str());
  } catch (const UserError& e) {
    user_error("autosp verify ", dir, ": ", e.what());
  }
  return 0;
}

int run_dump(const DumpArgs& args) {
  const bool pt2 = is_torch_program(args.model);
  std::optional<TorchProgram> imported;  // --model FILE.pt2: a PyTorch program in place of a directory
  models::LlamaConfig model;
  std::vector<std::string> warnings;  // config.json's keys autosp does not read, said once
  if (pt2) imported.emplace(TorchProgram::load(args.model));
  else model = models::load_llama_config(args.model + "/config.json", &warnings);
  for (const std::string& w : warnings) std::fprintf(stderr, "autosp: warning: %s\n", w.c_str());
  const auto& stages = pipeline_stages();
  if (std::find(stages.begin(), stages.end(), args.stage) == stages.end()) {
    std::string known;
    for (const auto& s : stages) known += (known.empty() ? "" : ", ") + s;
    user_error("--stage ", args.stage, ": unknown stage (known: ", known, ")");
  }
  if (args.rank >= args.sp) user_error("--rank ", args.rank, " is not a rank of --sp ", args.sp);
  DType dtype = DType::f32;
  if (args.dtype == "bf16") dtype = DType::bf16;
  else if (args.dtype != "f32") user_error("--dtype ", args.dtype, ": expected f32 or bf16");
  const Backend backend = parse_backend(args.backend);
  if (backend == Backend::cpu && dtype == DType::bf16)
    user_error("--backend cpu --dtype bf16: the CPU kernels are fp32; dump bf16 with --backend cuda");
  const models::LlamaTraceOptions trace{.batch = args.batch, .seq_len = args.seq_len, .dtype = dtype};
  Graph forward = imported ? imported->forward(trace) : models::llama_forward(model, trace);
  const int64_t world = args.world > 0 ? args.world : args.sp;
  if (world % args.sp != 0) user_error("--world ", world, " is not a multiple of --sp ", args.sp);
  if (args.zero > 3) user_error("--zero ", args.zero, ": ZeRO stages are 0, 1, 2 and 3");
  // The config these flags stand for, compiled as the trainer compiles it; the program shown
  // is the one the trainer runs for a step's last micro batch (passes/pipeline.h).
  train::TrainConfig config;
  config.sequence_parallel_size = args.sp;
  config.compile = {.deepcompile = true, .passes = {"autosp"}};
  config.zero_stage = config.zero.stage = int(args.zero);
  config.zero.reduce_bucket_size = args.reduce_bucket_size;
  config.backend = backend_name(backend);
  const train::MemoryStrategy strategy{{parse_checkpoint_policy(args.checkpoint, "--checkpoint")},
                                       {.tile_rows = args.tile_rows}};
  const CompileOptions options =
      last_micro_batch_options(train::step_compile_options(config, world, 0, strategy), args.accumulation);
  const SequenceSplit split = split_sequence(args.seq_len, args.sp);
  compile(forward, options, [&](const std::string& stage, const Graph& g) {
    if (stage != args.stage) return;
    // Before the autosp pass the graph is the single-device one, the same for every rank.
    if (stage == "forward" || args.sp == 1)
      std::cout << "# stage " << stage << ": the unsplit graph over all " << args.seq_len << " positions"
                << (args.sp > 1 ? " (the autosp pass splits it after this stage)" : "") << "\n";
    else
      std::cout << "# stage " << stage << ", rank " << args.rank << " of sequence_parallel_size " << args.sp
                << ": sequence positions [" << split.begin(args.rank) << ", "
                << std::min(split.begin(args.rank) + split.local, args.seq_len) << ") of " << args.seq_len
                << (split.padded > args.seq_len ? str(", padded to ", split.padded) : std::string()) << "\n";
    std::cout << print_graph(g);
  });
  return 0;
}

}  // namespace autosp::cli
