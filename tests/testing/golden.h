// Golden text files under tests/golden/. AUTOSP_UPDATE_GOLDEN=1 rewrites them (then read
// the diff before committing it: the golden file is the reviewed expectation).
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace autosp::testing {

inline void expect_golden(const std::string& actual, const std::string& file) {
  const std::string path = std::string(AUTOSP_SOURCE_DIR) + "/tests/golden/" + file;
  if (const char* update = std::getenv("AUTOSP_UPDATE_GOLDEN"); update && std::string(update) == "1") {
    std::ofstream(path) << actual;
    return;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "missing golden file " << path
                         << " (run with AUTOSP_UPDATE_GOLDEN=1 to create it, then review it)";
  std::stringstream expected;
  expected << in.rdbuf();
  EXPECT_EQ(actual, expected.str()) << "golden file " << path
                                    << " differs (AUTOSP_UPDATE_GOLDEN=1 rewrites it)";
}

}  // namespace autosp::testing
