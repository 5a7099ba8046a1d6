// Flash-style attention on the CPU (FlashAttention-2 schedule, fp32).
//
// Invariants this file keeps:
//   - No S x S buffer: scores live only in one Bq x Bk tile per thread.
//   - No heap allocation inside the kernels: every scratch float comes from `workspace`,
//     carved into fixed per-thread (and, for GQA, per-slot) regions whose sizes the
//     *_workspace_floats functions compute with the same formulas (see plan_*).
//   - Results are bitwise independent of the thread count and of the OpenMP schedule:
//     every output element is produced by one work item whose arithmetic does not depend
//     on which thread runs it, and GQA's dk/dv sums over a group's query heads are reduced
//     in a fixed order from per-head partials.
//
// The kernels run on the `threads` they are given; the workspace must have been sized for
// at least that many (`threads` argument of the *_workspace_floats functions).
//
// Compiled once per instruction set (isa.h): only the register tile of micro_kernel (and
// the vector width W) differ between the copies.
//
// Maths (row i of a query head, keys j, s_ij = scale * q_i . k_j, masked j -> -inf):
//   forward:  m_i = max_j s_ij, l_i = sum_j exp(s_ij - m_i), out_i = sum_j exp(s_ij - m_i) v_j / l_i,
//             lse_i = m_i + log l_i, computed with a running (m, l) over key tiles.
//   backward: P_ij = exp(s_ij - lse_i), delta_i = dout_i . out_i,
//             dv_j = sum_i P_ij dout_i, dP_ij = dout_i . v_j, dS_ij = P_ij (dP_ij - delta_i),
//             dq_i = scale sum_j dS_ij k_j, dk_j = scale sum_i dS_ij q_i.
// The exponentials are taken in base 2 (simd::vexp2, cheaper than exp): scores are scaled by
// scale log2(e), so m_i and the scores are in units of ln 2, and exp(s - m) = 2^(s' - m');
// lse is stored in natural units, lse_i = m_i ln 2 + log l_i.
// Softcap c > 0: s_ij is replaced by c t_ij, t_ij = tanh(scale q_i . k_j / c), in both
// directions (so lse is of the capped scores), and dS_ij = P_ij (dP_ij - delta_i) (1 - t_ij^2),
// the derivative through the cap, before dq and dk take it (tile_p_ds).
// ALiBi slopes a_h (null: none): s_ij + a_h (j - i) in both directions, added in base 2 as
// fmadd(a_h log2(e), j - i, s'_ij), j - i exact in float; a constant bias, so dS is unchanged.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/simd.h"

namespace autosp::cpu::AUTOSP_ISA {
namespace {

constexpr float kLog2e = 1.44269504088896341f, kLn2 = 0.693147180559945309f;

// The W-wide vector helpers (vf, W, load/store/splat/fmadd/vmax/hmax, vexp, vexp2).
using namespace simd;

// ---- register-blocked C[M x N] (+)= A[M x K] B[K x N] --------------------------------
// A is read element by element (broadcast) through strides, so A may be a transposed view:
// a(i, k) = A[i * ars + k * acs]. B and C are row-major with leading dims ldb, ldc; the
// vector dimension is N. All the tile products of attention are this one shape.
// Tail: one vector of which only the first `cols` (< W) columns exist; masked loads and
// stores never touch B's or C's memory past them (a head dim that is not a multiple of W).
template <int MR, int NV, bool Tail = false>
inline void micro_kernel(int64_t K, const float* __restrict A, int64_t ars, int64_t acs,
                         const float* __restrict B, int64_t ldb, float* __restrict C,
                         int64_t ldc, bool accumulate, const float* __restrict row_scale,
                         int64_t cols = W) {
  static_assert(!Tail || NV == 1);
  const auto ld = [cols](const float* p) { return Tail ? load(p, cols) : load(p); };
  vf acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) {
      if (!accumulate) acc[i][v] = vf{};
      else if (row_scale) acc[i][v] = ld(C + i * ldc + v * W) * splat(row_scale[i]);
      else acc[i][v] = ld(C + i * ldc + v * W);
    }
  // Unrolled by 4 (the same operations in the same order): K is only D or a tile's 64 here,
  // and the loop's own overhead showed (one thread, S 2048, D 32, medians of 5 alternating
  // runs: backward 78.4 -> 80.6 GFLOP/s avx2, 119 -> 121 avx512; 8 measured the same as 4).
#pragma GCC unroll 4
  for (int64_t k = 0; k < K; ++k) {
    vf b[NV];
    for (int v = 0; v < NV; ++v) b[v] = ld(B + k * ldb + v * W);
    const float* a = A + k * acs;
    for (int i = 0; i < MR; ++i) {
      const vf ai = splat(a[i * ars]);
      for (int v = 0; v < NV; ++v) acc[i][v] = fmadd(ai, b[v], acc[i][v]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) {
      if constexpr (Tail) store(C + i * ldc + v * W, cols, acc[i][v]);
      else store(C + i * ldc + v * W, acc[i][v]);
    }
}

// Rows of one column panel of NV vectors, in blocks of MR with a compile-time tail. row_scale
// (null: none) holds the panel's rows' scales, moved along with C's rows.
template <int MR, int NV, bool Tail = false>
void panel(int64_t M, int64_t K, const float* A, int64_t ars, int64_t acs, const float* B,
           int64_t ldb, float* C, int64_t ldc, bool accumulate, const float* row_scale,
           int64_t cols = W) {
  int64_t i = 0;
  for (; i + MR <= M; i += MR)
    micro_kernel<MR, NV, Tail>(K, A + i * ars, ars, acs, B, ldb, C + i * ldc, ldc, accumulate,
                               row_scale ? row_scale + i : nullptr, cols);
  if constexpr (MR > 1) {
    if (i < M)
      panel<MR - 1, NV, Tail>(M - i, K, A + i * ars, ars, acs, B, ldb, C + i * ldc, ldc, accumulate,
                              row_scale ? row_scale + i : nullptr, cols);
  }
}

// The widest register tile: kMR rows x kNV vectors of accumulators, plus kNV vectors of B
// and one broadcast of A, must fit the register file without spilling.
#if defined(__AVX512F__)
constexpr int kMR = 6, kNV = 4;  // 24 + 4 + 1 of 32 zmm: a 6 x 64 tile
#else
constexpr int kMR = 6, kNV = 2;  // 12 + 2 + 1 of 16 ymm: a 6 x 16 tile (Haswell sgemm's)
#endif

// With accumulate, C (+)= A B adds to C's rows, each first multiplied by row_scale[i] when
// row_scale is given (the forward's rescaling of its running output: the same rounded
// products a separate pass over C made, without that pass).
void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t ars, int64_t acs,
          const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate,
          const float* row_scale = nullptr) {
  int64_t n = 0;
  for (; n + kNV * W <= N; n += kNV * W)
    panel<kMR, kNV>(M, K, A, ars, acs, B + n, ldb, C + n, ldc, accumulate, row_scale);
  if constexpr (kNV > 2) {
    if (n + 2 * W <= N) {
      panel<8, 2>(M, K, A, ars, acs, B + n, ldb, C + n, ldc, accumulate, row_scale);
      n += 2 * W;
    }
  }
  if (n + W <= N) {
    panel<8, 1>(M, K, A, ars, acs, B + n, ldb, C + n, ldc, accumulate, row_scale);
    n += W;
  }
  if (n < N)  // D not a multiple of W: the last columns in one masked vector
    panel<8, 1, true>(M, K, A, ars, acs, B + n, ldb, C + n, ldc, accumulate, row_scale, N - n);
}

// ---- tiling and workspace layout -------------------------------------------------------
constexpr int64_t kBq = 64;  // query rows per tile (a multiple of W)
constexpr int64_t kBk = 64;  // key rows per tile (a multiple of W)
static_assert(kBq % W == 0 && kBk % W == 0);
// Query vectors whose softmax statistics the forward updates together (4 of 4 zmm, 4 of 8 ymm).
constexpr int kRV = 4;
static_assert(kBq / W % kRV == 0);

constexpr int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
// Every region starts on a 64-byte boundary relative to the workspace start.
constexpr int64_t region(int64_t floats) { return round_up(floats, W); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// 0, 1, ..., 63 as floats: a tile's row or column offsets, for ALiBi's j - i.
struct Iota {
  alignas(64) float v[kBk > kBq ? kBk : kBq];
  constexpr Iota() : v{} {
    for (int64_t i = 0; i < (kBk > kBq ? kBk : kBq); ++i) v[i] = float(i);
  }
};
constexpr Iota kIota{};

// ---- masks beyond causal ---------------------------------------------------------------
// Documents and the sliding window, for one sequence of the batch. Document ids (null: one
// document) are non-decreasing, so rows [r0, r0 + n) hold documents ids[r0] .. ids[r0 + n - 1];
// the window W (0: none) hides key j from query i when i - j >= W. A tile of queries
// [i0, i0 + qb) and keys [j0, j0 + kb) is
//   skip:  no query sees any key (their document ranges are disjoint, or even the nearest
//          pair (i0, j0 + kb - 1) is W or more apart): not computed at all;
//   whole: every pair in one document and within the window: no mask beyond the causal one;
//   mixed: some pairs are hidden: those scores are masked one by one (hidden()).
// So the work is the sum over documents of their squared lengths, and with a window about
// S x W instead of S^2 / 2.
struct Mask {
  enum Tile { skip, whole, mixed };
  const int32_t* ids = nullptr;
  int64_t window = 0;

  Tile tile(int64_t i0, int64_t qb, int64_t j0, int64_t kb) const {
    Tile t = whole;
    if (window > 0) {
      if (i0 - (j0 + kb - 1) >= window) return skip;
      if (i0 + qb - 1 - j0 >= window) t = mixed;  // the farthest pair is outside
    }
    if (ids) {
      const int32_t qlo = ids[i0], qhi = ids[i0 + qb - 1], klo = ids[j0], khi = ids[j0 + kb - 1];
      if (qhi < klo || khi < qlo) return skip;
      if (qlo != qhi || klo != khi) t = mixed;
    }
    return t;
  }
  // Whether query i must not see key j <= i (a mixed tile's pairs; causality is apart).
  bool hidden(int64_t i, int64_t j) const { return (ids && ids[i] != ids[j]) || (window > 0 && i - j >= window); }
  // What a tile must mask by (tile_p_ds): this mask for a mixed tile, else null.
  const Mask* mixed_mask(Tile t) const { return t == mixed ? this : nullptr; }
  // Window: whether query block i0 and every later one are past all of key block [j0, j0 + kb).
  bool past_window(int64_t i0, int64_t j0, int64_t kb) const { return window > 0 && i0 - (j0 + kb - 1) >= window; }
};

Mask mask_of(const int32_t* documents, int64_t window, int64_t S, int64_t b) {
  return {documents ? documents + b * S : nullptr, window};
}

struct ForwardPlan {
  int64_t qT, st, o, m, l, corr, per_thread;
};
ForwardPlan plan_forward(const AttentionDims& d) {
  ForwardPlan p{};
  int64_t off = 0;
  p.qT = off, off += region(d.D * kBq);   // scale * Q_i^T, D x Bq (zero-padded columns)
  p.st = off, off += region(kBk * kBq);   // S^T then P^T, Bk x Bq
  p.o = off, off += region(kBq * d.dv());  // unnormalised output rows
  p.m = off, off += region(kBq);
  p.l = off, off += region(kBq);
  p.corr = off, off += region(kBq);
  p.per_thread = off;
  return p;
}

// Backward runs one of two schedules, chosen from the work items per thread (never from
// the data), that give bitwise the same results (both are built from the same tile steps,
// summing in the same order):
//   fused: one work item per (batch, query head) walks key blocks j and, for each, the query
//          blocks i: dK_j, dV_j complete in registers' worth of scratch, dQ accumulates in
//          an S x D buffer. 5 tile products per (i, j). The head's q and dout rows are first
//          copied adjacent (S x D each): in [B, S, NH, D] they are NH x D floats apart, so the
//          head's rows, read again for every key block, occupy a fraction of the cache's sets
//          and evict each other (packed: backward 1.08-1.10x faster at NH 8, D 32, both sets).
//   split: when there are too few heads to keep every thread busy (few heads per rank under
//          sequence parallelism, many cores): items over (batch, kv head, key block j) make
//          dK_j, dV_j, then items over (batch, query head, query block i) make dQ_i, each
//          walking its own blocks in the same order as fused. P and dS are recomputed in
//          the second phase: 7 tile products per (i, j) instead of 5.
struct BackwardPlan {
  int64_t kT, vT, p, ds, dk, dv, dq, delta, per_thread;
  int64_t q, dout;   // fused only: the head's q and dout rows, packed (S x D, S x Dv)
  int64_t G;         // query heads per kv head
  bool split;        // the split schedule (else fused)
  // fused only:
  int64_t wave;      // kv groups processed at once when G > 1
  int64_t slot;      // floats of one query head's dk+dv partial (S x D, then S x Dv from slot_dv)
  int64_t slot_dv;
  int64_t slots;     // number of partial slots (0 when G == 1)
  // split only:
  int64_t dk_sum, dv_sum;  // per thread: a kv group's dK_j, dV_j summed over its heads
  int64_t deltas;          // shared: delta of every (batch, query head, row), B x NH x S
};

// The fused schedule keeps threads busy when its B x NH equal items fill the threads'
// rounds well; 0.75 is about where the split schedule's 7/5 work starts to cost less.
bool use_split(const AttentionDims& d, int threads) {
  const int64_t items = d.B * d.NH;
  const int64_t rounds = ceil_div(items, std::max(threads, 1));
  return double(items) / double(rounds * std::max(threads, 1)) < 0.75;
}

BackwardPlan plan_backward(const AttentionDims& d, int threads) {
  BackwardPlan p{};
  p.G = d.NH / d.NKV;
  p.split = use_split(d, threads);
  int64_t off = 0;
  const int64_t Dv = d.dv();
  p.kT = off, off += region(d.D * kBk);  // K_j^T, D x Bk (zero-padded columns)
  p.vT = off, off += region(Dv * kBk);   // V_j^T, Dv x Bk
  p.p = off, off += region(kBq * kBk);   // P tile
  p.ds = off, off += region(kBq * kBk);  // dP then dS tile
  p.dk = off, off += region(kBk * d.D);  // dK_j accumulator
  p.dv = off, off += region(kBk * Dv);   // dV_j accumulator
  if (!p.split) {
    p.dq = off, off += region(d.S * d.D);  // dq accumulator of the whole head
    p.delta = off, off += region(d.S);     // delta_i = dout_i . out_i
    p.q = off, off += region(d.S * d.D);
    p.dout = off, off += region(d.S * Dv);
    p.per_thread = off;
    p.wave = std::max<int64_t>(1, ceil_div(std::max(threads, 1), p.G));
    p.slot_dv = region(d.S * d.D);
    p.slot = p.slot_dv + region(d.S * Dv);
    p.slots = p.G > 1 ? p.wave * p.G : 0;
  } else {
    p.dq = off, off += region(kBq * d.D);  // dq accumulator of one query block
    p.dk_sum = off, off += region(kBk * d.D);
    p.dv_sum = off, off += region(kBk * Dv);
    p.per_thread = off;
    p.deltas = region(d.B * d.NH * d.S);
  }
  return p;
}

// ---- forward ---------------------------------------------------------------------------
// One work item: query block [i0, i0 + qb) of head h in batch b.
void forward_block(const AttentionDims& d, bool causal, float scale, float softcap, const float* alibi,
                   const float* q, const float* k, const float* v, float* out, float* lse, int64_t b,
                   int64_t h, int64_t i0, const Mask& mask, float* ws, const ForwardPlan& plan) {
  const int64_t S = d.S, D = d.D, Dv = d.dv(), NH = d.NH, NKV = d.NKV;
  const int64_t kvh = h / (NH / NKV);
  const int64_t qb = std::min(kBq, S - i0);
  float* __restrict qT = ws + plan.qT;
  float* __restrict st = ws + plan.st;
  float* __restrict o = ws + plan.o;
  float* __restrict m = ws + plan.m;
  float* __restrict l = ws + plan.l;
  float* __restrict corr = ws + plan.corr;

  const float* qrow = q + ((b * S + i0) * NH + h) * D;
  // Scores in base 2; with a cap, the tiles first hold scale q.k / c, the argument of tanh.
  const float scale2 = softcap > 0 ? scale / softcap : scale * kLog2e;
  const vf cap2 = splat(softcap * kLog2e);
  const float slope2 = alibi ? alibi[h] * kLog2e : 0.0f;  // ALiBi's slope in base 2
  for (int64_t dd = 0; dd < D; ++dd) {
    for (int64_t r = 0; r < qb; ++r) qT[dd * kBq + r] = scale2 * qrow[r * NH * D + dd];
    for (int64_t r = qb; r < kBq; ++r) qT[dd * kBq + r] = 0.0f;
  }
  for (int64_t r = 0; r < kBq; ++r) m[r] = -std::numeric_limits<float>::infinity(), l[r] = 0.0f;

  const int64_t j_end = causal ? i0 + qb : S;  // keys at or past j_end are masked for all rows
  // Window: key blocks before the one holding i0 - W + 1 are hidden from every row.
  const int64_t j_begin = mask.window > 0 ? std::max<int64_t>(0, i0 - mask.window + 1) / kBk * kBk : 0;
  bool first = true;
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kBk) {
    const int64_t kb = std::min(kBk, j_end - j0);
    const Mask::Tile tile = mask.tile(i0, qb, j0, kb);
    if (tile == Mask::skip) continue;
    const float* krow = k + ((b * S + j0) * NKV + kvh) * D;
    const float* vrow = v + ((b * S + j0) * NKV + kvh) * Dv;
    // S^T = K_j (scale log2(e) Q_i)^T: rows are keys, the vector dimension is queries, so the
    // softmax statistics of all Bq queries update with whole-vector operations.
    gemm(kb, kBq, D, krow, NKV * D, 1, qT, kBq, st, kBq, false);
    if (softcap > 0) {  // c tanh(scale q.k / c), in base 2
      for (int64_t e = 0; e < kb * kBq; e += W) store(st + e, cap2 * vtanh(load(st + e)));
    }
    if (alibi) {  // + slope (j - i): key j = j0 + c, query i = i0 + r along the vector
      const vf sl = splat(slope2);
      for (int64_t c = 0; c < kb; ++c)
        for (int64_t r = 0; r < kBq; r += W) {
          const vf ji = splat(float(j0 + c - i0)) - load(kIota.v + r);
          store(st + c * kBq + r, fmadd(sl, ji, load(st + c * kBq + r)));
        }
    }
    if (causal && j0 + kb - 1 > i0) {  // tile crosses the diagonal
      for (int64_t c = 0; c < kb; ++c)
        for (int64_t r = 0; r < std::min(kBq, j0 + c - i0); ++r)
          st[c * kBq + r] = -std::numeric_limits<float>::infinity();
    }
    if (tile == Mask::mixed) {
      for (int64_t c = 0; c < kb; ++c)
        for (int64_t r = 0; r < qb; ++r)
          if (mask.hidden(i0 + r, j0 + c)) st[c * kBq + r] = -std::numeric_limits<float>::infinity();
    }
    // kRV query vectors at a time: their max and sum chains over the keys run side by side
    // (one vector's chain alone waits on each vmax / add; forward 1.05-1.08x on both sets).
    for (int64_t r0 = 0; r0 < kBq; r0 += kRV * W) {
      vf mx[kRV], ms[kRV], sum[kRV];
      for (int v = 0; v < kRV; ++v) mx[v] = load(m + r0 + v * W);
      for (int64_t c = 0; c < kb; ++c)
        for (int v = 0; v < kRV; ++v) mx[v] = vmax(mx[v], load(st + c * kBq + r0 + v * W));
      // A row that has seen no key yet (documents, window) still has max -inf; subtracting the
      // lowest float instead makes its exp(-inf - max) 0, not NaN. Otherwise ms = mx.
      for (int v = 0; v < kRV; ++v) {
        ms[v] = vmax(mx[v], splat(-std::numeric_limits<float>::max()));
        sum[v] = vf{};
      }
      for (int64_t c = 0; c < kb; ++c)
        for (int v = 0; v < kRV; ++v) {
          float* s = st + c * kBq + r0 + v * W;
          const vf pc = vexp2(load(s) - ms[v]);
          store(s, pc);
          sum[v] += pc;
        }
      for (int v = 0; v < kRV; ++v) {
        const int64_t r = r0 + v * W;
        // m_old = -inf on the row's first tile: 2^-inf = 0 wipes the (zero) running sums.
        const vf cr = vexp2(load(m + r) - ms[v]);
        store(corr + r, cr);
        store(l + r, load(l + r) * cr + sum[v]);
        store(m + r, mx[v]);
      }
    }
    // o = P V on the first tile, else o = corr o + P V (each row rescaled as it is loaded).
    gemm(qb, Dv, kb, st, 1, kBq, vrow, NKV * Dv, o, Dv, !first, corr);
    first = false;
  }

  for (int64_t r = 0; r < qb; ++r) {
    const float inv = 1.0f / l[r];
    float* orow = out + ((b * S + i0 + r) * NH + h) * Dv;
    for (int64_t dd = 0; dd < Dv; ++dd) orow[dd] = o[r * Dv + dd] * inv;
    lse[(b * NH + h) * S + i0 + r] = m[r] * kLn2 + std::log(l[r]);
  }
}

// ---- backward --------------------------------------------------------------------------
// Both schedules are made of these steps, so they compute every tile identically.

// Row strides and head bases of one (batch, query head) pair.
struct HeadView {
  const float *q, *dout, *lse, *delta;  // rows of q (stride qs), dout (stride ds), lse / delta (stride 1)
  int64_t qs, ds;
  float slope2 = 0.0f;  // ALiBi's slope in base 2 (0: none)
};

// delta_i = dout_i . out_i for every row of head h in batch b.
void head_deltas(const AttentionDims& d, const float* out, const float* dout, int64_t b,
                 int64_t h, float* delta) {
  const int64_t S = d.S, Dv = d.dv(), NH = d.NH;
  for (int64_t i = 0; i < S; ++i) {
    const float* o_i = out + ((b * S + i) * NH + h) * Dv;
    const float* do_i = dout + ((b * S + i) * NH + h) * Dv;
    float s = 0.0f;
    for (int64_t dd = 0; dd < Dv; ++dd) s += o_i[dd] * do_i[dd];
    delta[i] = s;
  }
}

// K_j^T (D x kBk) and V_j^T (Dv x kBk), columns past kb zero, of key block [j0, j0 + kb).
void load_kv_transposed(const AttentionDims& d, const float* k, const float* v, int64_t b,
                        int64_t kvh, int64_t j0, int64_t kb, float* __restrict kT,
                        float* __restrict vT) {
  const int64_t Dv = d.dv(), ks = d.NKV * d.D, vs = d.NKV * Dv;
  const float* kj = k + ((b * d.S + j0) * d.NKV + kvh) * d.D;
  const float* vj = v + ((b * d.S + j0) * d.NKV + kvh) * Dv;
  if (Dv == d.D) {
    for (int64_t dd = 0; dd < d.D; ++dd) {
      for (int64_t c = 0; c < kb; ++c) {
        kT[dd * kBk + c] = kj[c * ks + dd];
        vT[dd * kBk + c] = vj[c * ks + dd];
      }
      for (int64_t c = kb; c < kBk; ++c) kT[dd * kBk + c] = vT[dd * kBk + c] = 0.0f;
    }
    return;
  }
  for (int64_t dd = 0; dd < d.D; ++dd) {
    for (int64_t c = 0; c < kb; ++c) kT[dd * kBk + c] = kj[c * ks + dd];
    for (int64_t c = kb; c < kBk; ++c) kT[dd * kBk + c] = 0.0f;
  }
  for (int64_t dd = 0; dd < Dv; ++dd) {
    for (int64_t c = 0; c < kb; ++c) vT[dd * kBk + c] = vj[c * vs + dd];
    for (int64_t c = kb; c < kBk; ++c) vT[dd * kBk + c] = 0.0f;
  }
}

// The backward's P = 2^x (x <= 0, a score less its lse in base 2), exactly 0 below 2^-100: a
// probability that small is nothing beside its row's sum of 1, but dS = P (dP - delta) of
// one near vexp2's smallest (2^-126) is a subnormal, and the dK and dQ products that read
// subnormals run many times slower (ALiBi's far keys: its backward took 1.07-1.52x its
// unbiased time before this, 0.88-1.06x after, on avx512; docs/PERFORMANCE.md).
inline vf probability(vf x) { return x < splat(-100.0f) ? vf{} : vexp2(x); }

// tile_p_ds with a softcap c: both products first (dP into ds, then the raw scores into p),
// then one pass makes t = tanh(scale q.k / c), P = 2^(c t log2(e) - lse log2(e)) and
// dS = P (dP - delta) (1 - t^2), which needs t and dP together; hidden pairs get P = dS = 0.
void tile_p_ds_capped(const AttentionDims& d, bool diag, float scale, float softcap, const HeadView& hv,
                      int64_t i0, int64_t qb, int64_t j0, int64_t kb, const Mask* mixed, const float* kT,
                      const float* vT, float* p, float* ds) {
  gemm(qb, kBk, d.dv(), hv.dout + i0 * hv.ds, hv.ds, 1, vT, kBk, ds, kBk, false);
  gemm(qb, kBk, d.D, hv.q + i0 * hv.qs, hv.qs, 1, kT, kBk, p, kBk, false);
  const vf arg = splat(scale / softcap), cap2 = splat(softcap * kLog2e), one = splat(1.0f);
  for (int64_t r = 0; r < qb; ++r) {
    const vf lr = splat(hv.lse[i0 + r] * kLog2e), dl = splat(hv.delta[i0 + r]);
    float* pr = p + r * kBk;
    float* dsr = ds + r * kBk;
    for (int64_t c = 0; c < kBk; c += W) {
      const vf t = vtanh(load(pr + c) * arg);
      const vf pc = vexp2(fmadd(t, cap2, -lr));
      store(pr + c, pc);
      store(dsr + c, pc * (load(dsr + c) - dl) * (one - t * t));
    }
    const int64_t c_end = diag ? std::clamp<int64_t>(i0 + r - j0 + 1, 0, kb) : kb;
    for (int64_t c = c_end; c < kBk; ++c) pr[c] = dsr[c] = 0.0f;
    if (mixed) {
      for (int64_t c = 0; c < c_end; ++c)
        if (mixed->hidden(i0 + r, j0 + c)) pr[c] = dsr[c] = 0.0f;
    }
  }
}

// P = exp(scale Q_i K_j^T - lse_i) (masked and padding keys 0) and dS = P (dO_i V_j^T - delta_i)
// of tile (query block [i0, i0 + qb), key block [j0, j0 + kb)), into p and ds (qb x kBk).
// mixed (a mixed tile's mask, else null): its hidden pairs get P = 0.
void tile_p_ds(const AttentionDims& d, bool causal, float scale, float softcap, const HeadView& hv, int64_t i0,
               int64_t qb, int64_t j0, int64_t kb, const Mask* mixed, const float* kT,
               const float* vT, float* p, float* ds) {
  const float* qi = hv.q + i0 * hv.qs;
  const float* doi = hv.dout + i0 * hv.ds;
  const bool diag = causal && j0 + kb - 1 > i0;
  if (softcap > 0) return tile_p_ds_capped(d, diag, scale, softcap, hv, i0, qb, j0, kb, mixed, kT, vT, p, ds);
  gemm(qb, kBk, d.D, qi, hv.qs, 1, kT, kBk, p, kBk, false);
  const vf sc = splat(scale * kLog2e);  // base 2, as the forward
  const vf sl = splat(hv.slope2);
  for (int64_t r = 0; r < qb; ++r) {
    const vf lr = splat(hv.lse[i0 + r] * kLog2e);
    float* pr = p + r * kBk;
    if (hv.slope2 != 0.0f) {  // ALiBi: + slope (j - i), key j = j0 + c along the vector
      const vf ij = splat(float(j0 - i0 - r));
      for (int64_t c = 0; c < kBk; c += W)
        store(pr + c, probability(fmadd(load(pr + c), sc, fmadd(sl, ij + load(kIota.v + c), -lr))));
    } else {
      for (int64_t c = 0; c < kBk; c += W) store(pr + c, probability(fmadd(load(pr + c), sc, -lr)));
    }
    // Masked keys (j > i) and padding columns (c >= kb) get probability 0.
    const int64_t c_end = diag ? std::clamp<int64_t>(i0 + r - j0 + 1, 0, kb) : kb;
    for (int64_t c = c_end; c < kBk; ++c) pr[c] = 0.0f;
    if (mixed) {
      for (int64_t c = 0; c < c_end; ++c)
        if (mixed->hidden(i0 + r, j0 + c)) pr[c] = 0.0f;
    }
  }
  // dP = dO_i V_j^T, then dS = P (dP - delta_i) in place
  gemm(qb, kBk, d.dv(), doi, hv.ds, 1, vT, kBk, ds, kBk, false);
  for (int64_t r = 0; r < qb; ++r) {
    const vf dl = splat(hv.delta[i0 + r]);
    float* dsr = ds + r * kBk;
    const float* pr = p + r * kBk;
    for (int64_t c = 0; c < kBk; c += W) store(dsr + c, load(pr + c) * (load(dsr + c) - dl));
  }
}

// dV_j (+)= P^T dO_i and dK_j (+)= dS^T Q_i (unscaled) for one tile.
void tile_dk_dv(const AttentionDims& d, const HeadView& hv, int64_t i0, int64_t qb, int64_t kb,
                const float* p, const float* ds, float* dka, float* dva, bool accumulate) {
  gemm(kb, d.dv(), qb, p, 1, kBk, hv.dout + i0 * hv.ds, hv.ds, dva, d.dv(), accumulate);
  gemm(kb, d.D, qb, ds, 1, kBk, hv.q + i0 * hv.qs, hv.qs, dka, d.D, accumulate);
}

// dQ_i += dS K_j (unscaled) for one tile; dqa holds rows [i0, i0 + qb).
void tile_dq(const AttentionDims& d, const float* k, int64_t b, int64_t kvh, int64_t j0,
             int64_t qb, int64_t kb, const float* ds, float* dqa) {
  const float* kj = k + ((b * d.S + j0) * d.NKV + kvh) * d.D;
  gemm(qb, d.D, kb, ds, kBk, 1, kj, d.NKV * d.D, dqa, d.D, true);
}

// Causal: the query blocks before the diagonal see none of key block j0's keys; at least
// one block (the one holding query j0) always remains, so dK_j, dV_j are always written.
int64_t first_query_block(bool causal, int64_t j0) { return causal ? j0 / kBq * kBq : 0; }

HeadView head_view(const AttentionDims& d, const float* q, const float* dout, const float* lse,
                   const float* delta, int64_t b, int64_t h, const float* alibi) {
  return {q + (b * d.S * d.NH + h) * d.D, dout + (b * d.S * d.NH + h) * d.dv(),
          lse + (b * d.NH + h) * d.S, delta, d.NH * d.D, d.NH * d.dv(), alibi ? alibi[h] * kLog2e : 0.0f};
}

// Fused schedule, one work item: every key block of query head h in batch b. Writes dq for
// (b, h) and the head's dk, dv contribution (scaled) to dk_dst, dv_dst (rows of strides ld,
// ld_v).
void backward_head(const AttentionDims& d, bool causal, float scale, float softcap, const float* alibi, const float* q,
                   const float* k, const float* v, const float* out, const float* lse,
                   const float* dout, float* dq, float* dk_dst, float* dv_dst, int64_t ld, int64_t ld_v,
                   int64_t b, int64_t h, const Mask& mask, float* ws, const BackwardPlan& plan) {
  const int64_t S = d.S, D = d.D, Dv = d.dv();
  const int64_t kvh = h / plan.G;
  float* __restrict dqa = ws + plan.dq;
  float* __restrict delta = ws + plan.delta;
  head_deltas(d, out, dout, b, h, delta);
  // The head's q and dout rows copied adjacent (BackwardPlan, fused), and read from there.
  const HeadView strided = head_view(d, q, dout, lse, delta, b, h, alibi);
  const int64_t qs = strided.qs;  // the row stride of q and dq
  for (int64_t i = 0; i < S; ++i) {
    std::memcpy(ws + plan.q + i * D, strided.q + i * qs, sizeof(float) * D);
    std::memcpy(ws + plan.dout + i * Dv, strided.dout + i * strided.ds, sizeof(float) * Dv);
  }
  const HeadView hv{ws + plan.q, ws + plan.dout, strided.lse, strided.delta, D, Dv, strided.slope2};
  std::memset(dqa, 0, sizeof(float) * S * D);

  for (int64_t j0 = 0; j0 < S; j0 += kBk) {
    const int64_t kb = std::min(kBk, S - j0);
    load_kv_transposed(d, k, v, b, kvh, j0, kb, ws + plan.kT, ws + plan.vT);
    bool first = true;
    for (int64_t i0 = first_query_block(causal, j0); i0 < S; i0 += kBq) {
      if (mask.past_window(i0, j0, kb)) break;
      const int64_t qb = std::min(kBq, S - i0);
      const Mask::Tile tile = mask.tile(i0, qb, j0, kb);
      if (tile == Mask::skip) continue;
      tile_p_ds(d, causal, scale, softcap, hv, i0, qb, j0, kb, mask.mixed_mask(tile), ws + plan.kT, ws + plan.vT,
                ws + plan.p, ws + plan.ds);
      tile_dk_dv(d, hv, i0, qb, kb, ws + plan.p, ws + plan.ds, ws + plan.dk, ws + plan.dv, !first);
      tile_dq(d, k, b, kvh, j0, qb, kb, ws + plan.ds, dqa + i0 * D);
      first = false;
    }
    const float* dka = ws + plan.dk;
    const float* dva = ws + plan.dv;
    for (int64_t c = 0; c < kb; ++c) {
      float* dkr = dk_dst + (j0 + c) * ld;
      float* dvr = dv_dst + (j0 + c) * ld_v;
      for (int64_t dd = 0; dd < D; ++dd) dkr[dd] = scale * dka[c * D + dd];
      for (int64_t dd = 0; dd < Dv; ++dd) dvr[dd] = dva[c * Dv + dd];
    }
  }

  float* dqh = dq + (b * S * d.NH + h) * D;
  for (int64_t i = 0; i < S; ++i)
    for (int64_t dd = 0; dd < D; ++dd) dqh[i * qs + dd] = scale * dqa[i * D + dd];
}

// Split schedule, phase 1 item: dK_j, dV_j of key block j0 of kv head kvh in batch b,
// summed over the group's query heads in head order, as the fused schedule's partials are.
void backward_key_block(const AttentionDims& d, bool causal, float scale, float softcap, const float* alibi,
                        const float* q,
                        const float* k, const float* v, const float* lse, const float* dout,
                        const float* deltas, float* dk, float* dv, int64_t b, int64_t kvh,
                        int64_t j0, const Mask& mask, float* ws, const BackwardPlan& plan) {
  const int64_t S = d.S, D = d.D, Dv = d.dv(), G = plan.G;
  const int64_t kb = std::min(kBk, S - j0);
  load_kv_transposed(d, k, v, b, kvh, j0, kb, ws + plan.kT, ws + plan.vT);
  float* dka = ws + plan.dk;
  const float* dva = ws + plan.dv;
  float* __restrict dks = ws + plan.dk_sum;
  float* __restrict dvs = ws + plan.dv_sum;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t h = kvh * G + g;
    const HeadView hv = head_view(d, q, dout, lse, deltas + (b * d.NH + h) * S, b, h, alibi);
    bool first = true;
    for (int64_t i0 = first_query_block(causal, j0); i0 < S; i0 += kBq) {
      if (mask.past_window(i0, j0, kb)) break;
      const int64_t qb = std::min(kBq, S - i0);
      const Mask::Tile tile = mask.tile(i0, qb, j0, kb);
      if (tile == Mask::skip) continue;
      tile_p_ds(d, causal, scale, softcap, hv, i0, qb, j0, kb, mask.mixed_mask(tile), ws + plan.kT, ws + plan.vT,
                ws + plan.p, ws + plan.ds);
      tile_dk_dv(d, hv, i0, qb, kb, ws + plan.p, ws + plan.ds, ws + plan.dk, ws + plan.dv, !first);
      first = false;
    }
    // G == 1: the head's values as they are; G > 1: 0 + head 0 + head 1 + ..., the fused
    // schedule's reduction of its per-head partials. The partial dK is scaled (and rounded)
    // in its own loop first, as the fused schedule stores it, so no compiler can contract
    // the scaling into the sum (an FMA would round differently).
    for (int64_t e = 0; e < kb * D; ++e) dka[e] *= scale;
    if (G == 1) {
      std::memcpy(dks, dka, sizeof(float) * kb * D);
      std::memcpy(dvs, dva, sizeof(float) * kb * Dv);
    } else {
      if (g == 0) {
        for (int64_t e = 0; e < kb * D; ++e) dks[e] = 0.0f;
        for (int64_t e = 0; e < kb * Dv; ++e) dvs[e] = 0.0f;
      }
      for (int64_t e = 0; e < kb * D; ++e) dks[e] += dka[e];
      for (int64_t e = 0; e < kb * Dv; ++e) dvs[e] += dva[e];
    }
  }
  for (int64_t c = 0; c < kb; ++c) {
    float* dkr = dk + ((b * S + j0 + c) * d.NKV + kvh) * D;
    float* dvr = dv + ((b * S + j0 + c) * d.NKV + kvh) * Dv;
    std::memcpy(dkr, dks + c * D, sizeof(float) * D);
    std::memcpy(dvr, dvs + c * Dv, sizeof(float) * Dv);
  }
}

// Split schedule, phase 2 item: dQ_i of query block i0 of head h in batch b, over key
// blocks in increasing order, as the fused schedule accumulates it.
void backward_query_block(const AttentionDims& d, bool causal, float scale, float softcap, const float* alibi,
                          const float* q,
                          const float* k, const float* v, const float* lse, const float* dout,
                          const float* deltas, float* dq, int64_t b, int64_t h, int64_t i0,
                          const Mask& mask, float* ws, const BackwardPlan& plan) {
  const int64_t S = d.S, D = d.D;
  const int64_t kvh = h / plan.G;
  const int64_t qb = std::min(kBq, S - i0);
  const HeadView hv = head_view(d, q, dout, lse, deltas + (b * d.NH + h) * S, b, h, alibi);
  float* __restrict dqa = ws + plan.dq;
  std::memset(dqa, 0, sizeof(float) * qb * D);
  // Window: key blocks before the one holding i0 - W + 1 are hidden from every row.
  const int64_t j_begin = mask.window > 0 ? std::max<int64_t>(0, i0 - mask.window + 1) / kBk * kBk : 0;
  for (int64_t j0 = j_begin; j0 < S; j0 += kBk) {
    if (first_query_block(causal, j0) > i0) break;  // every later key is masked for block i0
    const int64_t kb = std::min(kBk, S - j0);
    const Mask::Tile tile = mask.tile(i0, qb, j0, kb);
    if (tile == Mask::skip) continue;
    load_kv_transposed(d, k, v, b, kvh, j0, kb, ws + plan.kT, ws + plan.vT);
    tile_p_ds(d, causal, scale, softcap, hv, i0, qb, j0, kb, mask.mixed_mask(tile), ws + plan.kT, ws + plan.vT,
              ws + plan.p, ws + plan.ds);
    tile_dq(d, k, b, kvh, j0, qb, kb, ws + plan.ds, dqa);
  }
  for (int64_t r = 0; r < qb; ++r) {
    float* dqr = dq + ((b * S + i0 + r) * d.NH + h) * D;
    for (int64_t dd = 0; dd < D; ++dd) dqr[dd] = scale * dqa[r * D + dd];
  }
}

}  // namespace

int64_t attention_forward_workspace_floats(const AttentionDims& dims, int threads) {
  return std::max(threads, 1) * plan_forward(dims).per_thread;
}

bool attention_backward_is_split(const AttentionDims& dims, int threads) {
  return use_split(dims, threads);
}

int64_t attention_backward_workspace_floats(const AttentionDims& dims, int threads) {
  const BackwardPlan plan = plan_backward(dims, threads);
  return std::max(threads, 1) * plan.per_thread + plan.slots * plan.slot + plan.deltas;
}

void attention_forward(const AttentionDims& dims, bool causal, float scale, const float* q,
                       const float* k, const float* v, float* out, float* lse, float* workspace,
                       int threads, const int32_t* documents, int64_t window, float softcap,
                       const float* alibi) {
  const ForwardPlan plan = plan_forward(dims);
  const int64_t nq = ceil_div(dims.S, kBq);
  const int64_t items = dims.B * dims.NH * nq;
#pragma omp parallel num_threads(std::max(threads, 1))
  {
    float* ws = workspace + omp_get_thread_num() * plan.per_thread;
    // Causal: the last query blocks do the most work, so hand them out first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t qblk = nq - 1 - it % nq;
      const int64_t bh = it / nq;
      const int64_t b = bh / dims.NH;
      forward_block(dims, causal, scale, softcap, alibi, q, k, v, out, lse, b, bh % dims.NH, qblk * kBq,
                    mask_of(documents, window, dims.S, b), ws, plan);
    }
  }
}

void attention_backward(const AttentionDims& dims, bool causal, float scale, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const float* dout, float* dq, float* dk, float* dv, float* workspace,
                        int threads, const int32_t* documents, int64_t window, float softcap,
                        const float* alibi) {
  threads = std::max(threads, 1);
  const BackwardPlan plan = plan_backward(dims, threads);
  const int64_t S = dims.S, D = dims.D, Dv = dims.dv(), NKV = dims.NKV, G = plan.G;
  float* slots = workspace + threads * plan.per_thread;
  if (plan.split) {
    float* deltas = slots;
    const int64_t nk = ceil_div(S, kBk), nq = ceil_div(S, kBq);
#pragma omp parallel num_threads(threads)
    {
      float* ws = workspace + omp_get_thread_num() * plan.per_thread;
#pragma omp for schedule(static)
      for (int64_t bh = 0; bh < dims.B * dims.NH; ++bh)
        head_deltas(dims, out, dout, bh / dims.NH, bh % dims.NH, deltas + bh * S);
      // (implicit barrier) dK, dV by key block; causal: the first key blocks see the most
      // queries, so they go first.
#pragma omp for schedule(dynamic, 1)
      for (int64_t it = 0; it < dims.B * NKV * nk; ++it) {
        const int64_t bkv = it % (dims.B * NKV), jblk = it / (dims.B * NKV);
        const int64_t b = bkv / NKV;
        backward_key_block(dims, causal, scale, softcap, alibi, q, k, v, lse, dout, deltas, dk, dv, b, bkv % NKV,
                           jblk * kBk,
                           mask_of(documents, window, S, b), ws, plan);
      }
      // dQ by query block, the last (most keys) first.
#pragma omp for schedule(dynamic, 1)
      for (int64_t it = 0; it < dims.B * dims.NH * nq; ++it) {
        const int64_t bh = it % (dims.B * dims.NH), iblk = nq - 1 - it / (dims.B * dims.NH);
        const int64_t b = bh / dims.NH;
        backward_query_block(dims, causal, scale, softcap, alibi, q, k, v, lse, dout, deltas, dq, b, bh % dims.NH,
                             iblk * kBq,
                             mask_of(documents, window, S, b), ws, plan);
      }
    }
    return;
  }
  if (G == 1) {
    // Each query head owns its kv head: write dk, dv directly.
#pragma omp parallel num_threads(threads)
    {
      float* ws = workspace + omp_get_thread_num() * plan.per_thread;
#pragma omp for schedule(dynamic, 1)
      for (int64_t bh = 0; bh < dims.B * dims.NH; ++bh) {
        const int64_t b = bh / dims.NH, h = bh % dims.NH;
        float* dk_bh = dk + (b * S * NKV + h) * D;
        float* dv_bh = dv + (b * S * NKV + h) * Dv;
        backward_head(dims, causal, scale, softcap, alibi, q, k, v, out, lse, dout, dq, dk_bh, dv_bh, NKV * D,
                      NKV * Dv, b, h, mask_of(documents, window, S, b), ws, plan);
      }
    }
    return;
  }
  // GQA: in waves of plan.wave kv groups, every query head writes its dk, dv partial into
  // its own slot; the group's slots are then summed in head order (deterministic).
  const int64_t groups = dims.B * NKV;
#pragma omp parallel num_threads(threads)
  {
    float* ws = workspace + omp_get_thread_num() * plan.per_thread;
    for (int64_t g0 = 0; g0 < groups; g0 += plan.wave) {
      const int64_t ng = std::min(plan.wave, groups - g0);
#pragma omp for schedule(dynamic, 1)
      for (int64_t it = 0; it < ng * G; ++it) {
        const int64_t grp = g0 + it / G;
        const int64_t b = grp / NKV, h = grp % NKV * G + it % G;
        float* dk_part = slots + it * plan.slot;
        float* dv_part = dk_part + plan.slot_dv;
        backward_head(dims, causal, scale, softcap, alibi, q, k, v, out, lse, dout, dq, dk_part, dv_part, D, Dv, b,
                      h, mask_of(documents, window, S, b), ws, plan);
      }
      // (implicit barrier) reduce rows of the wave's groups
#pragma omp for schedule(static)
      for (int64_t row = 0; row < ng * S; ++row) {
        const int64_t gi = row / S, j = row % S;
        const int64_t grp = g0 + gi;
        const int64_t b = grp / NKV, kvh = grp % NKV;
        float* dkr = dk + ((b * S + j) * NKV + kvh) * D;
        float* dvr = dv + ((b * S + j) * NKV + kvh) * Dv;
        for (int64_t dd = 0; dd < D; ++dd) dkr[dd] = 0.0f;
        for (int64_t dd = 0; dd < Dv; ++dd) dvr[dd] = 0.0f;
        for (int64_t g = 0; g < G; ++g) {
          const float* dk_part = slots + (gi * G + g) * plan.slot + j * D;
          const float* dv_part = slots + (gi * G + g) * plan.slot + plan.slot_dv + j * Dv;
          for (int64_t dd = 0; dd < D; ++dd) dkr[dd] += dk_part[dd];
          for (int64_t dd = 0; dd < Dv; ++dd) dvr[dd] += dv_part[dd];
        }
      }
    }
  }
}

}  // namespace autosp::cpu::AUTOSP_ISA
