// The Qwen2, Qwen3 and Mistral fixtures of tests/fixtures/hf_families (written by
// tests/fixtures/make_hf_family_fixtures.py with transformers itself): each model directory,
// its two samples (plain, packed) as autosp's trainer is fed them, and transformers' float64
// losses and gradients. No gtest here: the MPI driver (tests/sp/hf_families_mpi_main.cpp)
// reads the fixtures too.
#pragma once
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "models/llama.h"
#include "passes/autosp.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/trainer.h"

namespace autosp::testing {

inline const std::vector<std::string>& hf_families() {
  static const std::vector<std::string> names = {"qwen2", "qwen3", "mistral"};
  return names;
}

struct HfFamilyFixture {
  std::string dir;
  nlohmann::json expected;  // expected.json
  models::LlamaConfig model;
  std::vector<std::vector<float>> params;  // model.safetensors, in llama_parameters order

  explicit HfFamilyFixture(const std::string& directory) : dir(directory) {
    std::ifstream in(dir + "/expected.json");
    expected = nlohmann::json::parse(in);
    model = models::load_llama_config(dir + "/config.json");
    params = train::load_weights(dir + "/model.safetensors", model);
  }
  int64_t seq_len() const { return expected["seq_len"].get<int64_t>(); }

  // The micro batch (B = 1) of sample "plain" (tokens[:S] predicting tokens[1:]) or
  // "packed" (documents with restarting positions, no label on a document's last token).
  SequenceBatch batch(bool packed) const {
    const int64_t S = seq_len();
    SequenceBatch b{1, S, {}, {}, {}, {}};
    if (packed) {
      const nlohmann::json& p = expected["packed"];
      b.input_ids = p["input_ids"].get<std::vector<int32_t>>();
      b.labels = p["labels"].get<std::vector<int32_t>>();
      b.position_ids = p["position_ids"].get<std::vector<int32_t>>();
      b.document_ids = p["document_ids"].get<std::vector<int32_t>>();
    } else {
      const std::vector<int32_t> tokens = expected["tokens"].get<std::vector<int32_t>>();
      b.input_ids.assign(tokens.begin(), tokens.begin() + S);
      b.labels.assign(tokens.begin() + 1, tokens.begin() + S + 1);
      for (int64_t i = 0; i < S; ++i) b.position_ids.push_back(static_cast<int32_t>(i));
    }
    return b;
  }
  // transformers' float64 loss of the sample (with the model's window, or without it).
  double loss(bool packed, bool window = true) const {
    const nlohmann::json& e = packed ? expected["packed"] : expected;
    return e[window ? "loss" : "loss_without_window"].get<double>();
  }
};

// A training config of one micro batch of one sample for `sp` sequence-parallel ranks (the
// autosp pass with sp > 1) under checkpoint `policy`, ZeRO-0.
inline train::TrainConfig hf_family_train_config(int sp, const std::string& policy, bool packed) {
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", 1}, {"gradient_accumulation_steps", 1},
                      {"sequence_parallel_size", sp},
                      {"compile", {{"deepcompile", true}, {"passes", {"autosp"}}, {"checkpoint", policy}}},
                      {"zero_optimization", {{"stage", 0}}}};
  train::TrainConfig config = train::parse_train_config(j, "hf family test", nullptr);
  train::resolve_batch(config, 1, "hf family test");
  config.data.packed = packed;
  return config;
}

}  // namespace autosp::testing
