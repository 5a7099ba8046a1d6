// The public SIMD kernels: each calls its copy for the active instruction set (isa.h).
// Built for the baseline. Optional scratch buffers the caller left null are allocated here,
// so the per-instruction-set copies never allocate (nor instantiate library templates that
// the linker could share between copies built for different instruction sets).
#include <omp.h>

#include <vector>

#include "kernels/cpu/basic.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/isa_kernels.h"
#include "util/error.h"

#define AUTOSP_DISPATCH(name, ...)                                                     \
  return active_isa() == Isa::avx512 ? avx512::name(__VA_ARGS__) : avx2::name(__VA_ARGS__)

namespace autosp::cpu {

int64_t attention_forward_workspace_floats(const AttentionDims& d, int threads) {
  AUTOSP_DISPATCH(attention_forward_workspace_floats, d, threads);
}
int64_t attention_backward_workspace_floats(const AttentionDims& d, int threads) {
  AUTOSP_DISPATCH(attention_backward_workspace_floats, d, threads);
}
void attention_forward(const AttentionDims& d, bool causal, float scale, const float* q,
                       const float* k, const float* v, float* out, float* lse, float* workspace,
                       int threads, const int32_t* documents, int64_t window, float softcap,
                       const float* alibi) {
  AUTOSP_CHECK(!(alibi && softcap > 0), "attention with both ALiBi and a softcap");
  AUTOSP_DISPATCH(attention_forward, d, causal, scale, q, k, v, out, lse, workspace, threads, documents, window,
                  softcap, alibi);
}
void attention_backward(const AttentionDims& d, bool causal, float scale, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const float* dout, float* dq, float* dk, float* dv, float* workspace,
                        int threads, const int32_t* documents, int64_t window, float softcap,
                        const float* alibi) {
  AUTOSP_CHECK(!(alibi && softcap > 0), "attention with both ALiBi and a softcap");
  AUTOSP_DISPATCH(attention_backward, d, causal, scale, q, k, v, out, lse, dout, dq, dk, dv,
                  workspace, threads, documents, window, softcap, alibi);
}

bool attention_backward_is_split(const AttentionDims& d, int threads) {
  AUTOSP_DISPATCH(attention_backward_is_split, d, threads);
}

void embedding_forward(const float* W, const int32_t* tokens, int64_t T, int64_t H, float* out) {
  AUTOSP_DISPATCH(embedding_forward, W, tokens, T, H, out);
}
void embedding_backward(const float* dy, const int32_t* tokens, int64_t T, int64_t H, int64_t V,
                        float* dW) {
  AUTOSP_DISPATCH(embedding_backward, dy, tokens, T, H, V, dW);
}

void rms_norm_forward(const float* x, const float* w, int64_t T, int64_t H, float eps, float* y,
                      float* rstd) {
  AUTOSP_DISPATCH(rms_norm_forward, x, w, T, H, eps, y, rstd);
}
int64_t rms_norm_backward_scratch_doubles(int64_t T, int64_t H) {
  AUTOSP_DISPATCH(rms_norm_backward_scratch_doubles, T, H);
}
void rms_norm_backward(const float* dy, const float* x, const float* w, const float* rstd,
                       int64_t T, int64_t H, float* dx, float* dw, double* scratch) {
  std::vector<double> own;
  if (!scratch) own.resize(static_cast<size_t>(rms_norm_backward_scratch_doubles(T, H))), scratch = own.data();
  AUTOSP_DISPATCH(rms_norm_backward, dy, x, w, rstd, T, H, dx, dw, scratch);
}

void rope_forward(const float* x, const int32_t* pos, const double* inv_freq, int64_t T,
                  int64_t NH, int64_t D, bool inverse, float* y, float* table, bool interleaved) {
  AUTOSP_CHECK(D % 2 == 0, "rope head dim D = ", D, " must be even");
  std::vector<float> own;
  if (!table) own.resize(static_cast<size_t>(omp_get_max_threads() * rope_table_floats(D))), table = own.data();
  AUTOSP_DISPATCH(rope_forward, x, pos, inv_freq, T, NH, D, inverse, y, table, interleaved);
}

void silu_forward(const float* x, int64_t n, float* y) { AUTOSP_DISPATCH(silu_forward, x, n, y); }
void silu_backward(const float* dy, const float* x, int64_t n, float* dx) {
  AUTOSP_DISPATCH(silu_backward, dy, x, n, dx);
}
void swiglu_forward(const float* gate, const float* up, int64_t n, float* out) {
  AUTOSP_DISPATCH(swiglu_forward, gate, up, n, out);
}
void swiglu_backward(const float* dy, const float* gate, const float* up, int64_t n, float* dgate,
                     float* dup) {
  AUTOSP_DISPATCH(swiglu_backward, dy, gate, up, n, dgate, dup);
}

void cross_entropy_forward(const float* logits, const int32_t* labels, int64_t T, int64_t V,
                           int32_t ignore_index, float* loss_sum, float* lse, float softcap) {
  AUTOSP_DISPATCH(cross_entropy_forward, logits, labels, T, V, ignore_index, loss_sum, lse, softcap);
}
void cross_entropy_backward(const float* dloss_sum, const float* logits, const int32_t* labels,
                            const float* lse, int64_t T, int64_t V, int32_t ignore_index,
                            float* dlogits, float softcap) {
  AUTOSP_DISPATCH(cross_entropy_backward, dloss_sum, logits, labels, lse, T, V, ignore_index,
                  dlogits, softcap);
}

int64_t gemm_workspace_floats(int threads) { AUTOSP_DISPATCH(gemm_workspace_floats, threads); }
void gemm_packed(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
                 const float* B, float* C, bool accumulate, float* workspace, int threads) {
  AUTOSP_DISPATCH(gemm_packed, trans_a, trans_b, M, N, K, A, B, C, accumulate, workspace, threads);
}

// The packing workspace of the calling thread's gemms: allocated on its first gemm (or a first
// with more threads) and kept, so a training step's hundreds of gemms allocate nothing.
// runtime_reserve_bytes (train/trainer.h) counts it.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
          const float* B, float* C, bool accumulate) {
  thread_local std::vector<float> workspace;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const auto floats = static_cast<size_t>(gemm_workspace_floats(threads));
  if (workspace.size() < floats) workspace.resize(floats);
  gemm_packed(trans_a, trans_b, M, N, K, A, B, C, accumulate, workspace.data(), threads);
}

}  // namespace autosp::cpu
