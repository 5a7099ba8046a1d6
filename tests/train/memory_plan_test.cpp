// The memory plan is true: on real CPU runs of the reference Llama, the resident memory the
// OS counts (VmHWM minus the resident set before the model was built) is within 5% of the
// planned peak under every checkpoint policy, with MLP tiles and without, on one rank and on
// two (SP = 2), wherever the
// activations are at least half of the plan. A memory budget is met, and one that cannot
// be met fails before the first step naming the smallest budget that would do.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/tokens.h"
#include "testing/process.h"
#include "util/error.h"

namespace autosp {
namespace {

using nlohmann::json;
using testing::run_command;
using testing::TempDir;

const char* kMpiEnv = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 ";

struct Job {
  TempDir dir{"memory_plan"};
  Job() {
    auto r = run_command(str("/usr/bin/python3 ", testing::source_path("tests/reference/llama_reference.py"),
                             " --out ", dir.path(), " --steps 1"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::vector<uint32_t> tokens(8192 * 2 + 1);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint32_t(i * 7 % 67);  // vocab 67
    io::write_tokens(dir / "long.bin", tokens);
  }
  // One step at sequence length S; the metrics line of that step.
  json step(const std::string& tag, int S, int sp, const json& compile, testing::ProcessResult* out = nullptr) const {
    json c = {{"train_micro_batch_size_per_gpu", 1}, {"gradient_accumulation_steps", 1},
              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}, {"sequence_parallel_size", sp},
              {"compile", compile}};
    if (sp > 1) c["compile"]["deepcompile"] = true, c["compile"]["passes"] = {"autosp"};
    std::ofstream(dir / (tag + ".json")) << c.dump();
    std::string cmd = str(AUTOSP_BINARY, " train --config ", dir / (tag + ".json"), " --model ", dir.path(),
                          " --data ", dir / "long.bin", " --seq-len ", S, " --steps 1 --metrics ",
                          dir / (tag + ".jsonl"));
    cmd = sp > 1 ? str(kMpiEnv, "timeout 300 ", AUTOSP_MPIEXEC, " -np ", sp, " --oversubscribe ", cmd)
                 : str("OMP_NUM_THREADS=2 timeout 300 ", cmd);
    auto r = run_command(cmd);
    if (out) *out = r;
    if (r.exit_code != 0) return json{{"error", r.output}};
    std::ifstream in(dir / (tag + ".jsonl"));
    std::string line;
    std::getline(in, line);
    return json::parse(line);
  }
};

TEST(MemoryPlan, MeasuredResidentPeakIsWithinFivePercentOfThePlan) {
  Job job;
  struct Case {
    int S, sp;
    const char* policy;
    int tile_rows = 0;
  };
  for (const Case c : {Case{8192, 1, "none"}, Case{8192, 1, "sac"}, Case{8192, 1, "full"}, Case{8192, 1, "sac", 1024},
                       Case{8192, 2, "sac"}, Case{8192, 2, "full"}, Case{8192, 2, "full", 512}}) {
    SCOPED_TRACE(str("S=", c.S, " SP=", c.sp, " checkpoint ", c.policy, " tile_rows ", c.tile_rows));
    const json m = job.step(str("plan_", c.sp, "_", c.policy, "_", c.tile_rows), c.S, c.sp,
                            {{"checkpoint", c.policy}, {"tile_rows", c.tile_rows}});
    ASSERT_FALSE(m.contains("error")) << m["error"];
    const auto planned = m["planned_peak_bytes"].get<int64_t>();
    const auto activations = m["activation_peak_bytes"].get<int64_t>();
    ASSERT_GE(2 * activations, planned) << "activations are less than half of the plan: not a test of it";
    for (size_t r = 0; r < m["rss_peak_bytes_per_rank"].size(); ++r) {
      const double measured =
          double(m["rss_peak_bytes_per_rank"][r].get<int64_t>() - m["rss_base_bytes_per_rank"][r].get<int64_t>());
      std::printf("S=%d SP=%d %-5s tiles %4d rank %zu: planned %.2f MiB (activations %.2f), measured %.2f MiB "
                  "(%+.1f%%)\n", c.S, c.sp, c.policy, c.tile_rows, r, planned / 1048576.0, activations / 1048576.0,
                  measured / 1048576.0, 100 * (measured / planned - 1));
      EXPECT_NEAR(measured, double(planned), 0.05 * double(planned)) << "rank " << r;
    }
  }
}

TEST(MemoryPlan, ABudgetIsMetOrRefusedBeforeTheFirstStep) {
  Job job;
  // What sac plans at S = 8192 on SP = 2, per rank; full plans less.
  const json sac = job.step("budget_sac", 8192, 2, {{"checkpoint", "sac"}});
  ASSERT_FALSE(sac.contains("error")) << sac["error"];
  const double sac_gib = sac["planned_peak_bytes"].get<double>() / double(1 << 30);

  // A budget just below sac's plan: auto takes a cheaper-in-memory policy and stays under it.
  const json fits = job.step("budget_auto", 8192, 2, {{"checkpoint", "auto"}, {"memory_budget_gb", 0.97 * sac_gib}});
  ASSERT_FALSE(fits.contains("error")) << fits["error"];
  EXPECT_LE(fits["planned_peak_bytes"].get<double>(), 0.97 * sac_gib * double(1 << 30));
  for (size_t r = 0; r < fits["rss_peak_bytes_per_rank"].size(); ++r)
    EXPECT_LE(fits["rss_peak_bytes_per_rank"][r].get<double>() - fits["rss_base_bytes_per_rank"][r].get<double>(),
              0.97 * sac_gib * double(1 << 30))
        << "rank " << r;

  // A budget nothing fits: refused before step 1, naming the smallest budget that would do.
  testing::ProcessResult r;
  const json refused = job.step("budget_tiny", 8192, 2, {{"checkpoint", "auto"}, {"memory_budget_gb", 0.001}}, &r);
  ASSERT_TRUE(refused.contains("error"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("the smallest budget that fits is"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace autosp
