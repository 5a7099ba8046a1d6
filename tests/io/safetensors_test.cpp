// safetensors reading and writing, and the atomic write under it. Files are hand-built
// byte by byte (no Python safetensors offline), so each test states exactly what is on
// disk; every malformed-file case asserts that the message names the file and the fault.
#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <csignal>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>

#include "util/atomic_file.h"
#include "util/error.h"

namespace {

namespace fs = std::filesystem;
using autosp::UserError;
using autosp::io::HostTensor;

// A fresh directory per test, removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "autosp_io_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << tmpl << ": " << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }
  std::string file(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir_;
};

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i) & 0xff);
  return s;
}

std::string u16_bytes(std::initializer_list<uint16_t> values) {
  std::string s;
  for (uint16_t v : values) s += {static_cast<char>(v & 0xff), static_cast<char>(v >> 8)};
  return s;
}

std::string f32_bytes(std::initializer_list<float> values) {
  std::string s;
  for (float v : values) s.append(reinterpret_cast<const char*>(&v), 4);
  return s;
}

// A safetensors file: length, header, buffer.
std::string st_bytes(const std::string& header, const std::string& buffer) {
  return le64(header.size()) + header + buffer;
}

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  ASSERT_TRUE(out) << path;
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out) << path;
}

std::string read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The UserError message read_safetensors throws for `path`, or a failure if none.
std::string read_error(const std::string& path) {
  try {
    autosp::io::read_safetensors(path);
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << path << " was read without error";
  return "";
}

bool same_bits(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

using SafetensorsTest = TempDirTest;

TEST_F(SafetensorsTest, RoundTripF32) {
  HostTensor w{{2, 3}, {1.5f, -2.f, 0.f, -0.f, 1e-40f, std::numeric_limits<float>::infinity()}};
  HostTensor scalar{{}, {42.f}};
  HostTensor empty{{0, 4}, {}};
  HostTensor cube{{2, 1, 2}, {std::nanf("7"), 3.f, 4.f, 5.f}};
  std::string path = file("model.safetensors");
  autosp::io::write_safetensors(
      path, {{"w", &w}, {"scalar", &scalar}, {"empty", &empty}, {"z.cube", &cube}},
      {{"format", "pt"}});

  std::map<std::string, std::string> metadata;
  auto tensors = autosp::io::read_safetensors(path, &metadata);
  EXPECT_EQ(metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(tensors.size(), 4u);
  for (const auto& [name, want] : std::map<std::string, const HostTensor*>{
           {"w", &w}, {"scalar", &scalar}, {"empty", &empty}, {"z.cube", &cube}}) {
    const HostTensor& got = tensors.at(name);
    EXPECT_EQ(got.shape, want->shape) << name;
    ASSERT_EQ(got.data.size(), want->data.size()) << name;
    for (size_t i = 0; i < got.data.size(); ++i)
      EXPECT_TRUE(same_bits(got.data[i], want->data[i])) << name << "[" << i << "]";
  }
}

TEST_F(SafetensorsTest, WriterLayoutIsHuggingFaceStandard) {
  // Data in the given order, header padded with spaces to a multiple of 8 (here 55 -> 56).
  HostTensor b{{2}, {1.f, 2.f}};
  HostTensor a{{1}, {3.f}};
  std::string path = file("two.safetensors");
  autosp::io::write_safetensors(path, {{"b", &b}, {"a", &a}});
  std::string header =
      R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  EXPECT_EQ(read_raw(path), st_bytes(header, f32_bytes({1.f, 2.f, 3.f})));
}

TEST_F(SafetensorsTest, WriterHeaderIsPaddedAndParses) {
  for (int name_len = 1; name_len <= 9; ++name_len) {
    HostTensor t{{1}, {1.f}};
    std::string path = file("pad.safetensors");
    autosp::io::write_safetensors(path, {{std::string(name_len, 'x'), &t}}, {{"k", "v"}});
    std::string bytes = read_raw(path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[i]);
    EXPECT_EQ(n % 8, 0u) << name_len;
    ASSERT_EQ(bytes.size(), 8 + n + 4);
    EXPECT_EQ(bytes[8], '{');
    auto header = nlohmann::json::parse(bytes.substr(8, n));
    EXPECT_EQ(header["__metadata__"]["k"], "v");
    EXPECT_EQ(autosp::io::read_safetensors(path).at(std::string(name_len, 'x')).data[0], 1.f);
  }
}

TEST_F(SafetensorsTest, ReadsBF16) {
  // bf16 is the top half of an fp32: 0x3f80 = 1, 0xc020 = -2.5, 0x0001 = 2^-133 (subnormal).
  std::string path = file("bf16.safetensors");
  write_raw(path, st_bytes(R"({"t":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]}})",
                           u16_bytes({0x3f80, 0xc020, 0x0001, 0x7f80, 0xff80, 0x7fc0})));
  auto tensors = autosp::io::read_safetensors(path);
  const HostTensor& t = tensors.at("t");
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(t.data.size(), 6u);
  EXPECT_EQ(t.data[0], 1.f);
  EXPECT_EQ(t.data[1], -2.5f);
  EXPECT_EQ(t.data[2], std::ldexp(1.f, -133));
  EXPECT_EQ(t.data[3], std::numeric_limits<float>::infinity());
  EXPECT_EQ(t.data[4], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(t.data[5]));
}

TEST_F(SafetensorsTest, ReadsF16IncludingSubnormalsAndInf) {
  std::string path = file("f16.safetensors");
  write_raw(path, st_bytes(R"({"h":{"dtype":"F16","shape":[10],"data_offsets":[0,20]}})",
                           u16_bytes({0x3c00, 0xc000, 0x7bff, 0x0001, 0x03ff, 0x0400, 0x7c00,
                                      0xfc00, 0x7e00, 0x8000})));
  const HostTensor t = autosp::io::read_safetensors(path).at("h");
  ASSERT_EQ(t.data.size(), 10u);
  EXPECT_EQ(t.data[0], 1.f);
  EXPECT_EQ(t.data[1], -2.f);
  EXPECT_EQ(t.data[2], 65504.f);                      // largest finite f16
  EXPECT_EQ(t.data[3], std::ldexp(1.f, -24));         // smallest subnormal
  EXPECT_EQ(t.data[4], 1023 * std::ldexp(1.f, -24));  // largest subnormal
  EXPECT_EQ(t.data[5], std::ldexp(1.f, -14));         // smallest normal
  EXPECT_EQ(t.data[6], std::numeric_limits<float>::infinity());
  EXPECT_EQ(t.data[7], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(t.data[8]));
  EXPECT_TRUE(t.data[9] == 0.f && std::signbit(t.data[9]));
}

// The writer a sharded checkpoint uses: pieces in any order, each at its place; the file
// equals what write_safetensors writes at once, byte for byte.
TEST_F(SafetensorsTest, PiecewiseWriterInAnyOrderEqualsTheWholeWriter) {
  HostTensor a{{3, 4}, {}}, b{{5}, {}}, empty{{0}, {}};
  for (int i = 0; i < 12; ++i) a.data.push_back(0.5f * float(i) - 2.f);
  for (int i = 0; i < 5; ++i) b.data.push_back(float(100 + i));
  const std::string whole = file("whole.safetensors"), pieces = file("pieces.safetensors");
  autosp::io::write_safetensors(whole, {{"a", &a}, {"empty", &empty}, {"b", &b}}, {{"step", "3"}});
  {
    autosp::io::SafetensorsWriter w(pieces, {{"a", a.shape}, {"empty", empty.shape}, {"b", b.shape}}, {{"step", "3"}});
    w.write(2, 3, b.data.data() + 3, 2);
    w.write(0, 7, a.data.data() + 7, 5);
    w.write(2, 0, b.data.data(), 3);
    w.write(0, 0, a.data.data(), 7);
    EXPECT_EQ(w.file_bytes(), fs::file_size(whole));
    EXPECT_FALSE(fs::exists(pieces)) << "visible before commit";
    w.commit();
  }
  std::ifstream x(whole, std::ios::binary), y(pieces, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(x), {}), std::string(std::istreambuf_iterator<char>(y), {}));
  {  // Not committed (an error on the way): nothing appears, no temporary stays.
    autosp::io::SafetensorsWriter w(file("abandoned.safetensors"), {{"a", a.shape}});
    w.write(0, 0, a.data.data(), 12);
  }
  EXPECT_FALSE(fs::exists(file("abandoned.safetensors")));
  for (const auto& e : fs::directory_iterator(dir_)) EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos);
}

// What a loading rank does: validate the header, then read only its element ranges, of
// F32 and of 16-bit tensors.
TEST_F(SafetensorsTest, ReaderReadsElementRangesAfterValidatingTheHeader) {
  std::string path = file("mixed.safetensors");
  std::string f32(16, '\0');
  const float fv[4] = {1.f, -2.f, 3.5f, 8.f};
  std::memcpy(f32.data(), fv, 16);
  write_raw(path, st_bytes(R"({"f":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                           R"("h":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]}})",
                           f32 + u16_bytes({0x3f80, 0xc020, 0x4000})));
  const autosp::io::SafetensorsReader r(path);
  EXPECT_EQ(r.names(), (std::vector<std::string>{"f", "h"}));
  float out[3] = {0, 0, 0};
  r.read("f", 1, 2, out);
  EXPECT_EQ(out[0], -2.f);
  EXPECT_EQ(out[1], 3.5f);
  r.read("h", 1, 2, out);
  EXPECT_EQ(out[0], -2.5f);
  EXPECT_EQ(out[1], 2.f);
  r.expect("f", {2, 2});
  auto message = [&](const std::string& name, const std::vector<int64_t>& shape) {
    try {
      r.expect(name, shape);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("f", {4}), path + ": tensor 'f' has shape [2, 2], expected [4]");
  EXPECT_EQ(message("g", {1}), path + ": missing tensor 'g'");
  // A damaged header is refused when the file is opened, before anything is read.
  write_raw(file("bad.safetensors"), st_bytes(R"({"f":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})",
                                              std::string(12, '\0')));
  try {
    autosp::io::SafetensorsReader bad(file("bad.safetensors"));
    ADD_FAILURE() << "opened";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'f': data_offsets [0,12] span 12 bytes"), std::string::npos) << e.what();
  }
}

TEST(SafetensorsConvert, F16MatchesDefinitionForEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    int sign = h >> 15 ? -1 : 1;
    int exp = (h >> 10) & 0x1f;
    int mant = h & 0x3ff;
    float got = autosp::io::f16_to_float(static_cast<uint16_t>(h));
    if (exp == 31) {
      if (mant == 0) EXPECT_EQ(got, sign * std::numeric_limits<float>::infinity()) << h;
      else EXPECT_TRUE(std::isnan(got)) << h;
      continue;
    }
    double want = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
    EXPECT_EQ(got, static_cast<float>(sign * want)) << std::hex << h;
    EXPECT_EQ(std::signbit(got), sign < 0) << std::hex << h;
  }
}

TEST(SafetensorsConvert, BF16IsTopHalfOfF32) {
  for (uint32_t h = 0; h < 0x10000; h += 7)
    EXPECT_EQ(std::bit_cast<uint32_t>(autosp::io::bf16_to_float(static_cast<uint16_t>(h))),
              h << 16);
}

TEST_F(SafetensorsTest, ReadsMixedDtypesInAnyHeaderOrder) {
  // Header order differs from buffer order; offsets decide where data lives.
  std::string path = file("mixed.safetensors");
  write_raw(path, st_bytes(R"({"__metadata__":{"a":"b"},)"
                           R"("c":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                           R"("a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
                           R"("b":{"dtype":"BF16","shape":[1,1],"data_offsets":[8,10]}})",
                           u16_bytes({0x3c00, 0x4000}) + f32_bytes({7.f}) + u16_bytes({0x4040})));
  auto tensors = autosp::io::read_safetensors(path);
  EXPECT_EQ(tensors.at("a").data, (std::vector<float>{1.f, 2.f}));
  EXPECT_EQ(tensors.at("b").data, (std::vector<float>{3.f}));
  EXPECT_EQ(tensors.at("b").shape, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(tensors.at("c").data, (std::vector<float>{7.f}));
}

TEST_F(SafetensorsTest, EmptyHeaderIsAnEmptyFile) {
  std::string path = file("empty.safetensors");
  write_raw(path, st_bytes("{}      ", ""));
  EXPECT_TRUE(autosp::io::read_safetensors(path).empty());
}

struct BadHeader {
  const char* what;
  std::string header;
  std::string buffer;
  std::vector<std::string> message_parts;
};

TEST_F(SafetensorsTest, RejectsEveryMalformedHeaderNamingFileAndFault) {
  const std::string f32x2 = f32_bytes({1.f, 2.f});
  auto one = [](const std::string& body) { return R"({"w":)" + body + "}"; };
  const std::vector<BadHeader> cases = {
      {"not json", R"({"w": )", f32x2, {"not valid JSON"}},
      {"not utf-8", "{\"w\xff\":{}}", "", {"not valid JSON"}},
      {"not an object", "[1, 2]", "", {"does not start with '{'"}},
      {"entry not object", one("3"), "", {"tensor 'w'", "not a JSON object"}},
      {"no dtype", one(R"({"shape":[2],"data_offsets":[0,8]})"), f32x2,
       {"tensor 'w'", "no \"dtype\""}},
      {"no shape", one(R"({"dtype":"F32","data_offsets":[0,8]})"), f32x2,
       {"tensor 'w'", "no \"shape\""}},
      {"no offsets", one(R"({"dtype":"F32","shape":[2]})"), f32x2,
       {"tensor 'w'", "no \"data_offsets\""}},
      {"dtype not string", one(R"({"dtype":4,"shape":[2],"data_offsets":[0,8]})"), f32x2,
       {"tensor 'w'", "\"dtype\" is not a string"}},
      {"unsupported dtype", one(R"({"dtype":"I64","shape":[1],"data_offsets":[0,8]})"), f32x2,
       {"tensor 'w'", "dtype \"I64\"", "only F32, BF16 and F16"}},
      {"shape not array", one(R"({"dtype":"F32","shape":2,"data_offsets":[0,8]})"), f32x2,
       {"tensor 'w'", "\"shape\" is not an array"}},
      {"negative dim", one(R"({"dtype":"F32","shape":[-1,2],"data_offsets":[0,8]})"), f32x2,
       {"tensor 'w'", "[-1,2]", "not a non-negative"}},
      {"float dim", one(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})"), f32x2,
       {"tensor 'w'", "not a non-negative"}},
      {"dim beyond int64",
       one(R"({"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,8]})"), f32x2,
       {"tensor 'w'", "not a non-negative 64-bit"}},
      {"element count overflow",
       one(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]})"), f32x2,
       {"tensor 'w'", "more elements than fit in 64 bits"}},
      {"byte count overflow",
       one(R"({"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8]})"), f32x2,
       {"tensor 'w'", "more bytes than fit in 64 bits"}},
      {"offsets not pair", one(R"({"dtype":"F32","shape":[2],"data_offsets":[8]})"), f32x2,
       {"tensor 'w'", "not [begin, end]"}},
      {"offsets negative", one(R"({"dtype":"F32","shape":[2],"data_offsets":[-8,0]})"), f32x2,
       {"tensor 'w'", "not [begin, end]"}},
      {"begin after end", one(R"({"dtype":"F32","shape":[2],"data_offsets":[8,0]})"), f32x2,
       {"tensor 'w'", "[8,0]", "begin after end"}},
      {"end beyond buffer", one(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})"), f32x2,
       {"tensor 'w'", "[0,16]", "beyond the 8-byte data buffer"}},
      {"size mismatch", one(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,8]})"), f32x2,
       {"tensor 'w'", "span 8 bytes", "F32 and shape [2, 3] need 24"}},
      {"bf16 size mismatch", one(R"({"dtype":"BF16","shape":[2],"data_offsets":[0,8]})"), f32x2,
       {"tensor 'w'", "span 8 bytes", "BF16 and shape [2] need 4"}},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       f32_bytes({1, 2, 3}), {"tensor 'b'", "overlaps tensor 'a'"}},
      {"gap",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
       f32_bytes({1, 2, 3}), {"tensor 'b'", "gap of bytes [4, 8)"}},
      {"leading gap", one(R"({"dtype":"F32","shape":[1],"data_offsets":[4,8]})"), f32x2,
       {"tensor 'w'", "gap of bytes [0, 4)"}},
      {"trailing bytes", one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})"), f32x2,
       {"buffer is 8 bytes", "cover only 4", "after tensor 'w'"}},
      {"duplicate name",
       R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       f32x2, {"tensor 'w' appears twice"}},
      {"deep nesting", one(std::string(100000, '[') + std::string(100000, ']')), "",
       {"more than 8 deep"}},
      {"metadata not object", R"({"__metadata__":[1]})", "",
       {"\"__metadata__\" is not a JSON object"}},
      {"metadata value not string", R"({"__metadata__":{"step":3}})", "",
       {"\"__metadata__\" key 'step' is not a string"}},
  };
  for (const BadHeader& c : cases) {
    SCOPED_TRACE(c.what);
    std::string path = file("bad.safetensors");
    write_raw(path, st_bytes(c.header, c.buffer));
    std::string message = read_error(path);
    EXPECT_NE(message.find(path), std::string::npos) << message;
    for (const std::string& part : c.message_parts)
      EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
}

TEST_F(SafetensorsTest, RejectsBadHeaderLengths) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  const std::string buffer = f32_bytes({1.f});
  const struct {
    uint64_t length;
    std::string expected;
  } cases[] = {
      {0, "header length 0 is too small"},
      {1, "header length 1 is too small"},
      {header.size() + 5, "exceeds the 58 bytes after the length field"},
      {100'000'001, "exceeds the limit of 100000000 bytes"},
      {~uint64_t{0}, "exceeds the limit"},
  };
  ASSERT_EQ(header.size() + buffer.size(), 58u);
  for (const auto& c : cases) {
    std::string path = file("len.safetensors");
    write_raw(path, le64(c.length) + header + buffer);
    std::string message = read_error(path);
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.length << ": " << message;
  }
}

TEST_F(SafetensorsTest, TruncatedFileAtEveryLengthIsAUserError) {
  // Covers lengths 0, 4 and 8, mid-header and mid-buffer: none may crash or read past
  // the end (this test runs under AddressSanitizer), and each names the file.
  HostTensor a{{3}, {1.f, 2.f, 3.f}};
  HostTensor b{{2, 2}, {4.f, 5.f, 6.f, 7.f}};
  std::string good = file("good.safetensors");
  autosp::io::write_safetensors(good, {{"a", &a}, {"b", &b}});
  const std::string bytes = read_raw(good);
  ASSERT_EQ(autosp::io::read_safetensors(good).size(), 2u);
  std::string path = file("cut.safetensors");
  for (size_t n = 0; n < bytes.size(); ++n) {
    write_raw(path, bytes.substr(0, n));
    std::string message = read_error(path);
    EXPECT_NE(message.find(path), std::string::npos) << n << ": " << message;
  }
}

TEST_F(SafetensorsTest, RandomCorruptionNeverCrashes) {
  // Flipped header bytes must give a clean read or a UserError, nothing else.
  HostTensor a{{3}, {1.f, 2.f, 3.f}};
  HostTensor b{{2, 2}, {4.f, 5.f, 6.f, 7.f}};
  std::string good = file("good.safetensors");
  autosp::io::write_safetensors(good, {{"a", &a}, {"b", &b}}, {{"k", "v"}});
  const std::string bytes = read_raw(good);
  std::mt19937 rng(1234);
  std::string path = file("fuzz.safetensors");
  for (int trial = 0; trial < 600; ++trial) {
    std::string mutated = bytes;
    for (int flips = 1 + trial % 3; flips > 0; --flips) {
      size_t at = rng() % (trial % 5 == 0 ? mutated.size() : std::min<size_t>(mutated.size(), 120));
      mutated[at] = static_cast<char>(trial % 2 ? rng() : "0123456789-[]{},:\"e."[rng() % 20]);
    }
    write_raw(path, mutated);
    try {
      autosp::io::read_safetensors(path);
    } catch (const UserError&) {
    }
  }
}

TEST_F(SafetensorsTest, MissingFileAndDirectoryAreUserErrors) {
  std::string missing = file("nope.safetensors");
  std::string message = read_error(missing);
  EXPECT_NE(message.find(missing + ": cannot open"), std::string::npos) << message;
  EXPECT_NE(message.find("No such file"), std::string::npos) << message;
  message = read_error(dir_);
  EXPECT_NE(message.find(dir_ + ": not a regular file"), std::string::npos) << message;
}

TEST(SafetensorsExpect, ChecksNameAndShape) {
  std::map<std::string, HostTensor> tensors;
  tensors["w"] = HostTensor{{2, 3}, std::vector<float>(6, 1.f)};
  EXPECT_EQ(&autosp::io::expect_tensor(tensors, "w", {2, 3}, "m.safetensors"), &tensors["w"]);
  try {
    autosp::io::expect_tensor(tensors, "w", {3, 2}, "m.safetensors");
    ADD_FAILURE() << "wrong shape accepted";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "m.safetensors: tensor 'w' has shape [2, 3], expected [3, 2]");
  }
  try {
    autosp::io::expect_tensor(tensors, "v", {1}, "m.safetensors");
    ADD_FAILURE() << "missing tensor accepted";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "m.safetensors: missing tensor 'v'");
  }
}

using SafetensorsAtomicWriteTest = TempDirTest;

// Names in dir_ other than `keep`: leftover temporaries would show up here.
std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

TEST_F(SafetensorsAtomicWriteTest, ReplacesContents) {
  std::string path = file("f.bin");
  autosp::write_file_atomic(path, "old contents");
  autosp::write_file_atomic(path, "new");
  EXPECT_EQ(read_raw(path), "new");
  EXPECT_EQ(entries(dir_), std::vector<std::string>{"f.bin"});
}

TEST_F(SafetensorsAtomicWriteTest, FailingProducerLeavesOldFileAndNoTemporary) {
  std::string path = file("f.bin");
  autosp::write_file_atomic(path, "old contents");
  EXPECT_THROW(autosp::write_file_atomic_streaming(path,
                                                   [](const autosp::ByteSink& sink) {
                                                     sink("half of the new");
                                                     throw std::runtime_error("disk on fire");
                                                   }),
               std::runtime_error);
  EXPECT_EQ(read_raw(path), "old contents");
  EXPECT_EQ(entries(dir_), std::vector<std::string>{"f.bin"});
}

TEST_F(SafetensorsAtomicWriteTest, TargetIsADirectory) {
  std::string path = file("model.safetensors");
  fs::create_directory(path);
  write_raw(path + "/inside", "keep me");
  HostTensor t{{1}, {1.f}};
  try {
    autosp::io::write_safetensors(path, {{"t", &t}});
    ADD_FAILURE() << "wrote over a directory";
  } catch (const UserError& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("cannot write '" + path + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("rename"), std::string::npos) << message;
  }
  EXPECT_EQ(read_raw(path + "/inside"), "keep me");
  EXPECT_EQ(entries(dir_), std::vector<std::string>{"model.safetensors"});
}

TEST_F(SafetensorsAtomicWriteTest, MissingDirectory) {
  std::string path = file("no/such/dir/f.bin");
  try {
    autosp::write_file_atomic(path, "x");
    ADD_FAILURE() << "wrote into a missing directory";
  } catch (const UserError& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("cannot write '" + path + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("No such file or directory"), std::string::npos) << message;
  }
}

// A write that fails part-way (here the file-size limit, EFBIG: the same path as a full
// disk) leaves the old file intact and no temporary behind. It runs in a child process so
// the limit does not touch the test binary; unlike directory permissions it also holds for
// root, which CI runs as.
TEST_F(SafetensorsAtomicWriteTest, WriteFailingPartWayLeavesOldFile) {
  std::string path = file("f.bin");
  autosp::write_file_atomic(path, "old contents");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    try {
      autosp::write_file_atomic(path, std::string(1 << 20, 'x'));
    } catch (const UserError& e) {
      ::_exit(std::string(e.what()).find(path) != std::string::npos ? 0 : 3);
    } catch (...) {
      ::_exit(4);
    }
    ::_exit(5);  // the oversized write succeeded: the limit did not apply
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: message lacks the path, 4: not a UserError, 5: no error";
  EXPECT_EQ(read_raw(path), "old contents");
  EXPECT_EQ(entries(dir_), std::vector<std::string>{"f.bin"});
}

TEST_F(SafetensorsAtomicWriteTest, PathNamingADirectoryIsRefused) {
  EXPECT_THROW(autosp::write_file_atomic(dir_ + "/", "x"), UserError);
  EXPECT_THROW(autosp::write_file_atomic("", "x"), UserError);
}

}  // namespace

// ------------------------------------------------------------------ narrowing to 16 bits
// float_to_f16 against the compiler's own fp32 -> _Float16 conversion (IEEE round to
// nearest even, written independently of ours): every f16 value, every midpoint between
// neighbours and one fp32 ulp either side of it, the overflow edge, and random floats.
TEST(Narrowing, FloatToF16RoundsAsIeeeDoes) {
  using autosp::io::f16_to_float;
  using autosp::io::float_to_f16;
  const auto want = [](float x) { return std::bit_cast<uint16_t>(static_cast<_Float16>(x)); };
  std::vector<float> cases;
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float x = f16_to_float(uint16_t(b));
    if (std::isnan(x)) continue;
    cases.push_back(x);
    if ((b & 0x7fff) < 0x7c00) {  // finite: the midpoint to the next value up in magnitude
      const double next = (b & 0x7fff) == 0x7bff ? 65536.0 : double(std::fabs(f16_to_float(uint16_t((b & 0x7fff) + 1))));
      const float mid = float((std::fabs(double(x)) + next) / 2) * (std::signbit(x) ? -1.f : 1.f);
      cases.insert(cases.end(), {mid, std::nextafter(mid, 0.f), std::nextafter(mid, 2 * mid)});
    }
  }
  std::mt19937 gen(7);
  for (int i = 0; i < 2'000'000; ++i) {
    const float x = std::bit_cast<float>(uint32_t(gen()));
    if (!std::isnan(x)) cases.push_back(x);
  }
  int64_t wrong = 0;
  for (float x : cases)
    if (float_to_f16(x) != want(x) && wrong++ < 5) ADD_FAILURE() << x << ": " << float_to_f16(x) << " vs " << want(x);
  EXPECT_EQ(wrong, 0) << " of " << cases.size();
  // NaN stays NaN (quiet), whatever its payload.
  for (uint32_t bits : {0x7fc00000u, 0x7f800001u, 0xffbfffffu})
    EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(std::bit_cast<float>(bits))))) << std::hex << bits;
}

// float_to_bf16: every bf16 value is kept; a value between two neighbours goes to the
// nearer, a tie to the even one; beyond the largest finite value rounds to inf.
TEST(Narrowing, FloatToBf16RoundsToNearestEven) {
  using autosp::io::bf16_to_float;
  using autosp::io::float_to_bf16;
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float x = bf16_to_float(uint16_t(b));
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(x))));
      continue;
    }
    ASSERT_EQ(float_to_bf16(x), b);
    if ((b & 0x7fff) >= 0x7f80) continue;  // inf: no upper neighbour
    const uint32_t lo = b << 16, tie = lo | 0x8000u;  // the midpoint to the next bf16 up in magnitude
    EXPECT_EQ(float_to_bf16(std::bit_cast<float>(tie - 1)), b);
    EXPECT_EQ(float_to_bf16(std::bit_cast<float>(tie + 1)), b + 1);
    EXPECT_EQ(float_to_bf16(std::bit_cast<float>(tie)), (b & 1) ? b + 1 : b) << std::hex << tie;
  }
}

// 16-bit tensors are written rounded and read back widened: what a bf16 model's weights go
// through in a checkpoint.
TEST_F(SafetensorsTest, WriterStoresBf16AndF16Rounded) {
  const std::vector<float> v = {1.0f, 1.00390625f, 1.001953125f, -3.14159265f, 1e-6f, 70000.f};
  const std::string path = file("narrow.safetensors");
  {
    autosp::io::SafetensorsWriter w(path, {{"b", {6}, autosp::io::FileDType::BF16}, {"h", {6}, autosp::io::FileDType::F16},
                                           {"f", {6}, autosp::io::FileDType::F32}});
    for (size_t t = 0; t < 3; ++t) w.write(t, 0, v.data(), 6);
    EXPECT_EQ(w.data_bytes(), 6u * (2 + 2 + 4));
    w.commit();
  }
  autosp::io::SafetensorsReader r(path);
  EXPECT_EQ(r.dtype("b"), autosp::io::FileDType::BF16);
  EXPECT_EQ(r.dtype("h"), autosp::io::FileDType::F16);
  std::vector<float> b(6), h(6), f(6);
  r.read("b", 0, 6, b.data());
  r.read("h", 0, 6, h.data());
  r.read("f", 0, 6, f.data());
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(b[i], autosp::io::bf16_to_float(autosp::io::float_to_bf16(v[i]))) << i;
    EXPECT_EQ(h[i], autosp::io::f16_to_float(autosp::io::float_to_f16(v[i]))) << i;
    EXPECT_EQ(f[i], v[i]);
  }
  EXPECT_EQ(b[1], 1.0f);  // 1 + 2^-8, a tie: to the even neighbour
  EXPECT_TRUE(std::isinf(h[5]));  // beyond f16's range
}
