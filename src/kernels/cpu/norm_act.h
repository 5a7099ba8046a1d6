// Plain fp32 CPU kernels of layer_norm and gelu (GPT-2, Gemma): one copy for every
// instruction set (not kernels/cpu/isa.h's per-ISA builds), OpenMP over rows or elements.
// As kernels/cpu/fused.h: T rows (leading dims flattened), contiguous row-major fp32;
// kernels overwrite their outputs; reductions over rows (dw, db) are deterministic (a fixed
// partition of the rows that depends on T only, summed in double in a fixed order).
#pragma once
#include <cstdint>

namespace autosp::cpu {

// ---- layer_norm (torch.nn.functional.layer_norm over the last dim, biased variance) -----
// y = (x - mean) rstd w + b, rstd = 1 / sqrt(var + eps); mean and rstd [T] are kept (f32)
// for the backward. The statistics are computed in double (two passes over the row).
void layer_norm_forward(const float* x, const float* w, const float* b, int64_t T, int64_t H,
                        float eps, float* y, float* mean /* [T] */, float* rstd /* [T] */);
// With xhat = (x - mean) rstd and g = dy w:
//   dx = rstd (g - mean_h(g) - xhat mean_h(g xhat)),  dw = sum_rows dy xhat,  db = sum_rows dy.
// scratch: layer_norm_backward_scratch_doubles(T, H) doubles (per-chunk partial dw and db),
// or null to allocate it here. dx may not alias dy or x.
void layer_norm_backward(const float* dy, const float* x, const float* w, const float* mean,
                         const float* rstd, int64_t T, int64_t H, float* dx, float* dw, float* db,
                         double* scratch = nullptr);
int64_t layer_norm_backward_scratch_doubles(int64_t T, int64_t H);

// ---- gelu -------------------------------------------------------------------------------
// tanh = false: y = 0.5 x (1 + erf(x / sqrt 2)); tanh = true (torch approximate="tanh"):
// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Element i is read before y[i] is
// written: y may be x.
void gelu_forward(const float* x, int64_t n, bool tanh, float* y);
// dx = dy gelu'(x), torch's GeluBackward formulas; dx may be dy or x.
void gelu_backward(const float* dy, const float* x, int64_t n, bool tanh, float* dx);

// ---- xIELU (Apertus; arXiv 2411.13010) ---------------------------------------------------
// With learned scalars a_p = softplus(alpha_p) and a_n = beta + softplus(alpha_n) (softplus as
// torch's, beta 1 and threshold 20):
//   y = a_p x^2 + beta x                         for x > 0,
//   y = (expm1(min(x, eps)) - x) a_n + beta x     otherwise,
// in transformers' XIELUActivation's operation order. y may be x.
void xielu_forward(const float* x, int64_t n, float alpha_p, float alpha_n, float beta, float eps, float* y);
// dx = dy y'(x) (min's derivative as torch's: 1 below eps, 1/2 at it, 0 above); dalpha_p and
// dalpha_n [1] are sum(dy x^2 over x > 0) softplus'(alpha_p) and sum(dy (expm1(min(x, eps)) - x)
// over x <= 0) softplus'(alpha_n), summed in double over fixed chunks in chunk order (thread-
// count independent). dx may be dy or x.
void xielu_backward(const float* dy, const float* x, int64_t n, float alpha_p, float alpha_n, float beta, float eps,
                    float* dx, float* dalpha_p, float* dalpha_n);

}  // namespace autosp::cpu
