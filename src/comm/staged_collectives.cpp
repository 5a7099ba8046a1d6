#include "comm/staged_collectives.h"

#include <cstring>

#include "io/safetensors.h"
#include "util/error.h"

namespace autosp {

namespace {

void check_dtype(DType dtype, const char* call) {
  AUTOSP_CHECK(dtype == DType::f32 || dtype == DType::bf16, call, ": f32 or bf16, not ", dtype_name(dtype));
}

// n elements of dtype at p, widened to fp32 into out.
void widen(const void* p, int64_t n, DType dtype, float* out) {
  if (dtype == DType::f32) {
    std::memcpy(out, p, size_t(4 * n));
    return;
  }
  const auto* bits = static_cast<const uint16_t*>(p);
  for (int64_t i = 0; i < n; ++i) out[i] = io::bf16_to_float(bits[i]);
}

void narrow(const float* in, int64_t n, DType dtype, void* p) {
  if (dtype == DType::f32) {
    std::memcpy(p, in, size_t(4 * n));
    return;
  }
  auto* bits = static_cast<uint16_t*>(p);
  for (int64_t i = 0; i < n; ++i) bits[i] = io::float_to_bf16(in[i]);
}

int64_t words(int64_t bytes) { return (bytes + 3) / 4; }

}  // namespace

void StagedCollectives::all_reduce_sum(void* data, int64_t n, DType dtype) {
  check_dtype(dtype, "all_reduce_sum");
  if (dtype == DType::f32) return host_.all_reduce_sum(static_cast<float*>(data), n);
  a_.resize(size_t(n));
  widen(data, n, dtype, a_.data());
  host_.all_reduce_sum(a_.data(), n);
  narrow(a_.data(), n, dtype, data);
}

void StagedCollectives::all_to_all(const void* send, void* recv, int64_t chunk_bytes) {
  const int64_t P = size(), w = words(chunk_bytes);
  if (chunk_bytes % 4 == 0)
    return host_.all_to_all(static_cast<const float*>(send), static_cast<float*>(recv), w);
  a_.assign(size_t(P * w), 0.0f);
  b_.resize(size_t(P * w));
  for (int64_t p = 0; p < P; ++p)
    std::memcpy(a_.data() + p * w, static_cast<const char*>(send) + p * chunk_bytes, size_t(chunk_bytes));
  host_.all_to_all(a_.data(), b_.data(), w);
  for (int64_t p = 0; p < P; ++p)
    std::memcpy(static_cast<char*>(recv) + p * chunk_bytes, b_.data() + p * w, size_t(chunk_bytes));
}

void StagedCollectives::all_gather(const void* send, void* recv, int64_t bytes) {
  const int64_t P = size(), w = words(bytes);
  if (bytes % 4 == 0) return host_.all_gather(static_cast<const float*>(send), static_cast<float*>(recv), w);
  a_.assign(size_t(w), 0.0f);
  b_.resize(size_t(P * w));
  std::memcpy(a_.data(), send, size_t(bytes));
  host_.all_gather(a_.data(), b_.data(), w);
  for (int64_t p = 0; p < P; ++p)
    std::memcpy(static_cast<char*>(recv) + p * bytes, b_.data() + p * w, size_t(bytes));
}

void StagedCollectives::reduce_scatter_sum(const void* send, void* recv, int64_t n, DType dtype) {
  check_dtype(dtype, "reduce_scatter_sum");
  const int64_t P = size();
  if (dtype == DType::f32)
    return host_.reduce_scatter_sum(static_cast<const float*>(send), static_cast<float*>(recv), n);
  a_.resize(size_t(P * n));
  b_.resize(size_t(n));
  widen(send, P * n, dtype, a_.data());
  host_.reduce_scatter_sum(a_.data(), b_.data(), n);
  narrow(b_.data(), n, dtype, recv);
}

}  // namespace autosp
