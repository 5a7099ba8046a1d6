// The attention ops on the cuda backend: blocks of queries whose scores are cuBLAS gemms
// (kernels/cuda/attention_blocks.h says how, and sizes the workspace). The reference kernels
// (kernels/cuda/kernels.h, attention_forward / attention_backward: one thread per row) stay
// beside them as what the tests hold these to.
#pragma once
#include "kernels/cuda/attention_blocks.h"
#include "ops/cuda_kernels.h"

namespace autosp {

// out [B, S, NH, D] and lse [B, NH, S] from q, k, v (kernels.h's layouts); workspace: the
// forward layout of attention_block_layout with `rows` queries a block (0: the sizing rule's,
// attention_block_rows, which is what the op's workspace rule plans for).
void cuda_attention_forward_blocks(const CudaContext& c, cuda::Dt dt, const cuda::AttentionDims& d, bool causal,
                                   int64_t window, float scale, const void* q, const void* k, const void* v,
                                   const int32_t* doc, void* out, float* lse, void* workspace, int64_t rows = 0);
// dq, dk, dv; workspace: the backward layout with `rows` (0 as above).
void cuda_attention_backward_blocks(const CudaContext& c, cuda::Dt dt, const cuda::AttentionDims& d, bool causal,
                                    int64_t window, float scale, const void* q, const void* k, const void* v,
                                    const void* out, const float* lse, const void* dout, const int32_t* doc, void* dq,
                                    void* dk, void* dv, void* workspace, int64_t rows = 0);

}  // namespace autosp
