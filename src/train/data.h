// Where training samples come from: a user's token file or the built-in passkey task.
// A sample is S input tokens and S labels; label -100 (kIgnoreLabel) is not scored.
// A packed source (packed()) holds several documents per sample (DESIGN.md "Files users
// bring"): its layout gives each token's position id and document, and attention stays
// within a document.
// The trainer decides which global sample index each row of each micro batch reads
// (io::TokenFile::sample_index, from the samples consumed so far); a source maps that index to tokens deterministically.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "io/tokens.h"

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

// The DESIGN.md token file: sample k is tokens [k*S, k*S + S + 1), taken modulo the number
// of whole samples; ids >= vocab_size are an error naming the offset.
class TokenFileSource final : public DataSource {
 public:
  TokenFileSource(const std::string& path, int32_t vocab_size)
      : file_(path), vocab_size_(vocab_size) {}
  void read_sample(int64_t sample, int64_t S, int32_t* inputs, int32_t* labels) const override {
    file_.read_sample(sample, S, vocab_size_, inputs, labels);
  }
  std::string describe(int64_t S) const override;
  int64_t num_samples(int64_t S) const override { return file_.num_samples(S); }
  std::optional<io::DataFingerprint> fingerprint() const override { return file_.fingerprint(); }
  const io::TokenFile& file() const { return file_; }

 private:
  io::TokenFile file_;
  int32_t vocab_size_;
};

}  // namespace autosp::train
