// The cuda fused kernels' host rules (kernels/cuda/fused_layout.h): which accesses they
// vectorise, their block shapes, and the scratch the ops' workspace rules give plan_memory.
// Host code that `lower` and plan_memory use on every machine, so it is tested here, without
// a GPU. (What the kernels compute is tests/cuda/cuda_fused_test.cpp's, on a GPU.)
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>

#include "kernels/cuda/fused_layout.h"
#include "ops/op.h"
#include "passes/lower.h"
#include "passes/plan_memory.h"
#include "runtime/executor.h"

namespace autosp {
namespace {

// Fake device addresses: only their alignment matters to vector_width.
const void* at(uintptr_t address) { return reinterpret_cast<const void*>(address); }

TEST(FusedLayout, VectorWidthIs16BytesOnlyForAlignedWholeRows) {
  // 8 bf16 or 4 f32 per access when the row is a whole number of 16-byte vectors.
  EXPECT_EQ(cuda::vector_width(2, 4096, {at(0x1000), at(0x2000)}), 8);
  EXPECT_EQ(cuda::vector_width(4, 4096, {at(0x1000), at(0x2000)}), 4);
  EXPECT_EQ(cuda::vector_width(2, 2048 + 8, {at(0x1000)}), 8);
  EXPECT_EQ(cuda::vector_width(2, 40, {at(0x1000)}), 8);
  EXPECT_EQ(cuda::vector_width(4, 40, {at(0x1000)}), 4);
  // A row that is not a whole number of vectors: row t would start misaligned.
  EXPECT_EQ(cuda::vector_width(2, 1030, {at(0x1000)}), 1);
  EXPECT_EQ(cuda::vector_width(4, 1030, {at(0x1000)}), 1);
  EXPECT_EQ(cuda::vector_width(2, 4, {at(0x1000)}), 1);  // rope's half of D = 8 in bf16
  EXPECT_EQ(cuda::vector_width(4, 4, {at(0x1000)}), 4);
  // Any operand off a 16-byte boundary (e.g. a view one element in) falls back for all.
  EXPECT_EQ(cuda::vector_width(2, 4096, {at(0x1000), at(0x2002)}), 1);
  EXPECT_EQ(cuda::vector_width(4, 4096, {at(0x1008), at(0x2000)}), 1);
  EXPECT_EQ(cuda::vector_width(2, 4096, {}), 8);
}

TEST(FusedLayout, FlatVectorWidthLeavesTheTailToTheKernel) {
  EXPECT_EQ(cuda::flat_vector_width(2, {at(0x100), at(0x200), at(0x300)}), 8);
  EXPECT_EQ(cuda::flat_vector_width(4, {at(0x100)}), 4);
  EXPECT_EQ(cuda::flat_vector_width(2, {at(0x100), at(0x202)}), 1);
  EXPECT_TRUE(cuda::is_aligned(at(0x108), 8));
  EXPECT_FALSE(cuda::is_aligned(at(0x108), 16));
}

TEST(FusedLayout, RowThreadsAreWholeWarpsFromOneWarpToTheCap) {
  EXPECT_EQ(cuda::row_threads(0), 32);
  EXPECT_EQ(cuda::row_threads(1), 32);
  EXPECT_EQ(cuda::row_threads(5), 32);    // H = 40 bf16: one warp
  EXPECT_EQ(cuda::row_threads(33), 64);
  EXPECT_EQ(cuda::row_threads(257), 256);  // H = 2048 + 8 bf16: 257 vectors, 256 threads
  EXPECT_EQ(cuda::row_threads(512), cuda::kRowThreads);
  for (int64_t items = 0; items < 2000; items += 7) {
    const int t = cuda::row_threads(items);
    EXPECT_EQ(t % 32, 0) << items;
    EXPECT_LE(t, cuda::kRowThreads) << items;
    EXPECT_TRUE(t >= items || t == cuda::kRowThreads) << items;
  }
}

TEST(FusedLayout, RmsNormBackwardScratchIsOneRowOfColumnSumsPerBlock) {
  EXPECT_EQ(cuda::rms_norm_backward_blocks(0), 0);
  EXPECT_EQ(cuda::rms_norm_backward_blocks(7), 7);
  EXPECT_EQ(cuda::rms_norm_backward_blocks(cuda::kRmsNormBackwardMaxBlocks + 1), cuda::kRmsNormBackwardMaxBlocks);
  EXPECT_EQ(cuda::rms_norm_backward_workspace_bytes(5, 8), 4 * 5 * 8);
  EXPECT_EQ(cuda::rms_norm_backward_workspace_bytes(4096, 2048), 4 * 512 * 2048);
  EXPECT_EQ(cuda::rms_norm_backward_workspace_bytes(0, 2048), 0);
  // A block's column sums in shared memory stay under the 48 KiB a block gets by default
  // (the kernel also takes 128 bytes of static shared memory for its block sums).
  EXPECT_LE(4 * cuda::kRmsNormSharedMaxH + 128, 48 * 1024);
  EXPECT_EQ(cuda::embedding_backward_workspace_bytes(true, 11, 8), 0);
  EXPECT_EQ(cuda::embedding_backward_workspace_bytes(false, 11, 8), 4 * 11 * 8);
}

// What lower binds for the fused ops on cuda, and that the workspace it records (which
// plan_memory places) is the fused kernels' own size rule, for both dtypes.
TEST(FusedLayout, OpsBindTheFusedKernelsWithTheirWorkspace) {
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t B = 3, S = 7, H = 40, V = 11, NH = 2, D = 8, T = B * S;
    Graph g;
    const ValueId x = g.add_input(Role::parameter, {dt, {B, S, H}}, "x");
    const ValueId w = g.add_input(Role::parameter, {dt, {H}}, "w");
    const ValueId dy = g.add_input(Role::constant, {dt, {B, S, H}}, "dy");
    const ValueId table = g.add_input(Role::parameter, {dt, {V, H}}, "table");
    const ValueId tokens = g.add_input(Role::tokens, {DType::i32, {B, S}}, "tokens");
    const ValueId q = g.add_input(Role::constant, {dt, {B, S, NH, D}}, "q");
    const ValueId pos = g.add_input(Role::constant, {DType::i32, {B, S}}, "pos");
    GraphBuilder b(g);
    const auto f = b.emit(OpKind::rms_norm, {x, w}, {{"eps", 1e-5}});
    const auto d = b.emit(OpKind::rms_norm_backward, {dy, x, w, f[1]});
    const ValueId e = b.emit1(OpKind::embedding, {table, tokens});
    const ValueId de = b.emit1(OpKind::embedding_backward, {dy, tokens}, {{"vocab", V}});
    const ValueId r = b.emit1(OpKind::rope, {q, pos}, {{"theta", 10000.0}});
    const ValueId s = b.emit1(OpKind::swiglu, {x, dy});
    const auto ds = b.emit(OpKind::swiglu_backward, {dy, x, dy});
    for (ValueId v : {f[0], d[0], d[1], e, de, r, s, ds[0], ds[1]}) g.add_output(str("y", v), v);
    const Graph lowered = lower(g, {.backend = Backend::cuda, .threads = 1});
    const MemoryPlan plan = read_memory_plan(executable_graph(g, Backend::cuda, 1));
    std::map<std::string, int64_t> workspace;
    for (NodeId n = 0; n < NodeId(lowered.nodes().size()); ++n) {
      const Node& node = lowered.node(n);
      if (node.op == OpKind::input) continue;
      const KernelBinding k = lowered_binding(node);
      workspace[k.kernel] = k.workspace_bytes;
      EXPECT_GE(plan.workspace_bytes.at(n), k.workspace_bytes) << k.kernel;
    }
    const std::map<std::string, int64_t> want = {
        {"cuda.rms_norm_fused", 0},
        {"cuda.rms_norm_backward_fused", cuda::rms_norm_backward_workspace_bytes(T, H)},
        {"cuda.embedding_fused", 0},
        {"cuda.embedding_backward_fused", dt == DType::f32 ? 0 : 4 * V * H},
        {"cuda.rope_fused", 0},
        {"cuda.swiglu_fused", 0},
        {"cuda.swiglu_backward_fused", 0},
    };
    EXPECT_EQ(workspace, want);
    EXPECT_EQ(cuda::rms_norm_backward_workspace_bytes(T, H), 4 * T * H) << "T < 512: one block per row";
  }
}

// In place only where the fused kernel reads element i of every operand before writing it
// (the same thread): swiglu, its backward and rope; never the row kernels whose second pass
// reads x again (rms_norm) or the gather (embedding).
TEST(FusedLayout, InPlaceRulesOfTheFusedKernels) {
  EXPECT_TRUE(op_def(OpKind::swiglu).cuda.inplace);
  EXPECT_TRUE(op_def(OpKind::swiglu_backward).cuda.inplace);
  EXPECT_TRUE(op_def(OpKind::rope).cuda.inplace);
  EXPECT_FALSE(op_def(OpKind::rms_norm).cuda.inplace);
  EXPECT_FALSE(op_def(OpKind::rms_norm_backward).cuda.inplace);
  EXPECT_FALSE(op_def(OpKind::embedding).cuda.inplace);
  EXPECT_FALSE(op_def(OpKind::embedding_backward).cuda.inplace);
}

}  // namespace
}  // namespace autosp
