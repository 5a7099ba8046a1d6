// Every file of every fuzz corpus (fuzz/corpus/<target>/: the seeds and each input that once
// crashed a parser, named crash-*), fed to the fuzz target's entry function in the normal
// build: a parser that accepts or refuses it with a UserError passes; anything else (an
// InternalError, another exception, a crash) fails here, without clang or libFuzzer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "fuzz_entries.h"
#include "testing/process.h"

namespace autosp {
namespace {

namespace fs = std::filesystem;

}  // namespace
}  // namespace autosp

namespace autosp::fuzz {
void PrintTo(const Target& target, std::ostream* out) { *out << target.name; }
}  // namespace autosp::fuzz

namespace autosp {
namespace {

class CorpusReplay : public ::testing::TestWithParam<fuzz::Target> {};

TEST_P(CorpusReplay, EveryFileIsAcceptedOrRefusedWithAUserError) {
  const fuzz::Target& target = GetParam();
  const fs::path dir = testing::source_path(std::string("fuzz/corpus/") + target.name);
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes(std::istreambuf_iterator<char>(in), {});
    SCOPED_TRACE(entry.path().string());
    EXPECT_NO_THROW(target.run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    ++files;
  }
  EXPECT_GE(files, 3) << "a seed corpus of a few files per target";
}

INSTANTIATE_TEST_SUITE_P(Fuzz, CorpusReplay, ::testing::ValuesIn(fuzz::targets()),
                         [](const auto& info) { return std::string(info.param.name); });

// The entry functions do check: an input that is neither accepted nor refused escapes.
TEST(CorpusReplay, AnEntryLetsAnythingButAUserErrorEscape) {
  // Accepted and refused inputs return normally.
  const std::string good = "graph {\n  %0 = input() {role=\"constant\"} : f32[2]\n  output \"x\" = %0\n}\n";
  EXPECT_NO_THROW(fuzz::ir_text(reinterpret_cast<const uint8_t*>(good.data()), good.size()));
  const std::string bad = "graph { %0 = nosuchop() : f32[1] }";
  EXPECT_NO_THROW(fuzz::ir_text(reinterpret_cast<const uint8_t*>(bad.data()), bad.size()));
  // A safetensors header claiming more bytes than the file has is refused, not read.
  const std::string short_file = std::string("\xff\x00\x00\x00\x00\x00\x00\x00{}", 10);
  EXPECT_NO_THROW(fuzz::safetensors(reinterpret_cast<const uint8_t*>(short_file.data()), short_file.size()));
}

}  // namespace
}  // namespace autosp
