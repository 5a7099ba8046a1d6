// compile.overlap under real mpirun: the CPU executor runs the sequence-parallel all-to-alls
// while it computes what does not need them (passes/plan_memory.h, overlap), and the numbers
// are the same bits as without it; AUTOSP_PROFILE=1 says how much of their time compute hid.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "testing/compare.h"
#include "util/error.h"
#include "testing/process.h"

namespace autosp {
namespace {

using nlohmann::json;
using testing::read_metrics;
using testing::run_command;
using testing::TempDir;

const char* kMpiEnv = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 ";

TEST(Overlap, TheAllToAllsOverlapComputeAndChangeNoBit) {
  TempDir dir("overlap");
  auto gen = run_command(str("/usr/bin/python3 ", testing::source_path("tests/reference/llama_reference.py"),
                             " --out ", dir.path(), " --steps 4 --seq-len 64"));
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  std::vector<json> runs;
  for (bool overlap : {false, true}) {
    json c = json::parse(std::ifstream(dir / "ds_config.json"));
    c["sequence_parallel_size"] = 2;
    c["compile"] = {{"deepcompile", true}, {"passes", {"autosp"}}, {"overlap", overlap}};
    const std::string tag = overlap ? "on" : "off";
    std::ofstream(dir / (tag + ".json")) << c.dump();
    const std::string cmd =
        str(kMpiEnv, "AUTOSP_PROFILE=1 timeout 300 ", AUTOSP_MPIEXEC, " -np 2 --oversubscribe ", AUTOSP_BINARY,
            " train --config ", dir / (tag + ".json"), " --model ", dir.path(), " --data ", dir / "tokens.bin",
            " --seq-len 64 --steps 4 --metrics ", dir / (tag + ".jsonl"));
    const auto r = run_command(cmd);
    ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
    // The profile's line: "overlapped collectives: N per step, X ms in flight per step, of
    // which Y ms waited for: Z% hidden by compute".
    const std::regex line(R"(overlapped collectives: (\d+) per step, [0-9.]+ ms in flight per step, of which [0-9.]+ ms waited for: ([0-9.]+)% hidden)");
    std::smatch m;
    if (overlap) {
      ASSERT_TRUE(std::regex_search(r.output, m, line)) << r.output;
      // Forward and backward: q, k, v and the output's exchanges, in each of the 2 layers, for
      // each of the step's micro batches.
      EXPECT_EQ(std::stoi(m[1]), 16 * c["gradient_accumulation_steps"].get<int>());
      const double hidden = std::stod(m[2]);
      EXPECT_GE(hidden, 0.0);
      EXPECT_LE(hidden, 100.0);
      std::printf("overlap at SP 2, S 64: %s%% of the all-to-alls' time hidden by compute\n", m[2].str().c_str());
    } else {
      EXPECT_FALSE(std::regex_search(r.output, m, line)) << "no overlap was asked for:\n" << r.output;
    }
    runs.push_back(json(read_metrics(dir / (tag + ".jsonl"))));
  }
  ASSERT_EQ(runs[0].size(), 4u);
  ASSERT_EQ(runs[1].size(), 4u);
  for (size_t s = 0; s < 4; ++s) {
    // The same kernels on the same numbers in the same order: the same bits.
    EXPECT_EQ(runs[0][s]["loss"].get<double>(), runs[1][s]["loss"].get<double>()) << "step " << s + 1;
    EXPECT_EQ(runs[0][s]["grad_norm"].get<double>(), runs[1][s]["grad_norm"].get<double>()) << "step " << s + 1;
  }
}

}  // namespace
}  // namespace autosp
