// The host logic of the cuda backend's cuDNN attention (kernels/cuda/cudnn_attention.h): the THD
// layout of packed documents, the graph cache key, which implementation runs a node, and the
// workspace it plans. All of it runs at compile time or before a launch, without a GPU or cuDNN,
// so it is tested here. (What cuDNN computes with it is tests/cuda/cudnn_attention_test.cpp's,
// on a GPU.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention_llama4.h"
#include "kernels/cuda/attention_blocks.h"
#include "kernels/cuda/cudnn_attention.h"
#include "ops/op.h"
#include "util/error.h"

namespace autosp {
namespace {

using cuda::cudnn_thd_layout;
using cuda::CudnnSdpaKey;
using cuda::CudnnSdpaKeyHash;

// ---- THD layout ---------------------------------------------------------------------------------

// Elements per token in q (NH D = 6), k and v (NKV D = 2), stats (NH = 3).
constexpr int64_t NH = 3, NKV = 1, D = 2;

std::vector<int64_t> times(std::vector<int64_t> tokens, int64_t per_token) {
  for (int64_t& t : tokens) t *= per_token;
  return tokens;
}

TEST(CudnnThdLayout, OneDocumentPerRowIsOneSequencePerRow) {
  const std::vector<int32_t> doc(2 * 5, 0);  // B 2, S 5, every row one document
  const auto l = cudnn_thd_layout(doc.data(), 2, 5, NH, NKV, D, 4);
  EXPECT_EQ(l.documents, 2);
  EXPECT_EQ(l.seq_len, (std::vector<int32_t>{5, 5, 0, 0}));
  const std::vector<int64_t> starts = {0, 5, 10, 10, 10};  // past the last: the end, T = 10
  EXPECT_EQ(l.offset_qo, times(starts, NH * D));
  EXPECT_EQ(l.offset_kv, times(starts, NKV * D));
  EXPECT_EQ(l.offset_stats, times(starts, NH));
}

// Rows with different counts: 2, 1 (a document spanning the whole row) and 4 documents, ids
// jumping by more than one and repeating across rows.
TEST(CudnnThdLayout, RowsWithDifferentDocumentCounts) {
  const std::vector<int32_t> doc = {0, 0, 1, 1, 1,   // row 0: tokens 0-1, 2-4
                                    7, 7, 7, 7, 7,   // row 1: 5-9
                                    2, 3, 4, 4, 9};  // row 2: 10, 11, 12-13, 14
  const auto l = cudnn_thd_layout(doc.data(), 3, 5, NH, NKV, D, 9);
  EXPECT_EQ(l.documents, 7);
  EXPECT_EQ(l.seq_len, (std::vector<int32_t>{2, 3, 5, 1, 1, 2, 1, 0, 0}));
  const std::vector<int64_t> starts = {0, 2, 5, 10, 11, 12, 14, 15, 15, 15};
  EXPECT_EQ(l.offset_qo, times(starts, NH * D));
  EXPECT_EQ(l.offset_kv, times(starts, NKV * D));
  EXPECT_EQ(l.offset_stats, times(starts, NH));
}

// Attention never crosses a batch row: a row that goes on with the previous row's last id
// starts a document of its own.
TEST(CudnnThdLayout, ANewRowStartsANewDocumentWhateverItsId) {
  const std::vector<int32_t> doc = {4, 4, 5, 5, 5, 6};  // B 2, S 3: row 1 starts with row 0's last id
  const auto l = cudnn_thd_layout(doc.data(), 2, 3, NH, NKV, D, 5);
  EXPECT_EQ(l.documents, 4);  // not 3: the 5s of the two rows are two documents
  EXPECT_EQ(l.seq_len, (std::vector<int32_t>{2, 1, 2, 1, 0}));
  EXPECT_EQ(l.offset_stats, times({0, 2, 3, 5, 6, 6}, NH));
}

// More documents than the graph's batch: the count says so (the device flags it as a data
// error), the first max_documents keep their own lengths, and nothing points past the tensors.
TEST(CudnnThdLayout, MoreDocumentsThanTheBoundAreCountedNotLaidOut) {
  const std::vector<int32_t> doc = {0, 1, 1, 2, 3, 3, 3, 4};  // B 1, S 8: 5 documents
  const auto l = cudnn_thd_layout(doc.data(), 1, 8, NH, NKV, D, 3);
  EXPECT_EQ(l.documents, 5);
  EXPECT_EQ(l.seq_len, (std::vector<int32_t>{1, 2, 1}));
  EXPECT_EQ(l.offset_qo, times({0, 1, 3, 8}, NH * D));
  EXPECT_EQ(l.offset_stats, times({0, 1, 3, 8}, NH));
}

TEST(CudnnThdLayout, TheBoundIsPerRowAndAtMostOneDocumentPerToken) {
  EXPECT_EQ(cuda::cudnn_max_documents(2, 5), 10);  // S < the per-row bound: one per token
  EXPECT_EQ(cuda::cudnn_max_documents(1, 4096), cuda::kCudnnDocumentsPerRow);
  EXPECT_EQ(cuda::cudnn_max_documents(3, 4096), 3 * cuda::kCudnnDocumentsPerRow);
  EXPECT_EQ(cuda::cudnn_max_documents(1, cuda::kCudnnDocumentsPerRow + 1), cuda::kCudnnDocumentsPerRow);
}

// Random packings against the definition, token by token: every token lies in exactly one laid-out
// sequence, whose tokens are one row's and one id's, and a sequence is a maximal run (the tokens
// just before and after it are another row's or another id's).
TEST(CudnnThdLayout, RandomPackingsMatchTheDefinition) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t B = 1 + rng() % 4, S = 1 + rng() % 40;
    std::vector<int32_t> doc;
    for (int64_t b = 0; b < B; ++b) {
      int32_t id = static_cast<int32_t>(rng() % 5);
      for (int64_t s = 0; s < S; ++s) {
        if (rng() % 4 == 0) id += 1 + static_cast<int32_t>(rng() % 3);  // non-decreasing
        doc.push_back(id);
      }
    }
    const int64_t max_documents = cuda::cudnn_max_documents(B, S);
    const auto l = cudnn_thd_layout(doc.data(), B, S, NH, NKV, D, max_documents);
    SCOPED_TRACE(testing::Message() << "trial " << trial << ": B " << B << ", S " << S);
    ASSERT_LE(l.documents, max_documents) << "S <= 128: one document per token at most";
    const int64_t T = B * S;
    std::vector<int> covered(static_cast<size_t>(T), 0);
    for (int64_t k = 0; k < max_documents; ++k) {
      const int64_t t0 = l.offset_stats[size_t(k)] / NH, len = l.seq_len[size_t(k)];
      EXPECT_EQ(l.offset_qo[size_t(k)], t0 * NH * D);
      EXPECT_EQ(l.offset_kv[size_t(k)], t0 * NKV * D);
      EXPECT_EQ(l.offset_stats[size_t(k + 1)] / NH - t0, len) << "sequences are packed back to back";
      ASSERT_LE(t0 + len, T);
      EXPECT_EQ(len > 0, k < l.documents);
      if (len == 0) continue;
      EXPECT_LE(len, S);
      for (int64_t t = t0; t < t0 + len; ++t) {
        ++covered[size_t(t)];
        EXPECT_EQ(t / S, t0 / S) << "within one row";
        EXPECT_EQ(doc[size_t(t)], doc[size_t(t0)]) << "of one id";
      }
      EXPECT_TRUE(t0 % S == 0 || doc[size_t(t0 - 1)] != doc[size_t(t0)]) << "maximal at its start";
      const int64_t end = t0 + len;
      EXPECT_TRUE(end % S == 0 || doc[size_t(end)] != doc[size_t(end - 1)]) << "maximal at its end";
    }
    EXPECT_EQ(l.offset_qo.back(), T * NH * D);
    for (int64_t t = 0; t < T; ++t) EXPECT_EQ(covered[size_t(t)], 1) << "token " << t;
  }
}

// ---- the graph cache key ------------------------------------------------------------------------

CudnnSdpaKey base_key() {
  return cuda::cudnn_sdpa_key(false, cuda::Dt::bf16, 2, 300, 8, 2, 64, true, 50, 0.125f, true);
}

TEST(CudnnSdpaKey, EqualKeysHashEqual) {
  EXPECT_EQ(base_key(), base_key());
  EXPECT_EQ(CudnnSdpaKeyHash{}(base_key()), CudnnSdpaKeyHash{}(base_key()));
}

// A change of any field is another graph: each one alone makes the key differ, in == and in
// the hash (a hash that ignored a field would put its graphs in one bucket, and a == that
// ignored it would reuse a wrong graph).
TEST(CudnnSdpaKey, EveryFieldChangesTheKey) {
  const std::vector<std::pair<const char*, void (*)(CudnnSdpaKey&)>> changes = {
      {"backward", [](CudnnSdpaKey& k) { k.backward = true; }},
      {"dtype", [](CudnnSdpaKey& k) { k.dtype = cuda::Dt::f32; }},
      {"B", [](CudnnSdpaKey& k) { k.B = 3; }},
      {"S", [](CudnnSdpaKey& k) { k.S = 301; }},
      {"NH", [](CudnnSdpaKey& k) { k.NH = 16; }},
      {"NKV", [](CudnnSdpaKey& k) { k.NKV = 4; }},
      {"D", [](CudnnSdpaKey& k) { k.D = 128; }},
      {"causal", [](CudnnSdpaKey& k) { k.causal = false; }},
      {"window", [](CudnnSdpaKey& k) { k.window = 51; }},
      {"scale", [](CudnnSdpaKey& k) { k.scale = 0.125f * (1 + 1e-6f); }},
      {"softcap", [](CudnnSdpaKey& k) { k.softcap = 50.0f; }},
      {"documents", [](CudnnSdpaKey& k) { k.documents = false; }},
      {"max_documents", [](CudnnSdpaKey& k) { k.max_documents = 255; }},
      {"device", [](CudnnSdpaKey& k) { k.device = 1; }},
  };
  for (const auto& [field, change] : changes) {
    CudnnSdpaKey k = base_key();
    change(k);
    EXPECT_FALSE(k == base_key()) << field;
    EXPECT_NE(CudnnSdpaKeyHash{}(k), CudnnSdpaKeyHash{}(base_key())) << field;
  }
}

// cudnn_sdpa_key normalises what does not change the attention, so that equal attentions share
// a graph: a window of S or more keeps every causal key (no window); the THD batch follows B, S.
TEST(CudnnSdpaKey, MakerNormalisesTheWindowAndSetsTheThdBatch) {
  auto key = [](int64_t window, bool documents) {
    return cuda::cudnn_sdpa_key(false, cuda::Dt::bf16, 2, 300, 8, 2, 64, true, window, 0.125f, documents);
  };
  EXPECT_EQ(key(300, false), key(0, false));
  EXPECT_EQ(key(5000, false), key(0, false));
  EXPECT_EQ(key(299, false).window, 299);
  EXPECT_EQ(key(0, true).max_documents, 2 * cuda::kCudnnDocumentsPerRow);
  EXPECT_EQ(key(0, false).max_documents, 0);
  // The forward's and the backward's keys of a node differ in `backward` only.
  CudnnSdpaKey b = cuda::cudnn_sdpa_key(true, cuda::Dt::bf16, 2, 300, 8, 2, 64, true, 50, 0.125f, true);
  b.backward = false;
  EXPECT_EQ(b, base_key());
}

// ---- selection ----------------------------------------------------------------------------------

TEST(AttentionSelection, ParsesTheEnvironmentVariable) {
  cuda::AttentionMode m = cuda::AttentionMode::blocks;
  EXPECT_TRUE(cuda::parse_attention_mode(nullptr, &m));
  EXPECT_EQ(m, cuda::AttentionMode::automatic);
  EXPECT_TRUE(cuda::parse_attention_mode("cudnn", &m));
  EXPECT_EQ(m, cuda::AttentionMode::cudnn);
  EXPECT_TRUE(cuda::parse_attention_mode("blocks", &m));
  EXPECT_EQ(m, cuda::AttentionMode::blocks);
  EXPECT_TRUE(cuda::parse_attention_mode("", &m));
  EXPECT_EQ(m, cuda::AttentionMode::automatic);
  EXPECT_TRUE(cuda::parse_attention_mode("auto", &m));
  for (const char* bad : {"cuDNN", "block", "1", "flash"}) {
    m = cuda::AttentionMode::blocks;
    EXPECT_FALSE(cuda::parse_attention_mode(bad, &m)) << bad;
    EXPECT_EQ(m, cuda::AttentionMode::blocks) << bad << " left the mode as it was";
  }
}

CudnnSdpaKey key_of(cuda::Dt dt, int64_t Dh, bool documents) {
  return cuda::cudnn_sdpa_key(false, dt, 1, 512, 8, 2, Dh, true, 0, 0.125f, documents);
}

TEST(AttentionSelection, CudnnTakesBf16WithAHeadDimOfItsKernels) {
  using cuda::AttentionImplementation;
  auto impl = [](const CudnnSdpaKey& k) {
    return cuda::choose_attention(cuda::AttentionMode::automatic, true, k).impl;
  };
  for (int64_t Dh : {8, 64, 72, 128})
    EXPECT_EQ(impl(key_of(cuda::Dt::bf16, Dh, false)), AttentionImplementation::cudnn) << "D " << Dh;
  for (int64_t Dh : {4, 60, 136, 256})  // not a multiple of 8, or past 128
    EXPECT_EQ(impl(key_of(cuda::Dt::bf16, Dh, false)), AttentionImplementation::blocks) << "D " << Dh;
  EXPECT_EQ(impl(key_of(cuda::Dt::f32, 64, false)), AttentionImplementation::blocks);
  // With documents the backward's workspace is bounded by the tokens only for D % 16 == 0.
  EXPECT_EQ(impl(key_of(cuda::Dt::bf16, 64, true)), AttentionImplementation::cudnn);
  EXPECT_EQ(impl(key_of(cuda::Dt::bf16, 72, true)), AttentionImplementation::blocks);
  // A logit softcap (Gemma 2): the graphs here build none, so the blocks cap the scores.
  CudnnSdpaKey capped = cuda::cudnn_sdpa_key(false, cuda::Dt::bf16, 1, 512, 8, 2, 64, true, 0, 0.125f, false, 0, 50.0f);
  EXPECT_EQ(capped.softcap, 50.0f);
  EXPECT_EQ(impl(capped), AttentionImplementation::blocks);
  EXPECT_NE(cuda::choose_attention(cuda::AttentionMode::automatic, true, capped).why.find("softcap"),
            std::string::npos);
  EXPECT_TRUE(cuda::choose_attention(cuda::AttentionMode::cudnn, true, capped).error);
  const auto why = cuda::choose_attention(cuda::AttentionMode::automatic, true, key_of(cuda::Dt::f32, 64, false));
  EXPECT_NE(why.why.find("bf16"), std::string::npos) << why.why;
  EXPECT_FALSE(why.error);
}

TEST(AttentionSelection, TheModeForcesEitherAndAForcedCudnnThatCannotIsAnError) {
  using cuda::AttentionImplementation;
  using cuda::AttentionMode;
  const CudnnSdpaKey ok = key_of(cuda::Dt::bf16, 64, false), f32 = key_of(cuda::Dt::f32, 64, false);
  EXPECT_EQ(cuda::choose_attention(AttentionMode::blocks, true, ok).impl, AttentionImplementation::blocks);
  EXPECT_FALSE(cuda::choose_attention(AttentionMode::blocks, true, ok).error);
  const auto forced = cuda::choose_attention(AttentionMode::cudnn, true, ok);
  EXPECT_EQ(forced.impl, AttentionImplementation::cudnn);
  EXPECT_TRUE(forced.forced);
  EXPECT_FALSE(cuda::choose_attention(AttentionMode::automatic, true, ok).forced);
  const auto cannot = cuda::choose_attention(AttentionMode::cudnn, true, f32);
  EXPECT_TRUE(cannot.error);
  EXPECT_NE(cannot.why.find("bf16"), std::string::npos) << cannot.why;
  // A build without cuDNN: the blocks, said why; forcing cuDNN there is an error.
  const auto unbuilt = cuda::choose_attention(AttentionMode::automatic, false, ok);
  EXPECT_EQ(unbuilt.impl, AttentionImplementation::blocks);
  EXPECT_NE(unbuilt.why.find("no cuDNN"), std::string::npos) << unbuilt.why;
  EXPECT_TRUE(cuda::choose_attention(AttentionMode::cudnn, false, ok).error);
}

// lse feeds the backward: a node's two directions choose alike, over every kind of key.
TEST(AttentionSelection, ForwardAndBackwardChooseAlike) {
  for (cuda::Dt dt : {cuda::Dt::f32, cuda::Dt::bf16})
    for (int64_t Dh : {8, 60, 64, 72, 128, 256})
      for (bool documents : {false, true})
        for (int64_t window : {0, 7}) {
          auto fwd = cuda::cudnn_sdpa_key(false, dt, 2, 100, 4, 2, Dh, true, window, 0.1f, documents);
          auto bwd = cuda::cudnn_sdpa_key(true, dt, 2, 100, 4, 2, Dh, true, window, 0.1f, documents);
          for (auto mode : {cuda::AttentionMode::automatic, cuda::AttentionMode::blocks, cuda::AttentionMode::cudnn})
            EXPECT_EQ(cuda::choose_attention(mode, true, fwd).impl, cuda::choose_attention(mode, true, bwd).impl)
                << cuda::cudnn_sdpa_key_str(fwd);
        }
}

// ---- workspace ----------------------------------------------------------------------------------

int64_t aligned(int64_t x) { return (x + 255) / 256 * 256; }

// The engines' own scratch: 4 times the bytes of q, at most 32 MiB.
TEST(CudnnSdpaLayout, EngineWorkspaceIsFourTimesQUpTo32MiB) {
  const int64_t q_bytes = 600 * 8 * 64 * 2;  // B 2, S 300, NH 8, D 64, bf16
  EXPECT_EQ(cuda::cudnn_engine_workspace_bytes(
                cuda::cudnn_sdpa_key(false, cuda::Dt::bf16, 2, 300, 8, 2, 64, true, 0, .1f, false)),
            4 * q_bytes);
  // Llama 3.2 1B at S 4096: q is 16 MiB, the cap binds.
  EXPECT_EQ(cuda::cudnn_engine_workspace_bytes(
                cuda::cudnn_sdpa_key(true, cuda::Dt::bf16, 1, 4096, 32, 8, 64, true, 0, .1f, false)),
            int64_t{32} << 20);
}

TEST(CudnnSdpaLayout, WithoutDocumentsOnlyCudnnsOwnWorkspace) {
  const auto key = cuda::cudnn_sdpa_key(false, cuda::Dt::bf16, 2, 300, 8, 2, 64, true, 0, .1f, false);
  const int64_t engine = aligned(cuda::cudnn_engine_workspace_bytes(key));
  const auto fwd = cuda::cudnn_sdpa_layout(key);
  EXPECT_EQ(fwd.seq_len, -1);
  EXPECT_EQ(fwd.stats, -1);
  EXPECT_EQ(fwd.cudnn, 0);
  EXPECT_EQ(fwd.cudnn_bytes, engine);
  EXPECT_EQ(fwd.bytes, engine);
  // The backward adds the f32 dQ accumulator [B S, NH, D] and softmax sum [B S, NH].
  const auto bwd = cuda::cudnn_sdpa_layout(cuda::cudnn_sdpa_key(true, cuda::Dt::bf16, 2, 300, 8, 2, 64, true, 0, .1f, false));
  EXPECT_EQ(bwd.cudnn_bytes, engine + aligned(4 * 600 * 8 * 64) + aligned(4 * 600 * 8));
  EXPECT_EQ(bwd.bytes, bwd.cudnn_bytes);
}

TEST(CudnnSdpaLayout, DocumentPiecesAreAlignedDisjointAndLargeEnough) {
  for (bool backward : {false, true})
    for (int64_t NKV_ : {2, 8}) {
      const auto k = cuda::cudnn_sdpa_key(backward, cuda::Dt::bf16, 2, 300, 8, NKV_, 64, true, 0, .1f, true);
      const auto l = cuda::cudnn_sdpa_layout(k);
      SCOPED_TRACE(cuda::cudnn_sdpa_key_str(k));
      const int64_t T = 600, n = k.max_documents;
      const std::vector<std::pair<int64_t, int64_t>> pieces = {
          {l.seq_len, 4 * n}, {l.offset_qo, 8 * (n + 1)}, {l.offset_kv, 8 * (n + 1)},
          {l.offset_stats, 8 * (n + 1)}, {l.stats, 4 * T * 8}, {l.cudnn, l.cudnn_bytes}};
      for (size_t i = 0; i < pieces.size(); ++i) {
        const auto [at, size] = pieces[i];
        EXPECT_GE(at, 0) << "piece " << i;
        EXPECT_EQ(at % 256, 0) << "piece " << i;
        EXPECT_LE(at + size, l.bytes) << "piece " << i;
        for (size_t j = 0; j < i; ++j)
          EXPECT_TRUE(at >= pieces[j].first + pieces[j].second || pieces[j].first >= at + size)
              << "pieces " << j << " and " << i << " overlap";
      }
      // With GQA the backward also holds dK and dV of every query head, [tokens, NH, D] f32 each.
      int64_t expected = aligned(cuda::cudnn_engine_workspace_bytes(k));
      if (backward) expected += aligned(4 * T * 8 * 64) + aligned(4 * T * 8);
      if (backward && NKV_ != 8) expected += 2 * aligned(4 * T * 8 * 64);
      EXPECT_EQ(l.cudnn_bytes, expected);
    }
}

// ---- the op's workspace rule, through lowering's bind_kernel --------------------------------

// Sets an environment variable for one scope (tests run one at a time in the process).
struct ScopedEnv {
  std::string name;
  std::string old;
  bool had = false;
  ScopedEnv(const char* n, const char* value) : name(n) {
    if (const char* v = std::getenv(n)) had = true, old = v;
    if (value) setenv(n, value, 1);
    else unsetenv(n);
  }
  ~ScopedEnv() {
    if (had) setenv(name.c_str(), old.c_str(), 1);
    else unsetenv(name.c_str());
  }
};

// attention(q, k, v[, doc]) of dtype dt, and its backward; returns the workspaces bind_kernel gives
// the two nodes for the cuda backend.
std::pair<int64_t, int64_t> cuda_workspaces(DType dt, int64_t Dh, bool documents, const Attrs& extra = {}) {
  const int64_t B = 2, S = 300, H = 8, KV = 2;
  Graph g;
  const ValueId q = g.add_input(Role::parameter, {dt, {B, S, H, Dh}}, "q");
  const ValueId k = g.add_input(Role::parameter, {dt, {B, S, KV, Dh}}, "k");
  const ValueId v = g.add_input(Role::parameter, {dt, {B, S, KV, Dh}}, "v");
  const ValueId dout = g.add_input(Role::constant, {dt, {B, S, H, Dh}}, "dout");
  std::vector<ValueId> ins = {q, k, v};
  if (documents) ins.push_back(g.add_input(Role::constant, {DType::i32, {B, S}}, "doc"));
  GraphBuilder b(g);
  Attrs a{{"causal", int64_t{1}}, {"scale", 0.125}};
  for (const auto& [key, value] : extra.all()) a.set(key, value);
  auto f = b.emit(OpKind::attention, ins, a);
  std::vector<ValueId> bins = {dout, q, k, v, f[0], f[1]};
  if (documents) bins.push_back(ins[3]);
  auto d = b.emit(OpKind::attention_backward, bins, a);
  for (int i = 0; i < 3; ++i) g.add_output(str("d", i), d[size_t(i)]);
  const NodeId fwd = g.value(f[0]).producer, bwd = g.value(d[0]).producer;
  return {bind_kernel(g, fwd, Backend::cuda, 1).workspace_bytes, bind_kernel(g, bwd, Backend::cuda, 1).workspace_bytes};
}

int64_t blocks_bytes(bool backward, int64_t elem) {
  return cuda::attention_block_layout(backward, 2, 300, 8, 2, 64, elem).bytes;
}
int64_t cudnn_bytes(bool backward, bool documents, int64_t chunk = 0) {
  return cuda::cudnn_sdpa_layout(cuda::cudnn_sdpa_key(backward, cuda::Dt::bf16, 2, 300, 8, 2, 64, true, 0, 0.125f,
                                                      documents, 0, 0, false, chunk))
      .bytes;
}

// Where cuDNN runs, the plan holds both layouts (a run may fall back to the blocks); elsewhere the
// blocks' only. Planned alike on every build, with or without cuDNN.
TEST(CudnnSdpaLayout, TheOpPlansTheLargerOfCudnnAndTheBlocks) {
  const ScopedEnv env("AUTOSP_ATTENTION", nullptr);
  for (bool documents : {false, true}) {
    SCOPED_TRACE(documents ? "documents" : "no documents");
    const auto [fwd, bwd] = cuda_workspaces(DType::bf16, 64, documents);
    EXPECT_EQ(fwd, std::max(blocks_bytes(false, 2), cudnn_bytes(false, documents)));
    EXPECT_EQ(bwd, std::max(blocks_bytes(true, 2), cudnn_bytes(true, documents)));
    EXPECT_GT(bwd, blocks_bytes(true, 2)) << "cuDNN's backward workspace is the larger one here";
  }
  const auto [f32_fwd, f32_bwd] = cuda_workspaces(DType::f32, 64, false);
  EXPECT_EQ(f32_fwd, blocks_bytes(false, 4));
  EXPECT_EQ(f32_bwd, blocks_bytes(true, 4));
}

// Llama 4's options: a chunk makes the kernels take document ids (the chunks' runs, kept in the
// op's own piece of B S i32, 256-byte aligned) with or without the op's; the temperature keeps the
// scaled queries [B, S, NH, D] in another.
TEST(CudnnSdpaLayout, ChunksPlanTheDocumentsGraphAndTheirIdsTemperatureItsQueries) {
  const ScopedEnv env("AUTOSP_ATTENTION", nullptr);
  const int64_t ids = cuda_aligned(2 * 300 * 4), queries = cuda_aligned(2 * 300 * 8 * 64 * 2);
  EXPECT_GT(cudnn_bytes(false, true, 64), cudnn_bytes(false, true)) << "the THD arrays of 4 more sequences a row";
  for (bool documents : {false, true}) {
    const auto [fwd, bwd] = cuda_workspaces(DType::bf16, 64, documents, {{"chunk", int64_t{64}}});
    EXPECT_EQ(fwd, ids + std::max(blocks_bytes(false, 2), cudnn_bytes(false, true, 64)));
    EXPECT_EQ(bwd, ids + std::max(blocks_bytes(true, 2), cudnn_bytes(true, true, 64)));
  }
  const auto [fwd, bwd] = cuda_workspaces(DType::bf16, 64, false, {{"temperature", std::vector<double>{4.0, 0.5}}});
  const auto [none_fwd, none_bwd] = cuda_workspaces(DType::bf16, 64, false);
  EXPECT_EQ(fwd, none_fwd + queries);
  EXPECT_EQ(bwd, none_bwd + queries);
}

// The chunks' runs as cuDNN's THD sequences: every sequence lies in one document and one chunk, and
// is maximal (it starts at its row's start, a chunk's or a document's), over random packings.
TEST(CudnnThdLayout, ChunkRunsAreTheDocumentsCutAtEveryChunk) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 100; ++trial) {
    const int64_t B = 1 + rng() % 3, S = 1 + rng() % 40, C = 1 + rng() % 12;
    std::vector<int32_t> doc, ids;
    for (int64_t b = 0; b < B; ++b) {
      int32_t id = static_cast<int32_t>(rng() % 5);
      for (int64_t s = 0; s < S; ++s) {
        if (rng() % 5 == 0) id += 1;
        doc.push_back(id);
      }
      for (int64_t s = 0; s < S; ++s)
        ids.push_back(attention_llama4::chunk_document_id(doc.data() + b * S, s, C));
    }
    const auto l = cudnn_thd_layout(ids.data(), B, S, NH, NKV, D, cuda::cudnn_max_documents(B, S, C));
    SCOPED_TRACE(testing::Message() << "trial " << trial << ": B " << B << ", S " << S << ", C " << C);
    ASSERT_LE(l.documents, cuda::cudnn_max_documents(B, S, C));
    int64_t tokens = 0;
    for (int64_t k = 0; k < l.documents; ++k) {
      const int64_t t0 = l.offset_stats[size_t(k)] / NH, len = l.seq_len[size_t(k)];
      const int64_t s0 = t0 % S;
      for (int64_t t = t0; t < t0 + len; ++t) {
        EXPECT_EQ(doc[size_t(t)], doc[size_t(t0)]) << "one document";
        EXPECT_EQ((t % S) / C, s0 / C) << "one chunk";
      }
      EXPECT_TRUE(s0 == 0 || s0 % C == 0 || doc[size_t(t0 - 1)] != doc[size_t(t0)]) << "maximal at its start";
      tokens += len;
    }
    EXPECT_EQ(tokens, B * S);
  }
}

// The chunks' cuts raise the bound by ceil(S / C) - 1 sequences per row: a row of the most
// documents the bound takes without chunks still fits with them.
TEST(CudnnThdLayout, TheBoundMakesRoomForTheChunksCuts) {
  const int64_t B = 2, S = 4096, C = 512;
  EXPECT_EQ(cuda::cudnn_max_documents(B, S, C), B * (cuda::kCudnnDocumentsPerRow + 7));
  EXPECT_EQ(cuda::cudnn_max_documents(B, S, 0), B * cuda::kCudnnDocumentsPerRow);
  EXPECT_EQ(cuda::cudnn_max_documents(1, 40, 3), 40) << "at most one sequence per token";
  EXPECT_EQ(cuda::cudnn_sdpa_key(false, cuda::Dt::bf16, B, S, 8, 2, 64, true, 0, 0.125f, true, 0, 0, false, C)
                .max_documents,
            cuda::cudnn_max_documents(B, S, C));
  // 125 documents per row (of 33 tokens, the last shorter), each chunk edge inside one of them
  std::vector<int32_t> doc, ids;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) doc.push_back(int32_t(s / 33));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) ids.push_back(attention_llama4::chunk_document_id(doc.data() + b * S, s, C));
  const auto l = cudnn_thd_layout(ids.data(), B, S, NH, NKV, D, cuda::cudnn_max_documents(B, S, C));
  EXPECT_EQ(l.documents, B * (125 + 7)) << "125 documents, 7 of them cut at a chunk's edge";
  EXPECT_LE(l.documents, cuda::cudnn_max_documents(B, S, C));
}

TEST(CudnnSdpaLayout, AutospAttentionBlocksPlansTheBlocksOnly) {
  const ScopedEnv env("AUTOSP_ATTENTION", "blocks");
  const auto [fwd, bwd] = cuda_workspaces(DType::bf16, 64, true);
  EXPECT_EQ(fwd, blocks_bytes(false, 2));
  EXPECT_EQ(bwd, blocks_bytes(true, 2));
}

// A bad value, or cuDNN forced on an attention it cannot run, is the user's error at compile
// time, naming the variable.
TEST(CudnnSdpaLayout, BadOrImpossibleAutospAttentionIsAUserError) {
  for (const char* value : {"cuDNN", "fast"}) {
    const ScopedEnv env("AUTOSP_ATTENTION", value);
    try {
      cuda_workspaces(DType::bf16, 64, false);
      ADD_FAILURE() << "AUTOSP_ATTENTION=" << value << " was accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("AUTOSP_ATTENTION"), std::string::npos) << e.what();
    }
  }
  const ScopedEnv env("AUTOSP_ATTENTION", "cudnn");
  EXPECT_NO_THROW(cuda_workspaces(DType::bf16, 64, false));
  try {
    cuda_workspaces(DType::f32, 64, false);
    ADD_FAILURE() << "cuDNN was forced on an f32 attention";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot run on cuDNN"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace autosp
