// autosp: train | dump | plan | verify. User errors print one clear line and exit 1; internal errors
// (bugs) exit 2. Under mpirun, one line for the job, not one per rank.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "comm/mpi_communicator.h"
#include "kernels/cpu/isa.h"
#include "passes/pipeline.h"
#include "runtime/backend_info.h"
#include "runtime/threads.h"
#include "util/error.h"

namespace {

// Under mpirun, an error must end every rank (the others may be waiting in a collective).
// When every rank raises it at the same point (a bad config, a check rank 0 made for all,
// a non-finite loss), the ranks agree on that within a few seconds, rank 0 prints it once
// and all exit with `code` after finalising MPI: no abort. An error only some ranks see
// prints with the rank's number and aborts the job.
[[noreturn]] void fail(std::unique_ptr<autosp::MpiRuntime>& mpi, const std::string& message, int code) {
  if (mpi && mpi->world_size() > 1) {
    const int rank = mpi->world_rank();
    if (mpi->all_ranks_failing(/*seconds=*/5.0)) {
      if (rank == 0) std::fprintf(stderr, "autosp: %s\n", message.c_str());
      mpi.reset();  // MPI_Finalize on every rank
      std::exit(code);
    }
    std::fprintf(stderr, "autosp: rank %d: %s\n", rank, message.c_str());
    std::fflush(stderr);
    mpi->abort_all(code);
  }
  std::fprintf(stderr, "autosp: %s\n", message.c_str());
  std::exit(code);
}

// Under mpirun, command-line errors are found before MPI starts, by every rank alike:
// rank 0 alone reports them.
bool lead_process() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
    if (const char* v = std::getenv(var)) return std::string(v) == "0";
  return true;
}

// The subcommand named on the command line ("" if none), for the help hint.
std::string subcommand_of(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "train" || a == "dump" || a == "plan" || a == "verify") return a;
  }
  return "";
}

// `autosp --version`: the build, the kernels this CPU runs, what is built in.
std::string version_text() {
  return std::string("autosp ") + AUTOSP_VERSION + "\n" + autosp::cpu::kernels_summary() +
         "\nbackends: " + autosp::backends_summary() + "\ncommunicators: single process, mpi (" +
         autosp::MpiRuntime::library_version() + ")" + autosp::nccl_summary();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace autosp::cli;
  // Before anything else: a CPU below the build's baseline, or a bad AUTOSP_ISA, is a clear
  // error rather than an illegal instruction later.
  if (std::string lacks; !autosp::cpu::cpu_runs_baseline(&lacks)) {
    if (lead_process())
      std::fprintf(stderr, "autosp: error: this CPU lacks %s; this build needs x86-64-v3 (AVX2, FMA, "
                   "BMI2)\n", lacks.c_str());
    return 1;
  }
  try {
    autosp::cpu::active_isa();
  } catch (const autosp::UserError& e) {
    if (lead_process()) std::fprintf(stderr, "autosp: error: %s\n", e.what());
    return 1;
  }
  CLI::App app{"autosp: a training compiler and runtime for long-context language models"};
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", version_text, "Print the version, the CPU kernels chosen and what is built in");

  const auto kPositive = CLI::Range(int64_t{1}, INT64_MAX);
  const auto kNonNegative = CLI::Range(int64_t{0}, INT64_MAX);
  // CLI::NonNegativeNumber lets "nan" through (nan < 0 is false).
  const CLI::Validator kSeconds(
      [](const std::string& text) {
        double v = 0;
        const bool parsed = CLI::detail::lexical_cast(text, v);
        return parsed && v >= 0 ? std::string() : "expected a number of seconds >= 0 (0: no limit), got " + text;
      },
      "SECONDS>=0");
  TrainArgs train;
  CLI::App* train_cmd = app.add_subcommand(
      "train", "Train a model (with no options: the built-in long-context demo)");
  // With no options at all, `train` runs the built-in demo; otherwise the flags marked
  // REQUIRED are (CLI11's ->required() would forbid the demo).
  train_cmd->add_option("--config", train.config, "REQUIRED. DeepSpeed-style JSON config")->check(CLI::ExistingFile);
  train_cmd->add_option("--model", train.model,
                        "REQUIRED unless --resume. Model directory (config.json, optional model.safetensors), or "
                        "a PyTorch program exported by python/autosp/export.py (FILE.pt2)")
      ->check(CLI::ExistingDirectory | CLI::ExistingFile);
  // Not CLI::ExistingFile: an indexed dataset is named by its prefix (open_data_source).
  train_cmd->add_option("--data", train.data,
                        "REQUIRED. Flat token file (little-endian uint32 ids), or a Megatron/NeMo indexed dataset: "
                        "PREFIX (or PREFIX.bin, PREFIX.idx) of PREFIX.bin + PREFIX.idx. Packing: the config's "
                        "\"data\" section (pack, eos_token_id)");
  train_cmd->add_option("--seq-len", train.seq_len, "REQUIRED unless --resume. Sequence length S")->check(kPositive);
  train_cmd->add_option("--steps", train.steps,
                        "REQUIRED. Train until this optimizer step (total, also when resuming)")
      ->check(kNonNegative);
  train_cmd->add_option("--metrics", train.metrics,
                        "Write one JSON object per step to this file (on --resume: kept up to the "
                        "checkpoint's step, then appended; without --resume a non-empty file needs --overwrite)");
  train_cmd->add_option("--save", train.save,
                        "Checkpoint directory (Hugging Face loadable): new, empty, or an autosp checkpoint (one this "
                        "run does not --resume from needs --overwrite)");
  train_cmd->add_flag("--overwrite", train.overwrite,
                      "Let --save replace a checkpoint this run does not resume from, and --metrics a non-empty "
                      "file without --resume");
  train_cmd->add_option("--save-every", train.save_every, "Also save every K steps (needs --save)")
      ->check(kPositive);
  train_cmd->add_option("--resume", train.resume, "Continue from this checkpoint directory");
  train_cmd->add_flag("--allow-new-data", train.allow_new_data,
                      "On --resume, train on data other than the checkpoint's, from its first sample");
  train_cmd->add_flag("--keep-data-position", train.keep_data_position,
                      "With --allow-new-data: continue at the checkpoint's sample position instead (wrapped onto "
                      "the new data)");
  train_cmd->add_option("--comm-timeout", train.comm_timeout,
                        "Under mpirun: seconds a collective may make no progress before the job is "
                        "aborted, naming the rank, the collective and the group (0: wait forever)")
      ->check(kSeconds)->default_val(600);
  train_cmd->add_option("--backend", train.backend,
                        "Where the step runs: cpu (default) or cuda (one GPU per rank; see autosp --version)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  train_cmd->add_option("--seed", train.seed, "Seed for initialisation (default: the config's seed)")
      ->type_name("INT");

  DumpArgs dump;
  CLI::App* dump_cmd = app.add_subcommand("dump", "Print a model's IR after a compiler stage");
  dump_cmd->add_option("--model", dump.model, "Model directory (config.json), or a PyTorch program exported by "
                       "python/autosp/export.py (FILE.pt2)")
      ->required()->check(CLI::ExistingDirectory | CLI::ExistingFile);
  dump_cmd->add_option("--seq-len", dump.seq_len, "Sequence length S")->required()->check(kPositive);
  dump_cmd->add_option("--batch", dump.batch, "Micro batch size")->check(kPositive);
  std::string stages;  // the pipeline's own list, so the help cannot fall behind it
  for (const std::string& s : autosp::pipeline_stages()) stages += (stages.empty() ? "" : " | ") + s;
  dump_cmd->add_option("--stage", dump.stage, stages)->required();
  dump_cmd->add_option("--backend", dump.backend,
                       "The kernels lower binds and plan_memory sizes: cpu (default) or cuda (no GPU needed)");
  dump_cmd->add_option("--dtype", dump.dtype, "f32 (default) or bf16 (the cuda backend's training dtype)");
  dump_cmd->add_option("--checkpoint", dump.checkpoint, "Checkpoint policy: none | full | sac (default sac)");
  dump_cmd->add_option("--tile-rows", dump.tile_rows, "Sequence rows per MLP tile (default 0: no tiling)")
      ->check(kNonNegative);
  dump_cmd->add_option("--sp", dump.sp, "sequence_parallel_size P (the autosp pass runs when P > 1)")
      ->check(kPositive);
  dump_cmd->add_option("--rank", dump.rank, "Which rank of the sequence-parallel group")->check(kNonNegative);
  dump_cmd->add_option("--zero", dump.zero, "ZeRO stage 0-3 (the grad_sync pass all-reduces the gradients at 0 and "
                       "reduce-scatters them at 1-3; at 3 it gathers the parameters too)")
      ->check(kNonNegative);
  dump_cmd->add_option("--gradient-accumulation-steps", dump.accumulation,
                       "Micro batches per step (> 1 at ZeRO 0/1: the last one's program, which adds the earlier "
                       "ones' summed gradients before reducing)")->check(kPositive);
  dump_cmd->add_option("--world", dump.world, "Ranks in all, data x sequence parallel (default: --sp)")
      ->check(kPositive);
  dump_cmd->add_option("--reduce-bucket-size", dump.reduce_bucket_size,
                       "Elements per gradient bucket (zero_optimization.reduce_bucket_size)")->check(kPositive);

  std::string verify_dir;
  CLI::App* verify_cmd = app.add_subcommand(
      "verify", "Check a checkpoint against its manifest (every file's size and checksum): exit 0 if whole, 1 if not");
  verify_cmd->add_option("CKPT", verify_dir, "Checkpoint directory (as given to --save)")->required();

  PlanArgs plan;
  CLI::App* plan_cmd = app.add_subcommand(
      "plan", "Plan a training step's memory per rank and the longest sequence each strategy trains (no data, no kernels)");
  plan_cmd->footer(
      "Assumes (unless the flags say otherwise): 1 rank, no sequence parallelism, ZeRO-0, bf16 compute with fp32 "
      "master weights and AdamW moments (a GPU run; --dtype f32 is the CPU runtime), micro batch 1, no gradient "
      "accumulation, DeepSpeed's default bucket sizes (reduce_bucket_size and allgather_bucket_size 5e8 elements, "
      "stage3_prefetch_bucket_size 5e7), and beside the compiler's plan a runtime reserve of 1 GiB per GPU (CUDA "
      "context, cuBLAS and NCCL buffers; with --dtype f32, the CPU runtime's own reserve). Sequence lengths are "
      "searched in multiples of 1024 x the SP size.");
  plan_cmd->add_option("--model", plan.model, "Hugging Face config.json (or a directory holding one)")
      ->required()->check(CLI::ExistingPath);
  // 2^20 ranks: far past any machine, and within the int the planner counts ranks in.
  const auto kRanks = CLI::Range(int64_t{1}, int64_t{1} << 20);
  plan_cmd->add_option("--world", plan.world, "Ranks W, data parallel x sequence parallel (default 1)")
      ->check(kRanks);
  plan_cmd->add_option("--sp", plan.sp, "sequence_parallel_size P (default 1; the SP strategies are planned when > 1)")
      ->check(kRanks);
  plan_cmd->add_option("--device-memory", plan.device_memory,
                       "Memory per rank, with a unit: 80GiB, 80GB, 24G (GiB), 512MiB")->required();
  plan_cmd->add_option("--zero", plan.zero, "ZeRO stage: 0, 1, 2 or 3 (default 0)")
      ->check(CLI::Range(int64_t{0}, int64_t{3}));
  plan_cmd->add_option("--dtype", plan.dtype,
                       "bf16 (default: a GPU run, bf16 compute, fp32 master state) or f32 (the CPU runtime)");
  plan_cmd->add_option("--backend", plan.backend,
                       "Whose kernels' workspaces the plan holds: cuda (default with bf16: what the cuda executor "
                       "allocates; no GPU needed) or cpu (default with --dtype f32)");
  plan_cmd->add_option("--micro-batch", plan.micro_batch, "Micro batch size (default 1)")->check(kPositive);
  plan_cmd->add_option("--gradient-accumulation-steps", plan.accumulation,
                       "Micro batches per step (default 1; ZeRO-1 keeps their whole gradient sum)")->check(kPositive);
  plan_cmd->add_option("--tile-rows", plan.tile_rows,
                       "Rows per MLP tile in the tiled strategies (default: chosen from the device memory)")
      ->check(kPositive);
  plan_cmd->add_flag("--json", plan.json, "Print one JSON object instead of the tables");
  plan_cmd->add_option("--plot", plan.plot, "Write an SVG of planned peak per rank against S for each strategy");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return lead_process() ? app.exit(e) : 0;  // --help
    const std::string sub = subcommand_of(argc, argv);
    if (lead_process())
      std::fprintf(stderr, "autosp: error: %s (see autosp %s--help)\n", e.what(), sub.empty() ? "" : (sub + " ").c_str());
    return 1;
  }
  // Before MPI_Init: it may re-exec this process (GOMP_SPINCOUNT is read when libgomp loads).
  if (*train_cmd) autosp::configure_threads(argv);
  std::unique_ptr<autosp::MpiRuntime> mpi;
  try {
    if (*train_cmd && autosp::MpiRuntime::launched_by_mpirun())
      mpi = std::make_unique<autosp::MpiRuntime>(&argc, &argv);
    if (*train_cmd) return run_train(train, mpi.get());
    if (*dump_cmd) return run_dump(dump);
    if (*plan_cmd) return run_plan(plan);
    if (*verify_cmd) return run_verify(verify_dir);
    std::cout << app.help();
    return 0;
  } catch (const autosp::CommTimeout& e) {
    // Some rank is not responding, so no agreement with the others is possible: end the job.
    std::fprintf(stderr, "autosp: rank %d: error: %s\n", mpi ? mpi->world_rank() : 0, e.what());
    if (mpi) mpi->abort_all(1);
    return 1;
  } catch (const autosp::UserError& e) {
    fail(mpi, std::string("error: ") + e.what(), 1);
  } catch (const autosp::InternalError& e) {
    fail(mpi, std::string(e.what()) + "\n(this is a bug in autosp; please report it)", 2);
  } catch (const std::bad_alloc&) {
    fail(mpi, "error: out of host memory (a shorter sequence, a smaller batch or more ranks "
                    "would need less)", 1);
  } catch (const std::exception& e) {
    fail(mpi, std::string("error: ") + e.what(), 1);
  }
}
