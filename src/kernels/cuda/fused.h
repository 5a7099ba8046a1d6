// The cuda backend's fast row and elementwise kernels, beside the reference ones of
// kernels.h (llm.c's rule: the plain kernel stays, the fast one is checked against it,
// tests/cuda/cuda_fused_test.cpp). The ops bind these (src/ops/<op>.cpp, OpDef::cuda).
//
// What makes them fast: every row and elementwise pass reads and writes 16 bytes per access
// (8 bf16 or 4 f32; kernels/cuda/fused_layout.h, vector_width) where the row length and the
// pointers allow, else element by element (the same kernel with a vector of one); a row is
// one block (one warp for a short row), which keeps its vectors in registers between its two
// passes; rms_norm's backward computes dx and dw in one pass over dy and x; rope computes a
// token's cos and sin once for all its heads.
//
// The maths, rounding points and types are the reference kernels' (kernels.h, "Types"): fp32
// arithmetic in the same expression order, a bf16 result rounded once when stored. Only the
// order of a reduction's terms differs (rms_norm's sums), so results agree with the reference
// to a few fp32 ulp before rounding, i.e. within one bf16 ulp after it.
//
// In place, stream and errors as kernels.h: every launcher enqueues on `stream` and returns
// without waiting; the caller checks the launches (cudaGetLastError). swiglu, its backward
// and rope read element i of every operand before writing element i of a result (by the
// same thread), so a result may alias an operand; rms_norm and embedding may not.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/fused_layout.h"
#include "kernels/cuda/kernels.h"

namespace autosp::cuda {

// y = x rstd w, rstd = 1 / sqrt(mean(x^2) + eps) per row (f32).
void rms_norm_forward_fused(Dt dt, const void* x, const void* w, int64_t T, int64_t H, float eps, void* y,
                            float* rstd, cudaStream_t stream);
// dx = rstd (dy w - xhat mean(dy w xhat)), dw = sum over rows of dy xhat, xhat = x rstd.
// partial: rms_norm_backward_workspace_bytes(T, H) bytes (fused_layout.h). Deterministic: no
// atomics, a fixed order of every sum. dw may be f32 or bf16 (dt), written once.
void rms_norm_backward_fused(Dt dt, const void* dy, const void* x, const void* w, const float* rstd, int64_t T,
                             int64_t H, void* dx, void* dw, float* partial, cudaStream_t stream);

// Rope (kernels.h rope_forward, rotate-half or interleaved): one block per token; D <= kRopeMaxD.
void rope_forward_fused(Dt dt, const void* x, const int32_t* pos, const double* inv_freq, int64_t T, int64_t NH,
                        int64_t D, bool inverse, void* y, cudaStream_t stream, bool interleaved = false);

void swiglu_forward_fused(Dt dt, const void* gate, const void* up, int64_t n, void* out, cudaStream_t stream);
void swiglu_backward_fused(Dt dt, const void* dy, const void* gate, const void* up, int64_t n, void* dgate, void* dup,
                           cudaStream_t stream);

// A row copy per token; an id outside [0, V) sets *error (kErrorTokenId) and zeroes its row.
void embedding_forward_fused(Dt dt, const void* W, const int32_t* tokens, int64_t T, int64_t H, int64_t V, void* out,
                             int* error, cudaStream_t stream);
// dW[v, :] = sum of dy[t, :] over t with tokens[t] == v, added in fp32 into acc (V x H; for
// f32, acc may be dW itself) in token order by the one block that owns row v (no atomics: the
// same bits on every run, unlike the reference's atomics), then rounded into dW by a
// vectorised pass. An id outside [0, V) sets *error and is skipped.
void embedding_backward_fused(Dt dt, const void* dy, const int32_t* tokens, int64_t T, int64_t H, int64_t V,
                              void* dW, float* acc, int* error, cudaStream_t stream);

}  // namespace autosp::cuda
