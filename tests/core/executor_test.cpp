// The CPU executor: buffer lifetimes (per node on the heap, or in one planned arena), errors,
// and attention's O(S) memory measured by the allocator's peak.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "frontend/tracer.h"
#include "models/llama.h"
#include "ops/op.h"
#include "passes/autodiff.h"
#include "runtime/executor.h"
#include "testing/gradcheck.h"

namespace autosp {
namespace {

Graph silu_chain() {
  Tracer t;
  Tensor x = t.input(Role::constant, "x", DType::f32, {1000});
  Tensor y = t.silu(t.silu(t.silu(x)));
  t.output("y", y);
  return t.finish();
}

float silu_chain_value() {
  const float s = 1.0f / (1.0f + std::exp(-0.5f));
  float expect = 0.5f * s;
  for (int i = 0; i < 2; ++i) expect = expect / (1.0f + std::exp(-expect));
  return expect;
}

TEST(Executor, HeapModeFreesIntermediatesAndKeepsOutputs) {
  Graph g = silu_chain();
  std::vector<float> xs(1000, 0.5f);
  HeapAllocator alloc;
  {
    CpuExecutor ex(g, alloc, 0, nullptr, BufferMode::heap);
    ex.bind("x", xs.data());
    ex.run();
    // Two 4000-byte buffers at most are live at once: an op's operand and its result.
    EXPECT_EQ(alloc.peak_bytes(), 8000);
    EXPECT_EQ(alloc.live_bytes(), 4000);  // only the output is kept
    EXPECT_NEAR(ex.output("y")[7], silu_chain_value(), 1e-6f);
  }
  EXPECT_EQ(alloc.live_bytes(), 0);
}

TEST(Executor, ArenaModeRunsTheChainInPlaceInOneAllocation) {
  Graph g = silu_chain();
  std::vector<float> xs(1000, 0.5f);
  HeapAllocator alloc;
  {
    CpuExecutor ex(g, alloc);
    // Each silu's operand dies at it, so all three share one buffer (rounded to 64 bytes),
    // allocated when the executor is made and held across runs.
    EXPECT_EQ(ex.arena_bytes(), 4032);
    EXPECT_EQ(alloc.live_bytes(), 4032);
    ex.bind("x", xs.data());
    ex.run();
    ex.run();
    EXPECT_EQ(alloc.peak_bytes(), 4032);
    EXPECT_NEAR(ex.output("y")[7], silu_chain_value(), 1e-6f);
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
  for (BufferMode mode : {BufferMode::heap, BufferMode::arena}) {
    HeapAllocator alloc;
    CpuExecutor ex(g, alloc, 0, nullptr, mode);
    ex.bind("w", ws.data());
    ex.bind("tokens", toks.data());
    try {
      ex.run();
      FAIL() << "token 5 of a 5-row table was accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("token id 5 at position 2 is outside [0, 5)"),
                std::string::npos) << e.what();
    }
    // Nothing but the arena (0 in heap mode), which the executor holds until destroyed.
    EXPECT_EQ(alloc.live_bytes(), ex.arena_bytes());
  }
}

// The attention kernels skip tiles by the document ids' order, so ids that decrease along
// the sequence (not what packing makes) are refused, naming where, not silently misread.
TEST(Executor, DecreasingDocumentIdsAreAUserError) {
  Tracer t;
  Tensor q = t.input(Role::constant, "q", DType::f32, {1, 4, 1, 2});
  Tensor docs = t.input(Role::documents, "docs", DType::i32, {1, 4});
  t.output("y", t.attention(q, q, q, docs, true, 1.0));
  Graph g = t.finish();
  std::vector<float> qs(8, 0.5f);
  std::vector<int32_t> ids = {0, 1, 1, 0};
  HeapAllocator alloc;
  CpuExecutor ex(g, alloc);
  ex.bind("q", qs.data());
  ex.bind("docs", ids.data());
  try {
    ex.run();
    FAIL() << "decreasing document ids were accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("batch row 0 has 1 then 0 at position 3"), std::string::npos) << e.what();
  }
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
  // position here, and the backward's per-thread head copies (dq, q, dout: 3 x D floats) 0.4 kB
  // per thread; a kernel that materialised even 1/16 of the score matrix (4 kB per position)
  // would fail.
  EXPECT_LT(double(large), one_score_matrix / 16);
}

// The forward graph with each linear_cross_entropy replaced by linear then cross_entropy:
// the LM head as llama_forward traced it before the fused op.
Graph unfuse_linear_cross_entropy(const Graph& fused) {
  Graph g;
  GraphBuilder b(g);
  std::vector<ValueId> map(fused.values().size(), -1);
  for (const Node& n : fused.nodes()) {
    if (n.op == OpKind::input) {
      const ValueId v = n.outputs[0];
      map[v] = g.add_input(fused.role(v), fused.type(v), fused.value(v).name);
      continue;
    }
    std::vector<ValueId> ins;
    for (ValueId v : n.inputs) ins.push_back(map[v]);
    std::vector<ValueId> outs;
    if (n.op == OpKind::linear_cross_entropy) {
      ValueId logits = b.emit1(OpKind::linear, {ins[0], ins[1]});
      outs = b.emit(OpKind::cross_entropy, {logits, ins[2]},
                    {{"ignore_index", n.attrs.get_int("ignore_index")}});
    } else {
      outs = b.emit(n.op, ins, n.attrs);
    }
    for (size_t i = 0; i < outs.size(); ++i) map[n.outputs[i]] = outs[i];
  }
  for (const GraphOutput& o : fused.outputs()) g.add_output(o.name, map[o.value]);
  return g;
}

struct StepPeak {
  int64_t peak_bytes;
  float loss;
};

// Allocator peak of one training step (the joint graph) of a 1-layer Llama with a large
// vocabulary; parameters and inputs are bound (caller memory), so what is counted is
// activations, gradients and kernel workspaces.
StepPeak llama_step_peak(const Graph& forward) {
  Graph joint = autodiff(forward);
  testing::Feed feed;
  const int64_t n = numel(forward.shape(forward.find_input("input_ids")));
  const int64_t V = forward.shape(forward.find_input("model.embed_tokens.weight"))[0];
  for (int64_t i = 0; i < n; ++i) {
    feed.i["input_ids"].push_back(int32_t(i * 7919 % V));
    feed.i["labels"].push_back(i % 10 == 9 ? -100 : int32_t(i * 104729 % V));
    feed.i["position_ids"].push_back(int32_t(i));
  }
  for (ValueId p : forward.inputs_with_role(Role::parameter))
    feed.f[forward.value(p).name] = testing::random_normal(numel(forward.shape(p)), 11, 0.02f);
  HeapAllocator alloc;
  CpuExecutor ex(joint, alloc);
  feed.bind(ex, joint);
  ex.run();
  return {alloc.peak_bytes(), ex.output("loss")[0]};
}

TEST(Executor, FusedLinearCrossEntropyLowersTheTrainingPeak) {
  models::LlamaConfig c;
  c.vocab_size = 32000;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.head_dim = 16;
  // S = 1024: 2 chunks of the default 524 rows (64 MiB of logits at V = 32000).
  const int64_t S = 1024;
  Graph fused = models::llama_forward(c, {.batch = 1, .seq_len = S});
  int lce = 0;
  for (const Node& n : fused.nodes()) lce += n.op == OpKind::linear_cross_entropy;
  ASSERT_EQ(lce, 1) << "llama_forward's training graph should use the fused head";
  const StepPeak f = llama_step_peak(fused);
  const StepPeak u = llama_step_peak(unfuse_linear_cross_entropy(fused));
  const double logits_bytes = double(S) * double(c.vocab_size) * 4;
  std::printf("joint graph peak, V=%lld H=%lld S=%lld: fused %lld bytes, unfused %lld bytes "
              "(%.2fx); one [S, V] fp32 logits is %.0f bytes; loss fused %.8g, unfused %.8g\n",
              (long long)c.vocab_size, (long long)c.hidden_size, (long long)S,
              (long long)f.peak_bytes, (long long)u.peak_bytes,
              double(u.peak_bytes) / double(f.peak_bytes), logits_bytes, f.loss, u.loss);
  // Unfused, logits and dlogits are live together; fused, only one chunk's logits (about
  // half of them here) plus the ~13 MB the rest of the step needs (two [V, H] gradients).
  EXPECT_GE(double(u.peak_bytes), 2 * logits_bytes);
  EXPECT_LT(double(f.peak_bytes), logits_bytes);
  // Same loss, up to fp32 reordering (lse summation and gemm blocking).
  EXPECT_NEAR(f.loss, u.loss, 1e-5 * std::abs(u.loss));
}

}  // namespace
}  // namespace autosp
