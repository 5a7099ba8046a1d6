// Megatron-LM / NeMo indexed datasets: PREFIX.bin (the token ids) and PREFIX.idx (the
// index), the "MMIDIDX" format version 1 that megatron/core/datasets/indexed_dataset.py
// writes (IndexedDatasetBuilder, _IndexWriter) and tools/preprocess_data.py produces.
//
// PREFIX.idx, little-endian, nothing between or after the fields:
//   char[9]  magic "MMIDIDX\0\0"
//   u64      version: 1
//   u8       dtype code of the ids in .bin (Megatron's DType): 1 uint8, 2 int8, 3 int16,
//            4 int32, 5 int64, 8 uint16 (6 float64 and 7 float32 are not token ids)
//   u64      sequence count N
//   u64      document index count M (documents + 1)
//   i32[N]   sequence lengths, in tokens
//   i64[N]   sequence pointers: byte offset of each sequence in .bin
//   i64[M]   document index: the sequence where each document starts, non-decreasing,
//            first 0, last N (document d is sequences [index[d], index[d+1]); an empty
//            document, which preprocess_data.py writes for an empty text, repeats a value)
// PREFIX.bin: the sequences' ids back to back, one dtype item each; Megatron's writer lays
// them out contiguously (pointer[i+1] = pointer[i] + length[i] * item size), which is
// what this reader requires, so the dataset is one token stream: the .bin in order.
//
// Both files are untrusted input: every field is checked (magic, version, dtype, counts
// against the file size, lengths, pointers against the lengths and the .bin size, the
// document index), each failure a UserError naming the file and the field. The index is
// validated in one streaming pass with bounded buffers; neither file is held in memory,
// only the document starts (one int64 per document).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/file.h"
#include "io/tokens.h"

namespace autosp::io {

// Megatron's DType codes for the integer types.
enum class TokenDType : uint8_t { kUint8 = 1, kInt8 = 2, kInt16 = 3, kInt32 = 4, kInt64 = 5, kUint16 = 8 };

class IndexedDataset {
 public:
  // PREFIX.idx and PREFIX.bin.
  explicit IndexedDataset(const std::string& prefix);
  IndexedDataset(const std::string& idx_path, const std::string& bin_path);

  const std::string& idx_path() const { return idx_.path(); }
  const std::string& bin_path() const { return bin_.path(); }
  TokenDType dtype() const { return dtype_; }
  int item_bytes() const { return item_bytes_; }
  const char* dtype_name() const;
  int64_t num_sequences() const { return num_sequences_; }
  // Megatron's documents (document index count - 1), empty ones included.
  int64_t num_documents() const { return static_cast<int64_t>(document_starts_.size()) - 1; }
  int64_t num_tokens() const { return num_tokens_; }
  // Where each document begins in the token stream, num_documents() + 1 entries: the first
  // 0, the last num_tokens(); non-decreasing (an empty document repeats its successor's).
  const std::vector<int64_t>& document_starts() const { return document_starts_; }

  // Stream tokens [first, first + n) into out[0..n). An id outside [0, vocab_size) is a
  // UserError naming the .bin, the id and its byte offset. Safe from several threads.
  void read_tokens(int64_t first, int64_t n, int32_t vocab_size, int32_t* out) const;

  // Checks every id of the .bin against [0, vocab_size) in one streaming pass, as
  // TokenFile::validate does: the first bad one is a UserError naming the .bin, the id and
  // its byte offset. `progress` runs after each block with the .bin bytes checked.
  void validate(int32_t vocab_size, const ValidationProgress& progress = {}) const;

  // Both files' sizes; a hash of the whole .idx and of the first and last
  // TokenFile::kFingerprintBlock bytes of the .bin.
  DataFingerprint fingerprint() const;

 private:
  ReadOnlyFile idx_, bin_;
  TokenDType dtype_ = TokenDType::kInt32;
  int item_bytes_ = 4;
  int64_t num_sequences_ = 0;
  int64_t num_tokens_ = 0;
  std::vector<int64_t> document_starts_;
};

// Writes PREFIX.bin and PREFIX.idx as Megatron's IndexedDatasetBuilder does: `documents`
// is a list of documents, each a list of sequences (ids must fit `dtype`), for tests.
void write_indexed_dataset(const std::string& prefix, TokenDType dtype,
                           const std::vector<std::vector<std::vector<int64_t>>>& documents);

}  // namespace autosp::io
