// CPU kernels of the fused row-wise ops. T is the number of rows (all leading dims
// flattened: T = B * S). All buffers are contiguous row-major fp32 unless typed otherwise.
// Kernels overwrite their outputs (never accumulate) and are multi-threaded with OpenMP
// over rows; reductions over rows (dw, dW) are deterministic (no atomics, fixed order).
#pragma once
#include <cstdint>

namespace autosp::cpu {

// ---- embedding: out[t, :] = W[tokens[t], :] --------------------------------------------
// tokens are already validated to lie in [0, V) by the caller.
void embedding_forward(const float* W, const int32_t* tokens, int64_t T, int64_t H, float* out);
// dW[v, :] = sum over t with tokens[t] == v of dy[t, :]   (a scatter-add; dW fully written)
void embedding_backward(const float* dy, const int32_t* tokens, int64_t T, int64_t H, int64_t V,
                        float* dW);

// ---- rms_norm: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps) ----------------------
void rms_norm_forward(const float* x, const float* w, int64_t T, int64_t H, float eps, float* y,
                      float* rstd /* [T] */);
// scratch: rms_norm_backward_scratch_doubles(T, H) doubles (the per-chunk partial dw), or
// null to allocate it here.
void rms_norm_backward(const float* dy, const float* x, const float* w, const float* rstd,
                       int64_t T, int64_t H, float* dx, float* dw /* [H], summed over T */,
                       double* scratch = nullptr);
int64_t rms_norm_backward_scratch_doubles(int64_t T, int64_t H);

// ---- rope (rotate-half, Hugging Face Llama convention) ---------------------------------
// x: [T, NH, D] with row t at position pos[t]; D even; inv_freq: [D/2].
// For i < D/2, angle = pos * inv_freq[i]:
//   y[i]       = x[i] cos - x[i + D/2] sin
//   y[i + D/2] = x[i + D/2] cos + x[i] sin
// inverse = true rotates by -angle (the transpose, used for the gradient).
// interleaved = true: the pairs are (x[2i], x[2i + 1]) instead (GPT-J's layout, GLM's, Cohere's):
//   y[2i] = x[2i] cos - x[2i + 1] sin,  y[2i + 1] = x[2i + 1] cos + x[2i] sin
// y may be x (both halves of a head are read before either is written).
// Angles are computed in double and rounded once, so y does not depend on the row split.
// table: rope_table_floats(D) floats per OpenMP thread (one row's cos and sin), or null to
// allocate it here.
void rope_forward(const float* x, const int32_t* pos, const double* inv_freq, int64_t T,
                  int64_t NH, int64_t D, bool inverse, float* y, float* table = nullptr, bool interleaved = false);
inline int64_t rope_table_floats(int64_t D) { return D; }

// inv_freq[i] = 1 / theta^(2i / D), then scaled as transformers' modeling_rope_utils does:
//  - linear: inv_freq / factor.
//  - llama3 (_compute_llama3_parameters): wavelen = 2 pi / inv_freq;
//      wavelen > orig / low_freq_factor  -> inv_freq / factor
//      wavelen < orig / high_freq_factor -> inv_freq
//      otherwise smooth = (orig / wavelen - low) / (high - low),
//                inv_freq = (1 - smooth) * inv_freq / factor + smooth * inv_freq
//  - yarn (_compute_yarn_parameters): the correction range [low, high] of dimensions that
//    make beta_fast and beta_slow rotations over orig positions (floor/ceil when truncate),
//    clamped to [0, D - 1]; ramp(i) = clamp((i - low) / (high - low), 0, 1);
//      inv_freq = inv_freq / factor * ramp(i) + inv_freq * (1 - ramp(i)).
//    (Its attention factor is not a frequency: the model applies it, RopeOptions.)
struct RopeScaling {
  enum Kind { none, linear, llama3, yarn } kind = none;
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192.0;
  double beta_fast = 32.0, beta_slow = 1.0;
  bool truncate = true;
};
void rope_inv_freq(int64_t D, double theta, const RopeScaling& scaling, double* inv_freq);

// ---- silu / swiglu ---------------------------------------------------------------------
// Elementwise by SIMD blocks, each block's operands loaded before its results are stored:
// any result may be (exactly) one of the operands.
void silu_forward(const float* x, int64_t n, float* y);
// dx = dy * s(x) * (1 + x (1 - s(x)))
void silu_backward(const float* dy, const float* x, int64_t n, float* dx);
// out = silu(gate) * up
void swiglu_forward(const float* gate, const float* up, int64_t n, float* out);
void swiglu_backward(const float* dy, const float* gate, const float* up, int64_t n, float* dgate,
                     float* dup);

// ---- cross entropy over V classes, rows with label == ignore_index contribute 0 ---------
// loss_sum = sum over valid t of (lse[t] - logits[t, label[t]]); lse[t] written for every row.
// Labels of valid rows are already validated to lie in [0, V).
// softcap c > 0 (Gemma 2's final_logit_softcapping): the loss is of the capped logits
// c tanh(logits / c), computed on the fly from the raw ones (which stay as they are), and lse is
// theirs; the backward's dlogits is then d loss / d raw logits, the softmax's gradient times
// 1 - tanh^2(logits / c). 0: none.
void cross_entropy_forward(const float* logits, const int32_t* labels, int64_t T, int64_t V,
                           int32_t ignore_index, float* loss_sum /* [1] */, float* lse /* [T] */,
                           float softcap = 0.0f);
// dlogits[t, :] = dloss_sum * (softmax(logits[t]) - onehot(label[t])) for valid rows, 0 else.
// dlogits may be logits (in place: linear_cross_entropy's chunks).
void cross_entropy_backward(const float* dloss_sum /* [1] */, const float* logits,
                            const int32_t* labels, const float* lse, int64_t T, int64_t V,
                            int32_t ignore_index, float* dlogits, float softcap = 0.0f);

}  // namespace autosp::cpu
