// Packed data sources (train/data.h): positions, document ids and labels of samples over
// a Megatron indexed dataset and a flat token file with an eos_token_id, against samples
// written out by hand and against a naive reference over the whole stream; pack false; and
// what --data's path resolves to (open_data_source); the shuffled sample order
// (shuffled_sample, ShuffledSource, order_samples).
#include "train/data.h"

#include <gtest/gtest.h>

#include <fstream>
#include <numeric>
#include <random>

#include "io/indexed_dataset.h"
#include "testing/process.h"
#include "util/error.h"
#include "testing/errors.h"

namespace autosp::train {
namespace {

using io::TokenDType;

struct Sample {
  std::vector<int32_t> inputs, labels, positions, documents;
};

Sample read(const DataSource& data, int64_t k, int64_t S) {
  Sample s{std::vector<int32_t>(S), std::vector<int32_t>(S), std::vector<int32_t>(S), std::vector<int32_t>(S)};
  data.read_sample(k, S, s.inputs.data(), s.labels.data());
  data.read_layout(k, S, s.positions.data(), s.documents.data());
  return s;
}

using autosp::testing::expect_contains;
using autosp::testing::user_error_of;

constexpr int32_t X = kIgnoreLabel;

// The naive reference: the whole stream and which of its tokens start a document; sample k
// as DESIGN.md defines it, by scanning.
Sample reference(const std::vector<int32_t>& stream, const std::vector<bool>& starts, int64_t k, int64_t S) {
  const int64_t samples = (static_cast<int64_t>(stream.size()) - 1) / S;
  const int64_t first = (k % samples) * S;
  Sample s;
  int64_t start = 0, document = -1;
  for (int64_t t = 0; t < first + S; ++t) {
    if (starts[t]) start = t;
    if (t == first) document = 0;
    else if (t > first && starts[t]) ++document;
    if (t < first) continue;
    s.inputs.push_back(stream[t]);
    s.labels.push_back(starts[t + 1] ? X : stream[t + 1]);
    s.positions.push_back(static_cast<int32_t>(t - start));
    s.documents.push_back(static_cast<int32_t>(document));
  }
  return s;
}

void expect_sample(const Sample& got, const Sample& want, const std::string& what) {
  EXPECT_EQ(got.inputs, want.inputs) << what;
  EXPECT_EQ(got.labels, want.labels) << what;
  EXPECT_EQ(got.positions, want.positions) << what;
  EXPECT_EQ(got.documents, want.documents) << what;
}

class PackedDataTest : public ::testing::Test {
 protected:
  testing::TempDir dir_{"packed"};

  // An int32 indexed dataset whose documents have these lengths (0: an empty document),
  // each of one sequence, ids 1, 2, 3, ... over the stream: stream index + 1.
  std::string dataset(const std::vector<int64_t>& lengths, const std::string& name = "ds") {
    std::vector<std::vector<std::vector<int64_t>>> docs;
    int64_t id = 1;
    for (int64_t n : lengths) {
      std::vector<int64_t> seq(static_cast<size_t>(n));
      std::iota(seq.begin(), seq.end(), id);
      id += n;
      docs.push_back(n > 0 ? std::vector<std::vector<int64_t>>{seq} : std::vector<std::vector<int64_t>>{});
    }
    io::write_indexed_dataset(dir_ / name, TokenDType::kInt32, docs);
    return dir_ / name;
  }
  IndexedDatasetSource source(const std::string& prefix, bool pack = true, int32_t vocab = 1000) {
    return IndexedDatasetSource(prefix + ".idx", prefix + ".bin", vocab, pack);
  }
};

TEST_F(PackedDataTest, DocumentsInsideOneSample) {
  // Documents of 2, 3 and 4 tokens, then one of 5: S = 8 holds the first three whole and
  // the fourth's first token (8 + 1 tokens: 1..9).
  const auto data = source(dataset({2, 3, 4, 5}));
  EXPECT_TRUE(data.packed());
  const Sample s = read(data, 0, 8);
  EXPECT_EQ(s.inputs, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  // Token 2 ends document 0, token 5 document 1; token 9 (the label of input 8) is document 2's.
  EXPECT_EQ(s.labels, (std::vector<int32_t>{2, X, 4, 5, X, 7, 8, 9}));
  EXPECT_EQ(s.positions, (std::vector<int32_t>{0, 1, 0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(s.documents, (std::vector<int32_t>{0, 0, 1, 1, 1, 2, 2, 2}));
}

TEST_F(PackedDataTest, DocumentsCutAtTheStartAndAtTheEndOfASample) {
  // Documents of 6 and 6 tokens; S = 4: sample 1 is stream 4..8: the end of document 0
  // (cut by the sample's start: its positions continue at 4) and document 1's start.
  const auto data = source(dataset({6, 6}));
  const Sample s1 = read(data, 1, 4);
  EXPECT_EQ(s1.inputs, (std::vector<int32_t>{5, 6, 7, 8}));
  EXPECT_EQ(s1.labels, (std::vector<int32_t>{6, X, 8, 9}));
  EXPECT_EQ(s1.positions, (std::vector<int32_t>{4, 5, 0, 1}));
  EXPECT_EQ(s1.documents, (std::vector<int32_t>{0, 0, 1, 1}));
  // Documents of 4 and 5 tokens, S = 4: sample 0 ends exactly at document 0's end, so its
  // last token has no label (its next token, the label slot's, starts document 1).
  const auto exact = source(dataset({4, 5}, "exact"));
  const Sample e0 = read(exact, 0, 4);
  EXPECT_EQ(e0.labels, (std::vector<int32_t>{2, 3, 4, X}));
  EXPECT_EQ(e0.positions, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(e0.documents, (std::vector<int32_t>{0, 0, 0, 0}));
  // Sample 1 then begins with a document start: position 0, document 0 of the sample.
  const Sample e1 = read(exact, 1, 4);
  EXPECT_EQ(e1.inputs, (std::vector<int32_t>{5, 6, 7, 8}));
  EXPECT_EQ(e1.labels, (std::vector<int32_t>{6, 7, 8, 9}));
  EXPECT_EQ(e1.positions, (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST_F(PackedDataTest, ADocumentLongerThanASampleContinuesAcrossSamples) {
  // One document of 20 tokens, then one of 5; S = 6: samples 0..2 lie inside document 0,
  // its positions running on from sample to sample; sample 3 holds its end.
  const auto data = source(dataset({20, 5}));
  for (int64_t k = 0; k < 3; ++k) {
    const Sample s = read(data, k, 6);
    std::vector<int32_t> positions(6), labels(6);
    std::iota(positions.begin(), positions.end(), static_cast<int32_t>(6 * k));
    std::iota(labels.begin(), labels.end(), static_cast<int32_t>(6 * k + 2));
    EXPECT_EQ(s.positions, positions) << "sample " << k;
    EXPECT_EQ(s.labels, labels) << "sample " << k;
    EXPECT_EQ(s.documents, std::vector<int32_t>(6, 0)) << "sample " << k;
  }
  const Sample s3 = read(data, 3, 6);  // stream 18..24: document 0's last 2 tokens, then document 1
  EXPECT_EQ(s3.inputs, (std::vector<int32_t>{19, 20, 21, 22, 23, 24}));
  EXPECT_EQ(s3.labels, (std::vector<int32_t>{20, X, 22, 23, 24, 25}));
  EXPECT_EQ(s3.positions, (std::vector<int32_t>{18, 19, 0, 1, 2, 3}));
  EXPECT_EQ(s3.documents, (std::vector<int32_t>{0, 0, 1, 1, 1, 1}));
  // 25 tokens, S = 6: (25 - 1) / 6 = 4 whole samples, so sample 4 wraps around to sample 0.
  EXPECT_EQ(data.num_samples(6), 4);
  expect_sample(read(data, 4, 6), read(data, 0, 6), "sample 4 is sample 0 again");
}

TEST_F(PackedDataTest, EmptyDocumentsDropOut) {
  // Megatron writes an empty document for an empty text: it holds no token and no boundary.
  const auto with_empty = source(dataset({0, 3, 0, 0, 4, 0}));
  const auto without = source(dataset({3, 4}, "plain"));
  for (int64_t k = 0; k < 3; ++k) expect_sample(read(with_empty, k, 2), read(without, k, 2), "sample");
  EXPECT_NE(with_empty.describe(2).find("6 documents (4 empty)"), std::string::npos) << with_empty.describe(2);
}

TEST_F(PackedDataTest, EverySampleMatchesTheNaiveReference) {
  // Random document lengths (some empty, some longer than S), several S, every sample and
  // a wrap-around, against the reference that scans the stream.
  std::mt19937 rng(7);
  std::vector<int64_t> lengths;
  for (int d = 0; d < 60; ++d) lengths.push_back(std::uniform_int_distribution<int>(0, 3)(rng) == 0
                                                     ? std::uniform_int_distribution<int>(0, 1)(rng) * 25
                                                     : std::uniform_int_distribution<int>(1, 9)(rng));
  const auto data = source(dataset(lengths));
  std::vector<int32_t> stream;
  std::vector<bool> starts;
  for (int64_t n : lengths)
    for (int64_t i = 0; i < n; ++i) {
      starts.push_back(i == 0);
      stream.push_back(static_cast<int32_t>(stream.size() + 1));
    }
  starts.push_back(true);  // past the end
  for (int64_t S : {1, 2, 5, 7, 16, 33}) {
    const int64_t samples = data.num_samples(S);
    ASSERT_EQ(samples, (static_cast<int64_t>(stream.size()) - 1) / S);
    for (int64_t k = 0; k <= samples; ++k)
      expect_sample(read(data, k, S), reference(stream, starts, k, S), "S=" + std::to_string(S) + " k=" + std::to_string(k));
  }
}

TEST_F(PackedDataTest, PackFalseIsOneStream) {
  const auto data = source(dataset({2, 3, 4}), /*pack=*/false);
  EXPECT_FALSE(data.packed());
  const Sample s = read(data, 0, 6);
  EXPECT_EQ(s.inputs, (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(s.labels, (std::vector<int32_t>{2, 3, 4, 5, 6, 7}));  // across document ends
  EXPECT_EQ(s.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(s.documents, std::vector<int32_t>(6, 0));
  EXPECT_NE(data.describe(6).find("not packed"), std::string::npos);
}

TEST_F(PackedDataTest, TokenIdsAreCheckedAgainstTheVocabulary) {
  // Stream 0..5 = ids 1..6: id 5 at byte offset 16 (int32) is out of range, found when the
  // source is made (every id is checked at start-up), not when a step reaches it.
  const std::string ds = dataset({3, 3});
  expect_contains(user_error_of([&] { source(ds, true, /*vocab=*/5); }),
                  {dir_ / "ds.bin", "token id 5", "byte offset 16", "vocab_size 5", "checked at start-up"});
  // The same for a flat token file, and through open_data_source.
  io::write_tokens(dir_ / "flat.bin", {1, 2, 3, 4, 9, 1});
  expect_contains(user_error_of([&] { TokenFileSource(dir_ / "flat.bin", 9); }),
                  {dir_ / "flat.bin", "token id 9", "byte offset 16", "vocab_size 9"});
  expect_contains(user_error_of([&] { open_data_source(ds, 5, {}, "ds_config.json"); }),
                  {dir_ / "ds.bin", "token id 5", "byte offset 16"});
  std::vector<int32_t> inputs(4), labels(4);
  // Shorter than one sample.
  const auto tiny = source(dataset({3}, "tiny"));
  expect_contains(user_error_of([&] { tiny.read_sample(0, 3, inputs.data(), labels.data()); }),
                  {dir_ / "tiny.bin", "3 tokens", "S + 1 = 4"});
  std::vector<int32_t> positions(3), documents(3);
  expect_contains(user_error_of([&] { tiny.read_layout(0, 3, positions.data(), documents.data()); }),
                  {"3 tokens", "S + 1 = 4"});
}

// ---------------------------------------------------------------------------- EOS packing

class EosPackingTest : public PackedDataTest {
 protected:
  std::string file(const std::vector<uint32_t>& tokens) {
    io::write_tokens(dir_ / "tokens.bin", tokens);
    return dir_ / "tokens.bin";
  }
};

TEST_F(EosPackingTest, EachEosEndsItsDocument) {
  // eos = 0: documents [5 6 0] [7 0] [8 9 10 0] [11 12]
  const std::string path = file({5, 6, 0, 7, 0, 8, 9, 10, 0, 11, 12});
  const TokenFileSource data(path, 100, 0);
  EXPECT_TRUE(data.packed());
  const Sample s = read(data, 0, 10);
  EXPECT_EQ(s.inputs, (std::vector<int32_t>{5, 6, 0, 7, 0, 8, 9, 10, 0, 11}));
  // The EOS is its document's last token: predicted from the token before, itself unlabelled.
  EXPECT_EQ(s.labels, (std::vector<int32_t>{6, 0, X, 0, X, 9, 10, 0, X, 12}));
  EXPECT_EQ(s.positions, (std::vector<int32_t>{0, 1, 2, 0, 1, 0, 1, 2, 3, 0}));
  EXPECT_EQ(s.documents, (std::vector<int32_t>{0, 0, 0, 1, 1, 2, 2, 2, 2, 3}));
  // Cut by the sample's start: S = 3, sample 2 is stream 6..9 (document 2's middle and end).
  const Sample s2 = read(data, 2, 3);
  EXPECT_EQ(s2.inputs, (std::vector<int32_t>{9, 10, 0}));
  EXPECT_EQ(s2.labels, (std::vector<int32_t>{10, 0, X}));
  EXPECT_EQ(s2.positions, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(s2.documents, (std::vector<int32_t>{0, 0, 0}));
  EXPECT_NE(data.describe(3).find("4 documents (each ending at eos_token_id 0, packed)"), std::string::npos)
      << data.describe(3);
}

TEST_F(EosPackingTest, MatchesTheIndexedDatasetOfTheSameDocuments) {
  // The same documents as a flat file with EOS ids and as an indexed dataset (each with
  // its EOS appended, as preprocess_data.py --append-eod writes): the same samples.
  // Consecutive EOS tokens are documents of one token; a file ending in EOS has no empty tail.
  const std::vector<std::vector<int64_t>> docs = {{3, 4, 1}, {1}, {1}, {5, 6, 7, 8, 9, 1}, {2, 1}, {4, 4, 4, 1}};
  std::vector<uint32_t> flat;
  std::vector<std::vector<std::vector<int64_t>>> indexed;
  for (const auto& d : docs) {
    flat.insert(flat.end(), d.begin(), d.end());
    indexed.push_back({d});
  }
  const TokenFileSource eos(file(flat), 10, 1);
  io::write_indexed_dataset(dir_ / "same", TokenDType::kUint16, indexed);
  const auto idx = source(dir_ / "same", true, 10);
  for (int64_t S : {1, 3, 4, 8})
    for (int64_t k = 0; k <= eos.num_samples(S); ++k)
      expect_sample(read(eos, k, S), read(idx, k, S), "S=" + std::to_string(S) + " k=" + std::to_string(k));
}

TEST_F(EosPackingTest, WithoutEosTheFileIsOneStream) {
  const TokenFileSource data(file({5, 6, 0, 7, 0, 8}), 100);
  EXPECT_FALSE(data.packed());
  const Sample s = read(data, 0, 5);
  EXPECT_EQ(s.labels, (std::vector<int32_t>{6, 0, 7, 0, 8}));
  EXPECT_EQ(s.positions, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  // The fingerprint is the token file's, packed or not: a checkpoint records the file.
  EXPECT_EQ(*TokenFileSource(dir_ / "tokens.bin", 100, 0).fingerprint(), *data.fingerprint());
}

// ---------------------------------------------------------------------------- --data

class OpenDataSourceTest : public PackedDataTest {};

TEST_F(OpenDataSourceTest, PrefixBinOrIdxNameTheIndexedDataset) {
  const std::string prefix = dataset({3, 4});
  for (const std::string& path : {prefix, prefix + ".bin", prefix + ".idx"}) {
    std::vector<std::string> warnings;
    const auto data = open_data_source(path, 100, DataConfig{}, "ds.json", &warnings);
    EXPECT_NE(dynamic_cast<const IndexedDatasetSource*>(data.get()), nullptr) << path;
    EXPECT_TRUE(data->packed()) << path;
    EXPECT_TRUE(warnings.empty());
  }
  DataConfig no_pack;
  no_pack.pack = false;
  EXPECT_FALSE(open_data_source(prefix, 100, no_pack, "ds.json")->packed());
  // eos_token_id means nothing to an indexed dataset: said, not silently dropped.
  DataConfig eos;
  eos.eos_token_id = 2;
  std::vector<std::string> warnings;
  EXPECT_TRUE(open_data_source(prefix, 100, eos, "ds.json", &warnings)->packed());
  ASSERT_EQ(warnings.size(), 1u);
  expect_contains(warnings[0], {"ds.json: data.eos_token_id: ignored", "indexed dataset"});
}

TEST_F(OpenDataSourceTest, AFlatFileIsPackedByItsEosTokenId) {
  io::write_tokens(dir_ / "tokens.bin", {1, 2, 0, 3, 4});
  const std::string path = dir_ / "tokens.bin";
  EXPECT_FALSE(open_data_source(path, 100, DataConfig{}, "ds.json")->packed());
  DataConfig eos;
  eos.eos_token_id = 0;
  const auto packed = open_data_source(path, 100, eos, "ds.json");
  EXPECT_NE(dynamic_cast<const TokenFileSource*>(packed.get()), nullptr);
  EXPECT_TRUE(packed->packed());
  eos.pack = false;
  std::vector<std::string> warnings;
  EXPECT_FALSE(open_data_source(path, 100, eos, "ds.json", &warnings)->packed());
  ASSERT_EQ(warnings.size(), 1u);
  expect_contains(warnings[0], {"data.eos_token_id: ignored", "data.pack is false"});
  // A .bin with no .idx beside it is a flat file.
  EXPECT_NE(dynamic_cast<const TokenFileSource*>(open_data_source(path, 100, DataConfig{}, "c").get()), nullptr);
}

TEST_F(OpenDataSourceTest, ErrorsNameTheKeyOrTheFile) {
  io::write_tokens(dir_ / "tokens.bin", {1, 2, 0, 3, 4});
  DataConfig pack;
  pack.pack = true;
  expect_contains(user_error_of([&] { open_data_source(dir_ / "tokens.bin", 100, pack, "ds.json"); }),
                  {"ds.json: data.pack: true", "flat token file", "data.eos_token_id"});
  DataConfig eos;
  eos.eos_token_id = 100;
  expect_contains(user_error_of([&] { open_data_source(dir_ / "tokens.bin", 100, eos, "ds.json"); }),
                  {"ds.json: data.eos_token_id: 100", "vocab_size is 100"});
  expect_contains(user_error_of([&] { open_data_source(dir_ / "nothing", 100, DataConfig{}, "ds.json"); }),
                  {dir_ / "nothing", "no such file", "PREFIX.bin and PREFIX.idx"});
  // Half an indexed dataset.
  const std::string prefix = dataset({3});
  std::remove((prefix + ".bin").c_str());
  expect_contains(user_error_of([&] { open_data_source(prefix, 100, DataConfig{}, "ds.json"); }),
                  {prefix + ".bin does not exist"});
  expect_contains(user_error_of([&] { open_data_source(prefix + ".idx", 100, DataConfig{}, "ds.json"); }),
                  {prefix + ".bin does not exist"});
  // A corrupt .idx: the reader's error.
  std::ofstream(prefix + ".bin") << "";
  std::ofstream(prefix + ".idx") << "not an index, but long enough to hold a header";
  expect_contains(user_error_of([&] { open_data_source(prefix, 100, DataConfig{}, "ds.json"); }),
                  {prefix + ".idx", "magic"});
}


// ---------------------------------------------------------------------------- sample order

// shuffled_sample(seed, epoch, n, .) for i in [0, n).
std::vector<int64_t> permutation(uint64_t seed, int64_t epoch, int64_t n) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = shuffled_sample(seed, epoch, n, i);
  return p;
}

TEST(ShuffledSample, IsABijectionOfEveryN) {
  // 1 and 2 are the smallest domains (one Feistel half of 1 bit, 4 values walked down to n),
  // 7 and 4097 walk from 16 and 16384 values, 1000 and 4096 = 4^6 not at all.
  for (int64_t n : {1, 2, 3, 7, 1000, 4096, 4097}) {
    for (uint64_t seed : {0ULL, 42ULL, 0xffffffffffffULL}) {
      for (int64_t epoch : {0, 1, 17}) {
        std::vector<int64_t> p = permutation(seed, epoch, n);
        std::vector<bool> seen(static_cast<size_t>(n), false);
        for (int64_t k : p) {
          ASSERT_TRUE(k >= 0 && k < n) << "n " << n << " seed " << seed << " epoch " << epoch << ": " << k;
          ASSERT_FALSE(seen[k]) << "n " << n << " seed " << seed << " epoch " << epoch << ": " << k << " twice";
          seen[k] = true;
        }
      }
    }
  }
}

TEST(ShuffledSample, IsAPureFunctionThatDiffersBetweenEpochsAndSeeds) {
  for (int64_t n : {7, 1000, 4097}) {
    const std::vector<int64_t> p = permutation(42, 3, n);
    EXPECT_EQ(p, permutation(42, 3, n)) << n;
    EXPECT_NE(p, permutation(42, 4, n)) << n;
    EXPECT_NE(p, permutation(43, 3, n)) << n;
    std::vector<int64_t> identity(static_cast<size_t>(n));
    std::iota(identity.begin(), identity.end(), 0);
    EXPECT_NE(p, identity) << n;
  }
  // Not merely different: two epochs of 1000 share about one fixed point of each other
  // (n * 1/n), and a permutation moves all but about one sample.
  const std::vector<int64_t> a = permutation(42, 0, 1000), b = permutation(42, 1, 1000);
  int same = 0, fixed = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    same += a[i] == b[i];
    fixed += a[i] == i;
  }
  EXPECT_LE(same, 8);
  EXPECT_LE(fixed, 8);
  // The largest n the index arithmetic allows still maps into range.
  const int64_t huge = int64_t{1} << 62;
  for (int64_t i : {int64_t{0}, huge / 3, huge - 1}) {
    const int64_t k = shuffled_sample(7, 1, huge, i);
    EXPECT_TRUE(k >= 0 && k < huge) << k;
  }
}

TEST_F(EosPackingTest, AShuffledSampleKeepsItsTokensAndLayout) {
  // eos = 0, S = 3: 16 tokens, 5 samples with documents cut by their starts and ends.
  const std::string path = file({5, 6, 0, 7, 0, 8, 9, 10, 0, 11, 12, 13, 14, 0, 15, 16});
  DataConfig config;
  config.eos_token_id = 0;
  config.seed = 9;
  const auto in_order = open_data_source(path, 100, config, "ds.json");
  const auto shuffled = order_samples(open_data_source(path, 100, config, "ds.json"), config);
  ASSERT_EQ(shuffled->num_samples(3), 5);
  EXPECT_TRUE(shuffled->packed());
  EXPECT_EQ(shuffled->fingerprint(), in_order->fingerprint());
  // Three epochs: global sample g is file sample perm_e(g mod 5), each epoch all five.
  std::vector<int64_t> order;
  for (int64_t g = 0; g < 15; ++g) {
    const int64_t k = shuffled_sample(9, g / 5, 5, g % 5);
    order.push_back(k);
    expect_sample(read(*shuffled, g, 3), read(*in_order, k, 3), str("global sample ", g, " = file sample ", k));
  }
  EXPECT_NE(std::vector<int64_t>(order.begin(), order.begin() + 5), std::vector<int64_t>(order.begin() + 5, order.begin() + 10));
  // data.shuffle false: the source itself, in file order.
  config.shuffle = false;
  EXPECT_EQ(describe_data_order(config), "data order: file order (data.shuffle false)");
  const auto plain = order_samples(open_data_source(path, 100, config, "ds.json"), config);
  EXPECT_NE(dynamic_cast<const TokenFileSource*>(plain.get()), nullptr);
  config.shuffle = true;
  EXPECT_EQ(describe_data_order(config), "data order: shuffled (seed 9, a new permutation each epoch)");
}

}  // namespace
}  // namespace autosp::train

namespace autosp {
namespace {

// A position at one sequence length as the same tokens into the epoch at another.
TEST(ConvertDataPosition, KeepsTheTokensReadOfTheEpoch) {
  using train::convert_data_position;
  // 8 samples of 16 = 128 tokens: 4 samples of 32, exactly; 5.33 of 24: the 6th, skipping 16.
  auto p = convert_data_position(8, 16, 13, 32, 6);
  EXPECT_EQ(p.samples, 4);
  EXPECT_EQ(p.skipped_tokens, 0);
  p = convert_data_position(8, 16, 13, 24, 8);
  EXPECT_EQ(p.samples, 6);
  EXPECT_EQ(p.skipped_tokens, 16);
  // Epoch 2, sample 3 of 13 at 16 (48 tokens): epoch 2, sample 2 of 6 at 24, after 12 samples.
  p = convert_data_position(2 * 13 + 3, 16, 13, 24, 6);
  EXPECT_EQ(p.epoch, 2);
  EXPECT_EQ(p.samples, 2 * 6 + 2);
  // No whole sample left in the epoch: the next epoch's first.
  p = convert_data_position(12, 16, 13, 32, 6);
  EXPECT_EQ(p.epoch, 1);
  EXPECT_EQ(p.samples, 6);
  // Shorter samples: exact. Endless data: in tokens of the stream.
  EXPECT_EQ(convert_data_position(3, 32, 6, 16, 13).samples, 6);
  EXPECT_EQ(convert_data_position(5, 64, 0, 128, 0).samples, 3);
}

}  // namespace
}  // namespace autosp
