// Kernel benchmark: every CPU kernel against a baseline measured in the same run, as a
// ratio (STYLE.md rule 10). Compute-bound kernels (linear, attention) are compared with
// OpenBLAS sgemm's FLOP/s and, per instruction set, with that set's peak FMA throughput;
// memory-bound kernels with a parallel memcpy's bandwidth.
//
//   bench_kernels [--isa avx2|avx512] [--only NAME[,NAME...]] [out.json]
//                                     (default bench_kernels.json)
//
// The kernels autosp compiles once per instruction set (gemm, attention, embedding, rms_norm,
// rope, swiglu, cross_entropy; src/kernels/cpu/isa.h) run once per set this CPU supports
// (cpu::set_active_isa before each; rows and JSON carry the set), so an AVX-512 machine
// measures the AVX2 kernels too (STYLE.md rule 13). --isa runs one set only. The baselines
// (sgemm 2048 and memcpy, at the start and the end, and OpenBLAS at each linear shape) do
// not depend on the set and run once; linear (cpu::gemm, autosp's own gemm since issue 25)
// runs per set: x W^T at T 4096, and the bench model's forward, dx and dW gemms at S 2048.
//
// --only runs the named parts: sgemm, linear, memcpy, fma_peak, attention, documents, window,
// rms_norm, rope, swiglu, cross_entropy, embedding (e.g. --only sgemm,attention). A part's
// baselines run with it (attention, documents, window: sgemm and fma_peak; linear: sgemm; the
// memory-bound kernels: memcpy), so every ratio printed is against a baseline of this run;
// documents and window also time full causal attention of their S, their own baseline.
//
// Threads: OMP_NUM_THREADS (default all cores); OpenBLAS is set to the same count.
// OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are read from the environment, never changed.
//
// Before a kernel is timed, its output is checked (finite everywhere; gemm and attention
// spot rows against double sums; attention at a small size against attention.h's double
// references, for every instruction set), so a broken kernel exits non-zero instead of
// reporting a fast time. The first (checked) run is also the warm-up; the time reported is
// the median of the timed repetitions, whose number shrinks for slow cases to keep the run
// near 3 minutes per instruction set on 2 cores.
#include <CLI/CLI.hpp>
#include <cblas.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <ctime>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/basic.h"
#include "kernels/cpu/fused.h"
#include "kernels/cpu/isa.h"

namespace {

namespace cpu = autosp::cpu;
using Clock = std::chrono::steady_clock;

// ---- timing ------------------------------------------------------------------------------
struct Timing {
  double median_s, min_s, first_s;
  int reps;
  // Process CPU time / (wall time x threads) over the timed runs. Well below 1 means other
  // processes took the cores and the time is inflated (spinning workers count as busy, so
  // 1 does not prove the opposite).
  double cpu_share;
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// Runs `run` once (warm-up), `check`s its output, then times odd-many repetitions: as many
// as fit in budget_s, at least min_reps, at most max_reps. Finiteness is checked again
// after timing, so a kernel that goes wrong on a later run cannot hide either.
// min_reps = 0: when the checked run alone exceeds the budget, it is the one timed run (for
// the slowest cases, whose buffers and threads an earlier case has already warmed).
Timing measure(const std::function<void()>& run, const std::function<void()>& check,
               double budget_s, int min_reps = 3, int max_reps = 15) {
  auto t0 = Clock::now();
  double c0 = process_cpu_s();
  run();
  const double first = seconds_since(t0);
  const double first_cpu = process_cpu_s() - c0;
  check();
  const int threads = omp_get_max_threads();
  if (min_reps == 0 && first >= budget_s)
    return {first, first, first, 1, first_cpu / (first * threads)};
  int reps = static_cast<int>(budget_s / std::max(first, 1e-9));
  reps = std::clamp(reps, std::max(min_reps, 1), max_reps);
  if (reps % 2 == 0) reps = reps > min_reps ? reps - 1 : reps + 1;
  std::vector<double> t(reps);
  c0 = process_cpu_s();
  for (int r = 0; r < reps; ++r) {
    t0 = Clock::now();
    run();
    t[r] = seconds_since(t0);
  }
  const double cpu = process_cpu_s() - c0;
  double wall = 0.0;
  for (double x : t) wall += x;
  check();
  std::sort(t.begin(), t.end());
  return {t[reps / 2], t[0], first, reps, cpu / (wall * threads)};
}

// ---- checks ------------------------------------------------------------------------------
[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "bench_kernels: CHECK FAILED: %s\n", what.c_str());
  std::exit(1);
}

void check_finite(const std::string& what, const float* x, int64_t n) {
  int64_t bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static)
  for (int64_t i = 0; i < n; ++i) bad += !std::isfinite(x[i]);
  if (bad) fail(what + ": " + std::to_string(bad) + " of " + std::to_string(n) + " not finite");
}

// max |x - ref| / max |ref|, as in tests/kernels/attention_test.cpp.
double normalised_max_error(const float* x, const double* ref, int64_t n) {
  double err = 0.0, scale = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    err = std::max(err, std::abs(static_cast<double>(x[i]) - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return err / (scale > 1e-12 ? scale : 1.0);
}

void check_close(const std::string& what, const float* x, const double* ref, int64_t n,
                 double tol) {
  const double e = normalised_max_error(x, ref, n);
  if (!(e <= tol)) fail(what + ": normalised max error " + std::to_string(e) + " > " +
                        std::to_string(tol));
}

std::vector<float> random_floats(int64_t n, uint32_t seed, float lo, float hi) {
  std::vector<float> x(n);
  // Seeded per chunk so the fill is parallel and still deterministic.
  const int64_t chunk = 1 << 16;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < (n + chunk - 1) / chunk; ++c) {
    std::mt19937 gen(seed * 7919u + static_cast<uint32_t>(c));
    std::uniform_real_distribution<float> dist(lo, hi);
    for (int64_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i) x[i] = dist(gen);
  }
  return x;
}

std::vector<int32_t> random_ints(int64_t n, uint32_t seed, int32_t hi) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, hi - 1);
  std::vector<int32_t> x(n);
  for (auto& e : x) e = dist(gen);
  return x;
}

// ---- results -----------------------------------------------------------------------------
struct Row {
  std::string name, shape;
  Timing t;
  double work;           // FLOPs or bytes per call
  bool flops;            // work counts FLOPs (else bytes read + written)
  std::string baseline;  // what `vs_baseline` divides by
  double baseline_rate;  // GFLOP/s or GB/s of that baseline
  std::string isa;       // the instruction set of the kernel copy timed; empty: not dispatched
  double rate() const { return work / t.median_s * 1e-9; }
};

// A row's baseline rate; 0 in a row means the run-wide baseline (sgemm 2048 or memcpy mean).

struct Bench {
  std::vector<Row> rows;
  // Measured at the start and again at the end; the ratios use the mean of the two, and a
  // drift between them (other load on the machine) is printed as a warning.
  double sgemm_gflops = 0.0;  // square 2048, the reference for every "vs sgemm" column
  double copy_gbs = 0.0;
  std::vector<double> sgemm_runs, copy_runs;
  // Peak fp32 FMA GFLOP/s on all threads, per instruction set, the reference of "vs peak":
  // like the other baselines, the mean of a run at the start and one at the end.
  std::map<std::string, double> fma_peak_gflops;
  std::map<std::string, std::vector<double>> fma_peak_runs;
  // The instruction set rows added now are for ("": the kernel is not dispatched).
  std::string isa;
  // The attention fwd+bwd rows, for the summary.
  struct AttentionPoint {
    std::string isa;
    int64_t S, D;
    size_t row;
  };
  std::vector<AttentionPoint> attention_fwd_bwd;
  // Document-masked attention fwd+bwd: rows of one S with 1, 4, 16 documents, per set.
  struct DocumentsPoint {
    std::string isa;
    int64_t S, D, documents;
    size_t row;
  };
  std::vector<DocumentsPoint> documents;
  // Sliding-window attention fwd+bwd: full causal (window 0) and windowed rows of one S, per set.
  struct WindowPoint {
    std::string isa;
    int64_t S, D, window;
    size_t row;
  };
  std::vector<WindowPoint> windows;

  // rate / the row's instruction set's FMA peak; 0 when it has none (or it was not measured).
  double vs_peak(const Row& r) const {
    const auto it = fma_peak_gflops.find(r.isa);
    return r.flops && it != fma_peak_gflops.end() ? r.rate() / it->second : 0.0;
  }

  double baseline_of(const Row& r) const {
    if (r.baseline_rate > 0.0) return r.baseline_rate;
    return r.flops ? sgemm_gflops : copy_gbs;
  }

  const Row& add(Row r) {
    r.isa = isa;
    rows.push_back(std::move(r));
    const Row& x = rows.back();
    std::fprintf(stderr, "  %-6s %-26s %-34s %9.2f ms  x%d\n", x.isa.c_str(), x.name.c_str(),
                 x.shape.c_str(), x.t.median_s * 1e3, x.t.reps);
    return x;
  }
};

// Lets the other library's worker threads go to sleep before the next measurement: on a
// machine with as many cores as threads, OpenBLAS's spinning pthreads and OpenMP's spinning
// workers otherwise steal cycles from each other.
void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }

std::string dims(std::initializer_list<int64_t> d, const char* names) {
  std::string s;
  const char* n = names;
  for (int64_t x : d) {
    const char* sp = std::strchr(n, ' ');
    const std::string key = sp ? std::string(n, sp) : std::string(n);
    s += (s.empty() ? "" : " ") + key + "=" + std::to_string(x);
    n = sp ? sp + 1 : n;
  }
  return s;
}

// ---- baselines ---------------------------------------------------------------------------
// C = op(A) op(B) through cblas directly, on OpenBLAS's own threads (as many as OpenMP's;
// set again before every call, cheaply, in case anything changed it).
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
           const float* B, float* C) {
  if (openblas_get_num_threads() != omp_get_max_threads()) openblas_set_num_threads(omp_get_max_threads());
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N,
              K, 1.0f, A, trans_a ? M : K, B, trans_b ? K : N, 0.0f, C, N);
}

// A few entries of C = op(A) op(B) against double dot products.
void check_gemm(const std::string& what, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                const float* A, const float* B, const float* C) {
  check_finite(what, C, M * N);
  const int64_t picks[][2] = {{0, 0}, {M - 1, N - 1}, {M / 2, N / 3}, {M / 7, std::max<int64_t>(N - 2, 0)}};
  for (const auto& p : picks) {
    double s = 0.0, a = 0.0;
    for (int64_t k = 0; k < K; ++k) {
      const double v = double(trans_a ? A[k * M + p[0]] : A[p[0] * K + k]) *
                       (trans_b ? B[p[1] * K + k] : B[k * N + p[1]]);
      s += v;
      a += std::abs(v);
    }
    if (std::abs(C[p[0] * N + p[1]] - s) > 1e-5 * a + 1e-6)
      fail(what + ": C[" + std::to_string(p[0]) + "," + std::to_string(p[1]) + "] = " +
           std::to_string(C[p[0] * N + p[1]]) + ", expected " + std::to_string(s));
  }
}

double mean(const std::vector<double>& x) {
  double s = 0.0;
  for (double v : x) s += v;
  return x.empty() ? 0.0 : s / x.size();
}

void bench_sgemm_square(Bench& bench, const char* when) {
  const int64_t n = 2048;
  const auto A = random_floats(n * n, 1, -1, 1), B = random_floats(n * n, 2, -1, 1);
  std::vector<float> C(n * n);
  const Timing t = measure([&] { sgemm(false, false, n, n, n, A.data(), B.data(), C.data()); },
                           [&] { check_gemm("sgemm 2048", false, false, n, n, n, A.data(), B.data(), C.data()); },
                           2.0, 5);
  const double work = 2.0 * n * n * n;
  bench.sgemm_runs.push_back(work / t.median_s * 1e-9);
  bench.sgemm_gflops = mean(bench.sgemm_runs);
  bench.add({std::string("sgemm ") + when, "M=N=K=2048 NN", t, work, true, "sgemm 2048", 0.0});
  settle();
}

// Parallel memcpy of 256 MiB (far past the last-level cache): bytes read + written.
void bench_copy(Bench& bench, const char* when) {
  const int64_t n = int64_t{64} << 20;
  const auto x = random_floats(n, 3, -1, 1);
  std::vector<float> y(n);
  const Timing t = measure(
      [&] {
#pragma omp parallel
        {
          const int nt = omp_get_num_threads(), id = omp_get_thread_num();
          const int64_t lo = n * id / nt, hi = n * (id + 1) / nt;
          std::memcpy(y.data() + lo, x.data() + lo, sizeof(float) * (hi - lo));
        }
      },
      [&] {
        if (std::memcmp(x.data(), y.data(), sizeof(float) * n) != 0) fail("memcpy baseline");
      },
      1.5, 5);
  const double work = 2.0 * sizeof(float) * n;
  bench.copy_runs.push_back(work / t.median_s * 1e-9);
  bench.copy_gbs = mean(bench.copy_runs);
  bench.add({std::string("memcpy ") + when, "256 MiB, parallel", t, work, false, "memcpy", 0.0});
}

// ---- FMA peak, per instruction set ------------------------------------------------------
// acc = acc * m + c on kPeakAcc independent registers per thread. An FMA has 4-5 cycles of
// latency and current x86 cores issue 2 a cycle, so 8-10 chains in flight saturate the
// ports; 12 leave margin. With m + c = 1 every chain converges to 1: values stay normal.
constexpr int kPeakAcc = 12;
constexpr int64_t kPeakIters = int64_t{1} << 22;
constexpr float kPeakM = 0.999f, kPeakC = 0.001f;

// ymm: 12 accumulators + m + c = 14 of AVX2's 16 registers.
__attribute__((noinline)) float fma_loop_avx2(int64_t iters) {
  const __m256 m = _mm256_set1_ps(kPeakM), c = _mm256_set1_ps(kPeakC);
  __m256 acc[kPeakAcc];
  for (int i = 0; i < kPeakAcc; ++i) acc[i] = _mm256_set1_ps(0.01f * i);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kPeakAcc; ++i) acc[i] = _mm256_fmadd_ps(acc[i], m, c);
  }
  __m256 sum = acc[0];
  for (int i = 1; i < kPeakAcc; ++i) sum = _mm256_add_ps(sum, acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = 0.0f;
  for (float x : lanes) total += x;
  return total;
}

// zmm. The file is built for the x86-64-v3 baseline; only this function may use AVX-512,
// and it is called only when the CPU has it.
__attribute__((target("avx512f"), noinline)) float fma_loop_avx512(int64_t iters) {
  const __m512 m = _mm512_set1_ps(kPeakM), c = _mm512_set1_ps(kPeakC);
  __m512 acc[kPeakAcc];
  for (int i = 0; i < kPeakAcc; ++i) acc[i] = _mm512_set1_ps(0.01f * i);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kPeakAcc; ++i) acc[i] = _mm512_fmadd_ps(acc[i], m, c);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kPeakAcc; ++i) sum = _mm512_add_ps(sum, acc[i]);
  // Not _mm512_reduce_add_ps: GCC 12's version warns about an uninitialised temporary.
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  float total = 0.0f;
  for (float x : lanes) total += x;
  return total;
}

int vector_floats(cpu::Isa isa) { return isa == cpu::Isa::avx512 ? 16 : 8; }

// The peak fp32 FMA rate of `isa`'s vectors on all threads at once (2 FLOPs per lane per
// FMA): what that instruction set's kernels could reach at best.
void bench_fma_peak(Bench& bench, cpu::Isa isa, const char* when) {
  const int threads = omp_get_max_threads();
  std::vector<float> sums(threads);
  const Timing t = measure(
      [&] {
#pragma omp parallel num_threads(threads)
        sums[omp_get_thread_num()] = isa == cpu::Isa::avx512 ? fma_loop_avx512(kPeakIters)
                                                             : fma_loop_avx2(kPeakIters);
      },
      [&] {
        // Each lane converged to 1: the sum is the lane count, up to fp32 rounding.
        const double lanes = double(kPeakAcc) * vector_floats(isa);
        for (float x : sums)
          if (!(std::abs(x - lanes) < 1e-3 * lanes))
            fail(std::string("fma peak ") + cpu::isa_name(isa) + ": thread sum " +
                 std::to_string(x) + ", expected " + std::to_string(lanes));
      },
      0.5, 5);
  const double work = 2.0 * vector_floats(isa) * kPeakAcc * kPeakIters * threads;
  const double rate = work / t.median_s * 1e-9;
  auto& runs = bench.fma_peak_runs[cpu::isa_name(isa)];
  runs.push_back(rate);
  bench.fma_peak_gflops[cpu::isa_name(isa)] = mean(runs);
  const std::string shape = std::to_string(kPeakAcc) +
                            (isa == cpu::Isa::avx512 ? " zmm" : " ymm") + " FMA chains x " +
                            std::to_string(threads) + " threads";
  // Its own row's ratio is to this run alone (1.0 only if start and end agree).
  bench.add({std::string("fma peak ") + when, shape, t, work, true, "fma peak (this)", rate});
  settle();
}

// ---- linear: y[T, N] = x[T, H] W[N, H]^T, and the bench model's gemms ---------------------
// cpu::gemm is autosp's own kernel (kernels/cpu/gemm.h), one copy per instruction set; its
// baseline is OpenBLAS sgemm at the same shape(s), run by cblas on OpenBLAS's own threads
// (with the core the environment gives it: OPENBLAS_CORETYPE, as for every sgemm row).
void bench_linear(Bench& bench, const std::vector<cpu::Isa>& isas, int64_t T, int64_t H, int64_t N) {
  const auto x = random_floats(T * H, 4, -1, 1), w = random_floats(N * H, 5, -1, 1);
  std::vector<float> y(T * N);
  const double work = 2.0 * T * N * H;
  const std::string shape = dims({T, H, N}, "T H N") + " trans_b";
  const Timing tb = measure([&] { sgemm(false, true, T, N, H, x.data(), w.data(), y.data()); },
                            [&] { check_gemm("sgemm " + shape, false, true, T, N, H, x.data(), w.data(), y.data()); },
                            1.5, 5);
  const Row& base = bench.add({"sgemm (linear shape)", shape, tb, work, true, "sgemm 2048", 0.0});
  const double base_rate = base.rate();
  settle();
  for (cpu::Isa isa : isas) {
    cpu::set_active_isa(isa);
    bench.isa = cpu::isa_name(isa);
    const Timing t = measure([&] { cpu::gemm(false, true, T, N, H, x.data(), w.data(), y.data()); },
                             [&] { check_gemm("linear " + shape, false, true, T, N, H, x.data(), w.data(), y.data()); },
                             1.5, 5);
    bench.add({"linear (cpu::gemm)", shape, t, work, true, "sgemm same shape", base_rate});
  }
  bench.isa.clear();
  settle();
}

// The gemms of one training step of bench_train.py's model (hidden 256, 8 heads of 32, 2 kv
// heads, ffn 704, vocab 2048) at S tokens, in three groups: the forward's x W^T (q, k, v, o,
// gate, up, down, lm_head), the backward's dx = dy W and dW = dy^T x. Each group is timed as
// one run of its 8 gemms in turn; at S 2048 a group's operands are 50-60 MB, so each product
// finds its operands outside the private caches, as in the step (warm only from the repeats).
struct GemmCall {
  bool ta, tb;
  int64_t M, N, K;
};
std::vector<GemmCall> model_gemms(const std::string& group, int64_t S) {
  const int64_t H = 256, KV = 64, F = 704, V = 2048;
  const int64_t outs[] = {H, KV, KV, H, F, F, H, V}, ins[] = {H, H, H, H, H, H, F, H};
  std::vector<GemmCall> calls;
  for (int i = 0; i < 8; ++i) {
    const int64_t out = outs[i], in = ins[i];
    if (group == "forward") calls.push_back({false, true, S, out, in});      // y = x W^T
    else if (group == "dx") calls.push_back({false, false, S, in, out});     // dx = dy W
    else calls.push_back({true, false, out, in, S});                          // dW = dy^T x
  }
  return calls;
}

void bench_model_gemms(Bench& bench, const std::vector<cpu::Isa>& isas, int64_t S) {
  for (const char* group : {"forward", "dx", "dW"}) {
    const std::vector<GemmCall> calls = model_gemms(group, S);
    std::vector<std::vector<float>> a, b, c;
    double work = 0.0;
    for (const GemmCall& g : calls) {
      a.push_back(random_floats(g.M * g.K, 6, -1, 1));
      b.push_back(random_floats(g.K * g.N, 7, -1, 1));
      c.emplace_back(g.M * g.N);
      work += 2.0 * g.M * g.N * g.K;
    }
    const auto cblas_all = [&] {
      for (size_t i = 0; i < calls.size(); ++i) {
        const GemmCall& g = calls[i];
        sgemm(g.ta, g.tb, g.M, g.N, g.K, a[i].data(), b[i].data(), c[i].data());
      }
    };
    const auto check_all = [&](const std::string& who) {
      for (size_t i = 0; i < calls.size(); ++i) {
        const GemmCall& g = calls[i];
        check_gemm(who + ", product " + std::to_string(i), g.ta, g.tb, g.M, g.N, g.K, a[i].data(), b[i].data(),
                   c[i].data());
      }
    };
    const std::string shape = std::string(group) + " " + dims({S}, "S") + ", 8 gemms";
    const Timing tb = measure(cblas_all, [&] { check_all("sgemm model " + shape); }, 1.0, 5);
    const Row& base = bench.add({"sgemm (model gemms)", shape, tb, work, true, "sgemm 2048", 0.0});
    const double base_rate = base.rate();
    settle();
    for (cpu::Isa isa : isas) {
      cpu::set_active_isa(isa);
      bench.isa = cpu::isa_name(isa);
      const auto ours = [&] {
        for (size_t i = 0; i < calls.size(); ++i) {
          const GemmCall& g = calls[i];
          cpu::gemm(g.ta, g.tb, g.M, g.N, g.K, a[i].data(), b[i].data(), c[i].data());
        }
      };
      const Timing t = measure(ours, [&] { check_all("cpu::gemm model " + shape); }, 1.0, 5);
      bench.add({"gemm (model gemms)", shape, t, work, true, "sgemm same shapes", base_rate});
    }
    bench.isa.clear();
    settle();
  }
}

// ---- attention ---------------------------------------------------------------------------
// Causal FLOPs: half of the dense 4 S^2 D NH (forward: QK^T, PV) and 10 S^2 D NH (backward:
// QK^T again, dV, dP, dQ, dK) per batch; exp and the softmax bookkeeping are not counted.
double attention_flops(const cpu::AttentionDims& d, double per_s2d) {
  return 0.5 * per_s2d * d.B * d.NH * static_cast<double>(d.S) * d.S * d.D;
}

struct AttentionData {
  cpu::AttentionDims d;
  std::vector<float> q, k, v, dout, out, lse, dq, dk, dv, ws;
  std::vector<int32_t> docs;  // document ids (B = 1), empty: one document
  int64_t window = 0;         // sliding window, 0: none
  float softcap = 0;          // logit softcap (Gemma 2), 0: none
  std::vector<float> alibi;   // ALiBi slopes of the NH heads (BLOOM, MPT), empty: none
  float scale;
  explicit AttentionData(const cpu::AttentionDims& dims) : d(dims) {
    const int64_t nq = d.B * d.S * d.NH * d.D, nk = d.B * d.S * d.NKV * d.D;
    // Magnitude ~2 makes the softmax peaked enough to exercise the running max (as the test).
    q = random_floats(nq, 10, -2, 2);
    k = random_floats(nk, 11, -2, 2);
    v = random_floats(nk, 12, -1, 1);
    dout = random_floats(nq, 13, -1, 1);
    out.assign(nq, 0.0f), dq.assign(nq, 0.0f), dk.assign(nk, 0.0f), dv.assign(nk, 0.0f);
    lse.assign(d.B * d.NH * d.S, 0.0f);
    const int threads = omp_get_max_threads();
    // NaN-filled: a kernel that reads scratch it never wrote poisons its outputs.
    ws.assign(std::max(cpu::attention_forward_workspace_floats(d, threads),
                       cpu::attention_backward_workspace_floats(d, threads)),
              std::numeric_limits<float>::quiet_NaN());
    scale = 1.0f / std::sqrt(static_cast<float>(d.D));
  }
  void forward() {
    cpu::attention_forward(d, true, scale, q.data(), k.data(), v.data(), out.data(), lse.data(),
                           ws.data(), omp_get_max_threads(), docs.empty() ? nullptr : docs.data(), window, softcap,
                           alibi.empty() ? nullptr : alibi.data());
  }
  void backward() {
    cpu::attention_backward(d, true, scale, q.data(), k.data(), v.data(), out.data(), lse.data(),
                            dout.data(), dq.data(), dk.data(), dv.data(), ws.data(),
                            omp_get_max_threads(), docs.empty() ? nullptr : docs.data(), window, softcap,
                            alibi.empty() ? nullptr : alibi.data());
  }
  // The first key query i sees: its document's start (0 for one document), or the window's.
  int64_t first_key(int64_t i) const {
    int64_t j = i;
    while (!docs.empty() && j > 0 && docs[j - 1] == docs[i]) --j;
    const int64_t doc_start = docs.empty() ? 0 : j;
    return window > 0 ? std::max(doc_start, i - window + 1) : doc_start;
  }
};

// Full check at a small size against attention.h's double references. The tolerance is the
// one tests/kernels/attention_test.cpp justifies: fp32 rounding over <= 257 keys measured up
// to 1.8e-6; a masking, indexing or scaling bug gives >= 1e-2.
void check_attention_reference(int64_t D) {
  const cpu::AttentionDims d{1, 130, 8, 4, D};
  AttentionData a(d);
  a.forward();
  a.backward();
  auto dbl = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  const auto q = dbl(a.q), k = dbl(a.k), v = dbl(a.v), dout = dbl(a.dout);
  std::vector<double> out(a.out.size()), lse(a.lse.size()), dq(a.dq.size()), dk(a.dk.size()),
      dv(a.dv.size());
  cpu::attention_forward_reference(d, true, a.scale, q.data(), k.data(), v.data(), out.data(),
                                   lse.data());
  cpu::attention_backward_reference(d, true, a.scale, q.data(), k.data(), v.data(), dout.data(),
                                    dq.data(), dk.data(), dv.data());
  const double tol = 1e-5;
  const std::string at = " (reference check S=130 D=" + std::to_string(D) + ")";
  check_close("attention out" + at, a.out.data(), out.data(), out.size(), tol);
  check_close("attention lse" + at, a.lse.data(), lse.data(), lse.size(), tol);
  check_close("attention dq" + at, a.dq.data(), dq.data(), dq.size(), tol);
  check_close("attention dk" + at, a.dk.data(), dk.data(), dk.size(), tol);
  check_close("attention dv" + at, a.dv.data(), dv.data(), dv.size(), tol);
}

// At the benchmark size: a few whole query rows (out, lse, dq) recomputed in double, O(S D)
// each, so a kernel that is only right at small S is caught too.
struct RowRef {
  double lse;
  std::vector<double> out, dq;
};
RowRef attention_row(const AttentionData& a, int64_t h, int64_t i) {
  const auto& d = a.d;
  const int64_t kvh = h / (d.NH / d.NKV), D = d.D;
  const float* qi = a.q.data() + (i * d.NH + h) * D;
  const float* doi = a.dout.data() + (i * d.NH + h) * D;
  const int64_t j0 = a.first_key(i);
  std::vector<double> s(i + 1), dcap(i + 1, 1.0);  // dcap: d(capped score) / d(score)
  double m = -1e300;
  for (int64_t j = j0; j <= i; ++j) {
    const float* kj = a.k.data() + (j * d.NKV + kvh) * D;
    double x = 0.0;
    for (int64_t dd = 0; dd < D; ++dd) x += static_cast<double>(qi[dd]) * kj[dd];
    s[j] = a.scale * x;
    if (a.softcap > 0) {
      const double t = std::tanh(s[j] / a.softcap);
      s[j] = a.softcap * t, dcap[j] = 1.0 - t * t;
    }
    if (!a.alibi.empty()) s[j] += double(a.alibi[h]) * double(j - i);
    m = std::max(m, s[j]);
  }
  double l = 0.0;
  for (int64_t j = j0; j <= i; ++j) l += std::exp(s[j] - m);
  RowRef r{m + std::log(l), std::vector<double>(D, 0.0), std::vector<double>(D, 0.0)};
  std::vector<double> dp(i + 1);
  for (int64_t j = j0; j <= i; ++j) {
    const float* vj = a.v.data() + (j * d.NKV + kvh) * D;
    const double p = std::exp(s[j] - r.lse);
    double x = 0.0;
    for (int64_t dd = 0; dd < D; ++dd) r.out[dd] += p * vj[dd], x += static_cast<double>(doi[dd]) * vj[dd];
    dp[j] = x;
  }
  double delta = 0.0;
  for (int64_t dd = 0; dd < D; ++dd) delta += r.out[dd] * doi[dd];
  for (int64_t j = j0; j <= i; ++j) {
    const float* kj = a.k.data() + (j * d.NKV + kvh) * D;
    const double ds = std::exp(s[j] - r.lse) * (dp[j] - delta) * dcap[j];
    for (int64_t dd = 0; dd < D; ++dd) r.dq[dd] += a.scale * ds * kj[dd];
  }
  return r;
}

void check_attention_rows(AttentionData& a, bool backward) {
  const auto& d = a.d;
  const std::string at = " (S=" + std::to_string(d.S) + " D=" + std::to_string(d.D) + ")";
  check_finite("attention out" + at, a.out.data(), a.out.size());
  check_finite("attention lse" + at, a.lse.data(), a.lse.size());
  if (backward) {
    check_finite("attention dq" + at, a.dq.data(), a.dq.size());
    check_finite("attention dk" + at, a.dk.data(), a.dk.size());
    check_finite("attention dv" + at, a.dv.data(), a.dv.size());
  }
  // Rows: first, one inside the first tile, last, and one mid-tile; first and last head.
  // Long rows sum more fp32 terms than the small check; 1e-4 still catches any real bug.
  for (int64_t h : {int64_t{0}, d.NH - 1})
    for (int64_t i : {int64_t{0}, int64_t{37}, d.S / 2 + 5, d.S - 1}) {
      const RowRef r = attention_row(a, h, i);
      const std::string row = at + " head " + std::to_string(h) + " row " + std::to_string(i);
      check_close("attention out" + row, a.out.data() + (i * d.NH + h) * d.D, r.out.data(), d.D, 1e-4);
      const float l = a.lse[h * d.S + i];
      if (std::abs(l - r.lse) > 1e-4 * std::max(1.0, std::abs(r.lse)))
        fail("attention lse" + row + ": " + std::to_string(l) + " vs " + std::to_string(r.lse));
      if (backward)
        check_close("attention dq" + row, a.dq.data() + (i * d.NH + h) * d.D, r.dq.data(), d.D, 1e-4);
    }
}

void bench_attention(Bench& bench, int64_t S, int64_t D) {
  AttentionData a({1, S, 8, 4, D});
  const std::string shape = dims({1, S, 8, 4, D}, "B S NH NKV D") + " causal";
  const double fwd = attention_flops(a.d, 4), bwd = attention_flops(a.d, 10);
  // Repetitions: ~1 s of timing per case; at S = 8192 (seconds per call) the checked run
  // is the only one, to keep the whole program near 3 minutes per instruction set.
  const double budget = 1.0;
  const int min_reps = S >= 8192 ? 0 : 3;
  const Timing tf = measure([&] { a.forward(); }, [&] { check_attention_rows(a, false); }, budget, min_reps);
  bench.add({"attention fwd", shape, tf, fwd, true, "sgemm 2048", 0.0});
  const Timing tb = measure([&] { a.backward(); }, [&] { check_attention_rows(a, true); }, budget, min_reps);
  bench.add({"attention bwd", shape, tb, bwd, true, "sgemm 2048", 0.0});
  const Timing tfb = measure([&] { a.forward(); a.backward(); }, [&] { check_attention_rows(a, true); },
                             budget, min_reps);
  bench.add({"attention fwd+bwd", shape, tfb, fwd + bwd, true, "sgemm 2048", 0.0});
  bench.attention_fwd_bwd.push_back({bench.isa, S, D, bench.rows.size() - 1});
}

// Document-masked attention (packed samples): S tokens in n equal documents. The tiles
// across documents are skipped, so the work is n (S/n)^2 / 2: the time should fall as 1/n
// (plus the tiles on the diagonal of each document). Every row's work counts the FLOPs of
// one document, so its GFLOP/s over the 1-document row's is t(1) / t(n).
void bench_documents(Bench& bench, int64_t S, int64_t D) {
  const double work = attention_flops({1, S, 4, 2, D}, 14);
  size_t one = 0;
  for (int64_t n : {1, 4, 16}) {
    AttentionData a({1, S, 4, 2, D});
    a.docs.resize(S);
    for (int64_t i = 0; i < S; ++i) a.docs[i] = static_cast<int32_t>(i * n / S);
    const std::string shape = dims({1, S, 4, 2, D}, "B S NH NKV D") + " causal, " + std::to_string(n) +
                              (n == 1 ? " document" : " documents");
    const Timing t = measure([&] { a.forward(); a.backward(); }, [&] { check_attention_rows(a, true); }, 1.0, 0);
    const double base = n == 1 ? 0.0 : bench.rows[one].rate();
    bench.add({"attention fwd+bwd, documents", shape, t, work, true, n == 1 ? "sgemm 2048" : "1 document", base});
    if (n == 1) one = bench.rows.size() - 1;
    bench.documents.push_back({bench.isa, S, D, n, bench.rows.size() - 1});
  }
}

// Sliding-window attention (Mistral): S tokens, a window of W, against full causal attention
// of the same S in the same run. Tiles wholly outside the window are skipped forward and
// backward, so the work is (W (W + 1) / 2 + (S - W) W) / (S (S + 1) / 2) of causal's (0.44
// at S = 16384, W = 4096): the ideal time ratio, which the tiles across the window's edge
// (computed whole, masked) keep it a little above. Each row counts the FLOPs of the pairs
// it computes.
void bench_window(Bench& bench, int64_t S, int64_t W, int64_t D) {
  const cpu::AttentionDims d{1, S, 4, 2, D};
  const double causal = attention_flops(d, 14);
  const double kept = (double(W) * (W + 1) / 2 + double(S - W) * W) / (double(S) * (S + 1) / 2);
  size_t full = 0;
  for (int64_t window : {int64_t{0}, W}) {
    AttentionData a(d);
    a.window = window;
    const std::string shape = dims({1, S, 4, 2, D}, "B S NH NKV D") + " causal" +
                              (window ? ", window " + std::to_string(window) : "");
    const Timing t = measure([&] { a.forward(); a.backward(); }, [&] { check_attention_rows(a, true); }, 1.0, 0);
    const double base = window ? bench.rows[full].rate() : 0.0;
    bench.add({"attention fwd+bwd, window", shape, t, window ? causal * kept : causal, true,
               window ? "causal" : "sgemm 2048", base});
    if (!window) full = bench.rows.size() - 1;
    bench.windows.push_back({bench.isa, S, D, window, bench.rows.size() - 1});
  }
}

// ALiBi (BLOOM, MPT) against the same kernels without it, in the same run: a_h (j - i) added to
// every score of both directions (8 heads, BLOOM's slopes 2^-1 .. 2^-8). The ratio is its cost.
void bench_alibi(Bench& bench, int64_t S, int64_t D) {
  const cpu::AttentionDims d{1, S, 8, 4, D};
  const double work = attention_flops(d, 14);
  double base = 0.0;
  for (const bool alibi : {false, true}) {
    AttentionData a(d);
    if (alibi)
      for (int64_t h = 0; h < d.NH; ++h) a.alibi.push_back(std::ldexp(1.0f, -int(h + 1)));
    const std::string shape = dims({1, S, 8, 4, D}, "B S NH NKV D") + " causal" + (alibi ? ", alibi" : "");
    const Timing t = measure([&] { a.forward(); a.backward(); }, [&] { check_attention_rows(a, true); }, 1.0, 0);
    bench.add({"attention fwd+bwd, alibi", shape, t, work, true, alibi ? "no alibi" : "sgemm 2048", base});
    if (!alibi) base = bench.rows.back().rate();
  }
}

// Gemma 2's logit softcaps against the same kernels without them, in the same run: attention's
// c tanh(s / c) on every score (the forward's, and the backward's recomputed ones, with the
// derivative), and the loss's on every logit (forward and backward, as linear_cross_entropy's
// chunks run them). Each capped row's baseline is its uncapped row: the ratio is the cap's cost.
void bench_softcap(Bench& bench, int64_t S, int64_t D) {
  const cpu::AttentionDims d{1, S, 8, 4, D};
  const double work = attention_flops(d, 14);
  double base = 0.0;
  for (const float cap : {0.0f, 50.0f}) {
    AttentionData a(d);
    a.softcap = cap;
    const std::string shape = dims({1, S, 8, 4, D}, "B S NH NKV D") + " causal" + (cap > 0 ? ", softcap 50" : "");
    const Timing t = measure([&] { a.forward(); a.backward(); }, [&] { check_attention_rows(a, true); }, 1.0, 0);
    bench.add({"attention fwd+bwd, softcap", shape, t, work, true, cap > 0 ? "no softcap" : "sgemm 2048", base});
    if (cap == 0) base = bench.rows.back().rate();
  }
  const int64_t T = 1024, V = 32000;  // the memory-bound parts' V (kV, below)
  const auto logits = random_floats(T * V, 27, -8, 8);
  const auto labels = random_ints(T, 28, static_cast<int32_t>(V));
  std::vector<float> lse(T), dlogits(T * V);
  float loss = 0.0f;
  const float dloss = 1.0f / T;
  double fwd_base = 0.0, bwd_base = 0.0;
  for (const float cap : {0.0f, 30.0f}) {
    const std::string shape = dims({T, V}, "T V") + (cap > 0 ? ", softcap 30" : "");
    const Timing tf = measure(
        [&] { cpu::cross_entropy_forward(logits.data(), labels.data(), T, V, -100, &loss, lse.data(), cap); },
        [&] { check_finite("cross_entropy loss", &loss, 1), check_finite("cross_entropy lse", lse.data(), T); }, 1.0,
        3, 21);
    bench.add({"cross_entropy fwd, softcap", shape, tf, 4.0 * (T * V + 2 * T), false,
               cap > 0 ? "no softcap" : "memcpy", fwd_base});
    if (cap == 0) fwd_base = bench.rows.back().rate();
    const Timing tb = measure(
        [&] {
          cpu::cross_entropy_backward(&dloss, logits.data(), labels.data(), lse.data(), T, V, -100, dlogits.data(),
                                      cap);
        },
        [&] { check_finite("cross_entropy dlogits", dlogits.data(), T * V); }, 1.0, 3, 21);
    bench.add({"cross_entropy bwd, softcap", shape, tb, 4.0 * (2 * T * V + 2 * T), false,
               cap > 0 ? "no softcap" : "memcpy", bwd_base});
    if (cap == 0) bwd_base = bench.rows.back().rate();
  }
}

// ---- memory-bound fused kernels (bytes = minimal traffic: each input read once, each
// output written once; write-allocate reads are not counted, as for memcpy) ------------------
constexpr int64_t kT = 4096, kH = 1024, kF = 2816, kV = 32000, kNH = 8, kD = 128;

void add_mem(Bench& bench, const std::string& name, const std::string& shape, const Timing& t,
             double bytes) {
  bench.add({name, shape, t, bytes, false, "memcpy", 0.0});
}

void bench_rms_norm(Bench& bench) {
  const int64_t T = kT, H = kH;
  const auto x = random_floats(T * H, 20, -2, 2), w = random_floats(H, 21, 0.5, 1.5),
             dy = random_floats(T * H, 22, -1, 1);
  std::vector<float> y(T * H), rstd(T), dx(T * H), dw(H);
  const std::string shape = dims({T, H}, "T H");
  const Timing tf = measure([&] { cpu::rms_norm_forward(x.data(), w.data(), T, H, 1e-5f, y.data(), rstd.data()); },
                            [&] { check_finite("rms_norm y", y.data(), y.size()), check_finite("rms_norm rstd", rstd.data(), T); },
                            0.5, 5, 51);
  add_mem(bench, "rms_norm fwd", shape, tf, 4.0 * (2 * T * H + H + T));
  const Timing tb = measure([&] { cpu::rms_norm_backward(dy.data(), x.data(), w.data(), rstd.data(), T, H, dx.data(), dw.data()); },
                            [&] { check_finite("rms_norm dx", dx.data(), dx.size()), check_finite("rms_norm dw", dw.data(), H); },
                            0.5, 5, 51);
  add_mem(bench, "rms_norm bwd", shape, tb, 4.0 * (3 * T * H + 2 * H + T));
}

void bench_rope(Bench& bench) {
  const int64_t T = kT, NH = kNH, D = kD;
  const auto x = random_floats(T * NH * D, 23, -2, 2);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(t);
  std::vector<double> inv_freq(D / 2);
  cpu::rope_inv_freq(D, 500000.0, cpu::RopeScaling{}, inv_freq.data());
  std::vector<float> y(T * NH * D);
  const Timing t = measure([&] { cpu::rope_forward(x.data(), pos.data(), inv_freq.data(), T, NH, D, false, y.data()); },
                           [&] { check_finite("rope y", y.data(), y.size()); }, 0.5, 5, 51);
  add_mem(bench, "rope fwd", dims({T, NH, D}, "T NH D"), t, 4.0 * (2 * T * NH * D + T));
  // The interleaved pairs (2i, 2i + 1): GPT-J's layout (GLM, Helium, Cohere, imported).
  const Timing ti = measure(
      [&] { cpu::rope_forward(x.data(), pos.data(), inv_freq.data(), T, NH, D, false, y.data(), nullptr, true); },
      [&] { check_finite("rope y", y.data(), y.size()); }, 0.5, 5, 51);
  add_mem(bench, "rope fwd interleaved", dims({T, NH, D}, "T NH D"), ti, 4.0 * (2 * T * NH * D + T));
}

void bench_swiglu(Bench& bench) {
  const int64_t n = kT * kF;
  const auto g = random_floats(n, 24, -4, 4), u = random_floats(n, 25, -2, 2),
             dy = random_floats(n, 26, -1, 1);
  std::vector<float> out(n), dg(n), du(n);
  const std::string shape = dims({kT, kF}, "T F");
  const Timing tf = measure([&] { cpu::swiglu_forward(g.data(), u.data(), n, out.data()); },
                            [&] { check_finite("swiglu out", out.data(), n); }, 0.5, 5, 51);
  add_mem(bench, "swiglu fwd", shape, tf, 4.0 * 3 * n);
  const Timing tb = measure([&] { cpu::swiglu_backward(dy.data(), g.data(), u.data(), n, dg.data(), du.data()); },
                            [&] { check_finite("swiglu dgate", dg.data(), n), check_finite("swiglu dup", du.data(), n); },
                            0.5, 5, 51);
  add_mem(bench, "swiglu bwd", shape, tb, 4.0 * 5 * n);
}

void bench_cross_entropy(Bench& bench) {
  const int64_t T = kT, V = kV;
  const auto logits = random_floats(T * V, 27, -8, 8);
  const auto labels = random_ints(T, 28, static_cast<int32_t>(V));
  std::vector<float> lse(T), dlogits(T * V);
  float loss = 0.0f;
  const float dloss = 1.0f / T;
  const std::string shape = dims({T, V}, "T V") + " (unchunked)";
  const Timing tf = measure([&] { cpu::cross_entropy_forward(logits.data(), labels.data(), T, V, -100, &loss, lse.data()); },
                            [&] { check_finite("cross_entropy loss", &loss, 1), check_finite("cross_entropy lse", lse.data(), T); },
                            1.0, 3, 21);
  add_mem(bench, "cross_entropy fwd", shape, tf, 4.0 * (T * V + 2 * T));
  const Timing tb = measure([&] { cpu::cross_entropy_backward(&dloss, logits.data(), labels.data(), lse.data(), T, V, -100, dlogits.data()); },
                            [&] { check_finite("cross_entropy dlogits", dlogits.data(), T * V); }, 1.0, 3, 21);
  add_mem(bench, "cross_entropy bwd", shape, tb, 4.0 * (2 * T * V + 2 * T));
}

void bench_embedding(Bench& bench) {
  const int64_t T = kT, H = kH, V = kV;
  const auto W = random_floats(V * H, 29, -1, 1), dy = random_floats(T * H, 30, -1, 1);
  const auto tokens = random_ints(T, 31, static_cast<int32_t>(V));
  std::vector<float> out(T * H), dW(V * H);
  const std::string shape = dims({T, H, V}, "T H V");
  const Timing tf = measure([&] { cpu::embedding_forward(W.data(), tokens.data(), T, H, out.data()); },
                            [&] { check_finite("embedding out", out.data(), out.size()); }, 0.5, 5, 51);
  add_mem(bench, "embedding fwd", shape, tf, 4.0 * (2 * T * H + T));
  // dW is fully written (V x H), dy read once.
  const Timing tb = measure([&] { cpu::embedding_backward(dy.data(), tokens.data(), T, H, V, dW.data()); },
                            [&] { check_finite("embedding dW", dW.data(), dW.size()); }, 1.0, 3, 21);
  add_mem(bench, "embedding bwd", shape, tb, 4.0 * (V * H + T * H + T));
}

// ---- machine info and output ---------------------------------------------------------------
std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const auto c = line.find(':');
      return c == std::string::npos ? line : line.substr(line.find_first_not_of(" \t", c + 1));
    }
  return "unknown";
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

nlohmann::json env_json(const char* name) {
  const char* v = std::getenv(name);
  return v ? nlohmann::json(v) : nlohmann::json(nullptr);  // null: not set
}

void print_table(const Bench& b) {
  std::printf("\n%-6s %-22s %-40s %10s %4s %4s %9s %-7s %7s  %-16s %9s %7s\n", "isa", "kernel",
              "shape", "ms", "reps", "cpu", "rate", "unit", "ratio", "(ratio to)", "vs sgemm",
              "vs peak");
  std::printf("%s\n", std::string(155, '-').c_str());
  for (const Row& r : b.rows) {
    const double rate = r.rate();
    // Memory-bound rows: GB/s over sgemm's GFLOP/s, a different unit; see the notes.
    // "-": that baseline was not run (--only).
    char vs_sgemm[16] = "-", vs_peak[16] = "-";
    if (b.sgemm_gflops > 0.0)
      std::snprintf(vs_sgemm, sizeof vs_sgemm, "%.3f%s", rate / b.sgemm_gflops, r.flops ? " " : "*");
    if (b.vs_peak(r) > 0.0) std::snprintf(vs_peak, sizeof vs_peak, "%.3f", b.vs_peak(r));
    std::printf("%-6s %-22s %-40s %10.3f %4d %4.2f %9.2f %-7s %7.3f  %-16s %9s %7s\n",
                r.isa.empty() ? "-" : r.isa.c_str(), r.name.c_str(), r.shape.c_str(),
                r.t.median_s * 1e3, r.t.reps, r.t.cpu_share, rate, r.flops ? "GFLOP/s" : "GB/s",
                rate / b.baseline_of(r), r.baseline.c_str(), vs_sgemm, vs_peak);
  }
}

// Attention fwd+bwd at S >= 2048 per instruction set, as issue 9 asks: rate / sgemm 2048
// (and / the set's FMA peak), and the time of the AVX2 kernels over the AVX-512 ones.
nlohmann::json print_summary(const Bench& b, const std::vector<cpu::Isa>& isas) {
  nlohmann::json out = nlohmann::json::array();
  if (b.attention_fwd_bwd.empty()) return out;
  std::map<std::pair<int64_t, int64_t>, std::map<std::string, const Row*>> at;  // (D, S)
  for (const auto& p : b.attention_fwd_bwd)
    if (p.S >= 2048) at[{p.D, p.S}][p.isa] = &b.rows[p.row];
  std::printf("\nSummary: attention fwd+bwd (B=1 NH=8 NKV=4 causal) at S >= 2048: GFLOP/s over "
              "sgemm 2048's (%.1f GFLOP/s), in brackets over the instruction set's FMA peak; "
              "issue 9 asks >= 0.50 of sgemm.\n\n",
              b.sgemm_gflops);
  std::printf("%5s %6s", "D", "S");
  for (cpu::Isa isa : isas) std::printf(" | %-14s", cpu::isa_name(isa));
  const bool both = isas.size() == 2;
  if (both) std::printf(" | time avx2 / avx512");
  std::printf("\n");
  std::map<std::string, std::pair<double, std::string>> lowest;
  for (const auto& [key, by_isa] : at) {
    const auto [D, S] = key;
    nlohmann::json j = {{"D", D}, {"S", S}};
    std::printf("%5lld %6lld", static_cast<long long>(D), static_cast<long long>(S));
    for (cpu::Isa isa : isas) {
      const auto it = by_isa.find(cpu::isa_name(isa));
      if (it == by_isa.end()) {
        std::printf(" | %-14s", "-");
        continue;
      }
      const Row& r = *it->second;
      const double vs_sgemm = r.rate() / b.sgemm_gflops, vs_peak = b.vs_peak(r);
      std::printf(" | %6.3f (%5.3f)", vs_sgemm, vs_peak);
      j[cpu::isa_name(isa)] = {{"median_ms", r.t.median_s * 1e3}, {"gflops", r.rate()},
                               {"ratio_to_sgemm_2048", vs_sgemm}, {"ratio_to_fma_peak", vs_peak}};
      auto& low = lowest[cpu::isa_name(isa)];
      if (low.second.empty() || vs_sgemm < low.first)
        low = {vs_sgemm, "D=" + std::to_string(D) + " S=" + std::to_string(S)};
    }
    if (both && by_isa.count("avx2") && by_isa.count("avx512")) {
      const double ratio = by_isa.at("avx2")->t.median_s / by_isa.at("avx512")->t.median_s;
      std::printf(" | %6.3f", ratio);
      j["time_avx2_over_avx512"] = ratio;
    }
    std::printf("\n");
    out.push_back(j);
  }
  std::printf("\nlowest over sgemm:");
  for (const auto& [isa, low] : lowest) std::printf("  %s %.3f (%s)", isa.c_str(), low.first, low.second.c_str());
  std::printf("\nFMA peak:");
  for (const auto& [isa, rate] : b.fma_peak_gflops)
    std::printf("  %s %.1f GFLOP/s (sgemm 2048 = %.3f of it)", isa.c_str(), rate, b.sgemm_gflops / rate);
  std::printf("\n");
  return out;
}

const char* kNotes[] = {
    "ms: median of `reps` timed runs after one checked warm-up run (reps = 1 at S = 8192: the "
    "checked run itself). cpu: process CPU time / (wall x threads); well below 1 = the cores "
    "were shared with other load, rerun.",
    "Baselines (sgemm 2048, memcpy, each set's FMA peak) run at the start and the end; ratios "
    "use their mean.",
    "GFLOP/s: 2MNK for gemm. Attention is causal and counted as HALF the dense FLOPs: "
    "fwd 0.5 * 4 S^2 D NH B, bwd 0.5 * 10 S^2 D NH B, fwd+bwd their sum; exp/softmax not counted.",
    "GB/s: minimal traffic (each input read once, each output written once, no write-allocate), "
    "the same convention as the memcpy baseline (2 x bytes copied).",
    "ratio: GFLOP/s or GB/s over the baseline named in '(ratio to)', measured in this run.",
    "vs sgemm: rate over sgemm 2048 GFLOP/s. For GB/s rows (*) this is GB/s per GFLOP/s, a "
    "different unit: not a meaningful comparison for memory-bound ops, reported as asked.",
    "isa: the instruction set whose kernel copy ran (cpu::set_active_isa); '-' = not "
    "dispatched per set (OpenBLAS, memcpy), run once.",
    "vs peak: GFLOP/s over the FMA peak of the row's instruction set (fma peak rows: 12 "
    "independent FMA chains per thread on every thread, ymm for avx2, zmm for avx512).",
    "cross_entropy here is the plain kernel over full T x V logits; training uses the fused "
    "chunked linear + cross-entropy op.",
};

// Issue 11: document-masked attention time per number of documents, over one document's.
nlohmann::json print_documents(const Bench& b) {
  nlohmann::json out = nlohmann::json::array();
  if (b.documents.empty()) return out;
  std::printf("\nSummary: document-masked attention fwd+bwd (B=1 NH=4 NKV=2 causal), time over the "
              "1-document time of the same set (ideal 1/n, plus each document's diagonal tiles)\n\n");
  std::printf("%-7s %6s %4s %10s %12s %10s\n", "isa", "S", "D", "documents", "median ms", "t / t(1)");
  double t1 = 0;
  for (const auto& p : b.documents) {
    const Row& r = b.rows[p.row];
    if (p.documents == 1) t1 = r.t.median_s;
    const double ratio = r.t.median_s / t1;
    std::printf("%-7s %6lld %4lld %10lld %12.1f %10.3f\n", p.isa.c_str(), (long long)p.S, (long long)p.D,
                (long long)p.documents, r.t.median_s * 1e3, ratio);
    out.push_back({{"isa", p.isa}, {"S", p.S}, {"D", p.D}, {"documents", p.documents},
                   {"median_ms", r.t.median_s * 1e3}, {"time_over_one_document", ratio}});
  }
  return out;
}

// Issue 24: sliding-window attention time over full causal attention's at the same S.
nlohmann::json print_windows(const Bench& b) {
  nlohmann::json out = nlohmann::json::array();
  if (b.windows.empty()) return out;
  std::printf("\nSummary: sliding-window attention fwd+bwd (B=1 NH=4 NKV=2 causal), time over full causal "
              "attention's of the same S and set (ideal: the share of (query, key) pairs in the window)\n\n");
  std::printf("%-7s %6s %4s %7s %12s %14s %8s\n", "isa", "S", "D", "window", "median ms", "t / t(causal)", "ideal");
  double t_causal = 0;
  for (const auto& p : b.windows) {
    const Row& r = b.rows[p.row];
    if (p.window == 0) t_causal = r.t.median_s;
    const double S = double(p.S), W = double(p.window), ratio = r.t.median_s / t_causal;
    const double ideal = p.window ? (W * (W + 1) / 2 + (S - W) * W) / (S * (S + 1) / 2) : 1.0;
    std::printf("%-7s %6lld %4lld %7lld %12.1f %14.3f %8.3f\n", p.isa.c_str(), (long long)p.S, (long long)p.D,
                (long long)p.window, r.t.median_s * 1e3, ratio, ideal);
    out.push_back({{"isa", p.isa}, {"S", p.S}, {"D", p.D}, {"window", p.window}, {"median_ms", r.t.median_s * 1e3},
                   {"time_over_causal", ratio}, {"ideal", ideal}});
  }
  return out;
}

void write_json(const Bench& b, const std::string& path, int threads,
                const std::vector<cpu::Isa>& isas, const std::set<std::string>& parts,
                const nlohmann::json& summary, const nlohmann::json& documents, const nlohmann::json& windows) {
  nlohmann::json j;
  std::vector<std::string> supported, ran;
  for (cpu::Isa isa : cpu::supported_isas()) supported.push_back(cpu::isa_name(isa));
  for (cpu::Isa isa : isas) ran.push_back(cpu::isa_name(isa));
  j["machine"] = {
      {"cpu_model", cpu_model()},
      {"hardware_threads", std::thread::hardware_concurrency()},
      {"omp_threads", threads},
      {"OMP_NUM_THREADS", env_json("OMP_NUM_THREADS")},
      {"OPENBLAS_CORETYPE", env_json("OPENBLAS_CORETYPE")},
      {"OPENBLAS_L2_SIZE", env_json("OPENBLAS_L2_SIZE")},
      {"openblas_threads", openblas_get_num_threads()},
      {"openblas_parallel", openblas_get_parallel()},  // 0 sequential, 1 pthreads, 2 OpenMP
      {"openblas_core", openblas_get_corename()},
      {"openblas_config", openblas_get_config()},
      {"cpu_supports_isas", supported},
  };
  j["isas"] = ran;
  j["parts"] = parts;
  j["baselines"] = {{"sgemm_2048_gflops", b.sgemm_gflops}, {"memcpy_gbs", b.copy_gbs},
                    {"sgemm_2048_gflops_start_end", b.sgemm_runs},
                    {"memcpy_gbs_start_end", b.copy_runs},
                    {"fma_peak_gflops", b.fma_peak_gflops},
                    {"fma_peak_gflops_start_end", b.fma_peak_runs}};
  j["notes"] = kNotes;
  j["summary"] = {{"attention_fwd_bwd_S_ge_2048", summary}, {"documents", documents}, {"window", windows}};
  j["rows"] = nlohmann::json::array();
  for (const Row& r : b.rows) {
    nlohmann::json row = {
        {"isa", r.isa.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.isa)},
        {"kernel", r.name},
        {"shape", r.shape},
        {"median_ms", r.t.median_s * 1e3},
        {"min_ms", r.t.min_s * 1e3},
        {"warmup_ms", r.t.first_s * 1e3},
        {"reps", r.t.reps},
        {r.flops ? "flops" : "bytes", r.work},
        {r.flops ? "gflops" : "gbs", r.rate()},
        {"cpu_share", r.t.cpu_share},
        {"ratio", r.rate() / b.baseline_of(r)},
        {"ratio_to", r.baseline},
    };
    if (b.sgemm_gflops > 0.0)
      row[r.flops ? "ratio_to_sgemm_2048" : "gbs_per_sgemm_gflops_not_comparable"] =
          r.rate() / b.sgemm_gflops;
    if (b.vs_peak(r) > 0.0) row["ratio_to_fma_peak"] = b.vs_peak(r);
    j["rows"].push_back(row);
  }
  std::ofstream f(path);
  if (!f) fail("cannot open " + path + " for writing; pass a writable path as the first argument");
  f << j.dump(2) << "\n";
  if (!f) fail("cannot write " + path);
}

// The parts --only can name, in the order they run. The per-set ones run once per
// instruction set.
const char* const kParts[] = {"sgemm", "linear", "memcpy", "fma_peak", "attention", "documents", "window",
                              "softcap", "alibi", "rms_norm", "rope", "swiglu", "cross_entropy", "embedding"};
const std::set<std::string> kMemoryParts = {"rms_norm", "rope", "swiglu", "cross_entropy",
                                            "embedding"};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_kernels: every CPU kernel against sgemm, memcpy and FMA-peak baselines "
               "measured in the same run, once per instruction set this CPU supports"};
  std::string json_path = "bench_kernels.json", isa_opt;
  std::string only;
  app.add_option("out", json_path, "JSON output (default bench_kernels.json)");
  app.add_option("--isa", isa_opt, "run the kernels of this instruction set only (default: "
                                   "every one this CPU supports)")
      ->check(CLI::IsMember({"avx2", "avx512"}));
  app.add_option("--only", only, "comma list of parts to run (default all): sgemm, linear, "
                                 "memcpy, fma_peak, attention, documents, window, softcap, alibi, rms_norm, rope, "
                                 "swiglu, "
                                 "cross_entropy, embedding; a part's baselines run with it")
      ->check([](const std::string& list) {
        // One comma list (CLI11's delimiter would also take the JSON path as a part).
        std::string bad;
        std::stringstream in(list);
        for (std::string p; std::getline(in, p, ',');)
          if (std::find(std::begin(kParts), std::end(kParts), p) == std::end(kParts))
            bad += (bad.empty() ? "" : ", ") + p;
        return bad.empty() ? std::string() : "unknown part(s): " + bad;
      });
  CLI11_PARSE(app, argc, argv);

  std::set<std::string> parts;
  std::stringstream only_list(only);
  for (std::string p; std::getline(only_list, p, ',');) parts.insert(p);
  if (parts.empty()) parts.insert(std::begin(kParts), std::end(kParts));
  if (parts.count("attention") || parts.count("documents") || parts.count("window") || parts.count("softcap") ||
      parts.count("alibi"))
    parts.insert({"sgemm", "fma_peak", "memcpy"});
  if (parts.count("linear")) parts.insert("sgemm");
  for (const auto& p : kMemoryParts)
    if (parts.count(p)) parts.insert("memcpy");
  auto want = [&](const char* p) { return parts.count(p) > 0; };

  std::vector<cpu::Isa> isas;
  try {
    if (!isa_opt.empty()) {
      const cpu::Isa isa = cpu::parse_isa(isa_opt, "--isa");
      cpu::set_active_isa(isa);  // a UserError if this CPU cannot run it
      isas = {isa};
    } else {
      isas = cpu::supported_isas();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_kernels: %s\n", e.what());
    return 1;
  }
  if (isas.empty()) fail("this CPU runs none of the kernel sets autosp is built with");
  std::string isa_list;
  for (cpu::Isa isa : isas) isa_list += std::string(isa_list.empty() ? "" : " ") + cpu::isa_name(isa);

  const int threads = omp_get_max_threads();
  openblas_set_num_threads(threads);
  std::fprintf(stderr, "bench_kernels: %s, %d threads, OPENBLAS_CORETYPE=%s (core %s), kernels: %s\n",
               cpu_model().c_str(), threads, env_or("OPENBLAS_CORETYPE", "unset").c_str(),
               openblas_get_corename(), isa_list.c_str());
  const auto t0 = Clock::now();

  if (want("attention"))
    for (cpu::Isa isa : isas) {
      std::fprintf(stderr, "checking %s attention against the double reference (S=130)\n",
                   cpu::isa_name(isa));
      cpu::set_active_isa(isa);
      for (int64_t D : {32, 40, 64, 128}) check_attention_reference(D);
    }

  Bench bench;
  if (want("sgemm")) bench_sgemm_square(bench, "(start)");
  if (want("linear")) {
    bench_linear(bench, isas, kT, kH, kH);
    bench_linear(bench, isas, kT, kH, kF);
    bench_model_gemms(bench, isas, 2048);
  }
  if (want("memcpy")) bench_copy(bench, "(start)");
  // The FMA peaks are baselines too: every set's at the start and at the end.
  auto fma_peaks = [&](const char* when) {
    for (cpu::Isa isa : isas) {
      bench.isa = cpu::isa_name(isa);
      if (want("fma_peak")) bench_fma_peak(bench, isa, when);
    }
    bench.isa.clear();
  };
  fma_peaks("(start)");
  for (cpu::Isa isa : isas) {
    cpu::set_active_isa(isa);
    bench.isa = cpu::isa_name(isa);
    if (want("attention"))
      for (int64_t D : {32, 40, 64, 128})  // 40: a last vector of 8 floats in the avx512 copy
        for (int64_t S : {1024, 2048, 4096, 8192})
          if (D != 40 || S == 2048 || S == 4096) bench_attention(bench, S, D);
    if (want("documents")) bench_documents(bench, 16384, 64);
    if (want("window")) bench_window(bench, 16384, 4096, 64);
    if (want("softcap")) bench_softcap(bench, 4096, 64);
    if (want("alibi")) bench_alibi(bench, 4096, 64);
    if (want("rms_norm")) bench_rms_norm(bench);
    if (want("rope")) bench_rope(bench);
    if (want("swiglu")) bench_swiglu(bench);
    if (want("cross_entropy")) bench_cross_entropy(bench);
    if (want("embedding")) bench_embedding(bench);
    settle();
  }
  bench.isa.clear();
  fma_peaks("(end)");
  if (want("memcpy")) bench_copy(bench, "(end)");
  settle();
  if (want("sgemm")) bench_sgemm_square(bench, "(end)");

  print_table(bench);
  // A baseline --only left out has no runs and no drift.
  auto warn_drift = [](const char* what, const std::vector<double>& x, const char* unit) {
    if (x.size() == 2 && std::abs(x[0] - x[1]) / std::max(x[0], x[1]) > 0.1)
      std::printf("\nWARNING: the %s baseline moved between start and end (%.1f -> %.1f %s): "
                  "the machine is shared; rerun for stable ratios.\n", what, x[0], x[1], unit);
  };
  warn_drift("sgemm", bench.sgemm_runs, "GFLOP/s");
  warn_drift("memcpy", bench.copy_runs, "GB/s");
  for (const auto& [isa, runs] : bench.fma_peak_runs)
    warn_drift((isa + " FMA peak").c_str(), runs, "GFLOP/s");
  const nlohmann::json summary = print_summary(bench, isas);
  const nlohmann::json documents = print_documents(bench);
  const nlohmann::json windows = print_windows(bench);
  std::printf("\n");
  for (const char* n : kNotes) std::printf("  - %s\n", n);
  std::printf("\nmachine: %s; %d OpenMP threads; OpenBLAS %d threads, core %s; "
              "OPENBLAS_CORETYPE=%s OPENBLAS_L2_SIZE=%s; kernels: %s; total %.0f s\n",
              cpu_model().c_str(), threads, openblas_get_num_threads(), openblas_get_corename(),
              env_or("OPENBLAS_CORETYPE", "unset").c_str(), env_or("OPENBLAS_L2_SIZE", "unset").c_str(),
              isa_list.c_str(), seconds_since(t0));
  write_json(bench, json_path, threads, isas, parts, summary, documents, windows);
  std::printf("wrote %s\n", json_path.c_str());
  return 0;
}
