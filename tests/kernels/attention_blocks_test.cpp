// The cuda attention's block sizing and scratch layout (kernels/cuda/attention_blocks.h):
// host code that `lower` and plan_memory use on every machine, so it is tested here, without
// a GPU. (What the blocks compute is tests/cuda/cuda_ops_test.cpp's, on a GPU.)
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "kernels/cuda/attention_blocks.h"

namespace autosp {
namespace {

using cuda::attention_block_layout;
using cuda::attention_block_rows;

struct Dims {
  int64_t B, S, NH, NKV, D, elem;
};

TEST(AttentionBlocks, RowsArePowersOfTwoWithinBothBounds) {
  for (const Dims d : {Dims{1, 4096, 32, 8, 64, 2}, Dims{1, 2048, 8, 2, 32, 4}, Dims{2, 150, 4, 2, 16, 4},
                       Dims{1, 1 << 20, 32, 8, 128, 2}, Dims{1, 9, 2, 1, 4, 4}, Dims{1, 5, 2, 1, 4, 4}}) {
    SCOPED_TRACE(testing::Message() << "S " << d.S << ", NH " << d.NH << ", D " << d.D << ", elem " << d.elem);
    const int64_t rows = attention_block_rows(d.B, d.S, d.NH, d.NKV, d.D, d.elem);
    ASSERT_GE(rows, 1);
    EXPECT_LE(rows, d.S);
    if (d.S >= 16) {
      EXPECT_GE(rows, 16) << "a block smaller than 16 rows only on a shorter sequence";
    }
    if (rows < d.S) {
      EXPECT_EQ(rows & (rows - 1), 0) << "a power of two";
    }
    // The backward's score buffers of one block: within 64 MiB and 4x the bytes of q, unless
    // the smallest block (16 rows) already exceeds them.
    const int64_t G = d.NH / d.NKV, scores = G * rows * d.S * (8 + 2 * d.elem);
    if (rows > 16) {
      EXPECT_LE(scores, cuda::kAttentionBlockBytes);
      EXPECT_LE(scores, cuda::kAttentionBlockPerQ * d.B * d.S * d.NH * d.D * d.elem);
    }
    // The next power of two would not fit (or would pass S).
    if (rows < d.S && rows >= 16) {
      const int64_t twice = 2 * scores;
      EXPECT_TRUE(twice > cuda::kAttentionBlockBytes ||
                  twice > cuda::kAttentionBlockPerQ * d.B * d.S * d.NH * d.D * d.elem);
    }
  }
  // Which bound binds, by hand (G x rows x S x 12 bytes in bf16, x 16 in f32):
  // Llama 3.2 1B in bf16 (G 4, D 64): at S 4096 both bounds are 64 MiB: 256 rows (50 MB);
  // at S 16384 64 MiB binds (4x q is 256 MiB): 64 rows (50 MB; 128 would be 101 MB).
  EXPECT_EQ(attention_block_rows(1, 4096, 32, 8, 64, 2), 256);
  EXPECT_EQ(attention_block_rows(1, 16384, 32, 8, 64, 2), 64);
  // The CPU bench's model in f32 (G 4, D 32) at S 2048: 4x q (8 MiB) binds: 64 rows (exactly
  // 8 MiB; 128 would be 16 MiB).
  EXPECT_EQ(attention_block_rows(1, 2048, 8, 2, 32, 4), 64);
}

TEST(AttentionBlocks, LayoutPiecesAreAlignedAndDisjoint) {
  for (bool backward : {false, true}) {
    SCOPED_TRACE(backward ? "backward" : "forward");
    const int64_t B = 2, S = 300, NH = 4, NKV = 2, D = 40, elem = 2, rows = 64, G = NH / NKV;
    const cuda::AttentionBlockLayout l = attention_block_layout(backward, B, S, NH, NKV, D, elem, rows);
    EXPECT_EQ(l.rows, rows);
    std::vector<std::pair<int64_t, int64_t>> pieces;  // [offset, offset + bytes)
    auto piece = [&](int64_t offset, int64_t bytes, bool used) {
      if (!used) {
        EXPECT_EQ(offset, -1);
        return;
      }
      ASSERT_GE(offset, 0);
      EXPECT_EQ(offset % 256, 0) << "pieces start at 256-byte boundaries";
      EXPECT_LE(offset + bytes, l.bytes);
      pieces.emplace_back(offset, offset + bytes);
    };
    const int64_t cells = G * rows * S;
    piece(l.delta, 4 * B * NH * S, backward);
    piece(l.scores, 4 * cells, true);
    piece(l.dprobs, 4 * cells, backward);
    piece(l.probs, elem * cells, true);
    piece(l.dscores, elem * cells, backward);
    piece(l.dk, 4 * S * D, backward);
    piece(l.dv, 4 * S * D, backward);
    std::sort(pieces.begin(), pieces.end());
    for (size_t i = 1; i < pieces.size(); ++i) EXPECT_LE(pieces[i - 1].second, pieces[i].first) << "piece " << i;
    EXPECT_EQ(l.bytes % 256, 0);
  }
  // The default block is the sizing rule's.
  EXPECT_EQ(attention_block_layout(true, 1, 4096, 32, 8, 64, 2).rows, attention_block_rows(1, 4096, 32, 8, 64, 2));
}

}  // namespace
}  // namespace autosp
