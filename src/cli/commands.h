#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace autosp {
class MpiRuntime;
}

namespace autosp::cli {

struct TrainArgs {
  std::string config, model, data, metrics, save, resume;
  int64_t seq_len = 0, steps = -1, save_every = 0;
  bool allow_new_data = false;  // resume on data other than the checkpoint's
  std::string seed;  // parsed strictly by run_train (CLI11 saturates out-of-range integers)
  bool any_given() const {
    return !config.empty() || !model.empty() || !data.empty() || !resume.empty();
  }
};

struct DumpArgs {
  std::string model, stage, checkpoint = "sac";
  int64_t seq_len = 0, batch = 1, sp = 1, rank = 0, tile_rows = 0;
};

// mpi: the MPI runtime when launched by mpirun (else null: one process).
int run_train(const TrainArgs& args, MpiRuntime* mpi);
int run_dump(const DumpArgs& args);

}  // namespace autosp::cli
