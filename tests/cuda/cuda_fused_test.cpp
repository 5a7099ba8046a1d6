// The fused row and elementwise kernels (kernels/cuda/fused.h) against the reference kernels
// (kernels.h) they replace in the ops, from the same device inputs, in f32 and bf16, on
// shapes that take every path: the 16-byte vector path (H = 4096, 40), a row that is not a
// whole number of a block's vectors (H = 2048 + 8), rows longer than the register cache (H =
// 10000), the scalar fallback (H = 1030, rope's D = 8 in bf16, an operand one element off a
// 16-byte boundary), flat tails (swiglu's n % 8 != 0), more rows than rms_norm_backward's
// blocks (T = 1100), dw sums past shared memory (H = 8200), in-place calls and bad token ids.
// (The op matrix, cuda_ops_test.cpp, holds the ops, which run these kernels, to the CPU.)
//
// Without a GPU every test is skipped with the reason. Each comparison prints one line
// "fused.<kernel>.<shape> <dtype> y<i> normalised error E (max U ulp)" that
// scripts/gpu_check.sh collects into docs/gpu_check.json.
//
// Tolerances. The fused kernels do the reference's fp32 arithmetic in the same expression
// order and round a bf16 result once, so:
//  - elementwise results (swiglu, rope, the embedding's copy) equal the reference's up to the
//    compiler contracting a product and a sum into an fma differently: at most 1 ulp, in
//    either dtype (checked per element, as ulps);
//  - results behind a reduction (rms_norm) see the same sum in another order: the sums of
//    H <= 10000 squares (or of T <= 1100 rows of dw) each carry about (terms per thread +
//    log2(threads)) ~ 50 roundings of 2^-24 either way, so f32 results differ by ~1e-6
//    relative at most: kF32Tol = 1e-5 leaves 10x; a bf16 result rounds the two nearly equal
//    fp32 values to the same bf16 or to neighbours: at most one ulp of the tensor's largest
//    element, 2^-7 = 7.8e-3 of it: kBf16Tol = 1e-2. A wrong kernel is off by O(1).
//  - rms_norm's y (a product of per-element values and one rstd) stays within 1 bf16 ulp
//    per element; dx (r (dy w - xhat mean), a difference that can cancel) is held to the
//    normalised bound only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/basic.h"
#include "kernels/cpu/fused.h"
#include "kernels/cuda/fused.h"
#include "kernels/cuda/kernels.h"
#include "ops/cuda_kernels.h"
#include "runtime/cuda_executor.h"
#include "testing/compare.h"
#include "util/error.h"
#include "cuda/skip_without_gpu.h"

namespace autosp {
namespace {

using cuda::Dt;
using testing::normalised_error;

constexpr double kF32Tol = 1e-5;
constexpr double kBf16Tol = 1e-2;
constexpr int64_t kMaxUlps = 1;

const char* dt_name(Dt dt) { return dt == Dt::f32 ? "f32" : "bf16"; }

std::vector<float> random_normal(int64_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// n elements of dtype dt on the device, `offset` elements into their allocation (offset 1:
// one element off a 16-byte boundary, which sends the fused kernels to their scalar path).
class Tensor {
 public:
  Tensor(Dt dt, int64_t n, int64_t offset = 0) : dt_(dt), n_(n), offset_(offset) {
    check_cuda(cudaMalloc(&base_, size_t((n + offset + 8) * cuda::dt_size(dt))), "cudaMalloc", "fused test");
    check_cuda(cudaMemset(base_, 0xff, size_t((n + offset + 8) * cuda::dt_size(dt))), "cudaMemset", "fused test");
  }
  Tensor(Dt dt, const std::vector<float>& host, int64_t offset = 0) : Tensor(dt, int64_t(host.size()), offset) {
    set(host);
  }
  ~Tensor() { cudaFree(base_); }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  void* p() const { return static_cast<char*>(base_) + offset_ * cuda::dt_size(dt_); }
  float* f() const { return static_cast<float*>(p()); }
  void set(const std::vector<float>& host) {
    if (dt_ == Dt::f32) {
      check_cuda(cudaMemcpy(p(), host.data(), 4 * host.size(), cudaMemcpyHostToDevice), "cudaMemcpy", "fused test");
    } else {
      std::vector<uint16_t> b(host.size());
      cpu::f32_to_bf16(host.data(), int64_t(host.size()), b.data());
      check_cuda(cudaMemcpy(p(), b.data(), 2 * b.size(), cudaMemcpyHostToDevice), "cudaMemcpy", "fused test");
    }
  }
  // The elements as fp32 (bf16 widened exactly), and as ordered integers for ulp distances.
  std::vector<float> floats() const {
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize", "fused test (the kernels)");
    std::vector<float> out(static_cast<size_t>(n_));
    if (dt_ == Dt::f32) {
      check_cuda(cudaMemcpy(out.data(), p(), 4 * out.size(), cudaMemcpyDeviceToHost), "cudaMemcpy", "fused test");
    } else {
      std::vector<uint16_t> b(out.size());
      check_cuda(cudaMemcpy(b.data(), p(), 2 * b.size(), cudaMemcpyDeviceToHost), "cudaMemcpy", "fused test");
      cpu::bf16_to_f32(b.data(), n_, out.data());
    }
    return out;
  }
  Dt dt() const { return dt_; }
  int64_t size() const { return n_; }

 private:
  Dt dt_;
  int64_t n_, offset_;
  void* base_ = nullptr;
};

// Distance in units in the last place of dt between two values of dt (held as fp32): the
// values' bit patterns as sign-magnitude integers.
int64_t ulps(float a, float b, Dt dt) {
  auto ordered = [dt](float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    if (dt == Dt::bf16) bits >>= 16;
    const uint32_t sign = dt == Dt::bf16 ? 0x8000u : 0x80000000u;
    const int64_t mag = int64_t(bits & (sign - 1));
    return bits & sign ? -mag : mag;
  };
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0 : INT64_MAX;
  return std::llabs(ordered(a) - ordered(b));
}

// Prints the comparison's line and checks the normalised error, and the ulps per element
// when max_ulps >= 0.
void expect_close(const std::string& what, int y, const Tensor& got, const Tensor& want, double tol,
                  int64_t max_ulps = -1) {
  const std::vector<float> g = got.floats(), w = want.floats();
  ASSERT_EQ(g.size(), w.size()) << what;
  const double err = normalised_error(g, w);  // blind to NaN: the count below is not
  int64_t worst = 0, nan_mismatches = 0;
  size_t at = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    nan_mismatches += std::isnan(g[i]) != std::isnan(w[i]);
    const int64_t u = ulps(g[i], w[i], got.dt());
    if (u > worst) worst = u, at = i;
  }
  // The tensors start as NaN (Tensor's 0xff fill): an element a kernel did not write is one.
  EXPECT_EQ(nan_mismatches, 0) << what << " y" << y << ": elements NaN in one result only";
  std::printf("fused.%s %s y%d normalised error %.2e (max %lld ulp)\n", what.c_str(), dt_name(got.dt()), y, err,
              (long long)worst);
  EXPECT_LT(err, tol) << what << " y" << y;
  if (max_ulps >= 0) {
    EXPECT_LE(worst, max_ulps) << what << " y" << y << ": element " << at << " is " << g[at] << ", the reference "
                               << w[at];
  }
}

void expect_identical(const std::string& what, const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.floats(), y = b.floats();
  ASSERT_EQ(x.size(), y.size());
  EXPECT_EQ(std::memcmp(x.data(), y.data(), 4 * x.size()), 0) << what << ": not bit-identical";
}

int device_int(const int* p) {
  int e = 0;
  check_cuda(cudaMemcpy(&e, p, 4, cudaMemcpyDeviceToHost), "cudaMemcpy", "fused test");
  return e;
}

template <typename T>
struct DeviceArray {
  T* p = nullptr;
  explicit DeviceArray(const std::vector<T>& host) {
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&p), sizeof(T) * std::max<size_t>(1, host.size())), "cudaMalloc",
               "fused test");
    check_cuda(cudaMemcpy(p, host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice), "cudaMemcpy",
               "fused test");
  }
  ~DeviceArray() { cudaFree(p); }
};

const Dt kDts[] = {Dt::f32, Dt::bf16};

struct Rows {
  int64_t T, H;
};

// ---- rms_norm ----------------------------------------------------------------------------------

TEST(CudaFused, RmsNormForwardMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  for (const Rows s : {Rows{7, 4096}, Rows{5, 2048 + 8}, Rows{9, 40}, Rows{3, 1030}, Rows{3, 10000}, Rows{1, 8}}) {
    for (Dt dt : kDts) {
      const std::string name = str("rms_norm.T", s.T, ".H", s.H);
      SCOPED_TRACE(str(name, " ", dt_name(dt)));
      Tensor x(dt, random_normal(s.T * s.H, 1)), w(dt, random_normal(s.H, 2, 0.5f));
      Tensor y_ref(dt, s.T * s.H), y(dt, s.T * s.H), r_ref(Dt::f32, s.T), r(Dt::f32, s.T);
      cuda::rms_norm_forward(dt, x.p(), w.p(), s.T, s.H, 1e-5f, y_ref.p(), r_ref.f(), nullptr);
      cuda::rms_norm_forward_fused(dt, x.p(), w.p(), s.T, s.H, 1e-5f, y.p(), r.f(), nullptr);
      check_cuda(cudaGetLastError(), "the rms_norm kernels", name);
      expect_close(name, 0, y, y_ref, dt == Dt::f32 ? kF32Tol : kBf16Tol, dt == Dt::bf16 ? kMaxUlps : -1);
      expect_close(name, 1, r, r_ref, kF32Tol);
    }
  }
}

// dx and dw against the reference's, and dw (and dx) the same bits on a second run: the
// reference adds dw with atomics, the fused kernel in a fixed order.
TEST(CudaFused, RmsNormBackwardMatchesTheReferenceAndIsDeterministic) {
  SKIP_WITHOUT_GPU();
  for (const Rows s : {Rows{7, 4096}, Rows{5, 2048 + 8}, Rows{9, 40}, Rows{3, 1030}, Rows{1100, 40}, Rows{4, 8200},
                       Rows{600, 2048 + 8}}) {
    for (Dt dt : kDts) {
      const std::string name = str("rms_norm_backward.T", s.T, ".H", s.H);
      SCOPED_TRACE(str(name, " ", dt_name(dt)));
      const int64_t n = s.T * s.H;
      Tensor x(dt, random_normal(n, 3)), w(dt, random_normal(s.H, 4, 0.5f)), dy(dt, random_normal(n, 5));
      Tensor y(dt, n), rstd(Dt::f32, s.T);
      cuda::rms_norm_forward(dt, x.p(), w.p(), s.T, s.H, 1e-5f, y.p(), rstd.f(), nullptr);
      Tensor dx_ref(dt, n), dw_ref(dt, s.H), acc(Dt::f32, s.H);
      cuda::rms_norm_backward(dt, dy.p(), x.p(), w.p(), rstd.f(), s.T, s.H, dx_ref.p(), dw_ref.p(), acc.f(), nullptr);
      Tensor partial(Dt::f32, cuda::rms_norm_backward_workspace_bytes(s.T, s.H) / 4);
      Tensor dx(dt, n), dw(dt, s.H), dx2(dt, n), dw2(dt, s.H);
      cuda::rms_norm_backward_fused(dt, dy.p(), x.p(), w.p(), rstd.f(), s.T, s.H, dx.p(), dw.p(), partial.f(), nullptr);
      cuda::rms_norm_backward_fused(dt, dy.p(), x.p(), w.p(), rstd.f(), s.T, s.H, dx2.p(), dw2.p(), partial.f(),
                                    nullptr);
      check_cuda(cudaGetLastError(), "the rms_norm_backward kernels", name);
      const double tol = dt == Dt::f32 ? kF32Tol : kBf16Tol;
      expect_close(name, 0, dx, dx_ref, tol);
      expect_close(name, 1, dw, dw_ref, tol);
      expect_identical(name + " dw run to run", dw, dw2);
      expect_identical(name + " dx run to run", dx, dx2);
    }
  }
}

// T = 0: no rows, and dw is zero (the reference's too), not the workspace's garbage.
TEST(CudaFused, RmsNormBackwardOfNoRowsIsAZeroDw) {
  SKIP_WITHOUT_GPU();
  for (Dt dt : kDts) {
    Tensor dw(dt, 16);
    cuda::rms_norm_backward_fused(dt, nullptr, nullptr, nullptr, nullptr, 0, 16, nullptr, dw.p(), nullptr, nullptr);
    check_cuda(cudaGetLastError(), "rms_norm_backward_fused", "T = 0");
    EXPECT_EQ(dw.floats(), std::vector<float>(16, 0.0f)) << dt_name(dt);
  }
}

// ---- rope ---------------------------------------------------------------------------------------

TEST(CudaFused, RopeMatchesTheReferenceInPlaceToo) {
  SKIP_WITHOUT_GPU();
  struct Shape4 {
    int64_t T, NH, D;
  };
  for (const Shape4 s : {Shape4{7, 32, 128}, Shape4{5, 3, 8}, Shape4{9, 8, 64}, Shape4{3, 2, cuda::kRopeMaxD},
                         Shape4{4, 5, 12}}) {
    std::vector<double> inv_freq(static_cast<size_t>(s.D / 2));
    cpu::rope_inv_freq(s.D, 500000.0, cpu::RopeScaling{}, inv_freq.data());
    std::vector<int32_t> pos;
    for (int64_t t = 0; t < s.T; ++t) pos.push_back(int32_t(t * 7919 + (t % 2 ? 100000 : 0)));
    DeviceArray<int32_t> dpos(pos);
    for (Dt dt : kDts)
      for (bool inverse : {false, true})
        for (bool interleaved : {false, true}) {
          const std::string name = str("rope.T", s.T, ".NH", s.NH, ".D", s.D, inverse ? ".inverse" : "",
                                       interleaved ? ".interleaved" : "");
          SCOPED_TRACE(str(name, " ", dt_name(dt)));
          const int64_t n = s.T * s.NH * s.D;
          const std::vector<float> host = random_normal(n, 6);
          Tensor x(dt, host), y_ref(dt, n), y(dt, n), inplace(dt, host);
          cuda::rope_forward(dt, x.p(), dpos.p, inv_freq.data(), s.T, s.NH, s.D, inverse, y_ref.p(), nullptr,
                             interleaved);
          cuda::rope_forward_fused(dt, x.p(), dpos.p, inv_freq.data(), s.T, s.NH, s.D, inverse, y.p(), nullptr,
                                   interleaved);
          cuda::rope_forward_fused(dt, inplace.p(), dpos.p, inv_freq.data(), s.T, s.NH, s.D, inverse, inplace.p(),
                                   nullptr, interleaved);
          check_cuda(cudaGetLastError(), "the rope kernels", name);
          expect_close(name, 0, y, y_ref, dt == Dt::f32 ? kF32Tol : kBf16Tol, kMaxUlps);
          expect_identical(name + " in place", inplace, y);
        }
  }
}

// ---- swiglu -------------------------------------------------------------------------------------

// n: whole vectors, a tail of 3, a single element; offset 1: every operand misaligned.
struct Flat {
  int64_t n, offset;
};
const Flat kFlats[] = {{7 * 4096, 0}, {5 * (2048 + 8) + 3, 0}, {9 * 40, 0}, {1, 0}, {4096 + 5, 1}};

TEST(CudaFused, SwigluMatchesTheReferenceInPlaceToo) {
  SKIP_WITHOUT_GPU();
  for (const Flat f : kFlats)
    for (Dt dt : kDts) {
      const std::string name = str("swiglu.n", f.n, f.offset ? ".misaligned" : "");
      SCOPED_TRACE(str(name, " ", dt_name(dt)));
      const std::vector<float> g = random_normal(f.n, 7, 2.0f), u = random_normal(f.n, 8);
      Tensor gate(dt, g, f.offset), up(dt, u, f.offset), ref(dt, f.n, f.offset), out(dt, f.n, f.offset),
          inplace(dt, g, f.offset);
      cuda::swiglu_forward(dt, gate.p(), up.p(), f.n, ref.p(), nullptr);
      cuda::swiglu_forward_fused(dt, gate.p(), up.p(), f.n, out.p(), nullptr);
      cuda::swiglu_forward_fused(dt, inplace.p(), up.p(), f.n, inplace.p(), nullptr);
      check_cuda(cudaGetLastError(), "the swiglu kernels", name);
      expect_close(name, 0, out, ref, dt == Dt::f32 ? kF32Tol : kBf16Tol, kMaxUlps);
      expect_identical(name + " in place", inplace, out);
    }
}

TEST(CudaFused, SwigluBackwardMatchesTheReferenceInPlaceToo) {
  SKIP_WITHOUT_GPU();
  for (const Flat f : kFlats)
    for (Dt dt : kDts) {
      const std::string name = str("swiglu_backward.n", f.n, f.offset ? ".misaligned" : "");
      SCOPED_TRACE(str(name, " ", dt_name(dt)));
      const std::vector<float> d = random_normal(f.n, 9), g = random_normal(f.n, 10, 2.0f), u = random_normal(f.n, 11);
      Tensor dy(dt, d, f.offset), gate(dt, g, f.offset), up(dt, u, f.offset);
      Tensor dg_ref(dt, f.n, f.offset), du_ref(dt, f.n, f.offset), dg(dt, f.n, f.offset), du(dt, f.n, f.offset);
      cuda::swiglu_backward(dt, dy.p(), gate.p(), up.p(), f.n, dg_ref.p(), du_ref.p(), nullptr);
      cuda::swiglu_backward_fused(dt, dy.p(), gate.p(), up.p(), f.n, dg.p(), du.p(), nullptr);
      // In place as plan_memory may place it: dgate over dy, dup over up.
      Tensor dy2(dt, d, f.offset), up2(dt, u, f.offset);
      cuda::swiglu_backward_fused(dt, dy2.p(), gate.p(), up2.p(), f.n, dy2.p(), up2.p(), nullptr);
      check_cuda(cudaGetLastError(), "the swiglu_backward kernels", name);
      const double tol = dt == Dt::f32 ? kF32Tol : kBf16Tol;
      expect_close(name, 0, dg, dg_ref, tol, kMaxUlps);
      expect_close(name, 1, du, du_ref, tol, kMaxUlps);
      expect_identical(name + " dgate in place", dy2, dg);
      expect_identical(name + " dup in place", up2, du);
    }
}

// ---- embedding ----------------------------------------------------------------------------------

// H: 16-byte vectors and 4-column atomics (4096, 2056, 40); 1028: 4-column atomics, 16-byte
// vectors in f32 only; 1030 and 6: element by element. A vocabulary of 5 over 64 tokens:
// every row is hit about 13 times.
TEST(CudaFused, EmbeddingMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  const int64_t T = 64, V = 5;
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) ids[size_t(t)] = int32_t((3 * t + t / 7) % V);
  DeviceArray<int32_t> tokens(ids);
  DeviceArray<int> error(std::vector<int>{0});
  for (const int64_t H : {int64_t{4096}, int64_t{2048 + 8}, int64_t{40}, int64_t{1028}, int64_t{1030}, int64_t{6}})
    for (Dt dt : kDts) {
      const std::string name = str("embedding.T", T, ".V", V, ".H", H);
      SCOPED_TRACE(str(name, " ", dt_name(dt)));
      Tensor W(dt, random_normal(V * H, 12)), out_ref(dt, T * H), out(dt, T * H);
      cuda::embedding_forward(dt, W.p(), tokens.p, T, H, V, out_ref.p(), error.p, nullptr);
      cuda::embedding_forward_fused(dt, W.p(), tokens.p, T, H, V, out.p(), error.p, nullptr);
      Tensor dy(dt, random_normal(T * H, 13)), dW_ref(dt, V * H), dW(dt, V * H), acc(Dt::f32, V * H);
      cuda::embedding_backward(dt, dy.p(), tokens.p, T, H, V, dW_ref.p(), dt == Dt::f32 ? dW_ref.f() : acc.f(),
                               error.p, nullptr);
      cuda::embedding_backward_fused(dt, dy.p(), tokens.p, T, H, V, dW.p(), dt == Dt::f32 ? dW.f() : acc.f(),
                                     error.p, nullptr);
      check_cuda(cudaGetLastError(), "the embedding kernels", name);
      expect_close(name, 0, out, out_ref, 1e-30, 0);  // a copy: the same bits
      // dW: sums of ~13 rows of dy in the order the atomics land, in both: kF32Tol / kBf16Tol.
      expect_close(str("embedding_backward.T", T, ".V", V, ".H", H), 0, dW, dW_ref,
                   dt == Dt::f32 ? kF32Tol : kBf16Tol);
      EXPECT_EQ(device_int(error.p), 0);
    }
}

// The backward adds each row's tokens in token order (one block owns a row): the same bits on
// every run, which a save resumed on the device needs. Many ids (several rows a block), more
// tokens than one chunk of ids, a popular id (every 3rd token) beside rare ones; against the
// reference within the sums' tolerance, and bit for bit against itself.
TEST(CudaFused, EmbeddingBackwardIsTheSameBitsEveryRun) {
  SKIP_WITHOUT_GPU();
  const int64_t T = 2500, V = 3001, H = 72;
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) ids[size_t(t)] = int32_t(t % 3 == 0 ? 17 : (t * 7919) % V);
  DeviceArray<int32_t> tokens(ids);
  DeviceArray<int> error(std::vector<int>{0});
  for (Dt dt : kDts) {
    SCOPED_TRACE(dt_name(dt));
    Tensor dy(dt, random_normal(T * H, 21)), dW_ref(dt, V * H), a(dt, V * H), b(dt, V * H);
    Tensor acc(Dt::f32, V * H);
    cuda::embedding_backward(dt, dy.p(), tokens.p, T, H, V, dW_ref.p(), dt == Dt::f32 ? dW_ref.f() : acc.f(),
                             error.p, nullptr);
    for (Tensor* out : {&a, &b})
      cuda::embedding_backward_fused(dt, dy.p(), tokens.p, T, H, V, out->p(), dt == Dt::f32 ? out->f() : acc.f(),
                                     error.p, nullptr);
    check_cuda(cudaGetLastError(), "the embedding kernels", "EmbeddingBackwardIsTheSameBitsEveryRun");
    // Row 17 sums 834 rows of dy: the tolerance of a long fp32 sum in another order, or of
    // one bf16 rounding of it.
    expect_close(str("embedding_backward.T", T, ".V", V, ".H", H), 0, a, dW_ref, dt == Dt::f32 ? 1e-5 : kBf16Tol);
    const std::vector<float> fa = a.floats(), fb = b.floats();
    EXPECT_EQ(std::memcmp(fa.data(), fb.data(), 4 * fa.size()), 0) << "two runs gave different bits";
    EXPECT_EQ(device_int(error.p), 0);
  }
}

// A token id outside [0, V) sets the error code; forward zeroes its row, backward skips it
// (the other rows' sums are still right).
TEST(CudaFused, EmbeddingReportsABadTokenAndSkipsIt) {
  SKIP_WITHOUT_GPU();
  const int64_t V = 4, H = 40;
  const std::vector<int32_t> ids{1, 7, 2, -1, 1};
  const int64_t T = int64_t(ids.size());
  DeviceArray<int32_t> tokens(ids);
  for (Dt dt : kDts) {
    SCOPED_TRACE(dt_name(dt));
    const std::vector<float> table = random_normal(V * H, 14), grad = random_normal(T * H, 15);
    Tensor W(dt, table), out(dt, T * H), dy(dt, grad), dW(dt, V * H), acc(Dt::f32, V * H);
    DeviceArray<int> e1(std::vector<int>{0}), e2(std::vector<int>{0});
    cuda::embedding_forward_fused(dt, W.p(), tokens.p, T, H, V, out.p(), e1.p, nullptr);
    cuda::embedding_backward_fused(dt, dy.p(), tokens.p, T, H, V, dW.p(), dt == Dt::f32 ? dW.f() : acc.f(), e2.p,
                                   nullptr);
    check_cuda(cudaGetLastError(), "the embedding kernels", "bad ids");
    EXPECT_EQ(device_int(e1.p), cuda::kErrorTokenId);
    EXPECT_EQ(device_int(e2.p), cuda::kErrorTokenId);
    const std::vector<float> o = out.floats(), Wh = W.floats(), dyh = dy.floats(), g = dW.floats();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const bool bad = ids[size_t(t)] < 0 || ids[size_t(t)] >= V;
        EXPECT_EQ(o[size_t(t * H + h)], bad ? 0.0f : Wh[size_t(ids[size_t(t)] * H + h)]) << t << ", " << h;
      }
    // Row 1 holds tokens 0 and 4, row 2 token 2, rows 0 and 3 nothing: sums of at most two
    // terms, exact in f32, rounded once in bf16 (half an ulp: 2^-8 relative).
    for (int64_t h = 0; h < H; ++h) {
      const float r1 = dyh[size_t(0 * H + h)] + dyh[size_t(4 * H + h)], r2 = dyh[size_t(2 * H + h)];
      EXPECT_EQ(g[size_t(0 * H + h)], 0.0f);
      EXPECT_EQ(g[size_t(3 * H + h)], 0.0f);
      EXPECT_NEAR(g[size_t(1 * H + h)], r1, std::abs(r1) * (dt == Dt::f32 ? 0.0 : 0.004)) << h;
      EXPECT_EQ(g[size_t(2 * H + h)], r2) << h;
    }
  }
}

}  // namespace
}  // namespace autosp
