#include "kernels/cpu/basic.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

namespace autosp::cpu {

void fill(float* y, int64_t n, float value) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = value;
}

void add(const float* a, const float* b, int64_t n, float* y) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void mul(const float* a, const float* b, int64_t n, float* y) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] * b[i];
}

void scale(const float* x, int64_t n, float alpha, float* y, float beta) {
  if (beta == 0.0f) {  // (not + 0: that would turn -0 into +0)
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = alpha * x[i];
    return;
  }
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = alpha * x[i] + beta;
}

void div_scalar(const float* x, int64_t n, float divisor, float* y) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / divisor;
}

void div(const float* a, const float* b, int64_t n, float* y) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] / b[i];
}

void relu_forward(const float* x, int64_t n, float* y) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void relu_backward(const float* dy, const float* x, int64_t n, float* dx) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

void clamp_forward(const float* x, int64_t n, float lo, float hi, float* y) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] < lo ? lo : (x[i] > hi ? hi : x[i]);
}

void clamp_backward(const float* dy, const float* x, int64_t n, float lo, float hi, float* dx) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dx[i] = x[i] >= lo && x[i] <= hi ? dy[i] : 0.0f;
}

void tanh_forward(const float* x, int64_t n, float* y) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
}

void tanh_backward(const float* dy, const float* y, int64_t n, float* dx) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
}

// Fixed chunks, summed in order: the result does not depend on the thread count.
constexpr int64_t kSumChunk = 1 << 14;

int64_t sum_scratch_doubles(int64_t n) { return std::max<int64_t>(1, (n + kSumChunk - 1) / kSumChunk); }

double sum(const float* x, int64_t n, double* scratch) {
  constexpr int64_t kChunk = kSumChunk;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> own;
  if (!scratch) own.resize(static_cast<size_t>(sum_scratch_doubles(n))), scratch = own.data();
  double* partial = scratch;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0;
    const int64_t end = std::min(n, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < end; ++i) s += x[i];
    partial[c] = s;
  }
  double total = 0;
  for (int64_t c = 0; c < chunks; ++c) total += partial[c];
  return total;
}

void vector_norm(const float* x, int64_t rows, int64_t n, float* y) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * n;
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += double(row[i]) * double(row[i]);
    y[r] = float(std::sqrt(s));
  }
}

void vector_norm_backward(const float* dy, const float* x, const float* y, int64_t rows, int64_t n, float* dx) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float g = y[r] > 0.0f ? dy[r] / y[r] : 0.0f;
    for (int64_t i = 0; i < n; ++i) dx[r * n + i] = g * x[r * n + i];
  }
}

namespace {
inline uint16_t round_to_bf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN
  // Adding 0x7fff rounds the dropped half up when it is above one half; the kept LSB adds
  // the last 1 on an exact half, so ties go to the even neighbour. A carry into the
  // exponent is the correct rounding (up to the next binade, or to inf).
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
}  // namespace

void f32_to_bf16(const float* __restrict x, int64_t n, uint16_t* __restrict y) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = round_to_bf16(x[i]);
}

void bf16_to_f32(const uint16_t* __restrict x, int64_t n, float* __restrict y) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = std::bit_cast<float>(static_cast<uint32_t>(x[i]) << 16);
}

void permute(const void* x, const int64_t* shape, const int64_t* perm, int rank, int64_t esize,
             void* y) {
  int64_t x_strides[8], y_shape[8], total = 1;
  int64_t stride = 1;
  for (int i = rank - 1; i >= 0; --i) {
    x_strides[i] = stride;
    stride *= shape[i];
  }
  for (int i = 0; i < rank; ++i) {
    y_shape[i] = shape[perm[i]];
    total *= y_shape[i];
  }
  // Copy runs of the innermost output dim; it is contiguous in x when perm keeps it last.
  const int64_t inner = rank ? y_shape[rank - 1] : 1;
  const int64_t inner_stride = rank ? x_strides[perm[rank - 1]] : 1;
  const int64_t rows = inner ? total / inner : 0;
  const auto* src = static_cast<const char*>(x);
  auto* dst = static_cast<char*>(y);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t rem = r, offset = 0;
    for (int i = rank - 2; i >= 0; --i) {
      offset += (rem % y_shape[i]) * x_strides[perm[i]];
      rem /= y_shape[i];
    }
    char* out = dst + r * inner * esize;
    if (inner_stride == 1) {
      std::memcpy(out, src + offset * esize, inner * esize);
    } else {
      for (int64_t j = 0; j < inner; ++j)
        std::memcpy(out + j * esize, src + (offset + j * inner_stride) * esize, esize);
    }
  }
}

void copy_slab(const float* x, int64_t outer, int64_t x_dim, int64_t x_off, int64_t inner,
               int64_t count, float* y, int64_t y_dim, int64_t y_off) {
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(y + (o * y_dim + y_off) * inner, x + (o * x_dim + x_off) * inner,
                count * inner * sizeof(float));
}

void concat_slabs(const float* const* xs, const int64_t* lens, int64_t n, int64_t outer, int64_t inner,
                  float* y) {
  int64_t y_dim = 0;
  for (int64_t i = 0; i < n; ++i) y_dim += lens[i];
  const int64_t total = outer * y_dim * inner;
  constexpr int64_t kMinParallel = int64_t{1} << 16;  // floats
#pragma omp parallel if (total >= kMinParallel)
  {
    // This thread's part of y, [lo, hi), walked piece by piece: piece (o, i) is operand i's
    // row o, contiguous in both x and y.
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t lo = total * t / threads, hi = total * (t + 1) / threads;
    int64_t at = 0;  // where the current piece starts in y
    for (int64_t o = 0; o < outer && at < hi; ++o) {
      for (int64_t i = 0; i < n && at < hi; ++i) {
        const int64_t len = lens[i] * inner;
        const int64_t b = std::max(lo, at), e = std::min(hi, at + len);
        if (b < e) std::memcpy(y + b, xs[i] + o * len + (b - at), (e - b) * sizeof(float));
        at += len;
      }
    }
  }
}

}  // namespace autosp::cpu
