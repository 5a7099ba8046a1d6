// The flash-style CPU attention kernels against the plain double-precision reference:
// forward (out, lse) and backward (dq, dk, dv) over sequence lengths that are and are not
// multiples of the tile, GQA ratios, head dims, causal and not, with and without document
// ids (packed samples), with a sliding window (alone and with documents), with Gemma 2's
// logit softcap (alone, with the window and with documents), with ALiBi (alone, with the
// window and with documents), with gpt-oss's sinks; bitwise
// determinism across thread counts; and the O(S) workspace, including one long run at
// S = 16384.
#include "kernels/cpu/attention.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace {

using autosp::cpu::AttentionDims;

// Normalised max error: max |x - ref| / max |ref| over one tensor. A tensor that is zero
// in exact arithmetic (dq, dk at S = 1, where P = 1 and dS = P (dP - delta) = 0) has no
// scale of its own; it is measured against 1, the scale of the O(1) inputs.
double normalised_max_error(const std::vector<float>& x, const std::vector<double>& ref) {
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(x[i]) - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return err / (scale > 1e-12 ? scale : 1.0);
}

std::vector<float> random_floats(int64_t n, std::mt19937& gen, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> x(n);
  for (auto& e : x) e = dist(gen);
  return x;
}

std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

struct Tensors {
  std::vector<float> q, k, v, dout, out, lse, dq, dk, dv;
};

Tensors make_inputs(const AttentionDims& d, uint32_t seed) {
  std::mt19937 gen(seed);
  Tensors t;
  // Inputs of magnitude ~2 make the softmax peaked enough to exercise the running max.
  t.q = random_floats(d.B * d.S * d.NH * d.D, gen, -2.0f, 2.0f);
  t.k = random_floats(d.B * d.S * d.NKV * d.D, gen, -2.0f, 2.0f);
  t.v = random_floats(d.B * d.S * d.NKV * d.dv(), gen, -1.0f, 1.0f);
  t.dout = random_floats(d.B * d.S * d.NH * d.dv(), gen, -1.0f, 1.0f);
  return t;
}

// Runs forward then backward with a workspace of exactly the advertised size.
void run_kernels(const AttentionDims& d, bool causal, float scale, Tensors& t,
                 const int32_t* documents = nullptr, int64_t window = 0, float softcap = 0.0f,
                 const float* alibi = nullptr) {
  const int threads = omp_get_max_threads();
  t.out.assign(d.B * d.S * d.NH * d.dv(), 0.0f);
  t.lse.assign(d.B * d.NH * d.S, 0.0f);
  t.dq.assign(t.q.size(), 0.0f);
  t.dk.assign(t.k.size(), 0.0f);
  t.dv.assign(t.v.size(), 0.0f);
  // NaN-filled, so a kernel that reads scratch it did not write poisons its outputs.
  std::vector<float> ws(std::max(autosp::cpu::attention_forward_workspace_floats(d, threads),
                                 autosp::cpu::attention_backward_workspace_floats(d, threads)),
                        std::numeric_limits<float>::quiet_NaN());
  autosp::cpu::attention_forward(d, causal, scale, t.q.data(), t.k.data(), t.v.data(),
                                 t.out.data(), t.lse.data(), ws.data(), threads, documents, window, softcap, alibi);
  autosp::cpu::attention_backward(d, causal, scale, t.q.data(), t.k.data(), t.v.data(),
                                  t.out.data(), t.lse.data(), t.dout.data(), t.dq.data(),
                                  t.dk.data(), t.dv.data(), ws.data(), threads, documents, window, softcap, alibi);
}

// Document ids [B, S]: row b holds documents of lengths[b % lengths.size()] in order; the
// tokens after them form one more document.
std::vector<int32_t> documents_of(const AttentionDims& d, const std::vector<std::vector<int64_t>>& lengths) {
  std::vector<int32_t> ids(d.B * d.S);
  for (int64_t b = 0; b < d.B; ++b) {
    int64_t i = 0;
    int32_t doc = 0;
    for (int64_t len : lengths[b % lengths.size()]) {
      for (int64_t e = 0; e < len && i < d.S; ++e) ids[b * d.S + i++] = doc;
      ++doc;
    }
    for (; i < d.S; ++i) ids[b * d.S + i] = doc;
  }
  return ids;
}

// Observed (fp32 kernel vs double reference, worst case over the matrix below):
//   out 1.3e-6 (S130 D128), lse 4.1e-7 (S1 D64), dq 1.8e-6 (S130 D128 causal),
//   dk 1.2e-6 (S257 D64 causal), dv 1.1e-6 (S130 D128).
// That is fp32 rounding summed over <= 257 keys and <= 128 dims. 1e-5 leaves a 5x margin;
// an indexing, masking or scaling bug gives errors >= 1e-2.
constexpr double kTolerance = 1e-5;

// (S, NH, NKV, D, causal)
using Case = std::tuple<int64_t, int64_t, int64_t, int64_t, bool>;

class AttentionKernelVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionKernelVsReference, ForwardAndBackwardMatchDouble) {
  const auto [S, NH, NKV, D, causal] = GetParam();
  const AttentionDims d{2, S, NH, NKV, D};
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  Tensors t = make_inputs(d, static_cast<uint32_t>(S * 1000 + NH * 100 + NKV * 10 + D + causal));
  run_kernels(d, causal, scale, t);

  std::vector<double> out(t.out.size()), lse(t.lse.size());
  std::vector<double> dq(t.dq.size()), dk(t.dk.size()), dv(t.dv.size());
  const auto q = to_double(t.q), k = to_double(t.k), v = to_double(t.v), dout = to_double(t.dout);
  autosp::cpu::attention_forward_reference(d, causal, scale, q.data(), k.data(), v.data(),
                                           out.data(), lse.data());
  autosp::cpu::attention_backward_reference(d, causal, scale, q.data(), k.data(), v.data(),
                                            dout.data(), dq.data(), dk.data(), dv.data());
  EXPECT_LE(normalised_max_error(t.out, out), kTolerance) << "out";
  EXPECT_LE(normalised_max_error(t.lse, lse), kTolerance) << "lse";
  EXPECT_LE(normalised_max_error(t.dq, dq), kTolerance) << "dq";
  EXPECT_LE(normalised_max_error(t.dk, dk), kTolerance) << "dk";
  EXPECT_LE(normalised_max_error(t.dv, dv), kTolerance) << "dv";
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const auto [S, NH, NKV, D, causal] = info.param;
  return "S" + std::to_string(S) + "_NH" + std::to_string(NH) + "_NKV" + std::to_string(NKV) +
         "_D" + std::to_string(D) + (causal ? "_causal" : "_full");
}

// Tiles are 64 x 64: S = 1, 7, 100, 257 leave partial tiles, 64 is exactly one.
// (NH, NKV): GQA ratios 1, 2, 4, and NKV = 1 (multi-query) with ratios 2 and 4.
// D = 16 and 64 everywhere; on a few shapes D = 12 and 40 (a masked last vector: 12 is
// 8 + 4 floats on avx2 and 12 of 16 on avx512, 40 is 32 + 8 on avx512) and D = 128 (two
// 64-wide column panels).
std::vector<Case> all_cases() {
  std::vector<Case> cases;
  const std::pair<int64_t, int64_t> heads[] = {{2, 2}, {4, 2}, {8, 2}, {2, 1}, {4, 1}};
  for (int64_t S : {1, 7, 64, 100, 257})
    for (auto [NH, NKV] : heads)
      for (int64_t D : {16, 64})
        for (bool causal : {false, true}) cases.emplace_back(S, NH, NKV, D, causal);
  for (int64_t D : {12, 40, 128})
    for (int64_t S : {7, 130})
      for (bool causal : {false, true}) cases.emplace_back(S, 4, 2, D, causal);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AttentionKernel, AttentionKernelVsReference, ::testing::ValuesIn(all_cases()),
                         case_name);

// ---- documents (packed samples) ------------------------------------------------------
// Document layouts per batch row: boundaries inside tiles and on tile edges (64, 128),
// one-token documents, a document per token, one document whose id is not 0.
const std::vector<std::pair<std::string, std::vector<std::vector<int64_t>>>>& document_layouts() {
  static const std::vector<std::pair<std::string, std::vector<std::vector<int64_t>>>> layouts = {
      {"inside_tiles", {{37, 27, 100}, {1, 90}}},
      {"tile_edges", {{64, 64}, {128, 1, 1}}},
      {"one_token_docs", {{1, 1, 1, 60, 1, 3}, {5, 1, 1, 1, 1, 1, 70}}},
      {"every_token", {std::vector<int64_t>(300, 1)}},
      {"one_document", {{}}},
  };
  return layouts;
}

TEST(AttentionKernelDocuments, ForwardAndBackwardMatchDouble) {
  for (const auto& [layout, lengths] : document_layouts())
    for (int64_t S : {100, 257})
      for (auto [NH, NKV] : {std::pair<int64_t, int64_t>{4, 2}, {2, 2}, {4, 1}})
        for (int64_t D : {16, 40})
          for (bool causal : {true, false}) {
            const AttentionDims d{2, S, NH, NKV, D};
            std::vector<int32_t> docs = documents_of(d, lengths);
            if (layout == "one_document")
              for (int32_t& id : docs) id = 7;
            const std::string at = layout + " S=" + std::to_string(S) + " NH=" + std::to_string(NH) +
                                   " NKV=" + std::to_string(NKV) + " D=" + std::to_string(D) +
                                   (causal ? " causal" : " full");
            const float scale = 1.0f / std::sqrt(static_cast<float>(D));
            Tensors t = make_inputs(d, static_cast<uint32_t>(S + NH + D));
            run_kernels(d, causal, scale, t, docs.data());
            std::vector<double> out(t.out.size()), lse(t.lse.size());
            std::vector<double> dq(t.dq.size()), dk(t.dk.size()), dv(t.dv.size());
            const auto q = to_double(t.q), k = to_double(t.k), v = to_double(t.v), dout = to_double(t.dout);
            autosp::cpu::attention_forward_reference(d, causal, scale, q.data(), k.data(), v.data(), out.data(),
                                                     lse.data(), docs.data());
            autosp::cpu::attention_backward_reference(d, causal, scale, q.data(), k.data(), v.data(), dout.data(),
                                                      dq.data(), dk.data(), dv.data(), docs.data());
            EXPECT_LE(normalised_max_error(t.out, out), kTolerance) << "out, " << at;
            EXPECT_LE(normalised_max_error(t.lse, lse), kTolerance) << "lse, " << at;
            EXPECT_LE(normalised_max_error(t.dq, dq), kTolerance) << "dq, " << at;
            EXPECT_LE(normalised_max_error(t.dk, dk), kTolerance) << "dk, " << at;
            EXPECT_LE(normalised_max_error(t.dv, dv), kTolerance) << "dv, " << at;
          }
}

// The reference itself is checked by what packing means: attending over a packed row equals
// attending over each of its documents alone (a [1, L] run per document), forward and
// backward; boundaries at 37, 128 (a tile edge), 129.
TEST(AttentionKernelDocuments, PackedRowEqualsEachDocumentAlone) {
  const int64_t S = 230, NH = 4, NKV = 2, D = 40;
  const std::vector<int64_t> lengths = {37, 91, 1, 101};
  const AttentionDims packed{1, S, NH, NKV, D};
  const std::vector<int32_t> docs = documents_of(packed, {lengths});
  for (bool causal : {true, false}) {
    Tensors whole = make_inputs(packed, 11);
    run_kernels(packed, causal, 0.2f, whole, docs.data());
    int64_t start = 0;
    for (int64_t L : lengths) {
      const AttentionDims alone{1, L, NH, NKV, D};
      Tensors part;
      auto rows = [&](const std::vector<float>& x, int64_t heads) {
        return std::vector<float>(x.begin() + start * heads * D, x.begin() + (start + L) * heads * D);
      };
      part.q = rows(whole.q, NH), part.k = rows(whole.k, NKV), part.v = rows(whole.v, NKV);
      part.dout = rows(whole.dout, NH);
      run_kernels(alone, causal, 0.2f, part);
      const std::string at = "document at " + std::to_string(start) + " of " + std::to_string(L) +
                             (causal ? " causal" : " full");
      auto close = [&](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
        EXPECT_LE(normalised_max_error(got, to_double(want)), kTolerance) << what << ", " << at;
      };
      close(rows(whole.out, NH), part.out, "out");
      close(rows(whole.dq, NH), part.dq, "dq");
      close(rows(whole.dk, NKV), part.dk, "dk");
      close(rows(whole.dv, NKV), part.dv, "dv");
      std::vector<float> lse_rows;
      for (int64_t h = 0; h < NH; ++h)
        lse_rows.insert(lse_rows.end(), whole.lse.begin() + h * S + start, whole.lse.begin() + h * S + start + L);
      close(lse_rows, part.lse, "lse");
      start += L;
    }
  }
}

// With documents too, results are bitwise the same on any thread count and schedule.
TEST(AttentionKernelDocuments, BitwiseEqualAcrossThreadCountsAndSchedules) {
  const int saved = omp_get_max_threads();
  bool saw_split = false, saw_fused = false;
  for (const AttentionDims d : {AttentionDims{2, 200, 8, 2, 64}, AttentionDims{1, 200, 4, 2, 40}}) {
    const std::vector<int32_t> docs = documents_of(d, {{37, 27, 100}, {64, 1, 70}});
    for (bool causal : {true, false}) {
      Tensors one = make_inputs(d, 5);
      omp_set_num_threads(1);
      run_kernels(d, causal, 0.125f, one, docs.data());
      for (int threads : {3, 16}) {
        Tensors many = make_inputs(d, 5);
        omp_set_num_threads(threads);
        const bool split = autosp::cpu::attention_backward_is_split(d, threads);
        (split ? saw_split : saw_fused) = true;
        run_kernels(d, causal, 0.125f, many, docs.data());
        const std::string where = "B=" + std::to_string(d.B) + (causal ? " causal " : " full ") +
                                  std::to_string(threads) + " threads";
        for (auto [a, b, name] : {std::tuple{&one.out, &many.out, "out"}, {&one.lse, &many.lse, "lse"},
                                  {&one.dq, &many.dq, "dq"}, {&one.dk, &many.dk, "dk"}, {&one.dv, &many.dv, "dv"}})
          EXPECT_EQ(0, std::memcmp(a->data(), b->data(), a->size() * sizeof(float))) << name << ", " << where;
      }
    }
  }
  omp_set_num_threads(saved);
  EXPECT_TRUE(saw_split && saw_fused) << "both backward schedules must be compared";
}

// ---- values of their own head dim (DeepSeek-V3's latent attention) ----------------------
// v, out, dout and dv of Dv columns against q's and k's D, narrower and wider: against the
// double reference with and without documents, causal and not, on both GQA layouts and on 1,
// 3 and 16 threads (the fused schedule, its GQA slots and the split one); and bitwise the same
// on every thread count.
TEST(AttentionKernelValueDim, ForwardAndBackwardMatchDoubleOnEverySchedule) {
  const int saved = omp_get_max_threads();
  bool saw_split = false, saw_fused = false;
  for (auto [D, Dv] : {std::pair<int64_t, int64_t>{12, 8}, {8, 12}, {40, 24}})
    for (int64_t S : {100, 257})
      for (auto [NH, NKV] : {std::pair<int64_t, int64_t>{4, 2}, {4, 4}})
        for (bool causal : {true, false})
          for (bool packed : {false, true}) {
            const AttentionDims d{2, S, NH, NKV, D, Dv};
            const std::vector<int32_t> docs = documents_of(d, {{37, 27, 100}, {64, 1, 70}});
            const int32_t* ids = packed ? docs.data() : nullptr;
            const std::string at = "D=" + std::to_string(D) + " Dv=" + std::to_string(Dv) + " S=" +
                                   std::to_string(S) + " NKV=" + std::to_string(NKV) + (causal ? " causal" : " full") +
                                   (packed ? " packed" : "");
            const float scale = 1.0f / std::sqrt(static_cast<float>(D));
            const auto seed = static_cast<uint32_t>(S + NKV + D + 7 * Dv);
            Tensors t = make_inputs(d, seed);
            std::vector<double> out(d.B * S * NH * Dv), lse(d.B * NH * S);
            std::vector<double> dq(t.q.size()), dk(t.k.size()), dv(t.v.size());
            const auto q = to_double(t.q), k = to_double(t.k), v = to_double(t.v), dout = to_double(t.dout);
            autosp::cpu::attention_forward_reference(d, causal, scale, q.data(), k.data(), v.data(), out.data(),
                                                     lse.data(), ids);
            autosp::cpu::attention_backward_reference(d, causal, scale, q.data(), k.data(), v.data(), dout.data(),
                                                      dq.data(), dk.data(), dv.data(), ids);
            Tensors first;
            for (int threads : {1, 3, 16}) {
              omp_set_num_threads(threads);
              (autosp::cpu::attention_backward_is_split(d, threads) ? saw_split : saw_fused) = true;
              Tensors t2 = make_inputs(d, seed);
              run_kernels(d, causal, scale, t2, ids);
              const std::string where = at + ", " + std::to_string(threads) + " threads";
              EXPECT_LE(normalised_max_error(t2.out, out), kTolerance) << "out, " << where;
              EXPECT_LE(normalised_max_error(t2.lse, lse), kTolerance) << "lse, " << where;
              EXPECT_LE(normalised_max_error(t2.dq, dq), kTolerance) << "dq, " << where;
              EXPECT_LE(normalised_max_error(t2.dk, dk), kTolerance) << "dk, " << where;
              EXPECT_LE(normalised_max_error(t2.dv, dv), kTolerance) << "dv, " << where;
              if (threads == 1) {
                first = t2;
                continue;
              }
              for (auto [a, b, name] : {std::tuple{&first.out, &t2.out, "out"}, {&first.dq, &t2.dq, "dq"},
                                        {&first.dk, &t2.dk, "dk"}, {&first.dv, &t2.dv, "dv"}})
                EXPECT_EQ(0, std::memcmp(a->data(), b->data(), a->size() * sizeof(float))) << name << ", " << where;
            }
          }
  omp_set_num_threads(saved);
  EXPECT_TRUE(saw_split && saw_fused) << "both backward schedules must be run";
}

// ---- attention sinks (gpt-oss) ----------------------------------------------------------
// A learned logit per query head in every row's softmax, as a key of zero value: the flash
// kernels' results with attention_sinks_forward folded in, the backward run on them and
// attention_sinks_backward's dsinks, against the double reference that takes the sink as one
// more score. Sinks below, near and above the rows' log-sum-exp (a sink of 8 takes most of each
// row), causal with a window and documents, and not; on 1 and 3 threads, bitwise alike.
TEST(AttentionKernelSinks, ForwardAndBackwardMatchDouble) {
  const int saved = omp_get_max_threads();
  for (auto [S, window] : {std::pair<int64_t, int64_t>{100, 0}, {257, 20}})
    for (auto [NH, NKV] : {std::pair<int64_t, int64_t>{4, 2}, {4, 1}})
      for (bool causal : {true, false})
        for (bool packed : {false, true}) {
          if (window > 0 && !causal) continue;  // a window needs causal attention
          const AttentionDims d{2, S, NH, NKV, 16};
          const std::vector<int32_t> docs = documents_of(d, {{37, 27, 100}, {64, 1, 70}});
          const int32_t* ids = packed ? docs.data() : nullptr;
          const std::string at = "S=" + std::to_string(S) + " W=" + std::to_string(window) + " NKV=" +
                                 std::to_string(NKV) + (causal ? " causal" : " full") + (packed ? " packed" : "");
          const float scale = 0.25f;
          const std::vector<float> sinks = {-3.0f, 0.5f, 2.0f, 8.0f};
          const auto seed = static_cast<uint32_t>(S + NKV + 11 * window);
          Tensors t = make_inputs(d, seed);
          std::vector<double> out(d.B * S * NH * d.D), lse(d.B * NH * S), dsinks(NH);
          std::vector<double> dq(t.q.size()), dk(t.k.size()), dv(t.v.size());
          const auto q = to_double(t.q), k = to_double(t.k), v = to_double(t.v), dout = to_double(t.dout);
          const auto z = to_double(sinks);
          autosp::cpu::attention_forward_reference(d, causal, scale, q.data(), k.data(), v.data(), out.data(),
                                                   lse.data(), ids, window, 0.0, nullptr, z.data());
          autosp::cpu::attention_backward_reference(d, causal, scale, q.data(), k.data(), v.data(), dout.data(),
                                                    dq.data(), dk.data(), dv.data(), ids, window, 0.0, nullptr,
                                                    z.data(), dsinks.data());
          Tensors first;
          std::vector<float> first_dsinks;
          for (int threads : {1, 3}) {
            omp_set_num_threads(threads);
            Tensors t2 = make_inputs(d, seed);
            std::vector<float> ws(std::max(autosp::cpu::attention_forward_workspace_floats(d, threads),
                                           autosp::cpu::attention_backward_workspace_floats(d, threads)),
                                  std::numeric_limits<float>::quiet_NaN());
            t2.out.assign(out.size(), 0.0f);
            t2.lse.assign(lse.size(), 0.0f);
            t2.dq.assign(t2.q.size(), 0.0f);
            t2.dk.assign(t2.k.size(), 0.0f);
            t2.dv.assign(t2.v.size(), 0.0f);
            std::vector<float> ds(NH, std::numeric_limits<float>::quiet_NaN());
            autosp::cpu::attention_forward(d, causal, scale, t2.q.data(), t2.k.data(), t2.v.data(), t2.out.data(),
                                           t2.lse.data(), ws.data(), threads, ids, window);
            autosp::cpu::attention_sinks_forward(d, sinks.data(), t2.out.data(), t2.lse.data(), threads);
            autosp::cpu::attention_backward(d, causal, scale, t2.q.data(), t2.k.data(), t2.v.data(), t2.out.data(),
                                            t2.lse.data(), t2.dout.data(), t2.dq.data(), t2.dk.data(), t2.dv.data(),
                                            ws.data(), threads, ids, window);
            autosp::cpu::attention_sinks_backward(d, sinks.data(), t2.out.data(), t2.lse.data(), t2.dout.data(),
                                                  ds.data(), threads);
            const std::string where = at + ", " + std::to_string(threads) + " threads";
            EXPECT_LE(normalised_max_error(t2.out, out), kTolerance) << "out, " << where;
            EXPECT_LE(normalised_max_error(t2.lse, lse), kTolerance) << "lse, " << where;
            EXPECT_LE(normalised_max_error(t2.dq, dq), kTolerance) << "dq, " << where;
            EXPECT_LE(normalised_max_error(t2.dk, dk), kTolerance) << "dk, " << where;
            EXPECT_LE(normalised_max_error(t2.dv, dv), kTolerance) << "dv, " << where;
            EXPECT_LE(normalised_max_error(ds, dsinks), kTolerance) << "dsinks, " << where;
            if (threads == 1) {
              first = t2, first_dsinks = ds;
              continue;
            }
            for (auto [a, b, name] : {std::tuple{&first.out, &t2.out, "out"}, {&first.dq, &t2.dq, "dq"},
                                      {&first.dk, &t2.dk, "dk"}, {&first.dv, &t2.dv, "dv"},
                                      {&first_dsinks, &ds, "dsinks"}})
              EXPECT_EQ(0, std::memcmp(a->data(), b->data(), a->size() * sizeof(float))) << name << ", " << where;
          }
        }
  omp_set_num_threads(saved);
}

// ---- sliding window (Mistral) ----------------------------------------------------------
// Windows of 1 (each query sees itself), shorter than a tile, a tile and one more, across
// several tiles, and longer than S (no effect); alone and with documents, on both GQA
// layouts; the same tolerance as above (the same sums over at most W keys).
TEST(AttentionKernelWindow, ForwardAndBackwardMatchDouble) {
  for (int64_t window : {1, 5, 64, 65, 100, 300})
    for (int64_t S : {100, 257})
      for (auto [NH, NKV] : {std::pair<int64_t, int64_t>{4, 2}, {4, 1}})
        for (int64_t D : {16, 40})
          for (bool packed : {false, true}) {
            const AttentionDims d{2, S, NH, NKV, D};
            const std::vector<int32_t> docs = documents_of(d, {{37, 27, 100}, {64, 1, 70}});
            const int32_t* ids = packed ? docs.data() : nullptr;
            const std::string at = "window " + std::to_string(window) + " S=" + std::to_string(S) + " NH=" +
                                   std::to_string(NH) + " NKV=" + std::to_string(NKV) + " D=" + std::to_string(D) +
                                   (packed ? " packed" : "");
            const float scale = 1.0f / std::sqrt(static_cast<float>(D));
            Tensors t = make_inputs(d, static_cast<uint32_t>(S + NH + D + window));
            run_kernels(d, true, scale, t, ids, window);
            std::vector<double> out(t.out.size()), lse(t.lse.size());
            std::vector<double> dq(t.dq.size()), dk(t.dk.size()), dv(t.dv.size());
            const auto q = to_double(t.q), k = to_double(t.k), v = to_double(t.v), dout = to_double(t.dout);
            autosp::cpu::attention_forward_reference(d, true, scale, q.data(), k.data(), v.data(), out.data(),
                                                     lse.data(), ids, window);
            autosp::cpu::attention_backward_reference(d, true, scale, q.data(), k.data(), v.data(), dout.data(),
                                                      dq.data(), dk.data(), dv.data(), ids, window);
            EXPECT_LE(normalised_max_error(t.out, out), kTolerance) << "out, " << at;
            EXPECT_LE(normalised_max_error(t.lse, lse), kTolerance) << "lse, " << at;
            EXPECT_LE(normalised_max_error(t.dq, dq), kTolerance) << "dq, " << at;
            EXPECT_LE(normalised_max_error(t.dk, dk), kTolerance) << "dk, " << at;
            EXPECT_LE(normalised_max_error(t.dv, dv), kTolerance) << "dv, " << at;
          }
}

// The reference's window is what Hugging Face's Mistral masks (masking_utils'
// sliding_window_overlay: kv_idx > q_idx - sliding_window): query i sees W keys, itself
// and the W - 1 before it. With W = 1 attention returns each query's own value row.
TEST(AttentionKernelWindow, WindowOfOneSeesOnlyItself) {
  const AttentionDims d{1, 70, 2, 1, 16};
  Tensors t = make_inputs(d, 3);
  run_kernels(d, true, 0.25f, t, nullptr, 1);
  for (int64_t i = 0; i < d.S; ++i)
    for (int64_t h = 0; h < d.NH; ++h)
      for (int64_t e = 0; e < d.D; ++e)
        ASSERT_EQ(t.out[(i * d.NH + h) * d.D + e], t.v[i * d.D + e]) << "row " << i << " head " << h;
}

// Tiles wholly outside the window are never computed, forward or backward: with W = 64,
// key block [0, 64) is outside every window of query blocks from 128 on, and query block
// [192, 256) outside every window over key block [0, 64). NaN in those rows (keys and
// values; queries and output gradients) leaves what only far rows read bitwise as with
// finite values there; a kernel that computed the tile (even masked: 0 x NaN) would not.
TEST(AttentionKernelWindow, TilesOutsideTheWindowAreSkippedBothWays) {
  const AttentionDims d{1, 256, 4, 2, 32};
  const int64_t W = 64;
  const int saved = omp_get_max_threads();
  for (int threads : {1, 16}) {  // the fused and the split backward schedules
    omp_set_num_threads(threads);
    Tensors clean = make_inputs(d, 9);
    run_kernels(d, true, 0.2f, clean, nullptr, W);
    Tensors far_keys = make_inputs(d, 9), far_queries = make_inputs(d, 9);
    for (int64_t j = 0; j < 64; ++j)
      for (int64_t e = 0; e < d.NKV * d.D; ++e)
        far_keys.k[j * d.NKV * d.D + e] = far_keys.v[j * d.NKV * d.D + e] = NAN;
    for (int64_t i = 192; i < 256; ++i)
      for (int64_t e = 0; e < d.NH * d.D; ++e)
        far_queries.q[i * d.NH * d.D + e] = far_queries.dout[i * d.NH * d.D + e] = NAN;
    run_kernels(d, true, 0.2f, far_keys, nullptr, W);
    run_kernels(d, true, 0.2f, far_queries, nullptr, W);
    const std::string where = std::to_string(threads) + " threads";
    // Queries from 128 on (out, dq; lse is [NH, S]) never read keys 0..63.
    const size_t q_from = 128 * d.NH * d.D;
    EXPECT_EQ(0, std::memcmp(clean.out.data() + q_from, far_keys.out.data() + q_from,
                             (clean.out.size() - q_from) * sizeof(float))) << "out, " << where;
    EXPECT_EQ(0, std::memcmp(clean.dq.data() + q_from, far_keys.dq.data() + q_from,
                             (clean.dq.size() - q_from) * sizeof(float))) << "dq, " << where;
    for (int64_t h = 0; h < d.NH; ++h)
      EXPECT_EQ(0, std::memcmp(clean.lse.data() + h * d.S + 128, far_keys.lse.data() + h * d.S + 128,
                               128 * sizeof(float))) << "lse, " << where;
    // Keys 0..63 (dk, dv) never meet queries from 192 on.
    const size_t k_to = 64 * d.NKV * d.D;
    EXPECT_EQ(0, std::memcmp(clean.dk.data(), far_queries.dk.data(), k_to * sizeof(float))) << "dk, " << where;
    EXPECT_EQ(0, std::memcmp(clean.dv.data(), far_queries.dv.data(), k_to * sizeof(float))) << "dv, " << where;
  }
  omp_set_num_threads(saved);
}

// With a window too, results are bitwise the same on any thread count and schedule.
TEST(AttentionKernelWindow, BitwiseEqualAcrossThreadCountsAndSchedules) {
  const int saved = omp_get_max_threads();
  bool saw_split = false, saw_fused = false;
  for (const AttentionDims d : {AttentionDims{2, 300, 8, 2, 64}, AttentionDims{1, 300, 4, 2, 40}})
    for (bool packed : {false, true}) {
      const std::vector<int32_t> docs = documents_of(d, {{37, 127, 100}, {64, 1, 170}});
      Tensors one = make_inputs(d, 5);
      omp_set_num_threads(1);
      run_kernels(d, true, 0.125f, one, packed ? docs.data() : nullptr, 90);
      for (int threads : {3, 16}) {
        Tensors many = make_inputs(d, 5);
        omp_set_num_threads(threads);
        const bool split = autosp::cpu::attention_backward_is_split(d, threads);
        (split ? saw_split : saw_fused) = true;
        run_kernels(d, true, 0.125f, many, packed ? docs.data() : nullptr, 90);
        const std::string where = "B=" + std::to_string(d.B) + (packed ? " packed " : " ") + std::to_string(threads) +
                                  " threads";
        for (auto [a, b, name] : {std::tuple{&one.out, &many.out, "out"}, {&one.lse, &many.lse, "lse"},
                                  {&one.dq, &many.dq, "dq"}, {&one.dk, &many.dk, "dk"}, {&one.dv, &many.dv, "dv"}})
          EXPECT_EQ(0, std::memcmp(a->data(), b->data(), a->size() * sizeof(float))) << name << ", " << where;
      }
    }
  omp_set_num_threads(saved);
  EXPECT_TRUE(saw_split && saw_fused) << "both backward schedules must be compared";
}

// ---- logit softcap (Gemma 2) -----------------------------------------------------------------
// Scores of these inputs reach about +-5 (|q|, |k| up to 2 per element); caps of 1 and 4 bend
// most of them, so a cap left out of either direction, or a backward without its 1 - tanh^2,
// is off by 1e-1 or more. Observed at most 1.2e-6 (out, lse, dq, dk, dv): the rational tanh's
// few ulp (simd::vtanh) add nothing visible to the fp32 sums, so the same 1e-5 as above.
TEST(AttentionKernelSoftcap, ForwardAndBackwardMatchDouble) {
  double worst = 0.0;
  for (float softcap : {1.0f, 4.0f})
    for (int64_t S : {1, 100, 257})
      for (auto [NH, NKV] : {std::pair<int64_t, int64_t>{4, 2}, {4, 1}})
        for (int64_t D : {16, 40})
          for (int variant = 0; variant < 4; ++variant) {  // full, causal, causal + window, causal + documents
            const bool causal = variant > 0;
            const int64_t window = variant == 2 ? 70 : 0;
            const AttentionDims d{2, S, NH, NKV, D};
            const std::vector<int32_t> docs = documents_of(d, {{37, 27, 100}, {64, 1, 70}});
            const int32_t* ids = variant == 3 ? docs.data() : nullptr;
            const std::string at = "softcap " + std::to_string(softcap) + " S=" + std::to_string(S) + " NH=" +
                                   std::to_string(NH) + " NKV=" + std::to_string(NKV) + " D=" + std::to_string(D) +
                                   " variant " + std::to_string(variant);
            const float scale = 1.0f / std::sqrt(static_cast<float>(D));
            Tensors t = make_inputs(d, static_cast<uint32_t>(S + NH + NKV + D + variant));
            run_kernels(d, causal, scale, t, ids, window, softcap);
            std::vector<double> out(t.out.size()), lse(t.lse.size());
            std::vector<double> dq(t.dq.size()), dk(t.dk.size()), dv(t.dv.size());
            const auto q = to_double(t.q), k = to_double(t.k), v = to_double(t.v), dout = to_double(t.dout);
            autosp::cpu::attention_forward_reference(d, causal, scale, q.data(), k.data(), v.data(), out.data(),
                                                     lse.data(), ids, window, softcap);
            autosp::cpu::attention_backward_reference(d, causal, scale, q.data(), k.data(), v.data(), dout.data(),
                                                      dq.data(), dk.data(), dv.data(), ids, window, softcap);
            for (auto [x, ref, name] : {std::tuple{&t.out, &out, "out"}, {&t.lse, &lse, "lse"}, {&t.dq, &dq, "dq"},
                                        {&t.dk, &dk, "dk"}, {&t.dv, &dv, "dv"}}) {
              const double e = normalised_max_error(*x, *ref);
              worst = std::max(worst, e);
              EXPECT_LE(e, kTolerance) << name << ", " << at;
            }
          }
  std::printf("softcap: worst normalised error %.3g\n", worst);
}

// The cap changes the numbers: the same inputs without it differ by far more than the
// tolerance (so the test above cannot pass with a kernel that ignores softcap), and a cap far
// above every score (1e4) is the uncapped attention within rounding.
TEST(AttentionKernelSoftcap, ACapBendsTheScoresAndAFarCapDoesNot) {
  const AttentionDims d{1, 100, 4, 2, 16};
  Tensors plain = make_inputs(d, 11), capped = make_inputs(d, 11), far = make_inputs(d, 11);
  run_kernels(d, true, 0.25f, plain);
  run_kernels(d, true, 0.25f, capped, nullptr, 0, 1.0f);
  run_kernels(d, true, 0.25f, far, nullptr, 0, 1e4f);
  for (auto [a, b, c, name] : {std::tuple{&plain.out, &capped.out, &far.out, "out"},
                               {&plain.dq, &capped.dq, &far.dq, "dq"}, {&plain.dk, &capped.dk, &far.dk, "dk"}}) {
    EXPECT_GT(normalised_max_error(*b, to_double(*a)), 1e-2) << name;
    EXPECT_LE(normalised_max_error(*c, to_double(*a)), kTolerance) << name;
  }
}

// Runs the kernels on 1 thread, then on 3 and 16 (the split backward schedule and the fused
// one both met), with a softcap (0: none) and slopes (null: none), and expects every result
// bitwise the same.
void expect_bitwise_across_threads(float softcap, std::vector<float> (*slopes_of)(int64_t), uint32_t seed) {
  const int saved = omp_get_max_threads();
  bool saw_split = false, saw_fused = false;
  for (const AttentionDims d : {AttentionDims{2, 200, 8, 2, 64}, AttentionDims{1, 200, 4, 2, 40}}) {
    const std::vector<float> slopes = slopes_of ? slopes_of(d.NH) : std::vector<float>{};
    const float* alibi = slopes.empty() ? nullptr : slopes.data();
    Tensors one = make_inputs(d, seed);
    omp_set_num_threads(1);
    run_kernels(d, true, 0.125f, one, nullptr, 0, softcap, alibi);
    for (int threads : {3, 16}) {
      Tensors many = make_inputs(d, seed);
      omp_set_num_threads(threads);
      const bool split = autosp::cpu::attention_backward_is_split(d, threads);
      (split ? saw_split : saw_fused) = true;
      run_kernels(d, true, 0.125f, many, nullptr, 0, softcap, alibi);
      const std::string where = "B=" + std::to_string(d.B) + " " + std::to_string(threads) + " threads";
      for (auto [a, b, name] : {std::tuple{&one.out, &many.out, "out"}, {&one.lse, &many.lse, "lse"},
                                {&one.dq, &many.dq, "dq"}, {&one.dk, &many.dk, "dk"}, {&one.dv, &many.dv, "dv"}})
        EXPECT_EQ(0, std::memcmp(a->data(), b->data(), a->size() * sizeof(float))) << name << ", " << where;
    }
  }
  omp_set_num_threads(saved);
  EXPECT_TRUE(saw_split && saw_fused) << "both backward schedules must be compared";
}

// With a cap too, results are bitwise the same on any thread count and schedule.
TEST(AttentionKernelSoftcap, BitwiseEqualAcrossThreadCountsAndSchedules) {
  expect_bitwise_across_threads(3.0f, nullptr, 13);
}

// ---- ALiBi (BLOOM, MPT) ----------------------------------------------------------------------
// BLOOM's slopes for NH heads: 2^(-8 (h + 1) / NH) for a power of two, else those of the power
// below and every other one of twice it (transformers' build_alibi_tensor).
std::vector<float> bloom_slopes(int64_t NH) {
  int64_t p = 1;
  while (2 * p <= NH) p *= 2;
  std::vector<float> a;
  for (int64_t h = 1; h <= p; ++h) a.push_back(float(std::pow(2.0, -8.0 * double(h) / double(p))));
  for (int64_t h = 1; int64_t(a.size()) < NH; h += 2) a.push_back(float(std::pow(2.0, -4.0 * double(h) / double(p))));
  return a;
}

// Scores reach about +-5 here and the bias a_h (j - i) reaches -0.5 x 256 in head 0 (slopes
// 1/2 .. 1/256, or 3 heads' interpolated ones), so far keys weigh little in the steep heads
// and much in the flat ones; a bias left out, of the wrong sign or of the wrong head is off
// by 1e-1 or more (checked below). Causal, observed at most 2.0e-6: the same 1e-5 as above.
// Full attention (no model uses ALiBi so, but the op allows it) biases the keys after the
// query upwards, to +128 at S = 257, where one fp32 ulp of a score is 7.6e-6 of a probability:
// observed up to 7.8e-6 (dq), so 3e-5 there.
constexpr double kFullTolerance = 3e-5;
TEST(AttentionKernelAlibi, ForwardAndBackwardMatchDouble) {
  double worst = 0.0;
  for (int64_t S : {1, 100, 257})
    for (auto [NH, NKV] : {std::pair<int64_t, int64_t>{8, 2}, {6, 3}, {3, 1}})
      for (int64_t D : {16, 40})
        for (int variant = 0; variant < 4; ++variant) {  // full, causal, causal + window, causal + documents
          const bool causal = variant > 0;
          const int64_t window = variant == 2 ? 70 : 0;
          const AttentionDims d{2, S, NH, NKV, D};
          const std::vector<int32_t> docs = documents_of(d, {{37, 27, 100}, {64, 1, 70}});
          const int32_t* ids = variant == 3 ? docs.data() : nullptr;
          const std::vector<float> slopes = bloom_slopes(NH);
          const std::vector<double> slopes64(slopes.begin(), slopes.end());
          const std::string at = "S=" + std::to_string(S) + " NH=" + std::to_string(NH) + " NKV=" +
                                 std::to_string(NKV) + " D=" + std::to_string(D) + " variant " +
                                 std::to_string(variant);
          const float scale = 1.0f / std::sqrt(static_cast<float>(D));
          Tensors t = make_inputs(d, static_cast<uint32_t>(7 * S + NH + NKV + D + variant));
          run_kernels(d, causal, scale, t, ids, window, 0.0f, slopes.data());
          std::vector<double> out(t.out.size()), lse(t.lse.size());
          std::vector<double> dq(t.dq.size()), dk(t.dk.size()), dv(t.dv.size());
          const auto q = to_double(t.q), k = to_double(t.k), v = to_double(t.v), dout = to_double(t.dout);
          autosp::cpu::attention_forward_reference(d, causal, scale, q.data(), k.data(), v.data(), out.data(),
                                                   lse.data(), ids, window, 0.0, slopes64.data());
          autosp::cpu::attention_backward_reference(d, causal, scale, q.data(), k.data(), v.data(), dout.data(),
                                                    dq.data(), dk.data(), dv.data(), ids, window, 0.0,
                                                    slopes64.data());
          for (auto [x, ref, name] : {std::tuple{&t.out, &out, "out"}, {&t.lse, &lse, "lse"}, {&t.dq, &dq, "dq"},
                                      {&t.dk, &dk, "dk"}, {&t.dv, &dv, "dv"}}) {
            const double e = normalised_max_error(*x, *ref);
            worst = std::max(worst, e);
            EXPECT_LE(e, causal ? kTolerance : kFullTolerance) << name << ", " << at;
          }
        }
  std::printf("alibi: worst normalised error %.3g\n", worst);
}

// The bias changes the numbers (so the test above cannot pass with a kernel that ignores
// it, or reads another head's slope), and slopes of 0 are plain attention bitwise.
TEST(AttentionKernelAlibi, TheBiasChangesTheResultsAndZeroSlopesDoNot) {
  const AttentionDims d{1, 130, 4, 2, 16};
  const std::vector<float> slopes = bloom_slopes(4), reversed(slopes.rbegin(), slopes.rend()), zeros(4, 0.0f);
  Tensors plain = make_inputs(d, 21), biased = make_inputs(d, 21), swapped = make_inputs(d, 21),
          zero = make_inputs(d, 21);
  run_kernels(d, true, 0.25f, plain);
  run_kernels(d, true, 0.25f, biased, nullptr, 0, 0.0f, slopes.data());
  run_kernels(d, true, 0.25f, swapped, nullptr, 0, 0.0f, reversed.data());
  run_kernels(d, true, 0.25f, zero, nullptr, 0, 0.0f, zeros.data());
  for (auto [a, b, c, z, name] :
       {std::tuple{&plain.out, &biased.out, &swapped.out, &zero.out, "out"},
        {&plain.dq, &biased.dq, &swapped.dq, &zero.dq, "dq"}, {&plain.dk, &biased.dk, &swapped.dk, &zero.dk, "dk"}}) {
    EXPECT_GT(normalised_max_error(*b, to_double(*a)), 1e-1) << name;
    EXPECT_GT(normalised_max_error(*c, to_double(*b)), 1e-1) << name;
    EXPECT_EQ(0, std::memcmp(a->data(), z->data(), a->size() * sizeof(float))) << name;
  }
}

// With slopes too, results are bitwise the same on any thread count and schedule.
TEST(AttentionKernelAlibi, BitwiseEqualAcrossThreadCountsAndSchedules) {
  expect_bitwise_across_threads(0.0f, bloom_slopes, 17);
}

// The backward pass reduces GQA's dk, dv in a fixed order and never lets the schedule
// decide a sum, so results must be bitwise equal on 1 and on several threads, also where
// the thread count switches attention_backward from its fused schedule (over heads) to
// the split one (over key blocks, then query blocks).
TEST(AttentionKernelDeterminism, BitwiseEqualAcrossThreadCountsAndSchedules) {
  const int saved = omp_get_max_threads();
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  bool saw_split = false, saw_fused = false;
  for (const AttentionDims d : {AttentionDims{2, 200, 8, 2, 64}, AttentionDims{1, 200, 4, 2, 64},
                                AttentionDims{1, 130, 2, 2, 40}, AttentionDims{1, 200, 3, 1, 32}}) {
    for (bool causal : {true, false}) {
      const std::string at = "B=" + std::to_string(d.B) + " NH=" + std::to_string(d.NH) + " NKV=" +
                             std::to_string(d.NKV) + (causal ? " causal" : "");
      Tensors one = make_inputs(d, 7);
      omp_set_num_threads(1);
      ASSERT_FALSE(autosp::cpu::attention_backward_is_split(d, 1));
      run_kernels(d, causal, 0.125f, one);
      for (int threads : {3, 16}) {
        Tensors many = make_inputs(d, 7);
        omp_set_num_threads(threads);
        const bool split = autosp::cpu::attention_backward_is_split(d, threads);
        (split ? saw_split : saw_fused) = true;
        run_kernels(d, causal, 0.125f, many);
        const std::string where = at + ", " + std::to_string(threads) + " threads" + (split ? " (split)" : " (fused)");
        EXPECT_TRUE(same(one.out, many.out)) << where;
        EXPECT_TRUE(same(one.lse, many.lse)) << where;
        EXPECT_TRUE(same(one.dq, many.dq)) << where;
        EXPECT_TRUE(same(one.dk, many.dk)) << where;
        EXPECT_TRUE(same(one.dv, many.dv)) << where;
      }
    }
  }
  omp_set_num_threads(saved);
  EXPECT_TRUE(saw_split && saw_fused) << "both backward schedules must be compared";
}

// The workspace must grow linearly in S, never as S^2.
TEST(AttentionKernelWorkspace, GrowsLinearlyInS) {
  for (int threads : {1, 2, 16}) {
    auto total = [&](int64_t S) {
      const AttentionDims d{1, S, 32, 8, 128};
      return autosp::cpu::attention_forward_workspace_floats(d, threads) +
             autosp::cpu::attention_backward_workspace_floats(d, threads);
    };
    const double per_s_4k = static_cast<double>(total(4096)) / 4096;
    const double per_s_16k = static_cast<double>(total(16384)) / 16384;
    // Affine in S (fixed tiles + S-long rows), so floats per position cannot increase.
    EXPECT_LE(per_s_16k, per_s_4k) << threads << " threads";
    // And below a single S x S score matrix even on 16 threads with D = 128.
    EXPECT_LT(total(16384), int64_t{16384} * 16384) << threads << " threads";
  }
}

// Double-precision statistics of one query row, O(S D): lse_i and out_i.
void reference_row(const AttentionDims& d, const Tensors& t, double scale, int64_t h, int64_t i,
                   double* lse, std::vector<double>& out) {
  const int64_t G = d.NH / d.NKV;
  std::vector<double> s(i + 1);
  double mx = -INFINITY;
  for (int64_t j = 0; j <= i; ++j) {  // causal, B = 1
    double dot = 0.0;
    for (int64_t dd = 0; dd < d.D; ++dd)
      dot += double(t.q[(i * d.NH + h) * d.D + dd]) * t.k[(j * d.NKV + h / G) * d.D + dd];
    s[j] = scale * dot;
    mx = std::max(mx, s[j]);
  }
  double sum = 0.0;
  for (auto& e : s) sum += (e = std::exp(e - mx));
  out.assign(d.D, 0.0);
  for (int64_t j = 0; j <= i; ++j)
    for (int64_t dd = 0; dd < d.D; ++dd) out[dd] += s[j] / sum * t.v[(j * d.NKV + h / G) * d.D + dd];
  *lse = mx + std::log(sum);
}

// S = 16384 with exactly the advertised workspace (an S x S fp32 matrix per head would be
// 1 GiB). Spot-checks against O(S D) double computations: out, lse and dq on a few query
// rows, and dk, dv of the last keys (only the last few queries see them).
TEST(AttentionKernelWorkspace, LongSequenceRunsInLinearWorkspace) {
  const AttentionDims d{1, 16384, 4, 2, 64};
  const double scale = 0.125;
  const int64_t G = d.NH / d.NKV;
  Tensors t = make_inputs(d, 11);
  run_kernels(d, true, static_cast<float>(scale), t);

  auto qrow = [&](const std::vector<float>& x, int64_t i, int64_t h) { return &x[(i * d.NH + h) * d.D]; };
  auto krow = [&](const std::vector<float>& x, int64_t j, int64_t h) { return &x[(j * d.NKV + h / G) * d.D]; };
  // P_ij and dS_ij = P_ij (dP_ij - delta_i) of one causal entry, from the double row stats.
  auto p_ds = [&](int64_t h, int64_t i, int64_t j, double lse_i, const std::vector<double>& out_i,
                  double* p, double* ds) {
    double s = 0.0, dp = 0.0, delta = 0.0;
    for (int64_t dd = 0; dd < d.D; ++dd) {
      s += double(qrow(t.q, i, h)[dd]) * krow(t.k, j, h)[dd];
      dp += double(qrow(t.dout, i, h)[dd]) * krow(t.v, j, h)[dd];
      delta += qrow(t.dout, i, h)[dd] * out_i[dd];
    }
    *p = std::exp(scale * s - lse_i);
    *ds = *p * (dp - delta);
  };

  // Per tensor: the largest error over the sampled rows / the largest reference value.
  enum { kOut, kLse, kDq, kDk, kDv, kCount };
  double err[kCount] = {}, ref_scale[kCount] = {};
  auto record = [&](int which, double got, double want) {
    err[which] = std::max(err[which], std::abs(got - want));
    ref_scale[which] = std::max(ref_scale[which], std::abs(want));
  };
  for (int64_t h = 0; h < d.NH; ++h)
    for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{4999}, d.S - 1}) {
      double lse_i;
      std::vector<double> out_i;
      reference_row(d, t, scale, h, i, &lse_i, out_i);
      record(kLse, t.lse[h * d.S + i], lse_i);
      std::vector<double> dq_i(d.D, 0.0);
      for (int64_t j = 0; j <= i; ++j) {
        double p, ds;
        p_ds(h, i, j, lse_i, out_i, &p, &ds);
        for (int64_t dd = 0; dd < d.D; ++dd) dq_i[dd] += scale * ds * krow(t.k, j, h)[dd];
      }
      for (int64_t dd = 0; dd < d.D; ++dd) {
        record(kOut, qrow(t.out, i, h)[dd], out_i[dd]);
        record(kDq, qrow(t.dq, i, h)[dd], dq_i[dd]);
      }
    }
  // dk_j, dv_j of the last 3 keys: sum over each group's query heads and queries i >= j.
  for (int64_t kvh = 0; kvh < d.NKV; ++kvh)
    for (int64_t j = d.S - 3; j < d.S; ++j) {
      std::vector<double> dk_j(d.D, 0.0), dv_j(d.D, 0.0);
      for (int64_t h = kvh * G; h < (kvh + 1) * G; ++h)
        for (int64_t i = j; i < d.S; ++i) {
          double lse_i, p, ds;
          std::vector<double> out_i;
          reference_row(d, t, scale, h, i, &lse_i, out_i);
          p_ds(h, i, j, lse_i, out_i, &p, &ds);
          for (int64_t dd = 0; dd < d.D; ++dd) {
            dk_j[dd] += scale * ds * qrow(t.q, i, h)[dd];
            dv_j[dd] += p * qrow(t.dout, i, h)[dd];
          }
        }
      for (int64_t dd = 0; dd < d.D; ++dd) {
        record(kDk, t.dk[(j * d.NKV + kvh) * d.D + dd], dk_j[dd]);
        record(kDv, t.dv[(j * d.NKV + kvh) * d.D + dd], dv_j[dd]);
      }
    }
  // Observed: out 1.5e-7, lse 5.2e-8, dq 2.0e-7, dk 5.2e-7, dv 4.9e-7. Same 1e-5 as the
  // matrix: longer fp32 sums (16384 keys) have not needed more.
  const char* names[kCount] = {"out", "lse", "dq", "dk", "dv"};
  for (int which = 0; which < kCount; ++which)
    EXPECT_LE(err[which] / ref_scale[which], kTolerance) << names[which];
  for (const auto* x : {&t.out, &t.lse, &t.dq, &t.dk, &t.dv})
    EXPECT_TRUE(std::all_of(x->begin(), x->end(), [](float e) { return std::isfinite(e); }));
}

}  // namespace
