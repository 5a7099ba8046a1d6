// autosp: train | dump. User errors print one clear line and exit 1; internal errors
// (bugs) exit 2.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "comm/mpi_communicator.h"
#include "util/error.h"

namespace {

// Under mpirun, an error on one rank must end every rank (the others may be waiting for it
// in a collective): print it, prefixed by the rank, and abort the job. Rank 0 prints at
// once; other ranks wait a moment, so an error every rank sees is printed once, by rank 0.
[[noreturn]] void fail(autosp::MpiRuntime* mpi, const std::string& message, int code) {
  if (mpi && mpi->world_size() > 1) {
    if (mpi->world_rank() != 0) sleep(2);
    std::fprintf(stderr, "autosp: rank %d: %s\n", mpi->world_rank(), message.c_str());
    std::fflush(stderr);
    mpi->abort_all(code);
  }
  std::fprintf(stderr, "autosp: %s\n", message.c_str());
  std::exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace autosp::cli;
  CLI::App app{"autosp: a training compiler and runtime for long-context language models"};
  app.require_subcommand(0, 1);

  const auto kPositive = CLI::Range(int64_t{1}, INT64_MAX);
  const auto kNonNegative = CLI::Range(int64_t{0}, INT64_MAX);
  TrainArgs train;
  CLI::App* train_cmd = app.add_subcommand(
      "train", "Train a model (with no options: the built-in long-context demo)");
  train_cmd->add_option("--config", train.config, "DeepSpeed-style JSON config")->check(CLI::ExistingFile);
  train_cmd->add_option("--model", train.model, "Model directory (config.json, optional model.safetensors)")
      ->check(CLI::ExistingDirectory);
  train_cmd->add_option("--data", train.data, "Token file (little-endian uint32 ids)")->check(CLI::ExistingFile);
  train_cmd->add_option("--seq-len", train.seq_len, "Sequence length S")->check(kPositive);
  train_cmd->add_option("--steps", train.steps, "Train until this optimizer step (total, also when resuming)")
      ->check(kNonNegative);
  train_cmd->add_option("--metrics", train.metrics, "Write one JSON object per step to this file");
  train_cmd->add_option("--save", train.save, "Checkpoint directory (Hugging Face loadable)");
  train_cmd->add_option("--save-every", train.save_every, "Also save every K steps")->check(kPositive);
  train_cmd->add_option("--resume", train.resume, "Continue from this checkpoint directory");
  train_cmd->add_option("--seed", train.seed, "Seed for initialisation (default: the config's seed)");

  DumpArgs dump;
  CLI::App* dump_cmd = app.add_subcommand("dump", "Print a model's IR after a compiler stage");
  dump_cmd->add_option("--model", dump.model, "Model directory (config.json)")
      ->required()->check(CLI::ExistingDirectory);
  dump_cmd->add_option("--seq-len", dump.seq_len, "Sequence length S")->required()->check(kPositive);
  dump_cmd->add_option("--batch", dump.batch, "Micro batch size")->check(kPositive);
  dump_cmd->add_option("--stage", dump.stage, "forward | autosp | joint | schedule | plan_memory")->required();
  dump_cmd->add_option("--sp", dump.sp, "sequence_parallel_size P (the autosp pass runs when P > 1)")
      ->check(kPositive);
  dump_cmd->add_option("--rank", dump.rank, "Which rank of the sequence-parallel group")->check(kNonNegative);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "autosp: error: %s (see autosp --help)\n", e.what());
    return 1;
  }
  std::unique_ptr<autosp::MpiRuntime> mpi;
  try {
    if (*train_cmd && autosp::MpiRuntime::launched_by_mpirun())
      mpi = std::make_unique<autosp::MpiRuntime>(&argc, &argv);
    if (*train_cmd) return run_train(train, mpi.get());
    if (*dump_cmd) return run_dump(dump);
    std::cout << app.help();
    return 0;
  } catch (const autosp::UserError& e) {
    fail(mpi.get(), std::string("error: ") + e.what(), 1);
  } catch (const autosp::InternalError& e) {
    fail(mpi.get(), std::string(e.what()) + "\n(this is a bug in autosp; please report it)", 2);
  } catch (const std::bad_alloc&) {
    fail(mpi.get(), "error: out of host memory (a shorter sequence, a smaller batch or more ranks "
                    "would need less)", 1);
  } catch (const std::exception& e) {
    fail(mpi.get(), std::string("error: ") + e.what(), 1);
  }
}
