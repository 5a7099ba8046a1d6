// The CPU executor: buffer lifetimes, errors, and attention's O(S) memory measured by the
// allocator's peak.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "frontend/tracer.h"
#include "ops/op.h"
#include "passes/autodiff.h"
#include "runtime/executor.h"
#include "testing/gradcheck.h"

namespace autosp {
namespace {

TEST(Executor, FreesIntermediatesAndKeepsOutputs) {
  Tracer t;
  Tensor x = t.input(Role::constant, "x", DType::f32, {1000});
  Tensor y = t.silu(t.silu(t.silu(x)));
  t.output("y", y);
  Graph g = t.finish();
  std::vector<float> xs(1000, 0.5f);
  HeapAllocator alloc;
  {
    CpuExecutor ex(g, alloc);
    ex.bind("x", xs.data());
    ex.run();
    // Two 4000-byte buffers at most are live at once: an op's operand and its result.
    EXPECT_EQ(alloc.peak_bytes(), 8000);
    EXPECT_EQ(alloc.live_bytes(), 4000);  // only the output is kept
    const float s = 1.0f / (1.0f + std::exp(-0.5f));
    float expect = 0.5f * s;
    for (int i = 0; i < 2; ++i) expect = expect / (1.0f + std::exp(-expect));
    EXPECT_NEAR(ex.output("y")[7], expect, 1e-6f);
  }
  EXPECT_EQ(alloc.live_bytes(), 0);
}

TEST(Executor, OutOfRangeTokenIsAUserErrorAndLeaksNothing) {
  Tracer t;
  Tensor w = t.input(Role::parameter, "w", DType::f32, {5, 3});
  Tensor tok = t.input(Role::tokens, "tokens", DType::i32, {4});
  t.output("y", t.silu(t.embedding(w, tok)));
  Graph g = t.finish();
  std::vector<float> ws(15, 1.0f);
  std::vector<int32_t> toks = {0, 1, 5, 2};
  HeapAllocator alloc;
  CpuExecutor ex(g, alloc);
  ex.bind("w", ws.data());
  ex.bind("tokens", toks.data());
  try {
    ex.run();
    FAIL() << "token 5 of a 5-row table was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("token id 5 at position 2 is outside [0, 5)"),
              std::string::npos) << e.what();
  }
  EXPECT_EQ(alloc.live_bytes(), 0);
}

// Peak bytes the allocator sees for attention forward + backward at sequence length S.
// q, k, v and dout are bound (caller memory); counted are out, lse, dq, dk, dv and the
// kernels' workspace.
int64_t attention_fwd_bwd_peak(int64_t S) {
  const int64_t B = 1, NH = 2, NKV = 1, D = 32;
  Graph g;
  GraphBuilder b(g);
  ValueId q = g.add_input(Role::constant, {DType::f32, {B, S, NH, D}}, "q");
  ValueId k = g.add_input(Role::constant, {DType::f32, {B, S, NKV, D}}, "k");
  ValueId v = g.add_input(Role::constant, {DType::f32, {B, S, NKV, D}}, "v");
  ValueId dout = g.add_input(Role::constant, {DType::f32, {B, S, NH, D}}, "dout");
  Attrs attrs{{"causal", int64_t{1}}, {"scale", 1.0 / std::sqrt(double(D))}};
  auto fwd = b.emit(OpKind::attention, {q, k, v}, attrs);
  auto bwd = b.emit(OpKind::attention_backward, {dout, q, k, v, fwd[0], fwd[1]}, attrs);
  g.add_output("dq", bwd[0]);
  g.add_output("dk", bwd[1]);
  g.add_output("dv", bwd[2]);
  testing::Feed feed;
  for (const char* name : {"q", "k", "v", "dout"})
    feed.f[name] = testing::random_normal(numel(g.shape(g.find_input(name))), 5);
  HeapAllocator alloc;
  CpuExecutor ex(g, alloc);
  feed.bind(ex, g);
  ex.run();
  for (float x : ex.output_vector("dq")) EXPECT_TRUE(std::isfinite(x));
  return alloc.peak_bytes();
}

TEST(Executor, AttentionForwardBackwardMemoryIsLinearInS) {
  const int64_t small = attention_fwd_bwd_peak(4096), large = attention_fwd_bwd_peak(16384);
  const double one_score_matrix = 16384.0 * 16384.0 * 4;
  std::printf("attention fwd+bwd peak: S=4096 %lld bytes, S=16384 %lld bytes (%.1f bytes per "
              "position); one S x S fp32 matrix at S=16384 is %.0f bytes\n",
              (long long)small, (long long)large, double(large) / 16384, one_score_matrix);
  // Linear: 4x the sequence, at most 4x the bytes (plus a little for fixed tile scratch).
  EXPECT_LE(double(large), 4.0 * double(small) * 1.02);
  // And far from quadratic: the outputs themselves (out, lse, dq, dk, dv) are ~1.2 kB per
  // position here; a kernel that materialised even 1/32 of the score matrix would fail.
  EXPECT_LT(double(large), one_score_matrix / 32);
}

}  // namespace
}  // namespace autosp
