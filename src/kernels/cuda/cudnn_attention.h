// The attention ops on cuDNN's fused SDPA (ops/cuda_attention_cudnn.cpp, through cudnn-frontend):
// the host logic, as plain C++ without CUDA or cuDNN headers, so that the `lower` pass and
// plan_memory size the workspace on machines without nvcc or cuDNN too, and the tests check it
// everywhere. What is here is the specification the device side follows:
//  - CudnnSdpaKey: everything that changes a cuDNN graph; one graph is built per key and process.
//  - cudnn_thd_layout: packed documents as cuDNN's THD ("ragged") layout. The device computes the
//    same arrays from the device document ids (kernels.h, cudnn_thd_layout), with no host sync.
//  - choose_attention: whether a node runs on cuDNN or on the blocks (ops/cuda_attention.cpp).
//  - cudnn_sdpa_layout: the workspace a cuDNN run uses, fixed before any device exists.
//
// How the op's tensors map onto cuDNN's [batch, heads, seq, dim] tensors: q, out [B, S, NH, D]
// and k, v [B, S, NKV, D] are bound with strides (BSHD, no transposes; NKV < NH is cuDNN's GQA,
// no repeat). lse [B, NH, S] is cuDNN's Stats (natural-log log-sum-exp of the scaled scores,
// what ours is) with strides {NH S, S, 1}. causal: a diagonal band with right bound 0 at the
// top-left diagonal (key j <= query i). window W: left bound W (cuDNN keeps key j when
// j + W > i, i.e. i - W < j, as ours). Documents: each maximal run of one id within a batch row
// is one cuDNN "sequence" of the THD layout (below), and the masks apply within it.
#pragma once
#include <algorithm>
#include <bit>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/dtype.h"

namespace autosp::cuda {

// ---- documents as THD -------------------------------------------------------------------------
// cuDNN's THD layout packs variable-length sequences: a graph is built for a batch of
// `max_documents` sequences of at most S tokens, and per run the device gives each one's length
// (seq_len, i32 [max_documents]) and where it starts in each tensor (ragged offsets, i64
// [max_documents + 1], in elements; the last one is the end of the tensor). The sequences here are
// the documents of all batch rows in order: q's tokens [B * S] are already packed, document k
// starting at token t_k, so its offset is t_k NH D in q and out, t_k NKV D in k and v. Entries
// past the last document have length 0, which cuDNN skips ("certain batches can be skipped by
// setting the actual seqlen of the corresponding batch to 0", cudnn-frontend's Attention.md),
// and offsets at the end.
//
// Stats is token-major in THD: cuDNN reads and writes it as [tokens, NH] (strides {NH S, 1, NH}
// with offset t_k NH), not as lse's [B, NH, S]; the device transposes between the two
// (kernels.h, lse_to_token_major / lse_from_token_major).
//
// The graph's batch must be fixed when the graph is built, but the number of documents is data.
// A bound of one document per token (B S) is always enough, but cuDNN launches its work per
// (sequence, head, tile of S): B S empty sequences would cost more than the attention. So the
// bound is kCudnnDocumentsPerRow per batch row (fewer for a shorter S), and a batch with more
// documents than that is a data error after the step (ErrorCode kErrorTooManyDocuments), naming
// AUTOSP_ATTENTION=blocks, which has no bound.
// Chunked attention (Llama 4's chunk C > 0; ops/attention.cpp) cuts a row's documents at every
// chunk, up to ceil(S / C) - 1 more sequences per row, which the bound adds.
constexpr int64_t kCudnnDocumentsPerRow = 128;
inline int64_t cudnn_max_documents(int64_t B, int64_t S, int64_t chunk = 0) {
  const int64_t cuts = chunk > 0 ? (S + chunk - 1) / chunk - 1 : 0;
  return B * std::min(S, kCudnnDocumentsPerRow + cuts);
}

struct CudnnThdLayout {
  int64_t documents = 0;              // runs of one id found; > max_documents: too many for the graph
  std::vector<int32_t> seq_len;       // [max_documents]: tokens of document k; 0 past the last
  std::vector<int64_t> offset_qo;     // [max_documents + 1]: t_k NH D (q, out, dout, dq)
  std::vector<int64_t> offset_kv;     // [max_documents + 1]: t_k NKV D (k, v, dk, dv)
  std::vector<int64_t> offset_stats;  // [max_documents + 1]: t_k NH (token-major stats)
};

// doc: the op's document ids, i32 [B, S] (non-decreasing along S, as the op requires). A run
// never crosses a batch row, even where the next row starts with the same id. With more than
// max_documents runs, the first max_documents are laid out (each with its own length) and the
// rest are left out: the result is wrong and the device flags it.
inline CudnnThdLayout cudnn_thd_layout(const int32_t* doc, int64_t B, int64_t S, int64_t NH, int64_t NKV, int64_t D,
                                       int64_t max_documents) {
  const int64_t T = B * S;
  std::vector<int64_t> starts;  // t_k of every run, and T after the last
  for (int64_t t = 0; t < T; ++t)
    if (t % S == 0 || doc[t] != doc[t - 1]) starts.push_back(t);
  CudnnThdLayout l;
  l.documents = static_cast<int64_t>(starts.size());
  starts.push_back(T);
  const int64_t n = std::min(l.documents, max_documents);
  l.seq_len.assign(static_cast<size_t>(max_documents), 0);
  l.offset_qo.assign(static_cast<size_t>(max_documents + 1), T * NH * D);
  l.offset_kv.assign(static_cast<size_t>(max_documents + 1), T * NKV * D);
  l.offset_stats.assign(static_cast<size_t>(max_documents + 1), T * NH);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t t = starts[static_cast<size_t>(k)];
    l.seq_len[static_cast<size_t>(k)] = static_cast<int32_t>(starts[static_cast<size_t>(k + 1)] - t);
    l.offset_qo[static_cast<size_t>(k)] = t * NH * D;
    l.offset_kv[static_cast<size_t>(k)] = t * NKV * D;
    l.offset_stats[static_cast<size_t>(k)] = t * NH;
  }
  return l;
}

// ---- the graph cache key ----------------------------------------------------------------------
// Everything a cuDNN SDPA graph (ops/cuda_attention_cudnn.cpp) is built from: the graph and its
// execution plan hold the dims, strides, masks, scale and THD batch, so a change of any of them
// is another graph. Make keys with cudnn_sdpa_key (it normalises the window and sets the THD
// batch); two keys of one attention are equal.
struct CudnnSdpaKey {
  bool backward = false;
  Dt dtype = Dt::bf16;
  int64_t B = 0, S = 0, NH = 0, NKV = 0, D = 0;
  bool causal = false;
  int64_t window = 0;  // 0: none. A window of S or more keeps every causal key: 0 as well.
  float scale = 0;     // baked into the graph (attn_scale as a value)
  float softcap = 0;   // 0: none; a cap the graphs here do not build (cudnn_sdpa_unsupported)
  bool alibi = false;  // ALiBi slopes, which the graphs here do not take (cudnn_sdpa_unsupported)
  bool documents = false;
  int64_t max_documents = 0;  // the THD graph's batch (documents only, else 0)
  int device = 0;             // a plan is built for one device
  bool operator==(const CudnnSdpaKey&) const = default;
};

inline CudnnSdpaKey cudnn_sdpa_key(bool backward, Dt dtype, int64_t B, int64_t S, int64_t NH, int64_t NKV, int64_t D,
                                   bool causal, int64_t window, float scale, bool documents, int device = 0,
                                   float softcap = 0, bool alibi = false, int64_t chunk = 0) {
  CudnnSdpaKey k;
  k.backward = backward;
  k.dtype = dtype;
  k.B = B, k.S = S, k.NH = NH, k.NKV = NKV, k.D = D;
  k.causal = causal;
  k.window = causal && window > 0 && window < S ? window : 0;
  k.scale = scale;
  k.softcap = softcap;
  k.alibi = alibi;
  k.documents = documents;
  k.max_documents = documents ? cudnn_max_documents(B, S, chunk) : 0;
  k.device = device;
  return k;
}

struct CudnnSdpaKeyHash {
  size_t operator()(const CudnnSdpaKey& k) const {
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&h](uint64_t x) {  // boost::hash_combine's step, on 64 bits
      h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    };
    for (uint64_t x : {uint64_t(k.backward), uint64_t(k.dtype), uint64_t(k.B), uint64_t(k.S), uint64_t(k.NH),
                       uint64_t(k.NKV), uint64_t(k.D), uint64_t(k.causal), uint64_t(k.window),
                       uint64_t(std::bit_cast<uint32_t>(k.scale)), uint64_t(std::bit_cast<uint32_t>(k.softcap)),
                       uint64_t(k.alibi), uint64_t(k.documents), uint64_t(k.max_documents),
                       uint64_t(uint32_t(k.device))})
      mix(x);
    return static_cast<size_t>(h);
  }
};

// "B=1 S=4096 NH=32 NKV=8 D=64 bf16 causal window=0 documents=0 backward": for messages.
inline std::string cudnn_sdpa_key_str(const CudnnSdpaKey& k) {
  return "B=" + std::to_string(k.B) + " S=" + std::to_string(k.S) + " NH=" + std::to_string(k.NH) +
         " NKV=" + std::to_string(k.NKV) + " D=" + std::to_string(k.D) + (k.dtype == Dt::bf16 ? " bf16" : " f32") +
         (k.causal ? " causal" : " full") + " window=" + std::to_string(k.window) +
         (k.softcap > 0 ? " softcap=" + std::to_string(k.softcap) : "") + (k.alibi ? " alibi" : "") +
         (k.documents ? " documents (at most " + std::to_string(k.max_documents) + ")" : "") +
         (k.backward ? " backward" : " forward");
}

// ---- which implementation runs a node -------------------------------------------------------
// AUTOSP_ATTENTION: unset, "" or "auto": cuDNN where it takes the shape (and the run finds it
// usable), else the blocks; "blocks": always the blocks; "cudnn": cuDNN, and an attention it
// cannot run is an error rather than a silent fallback.
enum class AttentionMode { automatic, blocks, cudnn };
// False for any other value (mode untouched).
inline bool parse_attention_mode(const char* value, AttentionMode* mode) {
  const std::string v = value ? value : "";
  if (v.empty() || v == "auto") *mode = AttentionMode::automatic;
  else if (v == "blocks") *mode = AttentionMode::blocks;
  else if (v == "cudnn") *mode = AttentionMode::cudnn;
  else return false;
  return true;
}

// Head dims cuDNN runs here: a multiple of 8 (its 16-byte vector loads of bf16 rows), at most
// 128. cuDNN 9.19's support matrix lists d <= 256 on Hopper for forward and backward, but
// autosp's GPU tests cover 64 and 128; a larger D stays on the blocks until they cover it.
constexpr int64_t kCudnnMaxHeadDim = 128;

// "" when the graphs of ops/cuda_attention_cudnn.cpp take the key's attention, else why not.
// Shape and dtype only: what needs a device (its architecture, NVRTC, pointer alignment, a
// successful graph build, a workspace within the plan) is checked by the run.
inline std::string cudnn_sdpa_unsupported(const CudnnSdpaKey& k) {
  if (k.dtype != Dt::bf16) return "cuDNN's fused attention runs bf16 only here (f32 runs on the blocks)";
  if (k.softcap > 0) return "the cuDNN graphs here have no logit softcap (the blocks cap the scores)";
  // cudnn-frontend's alibi_mask makes its own slopes from the head count (those of a power of
  // two), not a rank's part of any model's list: the blocks add the bias.
  if (k.alibi) return "the cuDNN graphs here take no ALiBi slopes (the blocks add the bias)";
  if (k.D % 8 != 0 || k.D > kCudnnMaxHeadDim)
    return "head dim D=" + std::to_string(k.D) + " is not a multiple of 8 up to " + std::to_string(kCudnnMaxHeadDim);
  // cudnn-frontend bounds the backward's f32 dQ accumulator by the token count (max_total_seq_len)
  // only for D a multiple of 16; otherwise by max_documents x S, up to 128 times more.
  if (k.documents && k.D % 16 != 0)
    return "with document ids, head dim D=" + std::to_string(k.D) + " is not a multiple of 16";
  if (k.S > INT32_MAX) return "S=" + std::to_string(k.S) + " exceeds cuDNN's int32 sequence lengths";
  if (k.B <= 0 || k.S <= 0 || k.NH <= 0 || k.NKV <= 0 || k.NH % k.NKV != 0) return "an empty or malformed shape";
  return "";
}

enum class AttentionImplementation { blocks, cudnn };
struct AttentionChoice {
  AttentionImplementation impl = AttentionImplementation::blocks;
  std::string why;     // why not cuDNN (blocks), or why cuDNN cannot run what was forced (error)
  bool error = false;  // AUTOSP_ATTENTION=cudnn for an attention cuDNN cannot run
  bool forced = false;  // AUTOSP_ATTENTION=cudnn: a run that cannot use cuDNN is an error too
};

// The forward and backward of one node choose alike: the choice is a function of the key less
// `backward`, and both keys of a node are equal but for it. (Were a run to fall back in one
// direction only, it would still be right: cuDNN's Stats and the blocks' lse are the same
// quantity, and the GPU tests hold them to each other.)
// built_with_cudnn: whether this build has the cuDNN path (AUTOSP_HAVE_CUDNN). The workspace
// rule asks as if it had, so that `autosp plan` on any machine plans what a GPU build runs.
inline AttentionChoice choose_attention(AttentionMode mode, bool built_with_cudnn, const CudnnSdpaKey& k) {
  AttentionChoice c;
  c.forced = mode == AttentionMode::cudnn;
  if (mode == AttentionMode::blocks) {
    c.why = "AUTOSP_ATTENTION=blocks";
    return c;
  }
  std::string why = built_with_cudnn ? cudnn_sdpa_unsupported(k)
                                     : "this build has no cuDNN (cudnn-frontend headers or libcudnn were not found "
                                       "by CMake; scripts/install_cudnn_frontend.sh installs the headers)";
  if (why.empty()) {
    c.impl = AttentionImplementation::cudnn;
    return c;
  }
  c.why = why;
  c.error = mode == AttentionMode::cudnn;
  return c;
}

// ---- the workspace ------------------------------------------------------------------------------
// cuDNN's own scratch beyond the tensors cudnn-frontend places in it (below): what its engines
// ask for themselves. Not documented; the GPU test CudnnAttention.WorkspaceWithinThePlan prints
// what the graphs ask for and holds them to this plan. Bounded, as the blocks' scratch
// (attention_blocks.h), by 32 MiB and by 4 times the bytes of q, so that a small model at a short
// sequence does not plan 32 MiB per attention (tests/cli/plan_test.cpp's 6 MiB budget of a tiny
// Llama fit no sequence at all with a flat 32 MiB). A graph that asks for more than planned runs
// on the blocks, said on stderr.
constexpr int64_t kCudnnEngineWorkspaceBytes = int64_t{32} << 20;
constexpr int64_t kCudnnEngineWorkspacePerQ = 4;
inline int64_t cudnn_engine_workspace_bytes(const CudnnSdpaKey& k) {
  return std::min(kCudnnEngineWorkspaceBytes, kCudnnEngineWorkspacePerQ * k.B * k.S * k.NH * k.D * dt_size(k.dtype));
}

// Byte offsets into the op's workspace (each at a 256-byte boundary); -1: not used. The cuDNN
// and the blocks layouts are alternatives over the same bytes: the op plans the larger
// (ops/attention.cpp), so that a run can fall back to the blocks.
struct CudnnSdpaLayout {
  int64_t seq_len = -1;       // i32 [max_documents] (documents)
  int64_t offset_qo = -1;     // i64 [max_documents + 1] (documents)
  int64_t offset_kv = -1;     // i64 [max_documents + 1] (documents)
  int64_t offset_stats = -1;  // i64 [max_documents + 1] (documents)
  int64_t stats = -1;         // f32 [B S, NH] (documents): lse token-major
  int64_t cudnn = -1;         // cuDNN's workspace, cudnn_bytes from here
  int64_t cudnn_bytes = 0;
  int64_t bytes = 0;
};

// cuDNN's workspace bound: its engines' own (above) and, in the backward, the tensors
// cudnn-frontend's SDPA backward node places in the workspace (node/scaled_dot_product_flash_
// attention.h): the f32 dQ accumulator [tokens, NH, D] (the non-deterministic backward adds the
// dQ of every key block into it with atomics), the f32 softmax sum [tokens, NH], and with
// documents and GQA the f32 dK and dV of every query head before their sum over the group
// [tokens, NH, D] each. tokens = B S: with documents, the backward is told the token count
// (max_total_seq_len_q/kv), else it would size them by max_documents x S. The deterministic
// backward is not used: on cuDNN 9.19 its workspace grows with S^2.
inline CudnnSdpaLayout cudnn_sdpa_layout(const CudnnSdpaKey& k) {
  auto aligned = [](int64_t x) { return (x + 255) / 256 * 256; };
  CudnnSdpaLayout l;
  int64_t at = 0;
  auto take = [&](int64_t bytes) {
    const int64_t here = at;
    at += aligned(bytes);
    return here;
  };
  const int64_t T = k.B * k.S;
  if (k.documents) {
    l.seq_len = take(4 * k.max_documents);
    l.offset_qo = take(8 * (k.max_documents + 1));
    l.offset_kv = take(8 * (k.max_documents + 1));
    l.offset_stats = take(8 * (k.max_documents + 1));
    l.stats = take(4 * T * k.NH);
  }
  l.cudnn_bytes = aligned(cudnn_engine_workspace_bytes(k));
  if (k.backward) {
    l.cudnn_bytes += aligned(4 * T * k.NH * k.D) + aligned(4 * T * k.NH);
    if (k.documents && k.NKV != k.NH) l.cudnn_bytes += 2 * aligned(4 * T * k.NH * k.D);
  }
  l.cudnn = take(l.cudnn_bytes);
  l.bytes = at;
  return l;
}

}  // namespace autosp::cuda
