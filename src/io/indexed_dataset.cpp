#include "io/indexed_dataset.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "util/atomic_file.h"
#include "util/error.h"
#include "util/hash.h"

namespace autosp::io {

// Index fields and token ids are copied straight from the files into host integers.
static_assert(std::endian::native == std::endian::little,
              "indexed datasets assume a little-endian host");

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
// magic, version u64, dtype u8, sequence count u64, document index count u64
constexpr uint64_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;
// Per sequence: an int32 length and an int64 pointer.
constexpr uint64_t kSequenceBytes = 4 + 8;

template <typename T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The magic as it would be written in Python, for the message.
std::string quoted_bytes(const char* p, size_t n) {
  std::string s = "\"";
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(p[i]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      s += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      s += "\\x";
      s += hex[c >> 4];
      s += hex[c & 15];
    }
  }
  return s + "\"";
}

int item_bytes_of(TokenDType d) {
  switch (d) {
    case TokenDType::kUint8:
    case TokenDType::kInt8: return 1;
    case TokenDType::kInt16:
    case TokenDType::kUint16: return 2;
    case TokenDType::kInt32: return 4;
    case TokenDType::kInt64: return 8;
  }
  internal_error("TokenDType ", int(d));
}

const char* name_of(TokenDType d) {
  switch (d) {
    case TokenDType::kUint8: return "uint8";
    case TokenDType::kInt8: return "int8";
    case TokenDType::kInt16: return "int16";
    case TokenDType::kUint16: return "uint16";
    case TokenDType::kInt32: return "int32";
    case TokenDType::kInt64: return "int64";
  }
  internal_error("TokenDType ", int(d));
}

// Consecutive elements of one array of the .idx, read through a bounded buffer.
template <typename T>
class ArrayCursor {
 public:
  ArrayCursor(const ReadOnlyFile& file, uint64_t begin, uint64_t count)
      : file_(file), at_(begin), left_(count) {}
  T next() {
    if (pos_ == buf_.size()) {
      AUTOSP_CHECK(left_ > 0, "read past the end of an index array of ", file_.path());
      const uint64_t n = std::min<uint64_t>(left_, kChunk);
      buf_.resize(n);
      file_.read(at_, buf_.data(), n * sizeof(T));
      at_ += n * sizeof(T);
      left_ -= n;
      pos_ = 0;
    }
    return buf_[pos_++];
  }

 private:
  static constexpr uint64_t kChunk = 8192;
  const ReadOnlyFile& file_;
  uint64_t at_, left_;
  std::vector<T> buf_;
  size_t pos_ = 0;
};

}  // namespace

const char* IndexedDataset::dtype_name() const { return name_of(dtype_); }

IndexedDataset::IndexedDataset(const std::string& prefix)
    : IndexedDataset(prefix + ".idx", prefix + ".bin") {}

IndexedDataset::IndexedDataset(const std::string& idx_path, const std::string& bin_path)
    : idx_(idx_path, "indexed dataset index"), bin_(bin_path, "indexed dataset token data") {
  const std::string& p = idx_path;
  const uint64_t size = idx_.size();
  if (size < kHeaderBytes)
    user_error(p, ": truncated: ", size, " bytes, but the header of an indexed dataset index (magic, version, "
               "dtype, sequence count, document count) is ", kHeaderBytes, " bytes");
  char header[kHeaderBytes];
  idx_.read(0, header, kHeaderBytes);
  if (std::memcmp(header, kMagic, sizeof kMagic) != 0)
    user_error(p, ": magic is ", quoted_bytes(header, sizeof kMagic),
               ", expected \"MMIDIDX\\x00\\x00\": not the index of a Megatron-LM / NeMo indexed dataset");
  const uint64_t version = load<uint64_t>(header + 9);
  if (version != 1)
    user_error(p, ": version ", version, ": autosp reads version 1 of the MMIDIDX index format");
  const uint8_t code = static_cast<uint8_t>(header[17]);
  switch (code) {
    case 1: case 2: case 3: case 4: case 5: case 8: dtype_ = static_cast<TokenDType>(code); break;
    case 6: case 7:
      user_error(p, ": dtype code ", int(code), " (", code == 6 ? "float64" : "float32",
                 "): token ids are integers (Megatron's DType codes 1-5 and 8)");
    default:
      user_error(p, ": unknown dtype code ", int(code), " (Megatron's DType: 1 uint8, 2 int8, 3 int16, 4 int32, "
                 "5 int64, 6 float64, 7 float32, 8 uint16)");
  }
  item_bytes_ = item_bytes_of(dtype_);
  const uint64_t sequences = load<uint64_t>(header + 18);
  const uint64_t doc_entries = load<uint64_t>(header + 26);

  // Every count is checked against what the file can hold before anything is multiplied
  // or allocated.
  const uint64_t body = size - kHeaderBytes;
  if (sequences > body / kSequenceBytes)
    user_error(p, ": sequence count ", sequences, " needs ", kSequenceBytes, " bytes each (sequence_lengths and "
               "sequence_pointers), but only ", body, " bytes follow the header: truncated, or a corrupt count");
  const uint64_t lengths_at = kHeaderBytes, pointers_at = lengths_at + 4 * sequences,
                 documents_at = pointers_at + 8 * sequences;
  if (doc_entries > (size - documents_at) / 8)
    user_error(p, ": document count ", doc_entries, " needs 8 bytes each (document_indices), but only ",
               size - documents_at, " bytes follow the sequence pointers: truncated, or a corrupt count");
  const uint64_t expected = documents_at + 8 * doc_entries;
  if (size != expected)
    user_error(p, ": ", size - expected, " bytes after document_indices (the file is ", size,
               " bytes; its counts account for ", expected, "): a corrupt count, or a multimodal dataset's "
               "sequence modes, which autosp does not read");
  if (doc_entries == 0)
    user_error(p, ": document count 0: document_indices holds at least its first entry, 0");
  num_sequences_ = static_cast<int64_t>(sequences);

  auto document_index = [&](uint64_t j) {
    int64_t v;
    idx_.read(documents_at + 8 * j, &v, 8);
    return v;
  };
  if (const int64_t first = document_index(0); first != 0)
    user_error(p, ": document_indices[0] = ", first, ", expected 0 (the first document starts at sequence 0)");
  if (const int64_t last = document_index(doc_entries - 1); last != num_sequences_)
    user_error(p, ": document_indices[", doc_entries - 1, "] = ", last, ", expected the sequence count ",
               num_sequences_, " (the last entry ends the last document)");

  // One pass over the three arrays together: sequence i's length and pointer, and the
  // documents starting at sequence i, whose token offset is the stream position there.
  const uint64_t bin_bytes = bin_.size();
  const std::string& b = bin_.path();
  ArrayCursor<int32_t> lengths(idx_, lengths_at, sequences);
  ArrayCursor<int64_t> pointers(idx_, pointers_at, sequences);
  ArrayCursor<int64_t> documents(idx_, documents_at, doc_entries);
  document_starts_.reserve(doc_entries);
  uint64_t j = 0;  // next document index entry
  int64_t pending = documents.next();
  auto take_documents_at = [&](int64_t sequence, uint64_t stream_bytes) {
    while (j < doc_entries && pending == sequence) {
      document_starts_.push_back(static_cast<int64_t>(stream_bytes) / item_bytes_);
      if (++j == doc_entries) break;
      const int64_t v = documents.next();
      if (v < pending)
        user_error(p, ": document_indices[", j, "] = ", v, " is less than document_indices[", j - 1, "] = ",
                   pending, ": the document index is not monotone");
      if (v > num_sequences_)
        user_error(p, ": document_indices[", j, "] = ", v, " is past the sequence count ", num_sequences_);
      pending = v;
    }
  };
  uint64_t end = 0;  // bytes of .bin the sequences so far cover
  for (int64_t i = 0; i < num_sequences_; ++i) {
    take_documents_at(i, end);
    const int64_t pointer = pointers.next();
    if (pointer < 0 || static_cast<uint64_t>(pointer) > bin_bytes)
      user_error(p, ": sequence_pointers[", i, "] = ", pointer, " is outside ", b, " (", bin_bytes, " bytes)");
    if (static_cast<uint64_t>(pointer) != end)
      user_error(p, ": sequence_pointers[", i, "] = ", pointer, ", but ",
                 i == 0 ? str("the first sequence starts at byte 0") : str("sequence ", i - 1, " ends at byte ", end),
                 ": the sequences are not back to back in ", b, " as Megatron's IndexedDatasetBuilder writes them");
    const int32_t length = lengths.next();
    if (length < 0) user_error(p, ": sequence_lengths[", i, "] = ", length, " is negative");
    const uint64_t bytes = static_cast<uint64_t>(length) * static_cast<uint64_t>(item_bytes_);
    if (bytes > bin_bytes - end)
      user_error(p, ": sequence_lengths[", i, "] = ", length, ": sequence ", i, " (", name_of(dtype_),
                 " ids from byte ", end, ") would end at byte ", end + bytes, ", past the end of ", b, " (",
                 bin_bytes, " bytes)");
    end += bytes;
  }
  take_documents_at(num_sequences_, end);
  AUTOSP_CHECK(j == doc_entries, "document_indices of ", p, " not consumed: ", j, " of ", doc_entries);
  if (end != bin_bytes)
    user_error(b, ": ", bin_bytes, " bytes, but the sequences of ", p, " hold ", end, " bytes of ", name_of(dtype_),
               " ids: the .bin and .idx do not belong together, or one of them is truncated");
  num_tokens_ = static_cast<int64_t>(end) / item_bytes_;
}

void IndexedDataset::read_tokens(int64_t first, int64_t n, int32_t vocab_size, int32_t* out) const {
  AUTOSP_CHECK(first >= 0 && n >= 0 && first <= num_tokens_ - n && vocab_size > 0, "tokens [", first, ", +", n,
               ") of ", num_tokens_, ", vocab_size ", vocab_size);
  std::vector<char> raw(static_cast<size_t>(n) * item_bytes_);
  bin_.read(static_cast<uint64_t>(first) * item_bytes_, raw.data(), raw.size());
  auto convert = [&](auto type_tag) {
    using T = decltype(type_tag);
    for (int64_t i = 0; i < n; ++i) {
      const T v = load<T>(raw.data() + i * sizeof(T));
      // Compared as int64 (exact for every dtype but uint64, which Megatron has not).
      if (static_cast<int64_t>(v) < 0 || static_cast<int64_t>(v) >= vocab_size)
        user_error(bin_.path(), ": token id ", static_cast<int64_t>(v), " at byte offset ",
                   (first + i) * int64_t(sizeof(T)), " is out of range for vocab_size ", vocab_size);
      out[i] = static_cast<int32_t>(v);
    }
  };
  switch (dtype_) {
    case TokenDType::kUint8: convert(uint8_t{}); break;
    case TokenDType::kInt8: convert(int8_t{}); break;
    case TokenDType::kInt16: convert(int16_t{}); break;
    case TokenDType::kUint16: convert(uint16_t{}); break;
    case TokenDType::kInt32: convert(int32_t{}); break;
    case TokenDType::kInt64: convert(int64_t{}); break;
  }
}

void IndexedDataset::validate(int32_t vocab_size, const ValidationProgress& progress) const {
  AUTOSP_CHECK(vocab_size > 0, "vocab_size ", vocab_size);
  const int64_t block_items = kValidationBlockBytes / item_bytes_;
  std::vector<char> raw(static_cast<size_t>(std::min(block_items, std::max<int64_t>(num_tokens_, 1)) * item_bytes_));
  auto check = [&](auto type_tag, int64_t first, int64_t n) {
    using T = decltype(type_tag);
    // Branch-free min and max of the block (vectorised), compared as int64 (exact for every
    // dtype); the rare bad block is searched again for the first offender.
    int64_t lo = 0, hi = 0;
    for (int64_t i = 0; i < n; ++i) {
      const auto v = static_cast<int64_t>(load<T>(raw.data() + i * sizeof(T)));
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    if (lo >= 0 && hi < vocab_size) return;
    for (int64_t i = 0; i < n; ++i) {
      const auto v = static_cast<int64_t>(load<T>(raw.data() + i * sizeof(T)));
      if (v < 0 || v >= vocab_size)
        user_error(bin_.path(), ": token id ", v, " at byte offset ", (first + i) * int64_t(sizeof(T)),
                   " is out of range for vocab_size ", vocab_size, " (every id of --data is checked at start-up)");
    }
  };
  for (int64_t first = 0; first < num_tokens_; first += block_items) {
    const int64_t n = std::min(block_items, num_tokens_ - first);
    bin_.read(static_cast<uint64_t>(first) * item_bytes_, raw.data(), static_cast<size_t>(n) * item_bytes_);
    switch (dtype_) {
      case TokenDType::kUint8: check(uint8_t{}, first, n); break;
      case TokenDType::kInt8: check(int8_t{}, first, n); break;
      case TokenDType::kInt16: check(int16_t{}, first, n); break;
      case TokenDType::kUint16: check(uint16_t{}, first, n); break;
      case TokenDType::kInt32: check(int32_t{}, first, n); break;
      case TokenDType::kInt64: check(int64_t{}, first, n); break;
    }
    if (progress) progress((first + n) * item_bytes_, num_tokens_ * item_bytes_);
  }
}

DataFingerprint IndexedDataset::fingerprint() const {
  int64_t idx_bytes = 0;
  const uint64_t idx_hash = fnv1a_file(idx_.path(), &idx_bytes);
  DataFingerprint f{idx_bytes + static_cast<int64_t>(bin_.size()),
                    fnv1a({reinterpret_cast<const char*>(&idx_hash), sizeof idx_hash})};
  const uint64_t block = std::min<uint64_t>(TokenFile::kFingerprintBlock, bin_.size());
  std::string buf(block, '\0');
  for (uint64_t at : {uint64_t{0}, bin_.size() - block}) {
    bin_.read(at, buf.data(), buf.size());
    f.hash = fnv1a(buf, f.hash);
  }
  return f;
}

void write_indexed_dataset(const std::string& prefix, TokenDType dtype,
                           const std::vector<std::vector<std::vector<int64_t>>>& documents) {
  const int item = item_bytes_of(dtype);
  std::string bin;
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers, document_indices{0};
  for (const auto& document : documents) {
    for (const auto& sequence : document) {
      pointers.push_back(static_cast<int64_t>(bin.size()));
      lengths.push_back(static_cast<int32_t>(sequence.size()));
      for (int64_t id : sequence) bin.append(reinterpret_cast<const char*>(&id), item);  // little-endian low bytes
    }
    document_indices.push_back(static_cast<int64_t>(lengths.size()));
  }
  std::string idx(kMagic, sizeof kMagic);
  auto put = [&](const void* p, size_t n) { idx.append(static_cast<const char*>(p), n); };
  const uint64_t version = 1, sequences = lengths.size(), entries = document_indices.size();
  const uint8_t code = static_cast<uint8_t>(dtype);
  put(&version, 8);
  put(&code, 1);
  put(&sequences, 8);
  put(&entries, 8);
  put(lengths.data(), 4 * lengths.size());
  put(pointers.data(), 8 * pointers.size());
  put(document_indices.data(), 8 * document_indices.size());
  write_file_atomic(prefix + ".bin", bin);
  write_file_atomic(prefix + ".idx", idx);
}

}  // namespace autosp::io
