#include "passes/pipeline.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "ops/op.h"
#include "passes/autodiff.h"
#include "util/error.h"

namespace autosp {

const std::vector<std::string>& pipeline_stages() {
  static const std::vector<std::string> stages = {"forward", "joint"};
  return stages;
}

Graph compile(const Graph& forward, const CompileOptions& options,
              const std::function<void(const std::string&, const Graph&)>& after_pass) {
  const bool print_times = [] {
    const char* v = std::getenv("AUTOSP_PASS_TIMES");
    return v && std::string(v) == "1";
  }();
  for (const std::string& pass : options.passes)
    if (pass != "autosp")
      user_error("compile.passes: \"", pass, "\" is not implemented in autosp (available: autosp)");
  if (options.sequence_parallel_size > 1)
    user_error("sequence_parallel_size = ", options.sequence_parallel_size,
               ": sequence parallelism needs the autosp pass, which this build does not have yet");

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
  g = run("joint", [&] {
    Graph joint = autodiff(g);
    verify(joint);
    return joint;
  });
  return g;
}

}  // namespace autosp
