// The matmul kernel behind cpu::gemm (basic.h): C[M, N] (+)= op(A) op(B), fp32, row-major,
// compiled once per instruction set (isa.h) like attention's kernels. Callers use cpu::gemm,
// which owns the workspace; only dispatch.cpp and the kernel tests call these directly.
//
// How (BLIS's loop nest, GotoBLAS's packing): op(B) is copied, one block of at most 256 rows
// and 256 columns at a time, into panels of NR columns (zero-padded) that the micro-kernel
// streams from L2; A is not copied: the micro-kernel broadcasts its elements straight from
// A's rows, one tile of MR rows kept in L1 across all the block's panels (A^T's tiles, whose
// rows lie M floats apart, are first copied k-major). Register tile MR x NR: 14 x 32 in the
// avx512 copy (28 of 32 zmm accumulate), 6 x 16 in the avx2 copy (12 of 16 ymm).
//
// Threads: a product with at least as many rows as columns splits its rows between the
// threads (each packs all of op(B)); a wider one its panels (each packs its own), and the rows
// too when there are fewer panels than threads. Small products run on one thread.
//
// Numbers: every C element is one chain of fused multiply-adds over k = 0, 1, ..., K - 1,
// starting from 0 (or from C's own value with accumulate); blocking K only stores and reloads
// the partial sum, which is exact. So C is bitwise the same for any M, N blocking, thread
// count, thread split and instruction set.
#pragma once
#include <cstdint>

namespace autosp::cpu {

// Floats of workspace gemm_packed needs for `threads` threads (each a packed block of op(B)
// and a tile of A^T, about 270 KiB; plus alignment).
int64_t gemm_workspace_floats(int threads);

// C[M, N] = op(A) op(B) (accumulate: C += op(A) op(B)), op = transpose where asked; A is
// [M, K] ([K, M] with trans_a), B is [K, N] ([N, K] with trans_b), C is [M, N], all
// row-major and dense. Runs on at most `threads` OpenMP threads (1 inside a parallel region).
void gemm_packed(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
                 const float* B, float* C, bool accumulate, float* workspace, int threads);

}  // namespace autosp::cpu
