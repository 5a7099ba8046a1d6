// The mixture-of-experts layer's kernels (moe.h): one thread per token for the routing (E and
// k are small: at most a few hundred experts; the routing is cpu/moe_routing.h's functions,
// the CPU kernels' own), one block per row for the row copies.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe.h"
#include "kernels/cpu/moe_experts.h"

#include <stdexcept>
#include <string>

namespace autosp::cuda {

namespace {

constexpr int kMaxExperts = int(kMoeMaxExperts);  // the routing kernels' per-thread arrays

// One token's logits as doubles, for moe_routing's functions.
template <typename T>
struct Logits {
  const T* l;
  __device__ double operator()(int64_t e) const { return double(to_f(l[e])); }
};

template <typename T>
__global__ void route_kernel(const T* logits, int64_t T_, int64_t E, int64_t k, moe_routing::Route route,
                             int32_t* experts, float* weights) {
  double s[kMaxExperts], w[moe_routing::kMaxTopK];
  AUTOSP_GRID_STRIDE(t, T_) {
    moe_routing::scores(route.sigmoid, Logits<T>{logits + t * E}, E, s);
    moe_routing::choose(route, s, E, k, experts + t * k, w);
    for (int64_t j = 0; j < k; ++j) weights[t * k + j] = float(w[j]);
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
  const float w = weights ? weights[slots[r]] : 1.0f;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) dout[r * H + h] = from_f<T>(w * to_f(dy[h]));
}

// Input weighted (cpu/moe.h's MoeExperts::weight_input): rows[i] *= weights[slots[i]].
template <typename T>
__global__ void scale_rows_kernel(T* rows, const int32_t* slots, const float* weights, int64_t n, int64_t H) {
  AUTOSP_GRID_STRIDE(i, n * H) rows[i] = from_f<T>(to_f(rows[i]) * weights[slots[i / H]]);
}
// One block per row: dws[slots[r]] = <dxs[r], x[slots[r] / k]> (summed in double).
template <typename T>
__global__ void input_weight_grad_kernel(const T* dxs, const T* x, const int32_t* slots, int64_t k, int64_t H,
                                         float* dws) {
  __shared__ double shared[32];
  const int64_t r = blockIdx.x;
  const T *d = dxs + r * H, *xt = x + int64_t(slots[r] / k) * H;
  double acc = 0;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) acc += double(to_f(d[h])) * double(to_f(xt[h]));
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) dws[slots[r]] = float(acc);
}

template <typename T>
__global__ void router_backward_kernel(const T* logits, const float* dws, int64_t T_, int64_t E, int64_t k,
                                       moe_routing::Route route, T* dlogits) {
  double s[kMaxExperts], w[moe_routing::kMaxTopK];
  int32_t chosen[moe_routing::kMaxTopK];
  AUTOSP_GRID_STRIDE(t, T_) {
    moe_routing::scores(route.sigmoid, Logits<T>{logits + t * E}, E, s);
    moe_routing::choose(route, s, E, k, chosen, w);
    T* dl = dlogits + t * E;
    moe_routing::backward(route, s, E, k, chosen, w, dws + t * k, [dl](int64_t e, float v) { dl[e] = from_f<T>(v); });
  }
}

template <typename T>
__global__ void balance_rows_kernel(const T* logits, int64_t T_, int64_t E, int64_t k, float* rows) {
  double p[kMaxExperts];
  int32_t chosen[kMaxExperts];
  AUTOSP_GRID_STRIDE(t, T_) {
    moe_routing::scores(false, Logits<T>{logits + t * E}, E, p);
    moe_routing::top_k([&p](int64_t e) { return p[e]; }, E, k, chosen);
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
    moe_routing::scores(false, Logits<T>{logits + t * E}, E, p);
    double dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += double(g[e]) * p[e];
    for (int64_t e = 0; e < E; ++e) dlogits[t * E + e] = from_f<T>(float(p[e] * (double(g[e]) - dot)));
  }
}

void check_experts(int64_t E, int64_t k = 0) {
  if (E > kMaxExperts)
    throw std::invalid_argument("moe: " + std::to_string(E) + " experts, above the cuda routing kernel's " +
                                std::to_string(kMaxExperts));
  if (k > moe_routing::kMaxTopK)
    throw std::invalid_argument("moe: top_k " + std::to_string(k) + ", above the cuda routing kernel's " +
                                std::to_string(moe_routing::kMaxTopK));
}

}  // namespace

void moe_route(Dt dt, const void* logits, int64_t T, int64_t E, int64_t k, const moe_routing::Route& route,
               int32_t* experts, float* weights, cudaStream_t stream) {
  check_experts(E, k);
  dispatch(dt, [&]<typename X>() {
    route_kernel<X><<<blocks_for(T), kThreads, 0, stream>>>(static_cast<const X*>(logits), T, E, k, route, experts,
                                                             weights);
  });
}

namespace {
// The fused experts (cpu/moe_experts.h): gu [n, 2 I] (gpt-oss's interleaved columns, Llama 4's
// halves) plus the bias [2 I] (null: none) into the saved planes g, u [n, I] and the GLU h [n, I].
template <typename T>
__global__ void fused_glu_kernel(moe_experts::FusedForm form, const T* gu, const T* bias, int64_t n, int64_t I, T* g,
                                 T* u, T* h) {
  AUTOSP_GRID_STRIDE(i, n * I) {
    const int64_t r = i / I, j = i % I;
    const int64_t cg = moe_experts::gate_column(form, I, j), cu = moe_experts::up_column(form, I, j);
    const T gi = from_f<T>(to_f(gu[r * 2 * I + cg]) + (bias ? to_f(bias[cg]) : 0.0f));
    const T ui = from_f<T>(to_f(gu[r * 2 * I + cu]) + (bias ? to_f(bias[cu]) : 0.0f));
    g[i] = gi, u[i] = ui;
    h[i] = from_f<T>(moe_experts::glu(form, to_f(gi), to_f(ui)).h);
  }
}
template <typename T>
__global__ void fused_glu_of_saved_kernel(moe_experts::FusedForm form, const T* g, const T* u, int64_t n, T* h) {
  AUTOSP_GRID_STRIDE(i, n) h[i] = from_f<T>(moe_experts::glu(form, to_f(g[i]), to_f(u[i])).h);
}
// dgu [n, 2 I], in gate_up's columns, from dh [n, I] and the saved g, u.
template <typename T>
__global__ void fused_glu_backward_kernel(moe_experts::FusedForm form, const T* dh, const T* g, const T* u, int64_t n,
                                          int64_t I, T* dgu) {
  AUTOSP_GRID_STRIDE(i, n * I) {
    const int64_t r = i / I, j = i % I;
    const moe_experts::Glu a = moe_experts::glu(form, to_f(g[i]), to_f(u[i]));
    dgu[r * 2 * I + moe_experts::gate_column(form, I, j)] = from_f<T>(to_f(dh[i]) * a.dg);
    dgu[r * 2 * I + moe_experts::up_column(form, I, j)] = from_f<T>(to_f(dh[i]) * a.du);
  }
}
// x [n, C] += bias [C] on each row.
template <typename T>
__global__ void add_row_bias_kernel(T* x, const T* bias, int64_t n, int64_t C) {
  AUTOSP_GRID_STRIDE(i, n * C) x[i] = from_f<T>(to_f(x[i]) + to_f(bias[i % C]));
}
// sums [C] += the column sums of x [n, C], each column's rows in order (deterministic).
template <typename T>
__global__ void add_column_sums_kernel(const T* x, int64_t n, int64_t C, T* sums) {
  AUTOSP_GRID_STRIDE(c, C) {
    float s = 0.0f;
    for (int64_t r = 0; r < n; ++r) s += to_f(x[r * C + c]);
    sums[c] = from_f<T>(to_f(sums[c]) + s);
  }
}
}  // namespace

void moe_fused_glu(Dt dt, const moe_experts::FusedForm& form, const void* gu, const void* bias, int64_t n, int64_t I,
                   void* g, void* u, void* h, cudaStream_t stream) {
  if (n * I == 0) return;
  dispatch(dt, [&]<typename X>() {
    fused_glu_kernel<X><<<blocks_for(n * I), kThreads, 0, stream>>>(
        form, static_cast<const X*>(gu), static_cast<const X*>(bias), n, I, static_cast<X*>(g), static_cast<X*>(u),
        static_cast<X*>(h));
  });
}

void moe_fused_glu_of_saved(Dt dt, const moe_experts::FusedForm& form, const void* g, const void* u, int64_t n,
                            void* h, cudaStream_t stream) {
  if (n == 0) return;
  dispatch(dt, [&]<typename X>() {
    fused_glu_of_saved_kernel<X><<<blocks_for(n), kThreads, 0, stream>>>(form, static_cast<const X*>(g),
                                                                          static_cast<const X*>(u), n,
                                                                          static_cast<X*>(h));
  });
}

void moe_fused_glu_backward(Dt dt, const moe_experts::FusedForm& form, const void* dh, const void* g, const void* u,
                            int64_t n, int64_t I, void* dgu, cudaStream_t stream) {
  if (n * I == 0) return;
  dispatch(dt, [&]<typename X>() {
    fused_glu_backward_kernel<X><<<blocks_for(n * I), kThreads, 0, stream>>>(
        form, static_cast<const X*>(dh), static_cast<const X*>(g), static_cast<const X*>(u), n, I,
        static_cast<X*>(dgu));
  });
}

void moe_scale_rows(Dt dt, void* rows, const int32_t* slots, const float* weights, int64_t n, int64_t H,
                    cudaStream_t stream) {
  if (n * H == 0) return;
  dispatch(dt, [&]<typename X>() {
    scale_rows_kernel<X><<<blocks_for(n * H), kThreads, 0, stream>>>(static_cast<X*>(rows), slots, weights, n, H);
  });
}

void moe_input_weight_grad(Dt dt, const void* dxs, const void* x, const int32_t* slots, int64_t n, int64_t k,
                           int64_t H, float* dws, cudaStream_t stream) {
  if (n == 0) return;
  dispatch(dt, [&]<typename X>() {
    input_weight_grad_kernel<X><<<unsigned(n), kThreads, 0, stream>>>(static_cast<const X*>(dxs),
                                                                       static_cast<const X*>(x), slots, k, H, dws);
  });
}

void moe_add_row_bias(Dt dt, void* x, const void* bias, int64_t n, int64_t C, cudaStream_t stream) {
  if (n * C == 0) return;
  dispatch(dt, [&]<typename X>() {
    add_row_bias_kernel<X><<<blocks_for(n * C), kThreads, 0, stream>>>(static_cast<X*>(x),
                                                                        static_cast<const X*>(bias), n, C);
  });
}

void moe_add_column_sums(Dt dt, const void* x, int64_t n, int64_t C, void* sums, cudaStream_t stream) {
  if (n * C == 0) return;
  dispatch(dt, [&]<typename X>() {
    add_column_sums_kernel<X><<<blocks_for(C), kThreads, 0, stream>>>(static_cast<const X*>(x), n, C,
                                                                       static_cast<X*>(sums));
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

void moe_router_backward(Dt dt, const void* logits, const float* dws, int64_t T, int64_t E, int64_t k,
                         const moe_routing::Route& route, void* dlogits, cudaStream_t stream) {
  check_experts(E, k);
  dispatch(dt, [&]<typename X>() {
    router_backward_kernel<X><<<blocks_for(T), kThreads, 0, stream>>>(static_cast<const X*>(logits), dws, T, E, k,
                                                                       route, static_cast<X*>(dlogits));
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
