// Packed documents against a float64 PyTorch reference (tests/reference/llama_reference.py
// --eos): a flat token file whose EOS token ends documents of 1 to 2S tokens, trained with
// position ids restarting at each document, no label on a document's last token and
// attention within documents. The loss, grad-norm and lr curves and the final parameters of
// autosp's run through the CLI equal the reference on one device and under mpirun with
// sequence parallelism 2 and 4 (S = 15 is divisible by neither, so the last rank is padded,
// and documents cross rank chunks and sample boundaries), with data parallelism beside it,
// and under each checkpoint policy.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "models/llama.h"
#include "testing/compare.h"
#include "testing/process.h"
#include "train/checkpoint.h"

namespace autosp {
namespace {

using nlohmann::json;
using testing::normalised_error;
using testing::read_metrics;
using testing::run_command;
using testing::TempDir;

constexpr int kSeqLen = 15;
constexpr int kSteps = 6;
constexpr int kEos = 3;
const char* kMpiEnv = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 ";

struct Layout {
  int world, sp;
  const char* checkpoint;
  int zero = 0;
};

class PackedReference : public ::testing::TestWithParam<Layout> {};

TEST_P(PackedReference, EqualsFloat64) {
  const Layout L = GetParam();
  const int dp = L.world / L.sp, micro = 2, accum = 2;
  TempDir dir("packed_ref");
  // One float64 run of the global batch (micro 2 x accumulation 2 on one device) is the
  // reference of every layout: data-parallel rank r of dp reads what accumulation step
  // (m * dp + r) of the single device reads.
  auto gen = run_command(str("/usr/bin/python3 ", testing::source_path("tests/reference/llama_reference.py"),
                             " --out ", dir.path(), " --steps ", kSteps, " --seq-len ", kSeqLen, " --eos ", kEos,
                             " --accum ", accum));
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  const auto expected = io::read_safetensors(dir / "expected.safetensors");
  auto ref = [&](const std::string& name) -> const std::vector<float>& { return expected.at(name).data; };

  std::ifstream in(dir / "ds_config.json");
  json c = json::parse(in);
  ASSERT_EQ(c["data"]["eos_token_id"], kEos);
  c["train_micro_batch_size_per_gpu"] = micro;
  c["gradient_accumulation_steps"] = accum / dp;
  c["train_batch_size"] = micro * accum;
  c["sequence_parallel_size"] = L.sp;
  c["compile"] = {{"deepcompile", true}, {"passes", {"autosp"}}, {"checkpoint", L.checkpoint}};
  c["zero_optimization"] = {{"stage", L.zero}};
  std::ofstream(dir / "run.json") << c.dump(2);

  const std::string save = dir / "ckpt", metrics_path = dir / "metrics.jsonl";
  std::string cmd = str(AUTOSP_BINARY, " train --config ", dir / "run.json", " --model ", dir.path(), " --data ",
                        dir / "tokens.bin", " --seq-len ", kSeqLen, " --steps ", kSteps, " --metrics ", metrics_path,
                        " --save ", save);
  if (L.world > 1) cmd = str(kMpiEnv, "timeout 300 ", AUTOSP_MPIEXEC, " -np ", L.world, " --oversubscribe ", cmd);
  auto r = run_command(cmd);
  ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  EXPECT_NE(r.output.find("documents"), std::string::npos) << "the data line should say the data is packed:\n"
                                                           << r.output;

  const auto metrics = read_metrics(metrics_path);
  ASSERT_EQ(metrics.size(), size_t(kSteps));
  double worst_loss = 0, worst_norm = 0, worst_param = 0;
  for (int t = 0; t < kSteps; ++t) {
    SCOPED_TRACE(str("step ", t + 1));
    const double loss = metrics[t]["loss"], norm = metrics[t]["grad_norm"];
    EXPECT_NEAR(metrics[t]["lr"].get<double>(), ref("lr")[t], 1e-7 * ref("lr")[t]);
    // The unpacked reference test's tolerances (fp32 vs float64 through AdamW updates).
    EXPECT_NEAR(loss, ref("loss")[t], 1e-6 * std::abs(ref("loss")[t]));
    EXPECT_NEAR(norm, ref("grad_norm")[t], 2e-6 * ref("grad_norm")[t]);
    worst_loss = std::max(worst_loss, std::abs(loss / ref("loss")[t] - 1));
    worst_norm = std::max(worst_norm, std::abs(norm / ref("grad_norm")[t] - 1));
  }
  models::LlamaConfig model = models::load_llama_config(save + "/config.json");
  auto params = train::load_weights(save + "/model.safetensors", model);
  auto specs = models::llama_parameters(model);
  for (size_t i = 0; i < specs.size(); ++i) {
    const double err = normalised_error(params[i], ref("param." + specs[i].name));
    worst_param = std::max(worst_param, err);
    EXPECT_LT(err, 5e-6) << specs[i].name;
  }
  std::printf("packed, W=%d SP=%d ZeRO-%d %s vs float64: loss rel %.2e, grad norm rel %.2e, parameters %.2e\n",
              L.world, L.sp, L.zero, L.checkpoint, worst_loss, worst_norm, worst_param);
}

INSTANTIATE_TEST_SUITE_P(Layouts, PackedReference,
                         ::testing::Values(Layout{1, 1, "none"}, Layout{1, 1, "full"}, Layout{2, 2, "sac"},
                                           Layout{4, 4, "full"}, Layout{4, 2, "none", 1}, Layout{4, 4, "sac", 3}),
                         [](const auto& info) {
                           return str("W", info.param.world, "_SP", info.param.sp, "_", info.param.checkpoint,
                                      "_zero", info.param.zero);
                         });

}  // namespace
}  // namespace autosp
