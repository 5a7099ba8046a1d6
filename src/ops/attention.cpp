// Causal (or full) attention with grouped KV heads, flash-style: the forward saves only
// the log-sum-exp of each query row, and neither direction holds an S x S matrix. An
// optional last operand, document ids i32 [B, S] (packed samples), keeps each query within
// its own document; an optional attribute `window` W (causal only; Mistral's sliding window)
// keeps query i to the W keys i - W < j <= i. The window counts sequence positions, so it
// is the same whether the sequence was whole from the start or gathered by the autosp pass's
// all-to-all; with documents, both limits apply. An optional attribute `softcap` c > 0
// (Gemma 2's attn_logit_softcapping) caps each score s = scale q.k to c tanh(s / c) before the
// softmax. An optional attribute `alibi` (BLOOM's and MPT's ALiBi) lists the slopes a_h of the
// model's query heads: each score gains a_h (j - i) (kernels/cpu/attention.h). Under sequence
// parallelism a rank attends over 1/P of the heads, the rank's part of the list in the sp
// group: the autosp pass sets `alibi_split` P, and the kernels read the slopes from the rank's
// offset (so the graph stays the same on every rank). An optional attribute `sinks` 1 (gpt-oss's
// attention sinks) says operand 3 is a learned logit per query head, [NH] of q's dtype, that
// joins each row's softmax as a key of zero value (kernels/cpu/attention.h); under sequence
// parallelism `sinks_split` P, as alibi_split, and the backward's dsinks holds the rank's heads'
// part (zeros elsewhere: the sum over the sp group, which every parameter's gradient gets, is
// the whole). Llama 4's: an optional attribute `chunk` C > 0 (causal only) keeps each query to the
// keys of its own chunk of C positions, and `temperature` [F, A] scales query row i by
// log1p(floor((i + 1) / F)) A + 1 before the scores (kernels/cpu/attention_llama4.h: the kernels
// take the chunks as document ids and the scaled queries as queries). Both count positions of the
// whole sequence, as the window does.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "comm/communicator.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_llama4.h"
#include "ops/op.h"
#include "kernels/cuda/attention_blocks.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/limits.h"
#ifdef AUTOSP_HAVE_CUDA
#include "ops/cuda_attention.h"
#endif

namespace autosp {

namespace {

// q [B, S, NH, D], k [B, S, NKV, D] and v [B, S, NKV, Dv] (Dv: D, or the values' own head
// dim, DeepSeek-V3's latent attention's), of one floating dtype
cpu::AttentionDims attention_dims(const Types& in) {
  for (int i = 0; i < 3; ++i) {
    const char* name = i == 0 ? "q" : i == 1 ? "k" : "v";
    require_floating(in[i], name);
    require_same_dtype(in[0], "q", in[i], name);
    require_rank(in[i], 4, i == 0 ? "q [B, S, NH, D]" : i == 1 ? "k [B, S, NKV, D]" : "v [B, S, NKV, Dv]");
  }
  const Shape &q = in[0].shape, &k = in[1].shape, &v = in[2].shape;
  require(k[0] == v[0] && k[1] == v[1] && k[2] == v[2] && v[3] > 0, "k and v must agree on B, S and NKV, got k ",
          shape_str(k), " and v ", shape_str(v));
  require(q[0] == k[0] && q[1] == k[1] && q[3] == k[3], "q and k must agree on B, S and D");
  require(k[2] > 0 && q[2] % k[2] == 0, "query heads NH=", q[2],
          " must be a multiple of kv heads NKV=", k[2]);
  return {q[0], q[1], q[2], k[2], q[3], v[3] == q[3] ? 0 : v[3]};
}
// out [B, S, NH, Dv] of q's dtype
TensorType attention_out(const Types& in, const cpu::AttentionDims& d) {
  return {in[0].dtype, {d.B, d.S, d.NH, d.dv()}};
}

// The optional document ids (operand `at` when present): i32 [B, S] of q's B and S.
bool check_documents(const Types& in, size_t at, const cpu::AttentionDims& d) {
  require(in.size() == at || in.size() == at + 1, "expected ", at, " operands, or ", at + 1,
          " with document ids, got ", in.size());
  if (in.size() == at) return false;
  require_dtype(in[at], DType::i32, "documents");
  require(in[at].shape == Shape{d.B, d.S}, "documents must be i32[", d.B, ", ", d.S, "] (q's B and S), got ",
          shape_str(in[at].shape));
  return true;
}

// The kernels need each sequence's document ids non-decreasing (packing gives them so).
const int32_t* documents_operand(const KernelArgs& a, size_t at, const cpu::AttentionDims& d) {
  if (a.inputs.size() <= at) return nullptr;
  const int32_t* docs = a.in<int32_t>(static_cast<int>(at));
  if (const int64_t bad = cpu::first_unsorted_document(d, docs); bad >= 0)
    user_error("attention: document ids must not decrease along the sequence, but batch row ", bad / d.S,
               " has ", docs[bad - 1], " then ", docs[bad], " at position ", bad % d.S);
  return docs;
}

// Whether operand 3 is the sinks (attribute "sinks" 1); the document ids then come after it.
bool has_sinks(const Attrs& attrs) { return attrs.get_int("sinks", 0) != 0; }
int64_t sinks_split_of(const Attrs& attrs) { return attrs.get_int("sinks_split", 1); }
// Where the optional document ids are: after q, k, v (or the backward's six) and the sinks.
size_t documents_at(const Attrs& attrs, size_t first) { return first + (has_sinks(attrs) ? 1 : 0); }

// The sinks operand (at `at`, where has_sinks): [NH] of q's dtype, NH all of the model's query
// heads (sinks_split P of this op's).
void check_sinks(const Types& in, size_t at, const Attrs& attrs, const cpu::AttentionDims& d) {
  require(!attrs.has("sinks_split") || has_sinks(attrs), "'sinks_split' without 'sinks'");
  if (!has_sinks(attrs)) return;
  const int64_t split = sinks_split_of(attrs);
  require(split >= 1, "'sinks_split' must be >= 1, got ", split);
  require(in.size() > at, "'sinks' 1 needs the sinks operand after q, k and v");
  require_same_dtype(in[0], "q", in[at], "sinks");
  require(in[at].shape == Shape{d.NH * split}, "sinks must be [", d.NH * split, "] (one logit per query head",
          split > 1 ? str(" of the ", split, " ranks'") : std::string(), "), got ", shape_str(in[at].shape));
}

// The first of this rank's NH query heads in the model's: 0, or with a split P (the autosp
// pass's exchange: the sp group of P ranks attends over P parts of the heads) the rank's part's.
int64_t first_local_head(const KernelArgs& a, int64_t NH, int64_t split, const char* what) {
  if (split == 1) return 0;
  AUTOSP_CHECK(a.comm && a.comm->size() == split, "attention: ", what, " ", split, " needs the sp group of ", split,
               " ranks");
  return a.comm->rank() * NH;
}

// The sliding window W (attribute "window", absent: 0 = none).
int64_t window_of(const Attrs& attrs) { return attrs.get_int("window", 0); }
// Llama 4's chunk C (attribute "chunk", absent: 0 = none).
int64_t chunk_of(const Attrs& attrs) { return attrs.get_int("chunk", 0); }
// Llama 4's temperature tuning [F, A] (attribute "temperature"), or none.
const std::vector<double>* temperature_of(const Attrs& attrs) {
  return attrs.has("temperature") ? &attrs.get_floats("temperature") : nullptr;
}
// Whether the kernels take document ids: the op's, or the chunks' (attention_llama4.h).
bool kernels_take_documents(const Types& in, const Attrs& attrs, size_t at) {
  return in.size() > at || chunk_of(attrs) > 0;
}
// The logit softcap c (attribute "softcap", absent: 0 = none).
float softcap_of(const Attrs& attrs) { return float(attrs.get_float("softcap", 0.0)); }

// ALiBi's slopes as the attribute holds them: every head of the model (alibi_split parts), or none.
const std::vector<double>* alibi_of(const Attrs& attrs) {
  return attrs.has("alibi") ? &attrs.get_floats("alibi") : nullptr;
}
int64_t alibi_split_of(const Attrs& attrs) { return attrs.get_int("alibi_split", 1); }

void check_alibi(const Attrs& attrs, int64_t NH) {
  if (attrs.has("alibi_split")) require(attrs.has("alibi"), "'alibi_split' without 'alibi'");
  const std::vector<double>* alibi = alibi_of(attrs);
  if (!alibi) return;
  const int64_t split = alibi_split_of(attrs);
  require(split >= 1, "'alibi_split' must be >= 1, got ", split);
  require(int64_t(alibi->size()) == NH * split, "'alibi' has ", alibi->size(), " slopes for ", NH * split,
          " query heads (NH = ", NH,
          split > 1 ? str(" on each of alibi_split = ", split, " ranks") : std::string(), ")");
  for (double a : *alibi) require(std::isfinite(a), "an ALiBi slope that is not finite: ", a);
  require(attrs.get_float("softcap", 0.0) == 0.0, "'alibi' with a 'softcap': no model has both, and the kernels "
                                                  "do not combine them");
}

// The slopes of this rank's NH heads, as the kernels take them (empty: no ALiBi). Split: the
// heads are the rank's part of the sp group's (KernelArgs::comm, given for alibi_split).
std::vector<float> local_alibi(const KernelArgs& a, int64_t NH) {
  const std::vector<double>* alibi = alibi_of(*a.attrs);
  if (!alibi) return {};
  const int64_t first = first_local_head(a, NH, alibi_split_of(*a.attrs), "alibi_split");
  return std::vector<float>(alibi->begin() + first, alibi->begin() + first + NH);
}

void check_attrs(const Attrs& attrs) {
  require(attrs.has("scale") && attrs.get_float("scale") > 0, "needs a positive 'scale'");
  require(attrs.has("causal"), "needs 'causal' (0 or 1)");
  require(window_of(attrs) >= 0, "'window' must be positive (or 0: none), got ", window_of(attrs));
  require(window_of(attrs) == 0 || attrs.get_int("causal") != 0, "a 'window' needs causal attention");
  const double cap = attrs.get_float("softcap", 0.0);
  require(std::isfinite(cap) && cap >= 0, "'softcap' must be positive (or 0: none), got ", cap);
  require(chunk_of(attrs) >= 0, "'chunk' must be positive (or 0: none), got ", chunk_of(attrs));
  require(chunk_of(attrs) == 0 || attrs.get_int("causal") != 0, "a 'chunk' needs causal attention");
  if (const std::vector<double>* t = temperature_of(attrs))
    require(t->size() == 2 && std::isfinite((*t)[0]) && (*t)[0] > 0 && std::isfinite((*t)[1]),
            "'temperature' must be [floor_scale, attn_scale], floor_scale > 0, both finite, got ", t->size(),
            " numbers");
}

// The op's own CPU scratch after the kernels' (float offsets; -1: none): the chunks' document ids
// [B, S] (i32) and the tempered queries [B, S, NH, D].
struct CpuScratch {
  int64_t ids = -1, q = -1, floats = 0;
};
CpuScratch cpu_scratch(const cpu::AttentionDims& d, const Attrs& attrs, int threads, bool backward) {
  CpuScratch s;
  s.floats = backward ? cpu::attention_backward_workspace_floats(d, threads)
                      : cpu::attention_forward_workspace_floats(d, threads);
  if (chunk_of(attrs) > 0) s.ids = s.floats, s.floats += d.B * d.S;
  if (temperature_of(attrs)) s.q = s.floats, s.floats += d.B * d.S * d.NH * d.D;
  return s;
}
// The document ids the kernels take: the op's (null: none), or with a chunk the runs' ids
// (attention_llama4.h), written to `ids` [B, S].
const int32_t* kernel_documents(const int32_t* documents, const cpu::AttentionDims& d, int64_t chunk, int32_t* ids) {
  if (chunk == 0) return documents;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t i = 0; i < d.S; ++i)
      ids[b * d.S + i] = attention_llama4::chunk_document_id(documents ? documents + b * d.S : nullptr, i, chunk);
  return ids;
}
// out [B, S, W] = x with position i's W numbers scaled by the temperature f_i (out may be x).
void temper_rows(const float* x, int64_t B, int64_t S, int64_t W, const std::vector<double>& t, float* out) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < S; ++i) {
      const float f = attention_llama4::temperature(i, float(t[0]), float(t[1]));
      const int64_t at = (b * S + i) * W;
      for (int64_t e = 0; e < W; ++e) out[at + e] = x[at + e] * f;
    }
}

double attention_flops(const cpu::AttentionDims& d, const Attrs& attrs, bool backward) {
  // Each S x S x D matmul is 2 S^2 D FLOPs per head over the (query, key) pairs: S^2, causal
  // about half; a window W < S leaves W (W + 1) / 2 + (S - W) W of the causal S (S + 1) / 2.
  // The forward's two are q.k (D) and P v (Dv); the backward's five q.k, dO v (Dv), dV, dK and dQ.
  const double S = double(d.S), W = double(window_of(attrs));
  double pairs = attrs.get_int("causal") != 0 ? 0.5 * S * S : S * S;
  if (W > 0 && W < S) pairs *= (W * (W + 1) / 2 + (S - W) * W) / (S * (S + 1) / 2);
  if (const double C = double(chunk_of(attrs)); C > 0 && C < S) pairs *= (C + 1) / (S + 1);  // S / C chunks
  const double dims = backward ? 3.0 * double(d.D) + 2.0 * double(d.dv()) : double(d.D) + double(d.dv());
  return 2.0 * d.B * d.NH * pairs * dims;
}

}  // namespace

namespace {
// The cuda kernels run cuDNN's fused SDPA or the blocks of queries, as cuda::choose_attention
// says for the node's key (kernels/cuda/cudnn_attention.h) and AUTOSP_ATTENTION. Forward and
// backward ask with keys that differ only in `backward`, so a node's two directions choose alike.
cuda::CudnnSdpaKey cuda_attention_key(const Types& qkv, const Attrs& attrs, bool documents, bool backward,
                                      int device = 0) {
  const cpu::AttentionDims d = attention_dims(qkv);
  return cuda::cudnn_sdpa_key(backward, qkv[0].dtype == DType::bf16 ? cuda::Dt::bf16 : cuda::Dt::f32, d.B, d.S, d.NH,
                              d.NKV, d.D, attrs.get_int("causal") != 0, window_of(attrs),
                              float(attrs.get_float("scale")), documents, device, softcap_of(attrs),
                              attrs.has("alibi"), chunk_of(attrs));
}
cuda::AttentionChoice cuda_attention_choice(const cuda::CudnnSdpaKey& key, bool built_with_cudnn) {
  cuda::AttentionMode mode;
  const char* env = std::getenv("AUTOSP_ATTENTION");
  if (!cuda::parse_attention_mode(env, &mode))
    user_error("AUTOSP_ATTENTION=", env, ": expected auto, blocks or cudnn (the cuda backend's attention)");
  cuda::AttentionChoice choice = cuda::choose_attention(mode, built_with_cudnn, key);
  if (choice.error)
    user_error("AUTOSP_ATTENTION=cudnn, but attention (", cuda::cudnn_sdpa_key_str(key), ") cannot run on cuDNN: ",
               choice.why);
  return choice;
}
// The cuda kernels take one head dim. Where v's (Dv) is not q's and k's (D), they run on
// copies of the operands of the smaller one zero-padded to the larger, P: a zero column adds 0
// to every score, and gives output (and gradient) columns that are sliced off when copied back.
// The copies come first in the op's workspace, each [rows, P] at a 256-byte boundary, in the
// order of CudaPadding's fields; the kernels' own scratch follows.
struct CudaPadding {
  int64_t P = 0;                          // 0: none (Dv == D)
  bool qk = false, values = false;        // which side is padded: q, k (D < P) or v, out (Dv < P)
  int64_t q = -1, k = -1, v = -1, out = -1, dout = -1, dq = -1, dk = -1, dv = -1, bytes = 0;  // offsets
};
CudaPadding cuda_padding(const cpu::AttentionDims& d, int64_t esize, bool backward) {
  CudaPadding p;
  if (d.dv() == d.D) return p;
  p.P = std::max(d.D, d.dv());
  p.qk = d.D < p.P;
  p.values = d.dv() < p.P;
  const int64_t rows_q = d.B * d.S * d.NH, rows_kv = d.B * d.S * d.NKV;
  auto piece = [&](int64_t rows) {
    const int64_t at = p.bytes;
    p.bytes += cuda_aligned(rows * p.P * esize);
    return at;
  };
  if (p.qk) {
    p.q = piece(rows_q), p.k = piece(rows_kv);
    if (backward) p.dq = piece(rows_q), p.dk = piece(rows_kv);
  } else {
    p.v = piece(rows_kv), p.out = piece(rows_q);
    if (backward) p.dout = piece(rows_q), p.dv = piece(rows_kv);
  }
  return p;
}
// q, k, v as the kernels see them: each head dim P where padded.
Types cuda_padded_types(const Types& qkv, const CudaPadding& p) {
  Types t(qkv.begin(), qkv.begin() + 3);
  if (p.P > 0)
    for (TensorType& x : t) x.shape[3] = p.P;
  return t;
}
// The op's own pieces after the padded copies (byte offsets from their end; -1: none): the chunks'
// document ids [B, S] (i32) and the tempered queries [B, S, NH, D] (D: the padded one, where q is).
struct CudaExtras {
  int64_t ids = -1, q = -1, bytes = 0;
};
CudaExtras cuda_extras(const cpu::AttentionDims& given, const CudaPadding& pad, int64_t esize, const Attrs& attrs) {
  CudaExtras x;
  if (chunk_of(attrs) > 0) x.ids = x.bytes, x.bytes += cuda_aligned(given.B * given.S * 4);
  if (temperature_of(attrs))
    x.q = x.bytes, x.bytes += cuda_aligned(given.B * given.S * given.NH * (pad.qk ? pad.P : given.D) * esize);
  return x;
}
// Scratch of the cuda kernels: the padded copies (CudaPadding), the op's extras (CudaExtras), then
// one block of queries' scores (kernels/cuda/attention_blocks.h), for the block size the kernels take themselves
// (cuda_attention.h, rows 0); where cuDNN runs, the larger of that and cuDNN's (a run may fall
// back to the blocks). Planned as if this build had cuDNN, so that `autosp plan` plans on any
// machine what a GPU build runs.
int64_t cuda_attention_workspace(const Types& qkv, const Attrs& attrs, bool documents, bool backward) {
  const int64_t esize = qkv[0].dtype == DType::bf16 ? 2 : 4;
  const CudaPadding pad = cuda_padding(attention_dims(qkv), esize, backward);
  const int64_t own = pad.bytes + cuda_extras(attention_dims(qkv), pad, esize, attrs).bytes;
  const Types kernels = cuda_padded_types(qkv, pad);
  const cpu::AttentionDims d = attention_dims(kernels);
  const int64_t blocks = cuda::attention_block_layout(backward, d.B, d.S, d.NH, d.NKV, d.D, esize).bytes;
  const cuda::CudnnSdpaKey key = cuda_attention_key(kernels, attrs, documents, backward);
  if (cuda_attention_choice(key, true).impl != cuda::AttentionImplementation::cudnn) return own + blocks;
  return own + std::max(blocks, cuda::cudnn_sdpa_layout(key).bytes);
}
// The cuda kernels take the slopes by value: at most kAttentionMaxAlibiHeads query heads (a
// rank's).
void cuda_check_attention(const Types& qkv, const Attrs& attrs) {
  if (attrs.has("alibi"))
    require(qkv[0].shape.size() == 4 && qkv[0].shape[2] <= cuda::kAttentionMaxAlibiHeads,
            "the cuda kernels take ALiBi slopes for at most ", cuda::kAttentionMaxAlibiHeads, " query heads, got ",
            shape_str(qkv[0].shape));
}
#ifdef AUTOSP_HAVE_CUDA
cuda::AttentionDims cuda_dims(const cpu::AttentionDims& d) { return {d.B, d.S, d.NH, d.NKV, d.D}; }
// This rank's slopes as the cuda kernels take them (n = 0: none).
cuda::AlibiSlopes cuda_alibi(const KernelArgs& a, int64_t NH) {
  cuda::AlibiSlopes s;
  const std::vector<float> slopes = local_alibi(a, NH);
  AUTOSP_CHECK(int64_t(slopes.size()) <= cuda::kAttentionMaxAlibiHeads, "ALiBi slopes of ", slopes.size(), " heads");
  s.n = int32_t(slopes.size());
  std::copy(slopes.begin(), slopes.end(), s.a);
  return s;
}
int cuda_current_device() {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice", "attention");
  return device;
}
// dst [rows, P] = src [rows, w] and zeros after (the padded copy); back: src [rows, P]'s first
// w columns into dst [rows, w].
void cuda_pad_rows(void* dst, const void* src, int64_t rows, int64_t w, int64_t P, int64_t esize,
                   const CudaContext& c) {
  check_cuda(cudaMemsetAsync(dst, 0, size_t(rows * P * esize), c.stream), "cudaMemsetAsync", "attention");
  check_cuda(cudaMemcpy2DAsync(dst, size_t(P * esize), src, size_t(w * esize), size_t(w * esize), size_t(rows),
                               cudaMemcpyDeviceToDevice, c.stream),
             "cudaMemcpy2DAsync", "attention");
}
void cuda_unpad_rows(void* dst, const void* src, int64_t rows, int64_t w, int64_t P, int64_t esize,
                     const CudaContext& c) {
  check_cuda(cudaMemcpy2DAsync(dst, size_t(w * esize), src, size_t(P * esize), size_t(w * esize), size_t(rows),
                               cudaMemcpyDeviceToDevice, c.stream),
             "cudaMemcpy2DAsync", "attention");
}
// The document ids and q as the kernels take them, in the op's extras after the padded copies
// (ws + pad.bytes): the op's ids (operand `doc_at`, where given) or, with a chunk, the runs' ids
// (attention_llama4.h); q, or with a temperature the tempered queries (of q as the kernels see it:
// padded where it is; d the kernels' dims, g the op's). Returns where the kernels' scratch starts.
void* cuda_kernel_operands(const KernelArgs& a, const CudaContext& c, cuda::Dt dt, size_t doc_at,
                           const cpu::AttentionDims& g, const cpu::AttentionDims& d, const CudaPadding& pad,
                           char* ws, const void** q, const int32_t** doc) {
  const CudaExtras ex = cuda_extras(g, pad, cuda::dt_size(dt), *a.attrs);
  char* extra = ws + pad.bytes;
  *doc = a.inputs.size() > doc_at ? a.in<int32_t>(static_cast<int>(doc_at)) : nullptr;
  if (const int64_t chunk = chunk_of(*a.attrs); chunk > 0) {
    int32_t* ids = reinterpret_cast<int32_t*>(extra + ex.ids);
    cuda::attention_chunk_documents(*doc, d.B, d.S, chunk, ids, c.stream);
    *doc = ids;
  }
  if (const std::vector<double>* t = temperature_of(*a.attrs)) {
    cuda::attention_temperature(dt, *q, d.B, d.S, d.NH * d.D, float((*t)[0]), float((*t)[1]), extra + ex.q, c.stream);
    *q = extra + ex.q;
  }
  return extra + ex.bytes;
}
void cuda_attention(const KernelArgs& a, const CudaContext& c) {
  const Types given = {*a.in_types[0], *a.in_types[1], *a.in_types[2]};
  const cpu::AttentionDims g = attention_dims(given);
  const int64_t es = cuda::dt_size(cuda_in_dt(a, 0)), rows_q = g.B * g.S * g.NH, rows_kv = g.B * g.S * g.NKV;
  const CudaPadding pad = cuda_padding(g, es, false);
  const Types qkv = cuda_padded_types(given, pad);
  const cpu::AttentionDims d = attention_dims(qkv);
  char* ws = static_cast<char*>(a.workspace);
  const void *q = a.in<void>(0), *k = a.in<void>(1), *v = a.in<void>(2);
  void* out = a.out<void>(0);
  if (pad.qk) {
    cuda_pad_rows(ws + pad.q, q, rows_q, g.D, pad.P, es, c), q = ws + pad.q;
    cuda_pad_rows(ws + pad.k, k, rows_kv, g.D, pad.P, es, c), k = ws + pad.k;
  } else if (pad.values) {
    cuda_pad_rows(ws + pad.v, v, rows_kv, g.dv(), pad.P, es, c), v = ws + pad.v;
    out = ws + pad.out;
  }
  const int32_t* doc = nullptr;
  void* scratch = cuda_kernel_operands(a, c, cuda_in_dt(a, 0), documents_at(*a.attrs, 3), g, d, pad, ws, &q, &doc);
  const cuda::CudnnSdpaKey key = cuda_attention_key(qkv, *a.attrs, doc != nullptr, false, cuda_current_device());
  const cuda::AttentionChoice choice = cuda_attention_choice(key, cuda_cudnn_attention_built());
  if (!(choice.impl == cuda::AttentionImplementation::cudnn &&
        cuda_attention_forward_cudnn(c, key, choice.forced, q, k, v, doc, out, a.out<float>(1), scratch)))
    cuda_attention_forward_blocks(c, cuda_in_dt(a, 0), cuda_dims(d), a.attrs->get_int("causal") != 0,
                                  window_of(*a.attrs), float(a.attrs->get_float("scale")), softcap_of(*a.attrs), q, k,
                                  v, doc, out, a.out<float>(1), scratch, 0, cuda_alibi(a, d.NH));
  if (pad.values) cuda_unpad_rows(a.out<void>(0), out, rows_q, g.dv(), pad.P, es, c);
  // the sinks, folded into the result whichever kernels made it (the backward then runs on it as it is)
  if (has_sinks(*a.attrs)) {
    const int64_t first = first_local_head(a, g.NH, sinks_split_of(*a.attrs), "sinks_split");
    cuda::attention_sinks_forward(cuda_in_dt(a, 0), g.B, g.S, g.NH, g.dv(), a.in<char>(3) + first * es,
                                  a.out<void>(0), a.out<float>(1), c.stream);
  }
}
// attention_backward(dout, q, k, v, out, lse[, doc]) -> (dq, dk, dv)
void cuda_attention_backward(const KernelArgs& a, const CudaContext& c) {
  const Types given = {*a.in_types[1], *a.in_types[2], *a.in_types[3]};
  const cpu::AttentionDims g = attention_dims(given);
  const int64_t es = cuda::dt_size(cuda_in_dt(a, 1)), rows_q = g.B * g.S * g.NH, rows_kv = g.B * g.S * g.NKV;
  const CudaPadding pad = cuda_padding(g, es, true);
  const Types qkv = cuda_padded_types(given, pad);
  const cpu::AttentionDims d = attention_dims(qkv);
  char* ws = static_cast<char*>(a.workspace);
  const void *q = a.in<void>(1), *k = a.in<void>(2), *v = a.in<void>(3), *out = a.in<void>(4), *dout = a.in<void>(0);
  void *dq = a.out<void>(0), *dk = a.out<void>(1), *dv = a.out<void>(2);
  if (pad.qk) {
    cuda_pad_rows(ws + pad.q, q, rows_q, g.D, pad.P, es, c), q = ws + pad.q;
    cuda_pad_rows(ws + pad.k, k, rows_kv, g.D, pad.P, es, c), k = ws + pad.k;
    dq = ws + pad.dq, dk = ws + pad.dk;
  } else if (pad.values) {
    cuda_pad_rows(ws + pad.v, v, rows_kv, g.dv(), pad.P, es, c), v = ws + pad.v;
    cuda_pad_rows(ws + pad.out, out, rows_q, g.dv(), pad.P, es, c), out = ws + pad.out;
    cuda_pad_rows(ws + pad.dout, dout, rows_q, g.dv(), pad.P, es, c), dout = ws + pad.dout;
    dv = ws + pad.dv;
  }
  const int32_t* doc = nullptr;
  void* scratch = cuda_kernel_operands(a, c, cuda_in_dt(a, 1), documents_at(*a.attrs, 6), g, d, pad, ws, &q, &doc);
  const cuda::CudnnSdpaKey key = cuda_attention_key(qkv, *a.attrs, doc != nullptr, true, cuda_current_device());
  const cuda::AttentionChoice choice = cuda_attention_choice(key, cuda_cudnn_attention_built());
  if (!(choice.impl == cuda::AttentionImplementation::cudnn &&
        cuda_attention_backward_cudnn(c, key, choice.forced, q, k, v, out, a.in<float>(5), dout, doc, dq, dk, dv,
                                      scratch)))
    cuda_attention_backward_blocks(c, cuda_in_dt(a, 1), cuda_dims(d), a.attrs->get_int("causal") != 0,
                                   window_of(*a.attrs), float(a.attrs->get_float("scale")), softcap_of(*a.attrs), q, k,
                                   v, out, a.in<float>(5), dout, doc, dq, dk, dv, scratch, 0, cuda_alibi(a, d.NH));
  if (pad.qk) {
    cuda_unpad_rows(a.out<void>(0), dq, rows_q, g.D, pad.P, es, c);
    cuda_unpad_rows(a.out<void>(1), dk, rows_kv, g.D, pad.P, es, c);
  } else if (pad.values) {
    cuda_unpad_rows(a.out<void>(2), dv, rows_kv, g.dv(), pad.P, es, c);
  }
  if (const std::vector<double>* t = temperature_of(*a.attrs))  // dq = f_i times the kernels' gradient
    cuda::attention_temperature(cuda_in_dt(a, 1), a.out<void>(0), g.B, g.S, g.NH * g.D, float((*t)[0]), float((*t)[1]),
                                a.out<void>(0), c.stream);
  if (has_sinks(*a.attrs)) {  // the rank's heads' part of dsinks, zeros elsewhere (as the CPU's)
    const int64_t first = first_local_head(a, g.NH, sinks_split_of(*a.attrs), "sinks_split");
    check_cuda(cudaMemsetAsync(a.outputs[3], 0, size_t(a.out_types[3]->shape[0] * es), c.stream), "cudaMemsetAsync",
               "attention_backward");
    cuda::attention_sinks_backward(cuda_in_dt(a, 1), g.B, g.S, g.NH, g.dv(), a.in<char>(6) + first * es,
                                   a.in<void>(4), a.in<float>(5), a.in<void>(0),
                                   static_cast<char*>(a.outputs[3]) + first * es, c.stream);
  }
}
#endif
}  // namespace

// attention(q, k, v[, sinks][, documents]) {causal, scale[, window, softcap, alibi, alibi_split, sinks,
//   sinks_split, chunk, temperature]} -> (out [B, S, NH, Dv], lse [B, NH, S])
// documents (i32 [B, S], non-decreasing along S): query i sees key j only when both are in
// one document. window W > 0 (causal only): query i sees keys i - W < j <= i. The cost rule
// counts the work of one document (an upper bound: it does not see the ids), within the
// window.
// out has q's dtype; lse is f32 for bf16 operands too, as FlashAttention's softmax_lse: the
// backward rebuilds the probabilities exp(s - lse) from it, and an lse near 10 rounded to
// bf16 (8 significant bits) is off by up to 0.03, scaling its row's probabilities by 3%.
extern const OpDef attention_op = {
    .num_inputs = -1,
    .num_outputs = 2,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      require(in.size() >= 3, "expected q, k, v, optional sinks and document ids, got ", in.size(), " operands");
      cpu::AttentionDims d = attention_dims(in);
      check_sinks(in, 3, attrs, d);
      check_documents(in, documents_at(attrs, 3), d);
      check_attrs(attrs);
      check_alibi(attrs, d.NH);
      return {attention_out(in, d), {DType::f32, {d.B, d.NH, d.S}}};
    },
    .cost = [](const Types& in, const Types&, const Attrs& attrs) {
      return Cost{attention_flops(attention_dims(in), attrs, false), 0};
    },
    // FlashAttention backward: recomputes the probabilities from q, k and lse.
    .grad = [](GradContext& c) {
      AUTOSP_CHECK(c.dout[1] < 0, "nothing differentiates through the log-sum-exp");
      // the sinks and the document ids, where given, follow as they do the forward's q, k, v
      std::vector<ValueId> ins = {c.dout[0], c.in(0), c.in(1), c.in(2), c.out(0), c.out(1)};
      for (size_t i = 3; i < c.node.inputs.size(); ++i) ins.push_back(c.in(int(i)));
      auto d = c.b.emit(OpKind::attention_backward, ins, c.attrs());
      for (int i = 0; i < 3; ++i)
        if (c.needs[i]) c.din[i] = d[i];
      if (has_sinks(c.attrs()) && c.needs[3]) c.din[3] = d[3];
    },
    .cpu = [](const KernelArgs& a) {
      cpu::AttentionDims d = attention_dims({*a.in_types[0], *a.in_types[1], *a.in_types[2]});
      const std::vector<float> alibi = local_alibi(a, d.NH);
      float* ws = static_cast<float*>(a.workspace);
      const CpuScratch scratch = cpu_scratch(d, *a.attrs, a.threads, false);
      const int32_t* docs = kernel_documents(documents_operand(a, documents_at(*a.attrs, 3), d), d, chunk_of(*a.attrs),
                                             reinterpret_cast<int32_t*>(ws + scratch.ids));
      const float* q = a.in(0);
      if (const std::vector<double>* t = temperature_of(*a.attrs))
        temper_rows(q, d.B, d.S, d.NH * d.D, *t, ws + scratch.q), q = ws + scratch.q;
      cpu::attention_forward(d, a.attrs->get_int("causal") != 0, float(a.attrs->get_float("scale")), q, a.in(1),
                             a.in(2), a.out(0), a.out(1), ws, a.threads, docs, window_of(*a.attrs),
                             softcap_of(*a.attrs), alibi.empty() ? nullptr : alibi.data());
      if (has_sinks(*a.attrs))
        cpu::attention_sinks_forward(d, a.in(3) + first_local_head(a, d.NH, sinks_split_of(*a.attrs), "sinks_split"),
                                     a.out(0), a.out(1), a.threads);
    },
    .cpu_workspace_bytes = [](const Types& in, const Attrs& attrs, int threads) -> int64_t {
      return cpu_scratch(attention_dims(in), attrs, threads, false).floats * 4;
    },
    // Every query needs every key: the sequence must be whole, so heads are split instead
    // (the autosp pass exchanges q, k, v to shard(2) before and the output back after, and
    // gathers the document ids whole).
    .shard = [](const Shardings& in, const Types&, const Attrs& attrs) -> Shardings {
      // ALiBi on split heads needs each rank's part of the slopes: the autosp pass's exchange
      // sets alibi_split; heads split any other way would read the first heads' slopes.
      require(!(is_shard(in[0]) && in[0].dim == 2 && attrs.has("alibi") && !attrs.has("alibi_split")),
              "attention with ALiBi on heads split other than by the autosp pass's exchange");
      for (size_t i = 0; i < 3; ++i)
        require(in[i] == in[0] && !is_partial(in[i]) && (!is_shard(in[i]) || in[i].dim == 0 || in[i].dim == 2),
                "attention needs the whole sequence: q, k, v must be split alike on B or heads, got ",
                sharding_str(in[i]));
      // sinks on split heads: likewise, each rank's part, which only the exchange's sinks_split reads
      if (has_sinks(attrs))
        require(is_replicated(in[3]) && !(is_shard(in[0]) && in[0].dim == 2 && !attrs.has("sinks_split")),
                "attention's sinks must be replicated, and on heads split by the autosp pass's exchange, got ",
                sharding_str(in[3]), " with q ", sharding_str(in[0]));
      if (const size_t at = documents_at(attrs, 3); in.size() == at + 1)
        require(is_replicated(in[at]) || (in[at] == in[0] && in[0].dim == 0),
                "attention needs the whole sequence's document ids: replicated, or split on B as q is, got ",
                sharding_str(in[at]));
      if (is_shard(in[0])) return {in[0], shard(in[0].dim == 2 ? 1 : 0)};  // lse is [B, NH, S]
      return {in[0], in[0]};
    },
    .cpu_per_isa = true,
    .cuda = {.name = "attention_blocks_forward",
             .run = AUTOSP_CUDA_RUN(cuda_attention),
             .workspace_bytes = [](const Types& in, const Types&, const Attrs& attrs) -> int64_t {
               return cuda_attention_workspace({in[0], in[1], in[2]}, attrs, kernels_take_documents(in, attrs, documents_at(attrs, 3)),
                                               false);
             },
             .check = [](const Types& in, const Attrs& attrs) { cuda_check_attention(in, attrs); }},
};

// attention_backward(dout, q, k, v, out, lse[, sinks][, documents]) {as the forward's}
//   -> (dq, dk, dv[, dsinks]), each of its operand's type (so of q's dtype); lse is f32; sinks and
// documents as the forward's; out and lse the forward's (with the sinks folded in).
extern const OpDef attention_backward_op = {
    .num_inputs = -1,
    .num_outputs = -1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      require(in.size() >= 6, "expected dout, q, k, v, out, lse, optional sinks and document ids, got ", in.size(),
              " operands");
      cpu::AttentionDims d = attention_dims({in[1], in[2], in[3]});
      Types qkv_sinks = {in[1], in[2], in[3]};  // (the sinks, where given, as the forward has them)
      if (in.size() > 6) qkv_sinks.push_back(in[6]);
      check_sinks(qkv_sinks, 3, attrs, d);
      check_documents(in, documents_at(attrs, 6), d);
      check_attrs(attrs);
      check_alibi(attrs, d.NH);
      const TensorType out = attention_out({in[1], in[2], in[3]}, d);
      require(in[0] == out && in[4] == out, "dout and out must be ", type_str(out), " (q's B, S, NH and dtype, v's "
              "head dim), got ", type_str(in[0]), " and ", type_str(in[4]));
      require(in[5] == TensorType{DType::f32, {d.B, d.NH, d.S}}, "lse must be f32[B, NH, S]");
      if (has_sinks(attrs)) return {in[1], in[2], in[3], in[6]};
      return {in[1], in[2], in[3]};
    },
    .cost = [](const Types& in, const Types&, const Attrs& attrs) {
      return Cost{attention_flops(attention_dims({in[1], in[2], in[3]}), attrs, true), 0};
    },
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) {
      cpu::AttentionDims d = attention_dims({*a.in_types[1], *a.in_types[2], *a.in_types[3]});
      const std::vector<float> alibi = local_alibi(a, d.NH);
      float* ws = static_cast<float*>(a.workspace);
      const CpuScratch scratch = cpu_scratch(d, *a.attrs, a.threads, true);
      const int32_t* docs = kernel_documents(documents_operand(a, documents_at(*a.attrs, 6), d), d, chunk_of(*a.attrs),
                                             reinterpret_cast<int32_t*>(ws + scratch.ids));
      // tempered: the kernels' queries were q f_i, so dq = f_i times their gradient
      const std::vector<double>* temperature = temperature_of(*a.attrs);
      const float* q = a.in(1);
      if (temperature) temper_rows(q, d.B, d.S, d.NH * d.D, *temperature, ws + scratch.q), q = ws + scratch.q;
      cpu::attention_backward(d, a.attrs->get_int("causal") != 0, float(a.attrs->get_float("scale")), q, a.in(2),
                              a.in(3), a.in(4), a.in(5), a.in(0), a.out(0), a.out(1), a.out(2), ws, a.threads, docs,
                              window_of(*a.attrs), softcap_of(*a.attrs), alibi.empty() ? nullptr : alibi.data());
      if (temperature) temper_rows(a.out(0), d.B, d.S, d.NH * d.D, *temperature, a.out(0));
      if (has_sinks(*a.attrs)) {
        // the rank's heads' part of dsinks; the other heads' are other ranks' (zeros here)
        const int64_t first = first_local_head(a, d.NH, sinks_split_of(*a.attrs), "sinks_split");
        float* dsinks = a.out(3);
        std::fill_n(dsinks, a.out_types[3]->shape[0], 0.0f);
        cpu::attention_sinks_backward(d, a.in(6) + first, a.in(4), a.in(5), a.in(0), dsinks + first, a.threads);
      }
    },
    .cpu_workspace_bytes = [](const Types& in, const Attrs& attrs, int threads) -> int64_t {
      return cpu_scratch(attention_dims({in[1], in[2], in[3]}), attrs, threads, true).floats * 4;
    },
    .cpu_per_isa = true,
    .cuda = {.name = "attention_blocks_backward",
             .run = AUTOSP_CUDA_RUN(cuda_attention_backward),
             // blocks: delta [B, NH, S], then one block's scores and the f32 sums of dk and dv
             .workspace_bytes = [](const Types& in, const Types&, const Attrs& attrs) -> int64_t {
               return cuda_attention_workspace({in[1], in[2], in[3]}, attrs, kernels_take_documents(in, attrs, documents_at(attrs, 6)),
                                               true);
             },
             .check = [](const Types& in, const Attrs& attrs) { cuda_check_attention({in[1], in[2], in[3]}, attrs); }},
};

}  // namespace autosp
