// The cuda kernels of the mixture-of-experts layer (the `moe` op) beside its cuBLAS products
// (ops/moe.cpp orchestrates them: the routing here, the experts' rows gathered here, three
// cuBLAS gemms and the fused swiglu per chunk, then a scatter-add here). The maths is
// kernels/cpu/moe.h's; each kernel is one thread (or block) per token or gathered row.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cpu/moe_experts.h"
#include "kernels/cpu/moe_routing.h"
#include "kernels/cuda/dtype.h"

namespace autosp::cuda {

// Token t's experts[t, j] and weights[t, j] (f32) from its E router logits (of dt), as
// cpu::moe_route: moe_routing.h's functions, in double (route.bias in device memory).
void moe_route(Dt dt, const void* logits, int64_t T, int64_t E, int64_t k, const moe_routing::Route& route,
               int32_t* experts, float* weights, cudaStream_t stream);
// rows[i, :] = src[slots[i] / k, :] for i < n (H elements of dt each).
void moe_gather_rows(Dt dt, const void* src, const int32_t* slots, int64_t n, int64_t k, int64_t H, void* rows,
                     cudaStream_t stream);
// y[slots[i] / k, :] += weights[slots[i]] rows[i, :] (weights null: 1), in fp32, rounded once
// to dt. The rows of one call are distinct tokens (a token chooses an expert once), and calls
// run in stream order, so each element's sum has one order.
void moe_scatter_add(Dt dt, const void* rows, const int32_t* slots, const float* weights, int64_t n, int64_t k,
                     int64_t H, void* y, cudaStream_t stream);
// For each gathered row i: dws[slots[i]] = <dy_rows[i], out[i]> (summed in double), and
// dout[i] = weights[slots[i]] dy_rows[i] (the expert's output gradient; weights null: 1).
void moe_output_grad(Dt dt, const void* dy_rows, const void* out, void* dout, const int32_t* slots,
                     const float* weights, int64_t n, int64_t H, float* dws, cudaStream_t stream);
// The input weighted (cpu/moe.h's MoeExperts::weight_input): rows[i] *= weights[slots[i]] of the
// gathered rows [n, H]; and dws[slots[i]] = <dxs[i], x[slots[i] / k]> (summed in double) from the
// gradient at the experts' inputs dxs [n, H].
void moe_scale_rows(Dt dt, void* rows, const int32_t* slots, const float* weights, int64_t n, int64_t H,
                    cudaStream_t stream);
void moe_input_weight_grad(Dt dt, const void* dxs, const void* x, const int32_t* slots, int64_t n, int64_t k,
                           int64_t H, float* dws, cudaStream_t stream);
// dlogits (of dt) from each slot's dw, as cpu::moe_backward's router part (the routing
// recomputed from the logits, as there).
void moe_router_backward(Dt dt, const void* logits, const float* dws, int64_t T, int64_t E, int64_t k,
                         const moe_routing::Route& route, void* dlogits, cudaStream_t stream);

// The fused experts (cpu/moe.h's MoeExperts: gpt-oss's, Llama 4's; ops/moe.cpp runs them as
// cpu::moe_fused_*, with cuBLAS for the products): gu [n, 2 I] (in the form's columns) plus bias
// [2 I] (null: none) into g, u and the GLU h [n, I]; h of the saved g, u [n elements]; dgu [n, 2 I]
// in the form's columns from dh [n, I]; a bias [C] added to each row of x [n, C]; and sums [C] +=
// the column sums of x [n, C].
void moe_fused_glu(Dt dt, const moe_experts::FusedForm& form, const void* gu, const void* bias, int64_t n, int64_t I,
                   void* g, void* u, void* h, cudaStream_t stream);
void moe_fused_glu_of_saved(Dt dt, const moe_experts::FusedForm& form, const void* g, const void* u, int64_t n,
                            void* h, cudaStream_t stream);
void moe_fused_glu_backward(Dt dt, const moe_experts::FusedForm& form, const void* dh, const void* g, const void* u,
                            int64_t n, int64_t I, void* dgu, cudaStream_t stream);
void moe_add_row_bias(Dt dt, void* x, const void* bias, int64_t n, int64_t C, cudaStream_t stream);
void moe_add_column_sums(Dt dt, const void* x, int64_t n, int64_t C, void* sums, cudaStream_t stream);

// The load-balancing statistics of T rows of router logits (of dt), as cpu::moe_balance_stats:
// each row's probabilities and top-k hits into rows [2, T, E] (f32 workspace), then counts and
// probability sums added, per expert in row order in double, into acc [2, E] (double).
void moe_balance_stats(Dt dt, const void* logits, int64_t T, int64_t E, int64_t k, float* rows, double* acc,
                       cudaStream_t stream);
// out[2, E] (f32) = acc rounded.
void moe_balance_finish(const double* acc, int64_t E, float* out, cudaStream_t stream);
// dlogits (of dt) = p (g - <g, p>) per row, g = dstats[1, :] (f32).
void moe_balance_backward(Dt dt, const float* dstats, const void* logits, int64_t T, int64_t E, void* dlogits,
                          cudaStream_t stream);

}  // namespace autosp::cuda
