// Reading and writing Hugging Face safetensors files.
//
// Format: an 8-byte little-endian u64 header length N, N bytes of JSON header
//   {NAME: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {str: str} (optional)}
// then the data buffer; offsets are relative to the buffer's start.
//
// Files are untrusted input. The reader checks everything Hugging Face's own loader
// checks (header length, JSON, every key and type, offsets that tile the buffer exactly
// with no overlap, gap or trailing byte, byte size = elements * item size), and reports
// each problem as a UserError naming the file and the tensor. It never reads outside
// the file or the buffers it allocated.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace autosp {
class AtomicFileWriter;
}

namespace autosp::io {

// The element types autosp reads and writes, by their safetensors names.
enum class FileDType { F32, BF16, F16 };
const char* dtype_name(FileDType d);  // "F32", "BF16", "F16"
size_t item_size(FileDType d);

// A tensor in host memory, row-major fp32.
struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// Reads every tensor of `path`, converting F32, BF16 and F16 to fp32 exactly; any other
// dtype is a UserError naming the tensor and the dtype. If `metadata` is not null it
// receives the "__metadata__" map (empty when absent).
std::map<std::string, HostTensor> read_safetensors(
    const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

// Writes `tensors` as F32, in the given order, with the header padded by spaces to a
// multiple of 8 bytes as Hugging Face does; atomically (util/atomic_file.h), so a
// crash mid-write leaves any previous file intact. Names must be unique, not
// "__metadata__", and each tensor's data must match its shape (internal checks).
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, const HostTensor*>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// A safetensors file opened to read parts of its tensors: the header is read and validated
// in full when it is opened (everything read_safetensors checks but the data themselves),
// and each read() then reads only the bytes of the elements asked for. For a rank that
// needs its shard of every tensor and nothing else.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&&) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&&) noexcept;

  const std::string& path() const;
  const std::map<std::string, std::string>& metadata() const;
  std::vector<std::string> names() const;  // sorted
  // UserError "FILE: missing tensor 'NAME'" or "FILE: tensor 'NAME' has shape [a, b],
  // expected [c, d]", as expect_tensor says it.
  void expect(const std::string& name, const std::vector<int64_t>& shape) const;
  // Elements [begin, begin + n) of tensor `name` (row-major) as fp32 (internal check: in range).
  void read(const std::string& name, int64_t begin, int64_t n, float* out) const;
  FileDType dtype(const std::string& name) const;  // internal check: present
  bool contains(const std::string& name) const;

 private:
  friend std::map<std::string, HostTensor> read_safetensors(const std::string&, std::map<std::string, std::string>*);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A tensor a SafetensorsWriter is to write: its name, shape and the dtype it is stored in.
struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  FileDType dtype = FileDType::F32;
};

// A safetensors file written in pieces, in any order, without any tensor whole in memory:
// the header follows from the names, shapes and dtypes given up front (in that order,
// padded as write_safetensors pads it), and write() puts elements at their place in the
// data, rounding fp32 to the tensor's dtype to nearest even (float_to_bf16, float_to_f16).
// Atomic as write_safetensors is: the file appears, complete, at commit(), which checks
// that as many elements were written as the tensors have (the caller writes each once).
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, const std::vector<TensorToWrite>& tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  // Elements [begin, begin + n) of tensor number `index` (of the constructor's list).
  void write(size_t index, int64_t begin, const float* data, int64_t n);
  void commit();
  uint64_t file_bytes() const { return data_start_ + data_bytes_; }
  uint64_t data_bytes() const { return data_bytes_; }  // the tensors' bytes (the index's total_size)

 private:
  std::unique_ptr<AtomicFileWriter> file_;
  std::vector<int64_t> numel_;
  std::vector<FileDType> dtype_;
  std::vector<uint64_t> offset_;  // of each tensor's first byte in the file
  uint64_t data_start_ = 0, data_bytes_ = 0, written_ = 0;
};

// Returns tensors[name] after checking its shape; otherwise a UserError
// "FILE: missing tensor 'NAME'" or "FILE: tensor 'NAME' has shape [a, b], expected [c, d]".
const HostTensor& expect_tensor(const std::map<std::string, HostTensor>& tensors,
                                const std::string& name, const std::vector<int64_t>& shape,
                                const std::string& file);

// "[a, b]": a shape as the error messages print it.
std::string shape_string(const std::vector<int64_t>& shape);

// Exact widening conversions (every bf16 and f16 value is representable in fp32).
float bf16_to_float(uint16_t bits);
float f16_to_float(uint16_t bits);  // subnormals, infinities and NaN payloads included
// Narrowing, rounded to nearest even as torch's .to(bfloat16/float16) rounds: NaN stays a
// (quiet) NaN, values beyond the range become infinities, f16 subnormals are kept.
uint16_t float_to_bf16(float x);
uint16_t float_to_f16(float x);

}  // namespace autosp::io
