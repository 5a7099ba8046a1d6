// Megatron indexed datasets (io/indexed_dataset.h): real .bin/.idx files written by the test
// (and by scripts/make_indexed_dataset.py), read back in every integer dtype, and every
// kind of corruption refused with a UserError naming the file and the field.
#include "io/indexed_dataset.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <numeric>
#include <optional>
#include <thread>

#include "testing/process.h"
#include "util/error.h"
#include "testing/errors.h"

namespace autosp::io {
namespace {

using Documents = std::vector<std::vector<std::vector<int64_t>>>;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

template <typename T>
void put(std::string& bytes, size_t at, T v) {
  ASSERT_LE(at + sizeof v, bytes.size());
  std::memcpy(bytes.data() + at, &v, sizeof v);
}

using autosp::testing::expect_contains;
using autosp::testing::user_error_of;

// Three documents: two sequences, none (empty, as preprocess_data.py writes an empty text),
// and one; 7 tokens.
const Documents kDocuments = {{{1, 2, 3}, {4}}, {}, {{5, 6, 7}}};

class IndexedDatasetTest : public ::testing::Test {
 protected:
  testing::TempDir dir_{"indexed"};
  std::string prefix(const std::string& name = "ds") const { return dir_ / name; }

  // Writes kDocuments as int32 and returns the .idx bytes, to corrupt.
  std::string valid(TokenDType dtype = TokenDType::kInt32) {
    write_indexed_dataset(prefix(), dtype, kDocuments);
    return read_bytes(prefix() + ".idx");
  }
  // Opening `idx` (with the valid .bin) fails; the message.
  std::string refused(const std::string& idx) {
    write_bytes(prefix() + ".idx", idx);
    return user_error_of([&] { IndexedDataset d(prefix()); });
  }
};

// kDocuments: N = 3 sequences, M = 4 document index entries {0, 2, 2, 3}.
constexpr size_t kLengthsAt = 34, kPointersAt = 34 + 4 * 3, kDocumentsAt = 34 + 12 * 3;

TEST_F(IndexedDatasetTest, ReadsEveryIntegerDtype) {
  for (TokenDType dtype : {TokenDType::kUint8, TokenDType::kInt8, TokenDType::kInt16, TokenDType::kInt32,
                           TokenDType::kInt64, TokenDType::kUint16}) {
    SCOPED_TRACE(int(dtype));
    write_indexed_dataset(prefix(), dtype, kDocuments);
    IndexedDataset d(prefix());
    EXPECT_EQ(d.dtype(), dtype);
    EXPECT_EQ(d.num_sequences(), 3);
    EXPECT_EQ(d.num_documents(), 3);
    EXPECT_EQ(d.num_tokens(), 7);
    EXPECT_EQ(d.document_starts(), (std::vector<int64_t>{0, 4, 4, 7}));
    EXPECT_EQ(int64_t(read_bytes(prefix() + ".bin").size()), 7 * d.item_bytes());
    std::vector<int32_t> out(7);
    d.read_tokens(0, 7, 8, out.data());
    EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}));
    std::vector<int32_t> middle(3);
    d.read_tokens(2, 3, 8, middle.data());
    EXPECT_EQ(middle, (std::vector<int32_t>{3, 4, 5}));
  }
}

TEST_F(IndexedDatasetTest, LargeIdsOfEachDtypeAndNegativeIdsAreChecked) {
  // The largest id of each dtype that a vocabulary (at most INT32_MAX ids) has: read exactly.
  const std::pair<TokenDType, int64_t> largest[] = {{TokenDType::kUint8, 255},
                                                    {TokenDType::kInt8, 127},
                                                    {TokenDType::kInt16, 32767},
                                                    {TokenDType::kUint16, 65535},
                                                    {TokenDType::kInt32, INT32_MAX - 1},
                                                    {TokenDType::kInt64, INT32_MAX - 1}};
  for (const auto& [dtype, id] : largest) {
    write_indexed_dataset(prefix(), dtype, {{{id, 0}}});
    IndexedDataset d(prefix());
    std::vector<int32_t> out(2);
    d.read_tokens(0, 2, INT32_MAX, out.data());
    EXPECT_EQ(out[0], id) << int(dtype);
    d.validate(INT32_MAX);
    // One id over the vocabulary: named with its byte offset in the .bin, by a read and by
    // the start-up pass over the whole .bin.
    expect_contains(user_error_of([&] { d.read_tokens(0, 2, static_cast<int32_t>(id), out.data()); }),
                    {prefix() + ".bin", "token id " + std::to_string(id), "byte offset 0", "vocab_size"});
    expect_contains(user_error_of([&] { d.validate(static_cast<int32_t>(id)); }),
                    {prefix() + ".bin", "token id " + std::to_string(id), "byte offset 0", "vocab_size"});
  }
  for (TokenDType dtype : {TokenDType::kInt8, TokenDType::kInt16, TokenDType::kInt32, TokenDType::kInt64}) {
    write_indexed_dataset(prefix(), dtype, {{{0, -3}}});
    IndexedDataset d(prefix());
    std::vector<int32_t> out(2);
    const std::string offset = "byte offset " + std::to_string(d.item_bytes());
    expect_contains(user_error_of([&] { d.read_tokens(0, 2, 100, out.data()); }),
                    {prefix() + ".bin", "token id -3", offset, "out of range"});
    expect_contains(user_error_of([&] { d.validate(100); }), {prefix() + ".bin", "token id -3", offset});
  }
  // int64 ids past int32 are out of range for any vocabulary.
  write_indexed_dataset(prefix(), TokenDType::kInt64, {{{int64_t{1} << 40}}});
  IndexedDataset d(prefix());
  int32_t out;
  expect_contains(user_error_of([&] { d.read_tokens(0, 1, INT32_MAX, &out); }), {"token id 1099511627776"});
}

TEST_F(IndexedDatasetTest, ReadsWhatTheScriptWritesTheSameBytesAsTheBuilder) {
  // scripts/make_indexed_dataset.py from a JSONL: a document of one sequence, one of two
  // sequences (--split-sentences style), an empty one, and {"ids": ...}.
  write_bytes(dir_ / "docs.jsonl", "[1, 2, 3, 4]\n[[5, 6], [7]]\n[]\n{\"ids\": [8, 9]}\n");
  for (const char* dtype : {"uint8", "int8", "int16", "int32", "int64", "uint16"}) {
    SCOPED_TRACE(dtype);
    const std::string script = testing::source_path("scripts/make_indexed_dataset.py");
    const testing::ProcessResult r =
        testing::run_command("/usr/bin/python3 " + script + " --jsonl " + (dir_ / "docs.jsonl") +
                             " --append-eod --eod-id 10 --dtype " + dtype + " --output-prefix " + prefix("py"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    IndexedDataset d(prefix("py"));
    EXPECT_EQ(d.num_documents(), 4);
    EXPECT_EQ(d.num_sequences(), 4);  // the empty document has none
    EXPECT_EQ(d.num_tokens(), 12);
    EXPECT_EQ(d.document_starts(), (std::vector<int64_t>{0, 5, 9, 9, 12}));
    std::vector<int32_t> out(12);
    d.read_tokens(0, 12, 11, out.data());
    EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 3, 4, 10, 5, 6, 7, 10, 8, 9, 10}));
    // The C++ writer (Megatron's IndexedDatasetBuilder layout) gives the same bytes.
    const TokenDType code = std::string(dtype) == "uint8"   ? TokenDType::kUint8
                            : std::string(dtype) == "int8"  ? TokenDType::kInt8
                            : std::string(dtype) == "int16" ? TokenDType::kInt16
                            : std::string(dtype) == "int32" ? TokenDType::kInt32
                            : std::string(dtype) == "int64" ? TokenDType::kInt64
                                                            : TokenDType::kUint16;
    write_indexed_dataset(prefix("cc"), code, {{{1, 2, 3, 4, 10}}, {{5, 6}, {7, 10}}, {}, {{8, 9, 10}}});
    EXPECT_EQ(read_bytes(prefix("py") + ".idx"), read_bytes(prefix("cc") + ".idx"));
    EXPECT_EQ(read_bytes(prefix("py") + ".bin"), read_bytes(prefix("cc") + ".bin"));
  }
  // Text, byte-level: Megatron's dtype choice for a 257-token vocabulary is uint16.
  write_bytes(dir_ / "notes.txt", "hi\n\nok\n");
  const testing::ProcessResult r = testing::run_command(
      "/usr/bin/python3 " + testing::source_path("scripts/make_indexed_dataset.py") + " --text " +
      (dir_ / "notes.txt") + " --append-eod --output-prefix " + prefix("text"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  IndexedDataset d(prefix("text"));
  EXPECT_EQ(d.dtype(), TokenDType::kUint16);
  std::vector<int32_t> out(6);
  d.read_tokens(0, 6, 257, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{'h', 'i', 256, 'o', 'k', 256}));
  EXPECT_EQ(d.document_starts(), (std::vector<int64_t>{0, 3, 6}));
}

// scripts/make_indexed_dataset.py with `args` under /usr/bin/python3 (which has numpy).
testing::ProcessResult run_script(const std::string& args) {
  return testing::run_command("/usr/bin/python3 " + testing::source_path("scripts/make_indexed_dataset.py") + " " +
                              args);
}

// What an indexed dataset holds, document by document, each the concatenation of its sequences.
std::vector<std::vector<int32_t>> documents_of(const std::string& prefix, int32_t vocab) {
  IndexedDataset d(prefix);
  std::vector<int32_t> tokens(d.num_tokens());
  if (!tokens.empty()) d.read_tokens(0, d.num_tokens(), vocab, tokens.data());
  std::vector<std::vector<int32_t>> documents;
  const std::vector<int64_t> starts = d.document_starts();
  for (size_t j = 0; j + 1 < starts.size(); ++j)
    documents.emplace_back(tokens.begin() + starts[j], tokens.begin() + starts[j + 1]);
  return documents;
}

std::vector<int32_t> bytes_of(const std::string& text, std::optional<int32_t> eod = std::nullopt) {
  std::vector<int32_t> ids(text.begin(), text.end());
  if (eod) ids.push_back(*eod);
  return ids;
}

TEST_F(IndexedDatasetTest, ScriptReadsMegatronJsonlText) {
  // preprocess_data.py's input: {"text": ...} per line, a string or a list of sentences (one
  // sequence each, empty ones dropped); other keys ignored; byte-level ids, EOD 256.
  write_bytes(dir_ / "docs.jsonl",
              "{\"text\": \"ab\\nc\"}\n{\"text\": \"\"}\n{\"text\": [\"d\", \"\", \"\\u00e9\"], \"url\": \"x\"}\n");
  testing::ProcessResult r = run_script("--jsonl " + (dir_ / "docs.jsonl") + " --append-eod --output-prefix " +
                                        prefix("text"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(IndexedDataset(prefix("text")).dtype(), TokenDType::kUint16);
  EXPECT_EQ(IndexedDataset(prefix("text")).num_sequences(), 3);  // "ab\nc", "d", "é"
  EXPECT_EQ(documents_of(prefix("text"), 257),
            (std::vector<std::vector<int32_t>>{bytes_of("ab\nc", 256), {}, {'d', 0xc3, 0xa9, 256}}));
  // The key is --json-keys, as preprocess_data.py's.
  write_bytes(dir_ / "content.jsonl", "{\"content\": \"hi\", \"text\": 3}\n");
  r = run_script("--jsonl " + (dir_ / "content.jsonl") + " --json-keys content --output-prefix " + prefix("key"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(documents_of(prefix("key"), 257), (std::vector<std::vector<int32_t>>{bytes_of("hi")}));
  // Without the key: the line and the keys it has are named.
  r = run_script("--jsonl " + (dir_ / "content.jsonl") + " --output-prefix " + prefix("bad"));
  EXPECT_NE(r.exit_code, 0);
  expect_contains(r.output, {"content.jsonl:1", "\"text\" must be a string"});
  write_bytes(dir_ / "other.jsonl", "{\"body\": \"hi\"}\n");
  r = run_script("--jsonl " + (dir_ / "other.jsonl") + " --output-prefix " + prefix("bad"));
  EXPECT_NE(r.exit_code, 0);
  expect_contains(r.output, {"other.jsonl:1", "without \"text\"", "keys: body", "--json-keys"});
  // Text and token id lines in one file are refused.
  write_bytes(dir_ / "mixed.jsonl", "{\"text\": \"hi\"}\n[1, 2]\n");
  r = run_script("--jsonl " + (dir_ / "mixed.jsonl") + " --output-prefix " + prefix("bad"));
  EXPECT_NE(r.exit_code, 0);
  expect_contains(r.output, {"mixed.jsonl:2", "all text or all ids"});
}

TEST_F(IndexedDatasetTest, ScriptSplitsTextAtBlankLinesOrLines) {
  // Wrapped prose: a paragraph is one document, its line breaks kept; runs of blank (or
  // whitespace-only) lines end it.
  write_bytes(dir_ / "prose.txt", "one\ntwo\n\n \n\nthree\n");
  testing::ProcessResult r =
      run_script("--text " + (dir_ / "prose.txt") + " --append-eod --output-prefix " + prefix("para"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(documents_of(prefix("para"), 257),
            (std::vector<std::vector<int32_t>>{bytes_of("one\ntwo", 256), bytes_of("three", 256)}));
  r = run_script("--text " + (dir_ / "prose.txt") + " --text-docs lines --output-prefix " + prefix("lines"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(documents_of(prefix("lines"), 257),
            (std::vector<std::vector<int32_t>>{bytes_of("one"), bytes_of("two"), bytes_of("three")}));
  // No trailing newline, no blank line at all: one document.
  write_bytes(dir_ / "one.txt", "a\nb");
  r = run_script("--text " + (dir_ / "one.txt") + " --output-prefix " + prefix("one"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(documents_of(prefix("one"), 257), (std::vector<std::vector<int32_t>>{bytes_of("a\nb")}));
}

TEST_F(IndexedDatasetTest, ScriptHelpWorksWithoutNumpy) {
  // An interpreter without numpy: None in sys.modules makes `import numpy` fail as if absent.
  const std::string script = testing::source_path("scripts/make_indexed_dataset.py");
  auto without_numpy = [&](const std::string& args) {
    return testing::run_command("/usr/bin/python3 -c 'import runpy, sys; sys.modules[\"numpy\"] = None; "
                                "sys.argv = [\"make_indexed_dataset.py\"] + sys.argv[1:]; "
                                "runpy.run_path(sys.argv.pop(1), run_name=\"__main__\")' " +
                                script + " " + args);
  };
  testing::ProcessResult r = without_numpy("--help");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r.output, {"usage: make_indexed_dataset.py", "--text-docs", "--json-keys", "blank-line"});
  // Writing needs numpy: the message says so and how to get it.
  write_bytes(dir_ / "notes.txt", "hi\n");
  r = without_numpy("--text " + (dir_ / "notes.txt") + " --output-prefix " + prefix("none"));
  EXPECT_NE(r.exit_code, 0);
  expect_contains(r.output, {"has no numpy", "python3-numpy"});
}

TEST_F(IndexedDatasetTest, EmptyDatasetAndEmptySequencesAreValid) {
  write_indexed_dataset(prefix(), TokenDType::kInt32, {});
  IndexedDataset empty(prefix());
  EXPECT_EQ(empty.num_sequences(), 0);
  EXPECT_EQ(empty.num_documents(), 0);
  EXPECT_EQ(empty.num_tokens(), 0);
  write_indexed_dataset(prefix(), TokenDType::kInt32, {{{}, {1}}, {{}}});
  IndexedDataset d(prefix());
  EXPECT_EQ(d.num_sequences(), 3);
  EXPECT_EQ(d.document_starts(), (std::vector<int64_t>{0, 1, 1}));
}

TEST_F(IndexedDatasetTest, ReadsFromSeveralThreads) {
  std::vector<int64_t> ids(5000);
  std::iota(ids.begin(), ids.end(), 0);
  write_indexed_dataset(prefix(), TokenDType::kInt32, {{ids}});
  IndexedDataset d(prefix());
  std::vector<std::thread> threads;
  std::vector<int> wrong(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<int32_t> out(100);
      for (int64_t first = t; first + 100 <= 5000; first += 37) {
        d.read_tokens(first, 100, 5000, out.data());
        for (int i = 0; i < 100; ++i) wrong[t] += out[i] != first + i;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong, (std::vector<int>{0, 0, 0, 0}));
}

TEST_F(IndexedDatasetTest, FingerprintCoversBothFiles) {
  valid();
  const DataFingerprint f = IndexedDataset(prefix()).fingerprint();
  EXPECT_EQ(f.bytes, int64_t(read_bytes(prefix() + ".idx").size() + read_bytes(prefix() + ".bin").size()));
  EXPECT_EQ(IndexedDataset(prefix()).fingerprint(), f);
  // Same sizes, another document boundary in the .idx (the second document starts a sequence later).
  write_indexed_dataset(prefix(), TokenDType::kInt32, {{{1, 2, 3}}, {{4}}, {{5, 6, 7}}});
  const DataFingerprint moved = IndexedDataset(prefix()).fingerprint();
  EXPECT_EQ(moved.bytes, f.bytes);
  EXPECT_NE(moved.hash, f.hash);
  // Same sizes, another token in the .bin.
  write_indexed_dataset(prefix(), TokenDType::kInt32, {{{1, 2, 3}, {4}}, {}, {{5, 6, 8}}});
  EXPECT_NE(IndexedDataset(prefix()).fingerprint().hash, f.hash);
}

// ---------------------------------------------------------------------------- corruption

TEST_F(IndexedDatasetTest, TruncatedFilesAreRefused) {
  const std::string idx = valid();
  const std::string name = prefix() + ".idx";
  // Inside the header: its size.
  for (size_t n : {size_t{0}, size_t{5}, size_t{33}})
    expect_contains(refused(idx.substr(0, n)), {name, "truncated", std::to_string(n) + " bytes", "header"});
  // Inside the lengths or pointers: the sequence count is past the file.
  for (size_t n : {size_t{40}, kPointersAt + 5})
    expect_contains(refused(idx.substr(0, n)), {name, "sequence count 3", "truncated, or a corrupt count"});
  // Inside the document index.
  expect_contains(refused(idx.substr(0, idx.size() - 1)), {name, "document count 4", "truncated"});
  // A truncated .bin: the index's sequences go past its end.
  write_bytes(prefix() + ".idx", idx);
  write_bytes(prefix() + ".bin", read_bytes(prefix() + ".bin").substr(0, 20));
  expect_contains(user_error_of([&] { IndexedDataset d(prefix()); }),
                  {name, "sequence_lengths[2] = 3", "past the end of", prefix() + ".bin", "20 bytes"});
}

TEST_F(IndexedDatasetTest, WrongMagicVersionAndDtypeAreRefused) {
  const std::string idx = valid();
  const std::string name = prefix() + ".idx";
  std::string bad = idx;
  bad[0] = 'X';
  expect_contains(refused(bad), {name, "magic is \"XMIDIDX\\x00\\x00\"", "expected \"MMIDIDX\\x00\\x00\""});
  // A token file (or anything else) handed as an .idx.
  expect_contains(refused(std::string(64, '\x01')), {name, "magic is \"\\x01\\x01", "Megatron"});
  bad = idx;
  put<uint64_t>(bad, 9, 2);
  expect_contains(refused(bad), {name, "version 2", "version 1"});
  for (uint8_t code : {0, 9, 255}) {
    bad = idx;
    bad[17] = static_cast<char>(code);
    expect_contains(refused(bad), {name, "unknown dtype code " + std::to_string(code), "8 uint16"});
  }
  bad = idx;
  bad[17] = 6;
  expect_contains(refused(bad), {name, "dtype code 6 (float64)", "integers"});
  bad[17] = 7;
  expect_contains(refused(bad), {name, "dtype code 7 (float32)"});
}

TEST_F(IndexedDatasetTest, CountsPastTheFileAreRefused) {
  const std::string idx = valid();
  const std::string name = prefix() + ".idx";
  for (uint64_t count : {uint64_t{100}, uint64_t{1} << 40, ~uint64_t{0}}) {
    std::string bad = idx;
    put<uint64_t>(bad, 18, count);
    expect_contains(refused(bad), {name, "sequence count " + std::to_string(count), "truncated, or a corrupt count"});
    bad = idx;
    put<uint64_t>(bad, 26, count);
    expect_contains(refused(bad), {name, "document count " + std::to_string(count), "corrupt count"});
  }
  // Counts smaller than the file: bytes left over.
  std::string bad = idx;
  put<uint64_t>(bad, 26, 3);
  expect_contains(refused(bad), {name, "8 bytes after document_indices", "corrupt count"});
  expect_contains(refused(idx + "x"), {name, "1 bytes after document_indices"});
  // No document index at all.
  bad = idx.substr(0, kDocumentsAt);
  put<uint64_t>(bad, 26, 0);
  expect_contains(refused(bad), {name, "document count 0"});
}

TEST_F(IndexedDatasetTest, PointersOutOfRangeOrInconsistentAreRefused) {
  const std::string idx = valid();
  const std::string name = prefix() + ".idx";
  const std::string bin = prefix() + ".bin";  // 28 bytes: 7 int32 ids
  for (int64_t pointer : {int64_t{29}, int64_t{1} << 50, int64_t{-4}}) {
    std::string bad = idx;
    put<int64_t>(bad, kPointersAt + 8 * 2, pointer);
    expect_contains(refused(bad), {name, "sequence_pointers[2] = " + std::to_string(pointer), "is outside", bin,
                                   "28 bytes"});
  }
  // In range, but not where the previous sequence ends (overlapping, or a gap).
  std::string bad = idx;
  put<int64_t>(bad, kPointersAt + 8 * 1, 8);
  expect_contains(refused(bad), {name, "sequence_pointers[1] = 8", "sequence 0 ends at byte 12", "back to back"});
  bad = idx;
  put<int64_t>(bad, kPointersAt, 4);
  expect_contains(refused(bad), {name, "sequence_pointers[0] = 4", "the first sequence starts at byte 0"});
}

TEST_F(IndexedDatasetTest, LengthsThatOverflowOrMismatchAreRefused) {
  const std::string idx = valid();
  const std::string name = prefix() + ".idx";
  const std::string bin = prefix() + ".bin";
  for (int32_t length : {INT32_MAX, 1 << 30, 8}) {
    std::string bad = idx;
    put<int32_t>(bad, kLengthsAt + 4 * 0, length);
    expect_contains(refused(bad), {name, "sequence_lengths[0] = " + std::to_string(length), "past the end of", bin});
  }
  std::string bad = idx;
  put<int32_t>(bad, kLengthsAt + 4 * 2, -1);
  expect_contains(refused(bad), {name, "sequence_lengths[2] = -1 is negative"});
  // Shorter lengths leave ids of the .bin that no sequence holds.
  bad = idx;
  put<int32_t>(bad, kLengthsAt + 4 * 2, 2);
  expect_contains(refused(bad), {bin, "28 bytes", "hold 24 bytes of int32 ids", "do not belong together"});
  // A lengths/pointers pair consistent with each other but not with the next pointer.
  bad = idx;
  put<int32_t>(bad, kLengthsAt + 4 * 0, 2);
  expect_contains(refused(bad), {name, "sequence_pointers[1] = 12", "sequence 0 ends at byte 8"});
}

TEST_F(IndexedDatasetTest, BadDocumentIndexIsRefused) {
  const std::string idx = valid();  // document_indices {0, 2, 2, 3}, N = 3
  const std::string name = prefix() + ".idx";
  auto with = [&](std::vector<int64_t> docs) {
    std::string bad = idx;
    for (size_t j = 0; j < docs.size(); ++j) put<int64_t>(bad, kDocumentsAt + 8 * j, docs[j]);
    write_bytes(name, bad);
  };
  auto refused_with = [&](std::vector<int64_t> docs) {
    with(std::move(docs));
    return user_error_of([&] { IndexedDataset d(prefix()); });
  };
  expect_contains(refused_with({1, 2, 2, 3}), {name, "document_indices[0] = 1, expected 0"});
  expect_contains(refused_with({0, 2, 2, 2}), {name, "document_indices[3] = 2, expected the sequence count 3"});
  expect_contains(refused_with({0, 2, 2, 5}), {name, "document_indices[3] = 5, expected the sequence count 3"});
  expect_contains(refused_with({0, 3, 2, 3}),
                  {name, "document_indices[2] = 2 is less than document_indices[1] = 3", "not monotone"});
  expect_contains(refused_with({0, 9, 2, 3}), {name, "document_indices[1] = 9 is past the sequence count 3"});
  expect_contains(refused_with({0, -1, 2, 3}), {name, "document_indices[1] = -1 is less than"});
  // Valid: one document of all three sequences, then two empty ones.
  with({0, 3, 3, 3});
  IndexedDataset d(prefix());
  EXPECT_EQ(d.document_starts(), (std::vector<int64_t>{0, 7, 7, 7}));
}

TEST_F(IndexedDatasetTest, MissingFilesAreNamed) {
  valid();
  std::remove((prefix() + ".bin").c_str());
  expect_contains(user_error_of([&] { IndexedDataset d(prefix()); }), {prefix() + ".bin", "cannot open"});
  expect_contains(user_error_of([&] { IndexedDataset d(prefix("none")); }), {prefix("none") + ".idx", "cannot open"});
}

}  // namespace
}  // namespace autosp::io
