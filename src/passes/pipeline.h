// The compiler pipeline, as one straight list of passes (DESIGN.md "The pipeline"):
//
//   forward --autosp--> --tile--> --autodiff--> joint --checkpoint--> --fuse--> --schedule-->
//   --grad_sync--> --lower--> --plan_memory--> lowered
//
// Built so far: autosp, tile, autodiff, checkpoint, fuse, schedule, grad_sync, lower and
// plan_memory (stages "forward", "autosp", "tile", "joint", "checkpoint", "fuse", "schedule",
// "grad_sync", "lower", "plan_memory"); tile runs before autodiff (see passes/tile.h) and checkpoint right after
// it. fuse makes the loss and its gradient one node on the cpu backend (passes/fuse.h). grad_sync reduces the gradients inside the step (all-reduce under ZeRO stage 0,
// reduce-scatter under 1-3) and gathers the parameters under stage 3 (passes/grad_sync.h),
// after schedule so that the gathers stay where it put them. lower binds every node to
// the kernel of `backend` (passes/lower.h), refusing what it cannot run, and plan_memory
// plans with those kernels' workspaces. Asking for a pass that does not
// exist is a clear error, not a silent no-op. AUTOSP_PASS_TIMES=1 prints each pass's time.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "passes/checkpoint.h"
#include "passes/grad_sync.h"
#include "passes/lower.h"
#include "passes/tile.h"

namespace autosp {

struct CompileOptions {
  int64_t sequence_parallel_size = 1;
  std::vector<std::string> passes;  // the config's compile.passes
  bool deepcompile = false;
  // The kernel threads the executor will run with (0: OpenMP's default, as CpuExecutor's);
  // kernel workspaces, and so the memory plan, depend on them.
  int threads = 0;
  Backend backend = Backend::cpu;  // the kernels lower binds (and schedule and plan_memory size)
  CheckpointOptions checkpoint;  // which activations backward keeps (none: all of them)
  TileOptions tile;              // sequence tiles of row-wise regions (default: none)
  GradSyncOptions grad_sync;     // ZeRO stage, world size and bucket (default: stage 0, unchanged)
  // The executor overlaps the all-to-alls with the compute that follows them (plan_memory's
  // overlap; cuda: on a communication stream); the numbers are the same either way.
  bool overlap = false;
};

// The stage names `autosp dump --stage` accepts, in pipeline order.
const std::vector<std::string>& pipeline_stages();

// Runs the pipeline on a forward graph. `after_pass(stage, graph)` is called after each
// stage (for dumps and tests); it may be empty. Returns the final graph: the joint graph,
// scheduled and memory-planned (read_memory_plan gives its arena).
Graph compile(const Graph& forward, const CompileOptions& options,
              const std::function<void(const std::string&, const Graph&)>& after_pass = {});

// The checks compile() makes of compile.passes, compile.deepcompile and
// sequence_parallel_size (UserErrors in the config's words), for a caller to make them
// before it reads anything the compile would then wait on (autosp train: data, weights).
void check_compile_options(const CompileOptions& options);

// The programs of one optimizer step of `accumulation_steps` micro batches. `last` runs the
// last micro batch and reduces the gradients; under ZeRO stages 0 and 1 with accumulation it
// takes the earlier micro batches' summed gradients ("grad_acc:<name>") and `earlier`, the
// same pipeline without the reduction, runs the micro batches before it (its "grad:<name>"
// outputs stay on the rank). `earlier` is empty otherwise: stages 2 and 3 reduce every micro
// batch, and one micro batch needs one program. Both come from one run of the passes before
// grad_sync, so they compute the same gradients.
struct CompiledStep {
  Graph last;
  Graph earlier;  // no nodes when there is none
  bool has_earlier() const { return !earlier.nodes().empty(); }
};
CompiledStep compile_step(const Graph& forward, const CompileOptions& options, int64_t accumulation_steps);
// The options of a step's last program (`autosp dump` shows it): gradients reduced in the
// graph, and with accumulation under ZeRO 0 and 1 the earlier micro batches' sum added first.
CompileOptions last_micro_batch_options(const CompileOptions& options, int64_t accumulation_steps);

}  // namespace autosp
