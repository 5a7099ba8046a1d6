// The attention ops on the cuda backend: blocks of queries whose scores are cuBLAS gemms
// (kernels/cuda/attention_blocks.h says how, and sizes the workspace). The reference kernels
// (kernels/cuda/kernels.h, attention_forward / attention_backward: one thread per row) stay
// beside them as what the tests hold these to.
//
// Beside them, cuDNN's fused SDPA (ops/cuda_attention_cudnn.cpp; kernels/cuda/cudnn_attention.h
// has its layout, graph key, selection and workspace). The ops' cuda kernels (ops/attention.cpp)
// run it where choose_attention says, and the blocks where it says no or where the cuDNN run
// declines at run time.
#pragma once
#include "kernels/cuda/attention_blocks.h"
#include "kernels/cuda/cudnn_attention.h"
#include "ops/cuda_kernels.h"

namespace autosp {

// out [B, S, NH, D] and lse [B, NH, S] from q, k, v (kernels.h's layouts; softcap and alibi as theirs); workspace: the
// forward layout of attention_block_layout with `rows` queries a block (0: the sizing rule's,
// attention_block_rows, which is what the op's workspace rule plans for).
void cuda_attention_forward_blocks(const CudaContext& c, cuda::Dt dt, const cuda::AttentionDims& d, bool causal,
                                   int64_t window, float scale, float softcap, const void* q, const void* k,
                                   const void* v, const int32_t* doc, void* out, float* lse, void* workspace,
                                   int64_t rows = 0, const cuda::AlibiSlopes& alibi = {});
// dq, dk, dv; workspace: the backward layout with `rows` (0 as above).
void cuda_attention_backward_blocks(const CudaContext& c, cuda::Dt dt, const cuda::AttentionDims& d, bool causal,
                                    int64_t window, float scale, float softcap, const void* q, const void* k,
                                    const void* v, const void* out, const float* lse, const void* dout,
                                    const int32_t* doc, void* dq, void* dk, void* dv, void* workspace,
                                    int64_t rows = 0, const cuda::AlibiSlopes& alibi = {});

// ---- cuDNN's fused SDPA (bf16; kernels/cuda/cudnn_attention.h) ------------------------------
// Whether this build has it (AUTOSP_HAVE_CUDNN: CMake found the cudnn-frontend headers and
// libcudnn).
bool cuda_cudnn_attention_built();
// The attention of `key` on cuDNN: true when it ran; false when it could not at run time (said
// once per key on stderr), and the caller runs the blocks; with `forced` (AUTOSP_ATTENTION=cudnn)
// that is a UserError instead. Layouts as the blocks'; doc: null exactly when the key has no
// documents. workspace: cudnn_sdpa_layout(key).bytes at least, 256-byte aligned.
bool cuda_attention_forward_cudnn(const CudaContext& c, const cuda::CudnnSdpaKey& key, bool forced, const void* q,
                                  const void* k, const void* v, const int32_t* doc, void* out, float* lse,
                                  void* workspace);
bool cuda_attention_backward_cudnn(const CudaContext& c, const cuda::CudnnSdpaKey& key, bool forced, const void* q,
                                   const void* k, const void* v, const void* out, const float* lse, const void* dout,
                                   const int32_t* doc, void* dq, void* dk, void* dv, void* workspace);
// For the tests: graphs built so far in this process (one per key), and the workspace the key's
// graph asks for (building it if needed; -1 where cuDNN declined the shape, *why says why).
int64_t cuda_cudnn_graph_builds();
int64_t cuda_cudnn_graph_workspace(const cuda::CudnnSdpaKey& key, std::string* why);
// "" when cuDNN attention can run in this process (libcudnn and NVRTC open, at the first call),
// else why not; and a line for `autosp --version` ("cuDNN 9.19.0 (libcudnn.so.9, ...)").
const std::string& cuda_cudnn_unavailable();
std::string cuda_cudnn_summary();

}  // namespace autosp
