// Imported PyTorch programs (tests/fixtures/torch_export: transformers' Llama, GPT-2, Phi3, Gemma3
// and Qwen2 through torch.export) under real mpirun with sequence parallelism 2 and 4: the autosp
// pass shards the imported graph as it does a built one (the positions input split, all-to-all
// around attention, KV heads repeated where fewer than SP), and the loss and every gradient equal PyTorch's
// float64 ones at the single-device test's tolerances (tests/frontend/torch_import_test.cpp);
// with the batch packed as documents, equal to one process's step.
// tests/sp/torch_import_mpi_main.cpp runs the steps; this compares what it wrote.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "testing/compare.h"
#include "testing/process.h"
#include "testing/torch_export.h"

namespace autosp {
namespace {

class TorchImportSequenceParallel : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(TorchImportSequenceParallel, LossAndGradientsEqualPyTorchFloat64) {
  const auto [model, sp] = GetParam();
  const testing::ExportFixture f(testing::source_path("tests/fixtures/torch_export/" + model));
  testing::TempDir out("torch_sp");
  const std::string cmd = str("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 timeout 300 ",
                              AUTOSP_MPIEXEC, " -np ", sp, " --oversubscribe ", AUTOSP_TORCH_IMPORT_MPI, " ", f.dir, " ",
                              out.path());
  const auto r = testing::run_command(cmd);
  ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  const double want = f.expected["steps"][0]["loss"].get<double>();
  std::map<std::string, io::HostTensor> none;
  for (const char* policy : {"none", "sac"}) {
    SCOPED_TRACE(str(model, " SP ", sp, ", checkpoint ", policy));
    std::ifstream in(out / str(policy, ".json"));
    ASSERT_TRUE(in) << r.output;
    const double loss = nlohmann::json::parse(in)["loss"];
    EXPECT_NEAR(loss, want, 1e-6 * std::abs(want));
    const auto grads = io::read_safetensors(out / str(policy, ".safetensors"));
    double worst = 0;
    for (const auto& spec : f.program.parameters()) {
      const std::string name = "grad." + spec.name;
      ASSERT_TRUE(grads.count(name)) << name;
      const double err = f.gradient_error(spec.name, grads.at(name).data);
      worst = std::max(worst, err);
      EXPECT_LT(err, 5e-6) << spec.name;
      if (std::string(policy) == "none") none[name] = grads.at(name);
      else EXPECT_EQ(grads.at(name).data, none.at(name).data) << spec.name;
    }
    std::printf("%s SP %d, checkpoint %s: loss %.10f vs PyTorch %.10f, worst gradient %.1e\n", model.c_str(), sp, policy,
                loss, want, worst);
  }
  // Packed documents: SP P equals one process's step (PyTorch's fixtures are unpacked).
  train::TrainConfig packed = testing::fixture_config(f.B());
  packed.data.packed = true;
  std::vector<std::vector<float>> grads;
  const double one = train::Trainer(f.model(), packed, f.S(), f.state()).loss_and_grads(f.packed_batch(), grads);
  std::ifstream in(out / "packed.json");
  ASSERT_TRUE(in) << r.output;
  const double loss = nlohmann::json::parse(in)["loss"];
  EXPECT_NEAR(loss, one, 1e-6 * std::abs(one)) << "packed documents";
  EXPECT_GT(std::abs(one - want), 1e-4) << "the packed batch's loss is the unpacked one's";
  const auto split = io::read_safetensors(out / "packed.safetensors");
  const auto& specs = f.program.parameters();
  const double scale = testing::largest_element(grads);
  for (size_t i = 0; i < specs.size(); ++i)
    EXPECT_LT(testing::gradient_error(split.at("grad." + specs[i].name).data, grads[i], scale), 5e-6)
        << "packed documents: " << specs[i].name;
}

INSTANTIATE_TEST_SUITE_P(Models, TorchImportSequenceParallel,
                         ::testing::Combine(::testing::Values("llama", "gpt2", "phi3", "gemma3", "llama31", "qwen2",
                                                              "phi3_partial", "olmo", "granite", "arcee", "stablelm",
                                                              "helium", "glm", "cohere", "persimmon", "falcon",
                                                              "nemotron", "gptj", "codegen", "gemma2", "opt", "cohere2",
                                                              "apertus", "mpt", "bloom", "gpt_neo", "qwen3", "gpt_neox",
                                                              "olmo2", "gpt_bigcode", "starcoder2", "smollm3", "phi",
                                                              "glm4", "biogpt", "bert_generation", "bert", "openai_gpt", "exaone4", "phi3_longrope", "nanogpt", "nanogpt_layerscale", "nanogpt_frozen", "sinusoidal_lm", "ctrl", "mingpt", "llama_lora", "olmo_clip", "llama_dora", "llama_vera", "scalar_gain", "normalized_gpt", "einsum_gpt", "xtransformers", "xtransformers_rotary",
                                                              "nanogpt_shift", "titan_llama", "torch_encoder",
                                                              "torch_encoder_prenorm", "cached_llama", "mixtral",
                                                              "qwen3_moe", "olmoe", "qwen2_moe", "mixtral_aux",
                                                              "glm4_moe", "ernie4_5_moe", "deepseek_v3", "granitemoe",
                                                              "hunyuan_moe", "gpt_oss", "dbrx", "deepseek_v2", "llama4", "aria", "longcat_flash", "llama_tf5", "qwen2_tf5", "glm_tf5",
                                                              "mixtral_tf5", "mixtral_aux_tf5", "qwen2_moe_tf5", "granitemoe_tf5",
                                                              "bloom_tf5", "gpt_neo_tf5", "glm4_moe_tf5",
                                                              "ernie4_5_moe_tf5", "deepseek_v3_tf5", "gpt_oss_tf5", "dbrx_tf5", "deepseek_v2_tf5", "llama4_tf5", "aria_tf5", "longcat_flash_tf5", "bert_tf5"),
                                            ::testing::Values(2, 4)),
                         [](const auto& info) { return str(std::get<0>(info.param), "_sp", std::get<1>(info.param)); });

}  // namespace
}  // namespace autosp
