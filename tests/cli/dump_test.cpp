// `autosp dump`: the IR after a stage, with a header that says what the graph is.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "models/llama.h"
#include "testing/process.h"
#include "util/error.h"
#include "testing/tiny_llama.h"

namespace autosp {
namespace {

using testing::run_command;

struct ModelDir {
  testing::TempDir dir{"dump"};
  ModelDir() {
    std::ofstream(dir / "config.json") << models::llama_config_json(testing::tiny_llama(1)).dump(2);
  }
  testing::ProcessResult dump(const std::string& args) const {
    return run_command(str(AUTOSP_BINARY, " dump --model ", dir.path(), " --seq-len 8 ", args));
  }
};

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

TEST(Dump, TheForwardStageIsTheUnsplitGraphWhateverTheRank) {
  ModelDir m;
  auto r = m.dump("--stage forward --sp 2 --rank 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(first_line(r.output),
            "# stage forward: the unsplit graph over all 8 positions (the autosp pass splits it after this stage)");
  r = m.dump("--stage autosp --sp 2 --rank 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(first_line(r.output), "# stage autosp, rank 1 of sequence_parallel_size 2: sequence positions [4, 8) of 8");
}

TEST(Dump, TheCheckpointStageShowsTheRecomputedNodes) {
  ModelDir m;
  auto none = m.dump("--stage checkpoint --checkpoint none"), full = m.dump("--stage checkpoint --checkpoint full");
  ASSERT_EQ(none.exit_code, 0) << none.output;
  ASSERT_EQ(full.exit_code, 0) << full.output;
  EXPECT_EQ(none.output.find("recompute:%"), std::string::npos);
  EXPECT_NE(full.output.find("= attention("), full.output.rfind("= attention("));  // forward and its copy
  EXPECT_NE(full.output.find("recompute:%"), std::string::npos);
  auto bad = m.dump("--stage checkpoint --checkpoint most");
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("--checkpoint: \"most\" is not a checkpoint policy"), std::string::npos) << bad.output;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The grad_sync stage is the program of a step's last micro batch: at ZeRO-0 the gradient
// buckets are all-reduced over the world; with accumulation it takes one summed gradient
// per parameter (tiny Llama of one layer: 12 tensors) and adds it before reducing.
TEST(Dump, TheGradSyncStageIsTheLastMicroBatchsProgram) {
  ModelDir m;
  const auto plain = m.dump("--stage grad_sync --sp 2 --zero 0"),
             acc = m.dump("--stage grad_sync --sp 2 --zero 0 --gradient-accumulation-steps 2"),
             one = m.dump("--stage grad_sync --sp 2 --zero 1 --world 4 --gradient-accumulation-steps 2");
  for (const auto* r : {&plain, &acc, &one}) ASSERT_EQ(r->exit_code, 0) << r->output;
  EXPECT_EQ(count(plain.output, "{role=\"gradient\"}"), 0u);
  EXPECT_EQ(count(plain.output, "all_reduce(%"), count(acc.output, "all_reduce(%"));
  EXPECT_GT(count(plain.output, "{group=\"world\", size=2}"), 0u);
  EXPECT_EQ(count(acc.output, "{role=\"gradient\"}"), 12u);
  EXPECT_EQ(count(acc.output, "\"grad_total:"), 12u);
  EXPECT_EQ(count(one.output, "\"grad_total:"), 12u);
  EXPECT_EQ(count(one.output, "output \"grad_shard:"), count(acc.output, "output \"grad_reduced:"));
  EXPECT_GT(count(one.output, "reduce_scatter(%"), 0u);
}

// The lower stage shows the kernel of every node, for the cuda backend too on a machine
// without a GPU (and in bf16, the cuda backend's training dtype); the CPU's attention is the
// active instruction set's copy.
TEST(Dump, TheLowerStageShowsEveryNodesKernelOnEitherBackend) {
  ModelDir m;
  for (const std::string backend : {"cpu", "cuda"})
    for (const std::string dtype : {"f32", "bf16"}) {
      if (backend == "cpu" && dtype == "bf16") continue;  // refused: tests/cli/cli_errors.sh
      SCOPED_TRACE(backend + " " + dtype);
      auto r = m.dump(str("--stage lower --sp 2 --backend ", backend, " --dtype ", dtype));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      size_t nodes = 0, lowered = 0;
      std::istringstream lines(r.output);
      for (std::string line; std::getline(lines, line);) {
        if (line.find(" = ") == std::string::npos || line.find(" = input(") != std::string::npos ||
            line.find("output \"") != std::string::npos)
          continue;  // not a node that runs
        ++nodes;
        lowered += line.find("kernel=\"" + backend + ".") != std::string::npos;
      }
      EXPECT_GT(nodes, 50u);
      EXPECT_EQ(lowered, nodes);
      if (backend == "cuda") {
        EXPECT_GT(count(r.output, "kernel=\"cuda.attention_blocks_forward\""), 0u);
      }
      if (dtype == "bf16") {
        EXPECT_NE(r.output.find("bf16["), std::string::npos);
      }
    }
}

// A PyTorch program dumps as a model directory does: GPT-2's Conv1D product is taken on the
// unflattened [B, s, K] rows, so the autosp pass splits it like any linear.
TEST(Dump, APyTorchProgramDumpsAtEachStage) {
  const std::string pt2 = testing::source_path("tests/fixtures/torch_export/gpt2/model.pt2");
  auto forward = run_command(str(AUTOSP_BINARY, " dump --model ", pt2, " --seq-len 8 --stage forward"));
  ASSERT_EQ(forward.exit_code, 0) << forward.output;
  EXPECT_NE(forward.output.find("\"transformer.h.0.attn.c_attn.weight\""), std::string::npos) << forward.output;
  auto split = run_command(str(AUTOSP_BINARY, " dump --model ", pt2, " --seq-len 8 --stage autosp --sp 2"));
  ASSERT_EQ(split.exit_code, 0) << split.output;
  EXPECT_NE(split.output.find("= all_to_all("), std::string::npos);
  std::istringstream lines(split.output);
  int linears = 0;
  for (std::string line; std::getline(lines, line);)
    if (line.find("= linear(") != std::string::npos) {
      ++linears;
      EXPECT_NE(line.find(": f32[1, 4, "), std::string::npos) << "not over this rank's 4 positions: " << line;
    }
  EXPECT_EQ(linears, 2 * 4) << split.output;  // c_attn, c_proj, c_fc, mlp.c_proj in each of 2 layers
  // The cuda backend's bf16 program of an imported graph compiles to a memory plan (Gemma3's
  // (1 + w) norm weights: bf16 fills).
  const std::string gemma3 = testing::source_path("tests/fixtures/torch_export/gemma3/model.pt2");
  auto bf16 = run_command(str(AUTOSP_BINARY, " dump --model ", gemma3,
                              " --seq-len 8 --stage plan_memory --backend cuda --dtype bf16 --sp 2"));
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  EXPECT_NE(bf16.output.find("fill() {dtype=\"bf16\""), std::string::npos) << bf16.output;
  EXPECT_NE(bf16.output.find(": bf16[1, 4, 32]"), std::string::npos) << bf16.output;
}

}  // namespace
}  // namespace autosp
