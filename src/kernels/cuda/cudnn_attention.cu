// What cuDNN's fused attention needs around it on the device (kernels.h): the THD layout of
// packed documents, computed from the device document ids inside the step (no host sync), and
// lse moved to and from cuDNN's token-major Stats. cudnn_attention.h's cudnn_thd_layout is the
// specification of the first; the GPU test holds this kernel to it.
#include "kernels/cuda/common.cuh"

namespace autosp::cuda {

namespace {

constexpr int kThdThreads = 1024;

// One block. Thread i scans a contiguous chunk of the B S tokens and counts the documents that
// start in it (a token starts one at a row's first position or where the id changes); an
// exclusive scan of the counts over the block gives each start its document index k, and the
// start token t_k goes to offset_stats[k], used as scratch (k <= max_documents: t_max is kept
// too, the end of the last document laid out). Then every entry is written from the starts.
__global__ void __launch_bounds__(kThdThreads) thd_layout_kernel(const int32_t* doc, int64_t B, int64_t S, int64_t NH, int64_t NKV, int64_t D,
                                  int64_t max_documents, int32_t* seq_len, int64_t* offset_qo, int64_t* offset_kv,
                                  int64_t* offset_stats, int* error) {
  __shared__ int64_t counts[kThdThreads];
  const int64_t T = B * S;
  const int64_t chunk = (T + kThdThreads - 1) / kThdThreads;
  const int64_t t0 = min(T, int64_t(threadIdx.x) * chunk), t1 = min(T, t0 + chunk);
  auto starts_document = [&](int64_t t) { return t % S == 0 || doc[t] != doc[t - 1]; };
  int64_t mine = 0;
  for (int64_t t = t0; t < t1; ++t) mine += starts_document(t);
  counts[threadIdx.x] = mine;
  __syncthreads();
  // Hillis-Steele inclusive scan over the block's counts.
  for (int step = 1; step < kThdThreads; step <<= 1) {
    const int64_t add = threadIdx.x >= step ? counts[threadIdx.x - step] : 0;
    __syncthreads();
    counts[threadIdx.x] += add;
    __syncthreads();
  }
  const int64_t documents = counts[kThdThreads - 1];
  int64_t k = counts[threadIdx.x] - mine;  // this chunk's first document
  for (int64_t t = t0; t < t1; ++t)
    if (starts_document(t)) {
      if (k <= max_documents) offset_stats[k] = t;
      ++k;
    }
  if (threadIdx.x == 0 && documents > max_documents) set_error(error, kErrorTooManyDocuments);
  __syncthreads();  // the starts are in global memory, visible to the block after this barrier
  const int64_t n = min(documents, max_documents);
  for (int64_t i = threadIdx.x; i < max_documents; i += kThdThreads) {
    const int64_t t = i < n ? offset_stats[i] : T;
    const int64_t end = i < n ? (i + 1 < documents ? offset_stats[i + 1] : T) : T;
    seq_len[i] = static_cast<int32_t>(end - t);
    offset_qo[i] = t * NH * D;
    offset_kv[i] = t * NKV * D;
  }
  if (threadIdx.x == 0) {
    offset_qo[max_documents] = T * NH * D;
    offset_kv[max_documents] = T * NKV * D;
  }
  __syncthreads();  // every read of the scratch starts is done: now overwrite them in place
  for (int64_t i = threadIdx.x; i <= max_documents; i += kThdThreads)
    offset_stats[i] = (i < n ? offset_stats[i] : T) * NH;
}

// stats[(b S + s) NH + h] = lse[(b NH + h) S + s], element i of the token-major side.
__global__ void lse_to_token_major_kernel(const float* lse, int64_t B, int64_t S, int64_t NH, float* stats) {
  AUTOSP_GRID_STRIDE(i, B * S * NH) {
    const int64_t h = i % NH, bs = i / NH, s = bs % S, b = bs / S;
    stats[i] = lse[(b * NH + h) * S + s];
  }
}

__global__ void lse_from_token_major_kernel(const float* stats, int64_t B, int64_t S, int64_t NH, float* lse) {
  AUTOSP_GRID_STRIDE(i, B * S * NH) {
    const int64_t h = i % NH, bs = i / NH, s = bs % S, b = bs / S;
    lse[(b * NH + h) * S + s] = stats[i];
  }
}

}  // namespace

void cudnn_thd_layout(const int32_t* doc, int64_t B, int64_t S, int64_t NH, int64_t NKV, int64_t D,
                      int64_t max_documents, int32_t* seq_len, int64_t* offset_qo, int64_t* offset_kv,
                      int64_t* offset_stats, int* error, cudaStream_t stream) {
  if (B * S == 0 || max_documents <= 0) return;
  thd_layout_kernel<<<1, kThdThreads, 0, stream>>>(doc, B, S, NH, NKV, D, max_documents, seq_len, offset_qo,
                                                    offset_kv, offset_stats, error);
}

void lse_to_token_major(const float* lse, int64_t B, int64_t S, int64_t NH, float* stats, cudaStream_t stream) {
  if (B * S * NH == 0) return;
  lse_to_token_major_kernel<<<blocks_for(B * S * NH), kThreads, 0, stream>>>(lse, B, S, NH, stats);
}

void lse_from_token_major(const float* stats, int64_t B, int64_t S, int64_t NH, float* lse, cudaStream_t stream) {
  if (B * S * NH == 0) return;
  lse_from_token_major_kernel<<<blocks_for(B * S * NH), kThreads, 0, stream>>>(stats, B, S, NH, lse);
}

}  // namespace autosp::cuda
