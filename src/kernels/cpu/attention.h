// Flash-style attention on the CPU: tiled over queries and keys with an online softmax.
// Neither direction ever holds an S x S matrix; the only saved statistic is the
// log-sum-exp of each query row, and the extra memory is O(S) (see *_workspace_floats).
//
// Layouts (row-major, contiguous):
//   q, dq            : [B, S, NH, D]
//   k, dk            : [B, S, NKV, D]      NH % NKV == 0; query head h reads kv head h / (NH / NKV)
//   out, dout        : [B, S, NH, Dv]      (Dv = dims.dv(): D unless the values' differs)
//   v, dv            : [B, S, NKV, Dv]
//   lse              : [B, NH, S]          lse[b,h,i] = log sum_j exp(scale * q_i . k_j) over allowed j
//   documents        : [B, S] int32, optional (null: one document), non-decreasing along S
// causal: query i attends to keys j <= i. With documents, query i attends only to keys of
// its own document (documents[b, j] == documents[b, i]): packed samples. Tiles whose query
// and key rows lie in different documents are skipped, so the work is the sum over
// documents of their squared lengths, not S^2. window W > 0 (a sliding window, causal
// only): query i attends only to keys i - W < j <= i (W keys, itself included, as Hugging
// Face's Mistral); tiles wholly outside the window are skipped both ways (forward and
// backward), so the work is about S x W, not S^2 / 2. Documents and window combine.
// softcap c > 0 (Gemma 2's attn_logit_softcapping): each score s = scale q_i . k_j becomes
// c tanh(s / c) before the softmax (lse too is of the capped scores), and the backward's dS
// is multiplied by d(c tanh(s / c))/ds = 1 - tanh^2(s / c); 0: no cap.
// alibi (BLOOM's and MPT's ALiBi; null: none): the slopes a_h of the NH query heads; score
// s_ij gains a_h (j - i), a bias that is 0 on the diagonal and more negative the farther the
// key (Press et al.'s relative form: the softmax is that of BLOOM's a_h j and MPT's
// a_h (j - S_max + 1), which differ from it by a constant per row, and the scores stay small
// at any length). A constant bias: the backward's dS is unchanged. Not with a softcap.
// sinks (gpt-oss's; null: none): a learned logit z_h per query head that joins every row's
// softmax as one more key whose value is zero, so a row may give its keys less than all of
// its weight. The flash kernels run without it, and attention_sinks_* fold it in after:
//   lse' = log(exp(lse) + exp(z_h)),  out' = out exp(lse - lse')
// The backward then runs on out' and lse' as they are: exp(s - lse') are the true
// probabilities, and the sink, with no value, adds nothing to dP = dO . V nor to the rows'
// D_i = dO'_i . O'_i = sum_j P_ij dP_ij. Its own gradient is the softmax's:
//   dz_h = sum_{b,i} P_sink (0 - D_i) = -sum_{b,i} exp(z_h - lse'_bhi) dO'_bhi . O'_bhi.
#pragma once
#include <cstdint>

namespace autosp::cpu {

// Dv: the values' head dim (and so out's and dout's, dv's), where it is not the queries' and
// keys' D (DeepSeek-V3's latent attention: 128 against 192); 0: D.
struct AttentionDims {
  int64_t B, S, NH, NKV, D;
  int64_t Dv = 0;
  int64_t dv() const { return Dv > 0 ? Dv : D; }
};

// Workspace sizes in floats for a run on `threads` threads; the caller allocates them
// (so the executor's allocator counts them) and passes them in. O(threads * (tile^2 + S*D)).
// The tile shapes, and so the sizes, depend on the active instruction set (isa.h).
int64_t attention_forward_workspace_floats(const AttentionDims& dims, int threads);
int64_t attention_backward_workspace_floats(const AttentionDims& dims, int threads);

// Both run on `threads` OpenMP threads (the count the workspace was sized for); the
// results are bitwise the same for every thread count.
void attention_forward(const AttentionDims& dims, bool causal, float scale, const float* q,
                       const float* k, const float* v, float* out, float* lse, float* workspace,
                       int threads, const int32_t* documents = nullptr, int64_t window = 0,
                       float softcap = 0.0f, const float* alibi = nullptr);

// Writes (does not accumulate into) dq, dk, dv.
void attention_backward(const AttentionDims& dims, bool causal, float scale, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const float* dout, float* dq, float* dk, float* dv, float* workspace,
                        int threads, const int32_t* documents = nullptr, int64_t window = 0,
                        float softcap = 0.0f, const float* alibi = nullptr);

// The sinks' fold (above) of attention_forward's out and lse, in place; sinks [NH] are this
// call's query heads'.
void attention_sinks_forward(const AttentionDims& dims, const float* sinks, float* out, float* lse, int threads);
// dsinks [NH] (written) from the folded out and lse; bitwise the same on any thread count.
void attention_sinks_backward(const AttentionDims& dims, const float* sinks, const float* out, const float* lse,
                              const float* dout, float* dsinks, int threads);

// Which schedule attention_backward uses on `threads` threads (attention.cpp): the split
// one (over key blocks, then query blocks) when B x NH heads are too few to keep every
// thread busy, else the fused one (over heads). Both give bitwise the same results.
bool attention_backward_is_split(const AttentionDims& dims, int threads);

// The first (b, i) with documents[b, i] < documents[b, i - 1], or -1 when every row is
// non-decreasing (what the kernels require).
int64_t first_unsorted_document(const AttentionDims& dims, const int32_t* documents);

// The plain O(S^2)-memory reference, in double, for tests: same layouts.
void attention_forward_reference(const AttentionDims& dims, bool causal, double scale,
                                 const double* q, const double* k, const double* v, double* out,
                                 double* lse, const int32_t* documents = nullptr, int64_t window = 0,
                                 double softcap = 0.0, const double* alibi = nullptr,
                                 const double* sinks = nullptr);
void attention_backward_reference(const AttentionDims& dims, bool causal, double scale,
                                  const double* q, const double* k, const double* v,
                                  const double* dout, double* dq, double* dk, double* dv,
                                  const int32_t* documents = nullptr, int64_t window = 0,
                                  double softcap = 0.0, const double* alibi = nullptr,
                                  const double* sinks = nullptr, double* dsinks = nullptr);

}  // namespace autosp::cpu
