// The torch.export frontend (frontend/torch_import.h) on programs PyTorch itself wrote:
// tests/fixtures/torch_export (transformers' Llama, GPT-2, Phi3 and Gemma3, exported with
// python/autosp/export.py by tests/fixtures/make_torch_export_fixtures.py, with PyTorch's float64
// losses and gradients) and tests/fixtures/torch_export_errors (programs autosp must refuse).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "frontend/torch_import.h"
#include "io/safetensors.h"
#include "testing/compare.h"
#include "testing/errors.h"
#include "testing/process.h"
#include "train/config.h"
#include "train/trainer.h"

namespace autosp {
namespace {

using testing::normalised_error;

std::string fixture(const std::string& name) { return testing::source_path("tests/fixtures/torch_export/" + name); }

std::string import_error(const std::string& path) {
  try {
    TorchProgram p = TorchProgram::load(path);
    p.forward({.batch = 2, .seq_len = 8});
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(TorchImportErrors, AnUnsupportedOpIsNamedWithItsNodeAndTheModelsSourceLine) {
  const std::string path = testing::source_path("tests/fixtures/torch_export_errors/softplus/model.pt2");
  const std::string e = import_error(path);
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("node 'softplus'"), std::string::npos) << e;
  EXPECT_NE(e.find("torch.ops.aten.softplus.default"), std::string::npos) << e;
  EXPECT_NE(e.find("make_torch_export_errors.py"), std::string::npos) << e;  // the model's line
  EXPECT_NE(e.find("F.softplus(self.embed(input_ids))"), std::string::npos) << e;
}

TEST(TorchImportErrors, AnAttentionMaskTensorIsRefusedWithWhatToDoInstead) {
  const std::string e = import_error(testing::source_path("tests/fixtures/torch_export_errors/masked/model.pt2"));
  EXPECT_NE(e.find("scaled_dot_product_attention"), std::string::npos) << e;
  EXPECT_NE(e.find("python/autosp/export.py"), std::string::npos) << e;
}

TEST(TorchImportErrors, NotAnArchiveOrATruncatedOneIsAUserError) {
  const testing::TempDir tmp("torch_import");
  const std::string dir = tmp.path();
  const std::string text = dir + "/text.pt2";
  std::ofstream(text) << "not a zip archive";
  EXPECT_NE(import_error(text).find("not a readable zip archive"), std::string::npos) << import_error(text);
  // The first half of a real program.
  const std::string src = testing::source_path("tests/fixtures/torch_export_errors/softplus/model.pt2");
  std::ifstream in(src, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string cut = dir + "/cut.pt2";
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  EXPECT_NE(import_error(cut).find(cut), std::string::npos) << import_error(cut);
  EXPECT_NE(import_error(dir + "/missing.pt2").find("missing.pt2"), std::string::npos);
}

}  // namespace
}  // namespace autosp
