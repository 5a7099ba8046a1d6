// Where training samples come from: a user's token file or indexed dataset, or the built-in passkey task.
// A sample is S input tokens and S labels; label -100 (kIgnoreLabel) is not scored.
// A packed source (packed()) holds several documents per sample (DESIGN.md "Files users
// bring"): its layout gives each token's position id and document, and attention stays
// within a document.
// The trainer decides which global sample index each row of each micro batch reads
// (io::TokenFile::sample_index, from the samples consumed so far); a source maps that index to tokens deterministically.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/indexed_dataset.h"
#include "io/tokens.h"
#include "train/config.h"

namespace autosp::train {

inline constexpr int32_t kIgnoreLabel = -100;

class DataSource {
 public:
  virtual ~DataSource() = default;
  // Fills inputs[0..S) and labels[0..S) for global sample `sample` (any index >= 0).
  virtual void read_sample(int64_t sample, int64_t S, int32_t* inputs, int32_t* labels) const = 0;
  // Whether samples hold several documents; read_layout says where they are.
  virtual bool packed() const { return false; }
  // Fills positions[0..S) and documents[0..S) for the same sample: a position id restarts
  // at 0 at each document start (a document cut by the sample's start continues its own
  // count), and documents[i] is the index, within the sample, of token i's document (0 for
  // the first, non-decreasing). The labels read_sample gives then never cross a document:
  // a document's last token has kIgnoreLabel. Unpacked: positions 0..S-1, one document.
  virtual void read_layout(int64_t sample, int64_t S, int32_t* positions, int32_t* documents) const;
  // One line for the progress log, e.g. "tokens.bin: 1048577 tokens, 4096 samples of 256".
  virtual std::string describe(int64_t S) const = 0;
  // Distinct samples before the data repeats (an epoch); 0 for a generated, endless source.
  virtual int64_t num_samples(int64_t /*S*/) const { return 0; }
  // What a checkpoint records to recognise this data on resume; none for generated data.
  virtual std::optional<io::DataFingerprint> fingerprint() const { return std::nullopt; }
};

// Where documents begin in a token stream, and what that makes of a sample's labels and
// layout (packed(), read_layout). Sample k is stream tokens [first, first + S + 1) with
// first = k * S; stream token t is in the document d with starts[d] <= t < starts[d + 1].
// Each sample finds its documents by binary search: O(log documents + its documents).
class DocumentStarts {
 public:
  DocumentStarts() = default;
  // `starts`: strictly increasing, the first 0 (the documents of a stream; none empty).
  explicit DocumentStarts(std::vector<int64_t> starts);
  int64_t count() const { return static_cast<int64_t>(starts_.size()); }
  // labels[i] = kIgnoreLabel for each i in [0, S) whose token first + i ends its document
  // (first + i + 1 starts another): its next token is not its document's.
  void mask_labels(int64_t first, int64_t S, int32_t* labels) const;
  // positions[i] = first + i - (start of its document); documents[i] = its document's
  // index minus that of token `first`.
  void layout(int64_t first, int64_t S, int32_t* positions, int32_t* documents) const;

 private:
  std::vector<int64_t> starts_;
};

// The DESIGN.md token file: sample k is tokens [k*S, k*S + S + 1), taken modulo the number
// of whole samples; ids >= vocab_size are an error naming the offset. With an
// `eos_token_id` the file is packed documents: each token equal to it ends one (the EOS is
// its document's last token, so it has no label), found in one pass over the file when the
// source is made.
class TokenFileSource final : public DataSource {
 public:
  // Every token id is checked against vocab_size here (io::TokenFile::validate).
  TokenFileSource(const std::string& path, int32_t vocab_size, std::optional<int32_t> eos_token_id = std::nullopt,
                  const io::ValidationProgress& progress = {});
  void read_sample(int64_t sample, int64_t S, int32_t* inputs, int32_t* labels) const override;
  bool packed() const override { return eos_token_id_.has_value(); }
  void read_layout(int64_t sample, int64_t S, int32_t* positions, int32_t* documents) const override;
  std::string describe(int64_t S) const override;
  int64_t num_samples(int64_t S) const override { return file_.num_samples(S); }
  std::optional<io::DataFingerprint> fingerprint() const override { return file_.fingerprint(); }
  const io::TokenFile& file() const { return file_; }

 private:
  io::TokenFile file_;
  int32_t vocab_size_;
  std::optional<int32_t> eos_token_id_;
  DocumentStarts documents_;
};

// A Megatron-LM / NeMo indexed dataset (io::IndexedDataset): its sequences in order are
// the token stream, sample k its tokens [k*S, k*S + S + 1) modulo the whole samples.
// Packed (the default), its documents are Megatron's (the sequences between consecutive
// document_indices; empty ones drop out); `pack` false reads one flat stream.
class IndexedDatasetSource final : public DataSource {
 public:
  // Every token id is checked against vocab_size here (io::IndexedDataset::validate).
  IndexedDatasetSource(const std::string& idx_path, const std::string& bin_path, int32_t vocab_size,
                       bool pack = true, const io::ValidationProgress& progress = {});
  void read_sample(int64_t sample, int64_t S, int32_t* inputs, int32_t* labels) const override;
  bool packed() const override { return pack_; }
  void read_layout(int64_t sample, int64_t S, int32_t* positions, int32_t* documents) const override;
  std::string describe(int64_t S) const override;
  int64_t num_samples(int64_t S) const override;
  std::optional<io::DataFingerprint> fingerprint() const override { return dataset_.fingerprint(); }
  const io::IndexedDataset& dataset() const { return dataset_; }

 private:
  // The first stream token of sample k; a dataset shorter than one sample is a UserError.
  int64_t first_token(int64_t sample, int64_t S) const;
  io::IndexedDataset dataset_;
  int32_t vocab_size_;
  bool pack_;
  DocumentStarts documents_;
};

// The file sample that position i of epoch e reads when shuffled: a permutation of [0, n)
// that is a pure function of (seed, epoch, n, i), so any world size, batch layout or
// resume reads the same sequence. A balanced Feistel network on the 2h bits of the
// smallest 4^h >= n (6 rounds, splitmix64 round functions keyed by seed and epoch) is a
// bijection of [0, 4^h); cycle-walking (apply it again while the result is >= n) restricts
// it to a bijection of [0, n), in fewer than 4 applications on average since 4^h < 4n.
// O(1) memory and time for any n <= 2^62, where a cached Fisher-Yates array would cost
// 8n bytes per rank (800 MB at 100M samples) and a pass over them each epoch.
int64_t shuffled_sample(uint64_t seed, int64_t epoch, int64_t n, int64_t i);

// A source whose global sample g reads sample shuffled_sample(seed, g / N, N, g mod N) of
// `inner`, N = inner.num_samples(S): each epoch visits every sample once, in a new order.
// Each sample keeps its own tokens and layout (documents, positions, labels). A generated,
// endless source (num_samples 0) is read as it is.
class ShuffledSource final : public DataSource {
 public:
  ShuffledSource(std::unique_ptr<DataSource> inner, uint64_t seed) : inner_(std::move(inner)), seed_(seed) {}
  // The inner source's sample that global sample g reads.
  int64_t file_sample(int64_t g, int64_t S) const;
  void read_sample(int64_t sample, int64_t S, int32_t* inputs, int32_t* labels) const override {
    inner_->read_sample(file_sample(sample, S), S, inputs, labels);
  }
  bool packed() const override { return inner_->packed(); }
  void read_layout(int64_t sample, int64_t S, int32_t* positions, int32_t* documents) const override {
    inner_->read_layout(file_sample(sample, S), S, positions, documents);
  }
  std::string describe(int64_t S) const override { return inner_->describe(S); }
  int64_t num_samples(int64_t S) const override { return inner_->num_samples(S); }
  std::optional<io::DataFingerprint> fingerprint() const override { return inner_->fingerprint(); }
  uint64_t seed() const { return seed_; }

 private:
  std::unique_ptr<DataSource> inner_;
  uint64_t seed_;
};

// `source` in the order the data section asks for: shuffled with data.seed (which must be
// resolved by then) unless data.shuffle is false.
std::unique_ptr<DataSource> order_samples(std::unique_ptr<DataSource> source, const DataConfig& config);

// A data position (global samples consumed) at sequence length old_S, as the position at
// new_S that has read as many tokens of the current epoch (a resume at another sequence
// length: context extension). Sample k of an epoch starts at stream token k S, so epoch e's
// first k samples at old_S end at token k old_S; the new position is the first sample of
// epoch e that starts there or after (`skipped_tokens` the difference), or the next epoch's
// first if no whole sample is left. old_N, new_N: the samples of an epoch at each length (0
// for endless data: a position in tokens of the whole stream). In shuffled order each epoch
// is a permutation of its own samples, so the rest of the epoch at new_S is as many tokens
// as were left, but not the same ones.
struct ConvertedPosition {
  int64_t samples = 0, epoch = 0, skipped_tokens = 0;
};
ConvertedPosition convert_data_position(int64_t consumed, int64_t old_S, int64_t old_N, int64_t new_S, int64_t new_N);

// One line for the start-up log: "data order: shuffled (seed N, a new permutation each
// epoch)" or "data order: file order (data.shuffle false)".
std::string describe_data_order(const DataConfig& config);

// What `--data PATH` names, and the source that reads it with the config's data section:
//  - PATH.bin and PATH.idx exist (PATH itself not a file): the indexed dataset PATH;
//  - PATH ends in .idx, or ends in .bin with the .idx beside it: that indexed dataset;
//  - otherwise PATH is a flat token file, packed when data.eos_token_id is given.
// Refused, naming `config_source` and the key: data.pack true for a flat file without
// data.eos_token_id, and an eos_token_id >= vocab_size. Keys that do nothing for this
// source (eos_token_id for an indexed dataset or with pack false) add to `warnings`.
// Every token id is checked before it returns; for a large file `progress` gets a line
// every few seconds and one with the bytes and the GB/s of the whole check. The source
// reads in file order; order_samples applies data.shuffle.
std::unique_ptr<DataSource> open_data_source(const std::string& path, int32_t vocab_size, const DataConfig& config,
                                             const std::string& config_source,
                                             std::vector<std::string>* warnings = nullptr,
                                             const std::function<void(const std::string&)>& progress = {});

}  // namespace autosp::train
