// Token files: sample layout, wrap-around, and the errors a bad data file gives.
#include "io/tokens.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include "util/error.h"
#include "testing/errors.h"

namespace {

namespace fs = std::filesystem;
using autosp::UserError;
using autosp::io::DataFingerprint;
using autosp::io::TokenFile;
using autosp::io::write_tokens;

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "autosp_tokens_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << tmpl << ": " << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string file(const std::string& name) const { return dir_ + "/" + name; }

  // A file holding tokens 0, 1, ..., n-1.
  std::string iota_file(int n) {
    std::vector<uint32_t> tokens(static_cast<size_t>(n));
    std::iota(tokens.begin(), tokens.end(), 0u);
    std::string path = file("iota.bin");
    autosp::io::write_tokens(path, tokens);
    return path;
  }
  std::string dir_;
};

struct Sample {
  std::vector<int32_t> inputs, labels;
};

Sample read(const TokenFile& f, int64_t k, int64_t S, int32_t vocab = 1000) {
  Sample s{std::vector<int32_t>(S), std::vector<int32_t>(S)};
  f.read_sample(k, S, vocab, s.inputs.data(), s.labels.data());
  return s;
}

std::vector<int32_t> range(int32_t begin, int32_t end) {
  std::vector<int32_t> v(static_cast<size_t>(end - begin));
  std::iota(v.begin(), v.end(), begin);
  return v;
}

using autosp::testing::expect_contains;
using autosp::testing::user_error_of;

TEST_F(TokenFileTest, WritesLittleEndianUint32) {
  std::string path = file("t.bin");
  autosp::io::write_tokens(path, {1, 0x01020304u, 0xffffffffu});
  std::ifstream in(path, std::ios::binary);
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  EXPECT_EQ(bytes, std::string("\x01\0\0\0\x04\x03\x02\x01\xff\xff\xff\xff", 12));
  EXPECT_EQ(TokenFile(path).num_tokens(), 3);
}

TEST_F(TokenFileTest, SampleKIsTokensKSToKSPlusSPlusOne) {
  TokenFile f(iota_file(21));
  EXPECT_EQ(f.num_tokens(), 21);
  EXPECT_EQ(f.num_samples(4), 5);  // (21 - 1) / 4: samples share their boundary token
  for (int32_t k = 0; k < 5; ++k) {
    Sample s = read(f, k, 4);
    EXPECT_EQ(s.inputs, range(4 * k, 4 * k + 4)) << k;
    EXPECT_EQ(s.labels, range(4 * k + 1, 4 * k + 5)) << k;
  }
}

TEST_F(TokenFileTest, WrapsModuloWholeSamples) {
  // 23 tokens, S = 4: 5 whole samples; tokens 21..22 never start a sample.
  TokenFile f(iota_file(23));
  EXPECT_EQ(f.num_samples(4), 5);
  for (int64_t k : {5, 7, 1003}) {
    Sample s = read(f, k, 4);
    int32_t base = static_cast<int32_t>(k % 5) * 4;
    EXPECT_EQ(s.inputs, range(base, base + 4)) << k;
    EXPECT_EQ(s.labels, range(base + 1, base + 5)) << k;
  }
}

TEST_F(TokenFileTest, ExactlyOneSample) {
  TokenFile f(iota_file(5));
  for (int64_t k : {0, 1, 9}) {
    EXPECT_EQ(read(f, k, 4).inputs, range(0, 4));
    EXPECT_EQ(read(f, k, 4).labels, range(1, 5));
  }
}

TEST_F(TokenFileTest, OutOfRangeTokenNamesFileOffsetAndValue) {
  std::vector<uint32_t> tokens(13, 7);
  tokens[6] = 1000;
  tokens[11] = 0xffffffffu;
  std::string path = file("bad.bin");
  autosp::io::write_tokens(path, tokens);
  TokenFile f(path);
  EXPECT_EQ(read(f, 0, 4, 1000).labels, std::vector<int32_t>(4, 7));  // tokens 0..4 are fine
  expect_contains(user_error_of([&] { read(f, 1, 4, 1000); }),
                  {path, "token id 1000", "byte offset 24", "vocab_size 1000"});
  EXPECT_EQ(read(f, 1, 4, 1001).labels[1], 1000);  // the largest valid id is vocab_size - 1
  expect_contains(user_error_of([&] { read(f, 2, 4, 1001); }),
                  {path, "token id 4294967295", "byte offset 44"});
}

TEST_F(TokenFileTest, ValidateFindsTheFirstBadIdAnywhereInTheFile) {
  // Three validation blocks and a part: ids in range but for one, placed past the first
  // block, in the last token, or nowhere. Each is found by one pass, before any sample.
  const int64_t block = autosp::io::kValidationBlockBytes / 4;
  const int64_t n = 3 * block + 123;
  std::vector<uint32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[size_t(i)] = uint32_t(i % 1000);
  for (int64_t bad : {block + 7, n - 1}) {
    SCOPED_TRACE(bad);
    std::vector<uint32_t> with_bad = tokens;
    with_bad[size_t(bad)] = 1000;
    if (bad < n - 1) with_bad[size_t(n - 1)] = 0xffffffffu;  // a later bad id: not the one named
    const std::string path = file("big.bin");
    write_tokens(path, with_bad);
    TokenFile f(path);
    const std::string offset = "byte offset " + std::to_string(bad * 4);
    expect_contains(user_error_of([&] { f.validate(1000); }), {path, "token id 1000 ", offset, "vocab_size 1000"});
  }
  const std::string path = file("good.bin");
  write_tokens(path, tokens);
  TokenFile f(path);
  std::vector<int64_t> seen;
  f.validate(1000, [&](int64_t done, int64_t total) {
    EXPECT_EQ(total, n * 4);
    seen.push_back(done);
  });
  EXPECT_EQ(seen, (std::vector<int64_t>{block * 4, 2 * block * 4, 3 * block * 4, n * 4}));
  expect_contains(user_error_of([&] { f.validate(999); }), {"token id 999", "byte offset 3996", "vocab_size 999"});
}

TEST_F(TokenFileTest, FileShorterThanOneSample) {
  TokenFile f(iota_file(4));
  expect_contains(user_error_of([&] { read(f, 0, 4); }), {f.path(), "4 tokens", "S=4", "5"});
  std::string empty = file("empty.bin");
  autosp::io::write_tokens(empty, {});
  TokenFile e(empty);
  EXPECT_EQ(e.num_tokens(), 0);
  EXPECT_EQ(e.num_samples(4), 0);
  expect_contains(user_error_of([&] { read(e, 0, 4); }), {empty, "0 tokens", "S=4"});
}

TEST_F(TokenFileTest, SizeNotMultipleOf4) {
  std::string path = file("odd.bin");
  std::ofstream(path, std::ios::binary) << "0123456789";
  expect_contains(user_error_of([&] { TokenFile f(path); }),
                  {path, "10 bytes", "not a multiple of 4"});
}

TEST_F(TokenFileTest, MissingFileAndDirectory) {
  std::string path = file("missing.bin");
  expect_contains(user_error_of([&] { TokenFile f(path); }),
                  {path, "cannot open", "No such file or directory"});
  expect_contains(user_error_of([&] { TokenFile f(dir_); }), {dir_, "not a regular file"});
}

TEST_F(TokenFileTest, MovedFileStillReads) {
  TokenFile a(iota_file(9));
  TokenFile b(std::move(a));
  EXPECT_EQ(read(b, 1, 4).inputs, range(4, 8));
  TokenFile c(iota_file(5));
  c = std::move(b);
  EXPECT_EQ(read(c, 1, 4).labels, range(5, 9));
}

TEST(TokenFileSampleIndex, Formula) {
  // consumed + (micro * dp_size + dp_rank) * micro_batch + row
  EXPECT_EQ(TokenFile::sample_index(0, 0, 0, 1, 0, 1), 0);
  EXPECT_EQ(TokenFile::sample_index(100, 1, 1, 4, 2, 8), 100 + (1 * 4 + 1) * 8 + 2);
}

TEST(TokenFileSampleIndex, CoversConsecutiveSamplesOnce) {
  // Every (step, micro, rank, row) reads a different sample, and together the first
  // `steps` steps read exactly samples 0 .. steps * accum * dp * mb - 1.
  const int64_t steps = 3, accum = 2, dp = 3, mb = 4;
  std::set<int64_t> seen;
  for (int64_t step = 0; step < steps; ++step)
    for (int64_t micro = 0; micro < accum; ++micro)
      for (int64_t rank = 0; rank < dp; ++rank)
        for (int64_t row = 0; row < mb; ++row)
          EXPECT_TRUE(seen.insert(TokenFile::sample_index(step * accum * dp * mb, micro, rank, dp, row, mb)).second);
  EXPECT_EQ(static_cast<int64_t>(seen.size()), steps * accum * dp * mb);
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), steps * accum * dp * mb - 1);
}

TEST(TokenFileFingerprint, SeesAChangeInTheFirstOrLastBlockOrTheSize) {
  std::vector<uint32_t> tokens(3 * TokenFile::kFingerprintBlock / 4);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i % 1000);
  const std::string dir = ::testing::TempDir();
  auto fingerprint = [&](const std::vector<uint32_t>& t) {
    write_tokens(dir + "/fingerprint.bin", t);
    return TokenFile(dir + "/fingerprint.bin").fingerprint();
  };
  const DataFingerprint base = fingerprint(tokens);
  EXPECT_EQ(base.bytes, int64_t(tokens.size() * 4));
  EXPECT_EQ(fingerprint(tokens), base);  // deterministic
  for (size_t at : {size_t{0}, tokens.size() - 1}) {
    auto changed = tokens;
    changed[at] += 1;
    EXPECT_NE(fingerprint(changed).hash, base.hash) << "token " << at;
  }
  auto longer = tokens;
  longer.push_back(7);
  EXPECT_NE(fingerprint(longer), base);
  // The middle block is not read: the fingerprint is a cheap identity, not a checksum.
  auto middle = tokens;
  middle[tokens.size() / 2] += 1;
  EXPECT_EQ(fingerprint(middle), base);
}

}  // namespace
