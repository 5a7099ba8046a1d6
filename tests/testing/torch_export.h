// The torch.export fixtures (tests/fixtures/torch_export, written by
// tests/fixtures/make_torch_export_fixtures.py): each program, PyTorch's float64 results on it,
// and the training config and data the reference used. No gtest here: the MPI driver
// (tests/sp/torch_import_mpi_main.cpp) reads the fixtures too.
#pragma once
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "frontend/torch_import.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "train/config.h"
#include "train/trainer.h"

namespace autosp::testing {

// A gradient tensor against a reference one: the normalised error (max |got - ref| over max
// |ref|), except for a gradient that is zero in exact arithmetic, which is rounding noise in
// both runs and has no scale of its own (OPT's separate key biases: softmax is unchanged by
// q . b added to a whole row; the float64 run gives 5e-10, autosp's fp32 2.7e-9). One whose
// largest element is under 1e-6 of `model_scale` (the model's largest gradient element) is
// measured against model_scale instead.
inline double gradient_error(const std::vector<float>& got, const std::vector<float>& ref, double model_scale) {
  if (got.size() != ref.size()) return INFINITY;
  double own = 0, err = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    own = std::max(own, double(std::abs(ref[i])));
    err = std::max(err, std::abs(double(got[i]) - double(ref[i])));
  }
  return err / std::max(own < 1e-6 * model_scale ? model_scale : own, 1e-30);
}
// The largest element of any of the tensors.
inline double largest_element(const std::vector<std::vector<float>>& tensors) {
  double m = 0;
  for (const auto& t : tensors)
    for (float v : t) m = std::max(m, double(std::abs(v)));
  return m;
}

// A fixture: the program, PyTorch's float64 results on it (expected.json, reference.safetensors).
struct ExportFixture {
  std::string dir;
  nlohmann::json expected;
  TorchProgram program;
  std::map<std::string, io::HostTensor> reference;

  explicit ExportFixture(const std::string& directory)
      : dir(directory),
        expected(nlohmann::json::parse(std::ifstream(dir + "/expected.json"))),
        program(TorchProgram::load(dir + "/model.pt2")),
        reference(io::read_safetensors(dir + "/reference.safetensors")) {}
  // reference.safetensors' name of a parameter's gradient (the fixture script keeps the export
  // wrapper's "model." prefix the importer removes).
  std::string grad_key(const std::string& name) const {
    return reference.count("grad.model." + name) ? "grad.model." + name : "grad." + name;
  }
  // A parameter's gradient against PyTorch's (testing::gradient_error, at the scale of all of
  // PyTorch's gradients).
  double gradient_error(const std::string& name, const std::vector<float>& got) const {
    std::vector<std::vector<float>> all;
    for (const auto& [key, t] : reference)
      if (key.rfind("grad.", 0) == 0) all.push_back(t.data);
    return testing::gradient_error(got, reference.at(grad_key(name)).data, largest_element(all));
  }
  int64_t B() const { return expected["B"].get<int64_t>(); }
  int64_t S() const { return expected["S"].get<int64_t>(); }
  std::vector<std::vector<int32_t>> tokens() const { return expected["tokens"].get<std::vector<std::vector<int32_t>>>(); }
  models::Model model() const { return program.model(); }
  train::ModelState state() const {
    std::vector<std::vector<float>> params;
    for (size_t i = 0; i < program.parameters().size(); ++i) params.push_back(program.read_parameter(i));
    return train::ModelState::with_weights(program.parameters(), std::move(params));
  }
  // Row r of the batch as autosp's data gives it: S inputs, the S tokens after them as labels.
  SequenceBatch batch() const {
    SequenceBatch b{B(), S(), {}, {}, {}, {}};
    for (const auto& row : tokens()) {
      b.input_ids.insert(b.input_ids.end(), row.begin(), row.begin() + S());
      b.labels.insert(b.labels.end(), row.begin() + 1, row.begin() + S() + 1);
      for (int64_t i = 0; i < S(); ++i) b.position_ids.push_back(int32_t(i));
    }
    return b;
  }
  // The batch as packed documents: each row three documents of 5, 7 and the rest of the tokens,
  // positions restarting at each (train with config.data.packed).
  SequenceBatch packed_batch() const {
    SequenceBatch b = batch();
    b.position_ids.clear();
    for (int64_t r = 0; r < B(); ++r)
      for (int64_t i = 0; i < S(); ++i) {
        const int32_t doc = i < 5 ? 0 : i < 12 ? 1 : 2, start = doc == 0 ? 0 : doc == 1 ? 5 : 12;
        b.document_ids.push_back(doc);
        b.position_ids.push_back(int32_t(i) - start);
      }
    return b;
  }
};

// The fixture's rows, the same every step (the reference trains on one batch).
class FixedRows final : public train::DataSource {
 public:
  explicit FixedRows(std::vector<std::vector<int32_t>> rows) : rows_(std::move(rows)) {}
  void read_sample(int64_t k, int64_t S, int32_t* inputs, int32_t* labels) const override {
    const std::vector<int32_t>& row = rows_[k % int64_t(rows_.size())];
    for (int64_t i = 0; i < S; ++i) inputs[i] = row[i], labels[i] = row[i + 1];
  }
  std::string describe(int64_t) const override { return "fixture rows"; }

 private:
  std::vector<std::vector<int32_t>> rows_;
};

// The reference's training: AdamW(lr 1e-2, betas (0.9, 0.95), eps 1e-8, weight decay 0.1),
// clipping at 1, one micro batch of B rows a step.
inline train::TrainConfig fixture_config(int64_t B, int sp = 1, const std::string& policy = "none") {
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", B}, {"gradient_accumulation_steps", 1},
                      {"gradient_clipping", 1.0},
                      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}, {"betas", {0.9, 0.95}}, {"eps", 1e-8},
                                                                   {"weight_decay", 0.1}}}}},
                      {"sequence_parallel_size", sp},
                      {"compile", {{"deepcompile", true}, {"passes", {"autosp"}}, {"checkpoint", policy}}},
                      {"zero_optimization", {{"stage", 0}}}};
  train::TrainConfig config = train::parse_train_config(j, "torch import test", nullptr);
  train::resolve_batch(config, 1, "torch import test");
  return config;
}

}  // namespace autosp::testing
