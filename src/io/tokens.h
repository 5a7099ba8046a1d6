// Training data: a flat file of little-endian uint32 token ids.
//
// Sample k is tokens [k*S, k*S + S + 1): inputs are its first S, labels its last S (the
// same tokens shifted by one). Samples overlap by the one token they share, so a file
// of T tokens holds (T - 1) / S whole samples; k is taken modulo that, so training can
// run for any number of steps and wraps around the data.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace autosp::io {

// Called during a validation pass with the bytes checked so far and the total.
using ValidationProgress = std::function<void(int64_t done_bytes, int64_t total_bytes)>;

// Bytes a validation pass reads at a time: large enough that each read streams at the
// disk's or page cache's speed, small enough to stay in L2/L3 while its ids are checked.
inline constexpr int64_t kValidationBlockBytes = int64_t{4} << 20;

// What identifies a data file when resuming: its size and a hash of its first and last
// blocks (cheap for a file of any size; a replaced, grown or edited file almost surely
// differs in one of them).
struct DataFingerprint {
  int64_t bytes = 0;
  uint64_t hash = 0;
  bool operator==(const DataFingerprint&) const = default;
};

class TokenFile {
 public:
  // Opens `path`; a size that is not a multiple of 4 bytes is a UserError.
  explicit TokenFile(std::string path);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;

  const std::string& path() const { return path_; }
  int64_t num_tokens() const { return num_tokens_; }
  // Whole samples of length S in the file, (num_tokens - 1) / S; 0 if shorter than one.
  int64_t num_samples(int64_t S) const;

  // Writes sample k mod num_samples(S) into inputs[0..S) and labels[0..S). A file shorter
  // than one sample, or a token id >= vocab_size, is a UserError naming the file (and the
  // token's byte offset and value). Safe to call from several threads at once.
  void read_sample(int64_t k, int64_t S, int32_t vocab_size, int32_t* inputs,
                   int32_t* labels) const;

  // Checks every token id of the file against vocab_size in one streaming pass (blocks of
  // kValidationBlockBytes, a branch-free max per block), so that a bad id is found at
  // start-up rather than at the step that reaches it. The first id >= vocab_size is a
  // UserError naming the file, the id and its byte offset. `progress` runs after each block.
  void validate(int32_t vocab_size, const ValidationProgress& progress = {}) const;

  // Tokens [first, first + n) as they are in the file, unchecked against any vocabulary.
  // UserError if the file cannot be read (it shrank). Safe from several threads.
  void read_tokens(int64_t first, int64_t n, uint32_t* out) const;

  // The sample that row `row` of micro-batch `micro` of an optimizer step reads on
  // data-parallel rank `dp_rank`, when `consumed` samples were read before the step:
  // consecutive micro-batches, ranks and rows read consecutive samples, so every rank sees
  // different data and none is skipped; the next step starts at consumed + the global batch,
  // whatever the batch layout was before. Not reduced modulo the file; read_sample does that.
  static int64_t sample_index(int64_t consumed, int64_t micro, int64_t dp_rank, int64_t dp_size,
                              int64_t row, int64_t micro_batch) {
    return consumed + (micro * dp_size + dp_rank) * micro_batch + row;
  }

  // Size and hash of the first and last kFingerprintBlock bytes. UserError if unreadable.
  static constexpr int64_t kFingerprintBlock = int64_t{1} << 20;
  DataFingerprint fingerprint() const;

 private:
  std::string path_;
  int fd_ = -1;
  int64_t num_tokens_ = 0;
};

// Writes `tokens` as a token file (atomically), for tests and tools.
void write_tokens(const std::string& path, const std::vector<uint32_t>& tokens);

}  // namespace autosp::io
