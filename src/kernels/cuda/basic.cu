// Reference kernels of the elementwise, reduction, layout, embedding, optimizer and loss
// ops (kernels.h). One thread per element (grid-stride) or one block per row; fp32 maths.
#include "kernels/cuda/common.cuh"

namespace autosp::cuda {

namespace {

// ---- elementwise -----------------------------------------------------------------------

template <typename T>
__global__ void fill_kernel(T* y, int64_t n, float value) {
  const T v = from_f<T>(value);
  AUTOSP_GRID_STRIDE(i, n) y[i] = v;
}

template <typename T>
__global__ void expand_kernel(const T* x, T* y, int64_t n) {
  const T v = x[0];
  AUTOSP_GRID_STRIDE(i, n) y[i] = v;
}

// y[r, c] = b[c] for every row r (a bias, which the linear's gemm then adds x W^T to).
template <typename T>
__global__ void broadcast_rows_kernel(const T* b, int64_t n, int64_t total, T* y) {
  AUTOSP_GRID_STRIDE(i, total) y[i] = b[i % n];
}

template <typename T, typename Op>
__global__ void binary_kernel(const T* a, const T* b, int64_t n, T* y, Op op) {
  AUTOSP_GRID_STRIDE(i, n) y[i] = from_f<T>(op(to_f(a[i]), to_f(b[i])));
}

template <typename T>
__global__ void scale_kernel(const T* x, int64_t n, float alpha, float beta, T* y) {
  if (beta == 0.0f) {
    AUTOSP_GRID_STRIDE(i, n) y[i] = from_f<T>(alpha * to_f(x[i]));
  } else {
    AUTOSP_GRID_STRIDE(i, n) y[i] = from_f<T>(alpha * to_f(x[i]) + beta);
  }
}

template <typename T>
__global__ void relu_kernel(const T* x, int64_t n, T* y) {
  AUTOSP_GRID_STRIDE(i, n) y[i] = to_f(x[i]) > 0.0f ? x[i] : from_f<T>(0.0f);
}

template <typename T>
__global__ void clamp_kernel(const T* x, int64_t n, float lo, float hi, T* y) {
  AUTOSP_GRID_STRIDE(i, n) {
    const float v = to_f(x[i]);
    y[i] = v < lo ? from_f<T>(lo) : (v > hi ? from_f<T>(hi) : x[i]);
  }
}

template <typename T>
__global__ void clamp_backward_kernel(const T* dy, const T* x, int64_t n, float lo, float hi, T* dx) {
  AUTOSP_GRID_STRIDE(i, n) {
    const float v = to_f(x[i]);
    dx[i] = v >= lo && v <= hi ? dy[i] : from_f<T>(0.0f);
  }
}

template <typename T>
__global__ void tanh_kernel(const T* x, int64_t n, T* y) {
  AUTOSP_GRID_STRIDE(i, n) y[i] = from_f<T>(tanhf(to_f(x[i])));
}

template <typename T>
__global__ void div_scalar_kernel(const T* x, int64_t n, const T* s, T* y) {
  const float d = to_f(s[0]);
  AUTOSP_GRID_STRIDE(i, n) y[i] = from_f<T>(to_f(x[i]) / d);
}

// One block, a fixed partition (thread t takes t, t + 1024, ...), then a fixed tree: the
// same sum on every run.
template <typename T>
__global__ void sum_kernel(const T* x, int64_t n, T* y) {
  __shared__ double shared[32];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += double(to_f(x[i]));
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) y[0] = from_f<T>(float(acc));
}

// One block per row: the row's squares summed in double, a fixed partition and tree.
template <typename T>
__global__ void vector_norm_kernel(const T* x, int64_t n, T* y) {
  __shared__ double shared[32];
  const T* row = x + int64_t(blockIdx.x) * n;
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double v = to_f(row[i]);
    acc += v * v;
  }
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) y[blockIdx.x] = from_f<T>(float(sqrt(acc)));
}

// dx[r, i] = dy[r] / y[r] x[r, i] (0 in a row of norm 0); dx may be x.
template <typename T>
__global__ void vector_norm_backward_kernel(const T* dy, const T* x, const T* y, int64_t n, int64_t total, T* dx) {
  AUTOSP_GRID_STRIDE(i, total) {
    const int64_t r = i / n;
    const float yr = to_f(y[r]);
    const float g = yr > 0.0f ? to_f(dy[r]) / yr : 0.0f;
    dx[i] = from_f<T>(g * to_f(x[i]));
  }
}

template <typename From, typename To>
__global__ void convert_kernel(const From* x, int64_t n, To* y) {
  AUTOSP_GRID_STRIDE(i, n) y[i] = from_f<To>(to_f(x[i]));
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename T>
__global__ void silu_kernel(const T* x, int64_t n, T* y) {
  AUTOSP_GRID_STRIDE(i, n) {
    const float v = to_f(x[i]);
    y[i] = from_f<T>(v * sigmoid(v));
  }
}

// dx = dy s(x) (1 + x (1 - s(x)))
template <typename T>
__global__ void silu_backward_kernel(const T* dy, const T* x, int64_t n, T* dx) {
  AUTOSP_GRID_STRIDE(i, n) {
    const float v = to_f(x[i]), s = sigmoid(v);
    dx[i] = from_f<T>(to_f(dy[i]) * s * (1.0f + v * (1.0f - s)));
  }
}

template <typename T>
__global__ void swiglu_kernel(const T* gate, const T* up, int64_t n, T* out) {
  AUTOSP_GRID_STRIDE(i, n) {
    const float g = to_f(gate[i]);
    out[i] = from_f<T>(g * sigmoid(g) * to_f(up[i]));
  }
}

// dgate = dy up silu'(gate), dup = dy silu(gate); both operands read before either result
// is written (a result may alias an operand).
template <typename T>
__global__ void swiglu_backward_kernel(const T* dy, const T* gate, const T* up, int64_t n, T* dgate,
                                       T* dup) {
  AUTOSP_GRID_STRIDE(i, n) {
    const float d = to_f(dy[i]), g = to_f(gate[i]), u = to_f(up[i]), s = sigmoid(g);
    const float dg = d * u * s * (1.0f + g * (1.0f - s)), du = d * g * s;
    dgate[i] = from_f<T>(dg);
    dup[i] = from_f<T>(du);
  }
}

__global__ void count_valid_kernel(const int32_t* labels, int64_t n, int32_t ignore, float* out) {
  __shared__ double shared[32];
  double c = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) c += labels[i] != ignore ? 1.0 : 0.0;
  c = block_sum(c, shared);
  if (threadIdx.x == 0) out[0] = float(c);
}

// ---- layout -------------------------------------------------------------------------------

struct PermuteArgs {
  int rank;
  int64_t out_shape[kMaxRank];
  int64_t in_stride[kMaxRank];  // x's stride of the dim that is y's dim i
};

template <typename E>
__global__ void permute_kernel(const E* x, PermuteArgs p, int64_t n, E* y) {
  AUTOSP_GRID_STRIDE(i, n) {
    int64_t rest = i, src = 0;
    for (int d = p.rank - 1; d >= 0; --d) {
      const int64_t c = rest % p.out_shape[d];
      rest /= p.out_shape[d];
      src += c * p.in_stride[d];
    }
    y[i] = x[src];
  }
}

template <typename E>
__global__ void copy_slab_kernel(const E* x, int64_t outer, int64_t x_dim, int64_t x_off, int64_t inner,
                                 int64_t count, E* y, int64_t y_dim, int64_t y_off) {
  const int64_t n = outer * count * inner;
  AUTOSP_GRID_STRIDE(i, n) {
    const int64_t e = i % inner, r = i / inner, c = r % count, o = r / count;
    y[(o * y_dim + y_off + c) * inner + e] = x[(o * x_dim + x_off + c) * inner + e];
  }
}

template <typename F>
void by_esize(int64_t esize, F&& f) {
  switch (esize) {
    case 1: f.template operator()<uint8_t>(); break;
    case 2: f.template operator()<uint16_t>(); break;
    case 4: f.template operator()<uint32_t>(); break;
    default: f.template operator()<uint64_t>(); break;  // the caller checks esize is 1, 2, 4 or 8
  }
}

// ---- embedding ------------------------------------------------------------------------------

template <typename T>
__global__ void embedding_kernel(const T* W, const int32_t* tokens, int64_t T_, int64_t H, int64_t V,
                                 T* out, int* error) {
  AUTOSP_GRID_STRIDE(i, T_ * H) {
    const int64_t t = i / H, h = i % H;
    const int32_t id = tokens[t];
    if (id < 0 || id >= V) {
      set_error(error, kErrorTokenId);
      out[i] = from_f<T>(0.0f);
    } else {
      out[i] = W[int64_t(id) * H + h];
    }
  }
}

template <typename T>
__global__ void embedding_backward_kernel(const T* dy, const int32_t* tokens, int64_t T_, int64_t H,
                                          int64_t V, float* acc, int* error) {
  AUTOSP_GRID_STRIDE(i, T_ * H) {
    const int64_t t = i / H, h = i % H;
    const int32_t id = tokens[t];
    if (id < 0 || id >= V) set_error(error, kErrorTokenId);
    else atomicAdd(acc + int64_t(id) * H + h, to_f(dy[i]));
  }
}

// ---- rms_norm -------------------------------------------------------------------------------

template <typename T>
__global__ void rms_norm_kernel(const T* x, const T* w, int64_t H, float eps, T* y, float* rstd) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * H;
  float ss = 0;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    const float v = to_f(xr[h]);
    ss += v * v;
  }
  ss = block_sum(ss, shared);
  const float r = 1.0f / sqrtf(ss / float(H) + eps);
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x)
    y[row * H + h] = from_f<T>(to_f(xr[h]) * r * to_f(w[h]));
  if (threadIdx.x == 0) rstd[row] = r;
}

// dx = rstd (dy w - xhat mean(dy w xhat)), xhat = x rstd
template <typename T>
__global__ void rms_norm_dx_kernel(const T* dy, const T* x, const T* w, const float* rstd, int64_t H,
                                   T* dx) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float r = rstd[row];
  float dot = 0;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x)
    dot += to_f(dy[row * H + h]) * to_f(w[h]) * to_f(x[row * H + h]) * r;
  const float mean = block_sum(dot, shared) / float(H);
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    const float xhat = to_f(x[row * H + h]) * r;
    dx[row * H + h] = from_f<T>(r * (to_f(dy[row * H + h]) * to_f(w[h]) - xhat * mean));
  }
}

// dw[h] = sum over rows of dy xhat: blockIdx.y takes a stripe of rows, one atomicAdd per
// (stripe, column).
constexpr int kRmsNormStripes = 64;
template <typename T>
__global__ void rms_norm_dw_kernel(const T* dy, const T* x, const float* rstd, int64_t T_, int64_t H,
                                   float* acc) {
  const int64_t h = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (h >= H) return;
  const int64_t per = (T_ + gridDim.y - 1) / gridDim.y, t0 = blockIdx.y * per;
  const int64_t t1 = t0 + per < T_ ? t0 + per : T_;
  float s = 0;
  for (int64_t t = t0; t < t1; ++t) s += to_f(dy[t * H + h]) * to_f(x[t * H + h]) * rstd[t];
  if (t1 > t0) atomicAdd(acc + h, s);
}

// ---- layer_norm -----------------------------------------------------------------------------

template <typename T>
__global__ void layer_norm_kernel(const T* x, const T* w, const T* b, int64_t H, float eps, T* y, float* mean,
                                  float* rstd) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * H;
  float s = 0;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) s += to_f(xr[h]);
  const float m = block_sum(s, shared) / float(H);
  float ss = 0;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    const float d = to_f(xr[h]) - m;
    ss += d * d;
  }
  const float r = 1.0f / sqrtf(block_sum(ss, shared) / float(H) + eps);
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x)
    y[row * H + h] = from_f<T>((to_f(xr[h]) - m) * r * to_f(w[h]) + to_f(b[h]));
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w, xhat = (x - mean) rstd
template <typename T>
__global__ void layer_norm_dx_kernel(const T* dy, const T* x, const T* w, const float* mean, const float* rstd,
                                     int64_t H, T* dx) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float m = mean[row], r = rstd[row];
  float sg = 0, sgx = 0;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    const float g = to_f(dy[row * H + h]) * to_f(w[h]);
    sg += g;
    sgx += g * (to_f(x[row * H + h]) - m) * r;
  }
  const float mg = block_sum(sg, shared) / float(H);
  const float mgx = block_sum(sgx, shared) / float(H);
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    const float xhat = (to_f(x[row * H + h]) - m) * r;
    dx[row * H + h] = from_f<T>(r * (to_f(dy[row * H + h]) * to_f(w[h]) - mg - xhat * mgx));
  }
}

// dw[h] = sum over rows of dy xhat, db[h] = sum over rows of dy: one thread per column, the
// rows in order.
template <typename T>
__global__ void layer_norm_dwdb_kernel(const T* dy, const T* x, const float* mean, const float* rstd, int64_t T_,
                                       int64_t H, T* dw, T* db) {
  const int64_t h = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (h >= H) return;
  float sw = 0, sb = 0;
  for (int64_t t = 0; t < T_; ++t) {
    const float d = to_f(dy[t * H + h]);
    sw += d * (to_f(x[t * H + h]) - mean[t]) * rstd[t];
    sb += d;
  }
  dw[h] = from_f<T>(sw);
  db[h] = from_f<T>(sb);
}

// ---- gelu -----------------------------------------------------------------------------------

constexpr float kGeluSqrt1_2 = 0.70710678118654752440f, kGeluInvSqrt2Pi = 0.39894228040143267794f,
                kGeluSqrt2OverPi = 0.79788456080286535588f, kGeluKappa = 0.044715f;

template <typename T>
__global__ void gelu_kernel(const T* x, int64_t n, bool tanh_form, T* y) {
  AUTOSP_GRID_STRIDE(i, n) {
    const float v = to_f(x[i]);
    const float g = tanh_form ? 0.5f * v * (1.0f + tanhf(kGeluSqrt2OverPi * (v + kGeluKappa * v * v * v)))
                              : 0.5f * v * (1.0f + erff(v * kGeluSqrt1_2));
    y[i] = from_f<T>(g);
  }
}

template <typename T>
__global__ void gelu_backward_kernel(const T* dy, const T* x, int64_t n, bool tanh_form, T* dx) {
  AUTOSP_GRID_STRIDE(i, n) {
    const float v = to_f(x[i]);
    float d;
    if (tanh_form) {
      const float v2 = v * v, t = tanhf(kGeluSqrt2OverPi * (v + kGeluKappa * v2 * v));
      d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kGeluSqrt2OverPi * (1.0f + 3.0f * kGeluKappa * v2);
    } else {
      d = 0.5f * (1.0f + erff(v * kGeluSqrt1_2)) + v * kGeluInvSqrt2Pi * expf(-0.5f * v * v);
    }
    dx[i] = from_f<T>(to_f(dy[i]) * d);
  }
}

// ---- xIELU ----------------------------------------------------------------------------------

__device__ __forceinline__ float softplus_f(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

template <typename T>
__global__ void xielu_kernel(const T* x, int64_t n, const T* alpha_p, const T* alpha_n, float beta, float eps, T* y) {
  const float ap = softplus_f(to_f(alpha_p[0])), an = beta + softplus_f(to_f(alpha_n[0]));
  AUTOSP_GRID_STRIDE(i, n) {
    const float v = to_f(x[i]);
    y[i] = from_f<T>(v > 0.0f ? ap * v * v + beta * v : (expm1f(fminf(v, eps)) - v) * an + beta * v);
  }
}

template <typename T>
__global__ void xielu_dx_kernel(const T* dy, const T* x, int64_t n, const T* alpha_p, const T* alpha_n, float beta,
                                float eps, T* dx) {
  const float ap = softplus_f(to_f(alpha_p[0])), an = beta + softplus_f(to_f(alpha_n[0]));
  AUTOSP_GRID_STRIDE(i, n) {
    const float v = to_f(x[i]), g = to_f(dy[i]);
    if (v > 0.0f) {
      dx[i] = from_f<T>(g * (2.0f * ap * v + beta));
    } else {
      const float m = fminf(v, eps), dmin = v < eps ? 1.0f : (v == eps ? 0.5f : 0.0f);
      dx[i] = from_f<T>(g * ((expf(m) * dmin - 1.0f) * an + beta));
    }
  }
}

// One block: thread t takes t, t + blockDim, ...; the block's fixed tree sums (deterministic).
template <typename T>
__global__ void xielu_dalpha_kernel(const T* dy, const T* x, int64_t n, const T* alpha_p, const T* alpha_n, float eps,
                                    T* dalpha_p, T* dalpha_n) {
  __shared__ double shared[32];
  double sp = 0, sn = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = to_f(x[i]), g = to_f(dy[i]);
    if (v > 0.0f) sp += double(g) * v * v;
    else sn += double(g) * (expm1f(fminf(v, eps)) - v);
  }
  sp = block_sum(sp, shared);
  __syncthreads();
  sn = block_sum(sn, shared);
  if (threadIdx.x != 0) return;
  const float a = to_f(alpha_p[0]), b = to_f(alpha_n[0]);
  dalpha_p[0] = from_f<T>(float(sp * (a > 20.0f ? 1.0 : 1.0 / (1.0 + exp(-double(a))))));
  dalpha_n[0] = from_f<T>(float(sn * (b > 20.0f ? 1.0 : 1.0 / (1.0 + exp(-double(b))))));
}

// ---- rope -----------------------------------------------------------------------------------

// One thread per (row, head, i < D/2); the angle in double, as the CPU kernel computes it.
struct InvFreq {
  double v[kRopeMaxD / 2];
};
template <typename T>
__global__ void rope_kernel(const T* x, const int32_t* pos, InvFreq inv_freq, int64_t T_,
                            int64_t NH, int64_t D, bool inverse, bool interleaved, T* y) {
  const int64_t half = D / 2;
  AUTOSP_GRID_STRIDE(e, T_ * NH * half) {
    const int64_t i = e % half, th = e / half, t = th / NH;
    const double angle = double(pos[t]) * inv_freq.v[i];
    const float c = float(cos(angle)), s = inverse ? -float(sin(angle)) : float(sin(angle));
    const int64_t base = th * D;
    // the pair: (i, i + D/2), or (2i, 2i + 1) interleaved
    const int64_t p = interleaved ? base + 2 * i : base + i, q = interleaved ? p + 1 : p + half;
    const float a = to_f(x[p]), b = to_f(x[q]);
    y[p] = from_f<T>(a * c - b * s);
    y[q] = from_f<T>(b * c + a * s);
  }
}

// ---- cross entropy ----------------------------------------------------------------------------

template <typename T>
__global__ void cross_entropy_rows_kernel(const T* logits, const int32_t* labels, int64_t V,
                                          int32_t ignore, float* lse, float* row_loss, int* error, float softcap) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* z = logits + row * V;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, cap(to_f(z[v]), softcap).s);
  m = block_max(m, shared);
  float s = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) s += expf(cap(to_f(z[v]), softcap).s - m);
  s = block_sum(s, shared);
  if (threadIdx.x != 0) return;
  const float l = m + logf(s);
  lse[row] = l;
  const int32_t label = labels[row];
  float loss = 0;
  if (label != ignore) {
    if (label < 0 || label >= V) set_error(error, kErrorLabel);
    else loss = l - cap(to_f(z[label]), softcap).s;
  }
  row_loss[row] = loss;
}

__global__ void sum_rows_kernel(const float* row_loss, int64_t T_, float* out) {
  __shared__ double shared[32];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < T_; i += blockDim.x) acc += double(row_loss[i]);
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) out[0] = float(acc);
}

template <typename In, typename Out>
__global__ void cross_entropy_backward_kernel(const In* logits, const int32_t* labels, const float* lse,
                                              const float* dloss, int64_t T_, int64_t V, int32_t ignore,
                                              Out* dlogits, float softcap) {
  const float d = dloss[0];
  AUTOSP_GRID_STRIDE(i, T_ * V) {
    const int64_t t = i / V, v = i % V;
    const int32_t label = labels[t];
    float g = 0;
    if (label != ignore && label >= 0 && label < V) {
      const Capped z = cap(to_f(logits[i]), softcap);
      g = d * (expf(z.s - lse[t]) - (v == label ? 1.0f : 0.0f)) * z.ds;
    }
    dlogits[i] = from_f<Out>(g);
  }
}

// ---- optimizer ----------------------------------------------------------------------------------

__global__ void adamw_kernel(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                             AdamWScalars s, bf16* copy) {
  AUTOSP_GRID_STRIDE(i, n) {
    const float np = adamw_element(param[i], grad[i], exp_avg[i], exp_avg_sq[i], s);
    param[i] = np;
    if (copy) copy[i] = __float2bfloat16_rn(np);
  }
}

template <typename T>
__global__ void accumulate_kernel(const T* g, int64_t n, float* acc, bool overwrite) {
  AUTOSP_GRID_STRIDE(i, n) acc[i] = overwrite ? to_f(g[i]) : acc[i] + to_f(g[i]);
}

struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MulOp {
  __device__ float operator()(float a, float b) const { return a * b; }
};
struct DivOp {
  __device__ float operator()(float a, float b) const { return a / b; }
};
struct ReluBackwardOp {  // (dy, x): dy where x > 0, else 0 (exact: dy passes through f32 unchanged)
  __device__ float operator()(float dy, float x) const { return x > 0.0f ? dy : 0.0f; }
};
struct TanhBackwardOp {  // (dy, y): dy (1 - y^2)
  __device__ float operator()(float dy, float y) const { return dy * (1.0f - y * y); }
};

}  // namespace

void fill(Dt dt, void* y, int64_t n, float value, cudaStream_t stream) {
  dispatch(dt, [&]<typename T>() { fill_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<T*>(y), n, value); });
}

void expand(Dt dt, const void* x, void* y, int64_t n, cudaStream_t stream) {
  dispatch(dt, [&]<typename T>() {
    expand_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), n);
  });
}

void broadcast_rows(Dt dt, const void* b, int64_t rows, int64_t n, void* y, cudaStream_t stream) {
  dispatch(dt, [&]<typename T>() {
    broadcast_rows_kernel<T><<<blocks_for(rows * n), kThreads, 0, stream>>>(static_cast<const T*>(b), n, rows * n,
                                                                             static_cast<T*>(y));
  });
}

void add(Dt dt, const void* a, const void* b, int64_t n, void* y, cudaStream_t stream) {
  dispatch(dt, [&]<typename T>() {
    binary_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(a), static_cast<const T*>(b), n,
                                                              static_cast<T*>(y), AddOp{});
  });
}

void mul(Dt dt, const void* a, const void* b, int64_t n, void* y, cudaStream_t stream) {
  dispatch(dt, [&]<typename T>() {
    binary_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(a), static_cast<const T*>(b), n,
                                                              static_cast<T*>(y), MulOp{});
  });
}

void div(Dt dt, const void* a, const void* b, int64_t n, void* y, cudaStream_t stream) {
  dispatch(dt, [&]<typename T>() {
    binary_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(a), static_cast<const T*>(b), n,
                                                              static_cast<T*>(y), DivOp{});
  });
}

void vector_norm(Dt dt, const void* x, int64_t rows, int64_t n, void* y, cudaStream_t stream) {
  if (rows == 0) return;
  dispatch(dt, [&]<typename T>() {
    vector_norm_kernel<T><<<unsigned(rows), 256, 0, stream>>>(static_cast<const T*>(x), n, static_cast<T*>(y));
  });
}

void vector_norm_backward(Dt dt, const void* dy, const void* x, const void* y, int64_t rows, int64_t n, void* dx,
                          cudaStream_t stream) {
  const int64_t total = rows * n;
  if (total == 0) return;
  dispatch(dt, [&]<typename T>() {
    vector_norm_backward_kernel<T><<<blocks_for(total), kThreads, 0, stream>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(y), n, total, static_cast<T*>(dx));
  });
}

void scale(Dt dt, const void* x, int64_t n, float alpha, void* y, cudaStream_t stream, float beta) {
  dispatch(dt, [&]<typename T>() {
    scale_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(x), n, alpha, beta,
                                                             static_cast<T*>(y));
  });
}

void relu_forward(Dt dt, const void* x, int64_t n, void* y, cudaStream_t stream) {
  dispatch(dt, [&]<typename T>() {
    relu_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(x), n, static_cast<T*>(y));
  });
}

void relu_backward(Dt dt, const void* dy, const void* x, int64_t n, void* dx, cudaStream_t stream) {
  dispatch(dt, [&]<typename T>() {
    binary_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(dy), static_cast<const T*>(x), n,
                                                              static_cast<T*>(dx), ReluBackwardOp{});
  });
}

void clamp_forward(Dt dt, const void* x, int64_t n, float lo, float hi, void* y, cudaStream_t stream) {
  dispatch(dt, [&]<typename T>() {
    clamp_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(x), n, lo, hi, static_cast<T*>(y));
  });
}

void clamp_backward(Dt dt, const void* dy, const void* x, int64_t n, float lo, float hi, void* dx,
                    cudaStream_t stream) {
  dispatch(dt, [&]<typename T>() {
    clamp_backward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(dy),
                                                                       static_cast<const T*>(x), n, lo, hi,
                                                                       static_cast<T*>(dx));
  });
}

void tanh_forward(Dt dt, const void* x, int64_t n, void* y, cudaStream_t stream) {
  dispatch(dt, [&]<typename T>() {
    tanh_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(x), n, static_cast<T*>(y));
  });
}

void tanh_backward(Dt dt, const void* dy, const void* y, int64_t n, void* dx, cudaStream_t stream) {
  dispatch(dt, [&]<typename T>() {
    binary_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(dy), static_cast<const T*>(y), n,
                                                              static_cast<T*>(dx), TanhBackwardOp{});
  });
}

void div_scalar(Dt dt, const void* x, int64_t n, const void* s, void* y, cudaStream_t stream) {
  dispatch(dt, [&]<typename T>() {
    div_scalar_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(x), n,
                                                                  static_cast<const T*>(s), static_cast<T*>(y));
  });
}

void sum(Dt dt, const void* x, int64_t n, void* y, cudaStream_t stream) {
  dispatch(dt, [&]<typename T>() {
    sum_kernel<T><<<1, 1024, 0, stream>>>(static_cast<const T*>(x), n, static_cast<T*>(y));
  });
}

void convert(Dt from, Dt to, const void* x, int64_t n, void* y, cudaStream_t stream) {
  if (from == to) {
    if (x != y) cudaMemcpyAsync(y, x, n * dt_size(from), cudaMemcpyDeviceToDevice, stream);
    return;
  }
  if (from == Dt::f32)
    convert_kernel<float, bf16><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const float*>(x), n,
                                                                         static_cast<bf16*>(y));
  else
    convert_kernel<bf16, float><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const bf16*>(x), n,
                                                                         static_cast<float*>(y));
}

void silu_forward(Dt dt, const void* x, int64_t n, void* y, cudaStream_t stream) {
  dispatch(dt, [&]<typename T>() {
    silu_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(x), n, static_cast<T*>(y));
  });
}

void silu_backward(Dt dt, const void* dy, const void* x, int64_t n, void* dx, cudaStream_t stream) {
  dispatch(dt, [&]<typename T>() {
    silu_backward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(dy),
                                                                     static_cast<const T*>(x), n, static_cast<T*>(dx));
  });
}

void swiglu_forward(Dt dt, const void* gate, const void* up, int64_t n, void* out, cudaStream_t stream) {
  dispatch(dt, [&]<typename T>() {
    swiglu_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(gate), static_cast<const T*>(up),
                                                              n, static_cast<T*>(out));
  });
}

void swiglu_backward(Dt dt, const void* dy, const void* gate, const void* up, int64_t n, void* dgate, void* dup,
                     cudaStream_t stream) {
  dispatch(dt, [&]<typename T>() {
    swiglu_backward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
        static_cast<const T*>(dy), static_cast<const T*>(gate), static_cast<const T*>(up), n, static_cast<T*>(dgate),
        static_cast<T*>(dup));
  });
}

void count_valid(const int32_t* labels, int64_t n, int32_t ignore_index, float* out, cudaStream_t stream) {
  count_valid_kernel<<<1, 1024, 0, stream>>>(labels, n, ignore_index, out);
}

void permute(const void* x, const int64_t* shape, const int64_t* perm, int rank, int64_t esize, void* y,
             cudaStream_t stream) {
  PermuteArgs p{};
  p.rank = rank;
  int64_t stride[kMaxRank], n = 1;
  for (int d = rank - 1; d >= 0; --d) {
    stride[d] = n;
    n *= shape[d];
  }
  for (int i = 0; i < rank; ++i) {
    p.out_shape[i] = shape[perm[i]];
    p.in_stride[i] = stride[perm[i]];
  }
  if (n == 0) return;
  by_esize(esize, [&]<typename E>() {
    permute_kernel<E><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const E*>(x), p, n, static_cast<E*>(y));
  });
}

void copy_slab(const void* x, int64_t outer, int64_t x_dim, int64_t x_off, int64_t inner, int64_t count, void* y,
               int64_t y_dim, int64_t y_off, int64_t esize, cudaStream_t stream) {
  const int64_t n = outer * count * inner;
  if (n == 0) return;
  by_esize(esize, [&]<typename E>() {
    copy_slab_kernel<E><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const E*>(x), outer, x_dim, x_off, inner,
                                                                 count, static_cast<E*>(y), y_dim, y_off);
  });
}

void embedding_forward(Dt dt, const void* W, const int32_t* tokens, int64_t T, int64_t H, int64_t V, void* out,
                       int* error, cudaStream_t stream) {
  if (T * H == 0) return;
  dispatch(dt, [&]<typename Ty>() {
    embedding_kernel<Ty><<<blocks_for(T * H), kThreads, 0, stream>>>(static_cast<const Ty*>(W), tokens, T, H, V,
                                                                      static_cast<Ty*>(out), error);
  });
}

void embedding_backward(Dt dt, const void* dy, const int32_t* tokens, int64_t T, int64_t H, int64_t V, void* dW,
                        float* acc, int* error, cudaStream_t stream) {
  cudaMemsetAsync(acc, 0, sizeof(float) * V * H, stream);
  dispatch(dt, [&]<typename Ty>() {
    if (T * H > 0)
      embedding_backward_kernel<Ty><<<blocks_for(T * H), kThreads, 0, stream>>>(static_cast<const Ty*>(dy), tokens,
                                                                                 T, H, V, acc, error);
  });
  if (static_cast<void*>(acc) != dW) convert(Dt::f32, dt, acc, V * H, dW, stream);
}

void rms_norm_forward(Dt dt, const void* x, const void* w, int64_t T, int64_t H, float eps, void* y, float* rstd,
                      cudaStream_t stream) {
  if (T == 0) return;
  dispatch(dt, [&]<typename Ty>() {
    rms_norm_kernel<Ty><<<static_cast<unsigned>(T), kThreads, 0, stream>>>(
        static_cast<const Ty*>(x), static_cast<const Ty*>(w), H, eps, static_cast<Ty*>(y), rstd);
  });
}

void rms_norm_backward(Dt dt, const void* dy, const void* x, const void* w, const float* rstd, int64_t T, int64_t H,
                       void* dx, void* dw, float* acc, cudaStream_t stream) {
  cudaMemsetAsync(acc, 0, sizeof(float) * H, stream);
  dispatch(dt, [&]<typename Ty>() {
    if (T == 0) return;
    // dw first: dx may not alias dy or x (rms_norm_backward is not in place), but keep the
    // reads of the operands before any write all the same.
    const dim3 grid(static_cast<unsigned>((H + kThreads - 1) / kThreads),
                    static_cast<unsigned>(T < kRmsNormStripes ? T : kRmsNormStripes));
    rms_norm_dw_kernel<Ty><<<grid, kThreads, 0, stream>>>(static_cast<const Ty*>(dy), static_cast<const Ty*>(x),
                                                           rstd, T, H, acc);
    rms_norm_dx_kernel<Ty><<<static_cast<unsigned>(T), kThreads, 0, stream>>>(
        static_cast<const Ty*>(dy), static_cast<const Ty*>(x), static_cast<const Ty*>(w), rstd, H,
        static_cast<Ty*>(dx));
  });
  if (static_cast<void*>(acc) != dw) convert(Dt::f32, dt, acc, H, dw, stream);
}

void layer_norm_forward(Dt dt, const void* x, const void* w, const void* b, int64_t T, int64_t H, float eps,
                        void* y, float* mean, float* rstd, cudaStream_t stream) {
  if (T == 0) return;
  dispatch(dt, [&]<typename Ty>() {
    layer_norm_kernel<Ty><<<static_cast<unsigned>(T), kThreads, 0, stream>>>(
        static_cast<const Ty*>(x), static_cast<const Ty*>(w), static_cast<const Ty*>(b), H, eps,
        static_cast<Ty*>(y), mean, rstd);
  });
}

void layer_norm_backward(Dt dt, const void* dy, const void* x, const void* w, const float* mean,
                         const float* rstd, int64_t T, int64_t H, void* dx, void* dw, void* db,
                         cudaStream_t stream) {
  if (H == 0) return;
  dispatch(dt, [&]<typename Ty>() {
    layer_norm_dwdb_kernel<Ty><<<static_cast<unsigned>((H + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        static_cast<const Ty*>(dy), static_cast<const Ty*>(x), mean, rstd, T, H, static_cast<Ty*>(dw),
        static_cast<Ty*>(db));
    if (T == 0) return;
    layer_norm_dx_kernel<Ty><<<static_cast<unsigned>(T), kThreads, 0, stream>>>(
        static_cast<const Ty*>(dy), static_cast<const Ty*>(x), static_cast<const Ty*>(w), mean, rstd, H,
        static_cast<Ty*>(dx));
  });
}

void gelu_forward(Dt dt, const void* x, int64_t n, bool tanh, void* y, cudaStream_t stream) {
  if (n == 0) return;
  dispatch(dt, [&]<typename T>() {
    gelu_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(x), n, tanh, static_cast<T*>(y));
  });
}

void gelu_backward(Dt dt, const void* dy, const void* x, int64_t n, bool tanh, void* dx, cudaStream_t stream) {
  if (n == 0) return;
  dispatch(dt, [&]<typename T>() {
    gelu_backward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(dy),
                                                                     static_cast<const T*>(x), n, tanh,
                                                                     static_cast<T*>(dx));
  });
}

void xielu_forward(Dt dt, const void* x, int64_t n, const void* alpha_p, const void* alpha_n, float beta, float eps,
                   void* y, cudaStream_t stream) {
  if (n == 0) return;
  dispatch(dt, [&]<typename T>() {
    xielu_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(x), n, static_cast<const T*>(alpha_p),
                                                             static_cast<const T*>(alpha_n), beta, eps,
                                                             static_cast<T*>(y));
  });
}

void xielu_backward(Dt dt, const void* dy, const void* x, int64_t n, const void* alpha_p, const void* alpha_n,
                    float beta, float eps, void* dx, void* dalpha_p, void* dalpha_n, cudaStream_t stream) {
  dispatch(dt, [&]<typename T>() {
    // The sums first: dx may be dy or x.
    xielu_dalpha_kernel<T><<<1, 1024, 0, stream>>>(static_cast<const T*>(dy), static_cast<const T*>(x), n,
                                                    static_cast<const T*>(alpha_p), static_cast<const T*>(alpha_n), eps,
                                                    static_cast<T*>(dalpha_p), static_cast<T*>(dalpha_n));
    if (n == 0) return;
    xielu_dx_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), n, static_cast<const T*>(alpha_p),
        static_cast<const T*>(alpha_n), beta, eps, static_cast<T*>(dx));
  });
}

void rope_forward(Dt dt, const void* x, const int32_t* pos, const double* inv_freq, int64_t T, int64_t NH, int64_t D,
                  bool inverse, void* y, cudaStream_t stream, bool interleaved) {
  const int64_t n = T * NH * (D / 2);
  if (n == 0) return;
  InvFreq f{};
  for (int64_t i = 0; i < D / 2 && i < kRopeMaxD / 2; ++i) f.v[i] = inv_freq[i];
  dispatch(dt, [&]<typename Ty>() {
    rope_kernel<Ty><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const Ty*>(x), pos, f, T, NH, D,
                                                             inverse, interleaved, static_cast<Ty*>(y));
  });
}

void cross_entropy_rows(Dt logits_dt, const void* logits, const int32_t* labels, int64_t T, int64_t V,
                        int32_t ignore_index, float* lse, float* row_loss, int* error, cudaStream_t stream,
                        float softcap) {
  if (T == 0) return;
  dispatch(logits_dt, [&]<typename Ty>() {
    cross_entropy_rows_kernel<Ty><<<static_cast<unsigned>(T), kThreads, 0, stream>>>(
        static_cast<const Ty*>(logits), labels, V, ignore_index, lse, row_loss, error, softcap);
  });
}

void sum_rows(const float* row_loss, int64_t T, float* loss_sum, cudaStream_t stream) {
  sum_rows_kernel<<<1, 1024, 0, stream>>>(row_loss, T, loss_sum);
}

void cross_entropy_backward_rows(Dt logits_dt, const void* logits, const int32_t* labels, const float* lse,
                                 const float* dloss, int64_t T, int64_t V, int32_t ignore_index, Dt out_dt,
                                 void* dlogits, cudaStream_t stream, float softcap) {
  const int64_t n = T * V;
  if (n == 0) return;
  dispatch(logits_dt, [&]<typename In>() {
    dispatch(out_dt, [&]<typename Out>() {
      cross_entropy_backward_kernel<In, Out><<<blocks_for(n), kThreads, 0, stream>>>(
          static_cast<const In*>(logits), labels, lse, dloss, T, V, ignore_index, static_cast<Out*>(dlogits), softcap);
    });
  });
}

void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n, const AdamWScalars& s,
                void* compute_copy_bf16, cudaStream_t stream) {
  if (n == 0) return;
  adamw_kernel<<<blocks_for(n), kThreads, 0, stream>>>(param, grad, exp_avg, exp_avg_sq, n, s,
                                                       static_cast<bf16*>(compute_copy_bf16));
}

void accumulate_grad(Dt dt, const void* g, int64_t n, float* acc, bool overwrite, cudaStream_t stream) {
  if (n == 0) return;
  dispatch(dt, [&]<typename T>() {
    accumulate_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(g), n, acc, overwrite);
  });
}

}  // namespace autosp::cuda
