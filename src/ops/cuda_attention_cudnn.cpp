// The attention ops on cuDNN's fused SDPA, through cudnn-frontend's graph API
// (kernels/cuda/cudnn_attention.h has the layout, the key, the selection and the workspace).
// One graph per CudnnSdpaKey and process, built at the first run of its shape (cuDNN picks an
// engine and, for its runtime-compiled ones, compiles it with NVRTC: seconds, once) and kept;
// one cuDNN handle per device and stream. Whatever keeps a run from cuDNN at run time (no
// NVRTC, a device or shape cuDNN declines, a misaligned pointer, a graph that asks for more
// workspace than the plan holds) sends that run to the blocks and is said once per shape on
// stderr; under AUTOSP_ATTENTION=cudnn it is an error instead.
//
// cuDNN and NVRTC are opened when attention first runs on cuDNN, not linked (as cuBLAS,
// runtime/cuda_blas.h): libnvrtc's static initialisers alone cost every process 17 ms before
// main. cudnn-frontend is compiled with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING (CMakeLists.txt,
// this file only): it calls cuDNN through cudnn_frontend::cudnn_dlhandle, which is set here,
// and opens NVRTC itself for its own engines.
#include "ops/cuda_attention.h"

#ifdef AUTOSP_HAVE_CUDNN
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <dlfcn.h>
#include <nvrtc.h>

#include <cstdio>
#include <cudnn_frontend.h>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "util/shared_library.h"
#endif

namespace autosp {

#ifndef AUTOSP_HAVE_CUDNN

bool cuda_cudnn_attention_built() { return false; }

// choose_attention never picks cuDNN in a build without it: reaching these is an autosp bug.
bool cuda_attention_forward_cudnn(const CudaContext&, const cuda::CudnnSdpaKey& key, bool, const void*, const void*,
                                  const void*, const int32_t*, void*, float*, void*) {
  internal_error("cuDNN attention (", cuda::cudnn_sdpa_key_str(key), ") called in a build without cuDNN");
}
bool cuda_attention_backward_cudnn(const CudaContext&, const cuda::CudnnSdpaKey& key, bool, const void*, const void*,
                                   const void*, const void*, const float*, const void*, const int32_t*, void*, void*,
                                   void*, void*) {
  internal_error("cuDNN attention (", cuda::cudnn_sdpa_key_str(key), ") called in a build without cuDNN");
}
int64_t cuda_cudnn_graph_builds() { return 0; }
int64_t cuda_cudnn_graph_workspace(const cuda::CudnnSdpaKey&, std::string* why) {
  if (why) *why = "this build has no cuDNN";
  return -1;
}
const std::string& cuda_cudnn_unavailable() {
  static const std::string why = "this build has no cuDNN";
  return why;
}
std::string cuda_cudnn_summary() { return "cuDNN attention not built"; }

#else

}  // namespace autosp

// cudnn-frontend's handle on libcudnn (its dynamic loading): set by cuda_cudnn_unavailable() below
// before any cudnn-frontend call.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace autosp {

namespace fe = cudnn_frontend;

namespace {

// Tensor uids of the graphs (the variant pack binds pointers to them).
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV,
  kSeqLenQ, kSeqLenKV, kOffsetQO, kOffsetKV, kOffsetStats,
};

std::string where_of(const cuda::CudnnSdpaKey& key) { return str("attention on cuDNN (", cudnn_sdpa_key_str(key), ")"); }

void check_cudnn(cudnnStatus_t rc, const char* call, const std::string& where) {
  if (rc == CUDNN_STATUS_SUCCESS) return;
  throw CudaError(str("cuda backend: ", call, " failed in ", where, ": ", fe::detail::get_error_string(rc)));
}

}  // namespace

// Opens libcudnn (for cudnn-frontend) and checks NVRTC, once: "" when cuDNN attention can run,
// else why not. cuDNN's runtime-compiled engines (the SDPA ones among them) compile with NVRTC when
// a plan is built: cuDNN loads libnvrtc by its soname, and NVRTC loads its builtins library when it
// first compiles. Without either, building fails deep inside cuDNN, or on some versions a plan is
// picked and fails at its first launch; so both are checked up front, for a clear message.
const std::string& cuda_cudnn_unavailable() {
  static const std::string why = []() -> std::string {
    std::string e;
    if (!(fe::cudnn_dlhandle = open_shared_library(str("libcudnn.so.", CUDNN_MAJOR), &e)))
      return str(e, ": install cuDNN ", CUDNN_MAJOR, " or put its directory on LD_LIBRARY_PATH");
    const std::string fix = ": cuDNN compiles its attention kernels with NVRTC at run time; put the CUDA toolkit's "
                            "lib64 on LD_LIBRARY_PATH";
    void* nvrtc = open_shared_library(str("libnvrtc.so.", CUDART_VERSION / 1000), &e);
    if (!nvrtc) return e + fix;
    auto version = reinterpret_cast<decltype(&::nvrtcVersion)>(dlsym(nvrtc, "nvrtcVersion"));
    int major = 0, minor = 0;
    if (!version || version(&major, &minor) != NVRTC_SUCCESS) return "nvrtcVersion failed";
    if (!open_shared_library(str("libnvrtc-builtins.so.", major, ".", minor), &e)) return e + fix;
    return "";
  }();
  return why;
}

namespace {

// One cuDNN handle per (device, stream), made on first use and kept for the process: a handle
// is bound to a device, and cudnnSetStream per call would race between executors on two streams.
// Never destroyed: at exit the CUDA context may already be gone.
cudnnHandle_t handle_for(int device, cudaStream_t stream, const std::string& where) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, cudnnHandle_t> handles;
  std::lock_guard<std::mutex> lock(mu);
  cudnnHandle_t& h = handles[{device, stream}];
  if (!h) {
    check_cudnn(fe::detail::create_handle(&h), "cudnnCreate", where);
    check_cudnn(fe::detail::set_stream(h, stream), "cudnnSetStream", where);
  }
  return h;
}

// A built graph, or why none could be built for its key (kept, so a declined shape is tried once).
struct CachedGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;  // what its plan asks for
  std::string declined;   // non-empty: no graph; the reason
};

std::mutex cache_mu;
std::unordered_map<cuda::CudnnSdpaKey, CachedGraph, cuda::CudnnSdpaKeyHash> cache;
int64_t builds = 0;

using Tensor = std::shared_ptr<fe::graph::Tensor_attributes>;

// The tensor [batch, heads, S, D] of a [B, S, heads, D] buffer (BSHD strides), ragged over the
// documents' offsets with documents.
Tensor bshd_tensor(fe::graph::Graph& g, const char* name, int64_t uid, const cuda::CudnnSdpaKey& k, int64_t heads,
                   const Tensor& ragged) {
  const int64_t batch = k.documents ? k.max_documents : k.B;
  auto t = g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({batch, heads, k.S, k.D})
                        .set_stride({k.S * heads * k.D, k.D, heads * k.D, 1}));
  if (ragged) t->set_ragged_offset(ragged);
  return t;
}
void set_bshd(const Tensor& t, const char* name, int64_t uid, const cuda::CudnnSdpaKey& k, int64_t heads,
              const Tensor& ragged) {
  const int64_t batch = k.documents ? k.max_documents : k.B;
  t->set_output(true).set_name(name).set_uid(uid).set_dim({batch, heads, k.S, k.D}).set_stride(
      {k.S * heads * k.D, k.D, heads * k.D, 1});
  if (ragged) t->set_ragged_offset(ragged);
}
// Stats [batch, NH, S, 1], f32: lse's [B, NH, S], or token-major [tokens, NH] with documents.
void set_stats_layout(const Tensor& t, const cuda::CudnnSdpaKey& k, const Tensor& ragged) {
  t->set_uid(kStats).set_data_type(fe::DataType_t::FLOAT);
  if (k.documents)
    t->set_dim({k.max_documents, k.NH, k.S, 1}).set_stride({k.NH * k.S, 1, k.NH, 1}).set_ragged_offset(ragged);
  else
    t->set_dim({k.B, k.NH, k.S, 1}).set_stride({k.NH * k.S, k.S, 1, 1});
}

// The THD inputs of a graph with documents: the lengths (one buffer serves q and kv: each document
// is its own keys) and the ragged offsets.
struct ThdTensors {
  Tensor seq_len_q, seq_len_kv, offset_qo, offset_kv, offset_stats;
};
ThdTensors thd_tensors(fe::graph::Graph& g, const cuda::CudnnSdpaKey& k) {
  if (!k.documents) return {};
  auto index = [&](const char* name, int64_t uid, int64_t n, fe::DataType_t type) {
    return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({n, 1, 1, 1}).set_stride(
        {1, 1, 1, 1}).set_data_type(type));
  };
  const int64_t n = k.max_documents;
  return {index("seq_len_q", kSeqLenQ, n, fe::DataType_t::INT32), index("seq_len_kv", kSeqLenKV, n, fe::DataType_t::INT32),
          index("offset_qo", kOffsetQO, n + 1, fe::DataType_t::INT64),
          index("offset_kv", kOffsetKV, n + 1, fe::DataType_t::INT64),
          index("offset_stats", kOffsetStats, n + 1, fe::DataType_t::INT64)};
}

// The masks, the same in both directions: causal is the band's right bound 0 at the top-left
// diagonal (key j <= query i, per document with THD); the window its left bound (key j kept
// when j + W > i). Documents: the padding mask over the THD lengths.
template <typename Attributes>
void set_masks(Attributes& a, const cuda::CudnnSdpaKey& k, const ThdTensors& thd) {
  a.set_attn_scale(k.scale);
  if (k.causal) a.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
  if (k.window > 0) a.set_diagonal_band_left_bound(static_cast<int>(k.window));
  if (k.documents) a.set_padding_mask(true).set_seq_len_q(thd.seq_len_q).set_seq_len_kv(thd.seq_len_kv);
}

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

std::shared_ptr<fe::graph::Graph> forward_graph(const cuda::CudnnSdpaKey& k) {
  auto g = new_graph();
  const ThdTensors thd = thd_tensors(*g, k);
  auto q = bshd_tensor(*g, "q", kQ, k, k.NH, thd.offset_qo);
  auto kk = bshd_tensor(*g, "k", kK, k, k.NKV, thd.offset_kv);
  auto v = bshd_tensor(*g, "v", kV, k, k.NKV, thd.offset_kv);
  auto a = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true);
  set_masks(a, k, thd);
  auto [o, stats] = g->sdpa(q, kk, v, a);
  set_bshd(o, "out", kO, k, k.NH, thd.offset_qo);
  stats->set_output(true).set_name("stats");
  set_stats_layout(stats, k, thd.offset_stats);
  return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const cuda::CudnnSdpaKey& k) {
  auto g = new_graph();
  const ThdTensors thd = thd_tensors(*g, k);
  auto q = bshd_tensor(*g, "q", kQ, k, k.NH, thd.offset_qo);
  auto kk = bshd_tensor(*g, "k", kK, k, k.NKV, thd.offset_kv);
  auto v = bshd_tensor(*g, "v", kV, k, k.NKV, thd.offset_kv);
  auto o = bshd_tensor(*g, "out", kO, k, k.NH, thd.offset_qo);
  auto dout = bshd_tensor(*g, "dout", kDO, k, k.NH, thd.offset_qo);
  auto stats = g->tensor(fe::graph::Tensor_attributes().set_name("stats"));
  set_stats_layout(stats, k, thd.offset_stats);
  // Not deterministic: cuDNN 9.19's deterministic backward needs a workspace of S^2.
  auto a = fe::graph::SDPA_backward_attributes().set_name("attention_backward").set_deterministic_algorithm(false);
  set_masks(a, k, thd);
  // With documents, the workspace tensors are sized by the token count, not max_documents x S.
  if (k.documents) a.set_max_total_seq_len_q(k.B * k.S).set_max_total_seq_len_kv(k.B * k.S);
  auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, dout, stats, a);
  set_bshd(dq, "dq", kDQ, k, k.NH, thd.offset_qo);
  set_bshd(dk, "dk", kDK, k, k.NKV, thd.offset_kv);
  set_bshd(dv, "dv", kDV, k, k.NKV, thd.offset_kv);
  return g;
}

// Builds the key's graph: "" on success, else what cuDNN said (the shape is declined). Only after
// cuda_cudnn_unavailable() said "" (the entry points below ask first).
std::string build(const cuda::CudnnSdpaKey& k, cudnnHandle_t handle, CachedGraph& out) {
  auto g = k.backward ? backward_graph(k) : forward_graph(k);
  auto step = [](fe::error_t e, const char* call) {
    return e.is_good() ? std::string() : str("cudnn-frontend ", call, ": ", e.get_message());
  };
  std::string why = step(g->validate(), "validate");
  if (why.empty()) why = step(g->build_operation_graph(handle), "build_operation_graph");
  if (why.empty()) why = step(g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}),
                              "create_execution_plans");
  // Engines that would need more workspace than the plan holds are passed over for the next
  // candidate, rather than the shape falling back to the blocks.
  if (why.empty()) g->deselect_workspace_greater_than(cuda::cudnn_engine_workspace_bytes(k));
  if (why.empty()) why = step(g->check_support(handle), "check_support");
  if (why.empty()) why = step(g->build_plans(handle), "build_plans");
  if (!why.empty()) return why;
  int64_t workspace = 0;
  if (why = step(g->get_workspace_size(workspace), "get_workspace_size"); !why.empty()) return why;
  out.graph = std::move(g);
  out.workspace = workspace;
  return "";
}

// The key's graph, built at its first use; null where cuDNN declined it or the plan's workspace is
// too small, said once on stderr (or thrown under AUTOSP_ATTENTION=cudnn).
const fe::graph::Graph* graph_for(const cuda::CudnnSdpaKey& k, cudnnHandle_t handle, bool forced) {
  std::lock_guard<std::mutex> lock(cache_mu);
  auto [it, fresh] = cache.try_emplace(k);
  CachedGraph& entry = it->second;
  if (fresh) {
    std::string why;
    try {
      why = build(k, handle, entry);
    } catch (const std::exception& e) {  // cudnn-frontend throws on some backend failures
      why = str("cudnn-frontend threw: ", e.what());
    }
    if (why.empty()) {
      ++builds;
      const int64_t planned = cuda::cudnn_sdpa_layout(k).cudnn_bytes;
      if (entry.workspace > planned)
        why = str("its plan asks for ", entry.workspace, " bytes of workspace, more than the ", planned,
                  " planned (kernels/cuda/cudnn_attention.h, cudnn_sdpa_layout)");
    }
    if (!why.empty()) {
      entry.graph.reset();
      entry.declined = why;
      if (!forced)  // said once: the entry stays, declined
        std::fprintf(stderr, "autosp: attention (%s) runs on the blocks, not cuDNN: %s\n",
                     cudnn_sdpa_key_str(k).c_str(), why.c_str());
    }
  }
  if (!entry.declined.empty() && forced)
    user_error("AUTOSP_ATTENTION=cudnn, but ", where_of(k), " cannot run: ", entry.declined);
  return entry.graph.get();
}

// A pointer cuDNN's SDPA kernels read or write with 16-byte vector loads and TMA: cudnn-frontend
// refuses a misaligned one (and the backend, unchecked, would compute wrong results).
bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// A run that goes to the blocks for `why`, said once per key (an error when forced).
bool fall_back(const cuda::CudnnSdpaKey& k, bool forced, const std::string& why) {
  static std::mutex mu;
  static std::unordered_set<cuda::CudnnSdpaKey, cuda::CudnnSdpaKeyHash> said;
  if (forced) user_error("AUTOSP_ATTENTION=cudnn, but ", where_of(k), " cannot run: ", why);
  std::lock_guard<std::mutex> lock(mu);
  if (said.insert(k).second)
    std::fprintf(stderr, "autosp: attention (%s) runs on the blocks, not cuDNN: %s\n", cudnn_sdpa_key_str(k).c_str(),
                 why.c_str());
  return false;
}

template <typename T>
T* piece(void* workspace, int64_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(workspace) + offset);
}

// The THD arrays into their pieces of the workspace, from the device document ids, and their
// bindings.
void bind_thd(const CudaContext& c, const cuda::CudnnSdpaKey& k, const cuda::CudnnSdpaLayout& l, const int32_t* doc,
              void* workspace, std::unordered_map<int64_t, void*>& pack) {
  if (!k.documents) return;
  auto* seq_len = piece<int32_t>(workspace, l.seq_len);
  auto* qo = piece<int64_t>(workspace, l.offset_qo);
  auto* kv = piece<int64_t>(workspace, l.offset_kv);
  auto* st = piece<int64_t>(workspace, l.offset_stats);
  cuda::cudnn_thd_layout(doc, k.B, k.S, k.NH, k.NKV, k.D, k.max_documents, seq_len, qo, kv, st, c.error, c.stream);
  check_cuda(cudaGetLastError(), "cudnn_thd_layout", where_of(k));
  pack[kSeqLenQ] = seq_len;
  pack[kSeqLenKV] = seq_len;
  pack[kOffsetQO] = qo;
  pack[kOffsetKV] = kv;
  pack[kOffsetStats] = st;
}

void execute(const fe::graph::Graph& g, cudnnHandle_t handle, std::unordered_map<int64_t, void*>& pack,
             void* cudnn_workspace, const cuda::CudnnSdpaKey& k) {
  const fe::error_t e = g.execute(handle, pack, cudnn_workspace);
  if (!e.is_good())
    throw CudaError(str("cuda backend: cudnn-frontend execute failed in ", where_of(k), ": ",
                        fe::error_t(e).get_message()));
}

int current_device(const std::string& where) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice", where);
  return device;
}

}  // namespace

bool cuda_cudnn_attention_built() { return true; }

bool cuda_attention_forward_cudnn(const CudaContext& c, const cuda::CudnnSdpaKey& key, bool forced, const void* q,
                                  const void* k, const void* v, const int32_t* doc, void* out, float* lse,
                                  void* workspace) {
  AUTOSP_CHECK(!key.backward && key.documents == (doc != nullptr), "cuDNN attention forward given the key ",
               cudnn_sdpa_key_str(key));
  if (const std::string& why = cuda_cudnn_unavailable(); !why.empty()) return fall_back(key, forced, why);
  if (!aligned16({q, k, v, out, lse, workspace})) return fall_back(key, forced, "an operand is not 16-byte aligned");
  const std::string where = where_of(key);
  cudnnHandle_t handle = handle_for(key.device, c.stream, where);
  const fe::graph::Graph* g = graph_for(key, handle, forced);
  if (!g) return false;
  const cuda::CudnnSdpaLayout l = cuda::cudnn_sdpa_layout(key);
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)},
                                             {kV, const_cast<void*>(v)}, {kO, out}};
  bind_thd(c, key, l, doc, workspace, pack);
  float* stats = key.documents ? piece<float>(workspace, l.stats) : lse;
  pack[kStats] = stats;
  execute(*g, handle, pack, piece<char>(workspace, l.cudnn), key);
  if (key.documents) {
    cuda::lse_from_token_major(stats, key.B, key.S, key.NH, lse, c.stream);
    check_cuda(cudaGetLastError(), "lse_from_token_major", where);
  }
  return true;
}

bool cuda_attention_backward_cudnn(const CudaContext& c, const cuda::CudnnSdpaKey& key, bool forced, const void* q,
                                   const void* k, const void* v, const void* out, const float* lse, const void* dout,
                                   const int32_t* doc, void* dq, void* dk, void* dv, void* workspace) {
  AUTOSP_CHECK(key.backward && key.documents == (doc != nullptr), "cuDNN attention backward given the key ",
               cudnn_sdpa_key_str(key));
  if (const std::string& why = cuda_cudnn_unavailable(); !why.empty()) return fall_back(key, forced, why);
  if (!aligned16({q, k, v, out, lse, dout, dq, dk, dv, workspace}))
    return fall_back(key, forced, "an operand is not 16-byte aligned");
  const std::string where = where_of(key);
  cudnnHandle_t handle = handle_for(key.device, c.stream, where);
  const fe::graph::Graph* g = graph_for(key, handle, forced);
  if (!g) return false;
  const cuda::CudnnSdpaLayout l = cuda::cudnn_sdpa_layout(key);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, const_cast<void*>(q)},   {kK, const_cast<void*>(k)}, {kV, const_cast<void*>(v)},
      {kO, const_cast<void*>(out)}, {kDO, const_cast<void*>(dout)}, {kDQ, dq}, {kDK, dk}, {kDV, dv}};
  bind_thd(c, key, l, doc, workspace, pack);
  if (key.documents) {
    float* stats = piece<float>(workspace, l.stats);
    cuda::lse_to_token_major(lse, key.B, key.S, key.NH, stats, c.stream);
    check_cuda(cudaGetLastError(), "lse_to_token_major", where);
    pack[kStats] = stats;
  } else {
    pack[kStats] = const_cast<float*>(lse);
  }
  execute(*g, handle, pack, piece<char>(workspace, l.cudnn), key);
  return true;
}

int64_t cuda_cudnn_graph_builds() {
  std::lock_guard<std::mutex> lock(cache_mu);
  return builds;
}

int64_t cuda_cudnn_graph_workspace(const cuda::CudnnSdpaKey& key, std::string* why) {
  if (const std::string& missing = cuda_cudnn_unavailable(); !missing.empty()) {
    if (why) *why = missing;
    return -1;
  }
  const std::string where = where_of(key);
  cudaStream_t stream = nullptr;  // the legacy default stream: building a plan launches nothing
  const fe::graph::Graph* g = graph_for(key, handle_for(current_device(where), stream, where), false);
  std::lock_guard<std::mutex> lock(cache_mu);
  const CachedGraph& entry = cache.at(key);
  if (why) *why = entry.declined;
  return g ? entry.workspace : (entry.declined.find("workspace") != std::string::npos ? entry.workspace : -1);
}


std::string cuda_cudnn_summary() {
  if (const std::string& why = cuda_cudnn_unavailable(); !why.empty()) return "cuDNN attention not loadable: " + why;
  const size_t v = fe::detail::get_backend_version();  // major * 10000 + minor * 100 + patch (cuDNN 9)
  return str("cuDNN ", v / 10000, ".", (v / 100) % 100, ".", v % 100, " (libcudnn.so.", CUDNN_MAJOR,
             ", cudnn-frontend ", CUDNN_FRONTEND_MAJOR_VERSION, ".", CUDNN_FRONTEND_MINOR_VERSION, ")");
}

#endif  // AUTOSP_HAVE_CUDNN

}  // namespace autosp
