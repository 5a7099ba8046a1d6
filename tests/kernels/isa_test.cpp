// The per-instruction-set kernel copies (kernels/cpu/isa.h): choosing one, refusing what
// the CPU cannot run, and the two copies agreeing with each other. Each copy is also held
// to the double references by the kernel tests, which ctest runs once per instruction set
// (kernels_avx2 runs them with AUTOSP_ISA=avx2).
#include "kernels/cpu/isa.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/isa_kernels.h"
#include "testing/compare.h"
#include "util/error.h"

namespace {

namespace cpu = autosp::cpu;
using autosp::UserError;
using autosp::testing::normalised_error;

std::vector<float> random_floats(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> x(n);
  for (auto& e : x) e = dist(gen);
  return x;
}

bool both_run() { return cpu::cpu_supports(cpu::Isa::avx2) && cpu::cpu_supports(cpu::Isa::avx512); }

TEST(Isa, NamesParseAndUnknownOnesAreErrorsNamingTheVariable) {
  for (cpu::Isa isa : cpu::built_isas()) EXPECT_EQ(cpu::parse_isa(cpu::isa_name(isa), "X"), isa);
  try {
    cpu::parse_isa("avx", "AUTOSP_ISA");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("AUTOSP_ISA=avx"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("avx2 or avx512"), std::string::npos) << e.what();
  }
}

TEST(Isa, TheActiveSetIsOneThisCpuRunsAndSettingItSticks) {
  ASSERT_TRUE(cpu::cpu_runs_baseline());  // else the test binary could not have started
  const std::vector<cpu::Isa> ok = cpu::supported_isas();
  ASSERT_FALSE(ok.empty());
  EXPECT_EQ(ok.front(), cpu::Isa::avx2);
  const cpu::Isa before = cpu::active_isa();
  EXPECT_TRUE(cpu::cpu_supports(before));
  for (cpu::Isa isa : ok) {
    cpu::set_active_isa(isa);
    EXPECT_EQ(cpu::active_isa(), isa);
    EXPECT_NE(cpu::kernels_summary().find(std::string("cpu kernels: ") + cpu::isa_name(isa)), std::string::npos);
  }
  cpu::set_active_isa(before);
}

TEST(Isa, AnInstructionSetThisCpuLacksIsRefused) {
  if (cpu::cpu_supports(cpu::Isa::avx512)) GTEST_SKIP() << "this CPU runs every built instruction set";
  EXPECT_THROW(cpu::set_active_isa(cpu::Isa::avx512), UserError);
  EXPECT_EQ(cpu::active_isa(), cpu::Isa::avx2);
}

// The two attention copies use different register tiles and vector widths, so they sum in
// different orders; they must agree to fp32 rounding (each is within 2e-6 of the double
// reference in attention_test.cpp). S = 200 is not a multiple of the tile, D = 40 not of
// either vector width, NH / NKV = 3; also with documents (packed samples) whose boundaries
// fall inside tiles and on a tile edge, and with a sliding window of 50 (tiles wholly
// outside it skipped, tiles across its edge masked), alone and with the documents; with a
// logit softcap (simd::vtanh at each width) alone and with documents and the window.
TEST(Isa, Avx2AndAvx512AttentionAgree) {
  if (!both_run()) GTEST_SKIP() << "needs a CPU with AVX-512 to run both copies";
  struct Case {
    int64_t D;
    bool packed;
    int64_t window;
    float softcap;
    bool alibi;
  };
  for (auto [D, packed, window, softcap, alibi] : {Case{40, false, 0, 0, false},
                                                   {64, false, 0, 0, false},
                                                   {40, true, 0, 0, false},
                                                   {64, true, 0, 0, false},
                                                   {40, false, 50, 0, false},
                                                   {64, true, 50, 0, false},
                                                   {40, false, 0, 2, false},
                                                   {64, true, 50, 2, false},
                                                   {40, false, 0, 0, true},
                                                   {64, true, 50, 0, true}}) {
    const cpu::AttentionDims d{2, 200, 6, 2, D};
    const size_t nq = d.B * d.S * d.NH * d.D, nk = d.B * d.S * d.NKV * d.D;
    const auto q = random_floats(nq, 1, -2, 2), k = random_floats(nk, 2, -2, 2);
    const auto v = random_floats(nk, 3, -1, 1), dout = random_floats(nq, 4, -1, 1);
    std::vector<int32_t> documents(d.B * d.S);
    for (int64_t i = 0; i < d.S; ++i) {
      documents[i] = (i >= 37) + (i >= 64) + (i >= 150);  // row 0: 4 documents
      documents[d.S + i] = (i >= 128);                    // row 1: 2, split on a tile edge
    }
    const int32_t* docs = packed ? documents.data() : nullptr;
    const std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f, 0.7071068f, 0.17677669f};  // 6 heads
    const float* slope = alibi ? slopes.data() : nullptr;
    struct Result {
      std::vector<float> out, lse, dq, dk, dv;
    };
    auto run = [&](auto fwd_ws, auto bwd_ws, auto fwd, auto bwd) {
      const int threads = 2;
      Result r{std::vector<float>(nq), std::vector<float>(d.B * d.NH * d.S), std::vector<float>(nq),
               std::vector<float>(nk), std::vector<float>(nk)};
      std::vector<float> ws(std::max(fwd_ws(d, threads), bwd_ws(d, threads)), NAN);
      const float scale = 1.0f / std::sqrt(float(D));
      fwd(d, true, scale, q.data(), k.data(), v.data(), r.out.data(), r.lse.data(), ws.data(), threads, docs, window,
          softcap, slope);
      bwd(d, true, scale, q.data(), k.data(), v.data(), r.out.data(), r.lse.data(), dout.data(),
          r.dq.data(), r.dk.data(), r.dv.data(), ws.data(), threads, docs, window, softcap, slope);
      return r;
    };
    const Result a = run(cpu::avx2::attention_forward_workspace_floats, cpu::avx2::attention_backward_workspace_floats,
                         cpu::avx2::attention_forward, cpu::avx2::attention_backward);
    const Result b = run(cpu::avx512::attention_forward_workspace_floats,
                         cpu::avx512::attention_backward_workspace_floats, cpu::avx512::attention_forward,
                         cpu::avx512::attention_backward);
    const std::string at = autosp::str("D=", D, " packed=", packed, " window=", window, " softcap=", softcap,
                                  " alibi=", alibi);
    EXPECT_LT(normalised_error(a.out, b.out), 4e-6) << at;
    EXPECT_LT(normalised_error(a.lse, b.lse), 4e-6) << at;
    EXPECT_LT(normalised_error(a.dq, b.dq), 4e-6) << at;
    EXPECT_LT(normalised_error(a.dk, b.dk), 4e-6) << at;
    EXPECT_LT(normalised_error(a.dv, b.dv), 4e-6) << at;
  }
}

TEST(Isa, Avx2AndAvx512RowKernelsAgree) {
  if (!both_run()) GTEST_SKIP() << "needs a CPU with AVX-512 to run both copies";
  const int64_t T = 37, H = 301, V = 1003;  // no multiple of either vector width
  const auto x = random_floats(T * H, 5, -2, 2), w = random_floats(H, 6, 0.5, 1.5);
  std::vector<float> y2(T * H), y5(T * H), r2(T), r5(T);
  cpu::avx2::rms_norm_forward(x.data(), w.data(), T, H, 1e-6f, y2.data(), r2.data());
  cpu::avx512::rms_norm_forward(x.data(), w.data(), T, H, 1e-6f, y5.data(), r5.data());
  EXPECT_LT(normalised_error(y2, y5), 1e-6);
  EXPECT_LT(normalised_error(r2, r5), 1e-6);

  const auto logits = random_floats(T * V, 7, -8, 8);
  std::vector<int32_t> labels(T);
  for (int64_t t = 0; t < T; ++t) labels[t] = int32_t((t * 131) % V);
  for (const float softcap : {0.0f, 3.0f}) {  // with Gemma 2's final logit softcap too
    std::vector<float> loss2(1), loss5(1), lse2(T), lse5(T), g2(T * V), g5(T * V);
    cpu::avx2::cross_entropy_forward(logits.data(), labels.data(), T, V, -100, loss2.data(), lse2.data(), softcap);
    cpu::avx512::cross_entropy_forward(logits.data(), labels.data(), T, V, -100, loss5.data(), lse5.data(), softcap);
    EXPECT_LT(normalised_error(lse2, lse5), 1e-6) << "softcap " << softcap;
    EXPECT_LT(normalised_error(loss2, loss5), 1e-6) << "softcap " << softcap;
    const float one = 1.0f;
    cpu::avx2::cross_entropy_backward(&one, logits.data(), labels.data(), lse2.data(), T, V, -100, g2.data(), softcap);
    cpu::avx512::cross_entropy_backward(&one, logits.data(), labels.data(), lse5.data(), T, V, -100, g5.data(),
                                        softcap);
    EXPECT_LT(normalised_error(g2, g5), 1e-5) << "softcap " << softcap;
  }
}

}  // namespace
