// Llama 4's two attention options, which the flash kernels run through what they already take
// (ops/attention.cpp), each written once for the CPU and the device (cuda/attention.cu compiles
// them):
//
// chunked attention (attribute `chunk` C > 0, causal): query i sees key j only when both lie in
// one chunk of C positions, floor(i / C) == floor(j / C), as transformers' chunked causal mask
// (positions counted along the row from 0, whatever the position ids). The kernels take it as
// document ids: chunk_document_id gives each position the first position of its run, the part
// of its document (of the op's document ids; none: one document) within its chunk,
//   ids'[i] = max(floor(i / C) C, the first position of i's document),
// which is non-decreasing (both terms are) and equal for two positions exactly when they share
// a document and a chunk: so the kernels' document masks and tile skips are the chunks' too.
//
// temperature tuning (attribute `temperature` [F, A], of the NoPE layers): query row i is scaled
// by f_i = log1p(floor((i + 1) / F)) A + 1 before its scores, computed in f32 as transformers
// does (cache_position.float()); the backward's dq is then f_i times the kernels' gradient.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/cpu/moe_routing.h"  // AUTOSP_HOST_DEVICE

namespace autosp::attention_llama4 {

// ids'[b, i] of row b's positions (documents: the row's ids, non-decreasing; null: one
// document). A binary search for the document's first position, so each position stands alone.
AUTOSP_HOST_DEVICE inline int32_t chunk_document_id(const int32_t* row_documents, int64_t i, int64_t chunk) {
  int64_t first = 0;  // (one document: the row's start)
  if (row_documents) {
    int64_t lo = 0, hi = i;  // the first j <= i with ids[j] == ids[i]
    const int32_t id = row_documents[i];
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (row_documents[mid] < id)
        lo = mid + 1;
      else
        hi = mid;
    }
    first = lo;
  }
  const int64_t chunk_start = i / chunk * chunk;
  return static_cast<int32_t>(first > chunk_start ? first : chunk_start);
}

// f_i, in f32 as transformers computes it.
AUTOSP_HOST_DEVICE inline float temperature(int64_t i, float floor_scale, float attn_scale) {
  return log1pf(floorf((static_cast<float>(i) + 1.0f) / floor_scale)) * attn_scale + 1.0f;
}

}  // namespace autosp::attention_llama4
