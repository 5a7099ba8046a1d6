// autosp: train | dump. User errors print one clear line and exit 1; internal errors
// (bugs) exit 2.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "util/error.h"

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
  dump_cmd->add_option("--stage", dump.stage, "forward | joint")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "autosp: error: %s (see autosp --help)\n", e.what());
    return 1;
  }
  try {
    if (*train_cmd) return run_train(train);
    if (*dump_cmd) return run_dump(dump);
    std::cout << app.help();
    return 0;
  } catch (const autosp::UserError& e) {
    std::fprintf(stderr, "autosp: error: %s\n", e.what());
    return 1;
  } catch (const autosp::InternalError& e) {
    std::fprintf(stderr, "autosp: %s\n(this is a bug in autosp; please report it)\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "autosp: error: out of host memory (a shorter sequence, a smaller batch or "
                         "more ranks would need less)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "autosp: error: %s\n", e.what());
    return 1;
  }
}
