// The cuda backend's reference kernels: one plain, obviously correct kernel per op (llm.c's
// rule: a reference first, a fast one beside it later, checked against it). The fast ones
// beside them: kernels/cuda/fused.h (rms_norm, rope, swiglu, embedding), which those ops run. They take raw
// device pointers and sizes, as the CPU kernels do, and know nothing of the IR; each op's
// definition (src/ops/<op>.cpp, OpDef::cuda) binds them to nodes. Matmuls are not here: they
// are cuBLAS calls (ops/cuda_kernels.h, cuda_gemm()).
//
// Types: every floating buffer is of the dtype passed as `dt` (f32 or bf16) unless its
// parameter is typed float*; arithmetic is fp32 (sums of many terms in double), and a bf16
// result is rounded once, to nearest even, when it is stored. Statistics (lse, rstd, the
// loss) are f32, as the op rules say (src/ops/op.h, "Types").
//
// Every launcher enqueues on `stream` and returns without waiting; errors of its launches
// and of the memsets and copies it enqueues are checked by the caller (the runtime records
// every failing call as its last error: cudaGetLastError after each node). Kernels that find bad data
// (a token id or label out of range) set *error (a device int) to an ErrorCode and skip
// the element; the executor reads it once per run and reports it as a UserError.
//
// In place: the elementwise kernels, rope and all_reduce's copy read element i of every
// operand before writing element i of the result, so a result may be one of its operands
// (plan_memory reuses a dying operand's buffer for the ops marked cpu_inplace).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/dtype.h"
#include "kernels/cuda/limits.h"

namespace autosp::cuda {

// What *error holds after a run: 0 = none, else the first code set.
// kErrorTooManyDocuments: a batch with more documents than cuDNN's attention graph holds
// (cudnn_attention.h, cudnn_max_documents).
enum ErrorCode : int { kErrorNone = 0, kErrorTokenId = 1, kErrorLabel = 2, kErrorTooManyDocuments = 3 };

// ---- elementwise and reductions ----------------------------------------------------------
void fill(Dt dt, void* y, int64_t n, float value, cudaStream_t stream);
void expand(Dt dt, const void* x /* [] */, void* y, int64_t n, cudaStream_t stream);
// y[r, :] = b[:] for each of `rows` rows of n elements (a linear's bias, before its gemm adds
// x W^T to it).
void broadcast_rows(Dt dt, const void* b, int64_t rows, int64_t n, void* y, cudaStream_t stream);
void add(Dt dt, const void* a, const void* b, int64_t n, void* y, cudaStream_t stream);
void mul(Dt dt, const void* a, const void* b, int64_t n, void* y, cudaStream_t stream);
// y = alpha x + beta
void scale(Dt dt, const void* x, int64_t n, float alpha, void* y, cudaStream_t stream, float beta = 0.0f);
void div_scalar(Dt dt, const void* x, int64_t n, const void* s /* [] */, void* y, cudaStream_t stream);
// y = a / b elementwise
void div(Dt dt, const void* a, const void* b, int64_t n, void* y, cudaStream_t stream);
// cpu::vector_norm and vector_norm_backward: the 2-norm of each of `rows` rows of n elements
// (one block per row, the squares summed in double in a fixed order), and dx = dy / y x.
void vector_norm(Dt dt, const void* x, int64_t rows, int64_t n, void* y, cudaStream_t stream);
void vector_norm_backward(Dt dt, const void* dy, const void* x, const void* y, int64_t rows, int64_t n, void* dx,
                          cudaStream_t stream);
// y[] = sum of x, accumulated in double by one block in a fixed order (deterministic).
void sum(Dt dt, const void* x, int64_t n, void* y, cudaStream_t stream);
void convert(Dt from, Dt to, const void* x, int64_t n, void* y, cudaStream_t stream);
void silu_forward(Dt dt, const void* x, int64_t n, void* y, cudaStream_t stream);
// relu(x) = max(x, 0); dx = dy where x > 0, else 0
void relu_forward(Dt dt, const void* x, int64_t n, void* y, cudaStream_t stream);
void relu_backward(Dt dt, const void* dy, const void* x, int64_t n, void* dx, cudaStream_t stream);
// cpu::clamp_forward and clamp_backward.
void clamp_forward(Dt dt, const void* x, int64_t n, float lo, float hi, void* y, cudaStream_t stream);
void clamp_backward(Dt dt, const void* dy, const void* x, int64_t n, float lo, float hi, void* dx,
                    cudaStream_t stream);
// tanh(x); dx = dy (1 - y^2) from the output y
void tanh_forward(Dt dt, const void* x, int64_t n, void* y, cudaStream_t stream);
void tanh_backward(Dt dt, const void* dy, const void* y, int64_t n, void* dx, cudaStream_t stream);
void silu_backward(Dt dt, const void* dy, const void* x, int64_t n, void* dx, cudaStream_t stream);
void swiglu_forward(Dt dt, const void* gate, const void* up, int64_t n, void* out, cudaStream_t stream);
void swiglu_backward(Dt dt, const void* dy, const void* gate, const void* up, int64_t n, void* dgate,
                     void* dup, cudaStream_t stream);
void count_valid(const int32_t* labels, int64_t n, int32_t ignore_index, float* out /* [] */,
                 cudaStream_t stream);

// ---- layout (any element size: 1, 2, 4 or 8 bytes) ----------------------------------------
constexpr int kMaxRank = 8;
// y = x permuted: y's dim i is x's dim perm[i].
void permute(const void* x, const int64_t* shape, const int64_t* perm, int rank, int64_t esize,
             void* y, cudaStream_t stream);
// x viewed as [outer, x_dim, inner], y as [outer, y_dim, inner]:
// y[o, y_off + i, :] = x[o, x_off + i, :] for i < count.
void copy_slab(const void* x, int64_t outer, int64_t x_dim, int64_t x_off, int64_t inner,
               int64_t count, void* y, int64_t y_dim, int64_t y_off, int64_t esize,
               cudaStream_t stream);

// ---- embedding ---------------------------------------------------------------------------
void embedding_forward(Dt dt, const void* W, const int32_t* tokens, int64_t T, int64_t H,
                       int64_t V, void* out, int* error, cudaStream_t stream);
// dW[v, :] = sum of dy[t, :] over t with tokens[t] == v: a scatter-add with fp32 atomicAdd
// into acc (V x H floats; for f32, acc may be dW itself), then rounded into dW.
void embedding_backward(Dt dt, const void* dy, const int32_t* tokens, int64_t T, int64_t H,
                        int64_t V, void* dW, float* acc, int* error, cudaStream_t stream);

// ---- rms_norm ----------------------------------------------------------------------------
void rms_norm_forward(Dt dt, const void* x, const void* w, int64_t T, int64_t H, float eps, void* y,
                      float* rstd, cudaStream_t stream);
// acc: H floats (dw's fp32 sums; for f32, may be dw itself).
void rms_norm_backward(Dt dt, const void* dy, const void* x, const void* w, const float* rstd,
                       int64_t T, int64_t H, void* dx, void* dw, float* acc, cudaStream_t stream);

// ---- layer_norm (see kernels/cpu/norm_act.h for the maths) ------------------------------
// One block per row; mean and rstd [T] f32.
void layer_norm_forward(Dt dt, const void* x, const void* w, const void* b, int64_t T, int64_t H, float eps,
                        void* y, float* mean, float* rstd, cudaStream_t stream);
// dx one block per row; dw and db one thread per column summing the rows in order (no
// atomics: the same bits on every run), written once in dt. dx may not alias dy or x.
void layer_norm_backward(Dt dt, const void* dy, const void* x, const void* w, const float* mean,
                         const float* rstd, int64_t T, int64_t H, void* dx, void* dw, void* db,
                         cudaStream_t stream);

// ---- gelu (torch's "none" erf form, or "tanh" when tanh) ---------------------------------
void gelu_forward(Dt dt, const void* x, int64_t n, bool tanh, void* y, cudaStream_t stream);
void gelu_backward(Dt dt, const void* dy, const void* x, int64_t n, bool tanh, void* dx, cudaStream_t stream);

// ---- xIELU (kernels/cpu/norm_act.h has the maths); alpha_p, alpha_n and the [1] gradients in
// device memory, of dtype dt; the gradients' sums in double by one block, in a fixed order ------
void xielu_forward(Dt dt, const void* x, int64_t n, const void* alpha_p, const void* alpha_n, float beta, float eps,
                   void* y, cudaStream_t stream);
void xielu_backward(Dt dt, const void* dy, const void* x, int64_t n, const void* alpha_p, const void* alpha_n,
                    float beta, float eps, void* dx, void* dalpha_p, void* dalpha_n, cudaStream_t stream);

// ---- rope (rotate-half, or interleaved pairs; see kernels/cpu/fused.h for the maths) -----
// inv_freq: D/2 doubles in host memory (cpu::rope_inv_freq's), passed to the kernel by value
// (no copy, no synchronisation); D <= kRopeMaxD (limits.h).
void rope_forward(Dt dt, const void* x, const int32_t* pos, const double* inv_freq, int64_t T,
                  int64_t NH, int64_t D, bool inverse, void* y, cudaStream_t stream, bool interleaved = false);

// ---- attention (flash-style: online softmax, f32 lse saved, never S x S) ------------------
// Layouts as kernels/cpu/attention.h: q, out [B, S, NH, D]; k, v [B, S, NKV, D]; lse
// [B, NH, S]. Key j is visible to query i iff (!causal || j <= i), (window == 0 || i - j <
// window) (a sliding window: causal only) and, when doc is not null (document ids, i32
// [B, S]), doc[b, j] == doc[b, i]. softcap c > 0 caps each score s = scale q.k to c tanh(s / c)
// (kernels/cpu/attention.h); 0: none. alibi: ALiBi's slopes a_h, each score of query i and key j
// gains a_h (j - i) (kernels/cpu/attention.h); n = 0: none. Not with a softcap (the op refuses).
struct AttentionDims {
  int64_t B, S, NH, NKV, D;
};
// The slopes of the NH query heads, passed to the kernels by value (no copy, no
// synchronisation): n = NH <= kAttentionMaxAlibiHeads (limits.h), or 0 for none.
struct AlibiSlopes {
  int32_t n = 0;
  float a[kAttentionMaxAlibiHeads] = {};
};
// The reference kernels; the ops run ops/cuda_attention.cpp's blocks. D <= kAttentionMaxD (limits.h): a larger
// D throws std::invalid_argument before any launch.
void attention_forward(Dt dt, const AttentionDims& d, bool causal, int64_t window, float scale, float softcap,
                       const void* q, const void* k, const void* v, const int32_t* doc, void* out, float* lse,
                       cudaStream_t stream, const AlibiSlopes& alibi = {});
// delta: B * NH * S floats of scratch (rowsum(dout * out)). Writes dq, dk, dv.
void attention_backward(Dt dt, const AttentionDims& d, bool causal, int64_t window, float scale, float softcap,
                        const void* q, const void* k, const void* v, const void* out, const float* lse,
                        const void* dout, const int32_t* doc, void* dq, void* dk, void* dv, float* delta,
                        cudaStream_t stream, const AlibiSlopes& alibi = {});

// ---- attention by blocks of queries (ops/cuda_attention.cpp runs the gemms; these are its
// row kernels; kernels/cuda/attention_blocks.h has the layout) ------------------------------
// A block: batch b, kv head g, queries [q0, q0 + nq) of its G = NH / NKV query heads, keys
// [k0, k0 + nk). Its score rows are r = hh * nq + ii (query head g * G + hh, query q0 + ii),
// nk scores each, already scaled (not yet capped, nor biased: the row kernels apply softcap and
// ALiBi).
struct AttentionBlock {
  int64_t b, g, q0, nq, k0, nk;
};
// probs[r, j] = exp(cap(scores[r, j]) - lse) for visible keys, 0 for the others; lse of each row
// into lse [B, NH, S].
void attention_block_softmax(Dt dt, const AttentionDims& d, const AttentionBlock& blk, bool causal, int64_t window,
                             float softcap, const int32_t* doc, const float* scores, void* probs, float* lse,
                             cudaStream_t stream, const AlibiSlopes& alibi = {});
// Attention sinks (gpt-oss's; kernels/cpu/attention.h): the logits sinks [NH] folded into out
// [B, S, NH, Dv] and lse [B, NH, S] in place; and their gradient dsinks [NH] (written) from the
// folded out and lse, of dtype dt as sinks, deterministic.
void attention_sinks_forward(Dt dt, int64_t B, int64_t S, int64_t NH, int64_t Dv, const void* sinks, void* out,
                             float* lse, cudaStream_t stream);
void attention_sinks_backward(Dt dt, int64_t B, int64_t S, int64_t NH, int64_t Dv, const void* sinks, const void* out,
                              const float* lse, const void* dout, void* dsinks, cudaStream_t stream);
// Llama 4's chunks and temperature (kernels/cpu/attention_llama4.h): ids [B, S], the chunks' runs
// as document ids, from the op's document ids (null: one document per row); and out [B, S, W] = x
// with position i's W numbers scaled by f_i (out may be x).
void attention_chunk_documents(const int32_t* documents, int64_t B, int64_t S, int64_t chunk, int32_t* ids,
                               cudaStream_t stream);
void attention_temperature(Dt dt, const void* x, int64_t B, int64_t S, int64_t W, float floor_scale, float attn_scale,
                           void* out, cudaStream_t stream);
// delta [B, NH, S] = rowsum(dout * out).
void attention_delta(Dt dt, const AttentionDims& d, const void* out, const void* dout, float* delta,
                     cudaStream_t stream);
// p = exp(cap(scores) - lse) (0 where not visible) into probs, and dS = p (dprobs - delta) cap'(scores)
// into dscores, both of dtype dt.
void attention_block_backward_probs(Dt dt, const AttentionDims& d, const AttentionBlock& blk, bool causal,
                                    int64_t window, float softcap, const int32_t* doc, const float* scores,
                                    const float* dprobs, const float* lse, const float* delta, void* probs,
                                    void* dscores, cudaStream_t stream, const AlibiSlopes& alibi = {});
// dk, dv rows of kv head g in batch b ([B, S, NKV, D], dtype dt) from the f32 sums [S, D].
void attention_store_kv_grads(Dt dt, const AttentionDims& d, int64_t b, int64_t g, const float* dk_sum,
                              const float* dv_sum, void* dk, void* dv, cudaStream_t stream);

// ---- cuDNN's fused attention (ops/cuda_attention_cudnn.cpp): its THD layout and Stats ---------
// The THD arrays of packed documents (kernels/cuda/cudnn_attention.h: cudnn_thd_layout is the
// specification, these the same arrays on the device) from the document ids doc (i32 [B, S])
// into seq_len (i32 [max_documents]) and offset_qo, offset_kv, offset_stats (i64
// [max_documents + 1] each); more than max_documents documents set *error to
// kErrorTooManyDocuments. One block, no host sync.
void cudnn_thd_layout(const int32_t* doc, int64_t B, int64_t S, int64_t NH, int64_t NKV, int64_t D,
                      int64_t max_documents, int32_t* seq_len, int64_t* offset_qo, int64_t* offset_kv,
                      int64_t* offset_stats, int* error, cudaStream_t stream);
// lse [B, NH, S] to cuDNN's token-major Stats [B S, NH] of the THD layout, and back.
void lse_to_token_major(const float* lse, int64_t B, int64_t S, int64_t NH, float* stats, cudaStream_t stream);
void lse_from_token_major(const float* stats, int64_t B, int64_t S, int64_t NH, float* lse, cudaStream_t stream);

// ---- cross entropy over rows of V logits (of dtype logits_dt: the op's, or f32 for a
// chunk of linear_cross_entropy's logits) ----------------------------------------------------
// lse[t] for every row; row_loss[t] = lse - logit[label] for labelled rows, else 0.
// softcap c > 0: of the capped logits c tanh(logit / c), made on the fly (kernels/cpu/fused.h).
void cross_entropy_rows(Dt logits_dt, const void* logits, const int32_t* labels, int64_t T,
                        int64_t V, int32_t ignore_index, float* lse, float* row_loss, int* error,
                        cudaStream_t stream, float softcap = 0.0f);
// loss_sum[] = sum of row_loss (double, fixed order).
void sum_rows(const float* row_loss, int64_t T, float* loss_sum, cudaStream_t stream);
// dlogits[t, :] = dloss (softmax(logits[t]) - onehot(label[t])) on labelled rows, 0 else.
// dlogits (of out_dt) may be logits itself when the dtypes match. softcap c > 0: through the
// cap, times 1 - tanh^2(logit / c).
void cross_entropy_backward_rows(Dt logits_dt, const void* logits, const int32_t* labels,
                                 const float* lse, const float* dloss /* [] */, int64_t T, int64_t V,
                                 int32_t ignore_index, Dt out_dt, void* dlogits, cudaStream_t stream,
                                 float softcap = 0.0f);

// ---- optimizer (fp32 master weights and moments; src/train/adamw.h has the maths) ---------
// One AdamW (decoupled) or Adam (L2) step on n elements, in torch's operation order with
// the same fused multiply-adds as train::adamw_step; the scalars (1 - lr wd, -lr / bc1,
// sqrt(bc2), ...) come computed in double and rounded to fp32 by the caller. compute_copy,
// if not null, receives the updated parameter rounded to bf16 (the copy the step reads).
struct AdamWScalars {
  float decay;        // 1 - lr * wd (decoupled), or 1
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float step_size;    // -lr / bc1
  float sqrt_bc2;     // sqrt(1 - beta2^step)
  float eps;
  float l2;           // wd for Adam's L2 term (decoupled = false), else 0
};
void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamWScalars& s, void* compute_copy_bf16, cudaStream_t stream);
// acc[i] (+)= g[i] in fp32: a step's bf16 (or f32) gradient into its fp32 accumulator.
void accumulate_grad(Dt dt, const void* g, int64_t n, float* acc, bool overwrite, cudaStream_t stream);

// ---- the device-resident optimizer step (train/device_step.h; kernels in optimizer.cu) -----
// What the step leaves on the device for the host to read once, at its end: the sum of the
// micro batches' losses, the gradient norm before clipping, clip_grad_norm's coefficient, and
// whether the update was applied (1) or skipped (0: a non-finite loss or norm).
struct StepStatus {
  double loss_sum;
  double norm;
  float coef;
  int applied;
};
// One piece of one gradient: n elements of dtype dt at src, added into the fp32 sum at dst.
struct GradChunk {
  const void* src;
  float* dst;
  int64_t n;
};
// For each of `count` chunks (a device array; one block each): dst[i] = (overwrite ? 0 :
// dst[i]) + fp32(src[i]) * scale, the fp32 product rounded once. scale is 1/g for a step of g
// micro batches (the mean gradient, as the host path's).
void accumulate_grad_chunks(Dt dt, const GradChunk* chunks, int64_t count, float scale, bool overwrite,
                            cudaStream_t stream);
// status->loss_sum (=, when first; else +=) the f32 scalar *loss, in double.
void add_loss(const float* loss, StepStatus* status, bool first, cudaStream_t stream);
// The gradient norm in two launches with a fixed grid, so its value does not depend on the
// device (bitwise the same on every run, and after a resume): kNormBlocks partial sums of g^2
// in double, each over a fixed strided set of elements and reduced in a fixed tree; then one
// block adds the partials in a fixed tree, takes the root, and sets the coefficient
// min(max_norm / (norm + 1e-6), 1) rounded to fp32 (max_norm <= 0: no clipping, 1), and
// applied = isfinite(norm) && no data error was found (*error == 0, the executor's flag: the
// host path stops before its update there too) && (check_loss: isfinite(loss_sum); across
// ranks the norm alone decides, as it is the same on every rank after the gradients'
// reduction, so that every rank updates or none does).
constexpr int kNormBlocks = 1024;
void grad_norm_partials(const float* g, int64_t n, double* partials /* kNormBlocks */, cudaStream_t stream);
void grad_norm_finish(const double* partials, double max_norm, bool check_loss, const int* error, StepStatus* status,
                      cudaStream_t stream);
// adamw_step (above) on the flat buffers with grad * status->coef as the gradient (rounded to
// fp32 once, as train::adamw_step's grad_scale), and only when status->applied; the updated
// parameter rounded to bf16 into compute_copy_bf16.
void adamw_flat(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamWScalars& s, const StepStatus* status, void* compute_copy_bf16, cudaStream_t stream);

}  // namespace autosp::cuda
