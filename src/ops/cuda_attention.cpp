#include "ops/cuda_attention.h"

#include <algorithm>

namespace autosp {

namespace {

int64_t elem_bytes(cuda::Dt dt) { return dt == cuda::Dt::bf16 ? 2 : 4; }

// Element `index` of a buffer of dtype dt.
const void* at(const void* p, int64_t index, cuda::Dt dt) {
  return static_cast<const char*>(p) + index * elem_bytes(dt);
}
void* at(void* p, int64_t index, cuda::Dt dt) { return static_cast<char*>(p) + index * elem_bytes(dt); }
template <typename T>
T* piece(void* workspace, int64_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(workspace) + offset);
}

// The keys a block of queries [q0, q0 + nq) can see: causal stops at its last query, a
// window starts W - 1 before its first.
cuda::AttentionBlock block_of(const cuda::AttentionDims& d, bool causal, int64_t window, int64_t b, int64_t g,
                              int64_t q0, int64_t rows) {
  const int64_t nq = std::min(rows, d.S - q0);
  const int64_t k1 = causal ? q0 + nq : d.S;
  const int64_t k0 = causal && window > 0 ? std::max<int64_t>(0, q0 - window + 1) : 0;
  return {b, g, q0, nq, k0, k1 - k0};
}

// The workspace layout of a run, its block size with it: `rows` queries a block, or for rows 0
// the sizing rule's, through the same call the op's workspace rule makes (ops/attention.cpp).
cuda::AttentionBlockLayout layout_of(bool backward, cuda::Dt dt, const cuda::AttentionDims& d, int64_t rows) {
  return rows > 0 ? cuda::attention_block_layout(backward, d.B, d.S, d.NH, d.NKV, d.D, elem_bytes(dt), rows)
                  : cuda::attention_block_layout(backward, d.B, d.S, d.NH, d.NKV, d.D, elem_bytes(dt));
}

// The first key row a block reads of k or v ([B, S, NKV, D]): key blk.k0 of kv head blk.g.
const void* block_keys(const void* kv, const cuda::AttentionDims& d, const cuda::AttentionBlock& blk, cuda::Dt dt) {
  return at(kv, ((blk.b * d.S + blk.k0) * d.NKV + blk.g) * d.D, dt);
}

}  // namespace

void cuda_attention_forward_blocks(const CudaContext& c, cuda::Dt dt, const cuda::AttentionDims& d, bool causal,
                                   int64_t window, float scale, float softcap, const void* q, const void* k,
                                   const void* v, const int32_t* doc, void* out, float* lse, void* workspace,
                                   int64_t rows, const cuda::AlibiSlopes& alibi) {
  if (d.B * d.S * d.NH == 0) return;
  const int64_t G = d.NH / d.NKV, D = d.D;
  const cuda::AttentionBlockLayout l = layout_of(false, dt, d, rows);
  float* scores = piece<float>(workspace, l.scores);
  void* probs = piece<char>(workspace, l.probs);
  const char* op = "attention";
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t g = 0; g < d.NKV; ++g)
      for (int64_t q0 = 0; q0 < d.S; q0 += l.rows) {
        const cuda::AttentionBlock blk = block_of(d, causal, window, b, g, q0, l.rows);
        const void* kg = block_keys(k, d, blk, dt);
        const void* vg = block_keys(v, d, blk, dt);
        for (int64_t hh = 0; hh < G; ++hh)  // scores = scale q_h k_g^T
          cuda_gemm(c, dt, cuda::Dt::f32, false, true, blk.nq, blk.nk, D, scale,
                    at(q, ((b * d.S + q0) * d.NH + g * G + hh) * D, dt), d.NH * D, kg, d.NKV * D, 0.0f,
                    scores + hh * blk.nq * blk.nk, blk.nk, op);
        cuda::attention_block_softmax(dt, d, blk, causal, window, softcap, doc, scores, probs, lse, c.stream, alibi);
        for (int64_t hh = 0; hh < G; ++hh)  // out_h = P_h v_g
          cuda_gemm(c, dt, dt, false, false, blk.nq, D, blk.nk, 1.0f, at(probs, hh * blk.nq * blk.nk, dt), blk.nk, vg,
                    d.NKV * D, 0.0f, at(out, ((b * d.S + q0) * d.NH + g * G + hh) * D, dt), d.NH * D, op);
      }
}

void cuda_attention_backward_blocks(const CudaContext& c, cuda::Dt dt, const cuda::AttentionDims& d, bool causal,
                                    int64_t window, float scale, float softcap, const void* q, const void* k,
                                    const void* v, const void* out, const float* lse, const void* dout,
                                    const int32_t* doc, void* dq, void* dk, void* dv, void* workspace, int64_t rows,
                                    const cuda::AlibiSlopes& alibi) {
  if (d.B * d.S * d.NH == 0) return;
  const int64_t G = d.NH / d.NKV, D = d.D;
  const cuda::AttentionBlockLayout l = layout_of(true, dt, d, rows);
  float* delta = piece<float>(workspace, l.delta);
  float* scores = piece<float>(workspace, l.scores);
  float* dprobs = piece<float>(workspace, l.dprobs);
  void* probs = piece<char>(workspace, l.probs);
  void* dscores = piece<char>(workspace, l.dscores);
  float* dk_sum = piece<float>(workspace, l.dk);
  float* dv_sum = piece<float>(workspace, l.dv);
  const char* op = "attention_backward";
  cuda::attention_delta(dt, d, out, dout, delta, c.stream);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t g = 0; g < d.NKV; ++g) {
      check_cuda(cudaMemsetAsync(dk_sum, 0, size_t(4 * d.S * D), c.stream), "cudaMemsetAsync", op);
      check_cuda(cudaMemsetAsync(dv_sum, 0, size_t(4 * d.S * D), c.stream), "cudaMemsetAsync", op);
      for (int64_t q0 = 0; q0 < d.S; q0 += l.rows) {
        const cuda::AttentionBlock blk = block_of(d, causal, window, b, g, q0, l.rows);
        const void* kg = block_keys(k, d, blk, dt);
        const void* vg = block_keys(v, d, blk, dt);
        const int64_t cells = blk.nq * blk.nk;
        for (int64_t hh = 0; hh < G; ++hh) {
          const int64_t row = ((b * d.S + q0) * d.NH + g * G + hh) * D;
          // scores = scale q_h k_g^T (as the forward's), dP = dout_h v_g^T
          cuda_gemm(c, dt, cuda::Dt::f32, false, true, blk.nq, blk.nk, D, scale, at(q, row, dt), d.NH * D, kg,
                    d.NKV * D, 0.0f, scores + hh * cells, blk.nk, op);
          cuda_gemm(c, dt, cuda::Dt::f32, false, true, blk.nq, blk.nk, D, 1.0f, at(dout, row, dt), d.NH * D, vg,
                    d.NKV * D, 0.0f, dprobs + hh * cells, blk.nk, op);
        }
        cuda::attention_block_backward_probs(dt, d, blk, causal, window, softcap, doc, scores, dprobs, lse, delta,
                                             probs, dscores, c.stream, alibi);
        for (int64_t hh = 0; hh < G; ++hh) {
          const int64_t row = ((b * d.S + q0) * d.NH + g * G + hh) * D;
          const void* ds_h = at(dscores, hh * cells, dt);
          const void* p_h = at(probs, hh * cells, dt);
          // dq_h = scale dS_h k_g; dk_g += scale dS_h^T q_h; dv_g += P_h^T dout_h
          cuda_gemm(c, dt, dt, false, false, blk.nq, D, blk.nk, scale, ds_h, blk.nk, kg, d.NKV * D, 0.0f,
                    at(dq, row, dt), d.NH * D, op);
          cuda_gemm(c, dt, cuda::Dt::f32, true, false, blk.nk, D, blk.nq, scale, ds_h, blk.nk, at(q, row, dt),
                    d.NH * D, 1.0f, dk_sum + blk.k0 * D, D, op);
          cuda_gemm(c, dt, cuda::Dt::f32, true, false, blk.nk, D, blk.nq, 1.0f, p_h, blk.nk, at(dout, row, dt),
                    d.NH * D, 1.0f, dv_sum + blk.k0 * D, D, op);
        }
      }
      cuda::attention_store_kv_grads(dt, d, b, g, dk_sum, dv_sum, dk, dv, c.stream);
    }
}

}  // namespace autosp
