#include "passes/pipeline.h"

#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "ops/op.h"
#include "passes/autodiff.h"
#include "passes/autosp.h"
#include "passes/fuse.h"
#include "passes/plan_memory.h"
#include "passes/schedule.h"
#include "passes/tile.h"
#include "util/error.h"

namespace autosp {

const std::vector<std::string>& pipeline_stages() {
  static const std::vector<std::string> stages = {"forward",  "autosp",    "tile",  "joint",      "checkpoint", "fuse",
                                                  "schedule", "grad_sync", "lower", "plan_memory"};
  return stages;
}

void check_compile_options(const CompileOptions& options) {
  bool use_autosp = false;
  for (const std::string& pass : options.passes) {
    if (pass != "autosp")
      user_error("compile.passes: \"", pass, "\" is not implemented in autosp (available: autosp)");
    use_autosp = true;
  }
  if (use_autosp && !options.deepcompile)
    user_error("compile.passes lists autosp but compile.deepcompile is false; set \"deepcompile\": true");
  if (options.sequence_parallel_size > 1 && !use_autosp)
    user_error("sequence_parallel_size = ", options.sequence_parallel_size,
               " needs the autosp pass: add \"compile\": {\"deepcompile\": true, \"passes\": [\"autosp\"]}");
}

Graph compile(const Graph& forward, const CompileOptions& options,
              const std::function<void(const std::string&, const Graph&)>& after_pass) {
  const bool print_times = [] {
    const char* v = std::getenv("AUTOSP_PASS_TIMES");
    return v && std::string(v) == "1";
  }();
  check_compile_options(options);

  auto run = [&](const std::string& stage, auto&& fn) {
    const auto start = std::chrono::steady_clock::now();
    Graph g = fn();
    if (print_times)
      std::fprintf(stderr, "pass %-12s %8.3f ms  %zu nodes\n", stage.c_str(),
                   std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count(),
                   g.nodes().size());
    if (after_pass) after_pass(stage, g);
    return g;
  };

  Graph g = run("forward", [&] {
    verify(forward);
    return forward;
  });
  g = run("autosp", [&] { return autosp(g, {options.sequence_parallel_size}); });
  g = run("tile", [&] { return tile(g, options.tile); });
  g = run("joint", [&] {
    Graph joint = autodiff(g);
    verify(joint);
    return joint;
  });
  g = run("checkpoint", [&] {
    Graph checkpointed = checkpoint(g, options.checkpoint);
    verify(checkpointed);
    return checkpointed;
  });
  g = run("fuse", [&] {
    Graph fused = fuse(g, {.backend = options.backend});
    verify(fused);
    return fused;
  });
  const int threads = options.threads > 0 ? options.threads : omp_get_max_threads();
  g = run("schedule", [&] { return schedule(g, {.threads = threads, .backend = options.backend}); });
  // After schedule: it would issue each stage-3 parameter gather (ready from the start)
  // first (passes/grad_sync.h).
  g = run("grad_sync", [&] {
    Graph synced = grad_sync(g, options.grad_sync);
    verify(synced);
    return synced;
  });
  g = run("lower", [&] { return lower(g, {.backend = options.backend, .threads = threads}); });
  g = run("plan_memory", [&] { return plan_memory(g, {.threads = threads, .overlap = options.overlap}); });
  return g;
}

CompileOptions last_micro_batch_options(const CompileOptions& options, int64_t accumulation_steps) {
  AUTOSP_CHECK(accumulation_steps >= 1, "accumulation steps ", accumulation_steps);
  CompileOptions last = options;
  last.grad_sync.reduce = true;
  last.grad_sync.accumulated = accumulation_steps > 1 && options.grad_sync.zero_stage < 2;
  return last;
}

CompiledStep compile_step(const Graph& forward, const CompileOptions& options, int64_t accumulation_steps) {
  const CompileOptions last = last_micro_batch_options(options, accumulation_steps);
  CompiledStep step;
  Graph scheduled;
  step.last = compile(forward, last, [&](const std::string& stage, const Graph& g) {
    if (stage == "schedule" && last.grad_sync.accumulated) scheduled = g;
  });
  if (last.grad_sync.accumulated) {
    GradSyncOptions local = options.grad_sync;
    local.reduce = false;
    Graph earlier = grad_sync(scheduled, local);
    verify(earlier);
    const int threads = options.threads > 0 ? options.threads : omp_get_max_threads();
    step.earlier = plan_memory(lower(earlier, {.backend = options.backend, .threads = threads}),
                               {.threads = threads, .overlap = options.overlap});
  }
  return step;
}

}  // namespace autosp
