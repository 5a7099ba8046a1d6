// The transformers peer the tests load autosp's checkpoints with: the venv of
// scripts/install_hf_venv.sh (transformers 4.46 over Debian's torch 1.13), which `make test`
// installs first, and tests/reference/hf_load_checkpoint.py run by its python.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing/process.h"
#include "util/error.h"

namespace autosp::testing {

// The venv's python: a missing one fails the test, saying how to install it.
inline std::string hf_python() {
  const char* venv = std::getenv("AUTOSP_HF_VENV");
  const char* cache = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string dir = venv ? venv : str(cache ? cache : str(home ? home : "", "/.cache"), "/autosp/hf-venv");
  const std::string python = dir + "/bin/python";
  EXPECT_TRUE(std::filesystem::exists(python))
      << python << " is missing: run scripts/install_hf_venv.sh (make test runs it)";
  return python;
}

// transformers' from_pretrained on `dir`, with the loss of `tokens` (tests/reference/hf_load_checkpoint.py):
// its JSON line (missing, unexpected and mismatched keys, the config read, the float64 loss).
inline nlohmann::json transformers_load(const std::string& dir, const std::vector<int32_t>& tokens) {
  std::string ids;
  for (int32_t t : tokens) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const auto r = run_command(
      str(hf_python(), " ", source_path("tests/reference/hf_load_checkpoint.py"), " ", dir, " ", ids, " 2>/dev/null"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const size_t line = r.output.rfind("{\"missing_keys\"");
  if (line == std::string::npos) {
    ADD_FAILURE() << r.output;
    return nlohmann::json::object();
  }
  return nlohmann::json::parse(r.output.substr(line, r.output.find('\n', line) - line));
}

}  // namespace autosp::testing
