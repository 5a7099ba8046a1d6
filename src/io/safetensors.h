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
#include <string>
#include <utility>
#include <vector>

namespace autosp::io {

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

}  // namespace autosp::io
