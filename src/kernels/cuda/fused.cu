// The fused, vectorised row and elementwise kernels (fused.h). Each is templated on the
// element type T and the elements per access N: N = 16 / sizeof(T) (one 16-byte access) when
// vector_width allows it, N = 1 otherwise (the same code, element by element).
#include <cstring>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fused.h"

namespace autosp::cuda {

namespace {

// N elements of T as one access of N * sizeof(T) bytes (16, 8, 4 or 2).
template <typename T, int N>
using Raw = std::conditional_t<N * sizeof(T) == 16, uint4,
            std::conditional_t<N * sizeof(T) == 8, uint2, std::conditional_t<N * sizeof(T) == 4, uint32_t, uint16_t>>>;

template <typename T, int N>
__device__ __forceinline__ Raw<T, N> load_raw(const T* p) {
  static_assert(sizeof(Raw<T, N>) == N * sizeof(T), "an access is 2, 4, 8 or 16 bytes");
  return *reinterpret_cast<const Raw<T, N>*>(p);
}

template <typename T, int N>
__device__ __forceinline__ void unpack(const Raw<T, N>& raw, float (&f)[N]) {
  T v[N];
  memcpy(v, &raw, sizeof raw);
#pragma unroll
  for (int e = 0; e < N; ++e) f[e] = to_f(v[e]);
}

template <typename T, int N>
__device__ __forceinline__ void load(const T* p, float (&f)[N]) {
  unpack<T, N>(load_raw<T, N>(p), f);
}

template <typename T, int N>
__device__ __forceinline__ void store(T* p, const float (&f)[N]) {
  T v[N];
#pragma unroll
  for (int e = 0; e < N; ++e) v[e] = from_f<T>(f[e]);
  Raw<T, N> raw;
  memcpy(&raw, v, sizeof raw);
  *reinterpret_cast<Raw<T, N>*>(p) = raw;
}

// Calls f.template operator()<N>() with N = the vector width (16 / sizeof(T)) or 1.
template <typename T, typename F>
void with_width(int64_t width, F&& f) {
  constexpr int kVec = int(kVectorBytes / sizeof(T));
  if (width == kVec) f.template operator()<kVec>();
  else f.template operator()<1>();
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Vectors a thread keeps in registers between a row's two passes (the reduction, then the
// write), as loaded (bf16 stays packed: half the registers of fp32): kCache * blockDim
// vectors, i.e. H up to 8192 bf16 or 4096 f32 at 256 threads. The vectors of a longer row are
// read again in the second pass (from L1/L2: the row was just read).
constexpr int kCache = 4;
// The backward caches dy and x: two vectors per thread each (H up to 4096 bf16 at 256
// threads) keep it at 64 registers or fewer (ptxas, sm_90): four blocks of 256 per SM.
constexpr int kCacheBackward = 2;

// ---- rms_norm ---------------------------------------------------------------------------------

template <typename T, int N>
__global__ void __launch_bounds__(kRowThreads) rms_norm_fused_kernel(const T* x, const T* w, int64_t H, float eps,
                                                                     T* y, float* rstd) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x, vecs = H / N;
  const T* xr = x + row * H;
  T* yr = y + row * H;
  Raw<T, N> cache[kCache];
  float ss = 0;
#pragma unroll
  for (int j = 0; j < kCache; ++j) {
    const int64_t k = threadIdx.x + int64_t(j) * blockDim.x;
    if (k < vecs) {
      float v[N];
      cache[j] = load_raw<T, N>(xr + k * N);
      unpack<T, N>(cache[j], v);
#pragma unroll
      for (int e = 0; e < N; ++e) ss += v[e] * v[e];
    }
  }
  for (int64_t k = threadIdx.x + int64_t(kCache) * blockDim.x; k < vecs; k += blockDim.x) {
    float v[N];
    load<T, N>(xr + k * N, v);
#pragma unroll
    for (int e = 0; e < N; ++e) ss += v[e] * v[e];
  }
  ss = block_sum(ss, shared);
  const float r = 1.0f / sqrtf(ss / float(H) + eps);  // the reference's expression
  auto write = [&](int64_t k, const float (&v)[N]) {
    float wv[N], o[N];
    load<T, N>(w + k * N, wv);
#pragma unroll
    for (int e = 0; e < N; ++e) o[e] = v[e] * r * wv[e];
    store<T, N>(yr + k * N, o);
  };
#pragma unroll
  for (int j = 0; j < kCache; ++j) {
    const int64_t k = threadIdx.x + int64_t(j) * blockDim.x;
    if (k < vecs) {
      float v[N];
      unpack<T, N>(cache[j], v);
      write(k, v);
    }
  }
  for (int64_t k = threadIdx.x + int64_t(kCache) * blockDim.x; k < vecs; k += blockDim.x) {
    float v[N];
    load<T, N>(xr + k * N, v);
    write(k, v);
  }
  if (threadIdx.x == 0) rstd[row] = r;
}

// Block b takes rows b, b + gridDim.x, ...: per row, dot = sum dy w xhat (a block sum), then
// dx = rstd (dy w - xhat dot / H), and the thread that owns column h adds dy xhat into acc[h]
// (shared memory when H fits, else the block's own row of `partial`). Each column has one
// owner thread in the whole block, so acc needs neither atomics nor barriers; the block's
// row of partial sums is written once at the end.
template <typename T, int N>
__global__ void __launch_bounds__(kRowThreads)
    rms_norm_backward_fused_kernel(const T* dy, const T* x, const T* w, const float* rstd, int64_t T_, int64_t H,
                                   T* dx, float* partial, bool shared_acc) {
  extern __shared__ float shared_sums[];  // H floats when shared_acc
  __shared__ float reduce[32];
  const int64_t vecs = H / N;
  float* const out = partial + int64_t(blockIdx.x) * H;
  float* const acc = shared_acc ? shared_sums : out;
  for (int64_t k = threadIdx.x; k < vecs; k += blockDim.x)
#pragma unroll
    for (int e = 0; e < N; ++e) acc[k * N + e] = 0.0f;

  for (int64_t t = blockIdx.x; t < T_; t += gridDim.x) {
    const float r = rstd[t];
    const T* dyr = dy + t * H;
    const T* xr = x + t * H;
    Raw<T, N> cdy[kCacheBackward], cx[kCacheBackward];
    float dot = 0;
    auto add_dot = [&](const float (&g)[N], const float (&v)[N], const float (&wv)[N]) {
#pragma unroll
      for (int e = 0; e < N; ++e) dot += g[e] * wv[e] * v[e] * r;  // the reference's order
    };
#pragma unroll
    for (int j = 0; j < kCacheBackward; ++j) {
      const int64_t k = threadIdx.x + int64_t(j) * blockDim.x;
      if (k < vecs) {
        float g[N], v[N], wv[N];
        cdy[j] = load_raw<T, N>(dyr + k * N);
        cx[j] = load_raw<T, N>(xr + k * N);
        unpack<T, N>(cdy[j], g);
        unpack<T, N>(cx[j], v);
        load<T, N>(w + k * N, wv);
        add_dot(g, v, wv);
      }
    }
    for (int64_t k = threadIdx.x + int64_t(kCacheBackward) * blockDim.x; k < vecs; k += blockDim.x) {
      float g[N], v[N], wv[N];
      load<T, N>(dyr + k * N, g);
      load<T, N>(xr + k * N, v);
      load<T, N>(w + k * N, wv);
      add_dot(g, v, wv);
    }
    const float mean = block_sum(dot, reduce) / float(H);
    auto write = [&](int64_t k, const float (&g)[N], const float (&v)[N]) {
      float wv[N], o[N];
      load<T, N>(w + k * N, wv);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const float xhat = v[e] * r;
        o[e] = r * (g[e] * wv[e] - xhat * mean);
        acc[k * N + e] += g[e] * v[e] * r;  // dw's term, in the reference's order (dy x rstd)
      }
      store<T, N>(dx + t * H + k * N, o);
    };
#pragma unroll
    for (int j = 0; j < kCacheBackward; ++j) {
      const int64_t k = threadIdx.x + int64_t(j) * blockDim.x;
      if (k < vecs) {
        float g[N], v[N];
        unpack<T, N>(cdy[j], g);
        unpack<T, N>(cx[j], v);
        write(k, g, v);
      }
    }
    for (int64_t k = threadIdx.x + int64_t(kCacheBackward) * blockDim.x; k < vecs; k += blockDim.x) {
      float g[N], v[N];
      load<T, N>(dyr + k * N, g);
      load<T, N>(xr + k * N, v);
      write(k, g, v);
    }
  }
  if (shared_acc)
    for (int64_t k = threadIdx.x; k < vecs; k += blockDim.x)
#pragma unroll
      for (int e = 0; e < N; ++e) out[k * N + e] = acc[k * N + e];
}

// dw[h] = sum over b = 0 .. G-1 of partial[b, h], in that order; one thread per column.
template <typename T>
__global__ void rms_norm_dw_kernel(const float* partial, int64_t G, int64_t H, T* dw) {
  AUTOSP_GRID_STRIDE(h, H) {
    float s = 0;
    for (int64_t b = 0; b < G; ++b) s += partial[b * H + h];
    dw[h] = from_f<T>(s);
  }
}

// ---- rope -------------------------------------------------------------------------------------

struct InvFreq {
  double v[kRopeMaxD / 2];
};

// One block per token: its D/2 angles in double and their cos and sin (the reference's
// expressions, so the same floats), once for all NH heads; then each thread rotates N pairs
// (x[i .. i+N), x[i+D/2 .. i+D/2+N)) of one head, or interleaved the N pairs in x[2i .. 2i+2N).
template <typename T, int N>
__global__ void __launch_bounds__(kRowThreads) rope_fused_kernel(const T* x, const int32_t* pos, InvFreq inv_freq,
                                                                 int64_t NH, int64_t D, bool inverse, bool interleaved,
                                                                 T* y) {
  __shared__ float cs[kRopeMaxD / 2], sn[kRopeMaxD / 2];
  const int64_t t = blockIdx.x, half = D / 2;
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const double angle = double(pos[t]) * inv_freq.v[i];
    cs[i] = float(cos(angle));
    sn[i] = inverse ? -float(sin(angle)) : float(sin(angle));
  }
  __syncthreads();
  const int64_t per_head = half / N;
  for (int64_t item = threadIdx.x; item < NH * per_head; item += blockDim.x) {
    const int64_t head = item / per_head, i0 = (item % per_head) * N;
    if (interleaved) {  // 2N elements from 2 i0: D a multiple of 2N, so both vectors are aligned
      const int64_t base = (t * NH + head) * D + 2 * i0;
      float u0[N], u1[N], o0[N], o1[N];  // elements [0, N) and [N, 2N) of the 2N
      load<T, N>(x + base, u0);
      load<T, N>(x + base + N, u1);
#pragma unroll
      for (int e = 0; e < N; ++e) {  // pair e: elements 2e and 2e + 1 (the branches are compile-time)
        const int k = 2 * e;
        const float c = cs[i0 + e], s = sn[i0 + e];
        const float a = k < N ? u0[k] : u1[k - N], b = k + 1 < N ? u0[k + 1] : u1[k + 1 - N];
        (k < N ? o0[k] : o1[k - N]) = a * c - b * s;
        (k + 1 < N ? o0[k + 1] : o1[k + 1 - N]) = b * c + a * s;
      }
      store<T, N>(y + base, o0);
      store<T, N>(y + base + N, o1);
      continue;
    }
    const int64_t base = (t * NH + head) * D + i0;
    float a[N], b[N], lo[N], hi[N];
    load<T, N>(x + base, a);
    load<T, N>(x + base + half, b);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const float c = cs[i0 + e], s = sn[i0 + e];
      lo[e] = a[e] * c - b[e] * s;
      hi[e] = b[e] * c + a[e] * s;
    }
    store<T, N>(y + base, lo);
    store<T, N>(y + base + half, hi);
  }
}

// ---- swiglu -----------------------------------------------------------------------------------

// Vectors k = 0 .. n/N - 1 grid-stride, then the last n % N elements one per thread.
template <typename T, int N>
__global__ void swiglu_fused_kernel(const T* gate, const T* up, int64_t n, T* out) {
  const int64_t vecs = n / N;
  AUTOSP_GRID_STRIDE(k, vecs) {
    float g[N], u[N], o[N];
    load<T, N>(gate + k * N, g);
    load<T, N>(up + k * N, u);
#pragma unroll
    for (int e = 0; e < N; ++e) o[e] = g[e] * sigmoid(g[e]) * u[e];
    store<T, N>(out + k * N, o);
  }
  const int64_t i = vecs * N + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const float g = to_f(gate[i]);
    out[i] = from_f<T>(g * sigmoid(g) * to_f(up[i]));
  }
}

// dgate = dy up silu'(gate), dup = dy silu(gate): a thread reads its elements of dy, gate and
// up before it writes either result (they may alias).
template <typename T, int N>
__global__ void swiglu_backward_fused_kernel(const T* dy, const T* gate, const T* up, int64_t n, T* dgate, T* dup) {
  auto one = [](float d, float g, float u, float& dg, float& du) {
    const float s = sigmoid(g);
    dg = d * u * s * (1.0f + g * (1.0f - s));
    du = d * g * s;
  };
  const int64_t vecs = n / N;
  AUTOSP_GRID_STRIDE(k, vecs) {
    float d[N], g[N], u[N], dg[N], du[N];
    load<T, N>(dy + k * N, d);
    load<T, N>(gate + k * N, g);
    load<T, N>(up + k * N, u);
#pragma unroll
    for (int e = 0; e < N; ++e) one(d[e], g[e], u[e], dg[e], du[e]);
    store<T, N>(dgate + k * N, dg);
    store<T, N>(dup + k * N, du);
  }
  const int64_t i = vecs * N + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    float dg, du;
    one(to_f(dy[i]), to_f(gate[i]), to_f(up[i]), dg, du);
    dgate[i] = from_f<T>(dg);
    dup[i] = from_f<T>(du);
  }
}

// ---- embedding --------------------------------------------------------------------------------

// One block per token: its table row copied as raw units U (16 bytes, or one element).
template <typename U>
__global__ void __launch_bounds__(kRowThreads) embedding_fused_kernel(const U* W, const int32_t* tokens, int64_t units,
                                                                      int64_t V, U* out, int* error) {
  const int64_t t = blockIdx.x;
  const int32_t id = tokens[t];
  const bool bad = id < 0 || id >= V;
  if (bad && threadIdx.x == 0) set_error(error, kErrorTokenId);
  const U* src = W + int64_t(bad ? 0 : id) * units;
  U* dst = out + t * units;
  for (int64_t k = threadIdx.x; k < units; k += blockDim.x) {
    if (bad) {
      U zero;
      memset(&zero, 0, sizeof zero);  // +0.0 in both dtypes
      dst[k] = zero;
    } else {
      dst[k] = src[k];
    }
  }
}

// Deterministic: block (b, c) owns acc's rows [b R, (b + 1) R), columns [c kRowThreads,
// (c + 1) kRowThreads), and alone writes them, adding the dy of every token whose id falls there
// in token order (no atomics), so dW is the same bits on every run, which a save resumed on the
// device needs to match the run that never stopped. The column tiles spread a frequent id's
// work (low ids of byte-level vocabularies: spaces, punctuation) over H / 256 blocks. Each
// block reads every token id (in chunks through shared memory: T x blocks reads of 4 bytes
// from L2) and its columns of its own tokens' dy rows once; a thread keeps its column, so a
// row's repeated tokens add in order within one thread. Block (0, 0) reports ids outside
// [0, V); they are skipped.
constexpr int kEmbeddingIdChunk = 1024;
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    embedding_backward_owned_kernel(const T* dy, const int32_t* tokens, int64_t Tn, int64_t H, int64_t V,
                                    int64_t rows, float* acc, int* error) {
  __shared__ int32_t ids[kEmbeddingIdChunk];
  const int64_t lo = int64_t(blockIdx.x) * rows, hi = lo + rows < V ? lo + rows : V;
  for (int64_t base = 0; base < Tn; base += kEmbeddingIdChunk) {
    const int n = int(Tn - base < kEmbeddingIdChunk ? Tn - base : kEmbeddingIdChunk);
    __syncthreads();  // the last chunk's ids have been read
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int32_t id = tokens[base + i];
      ids[i] = id;
      if (blockIdx.x == 0 && blockIdx.y == 0 && (id < 0 || id >= V)) set_error(error, kErrorTokenId);
    }
    __syncthreads();
    for (int i = 0; i < n; ++i) {
      const int64_t id = ids[i];
      if (id < lo || id >= hi) continue;  // uniform over the block
      const int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
      if (c < H) acc[id * H + c] += to_f(dy[(base + i) * H + c]);
    }
  }
}

// y (bf16) = x (f32) rounded, vectorised as swiglu (N = 8: two 16-byte reads, one write).
template <int N>
__global__ void round_to_bf16_kernel(const float* x, int64_t n, bf16* y) {
  const int64_t vecs = n / N;
  AUTOSP_GRID_STRIDE(k, vecs) {
    float v[N];
    if constexpr (N == 8) {
      load<float, 4>(x + k * 8, *reinterpret_cast<float(*)[4]>(v));
      load<float, 4>(x + k * 8 + 4, *reinterpret_cast<float(*)[4]>(v + 4));
    } else {
      v[0] = x[k];
    }
    store<bf16, N>(y + k * N, v);
  }
  const int64_t i = vecs * N + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = from_f<bf16>(x[i]);
}

}  // namespace

void rms_norm_forward_fused(Dt dt, const void* x, const void* w, int64_t T, int64_t H, float eps, void* y,
                            float* rstd, cudaStream_t stream) {
  if (T == 0 || H == 0) return;
  dispatch(dt, [&]<typename Ty>() {
    with_width<Ty>(vector_width(sizeof(Ty), H, {x, w, y}), [&]<int N>() {
      rms_norm_fused_kernel<Ty, N><<<static_cast<unsigned>(T), row_threads(H / N), 0, stream>>>(
          static_cast<const Ty*>(x), static_cast<const Ty*>(w), H, eps, static_cast<Ty*>(y), rstd);
    });
  });
}

void rms_norm_backward_fused(Dt dt, const void* dy, const void* x, const void* w, const float* rstd, int64_t T,
                             int64_t H, void* dx, void* dw, float* partial, cudaStream_t stream) {
  if (H == 0) return;
  const int64_t G = rms_norm_backward_blocks(T);
  dispatch(dt, [&]<typename Ty>() {
    if (G > 0) {
      with_width<Ty>(vector_width(sizeof(Ty), H, {dy, x, w, dx}), [&]<int N>() {
        const bool shared_acc = H <= kRmsNormSharedMaxH;
        rms_norm_backward_fused_kernel<Ty, N>
            <<<static_cast<unsigned>(G), row_threads(H / N), shared_acc ? size_t(4 * H) : 0, stream>>>(
                static_cast<const Ty*>(dy), static_cast<const Ty*>(x), static_cast<const Ty*>(w), rstd, T, H,
                static_cast<Ty*>(dx), partial, shared_acc);
      });
    }
    rms_norm_dw_kernel<Ty><<<blocks_for(H), kThreads, 0, stream>>>(partial, G, H, static_cast<Ty*>(dw));
  });
}

void rope_forward_fused(Dt dt, const void* x, const int32_t* pos, const double* inv_freq, int64_t T, int64_t NH,
                        int64_t D, bool inverse, void* y, cudaStream_t stream, bool interleaved) {
  if (T * NH * (D / 2) == 0) return;
  InvFreq f{};
  for (int64_t i = 0; i < D / 2 && i < kRopeMaxD / 2; ++i) f.v[i] = inv_freq[i];
  dispatch(dt, [&]<typename Ty>() {
    // Vectors within each half of a head: D / 2 a whole number of them.
    with_width<Ty>(vector_width(sizeof(Ty), D / 2, {x, y}), [&]<int N>() {
      rope_fused_kernel<Ty, N><<<static_cast<unsigned>(T), row_threads(NH * (D / 2) / N), 0, stream>>>(
          static_cast<const Ty*>(x), pos, f, NH, D, inverse, interleaved, static_cast<Ty*>(y));
    });
  });
}

void swiglu_forward_fused(Dt dt, const void* gate, const void* up, int64_t n, void* out, cudaStream_t stream) {
  if (n == 0) return;
  dispatch(dt, [&]<typename Ty>() {
    with_width<Ty>(flat_vector_width(sizeof(Ty), {gate, up, out}), [&]<int N>() {
      swiglu_fused_kernel<Ty, N><<<blocks_for(n / N), kThreads, 0, stream>>>(
          static_cast<const Ty*>(gate), static_cast<const Ty*>(up), n, static_cast<Ty*>(out));
    });
  });
}

void swiglu_backward_fused(Dt dt, const void* dy, const void* gate, const void* up, int64_t n, void* dgate, void* dup,
                           cudaStream_t stream) {
  if (n == 0) return;
  dispatch(dt, [&]<typename Ty>() {
    with_width<Ty>(flat_vector_width(sizeof(Ty), {dy, gate, up, dgate, dup}), [&]<int N>() {
      swiglu_backward_fused_kernel<Ty, N><<<blocks_for(n / N), kThreads, 0, stream>>>(
          static_cast<const Ty*>(dy), static_cast<const Ty*>(gate), static_cast<const Ty*>(up), n,
          static_cast<Ty*>(dgate), static_cast<Ty*>(dup));
    });
  });
}

void embedding_forward_fused(Dt dt, const void* W, const int32_t* tokens, int64_t T, int64_t H, int64_t V, void* out,
                             int* error, cudaStream_t stream) {
  if (T * H == 0) return;
  const int64_t elem = dt_size(dt);
  auto launch = [&]<typename U>() {
    const int64_t units = H * elem / int64_t(sizeof(U));
    embedding_fused_kernel<U><<<static_cast<unsigned>(T), row_threads(units), 0, stream>>>(
        static_cast<const U*>(W), tokens, units, V, static_cast<U*>(out), error);
  };
  if (vector_width(elem, H, {W, out}) > 1) launch.template operator()<uint4>();
  else if (dt == Dt::bf16) launch.template operator()<uint16_t>();
  else launch.template operator()<uint32_t>();
}

void embedding_backward_fused(Dt dt, const void* dy, const int32_t* tokens, int64_t T, int64_t H, int64_t V,
                              void* dW, float* acc, int* error, cudaStream_t stream) {
  cudaMemsetAsync(acc, 0, sizeof(float) * V * H, stream);
  dispatch(dt, [&]<typename Ty>() {
    if (T * H == 0 || V == 0) return;
    // About 1024 blocks (a few per SM), each owning `rows` rows of the table.
    const int64_t rows = (V + 1023) / 1024, blocks = (V + rows - 1) / rows;
    const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>((H + kRowThreads - 1) / kRowThreads));
    embedding_backward_owned_kernel<Ty><<<grid, kRowThreads, 0, stream>>>(
        static_cast<const Ty*>(dy), tokens, T, H, V, rows, acc, error);
  });
  if (static_cast<void*>(acc) == dW || V * H == 0) return;
  // dt is bf16 here (an f32 dW is its own acc; the op binds it so).
  if (dt == Dt::f32) {
    convert(Dt::f32, Dt::f32, acc, V * H, dW, stream);
    return;
  }
  const int64_t n = V * H;
  if (flat_vector_width(2, {acc, dW}) > 1)
    round_to_bf16_kernel<8><<<blocks_for(n / 8), kThreads, 0, stream>>>(acc, n, static_cast<bf16*>(dW));
  else
    round_to_bf16_kernel<1><<<blocks_for(n), kThreads, 0, stream>>>(acc, n, static_cast<bf16*>(dW));
}

}  // namespace autosp::cuda
