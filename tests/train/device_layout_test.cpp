// The device-resident state's flat layout and the multi-tensor chunks (train/device_layout.h):
// host logic of the cuda backend's bf16 step, checked without a GPU.
#include "train/device_layout.h"

#include <gtest/gtest.h>

#include "models/llama.h"
#include "testing/process.h"

namespace autosp::train {
namespace {

TEST(DeviceLayout, TensorsStartAlignedAndDoNotOverlap) {
  const std::vector<int64_t> numel = {1, 128, 129, 0, 4096, 7};
  const FlatLayout l = flat_layout(numel);
  ASSERT_EQ(l.offset.size(), numel.size());
  EXPECT_EQ(l.offset, (std::vector<int64_t>{0, 128, 256, 512, 512, 4608}));
  EXPECT_EQ(l.total, 4608 + 128);
  for (size_t i = 0; i < numel.size(); ++i) {
    EXPECT_EQ(l.offset[i] % kFlatAlignElements, 0) << i;
    // 256-byte aligned as bf16, so as fp32 too.
    EXPECT_EQ(2 * l.offset[i] % 256, 0) << i;
    if (i + 1 < numel.size()) {
      EXPECT_LE(l.offset[i] + numel[i], l.offset[i + 1]) << i;
    }
  }
  EXPECT_LE(l.offset.back() + numel.back(), l.total);
  EXPECT_EQ(flat_layout({}).total, 0);
  EXPECT_EQ(flat_layout({5, 5}, 1).offset, (std::vector<int64_t>{0, 5}));
}

TEST(DeviceLayout, ChunksCoverEveryElementOnce) {
  const std::vector<int64_t> numel = {10, 0, 25, 8, 1};
  const std::vector<TensorChunk> chunks = tensor_chunks(numel, 8);
  std::vector<std::vector<int>> seen(numel.size());
  for (size_t t = 0; t < numel.size(); ++t) seen[t].assign(size_t(numel[t]), 0);
  for (const TensorChunk& c : chunks) {
    ASSERT_GE(c.tensor, 0);
    ASSERT_LT(c.tensor, int64_t(numel.size()));
    EXPECT_GT(c.n, 0);
    EXPECT_LE(c.n, 8);
    for (int64_t e = c.begin; e < c.begin + c.n; ++e) ++seen[size_t(c.tensor)].at(size_t(e));
  }
  for (size_t t = 0; t < numel.size(); ++t)
    for (size_t e = 0; e < seen[t].size(); ++e) EXPECT_EQ(seen[t][e], 1) << "tensor " << t << " element " << e;
  // 2 + 0 + 4 + 1 + 1 pieces, in tensor order.
  ASSERT_EQ(chunks.size(), 8u);
  EXPECT_EQ(chunks[2].tensor, 2);
  EXPECT_EQ(chunks[5].begin, 24);
  EXPECT_EQ(chunks[5].n, 1);
}

// What the trainer plans for the device state is what a DeviceStep allocates: 18 bytes an
// element of the flat layout (4 master + 4 gradient sum + 4 + 4 moments + 2 bf16 copy) and
// the small tables, for a real model's tensors (Llama 3.2 1B: 16 layers, GQA, tied head).
TEST(DeviceLayout, StateBytesAreEighteenAParameterPlusTables) {
  const models::LlamaConfig m =
      models::load_llama_config(testing::source_path("bench/models/llama-3.2-1b/config.json"));
  std::vector<int64_t> sizes;
  for (const auto& spec : models::llama_parameters(m)) sizes.push_back(numel(spec.shape));
  const FlatLayout l = flat_layout(sizes);
  int64_t params = 0;
  for (int64_t n : sizes) params += n;
  EXPECT_EQ(params, models::llama_num_parameters(m));
  // Every Llama tensor is a multiple of 128 elements here: no padding at all.
  EXPECT_EQ(l.total, params);
  const int64_t chunks = int64_t(tensor_chunks(sizes, kGradChunkElements).size());
  EXPECT_EQ(device_state_bytes(sizes), 18 * params + 8 * kDeviceNormPartials + 64 + 24 * chunks);
  EXPECT_NEAR(double(device_state_bytes(sizes)) / double(params), 18.0, 1e-3);
}

}  // namespace
}  // namespace autosp::train
