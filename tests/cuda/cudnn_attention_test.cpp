// cuDNN's fused attention on the cuda backend (ops/cuda_attention_cudnn.cpp), on a GPU: its
// results against the double reference and against the blocks (the implementation it replaces,
// itself held to the reference in cuda_ops_test.cpp), forward and backward, in bf16, over
// causal, GQA, a sliding window, packed documents (THD), D 64 and 128 and S that is not a
// multiple of 64; the device THD layout against its host specification; one graph build per
// key; the workspace its graphs ask for against the plan; the ops through the executor.
//
// Every measured error is printed as a line "cuda cudnn_<case>_<tensor> vs float64: ..." that
// scripts/gpu_check.sh collects. Without a GPU every test is skipped with the reason, and so is
// every cuDNN test in a build without cuDNN (CMake says why at configure time).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <tuple>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "kernels/cuda/cudnn_attention.h"
#include "ops/cuda_attention.h"
#include "ops/op.h"
#include "runtime/cuda_executor.h"
#include "testing/compare.h"
#include "util/error.h"

namespace autosp {
namespace {

using testing::as_float;
using testing::attention_reference;
using testing::AttentionRun;
using testing::AttnRef;
using testing::DeviceBuffer;
using testing::from_bf16;
using testing::kBf16Tol;
using testing::kF32Tol;
using testing::normalised_error;
using testing::random_normal;
using testing::round_bf16;
using testing::to_bf16;

#define SKIP_WITHOUT_CUDNN()                                                                                \
  do {                                                                                                      \
    SKIP_WITHOUT_GPU();                                                                                     \
    if (!cuda_cudnn_attention_built())                                                                      \
      GTEST_SKIP() << "this build has no cuDNN attention (CMake's 'autosp: cuDNN attention OFF' line says " \
                      "why; scripts/install_cudnn_frontend.sh installs the headers)";                      \
  } while (0)

// Sets an environment variable for one scope.
struct ScopedEnv {
  std::string name, old;
  bool had = false;
  ScopedEnv(const char* n, const char* value) : name(n) {
    if (const char* v = std::getenv(n)) had = true, old = v;
    setenv(n, value, 1);
  }
  ~ScopedEnv() {
    if (had) setenv(name.c_str(), old.c_str(), 1);
    else unsetenv(name.c_str());
  }
};

// ---- the device THD layout against its specification -------------------------------------------

struct DeviceThd {
  std::vector<int32_t> seq_len;
  std::vector<int64_t> offset_qo, offset_kv, offset_stats;
  int error = 0;
};
DeviceThd device_thd(const std::vector<int32_t>& doc, int64_t B, int64_t S, int64_t NH, int64_t NKV, int64_t D,
                     int64_t max_documents) {
  DeviceBuffer<int32_t> ddoc(doc), seq_len{size_t(max_documents)}, error(std::vector<int32_t>{0});
  DeviceBuffer<int64_t> qo{size_t(max_documents + 1)}, kv{size_t(max_documents + 1)}, st{size_t(max_documents + 1)};
  cuda::cudnn_thd_layout(ddoc.p, B, S, NH, NKV, D, max_documents, seq_len.p, qo.p, kv.p, st.p, error.p, nullptr);
  check_cuda(cudaGetLastError(), "cudnn_thd_layout", "test");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize", "test");
  return {seq_len.host(), qo.host(), kv.host(), st.host(), error.host()[0]};
}

// Document ids of B rows of S tokens, each row cut into documents of the given lengths (cycled),
// ids non-decreasing along a row.
std::vector<int32_t> packed(int64_t B, int64_t S, const std::vector<int64_t>& lengths) {
  std::vector<int32_t> doc;
  size_t next = 0;
  for (int64_t b = 0; b < B; ++b) {
    int32_t id = int32_t(b * 1000);
    int64_t left = 0;
    for (int64_t s = 0; s < S; ++s) {
      if (left == 0) left = lengths[next++ % lengths.size()], ++id;
      doc.push_back(id);
      --left;
    }
  }
  return doc;
}

TEST(CudnnAttention, ThdKernelMatchesTheHostLayout) {
  SKIP_WITHOUT_GPU();
  struct Case {
    const char* name;
    int64_t B, S;
    std::vector<int32_t> doc;
  };
  std::vector<Case> cases = {
      {"one document per row", 2, 300, std::vector<int32_t>(600, 0)},
      {"rows of 4 and 1 documents", 2, 300, packed(1, 300, {37, 100, 1, 162})},
      {"short documents", 3, 300, packed(3, 300, {1, 2, 3, 5, 8, 13})},
      {"one token each, past the bound", 1, 300, packed(1, 300, {1})},  // 300 > 128 documents
      {"a long row: chunks of many tokens a thread", 2, 5000, packed(2, 5000, {700, 3, 1200})},
  };
  cases[1].doc.insert(cases[1].doc.end(), 300, 7);  // the second row: one document
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t NH = 8, NKV = 2, D = 64, max_documents = cuda::cudnn_max_documents(c.B, c.S);
    ASSERT_EQ(int64_t(c.doc.size()), c.B * c.S);
    const cuda::CudnnThdLayout want = cuda::cudnn_thd_layout(c.doc.data(), c.B, c.S, NH, NKV, D, max_documents);
    const DeviceThd got = device_thd(c.doc, c.B, c.S, NH, NKV, D, max_documents);
    EXPECT_EQ(got.seq_len, want.seq_len);
    EXPECT_EQ(got.offset_qo, want.offset_qo);
    EXPECT_EQ(got.offset_kv, want.offset_kv);
    EXPECT_EQ(got.offset_stats, want.offset_stats);
    EXPECT_EQ(got.error, want.documents > max_documents ? int(cuda::kErrorTooManyDocuments) : 0)
        << want.documents << " documents, at most " << max_documents;
  }
}

TEST(CudnnAttention, LseToTokenMajorAndBack) {
  SKIP_WITHOUT_GPU();
  const int64_t B = 2, S = 300, NH = 8;
  const std::vector<float> lse = random_normal(B * NH * S, 21);
  std::vector<float> want(lse.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t s = 0; s < S; ++s) want[size_t((b * S + s) * NH + h)] = lse[size_t((b * NH + h) * S + s)];
  DeviceBuffer<float> dlse(lse), stats(lse.size()), back(lse.size());
  cuda::lse_to_token_major(dlse.p, B, S, NH, stats.p, nullptr);
  cuda::lse_from_token_major(stats.p, B, S, NH, back.p, nullptr);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize", "test");
  EXPECT_EQ(stats.host(), want);
  EXPECT_EQ(back.host(), lse);
}

// ---- cuDNN against the double reference and the blocks ------------------------------------------

struct SdpaCase {
  const char* name;
  int64_t B, S, NH, NKV, D;
  bool causal;
  int64_t window;
  std::vector<int64_t> document_lengths;  // empty: no documents
};

std::string case_str(const SdpaCase& c) {
  return str(c.name, " (B ", c.B, ", S ", c.S, ", NH ", c.NH, ", NKV ", c.NKV, ", D ", c.D,
             c.causal ? ", causal" : ", full", ", window ", c.window, c.document_lengths.empty() ? "" : ", documents",
             ")");
}

// S 300, 130 and 200: not multiples of 64 (cuDNN's tiles end inside the sequence).
const std::vector<SdpaCase> kSdpaCases = {
    {"causal", 1, 300, 4, 4, 64, true, 0, {}},
    {"gqa", 2, 300, 8, 2, 64, true, 0, {}},
    {"window", 1, 300, 8, 2, 64, true, 50, {}},
    {"full", 1, 130, 4, 2, 64, false, 0, {}},
    {"d128", 1, 200, 8, 2, 128, true, 0, {}},
    {"documents", 2, 300, 8, 2, 64, true, 0, {37, 100, 1, 162, 300, 250, 50}},
    {"documents_full", 2, 300, 8, 2, 64, false, 0, {120, 180, 7, 293}},
    {"documents_window_d128", 2, 300, 8, 2, 128, true, 40, {37, 100, 1, 162, 300}},
};

struct Results {
  std::vector<float> out, lse, dq, dk, dv;
};

std::vector<float> bf16_host(const DeviceBuffer<uint16_t>& b) {
  const std::vector<uint16_t> h = b.host();
  return from_bf16(h.data(), int64_t(h.size()));
}

// One case's inputs: bf16-rounded q, k, v, dout and the document ids (all 0: one per row).
struct SdpaInputs {
  std::vector<float> q, k, v, dout;
  std::vector<int32_t> doc;
};
SdpaInputs inputs_of(const SdpaCase& c) {
  const int64_t T = c.B * c.S;
  SdpaInputs in{round_bf16(random_normal(T * c.NH * c.D, 31)), round_bf16(random_normal(T * c.NKV * c.D, 32)),
                round_bf16(random_normal(T * c.NKV * c.D, 33)), round_bf16(random_normal(T * c.NH * c.D, 34)),
                c.document_lengths.empty() ? std::vector<int32_t>(size_t(T), 0) : packed(c.B, c.S, c.document_lengths)};
  return in;
}

// forced: AUTOSP_ATTENTION=cudnn's behaviour, so that a shape cuDNN declines fails here with what
// cuDNN said instead of passing through the blocks.
Results run_cudnn(const SdpaCase& c, const SdpaInputs& in, float scale) {
  const bool documents = !c.document_lengths.empty();
  const auto fwd = cuda::cudnn_sdpa_key(false, cuda::Dt::bf16, c.B, c.S, c.NH, c.NKV, c.D, c.causal, c.window, scale,
                                        documents);
  auto bwd = fwd;
  bwd.backward = true;
  DeviceBuffer<uint16_t> q(to_bf16(in.q)), k(to_bf16(in.k)), v(to_bf16(in.v)), dout(to_bf16(in.dout)),
      out(in.q.size()), dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
  DeviceBuffer<float> lse(size_t(c.B * c.NH * c.S));
  DeviceBuffer<int32_t> doc(in.doc), error(std::vector<int32_t>{0});
  DeviceBuffer<char> workspace(size_t(std::max(cuda::cudnn_sdpa_layout(fwd).bytes, cuda::cudnn_sdpa_layout(bwd).bytes)));
  const CudaContext ctx{nullptr, nullptr, error.p};
  const int32_t* d = documents ? doc.p : nullptr;
  EXPECT_TRUE(cuda_attention_forward_cudnn(ctx, fwd, true, q.p, k.p, v.p, d, out.p, lse.p, workspace.p));
  EXPECT_TRUE(cuda_attention_backward_cudnn(ctx, bwd, true, q.p, k.p, v.p, out.p, lse.p, dout.p, d, dq.p, dk.p, dv.p,
                                            workspace.p));
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize", "cudnn attention");
  EXPECT_EQ(error.host()[0], 0) << "a kernel flagged the data";
  return {bf16_host(out), lse.host(), bf16_host(dq), bf16_host(dk), bf16_host(dv)};
}

Results run_blocks(const SdpaCase& c, const SdpaInputs& in, float scale) {
  const bool documents = !c.document_lengths.empty();
  DeviceBuffer<uint16_t> q(to_bf16(in.q)), k(to_bf16(in.k)), v(to_bf16(in.v)), dout(to_bf16(in.dout)),
      out(in.q.size()), dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
  DeviceBuffer<float> lse(size_t(c.B * c.NH * c.S));
  DeviceBuffer<int32_t> doc(in.doc);
  const AttentionRun blocks({"blocks of 64", 64});
  blocks.run({c.B, c.S, c.NH, c.NKV, c.D}, c.causal, scale, q.p, k.p, v.p, documents ? doc.p : nullptr, out.p, lse.p,
             dout.p, dq.p, dk.p, dv.p, nullptr, c.window, cuda::Dt::bf16);
  return {bf16_host(out), lse.host(), bf16_host(dq), bf16_host(dk), bf16_host(dv)};
}

// Tolerances. cuDNN's forward, as the blocks, accumulates bf16 products in fp32 and rounds P to
// bf16 before P V, and its backward reads the bf16 out (for rowsum(dO o O)) and rounds dS before
// the dQ and dK products: the blocks' kBf16Tol (its float64 model gives 2e-3 to 5e-3 at these
// sizes) for out, dq, dk, dv against float64. lse is fp32 from fp32 scores (exp2 and log2 of the
// hardware, within 2 ulp): about 1e-6 of its scale, kF32Tol's 2e-5. cuDNN against the blocks:
// two independent errors within those bounds, so twice them. None of these has been measured
// on a GPU yet: the first gpu_check run's printed errors are the numbers to quote here.
TEST(CudnnAttention, MatchesTheDoubleReferenceAndTheBlocks) {
  SKIP_WITHOUT_CUDNN();
  for (const SdpaCase& c : kSdpaCases) {
    SCOPED_TRACE(case_str(c));
    const float scale = float(1.0 / std::sqrt(double(c.D)));
    const SdpaInputs in = inputs_of(c);
    const AttnRef ref = attention_reference({c.B, c.S, c.NH, c.NKV, c.D}, c.causal, scale, in.q, in.k, in.v, in.dout,
                                            in.doc, c.window);
    const Results cudnn = run_cudnn(c, in, scale);
    const Results blocks = run_blocks(c, in, scale);
    const std::vector<std::tuple<const char*, const std::vector<float>*, const std::vector<float>*,
                                 const std::vector<double>*, double>>
        tensors = {{"out", &cudnn.out, &blocks.out, &ref.out, kBf16Tol},
                   {"lse", &cudnn.lse, &blocks.lse, &ref.lse, kF32Tol},
                   {"dq", &cudnn.dq, &blocks.dq, &ref.dq, kBf16Tol},
                   {"dk", &cudnn.dk, &blocks.dk, &ref.dk, kBf16Tol},
                   {"dv", &cudnn.dv, &blocks.dv, &ref.dv, kBf16Tol}};
    for (const auto& [name, got, theirs, want, tol] : tensors) {
      const double vs_ref = normalised_error(*got, as_float(*want));
      const double blocks_vs_ref = normalised_error(*theirs, as_float(*want));
      const double vs_blocks = normalised_error(*got, *theirs);
      std::printf("cuda cudnn_%s_%s vs float64: %.3g (the blocks: %.3g; cudnn vs the blocks: %.3g)\n", c.name, name,
                  vs_ref, blocks_vs_ref, vs_blocks);
      EXPECT_LT(vs_ref, tol) << name;
      EXPECT_LT(vs_blocks, 2 * tol) << name << " against the blocks";
    }
  }
}

// One graph per key and process: a second run of a shape reuses the first one's graph, and the
// backward of the same shape is a graph of its own.
TEST(CudnnAttention, BuildsOneGraphPerKey) {
  SKIP_WITHOUT_CUDNN();
  // A shape no other test uses (its scale too), so that its first run builds.
  const SdpaCase c{"cache", 1, 77, 2, 1, 64, true, 0, {}};
  const float scale = 0.3f;
  const SdpaInputs in = inputs_of(c);
  const int64_t before = cuda_cudnn_graph_builds();
  run_cudnn(c, in, scale);
  EXPECT_EQ(cuda_cudnn_graph_builds() - before, 2) << "one forward and one backward graph";
  run_cudnn(c, in, scale);
  run_cudnn(c, in, scale);
  EXPECT_EQ(cuda_cudnn_graph_builds() - before, 2) << "the second and third runs rebuilt a graph";
  const SdpaCase other{"cache", 1, 78, 2, 1, 64, true, 0, {}};
  run_cudnn(other, inputs_of(other), scale);
  EXPECT_EQ(cuda_cudnn_graph_builds() - before, 4) << "another S is another pair of graphs";
}

// What the graphs ask for against the static plan (kernels/cuda/cudnn_attention.h,
// cudnn_sdpa_layout), over the shapes training runs: a graph that asks for more runs on the
// blocks (said on stderr), so this test is what says the plan is large enough.
TEST(CudnnAttention, WorkspaceWithinThePlan) {
  SKIP_WITHOUT_CUDNN();
  struct Shape {
    int64_t B, S, NH, NKV, D;
    bool documents;
    int64_t window;
  };
  for (const Shape s : {Shape{1, 4096, 32, 8, 64, false, 0}, Shape{1, 4096, 32, 8, 64, true, 0},
                        Shape{1, 4096, 32, 32, 64, true, 0}, Shape{1, 16384, 32, 8, 64, false, 0},
                        Shape{2, 300, 8, 2, 128, true, 40}, Shape{1, 8192, 16, 16, 128, false, 4096}})
    for (bool backward : {false, true}) {
      const auto key = cuda::cudnn_sdpa_key(backward, cuda::Dt::bf16, s.B, s.S, s.NH, s.NKV, s.D, true, s.window,
                                            float(1 / std::sqrt(double(s.D))), s.documents);
      std::string why;
      const int64_t asks = cuda_cudnn_graph_workspace(key, &why);
      const int64_t planned = cuda::cudnn_sdpa_layout(key).cudnn_bytes;
      std::printf("cudnn workspace (%s): asks %lld bytes, planned %lld\n", cuda::cudnn_sdpa_key_str(key).c_str(),
                  static_cast<long long>(asks), static_cast<long long>(planned));
      EXPECT_GE(asks, 0) << cuda::cudnn_sdpa_key_str(key) << ": " << why;
      EXPECT_LE(asks, planned) << cuda::cudnn_sdpa_key_str(key);
    }
}

// ---- the ops through the executor --------------------------------------------------------------

// attention and attention_backward of a bf16 graph, with document ids when `lengths` is not
// empty; returns out, lse, dq, dk, dv as f32.
Results run_ops(const SdpaCase& c, const SdpaInputs& in, float scale) {
  Graph g;
  const DType bf = DType::bf16;
  const ValueId q = g.add_input(Role::constant, {bf, {c.B, c.S, c.NH, c.D}}, "q");
  const ValueId k = g.add_input(Role::constant, {bf, {c.B, c.S, c.NKV, c.D}}, "k");
  const ValueId v = g.add_input(Role::constant, {bf, {c.B, c.S, c.NKV, c.D}}, "v");
  const ValueId dout = g.add_input(Role::constant, {bf, {c.B, c.S, c.NH, c.D}}, "dout");
  std::vector<ValueId> ins = {q, k, v};
  const bool documents = !c.document_lengths.empty();
  if (documents) ins.push_back(g.add_input(Role::constant, {DType::i32, {c.B, c.S}}, "doc"));
  GraphBuilder b(g);
  Attrs a{{"causal", int64_t{c.causal}}, {"scale", double(scale)}};
  if (c.window > 0) a.set("window", c.window);
  auto f = b.emit(OpKind::attention, ins, a);
  std::vector<ValueId> bins = {dout, q, k, v, f[0], f[1]};
  if (documents) bins.push_back(ins[3]);
  auto d = b.emit(OpKind::attention_backward, bins, a);
  g.add_output("out", f[0]);
  g.add_output("lse", f[1]);
  g.add_output("dq", d[0]);
  g.add_output("dk", d[1]);
  g.add_output("dv", d[2]);
  CudaExecutor ex(g);
  const auto bq = to_bf16(in.q), bk = to_bf16(in.k), bv = to_bf16(in.v), bdout = to_bf16(in.dout);
  ex.bind("q", bq.data());
  ex.bind("k", bk.data());
  ex.bind("v", bv.data());
  ex.bind("dout", bdout.data());
  if (documents) ex.bind("doc", in.doc.data());
  ex.run();
  auto bf16_out = [&](const char* name, int64_t n) {
    return from_bf16(static_cast<const uint16_t*>(ex.output_data(name)), n);
  };
  const auto* lse = static_cast<const float*>(ex.output_data("lse"));
  return {bf16_out("out", int64_t(in.q.size())), std::vector<float>(lse, lse + c.B * c.NH * c.S),
          bf16_out("dq", int64_t(in.q.size())), bf16_out("dk", int64_t(in.k.size())),
          bf16_out("dv", int64_t(in.v.size()))};
}

// The ops' cuda kernels (ops/attention.cpp) choose cuDNN for these shapes and run it with the
// workspace lowering planned: the same results as the ops on the blocks (AUTOSP_ATTENTION=blocks),
// within the two bf16 errors of the test above.
TEST(CudnnAttention, TheOpsRunCudnnAsTheBlocks) {
  SKIP_WITHOUT_CUDNN();
  for (const SdpaCase& c : {kSdpaCases[1], kSdpaCases[2], kSdpaCases[5]}) {
    SCOPED_TRACE(case_str(c));
    const float scale = float(1.0 / std::sqrt(double(c.D)));
    const SdpaInputs in = inputs_of(c);
    Results cudnn, blocks;
    {
      const ScopedEnv env("AUTOSP_ATTENTION", "cudnn");  // a fallback would be an error
      cudnn = run_ops(c, in, scale);
    }
    {
      const ScopedEnv env("AUTOSP_ATTENTION", "blocks");
      blocks = run_ops(c, in, scale);
    }
    EXPECT_LT(normalised_error(cudnn.out, blocks.out), 2 * kBf16Tol);
    EXPECT_LT(normalised_error(cudnn.lse, blocks.lse), 2 * kF32Tol);
    EXPECT_LT(normalised_error(cudnn.dq, blocks.dq), 2 * kBf16Tol);
    EXPECT_LT(normalised_error(cudnn.dk, blocks.dk), 2 * kBf16Tol);
    EXPECT_LT(normalised_error(cudnn.dv, blocks.dv), 2 * kBf16Tol);
  }
}

// More documents in a batch than the graph holds: a UserError after the step that names the way
// out, not wrong results.
TEST(CudnnAttention, TooManyDocumentsIsAUserError) {
  SKIP_WITHOUT_CUDNN();
  const SdpaCase c{"too_many", 1, 300, 2, 1, 64, true, 0, {1}};  // 300 documents > 128
  const ScopedEnv env("AUTOSP_ATTENTION", "cudnn");
  try {
    run_ops(c, inputs_of(c), 0.125f);
    ADD_FAILURE() << "300 documents ran on a graph of " << cuda::cudnn_max_documents(1, 300);
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("AUTOSP_ATTENTION=blocks"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace autosp
