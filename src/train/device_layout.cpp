#include "train/device_layout.h"

#include <algorithm>

#include "util/error.h"

namespace autosp::train {

FlatLayout flat_layout(const std::vector<int64_t>& numel, int64_t align) {
  AUTOSP_CHECK(align > 0, "flat_layout: alignment ", align);
  FlatLayout l;
  l.numel = numel;
  for (int64_t n : numel) {
    AUTOSP_CHECK(n >= 0, "flat_layout: a tensor of ", n, " elements");
    l.offset.push_back(l.total);
    l.total += (n + align - 1) / align * align;
  }
  return l;
}

std::vector<TensorChunk> tensor_chunks(const std::vector<int64_t>& numel, int64_t chunk) {
  AUTOSP_CHECK(chunk > 0, "tensor_chunks: chunk ", chunk);
  std::vector<TensorChunk> out;
  for (size_t t = 0; t < numel.size(); ++t)
    for (int64_t begin = 0; begin < numel[t]; begin += chunk)
      out.push_back({int64_t(t), begin, std::min(chunk, numel[t] - begin)});
  return out;
}

int64_t device_state_bytes(const std::vector<int64_t>& numel) {
  const int64_t chunks = static_cast<int64_t>(tensor_chunks(numel, kGradChunkElements).size());
  return 18 * flat_layout(numel).total + 8 * kDeviceNormPartials + 64 + 24 * chunks;
}

}  // namespace autosp::train
