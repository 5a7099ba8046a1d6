// CPU kernels of the elementwise, reduction, layout and matmul ops.
#pragma once
#include <cstdint>

namespace autosp::cpu {

void fill(float* y, int64_t n, float value);
// The elementwise kernels read element i of every operand before writing y[i], so y may
// be one of the operands (in-place; plan_memory relies on it, see OpDef::cpu_inplace).
void add(const float* a, const float* b, int64_t n, float* y);
void mul(const float* a, const float* b, int64_t n, float* y);
// y = alpha x + beta (beta 0: alpha x, bitwise)
void scale(const float* x, int64_t n, float alpha, float* y, float beta = 0.0f);
void div_scalar(const float* x, int64_t n, float divisor, float* y);
// y = a / b elementwise (IEEE: a zero divisor gives +-inf or NaN, as torch)
void div(const float* a, const float* b, int64_t n, float* y);
// relu(x) = max(x, 0); its backward dx = dy where x > 0, else 0 (torch's: 0 at x = 0)
void relu_forward(const float* x, int64_t n, float* y);
void relu_backward(const float* dy, const float* x, int64_t n, float* dx);
// y = min(max(x, lo), hi); dx = dy where lo <= x <= hi (bounds included, as torch), else 0.
void clamp_forward(const float* x, int64_t n, float lo, float hi, float* y);
void clamp_backward(const float* dy, const float* x, int64_t n, float lo, float hi, float* dx);
// tanh(x) (std::tanh); its backward from the output, dx = dy (1 - y^2)
void tanh_forward(const float* x, int64_t n, float* y);
void tanh_backward(const float* dy, const float* y, int64_t n, float* dx);
// Sum in double over a fixed partition of the range: the same on any thread count.
// scratch: sum_scratch_doubles(n) doubles (per-chunk partial sums), or null to allocate.
double sum(const float* x, int64_t n, double* scratch = nullptr);
int64_t sum_scratch_doubles(int64_t n);
// The 2-norm of each of `rows` rows of n elements: y[r] = sqrt(sum_i x[r, i]^2), the squares
// summed in double and rounded once. Its backward dx[r, i] = dy[r] x[r, i] / y[r], and 0 in a
// row whose norm is 0 (torch's subgradient there). dx may be x (each row read before written).
void vector_norm(const float* x, int64_t rows, int64_t n, float* y);
void vector_norm_backward(const float* dy, const float* x, const float* y, int64_t rows, int64_t n, float* dx);

// bf16 <-> fp32. A bf16 is the top 16 bits of an fp32. Narrowing rounds to nearest, ties
// to even (as CUDA's __float2bfloat16_rn and PyTorch): overflow gives +-inf, a NaN stays a
// (quiet) NaN of the same sign. Widening is exact.
void f32_to_bf16(const float* x, int64_t n, uint16_t* y);
void bf16_to_f32(const uint16_t* x, int64_t n, float* y);

// y = x permuted: y's dim i is x's dim perm[i]. Elements of esize bytes.
void permute(const void* x, const int64_t* shape, const int64_t* perm, int rank, int64_t esize,
             void* y);

// Copies count slabs along a middle dim: x viewed as [outer, x_dim, inner], y as
// [outer, y_dim, inner]; y[o, y_off + i, :] = x[o, x_off + i, :] for i < count.
void copy_slab(const float* x, int64_t outer, int64_t x_dim, int64_t x_off, int64_t inner,
               int64_t count, float* y, int64_t y_dim, int64_t y_off);

// Concatenates n operands along a middle dim: operand i viewed as [outer, lens[i], inner]
// lands in y, viewed as [outer, sum of lens, inner], after the operands before it. One
// parallel region in which every thread copies an equal share of y (a flattened gradient
// bucket is a single row of dozens of operands).
void concat_slabs(const float* const* xs, const int64_t* lens, int64_t n, int64_t outer, int64_t inner,
                  float* y);

// C[M, N] = op(A) op(B), row-major, op = transpose where asked; the packed kernel of the
// active instruction set (gemm.h: each element one FMA chain over K in order, bitwise the
// same on any thread count and either set). accumulate: C += op(A) op(B) instead (beta = 1).
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
          const float* B, float* C, bool accumulate = false);

}  // namespace autosp::cpu
