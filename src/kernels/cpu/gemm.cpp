// The packed, register-blocked gemm (gemm.h), compiled once per instruction set.
//
// Why not OpenBLAS: at the training step's shapes (K of 256-2048, N of 64-2048) OpenBLAS
// 0.3.21 ran at 0.82-0.90 of its own 2048^3 rate. This kernel packs only op(B) (and A^T's
// tiles), keeps one A tile in L1 across a block's panels, and splits rows between threads
// without splitting K: on the bench model's gemms it runs 1.04-1.20x OpenBLAS's rate with
// each set (bench_kernels --only linear; docs/PERFORMANCE.md).
#include <omp.h>

#include <algorithm>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/simd.h"

namespace autosp::cpu::AUTOSP_ISA {
namespace {

using namespace simd;

// Register tile: kMR rows x kNV vectors of accumulators, kNV vectors of B and one broadcast
// of A must fit the register file without spilling.
#if defined(__AVX512F__)
constexpr int kMR = 14, kNV = 2;  // 28 + 2 + 1 of 32 zmm: a 14 x 32 tile
#else
constexpr int kMR = 6, kNV = 2;   // 12 + 2 + 1 of 16 ymm: a 6 x 16 tile
#endif
constexpr int64_t kNR = kNV * W;  // columns per packed panel
constexpr int64_t kKC = 256;      // rows of op(B) per packed block: a panel is kKC x kNR
constexpr int64_t kNC = 256 / kNR * kNR;  // columns per packed block (a multiple of kNR)
static_assert(kNC % kNR == 0 && kKC % 16 == 0);
constexpr int64_t kPackFloats = kKC * kNC + kKC * kMR;  // per thread, a multiple of 16
constexpr int64_t kAlignFloats = 16;        // 64 bytes

// Products below this many multiply-adds per thread stay on fewer threads.
constexpr double kMinWorkPerThread = 1 << 21;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A as the micro-kernel reads it: a(i, k) = A[i * rs + k * cs].
struct View {
  const float* p;
  int64_t rs, cs;
  const float* at(int64_t i, int64_t k) const { return p + i * rs + k * cs; }
};

// C[MR x cols] (+)= a(0..MR, 0..kc) Bp[kc x kNR], Bp a packed panel (row k at Bp + k kNR).
// load_c: start from C (accumulate, or a later block of K) instead of 0. Tail: cols < kNR,
// and only C's first `cols` columns are read or written.
// TransA: a(i, k) = A[k cs + i] (rs = 1), else A[i rs + k] (cs = 1): the unit stride known at
// compile time keeps the broadcasts' addresses in few registers.
template <int MR, bool Tail, bool TransA>
inline void micro_kernel(int64_t kc, View a, const float* __restrict Bp, float* __restrict C,
                         int64_t ldc, bool load_c, int64_t cols) {
  const auto lanes = [cols](int v) { return Tail ? cols - v * W : W; };
  vf acc[MR][kNV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < kNV; ++v) {
      if (!load_c) acc[i][v] = vf{};
      else acc[i][v] = Tail ? load(C + i * ldc + v * W, lanes(v)) : load(C + i * ldc + v * W);
    }
  const float* __restrict A = a.p;
  const int64_t rs = TransA ? 1 : a.rs, cs = TransA ? a.cs : 1;
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    vf b[kNV];
    for (int v = 0; v < kNV; ++v) b[v] = load(Bp + k * kNR + v * W);
    const float* ak = A + k * cs;
    for (int i = 0; i < MR; ++i) {
      const vf ai = splat(ak[i * rs]);
      for (int v = 0; v < kNV; ++v) acc[i][v] = fmadd(ai, b[v], acc[i][v]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < kNV; ++v) {
      if constexpr (Tail) store(C + i * ldc + v * W, lanes(v), acc[i][v]);
      else store(C + i * ldc + v * W, acc[i][v]);
    }
}

// Rows [0, M) against every panel of a packed block: one tile of MR rows (its A elements
// reused from L1) across the panels (streamed from L2), then the next; the last M mod kMR rows
// with a smaller tile.
// A^T's tile (TransA) is first copied to Ap (kKC x kMR floats), k-major: its rows lie M
// floats apart in A, and at M = 256 or 704 the kc rows a tile reads fall into a few of L1's
// sets and evict each other.
template <int MR, bool TransA>
void row_tiles(int64_t M, int64_t kc, View a, const float* Bp, int64_t nc, float* C, int64_t ldc,
               bool load_c, float* Ap) {
  int64_t i = 0;
  for (; i + MR <= M; i += MR) {
    View ai{a.at(i, 0), a.rs, a.cs};
    if constexpr (TransA) {
      for (int64_t k = 0; k < kc; ++k)  // MR <= W + 1 (14 of 16, 6 of 8)
        for (int r = 0; r < MR; r += W) store(Ap + k * MR + r, MR - r, load(ai.p + k * ai.cs + r, MR - r));
      ai = {Ap, 1, MR};
    }
    int64_t p = 0;
    for (; (p + 1) * kNR <= nc; ++p)
      micro_kernel<MR, false, TransA>(kc, ai, Bp + p * kc * kNR, C + i * ldc + p * kNR, ldc, load_c, kNR);
    if (p * kNR < nc)
      micro_kernel<MR, true, TransA>(kc, ai, Bp + p * kc * kNR, C + i * ldc + p * kNR, ldc, load_c, nc - p * kNR);
  }
  if constexpr (MR > 1) {
    if (i < M) row_tiles<MR - 1, TransA>(M - i, kc, {a.at(i, 0), a.rs, a.cs}, Bp, nc, C + i * ldc, ldc, load_c, Ap);
  }
}

// op(B)[k0 + k, n0 + j] for k < kc, j < nc into panels of kNR columns: panel p at
// Bp + p kc kNR, row k of it at + k kNR; columns past nc are 0.
void pack_b(bool trans_b, const float* B, int64_t N, int64_t K, int64_t k0, int64_t kc, int64_t n0,
            int64_t nc, float* Bp) {
  for (int64_t p = 0; p * kNR < nc; ++p) {
    const int64_t j0 = n0 + p * kNR, cols = std::min(kNR, nc - p * kNR);
    float* dst = Bp + p * kc * kNR;
    if (!trans_b) {  // rows of op(B) are rows of B: vector copies
      for (int64_t k = 0; k < kc; ++k)
        for (int v = 0; v < kNV; ++v)
          store(dst + k * kNR + v * W, load(B + (k0 + k) * N + j0 + v * W, cols - v * W));
    } else {  // op(B)[k, j] = B[j, k]: each row of B becomes a column of the panel
      for (int64_t j = 0; j < cols; ++j) {
        const float* src = B + (j0 + j) * K + k0;
        for (int64_t k = 0; k < kc; ++k) dst[k * kNR + j] = src[k];
      }
      for (int64_t j = cols; j < kNR; ++j)
        for (int64_t k = 0; k < kc; ++k) dst[k * kNR + j] = 0.0f;
    }
  }
}

// C[m0:m1, n0:n1] of the product on the calling thread, packing into ws (kPackFloats: a
// block of op(B), then a tile of A^T).
void gemm_block(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
                const float* B, float* C, bool accumulate, int64_t m0, int64_t m1, int64_t n0,
                int64_t n1, float* ws) {
  float* Bp = ws;
  float* Ap = ws + kKC * kNC;
  const View a = trans_a ? View{A, 1, M} : View{A, K, 1};
  // K in equal blocks of at most kKC (each block's partial sums stored to C and reloaded).
  const int64_t kblocks = ceil_div(K, kKC);
  for (int64_t nc0 = n0; nc0 < n1; nc0 += kNC) {
    const int64_t nc = std::min(kNC, n1 - nc0);
    for (int64_t kb = 0; kb < kblocks; ++kb) {
      const int64_t k0 = K * kb / kblocks, kc = K * (kb + 1) / kblocks - k0;
      pack_b(trans_b, B, N, K, k0, kc, nc0, nc, Bp);
      const bool load_c = accumulate || kb > 0;
      const View am{a.at(m0, k0), a.rs, a.cs};
      if (trans_a) row_tiles<kMR, true>(m1 - m0, kc, am, Bp, nc, C + m0 * N + nc0, N, load_c, Ap);
      else row_tiles<kMR, false>(m1 - m0, kc, am, Bp, nc, C + m0 * N + nc0, N, load_c, Ap);
    }
  }
}

}  // namespace

int64_t gemm_workspace_floats(int threads) {
  return int64_t{std::max(threads, 1)} * kPackFloats + kAlignFloats;
}

void gemm_packed(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
                 const float* B, float* C, bool accumulate, float* workspace, int threads) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate) std::fill_n(C, M * N, 0.0f);
    return;
  }
  float* ws = workspace + (kAlignFloats - reinterpret_cast<uintptr_t>(workspace) / sizeof(float) % kAlignFloats) % kAlignFloats;
  // Threads: rows or columns (panels), then rows when the panels are fewer than the threads.
  const int team = omp_in_parallel() ? 1 : std::max(threads, 1);
  const int64_t parts = std::clamp<int64_t>(
      std::min<int64_t>(team, static_cast<int64_t>(double(M) * double(N) * double(K) / kMinWorkPerThread)), 1, team);
  const int64_t panels = ceil_div(N, kNR);
  // A product with at least as many rows as columns splits its rows: each thread reads only
  // its rows of A (the tokens' activations, the large operand) and packs all of op(B) (a
  // weight, or for a weight's gradient K rows of activations). Split by columns, every thread
  // would read all of A. Measured on the bench model's step at S 2048: rows 1.5-3% faster.
  const int64_t col_parts = M >= N ? 1 : std::min(parts, panels);
  const int64_t tiles = ceil_div(M, kMR);  // row tiles; a row part is whole tiles
  const int64_t row_parts = std::clamp<int64_t>(parts / col_parts, 1, tiles);
#pragma omp parallel for num_threads(static_cast<int>(col_parts * row_parts)) schedule(static) if (col_parts * row_parts > 1)
  for (int64_t t = 0; t < col_parts * row_parts; ++t) {
    const int64_t c = t % col_parts, r = t / col_parts;
    const int64_t n0 = std::min(N, panels * c / col_parts * kNR), n1 = std::min(N, panels * (c + 1) / col_parts * kNR);
    const int64_t m0 = std::min(M, tiles * r / row_parts * kMR), m1 = std::min(M, tiles * (r + 1) / row_parts * kMR);
    if (n0 < n1 && m0 < m1)
      gemm_block(trans_a, trans_b, M, N, K, A, B, C, accumulate, m0, m1, n0, n1,
                 ws + int64_t{omp_get_thread_num()} * kPackFloats);
  }
}

}  // namespace autosp::cpu::AUTOSP_ISA
