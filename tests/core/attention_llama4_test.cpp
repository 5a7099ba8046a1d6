// Llama 4's attention options on the attention op (kernels/cpu/attention_llama4.h): chunked
// attention, taken by the kernels as document ids, and the temperature tuning of the queries.
// The op (forward and backward through the CPU executor) against the double reference given
// its own mask, written here as (document, chunk) pairs, and its own tempered queries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <vector>

#include "ir/graph.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_llama4.h"
#include "runtime/allocator.h"
#include "runtime/executor.h"
#include "testing/gradcheck.h"

namespace autosp {
namespace {

using cpu::AttentionDims;

// Row b's documents: lengths in turn, then one document of the rest.
std::vector<int32_t> documents_of(int64_t B, int64_t S, const std::vector<int64_t>& lengths) {
  std::vector<int32_t> ids;
  for (int64_t b = 0; b < B; ++b) {
    int64_t i = 0;
    int32_t doc = 10 * int32_t(b);  // (ids need not start at 0)
    for (int64_t len : lengths) {
      for (int64_t e = 0; e < len && i < S; ++e, ++i) ids.push_back(doc);
      ++doc;
    }
    for (; i < S; ++i) ids.push_back(doc);
  }
  return ids;
}

// Every position's chunk run id, against the pair (document, chunk) it stands for: non-decreasing
// along each row, and two positions equal exactly when they share both.
TEST(AttentionLlama4, ChunkIdsAreTheDocumentAndChunkPairs) {
  const int64_t B = 2, S = 75;
  for (int64_t chunk : {1, 4, 16, 64, 100})
    for (bool docs : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "chunk=" << chunk << " documents=" << docs);
      const std::vector<int32_t> ids = documents_of(B, S, {1, 3, 20, 17, 2});
      std::vector<int32_t> runs(B * S);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < S; ++i)
          runs[b * S + i] = attention_llama4::chunk_document_id(docs ? ids.data() + b * S : nullptr, i, chunk);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < S; ++i) {
          if (i > 0) EXPECT_LE(runs[b * S + i - 1], runs[b * S + i]);
          for (int64_t j = 0; j < S; ++j) {
            const bool same = i / chunk == j / chunk && (!docs || ids[b * S + i] == ids[b * S + j]);
            ASSERT_EQ(runs[b * S + i] == runs[b * S + j], same) << "b=" << b << " i=" << i << " j=" << j;
          }
        }
    }
}

// transformers' factors: log1p(floor((i + 1) / F)) A + 1, 1 below position F - 1.
TEST(AttentionLlama4, TemperatureIsTransformersFactor) {
  EXPECT_EQ(attention_llama4::temperature(0, 8192.0f, 0.1f), 1.0f);
  EXPECT_EQ(attention_llama4::temperature(8190, 8192.0f, 0.1f), 1.0f);
  EXPECT_NEAR(attention_llama4::temperature(8191, 8192.0f, 0.1f), 1.0 + 0.1 * std::log(2.0), 1e-6);
  EXPECT_NEAR(attention_llama4::temperature(3 * 8192 + 5, 8192.0f, 0.1f), 1.0 + 0.1 * std::log(4.0), 1e-6);
}

struct Case {
  int64_t S, chunk, window;
  bool docs, tempered;
};

struct Result {
  std::vector<float> out, lse, dq, dk, dv;
};

// The op, forward and backward, through the CPU executor.
Result run_op(const AttentionDims& d, const Case& c, const std::vector<double>& temperature,
              const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
              const std::vector<float>& dout, const std::vector<int32_t>& docs) {
  Graph g;
  GraphBuilder b(g);
  std::vector<ValueId> in = {g.add_input(Role::constant, {DType::f32, {d.B, d.S, d.NH, d.D}}, "q"),
                             g.add_input(Role::constant, {DType::f32, {d.B, d.S, d.NKV, d.D}}, "k"),
                             g.add_input(Role::constant, {DType::f32, {d.B, d.S, d.NKV, d.D}}, "v")};
  const ValueId dy = g.add_input(Role::constant, {DType::f32, {d.B, d.S, d.NH, d.D}}, "dout");
  if (c.docs) in.push_back(g.add_input(Role::documents, {DType::i32, {d.B, d.S}}, "documents"));
  Attrs attrs{{"causal", int64_t{1}}, {"scale", 1.0 / std::sqrt(double(d.D))}};
  if (c.chunk) attrs.set("chunk", c.chunk);
  if (c.window) attrs.set("window", c.window);
  if (c.tempered) attrs.set("temperature", temperature);
  auto fwd = b.emit(OpKind::attention, in, attrs);
  std::vector<ValueId> bin = {dy, in[0], in[1], in[2], fwd[0], fwd[1]};
  if (c.docs) bin.push_back(in[3]);
  auto bwd = b.emit(OpKind::attention_backward, bin, attrs);
  g.add_output("out", fwd[0]);
  g.add_output("lse", fwd[1]);
  g.add_output("dq", bwd[0]);
  g.add_output("dk", bwd[1]);
  g.add_output("dv", bwd[2]);
  testing::Feed feed;
  feed.f["q"] = q, feed.f["k"] = k, feed.f["v"] = v, feed.f["dout"] = dout;
  if (c.docs) feed.i["documents"] = docs;
  HeapAllocator alloc;
  CpuExecutor ex(g, alloc);
  feed.bind(ex, g);
  ex.run();
  return {ex.output_vector("out"), ex.output_vector("lse"), ex.output_vector("dq"), ex.output_vector("dk"),
          ex.output_vector("dv")};
}

double max_error(const std::vector<float>& x, const std::vector<double>& ref) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err = std::max(err, std::abs(double(x[i]) - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return err / std::max(scale, 1e-12);
}

// S = 70 spans the kernels' 64-row tiles; chunks of 3 (inside tiles), 16 and 64 (on a tile's
// edge), alone and with documents, a window and the temperature (F 4, A 0.5: factors up to 2.5,
// so that a missing or misplaced factor shows).
TEST(AttentionLlama4, OpMatchesDoubleReference) {
  const AttentionDims d{2, 70, 4, 2, 8};
  const std::vector<double> temperature = {4.0, 0.5};
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  auto draw = [&](int64_t n) {
    std::vector<float> x(n);
    for (float& e : x) e = u(gen);
    return x;
  };
  const std::vector<float> q = draw(d.B * d.S * d.NH * d.D), k = draw(d.B * d.S * d.NKV * d.D),
                           v = draw(d.B * d.S * d.NKV * d.D), dout = draw(d.B * d.S * d.NH * d.D);
  const std::vector<int32_t> docs = documents_of(d.B, d.S, {5, 30, 1, 9});
  for (const Case& c : {Case{70, 3, 0, false, false}, Case{70, 16, 0, false, false}, Case{70, 64, 0, true, false},
                        Case{70, 16, 5, true, false}, Case{70, 0, 0, false, true}, Case{70, 16, 0, true, true},
                        Case{70, 3, 0, false, true}}) {
    SCOPED_TRACE(::testing::Message() << "chunk=" << c.chunk << " window=" << c.window << " docs=" << c.docs
                                    << " tempered=" << c.tempered);
    const Result r = run_op(d, c, temperature, q, k, v, dout, docs);
    // The reference's mask: one id per (document, chunk) pair.
    std::vector<int32_t> pairs(d.B * d.S);
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t i = 0; i < d.S; ++i)
        pairs[b * d.S + i] = (c.docs ? docs[b * d.S + i] : 0) * 1000 + int32_t(c.chunk ? i / c.chunk : 0);
    // Its queries: tempered in double by transformers' f32 factors.
    std::vector<double> qd(q.begin(), q.end()), f(d.S, 1.0);
    if (c.tempered)
      for (int64_t i = 0; i < d.S; ++i) f[i] = std::log1p(std::floor((float(i) + 1.0f) / 4.0f)) * 0.5 + 1.0;
    for (size_t e = 0; e < qd.size(); ++e) qd[e] *= f[e / (d.NH * d.D) % d.S];
    const std::vector<double> kd(k.begin(), k.end()), vd(v.begin(), v.end()), dod(dout.begin(), dout.end());
    std::vector<double> out(dout.size()), lse(d.B * d.NH * d.S), dq(q.size()), dk(k.size()), dv(v.size());
    const double scale = 1.0 / std::sqrt(double(d.D));
    cpu::attention_forward_reference(d, true, scale, qd.data(), kd.data(), vd.data(), out.data(), lse.data(),
                                     pairs.data(), c.window);
    cpu::attention_backward_reference(d, true, scale, qd.data(), kd.data(), vd.data(), dod.data(), dq.data(),
                                      dk.data(), dv.data(), pairs.data(), c.window);
    for (size_t e = 0; e < dq.size(); ++e) dq[e] *= f[e / (d.NH * d.D) % d.S];
    EXPECT_LT(max_error(r.out, out), 1e-5);
    EXPECT_LT(max_error(r.lse, lse), 1e-5);
    EXPECT_LT(max_error(r.dq, dq), 1e-5);
    EXPECT_LT(max_error(r.dk, dk), 1e-5);
    EXPECT_LT(max_error(r.dv, dv), 1e-5);
  }
}

// A chunk as long as the sequence or longer is no chunk: the same bits.
TEST(AttentionLlama4, AChunkOfTheWholeSequenceChangesNothing) {
  const AttentionDims d{1, 70, 2, 1, 8};
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  std::vector<float> q(d.S * d.NH * d.D), k(d.S * d.D), v(d.S * d.D), dout(q.size());
  for (auto* x : {&q, &k, &v, &dout})
    for (float& e : *x) e = u(gen);
  const Result plain = run_op(d, {70, 0, 0, false, false}, {}, q, k, v, dout, {});
  for (int64_t chunk : {70, 500}) {
    const Result chunked = run_op(d, {70, chunk, 0, false, false}, {}, q, k, v, dout, {});
    EXPECT_EQ(chunked.out, plain.out);
    EXPECT_EQ(chunked.dq, plain.dq);
    EXPECT_EQ(chunked.dk, plain.dk);
  }
}

// Finite differences through autodiff: chunks with documents, and the temperature.
TEST(AttentionLlama4, GradientsMatchFiniteDifferences) {
  for (bool tempered : {false, true}) {
    SCOPED_TRACE(tempered ? "tempered" : "chunked");
    const int64_t B = 2, S = 9, NH = 2, NKV = 1, D = 4;
    Graph g;
    GraphBuilder b(g);
    std::vector<ValueId> in = {g.add_input(Role::parameter, {DType::f32, {B, S, NH, D}}, "q"),
                               g.add_input(Role::parameter, {DType::f32, {B, S, NKV, D}}, "k"),
                               g.add_input(Role::parameter, {DType::f32, {B, S, NKV, D}}, "v"),
                               g.add_input(Role::documents, {DType::i32, {B, S}}, "documents")};
    Attrs attrs{{"causal", int64_t{1}}, {"scale", 0.5}, {"chunk", int64_t{4}}};
    if (tempered) attrs.set("temperature", std::vector<double>{2.0, 0.7});
    g.add_output("y0", b.emit(OpKind::attention, in, attrs)[0]);
    testing::Feed feed;
    feed.i["documents"] = {0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1};
    testing::check_gradients(g, feed);
  }
}

}  // namespace
}  // namespace autosp
