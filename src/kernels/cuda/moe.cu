// The mixture-of-experts layer's kernels (moe.h): one thread per token for the routing (E and
// k are small: at most a few hundred experts), one block per row for the row copies.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe.h"

#include <stdexcept>
#include <string>

namespace autosp::cuda {

namespace {

constexpr int kMaxExperts = int(kMoeMaxExperts);  // the routing kernels' per-thread arrays

// softmax of one token's logits into p, in double (cpu/moe.cpp's softmax_row).
template <typename T>
__device__ void softmax_token(const T* l, int64_t E, double* p) {
  double m = -INFINITY;
  for (int64_t e = 0; e < E; ++e) m = fmax(m, double(to_f(l[e])));
  double s = 0;
  for (int64_t e = 0; e < E; ++e) s += p[e] = exp(double(to_f(l[e])) - m);
  for (int64_t e = 0; e < E; ++e) p[e] /= s;
}

// softmax of one token's logits into p, and its k largest (ties to the lower expert).
template <typename T>
__device__ void route_token(const T* l, int64_t E, int64_t k, double* p, int32_t* chosen) {
  softmax_token(l, E, p);
  for (int64_t j = 0; j < k; ++j) {
    int32_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || chosen[i] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = int32_t(e);
    }
    chosen[j] = best;
  }
}

template <typename T>
__global__ void route_kernel(const T* logits, int64_t T_, int64_t E, int64_t k, bool normalize, int32_t* experts,
                             float* weights) {
  double p[kMaxExperts];
  AUTOSP_GRID_STRIDE(t, T_) {
    int32_t* chosen = experts + t * k;
    route_token(logits + t * E, E, k, p, chosen);
    double s = 0;
    for (int64_t j = 0; j < k; ++j) s += p[chosen[j]];
    for (int64_t j = 0; j < k; ++j) weights[t * k + j] = float(normalize ? p[chosen[j]] / s : p[chosen[j]]);
  }
}

template <typename T>
__global__ void gather_kernel(const T* src, const int32_t* slots, int64_t n, int64_t k, int64_t H, T* rows) {
  AUTOSP_GRID_STRIDE(i, n * H) {
    const int64_t r = i / H, h = i % H;
    rows[i] = src[int64_t(slots[r] / k) * H + h];
  }
}

template <typename T>
__global__ void scatter_add_kernel(const T* rows, const int32_t* slots, const float* weights, int64_t n, int64_t k,
                                   int64_t H, T* y) {
  AUTOSP_GRID_STRIDE(i, n * H) {
    const int64_t r = i / H, h = i % H;
    const float w = weights ? weights[slots[r]] : 1.0f;
    T* yt = y + int64_t(slots[r] / k) * H + h;
    *yt = from_f<T>(to_f(*yt) + w * to_f(rows[i]));
  }
}

// One block per row.
template <typename T>
__global__ void output_grad_kernel(const T* dy_rows, const T* out, T* dout, const int32_t* slots, const float* weights,
                                   int64_t H, float* dws) {
  __shared__ double shared[32];
  const int64_t r = blockIdx.x;
  const T *dy = dy_rows + r * H, *o = out + r * H;
  double acc = 0;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) acc += double(to_f(dy[h])) * double(to_f(o[h]));
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) dws[slots[r]] = float(acc);
  const float w = weights[slots[r]];
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) dout[r * H + h] = from_f<T>(w * to_f(dy[h]));
}

template <typename T>
__global__ void router_backward_kernel(const T* logits, const int32_t* experts, const float* dws, int64_t T_,
                                       int64_t E, int64_t k, bool normalize, T* dlogits) {
  double p[kMaxExperts];
  AUTOSP_GRID_STRIDE(t, T_) {
    softmax_token(logits + t * E, E, p);
    const int32_t* chosen = experts + t * k;
    const float* dw = dws + t * k;
    double sel = 0, dot = 0;
    for (int64_t j = 0; j < k; ++j) sel += p[chosen[j]];
    for (int64_t j = 0; j < k; ++j) dot += double(dw[j]) * p[chosen[j]] / sel;
    double pdp = 0;
    for (int64_t j = 0; j < k; ++j) pdp += (normalize ? (double(dw[j]) - dot) / sel : double(dw[j])) * p[chosen[j]];
    T* dl = dlogits + t * E;
    for (int64_t e = 0; e < E; ++e) dl[e] = from_f<T>(float(-p[e] * pdp));
    for (int64_t j = 0; j < k; ++j) {
      const double dp = normalize ? (double(dw[j]) - dot) / sel : double(dw[j]);
      dl[chosen[j]] = from_f<T>(float(p[chosen[j]] * (dp - pdp)));
    }
  }
}

template <typename T>
__global__ void balance_rows_kernel(const T* logits, int64_t T_, int64_t E, int64_t k, float* rows) {
  double p[kMaxExperts];
  int32_t chosen[kMaxExperts];
  AUTOSP_GRID_STRIDE(t, T_) {
    route_token(logits + t * E, E, k, p, chosen);
    for (int64_t e = 0; e < E; ++e) {
      rows[t * E + e] = 0.0f;
      rows[(T_ + t) * E + e] = float(p[e]);
    }
    for (int64_t j = 0; j < k; ++j) rows[t * E + chosen[j]] = 1.0f;
  }
}

// One thread per (statistic, expert): its column summed over the rows in order. (The
// probabilities are summed as rounded to f32 here, in double on the CPU: within fp32 rounding.)
__global__ void balance_columns_kernel(const float* rows, int64_t T_, int64_t E, double* acc) {
  AUTOSP_GRID_STRIDE(i, 2 * E) {
    const int64_t which = i / E, e = i % E;
    double s = 0;
    for (int64_t t = 0; t < T_; ++t) s += double(rows[(which * T_ + t) * E + e]);
    acc[i] += s;
  }
}

__global__ void balance_finish_kernel(const double* acc, int64_t n, float* out) {
  AUTOSP_GRID_STRIDE(i, n) out[i] = float(acc[i]);
}

template <typename T>
__global__ void balance_backward_kernel(const float* g, const T* logits, int64_t T_, int64_t E, T* dlogits) {
  double p[kMaxExperts];
  AUTOSP_GRID_STRIDE(t, T_) {
    softmax_token(logits + t * E, E, p);
    double dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += double(g[e]) * p[e];
    for (int64_t e = 0; e < E; ++e) dlogits[t * E + e] = from_f<T>(float(p[e] * (double(g[e]) - dot)));
  }
}

void check_experts(int64_t E) {
  if (E > kMaxExperts)
    throw std::invalid_argument("moe: " + std::to_string(E) + " experts, above the cuda routing kernel's " +
                                std::to_string(kMaxExperts));
}

}  // namespace

void moe_route(Dt dt, const void* logits, int64_t T, int64_t E, int64_t k, bool normalize, int32_t* experts,
               float* weights, cudaStream_t stream) {
  check_experts(E);
  dispatch(dt, [&]<typename X>() {
    route_kernel<X><<<blocks_for(T), kThreads, 0, stream>>>(static_cast<const X*>(logits), T, E, k, normalize,
                                                             experts, weights);
  });
}

void moe_gather_rows(Dt dt, const void* src, const int32_t* slots, int64_t n, int64_t k, int64_t H, void* rows,
                     cudaStream_t stream) {
  dispatch(dt, [&]<typename X>() {
    gather_kernel<X><<<blocks_for(n * H), kThreads, 0, stream>>>(static_cast<const X*>(src), slots, n, k, H,
                                                                  static_cast<X*>(rows));
  });
}

void moe_scatter_add(Dt dt, const void* rows, const int32_t* slots, const float* weights, int64_t n, int64_t k,
                     int64_t H, void* y, cudaStream_t stream) {
  dispatch(dt, [&]<typename X>() {
    scatter_add_kernel<X><<<blocks_for(n * H), kThreads, 0, stream>>>(static_cast<const X*>(rows), slots, weights, n,
                                                                       k, H, static_cast<X*>(y));
  });
}

void moe_output_grad(Dt dt, const void* dy_rows, const void* out, void* dout, const int32_t* slots,
                     const float* weights, int64_t n, int64_t H, float* dws, cudaStream_t stream) {
  if (n == 0) return;
  dispatch(dt, [&]<typename X>() {
    output_grad_kernel<X><<<unsigned(n), kThreads, 0, stream>>>(
        static_cast<const X*>(dy_rows), static_cast<const X*>(out), static_cast<X*>(dout), slots, weights, H, dws);
  });
}

void moe_router_backward(Dt dt, const void* logits, const int32_t* experts, const float* dws, int64_t T, int64_t E,
                         int64_t k, bool normalize, void* dlogits, cudaStream_t stream) {
  check_experts(E);
  dispatch(dt, [&]<typename X>() {
    router_backward_kernel<X><<<blocks_for(T), kThreads, 0, stream>>>(static_cast<const X*>(logits), experts, dws, T,
                                                                       E, k, normalize, static_cast<X*>(dlogits));
  });
}

void moe_balance_stats(Dt dt, const void* logits, int64_t T, int64_t E, int64_t k, float* rows, double* acc,
                       cudaStream_t stream) {
  check_experts(E);
  if (T == 0) return;
  dispatch(dt, [&]<typename X>() {
    balance_rows_kernel<X><<<blocks_for(T), kThreads, 0, stream>>>(static_cast<const X*>(logits), T, E, k, rows);
  });
  balance_columns_kernel<<<blocks_for(2 * E), kThreads, 0, stream>>>(rows, T, E, acc);
}

void moe_balance_finish(const double* acc, int64_t E, float* out, cudaStream_t stream) {
  balance_finish_kernel<<<blocks_for(2 * E), kThreads, 0, stream>>>(acc, 2 * E, out);
}

void moe_balance_backward(Dt dt, const float* dstats, const void* logits, int64_t T, int64_t E, void* dlogits,
                          cudaStream_t stream) {
  check_experts(E);
  if (T == 0) return;
  dispatch(dt, [&]<typename X>() {
    balance_backward_kernel<X><<<blocks_for(T), kThreads, 0, stream>>>(dstats + E, static_cast<const X*>(logits), T,
                                                                        E, static_cast<X*>(dlogits));
  });
}

}  // namespace autosp::cuda
