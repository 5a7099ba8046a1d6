// What the cuda backend's GPU tests share (cuda_ops_test.cpp, cudnn_attention_test.cpp): the
// visible skip without a GPU, the tolerances and why, bf16 conversions, device buffers, and the
// attention's double reference with the runner of its cuda implementations (the reference
// kernels and the blocks).
#pragma once
#include <cuda_runtime.h>  // cudaMalloc(T**)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/basic.h"
#include "kernels/cuda/kernels.h"
#include "runtime/cuda_blas.h"
#include "ops/cuda_attention.h"
#include "ops/cuda_kernels.h"
#include "runtime/cuda_executor.h"
#include "testing/gradcheck.h"  // random_normal
#include "cuda/skip_without_gpu.h"

namespace autosp::testing {

// Skips the test, visibly, where there is no GPU.

// ---- tolerances --------------------------------------------------------------------------
// f32 on cuda vs f32 on the CPU: the same maths in another summation order (cuBLAS's
// blocking, one-block tree reductions, fp32 atomics in the scatter-adds) and expf/logf of
// the CUDA math library (<= 2 ulp) against the CPU's: a few ulp per element of a sum of up
// to ~100 terms here, i.e. ~1e-6 relative; 2e-5 leaves 20x, and a wrong kernel is off by
// O(1).
constexpr double kF32Tol = 2e-5;
// bf16 on cuda vs f32 on the CPU from the same (bf16-rounded) inputs: the kernels compute in
// fp32 and round each result once to bf16 (8 significant bits: |error| <= 2^-9 of the
// element, <= 2^-9 = 2e-3 of the tensor's largest), and the composite graphs (forward ->
// backward) round their intermediate results too (out and lse feed attention_backward,
// dz feeds linear_cross_entropy_backward's gemms): two or three roundings compound to about
// 6e-3. 1.5e-2 leaves 2x; a wrong kernel is off by O(1).
constexpr double kBf16Tol = 1.5e-2;

inline std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> y(x.size());
  cpu::f32_to_bf16(x.data(), static_cast<int64_t>(x.size()), y.data());
  return y;
}
inline std::vector<float> from_bf16(const uint16_t* x, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  cpu::bf16_to_f32(x, n, y.data());
  return y;
}
inline std::vector<float> round_bf16(const std::vector<float>& x) {
  auto b = to_bf16(x);
  return from_bf16(b.data(), static_cast<int64_t>(b.size()));
}

// visible(i, j) = (!causal || j <= i) && doc[i] == doc[j]; plain O(S^2) in double.
struct AttnRef {
  std::vector<double> out, lse, dq, dk, dv;
};
inline AttnRef attention_reference(const cuda::AttentionDims& d, bool causal, double scale, const std::vector<float>& q,
                            const std::vector<float>& k, const std::vector<float>& v, const std::vector<float>& dout,
                            const std::vector<int32_t>& doc, int64_t window = 0) {
  AttnRef r;
  r.out.assign(q.size(), 0);
  r.dq.assign(q.size(), 0);
  r.dk.assign(k.size(), 0);
  r.dv.assign(v.size(), 0);
  r.lse.assign(size_t(d.B * d.NH * d.S), 0);
  const int64_t G = d.NH / d.NKV;
  auto Q = [&](int64_t b, int64_t i, int64_t h) { return ((b * d.S + i) * d.NH + h) * d.D; };
  auto K = [&](int64_t b, int64_t j, int64_t g) { return ((b * d.S + j) * d.NKV + g) * d.D; };
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.NH; ++h)
      for (int64_t i = 0; i < d.S; ++i) {
        const int64_t g = h / G;
        std::vector<double> s(size_t(d.S), -INFINITY), p(size_t(d.S), 0);
        double m = -INFINITY;
        for (int64_t j = 0; j < d.S; ++j) {
          if ((causal && j > i) || (window > 0 && i - j >= window) || doc[size_t(b * d.S + j)] != doc[size_t(b * d.S + i)])
            continue;
          double dot = 0;
          for (int64_t e = 0; e < d.D; ++e) dot += double(q[size_t(Q(b, i, h) + e)]) * k[size_t(K(b, j, g) + e)];
          s[size_t(j)] = scale * dot;
          m = std::max(m, s[size_t(j)]);
        }
        double l = 0;
        for (int64_t j = 0; j < d.S; ++j) l += std::isinf(s[size_t(j)]) ? 0 : std::exp(s[size_t(j)] - m);
        const double lse = m + std::log(l);
        r.lse[size_t((b * d.NH + h) * d.S + i)] = lse;
        for (int64_t j = 0; j < d.S; ++j) p[size_t(j)] = std::isinf(s[size_t(j)]) ? 0 : std::exp(s[size_t(j)] - lse);
        for (int64_t j = 0; j < d.S; ++j)
          for (int64_t e = 0; e < d.D; ++e) r.out[size_t(Q(b, i, h) + e)] += p[size_t(j)] * v[size_t(K(b, j, g) + e)];
        double delta = 0;
        for (int64_t e = 0; e < d.D; ++e) delta += double(dout[size_t(Q(b, i, h) + e)]) * r.out[size_t(Q(b, i, h) + e)];
        for (int64_t j = 0; j < d.S; ++j) {
          if (p[size_t(j)] == 0) continue;
          double dp = 0;
          for (int64_t e = 0; e < d.D; ++e) dp += double(dout[size_t(Q(b, i, h) + e)]) * v[size_t(K(b, j, g) + e)];
          const double ds = p[size_t(j)] * (dp - delta);
          for (int64_t e = 0; e < d.D; ++e) {
            r.dq[size_t(Q(b, i, h) + e)] += scale * ds * k[size_t(K(b, j, g) + e)];
            r.dk[size_t(K(b, j, g) + e)] += scale * ds * q[size_t(Q(b, i, h) + e)];
            r.dv[size_t(K(b, j, g) + e)] += p[size_t(j)] * dout[size_t(Q(b, i, h) + e)];
          }
        }
      }
  return r;
}

template <typename T>
struct DeviceBuffer {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) { check_cuda(cudaMalloc(&p, sizeof(T) * (n ? n : 1)), "cudaMalloc", "test"); }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    check_cuda(cudaMemcpy(p, host.data(), sizeof(T) * n, cudaMemcpyHostToDevice), "cudaMemcpy", "test");
  }
  ~DeviceBuffer() { cudaFree(p); }
  std::vector<T> host() const {
    std::vector<T> h(n);
    check_cuda(cudaMemcpy(h.data(), p, sizeof(T) * n, cudaMemcpyDeviceToHost), "cudaMemcpy", "test");
    return h;
  }
};

inline std::vector<float> as_float(const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); }

// The attention implementations: the reference kernels (one thread per row), and the blocks
// of queries the ops run (cuBLAS scores), here with blocks of `rows` queries so that a
// sequence spans several blocks (and a causal block sees fewer keys than the sequence).
struct AttentionImpl {
  const char* name;
  int64_t rows;  // 0: the reference kernels
};
inline const AttentionImpl kAttentionImpls[] = {{"reference", 0}, {"blocks of 16", 16}, {"blocks of 64", 64}};

struct AttentionRun {
  AttentionImpl impl;
  cublasHandle_t cublas = nullptr;
  explicit AttentionRun(AttentionImpl i) : impl(i) { check_cublas(autosp::cublas().create(&cublas), "cublasCreate", "test"); }
  ~AttentionRun() { autosp::cublas().destroy(cublas); }
  // forward, then backward (delta: the reference's scratch); q ... dv of dtype dt, lse f32
  void run(const cuda::AttentionDims& d, bool causal, float scale, const void* q, const void* k, const void* v,
           const int32_t* doc, void* out, float* lse, const void* dout, void* dq, void* dk, void* dv,
           float* delta, int64_t window = 0, cuda::Dt dt = cuda::Dt::f32, float softcap = 0.0f,
           const cuda::AlibiSlopes& alibi = {}) const {
    if (impl.rows == 0) {
      cuda::attention_forward(dt, d, causal, window, scale, softcap, q, k, v, doc, out, lse, nullptr, alibi);
      cuda::attention_backward(dt, d, causal, window, scale, softcap, q, k, v, out, lse, dout, doc, dq, dk, dv, delta,
                               nullptr, alibi);
      return;
    }
    const CudaContext c{nullptr, cublas, nullptr};
    const int64_t elem = dt == cuda::Dt::bf16 ? 2 : 4;
    const int64_t bytes = std::max(
        cuda::attention_block_layout(false, d.B, d.S, d.NH, d.NKV, d.D, elem, impl.rows).bytes,
        cuda::attention_block_layout(true, d.B, d.S, d.NH, d.NKV, d.D, elem, impl.rows).bytes);
    DeviceBuffer<char> workspace(static_cast<size_t>(bytes));
    cuda_attention_forward_blocks(c, dt, d, causal, window, scale, softcap, q, k, v, doc, out, lse, workspace.p,
                                  impl.rows, alibi);
    cuda_attention_backward_blocks(c, dt, d, causal, window, scale, softcap, q, k, v, out, lse, dout, doc, dq, dk, dv,
                                   workspace.p, impl.rows, alibi);
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize", "attention blocks");
  }
};

}  // namespace autosp::testing
