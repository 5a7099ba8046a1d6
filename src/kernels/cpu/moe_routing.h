// One token's mixture-of-experts routing (the `moe` op's router, moe.h), written once for the
// CPU kernels (moe.cpp) and the cuda ones (cuda/moe.cu compiles these for the device): host
// and device functions over arrays the caller gives, in double. The CPU kernels, tested by
// finite differences and against PyTorch's float64 models, are these functions run on the host.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define AUTOSP_HOST_DEVICE __host__ __device__
#define AUTOSP_HOST_DEVICE_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define AUTOSP_HOST_DEVICE
#define AUTOSP_HOST_DEVICE_TEMPLATE
#endif

namespace autosp::moe_routing {

// A router as plain values (a cuda kernel's argument): cpu::MoeRouting and the op's normalize.
struct Route {
  bool normalize = false, sigmoid = false, group_top2 = false, dropped_zero = false;
  int32_t groups = 1, topk_group = 1;
  double scale = 1.0, norm_eps = 0.0;
  const double* bias = nullptr;  // [E] (the cuda kernels': in device memory), or null: none
};

// The groups' scores, kept as bits of one word, and the chosen weights, in the cuda kernels'
// per-thread arrays.
constexpr int64_t kMaxGroups = 64;
constexpr int64_t kMaxTopK = 64;

// s = the scores of one token's E logits, read as doubles by logit(e): their softmax (the
// first largest subtracted, exp, divided by the sum) or each one's sigmoid.
AUTOSP_HOST_DEVICE_TEMPLATE
template <class Logit>
AUTOSP_HOST_DEVICE void scores(bool sigmoid, Logit logit, int64_t E, double* s) {
  if (sigmoid) {
    for (int64_t e = 0; e < E; ++e) s[e] = 1.0 / (1.0 + exp(-logit(e)));
    return;
  }
  double m = logit(0);
  for (int64_t e = 1; e < E; ++e)
    if (m < logit(e)) m = logit(e);
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += s[e] = exp(logit(e) - m);
  for (int64_t e = 0; e < E; ++e) s[e] /= sum;
}

// The k largest of v(0 .. n), in descending order, ties to the lower index: k passes, each
// taking the first index not yet chosen that no later one exceeds. A NaN is never greater,
// so NaN values choose some k indices, never one out of range.
AUTOSP_HOST_DEVICE_TEMPLATE
template <class Value>
AUTOSP_HOST_DEVICE void top_k(Value v, int64_t n, int64_t k, int32_t* chosen) {
  for (int64_t j = 0; j < k; ++j) {
    int32_t best = -1;
    for (int64_t e = 0; e < n; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || chosen[i] == e;
      if (!taken && (best < 0 || v(e) > v(best))) best = int32_t(e);
    }
    chosen[j] = best;
  }
}

// The token's k experts, in descending order of the choice's values, and their weights w [k]:
// the choice is s + bias among the topk_group best groups of E / groups experts (each scored by
// its best or its two best of s + bias), the other groups' experts at -inf or 0; the weights
// are s (normalize: over the chosen ones' sum plus norm_eps) times the scale.
AUTOSP_HOST_DEVICE inline void choose(const Route& r, const double* s, int64_t E, int64_t k, int32_t* chosen,
                                      double* w) {
  auto biased = [&](int64_t e) { return s[e] + (r.bias ? r.bias[e] : 0.0); };
  uint64_t kept = ~uint64_t{0};
  const int64_t per_group = E / r.groups;
  if (r.groups > 1) {
    double score[kMaxGroups];
    for (int64_t g = 0; g < r.groups; ++g) {
      double a = -INFINITY, b = -INFINITY;  // the best two
      for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
        const double c = biased(e);
        if (c > a) b = a, a = c;
        else if (c > b) b = c;
      }
      score[g] = r.group_top2 ? a + b : a;
    }
    int32_t best[kMaxGroups];
    top_k([&](int64_t g) { return score[g]; }, r.groups, r.topk_group, best);
    kept = 0;
    for (int64_t i = 0; i < r.topk_group; ++i) kept |= uint64_t{1} << best[i];
  }
  if (r.groups > 1 || r.bias) {
    top_k(
        [&](int64_t e) {
          return (kept >> (e / per_group)) & 1 ? biased(e) : r.dropped_zero ? 0.0 : -INFINITY;
        },
        E, k, chosen);
  } else {
    top_k([&](int64_t e) { return s[e]; }, E, k, chosen);
  }
  double sum = r.norm_eps;
  for (int64_t j = 0; j < k; ++j) sum += s[chosen[j]];
  for (int64_t j = 0; j < k; ++j) w[j] = (r.normalize ? s[chosen[j]] / sum : s[chosen[j]]) * r.scale;
}

// The logits' gradient, out(e, dl_e) for every e < E, from the chosen weights' dw [k] (s,
// chosen and w as choose gave them). The choice (top k, groups, the bias) has no gradient.
//   softmax, normalised, no norm_eps: w is the softmax of the chosen logits alone times the
//     scale c, so dl[e_j] = w_j (dw_j - sum_i dw_i w_i / c) and exactly 0 for the others (as in
//     the maths; through the full softmax it would be rounding noise, which AdamW's first
//     steps turn into +-lr updates);
//   otherwise through du_j, the gradient of u_j = s_{e_j}: c dw_j, or normalised
//     c (dw_j / D - sum_i dw_i u_i / D^2), D = sum_i u_i + norm_eps; then softmax
//     dl[e] = s_e (du_e - sum_j du_j s_{e_j}) (du_e = 0 unchosen), sigmoid du_e s_e (1 - s_e).
AUTOSP_HOST_DEVICE_TEMPLATE
template <class Out>
AUTOSP_HOST_DEVICE void backward(const Route& r, const double* s, int64_t E, int64_t k, const int32_t* chosen,
                                 const double* w, const float* dw, Out out) {
  if (!r.sigmoid && r.normalize && r.norm_eps == 0.0) {
    double dot = 0;
    for (int64_t j = 0; j < k; ++j) dot += double(dw[j]) * w[j] / r.scale;
    for (int64_t e = 0; e < E; ++e) out(e, 0.0f);
    for (int64_t j = 0; j < k; ++j) out(chosen[j], float(w[j] * (double(dw[j]) - dot)));
    return;
  }
  double sum = r.norm_eps, dot = 0;
  for (int64_t j = 0; j < k; ++j) sum += s[chosen[j]];
  for (int64_t j = 0; j < k; ++j) dot += double(dw[j]) * s[chosen[j]];
  auto du = [&](int64_t j) {
    return r.scale * (r.normalize ? double(dw[j]) / sum - dot / (sum * sum) : double(dw[j]));
  };
  if (r.sigmoid) {
    for (int64_t e = 0; e < E; ++e) out(e, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const double v = s[chosen[j]];
      out(chosen[j], float(du(j) * v * (1.0 - v)));
    }
    return;
  }
  double pd = 0;
  for (int64_t j = 0; j < k; ++j) pd += du(j) * s[chosen[j]];
  for (int64_t e = 0; e < E; ++e) out(e, float(-s[e] * pd));
  for (int64_t j = 0; j < k; ++j) out(chosen[j], float(s[chosen[j]] * (du(j) - pd)));
}

}  // namespace autosp::moe_routing
