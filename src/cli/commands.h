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
  bool allow_new_data = false;  // resume on data other than the checkpoint's (from its first sample)
  bool keep_data_position = false;  // with allow_new_data: at the checkpoint's sample position instead
  bool overwrite = false;  // --save may replace a checkpoint not resumed from; --metrics a non-empty file
  double comm_timeout = 600;    // seconds a collective may make no progress (0: no limit)
  std::string seed;  // parsed strictly by run_train (CLI11 saturates out-of-range integers)
  std::string backend = "cpu";  // cpu | cuda
  bool any_given() const {
    return !config.empty() || !model.empty() || !data.empty() || !resume.empty();
  }
};

struct DumpArgs {
  std::string model, stage, checkpoint = "sac", backend = "cpu", dtype = "f32";
  int64_t seq_len = 0, batch = 1, sp = 1, rank = 0, tile_rows = 0;
  int64_t zero = 0, world = 0, reduce_bucket_size = 500000000;  // world 0: the SP size
  int64_t accumulation = 1;  // gradient_accumulation_steps: > 1 dumps the last micro batch's program
};

struct PlanArgs {
  std::string model, device_memory, dtype = "bf16", plot;
  std::string backend;  // empty: cuda for bf16 (a GPU run), cpu for f32 (the CPU runtime)
  int64_t world = 1, sp = 1, zero = 0, micro_batch = 1, accumulation = 1;
  int64_t tile_rows = 0;  // tiled strategies: rows per tile (0: the compiler's choice from the memory)
  bool json = false;
};

// mpi: the MPI runtime when launched by mpirun (else null: one process).
int run_train(const TrainArgs& args, MpiRuntime* mpi);
int run_dump(const DumpArgs& args);
// `autosp verify CKPT`: checks a checkpoint against its manifest; 0 if whole, else 1.
int run_verify(const std::string& dir);
// `autosp plan`: the per-rank memory of a training step and the longest sequence that trains
// under each strategy, compile-only (src/train/planner.h).
int run_plan(const PlanArgs& args);

}  // namespace autosp::cli
