// Running real processes (the CLI, the PyTorch reference) from tests, and temp dirs.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace autosp::testing {

struct ProcessResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs `command` with /bin/sh; stderr is merged into the captured output.
inline ProcessResult run_command(const std::string& command) {
  ProcessResult r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) {
    r.output = "popen failed";
    return r;
  }
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// A fresh directory under the test temp dir, removed when the object dies.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    std::string pattern = ::testing::TempDir() + "autosp_" + tag + "_XXXXXX";
    path_ = mkdtemp(pattern.data()) ? pattern : "";
    EXPECT_FALSE(path_.empty()) << "mkdtemp failed for " << pattern;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string source_path(const std::string& relative) {
  return std::string(AUTOSP_SOURCE_DIR) + "/" + relative;
}

}  // namespace autosp::testing
