// Flash-style attention, the reference version: one thread per query row (forward, dq) or
// per key row (dk, dv), key or query tiles staged in shared memory for the whole block, an
// online softmax in fp32, and only the f32 log-sum-exp saved. No S x S matrix exists in
// either direction, and there are no atomics: every result element has one writer, so the
// results are deterministic. The fast version (tensor cores, warp-level tiles) comes beside
// it, checked against it.
//
// visible(i, j) = (!causal || j <= i) && (window == 0 || i - j < window)
//                 && (doc == null || doc[b, j] == doc[b, i])
//   forward:  s_j = scale q_i . k_j (capped: c tanh(s_j / c) when softcap c > 0; plus a_h (j - i)
//             with ALiBi slopes),
//             lse_i = log sum_visible exp(s_j),
//             out_i = sum_visible exp(s_j - lse_i) v_j
//   backward: p_ij = exp(s_ij - lse_i),  delta_i = dout_i . out_i,
//             ds_ij = p_ij (dout_i . v_j - delta_i) (times 1 - tanh^2(s_ij / c) when capped)
//             dq_i = scale sum_j ds_ij k_j,  dk_j = scale sum_i ds_ij q_i,  dv_j = sum_i p_ij dout_i
//   (GQA: dk, dv of kv head g sum over the NH / NKV query heads that read it.)
#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cpu/attention_llama4.h"

namespace autosp::cuda {

namespace {

constexpr int kRows = 64;  // query (or key) rows per block, one per thread
constexpr int kMaxD = static_cast<int>(kAttentionMaxD);

// The reference kernels hold a row of D floats in registers (qr, acc, ...): refuse a larger
// D on the host, before any launch, instead of writing past those arrays.
void require_reference_head_dim(const AttentionDims& d, const char* kernel) {
  if (d.D < 1 || d.D > kAttentionMaxD)
    throw std::invalid_argument(std::string(kernel) + ": head dim D = " + std::to_string(d.D) +
                                " is outside the reference kernel's 1.." + std::to_string(kAttentionMaxD) +
                                " (kAttentionMaxD, kernels/cuda/limits.h)");
}

// Rows per shared-memory tile: two tiles of tile x D floats in 32 KiB.
int tile_rows(int64_t D) {
  const int64_t t = 4096 / D;
  return static_cast<int>(t < 1 ? 1 : (t > 64 ? 64 : t));
}

// The window (0: none) only ever comes with causal (the op's rule): keys i - window < j <= i.
// ALiBi's bias of query i and key j in head h (0 without slopes), as the CPU kernels add it.
__device__ __forceinline__ float alibi_bias(const AlibiSlopes& alibi, int64_t h, int64_t i, int64_t j) {
  return alibi.n ? alibi.a[h] * float(j - i) : 0.0f;
}

__device__ __forceinline__ bool visible(bool causal, int64_t window, const int32_t* doc, int64_t i, int64_t j,
                                        int32_t doc_i, int32_t doc_j) {
  return (!causal || j <= i) && (window == 0 || i - j < window) && (doc == nullptr || doc_i == doc_j);
}

template <typename T>
__global__ void forward_kernel(AttentionDims d, bool causal, int64_t window, float scale, float softcap,
                               const AlibiSlopes alibi, const T* q, const T* k, const T* v, const int32_t* doc, T* out,
                               float* lse, int tile) {
  extern __shared__ float smem[];
  float* ks = smem;
  float* vs = ks + tile * d.D;
  int32_t* docs = reinterpret_cast<int32_t*>(vs + tile * d.D);
  const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (d.NH / d.NKV), D = d.D;
  const int64_t i0 = int64_t(blockIdx.x) * kRows, i = i0 + threadIdx.x;
  const bool active = i < d.S;
  float qr[kMaxD], acc[kMaxD];
  int32_t doc_i = 0;
  if (active) {
    const T* qi = q + ((b * d.S + i) * d.NH + h) * D;
    for (int64_t e = 0; e < D; ++e) qr[e] = to_f(qi[e]), acc[e] = 0.0f;
    if (doc) doc_i = doc[b * d.S + i];
  }
  float m = -INFINITY, l = 0.0f;
  const int64_t last = i0 + kRows < d.S ? i0 + kRows : d.S;  // keys past the block's last query
  const int64_t key_end = causal ? last : d.S;                 // are never visible when causal
  for (int64_t j0 = 0; j0 < key_end; j0 += tile) {
    const int64_t n = j0 + tile < key_end ? tile : key_end - j0;
    __syncthreads();
    for (int64_t e = threadIdx.x; e < n * D; e += blockDim.x) {
      const int64_t jj = e / D, dd = e % D, at = ((b * d.S + j0 + jj) * d.NKV + g) * D + dd;
      ks[e] = to_f(k[at]);
      vs[e] = to_f(v[at]);
    }
    if (doc)
      for (int64_t jj = threadIdx.x; jj < n; jj += blockDim.x) docs[jj] = doc[b * d.S + j0 + jj];
    __syncthreads();
    if (!active) continue;
    for (int64_t jj = 0; jj < n; ++jj) {
      const int64_t j = j0 + jj;
      if (!visible(causal, window, doc, i, j, doc_i, doc ? docs[jj] : 0)) continue;
      float s = 0.0f;
      for (int64_t e = 0; e < D; ++e) s += qr[e] * ks[jj * D + e];
      s = cap(s * scale, softcap).s + alibi_bias(alibi, h, i, j);
      if (s > m) {  // a new row maximum: rescale what was summed so far
        const float f = expf(m - s);
        l *= f;
        for (int64_t e = 0; e < D; ++e) acc[e] *= f;
        m = s;
      }
      const float p = expf(s - m);
      l += p;
      for (int64_t e = 0; e < D; ++e) acc[e] += p * vs[jj * D + e];
    }
  }
  if (!active) return;
  T* oi = out + ((b * d.S + i) * d.NH + h) * D;
  for (int64_t e = 0; e < D; ++e) oi[e] = from_f<T>(acc[e] / l);
  lse[(b * d.NH + h) * d.S + i] = m + logf(l);
}

// delta[b, h, i] = dout_i . out_i
template <typename T>
__global__ void delta_kernel(AttentionDims d, const T* out, const T* dout, float* delta) {
  AUTOSP_GRID_STRIDE(r, d.B * d.S * d.NH) {
    const int64_t h = r % d.NH, bi = r / d.NH, b = bi / d.S, i = bi % d.S;
    float s = 0.0f;
    for (int64_t e = 0; e < d.D; ++e) s += to_f(out[r * d.D + e]) * to_f(dout[r * d.D + e]);
    delta[(b * d.NH + h) * d.S + i] = s;
  }
}

template <typename T>
__global__ void dq_kernel(AttentionDims d, bool causal, int64_t window, float scale, float softcap,
                          const AlibiSlopes alibi, const T* q, const T* k, const T* v, const float* lse,
                          const float* delta, const T* dout, const int32_t* doc, T* dq, int tile) {
  extern __shared__ float smem[];
  float* ks = smem;
  float* vs = ks + tile * d.D;
  int32_t* docs = reinterpret_cast<int32_t*>(vs + tile * d.D);
  const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (d.NH / d.NKV), D = d.D;
  const int64_t i0 = int64_t(blockIdx.x) * kRows, i = i0 + threadIdx.x;
  const bool active = i < d.S;
  float qr[kMaxD], dor[kMaxD], acc[kMaxD];
  int32_t doc_i = 0;
  float lse_i = 0.0f, delta_i = 0.0f;
  if (active) {
    const int64_t at = ((b * d.S + i) * d.NH + h) * D;
    for (int64_t e = 0; e < D; ++e) qr[e] = to_f(q[at + e]), dor[e] = to_f(dout[at + e]), acc[e] = 0.0f;
    if (doc) doc_i = doc[b * d.S + i];
    lse_i = lse[(b * d.NH + h) * d.S + i];
    delta_i = delta[(b * d.NH + h) * d.S + i];
  }
  const int64_t last = i0 + kRows < d.S ? i0 + kRows : d.S;
  const int64_t key_end = causal ? last : d.S;
  for (int64_t j0 = 0; j0 < key_end; j0 += tile) {
    const int64_t n = j0 + tile < key_end ? tile : key_end - j0;
    __syncthreads();
    for (int64_t e = threadIdx.x; e < n * D; e += blockDim.x) {
      const int64_t jj = e / D, dd = e % D, at = ((b * d.S + j0 + jj) * d.NKV + g) * D + dd;
      ks[e] = to_f(k[at]);
      vs[e] = to_f(v[at]);
    }
    if (doc)
      for (int64_t jj = threadIdx.x; jj < n; jj += blockDim.x) docs[jj] = doc[b * d.S + j0 + jj];
    __syncthreads();
    if (!active) continue;
    for (int64_t jj = 0; jj < n; ++jj) {
      const int64_t j = j0 + jj;
      if (!visible(causal, window, doc, i, j, doc_i, doc ? docs[jj] : 0)) continue;
      float s = 0.0f, dp = 0.0f;
      for (int64_t e = 0; e < D; ++e) s += qr[e] * ks[jj * D + e], dp += dor[e] * vs[jj * D + e];
      const Capped c = cap(s * scale, softcap);
      const float p = expf(c.s + alibi_bias(alibi, h, i, j) - lse_i), ds = p * (dp - delta_i) * c.ds;
      for (int64_t e = 0; e < D; ++e) acc[e] += ds * ks[jj * D + e];
    }
  }
  if (!active) return;
  T* out = dq + ((b * d.S + i) * d.NH + h) * D;
  for (int64_t e = 0; e < D; ++e) out[e] = from_f<T>(scale * acc[e]);
}

// One thread per key row j of kv head g; loops over the group's query heads and the query
// tiles that can see j.
template <typename T>
__global__ void dkdv_kernel(AttentionDims d, bool causal, int64_t window, float scale, float softcap,
                            const AlibiSlopes alibi, const T* q, const T* k, const T* v, const float* lse,
                            const float* delta, const T* dout, const int32_t* doc, T* dk, T* dv, int tile) {
  extern __shared__ float smem[];
  float* qs = smem;
  float* dos = qs + tile * d.D;
  float* lses = dos + tile * d.D;
  float* deltas = lses + tile;
  int32_t* docs = reinterpret_cast<int32_t*>(deltas + tile);
  const int64_t b = blockIdx.z, g = blockIdx.y, G = d.NH / d.NKV, D = d.D;
  const int64_t j0 = int64_t(blockIdx.x) * kRows, j = j0 + threadIdx.x;
  const bool active = j < d.S;
  float kr[kMaxD], vr[kMaxD], dka[kMaxD], dva[kMaxD];
  int32_t doc_j = 0;
  if (active) {
    const int64_t at = ((b * d.S + j) * d.NKV + g) * D;
    for (int64_t e = 0; e < D; ++e) kr[e] = to_f(k[at + e]), vr[e] = to_f(v[at + e]), dka[e] = 0.0f, dva[e] = 0.0f;
    if (doc) doc_j = doc[b * d.S + j];
  }
  const int64_t query_begin = causal ? j0 : 0;  // queries before the block's first key see none of it
  for (int64_t h = g * G; h < (g + 1) * G; ++h) {
    for (int64_t i0 = query_begin; i0 < d.S; i0 += tile) {
      const int64_t n = i0 + tile < d.S ? tile : d.S - i0;
      __syncthreads();
      for (int64_t e = threadIdx.x; e < n * D; e += blockDim.x) {
        const int64_t ii = e / D, dd = e % D, at = ((b * d.S + i0 + ii) * d.NH + h) * D + dd;
        qs[e] = to_f(q[at]);
        dos[e] = to_f(dout[at]);
      }
      for (int64_t ii = threadIdx.x; ii < n; ii += blockDim.x) {
        lses[ii] = lse[(b * d.NH + h) * d.S + i0 + ii];
        deltas[ii] = delta[(b * d.NH + h) * d.S + i0 + ii];
        if (doc) docs[ii] = doc[b * d.S + i0 + ii];
      }
      __syncthreads();
      if (!active) continue;
      for (int64_t ii = 0; ii < n; ++ii) {
        const int64_t i = i0 + ii;
        if (!visible(causal, window, doc, i, j, doc ? docs[ii] : 0, doc_j)) continue;
        float s = 0.0f, dp = 0.0f;
        for (int64_t e = 0; e < D; ++e) s += qs[ii * D + e] * kr[e], dp += dos[ii * D + e] * vr[e];
        const Capped c = cap(s * scale, softcap);
        const float p = expf(c.s + alibi_bias(alibi, h, i, j) - lses[ii]), ds = p * (dp - deltas[ii]) * c.ds;
        for (int64_t e = 0; e < D; ++e) dva[e] += p * dos[ii * D + e], dka[e] += ds * qs[ii * D + e];
      }
    }
  }
  if (!active) return;
  const int64_t at = ((b * d.S + j) * d.NKV + g) * D;
  for (int64_t e = 0; e < D; ++e) dk[at + e] = from_f<T>(scale * dka[e]), dv[at + e] = from_f<T>(dva[e]);
}

dim3 grid_of(int64_t S, int64_t heads, int64_t B) {
  return dim3(static_cast<unsigned>((S + kRows - 1) / kRows), static_cast<unsigned>(heads), static_cast<unsigned>(B));
}

__device__ __forceinline__ bool key_visible(bool causal, int64_t window, const int32_t* doc_row, int64_t i,
                                            int64_t j) {
  return (!causal || j <= i) && (window == 0 || i - j < window) && (doc_row == nullptr || doc_row[j] == doc_row[i]);
}

// One block of threads per score row.
template <typename T>
__global__ void block_softmax_kernel(AttentionDims d, AttentionBlock blk, bool causal, int64_t window,
                                     float softcap, const AlibiSlopes alibi, const int32_t* doc, const float* scores,
                                     T* probs, float* lse) {
  __shared__ float red[32];
  const int64_t G = d.NH / d.NKV, r = blockIdx.x, hh = r / blk.nq, i = blk.q0 + r % blk.nq;
  const int64_t h = blk.g * G + hh;
  const float* s = scores + r * blk.nk;
  T* p = probs + r * blk.nk;
  const int32_t* doc_row = doc ? doc + blk.b * d.S : nullptr;
  // the score of key blk.k0 + j, capped and biased
  auto score = [&](int64_t j) { return cap(s[j], softcap).s + alibi_bias(alibi, h, i, blk.k0 + j); };
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < blk.nk; j += blockDim.x)
    if (key_visible(causal, window, doc_row, i, blk.k0 + j)) m = fmaxf(m, score(j));
  m = block_max(m, red);
  float l = 0.0f;
  for (int64_t j = threadIdx.x; j < blk.nk; j += blockDim.x)
    if (key_visible(causal, window, doc_row, i, blk.k0 + j)) l += expf(score(j) - m);
  l = block_sum(l, red);
  const float row_lse = m + logf(l);
  for (int64_t j = threadIdx.x; j < blk.nk; j += blockDim.x)
    p[j] = from_f<T>(key_visible(causal, window, doc_row, i, blk.k0 + j) ? expf(score(j) - row_lse) : 0.0f);
  if (threadIdx.x == 0) lse[(blk.b * d.NH + h) * d.S + i] = row_lse;
}

template <typename T>
__global__ void block_backward_probs_kernel(AttentionDims d, AttentionBlock blk, bool causal, int64_t window,
                                            float softcap, const AlibiSlopes alibi, const int32_t* doc,
                                            const float* scores, const float* dprobs, const float* lse,
                                            const float* delta, T* probs, T* dscores) {
  const int64_t G = d.NH / d.NKV;
  const int32_t* doc_row = doc ? doc + blk.b * d.S : nullptr;
  AUTOSP_GRID_STRIDE(e, G * blk.nq * blk.nk) {
    const int64_t r = e / blk.nk, j = e % blk.nk, hh = r / blk.nq, i = blk.q0 + r % blk.nq;
    const int64_t row = (blk.b * d.NH + blk.g * G + hh) * d.S + i;
    float p = 0.0f, ds = 0.0f;
    if (key_visible(causal, window, doc_row, i, blk.k0 + j)) {
      const Capped c = cap(scores[e], softcap);
      p = expf(c.s + alibi_bias(alibi, blk.g * G + hh, i, blk.k0 + j) - lse[row]);
      ds = p * (dprobs[e] - delta[row]) * c.ds;
    }
    probs[e] = from_f<T>(p);
    dscores[e] = from_f<T>(ds);
  }
}

template <typename T>
__global__ void store_kv_grads_kernel(AttentionDims d, int64_t b, int64_t g, const float* dk_sum,
                                      const float* dv_sum, T* dk, T* dv) {
  AUTOSP_GRID_STRIDE(e, d.S * d.D) {
    const int64_t j = e / d.D, x = e % d.D, at = ((b * d.S + j) * d.NKV + g) * d.D + x;
    dk[at] = from_f<T>(dk_sum[e]);
    dv[at] = from_f<T>(dv_sum[e]);
  }
}

}  // namespace

void attention_block_softmax(Dt dt, const AttentionDims& d, const AttentionBlock& blk, bool causal, int64_t window,
                             float softcap, const int32_t* doc, const float* scores, void* probs, float* lse,
                             cudaStream_t stream, const AlibiSlopes& alibi) {
  const int64_t rows = (d.NH / d.NKV) * blk.nq;
  if (rows == 0 || blk.nk == 0) return;
  dispatch(dt, [&]<typename T>() {
    block_softmax_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        d, blk, causal, window, softcap, alibi, doc, scores, static_cast<T*>(probs), lse);
  });
}

void attention_delta(Dt dt, const AttentionDims& d, const void* out, const void* dout, float* delta,
                     cudaStream_t stream) {
  if (d.B * d.S * d.NH == 0) return;
  dispatch(dt, [&]<typename T>() {
    delta_kernel<T><<<blocks_for(d.B * d.S * d.NH), kThreads, 0, stream>>>(d, static_cast<const T*>(out),
                                                                            static_cast<const T*>(dout), delta);
  });
}

void attention_block_backward_probs(Dt dt, const AttentionDims& d, const AttentionBlock& blk, bool causal,
                                    int64_t window, float softcap, const int32_t* doc, const float* scores,
                                    const float* dprobs, const float* lse, const float* delta, void* probs,
                                    void* dscores, cudaStream_t stream, const AlibiSlopes& alibi) {
  const int64_t n = (d.NH / d.NKV) * blk.nq * blk.nk;
  if (n == 0) return;
  dispatch(dt, [&]<typename T>() {
    block_backward_probs_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
        d, blk, causal, window, softcap, alibi, doc, scores, dprobs, lse, delta, static_cast<T*>(probs),
        static_cast<T*>(dscores));
  });
}

void attention_store_kv_grads(Dt dt, const AttentionDims& d, int64_t b, int64_t g, const float* dk_sum,
                              const float* dv_sum, void* dk, void* dv, cudaStream_t stream) {
  if (d.S * d.D == 0) return;
  dispatch(dt, [&]<typename T>() {
    store_kv_grads_kernel<T><<<blocks_for(d.S * d.D), kThreads, 0, stream>>>(d, b, g, dk_sum, dv_sum,
                                                                              static_cast<T*>(dk), static_cast<T*>(dv));
  });
}

namespace {
// Sinks (kernels/cpu/attention.h): row r = (b S + i) NH + h of out [B, S, NH, Dv] and its lse
// [B, NH, S] with the logit z_h folded in: lse' = log(exp(lse) + exp(z_h)), out' = out exp(lse - lse').
template <typename T>
__global__ void sinks_forward_kernel(int64_t B, int64_t S, int64_t NH, int64_t Dv, const T* sinks, T* out,
                                     float* lse) {
  AUTOSP_GRID_STRIDE(r, B * S * NH) {
    const int64_t h = r % NH, bi = r / NH, b = bi / S, i = bi % S;
    float& l = lse[(b * NH + h) * S + i];
    const float z = to_f(sinks[h]), m = fmaxf(l, z);
    const float folded = isinf(m) ? m : m + log1pf(expf(-fabsf(l - z)));
    const float keep = expf(l - folded);
    for (int64_t e = 0; e < Dv; ++e) out[r * Dv + e] = from_f<T>(to_f(out[r * Dv + e]) * keep);
    l = folded;
  }
}
// dsinks[h] = -sum_{b,i} exp(z_h - lse'_bhi) dout_bih . out_bih: one block per head, its rows in a
// fixed order per thread and a fixed tree over the threads (the same sum every run).
template <typename T>
__global__ void sinks_backward_kernel(int64_t B, int64_t S, int64_t NH, int64_t Dv, const T* sinks, const T* out,
                                      const float* lse, const T* dout, T* dsinks) {
  __shared__ float part[kThreads];
  const int64_t h = blockIdx.x;
  const float z = to_f(sinks[h]);
  float sum = 0.0f;
  for (int64_t bi = threadIdx.x; bi < B * S; bi += blockDim.x) {
    const int64_t r = bi * NH + h, b = bi / S, i = bi % S;
    float dot = 0.0f;
    for (int64_t e = 0; e < Dv; ++e) dot += to_f(out[r * Dv + e]) * to_f(dout[r * Dv + e]);
    sum += expf(z - lse[(b * NH + h) * S + i]) * dot;
  }
  part[threadIdx.x] = sum;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) dsinks[h] = from_f<T>(-part[0]);
}
}  // namespace

namespace {
template <typename T>
__global__ void temperature_kernel(const T* x, int64_t B, int64_t S, int64_t W, float floor_scale, float attn_scale,
                                   T* out) {
  AUTOSP_GRID_STRIDE(e, B * S * W) {
    const int64_t i = e / W % S;
    out[e] = from_f<T>(to_f(x[e]) * attention_llama4::temperature(i, floor_scale, attn_scale));
  }
}
__global__ void chunk_documents_kernel(const int32_t* documents, int64_t B, int64_t S, int64_t chunk, int32_t* ids) {
  AUTOSP_GRID_STRIDE(t, B * S) {
    const int64_t b = t / S;
    ids[t] = attention_llama4::chunk_document_id(documents ? documents + b * S : nullptr, t % S, chunk);
  }
}
}  // namespace

void attention_chunk_documents(const int32_t* documents, int64_t B, int64_t S, int64_t chunk, int32_t* ids,
                               cudaStream_t stream) {
  if (B * S == 0) return;
  chunk_documents_kernel<<<blocks_for(B * S), kThreads, 0, stream>>>(documents, B, S, chunk, ids);
}

void attention_temperature(Dt dt, const void* x, int64_t B, int64_t S, int64_t W, float floor_scale, float attn_scale,
                           void* out, cudaStream_t stream) {
  if (B * S * W == 0) return;
  dispatch(dt, [&]<typename T>() {
    temperature_kernel<T><<<blocks_for(B * S * W), kThreads, 0, stream>>>(static_cast<const T*>(x), B, S, W,
                                                                           floor_scale, attn_scale, static_cast<T*>(out));
  });
}

void attention_sinks_forward(Dt dt, int64_t B, int64_t S, int64_t NH, int64_t Dv, const void* sinks, void* out,
                             float* lse, cudaStream_t stream) {
  if (B * S * NH == 0) return;
  dispatch(dt, [&]<typename T>() {
    sinks_forward_kernel<T><<<blocks_for(B * S * NH), kThreads, 0, stream>>>(B, S, NH, Dv,
                                                                              static_cast<const T*>(sinks),
                                                                              static_cast<T*>(out), lse);
  });
}

void attention_sinks_backward(Dt dt, int64_t B, int64_t S, int64_t NH, int64_t Dv, const void* sinks, const void* out,
                              const float* lse, const void* dout, void* dsinks, cudaStream_t stream) {
  if (NH == 0) return;
  dispatch(dt, [&]<typename T>() {
    sinks_backward_kernel<T><<<static_cast<unsigned>(NH), kThreads, 0, stream>>>(
        B, S, NH, Dv, static_cast<const T*>(sinks), static_cast<const T*>(out), lse, static_cast<const T*>(dout),
        static_cast<T*>(dsinks));
  });
}

void attention_forward(Dt dt, const AttentionDims& d, bool causal, int64_t window, float scale, float softcap,
                       const void* q,
                       const void* k, const void* v, const int32_t* doc, void* out, float* lse, cudaStream_t stream,
                       const AlibiSlopes& alibi) {
  if (d.B * d.S * d.NH == 0) return;
  require_reference_head_dim(d, "cuda::attention_forward");
  const int tile = tile_rows(d.D);
  const size_t smem = sizeof(float) * (2 * tile * d.D + tile);
  dispatch(dt, [&]<typename T>() {
    forward_kernel<T><<<grid_of(d.S, d.NH, d.B), kRows, smem, stream>>>(
        d, causal, window, scale, softcap, alibi, static_cast<const T*>(q), static_cast<const T*>(k),
        static_cast<const T*>(v), doc, static_cast<T*>(out), lse, tile);
  });
}

void attention_backward(Dt dt, const AttentionDims& d, bool causal, int64_t window, float scale, float softcap,
                        const void* q,
                        const void* k, const void* v, const void* out, const float* lse, const void* dout, const int32_t* doc,
                        void* dq, void* dk, void* dv, float* delta, cudaStream_t stream, const AlibiSlopes& alibi) {
  if (d.B * d.S * d.NH == 0) return;
  require_reference_head_dim(d, "cuda::attention_backward");
  const int tile = tile_rows(d.D);
  const size_t smem_q = sizeof(float) * (2 * tile * d.D + tile);
  const size_t smem_kv = sizeof(float) * (2 * tile * d.D + 3 * tile);
  dispatch(dt, [&]<typename T>() {
    delta_kernel<T><<<blocks_for(d.B * d.S * d.NH), kThreads, 0, stream>>>(d, static_cast<const T*>(out),
                                                                            static_cast<const T*>(dout), delta);
    dq_kernel<T><<<grid_of(d.S, d.NH, d.B), kRows, smem_q, stream>>>(
        d, causal, window, scale, softcap, alibi, static_cast<const T*>(q), static_cast<const T*>(k),
        static_cast<const T*>(v), lse, delta, static_cast<const T*>(dout), doc, static_cast<T*>(dq), tile);
    dkdv_kernel<T><<<grid_of(d.S, d.NKV, d.B), kRows, smem_kv, stream>>>(
        d, causal, window, scale, softcap, alibi, static_cast<const T*>(q), static_cast<const T*>(k),
        static_cast<const T*>(v), lse, delta, static_cast<const T*>(dout), doc, static_cast<T*>(dk),
        static_cast<T*>(dv), tile);
  });
}

}  // namespace autosp::cuda
