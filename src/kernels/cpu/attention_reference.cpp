// The plain O(S^2)-memory attention in double (attention.h), for tests and benchmarks:
// built for the baseline, not per instruction set.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/attention.h"

namespace autosp::cpu {

namespace {
// Whether key j is in query i's document (always, without documents) and, with a window,
// within it (i - j < window).
bool visible(const int32_t* documents, int64_t window, int64_t S, int64_t b, int64_t i, int64_t j) {
  return (!documents || documents[b * S + i] == documents[b * S + j]) && (window == 0 || i - j < window);
}
// The score of scale q.k = s: s itself, or with a softcap c > 0, c tanh(s / c).
double capped(double s, double softcap) { return softcap > 0 ? softcap * std::tanh(s / softcap) : s; }
// ALiBi's bias of query i and key j in head h: a_h (j - i), or 0 without slopes.
double bias(const double* alibi, int64_t h, int64_t i, int64_t j) { return alibi ? alibi[h] * double(j - i) : 0.0; }
}  // namespace

int64_t first_unsorted_document(const AttentionDims& d, const int32_t* documents) {
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t i = 1; i < d.S; ++i)
      if (documents[b * d.S + i] < documents[b * d.S + i - 1]) return b * d.S + i;
  return -1;
}

void attention_forward_reference(const AttentionDims& d, bool causal, double scale,
                                 const double* q, const double* k, const double* v, double* out,
                                 double* lse, const int32_t* documents, int64_t window, double softcap,
                                 const double* alibi, const double* sinks) {
  const int64_t S = d.S, D = d.D, Dv = d.dv(), NH = d.NH, NKV = d.NKV, G = NH / NKV;
  std::vector<double> s(S);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t i = 0; i < S; ++i) {
        const double* qi = q + ((b * S + i) * NH + h) * D;
        const int64_t n = causal ? i + 1 : S;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          const double* kj = k + ((b * S + j) * NKV + h / G) * D;
          double t = 0.0;
          for (int64_t dd = 0; dd < D; ++dd) t += qi[dd] * kj[dd];
          s[j] = visible(documents, window, S, b, i, j) ? capped(scale * t, softcap) + bias(alibi, h, i, j)
                                                        : -std::numeric_limits<double>::infinity();
          mx = std::max(mx, s[j]);
        }
        // a sink: one more score, of a key whose value is zero
        if (sinks) mx = std::max(mx, sinks[h]);
        double sum = sinks ? std::exp(sinks[h] - mx) : 0.0;
        for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
        double* oi = out + ((b * S + i) * NH + h) * Dv;
        for (int64_t dd = 0; dd < Dv; ++dd) oi[dd] = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          const double* vj = v + ((b * S + j) * NKV + h / G) * Dv;
          for (int64_t dd = 0; dd < Dv; ++dd) oi[dd] += s[j] / sum * vj[dd];
        }
        lse[(b * NH + h) * S + i] = mx + std::log(sum);
      }
}

void attention_backward_reference(const AttentionDims& d, bool causal, double scale,
                                  const double* q, const double* k, const double* v,
                                  const double* dout, double* dq, double* dk, double* dv,
                                  const int32_t* documents, int64_t window, double softcap,
                                  const double* alibi, const double* sinks, double* dsinks) {
  const int64_t S = d.S, D = d.D, Dv = d.dv(), NH = d.NH, NKV = d.NKV, G = NH / NKV;
  std::fill(dq, dq + d.B * S * NH * D, 0.0);
  std::fill(dk, dk + d.B * S * NKV * D, 0.0);
  std::fill(dv, dv + d.B * S * NKV * Dv, 0.0);
  std::vector<double> P(S * S), dP(S * S), dcap(S * S), Psink(S);
  if (dsinks) std::fill(dsinks, dsinks + NH, 0.0);
  auto row = [&](auto* x, int64_t b, int64_t t, int64_t heads, int64_t hh) {
    return x + ((b * S + t) * heads + hh) * D;
  };
  auto vrow = [&](auto* x, int64_t b, int64_t t, int64_t heads, int64_t hh) {  // v, dv, dout: Dv
    return x + ((b * S + t) * heads + hh) * Dv;
  };
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t kvh = h / G;
      for (int64_t i = 0; i < S; ++i) {
        const int64_t n = causal ? i + 1 : S;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < S; ++j) {
          double t = 0.0;
          for (int64_t dd = 0; dd < D; ++dd) t += row(q, b, i, NH, h)[dd] * row(k, b, j, NKV, kvh)[dd];
          P[i * S + j] = j < n && visible(documents, window, S, b, i, j)
                             ? capped(scale * t, softcap) + bias(alibi, h, i, j)
                                                                 : -std::numeric_limits<double>::infinity();
          // d capped / ds = 1 - tanh^2 (1 without a cap), kept for the softmax backward below
          const double th = softcap > 0 ? std::tanh(scale * t / softcap) : 0.0;
          dcap[i * S + j] = 1.0 - th * th;
          mx = std::max(mx, P[i * S + j]);
        }
        if (sinks) mx = std::max(mx, sinks[h]);
        double sum = sinks ? std::exp(sinks[h] - mx) : 0.0;
        for (int64_t j = 0; j < S; ++j) sum += (P[i * S + j] = std::exp(P[i * S + j] - mx));
        for (int64_t j = 0; j < S; ++j) P[i * S + j] /= sum;
        Psink[i] = sinks ? std::exp(sinks[h] - mx) / sum : 0.0;
      }
      // dv_j = sum_i P_ij dout_i;  dP_ij = dout_i . v_j
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j < S; ++j) {
          double t = 0.0;
          for (int64_t dd = 0; dd < Dv; ++dd) {
            vrow(dv, b, j, NKV, kvh)[dd] += P[i * S + j] * vrow(dout, b, i, NH, h)[dd];
            t += vrow(dout, b, i, NH, h)[dd] * vrow(v, b, j, NKV, kvh)[dd];
          }
          dP[i * S + j] = t;
        }
      // softmax backward: dS_ij = P_ij (dP_ij - sum_l P_il dP_il) d capped / ds; s = scale q.k
      for (int64_t i = 0; i < S; ++i) {
        double dot = 0.0;
        for (int64_t j = 0; j < S; ++j) dot += P[i * S + j] * dP[i * S + j];
        // the sink's score: its dP is 0 (no value), so dz = P_sink (0 - dot)
        if (dsinks) dsinks[h] -= Psink[i] * dot;
        for (int64_t j = 0; j < S; ++j) {
          const double dS = P[i * S + j] * (dP[i * S + j] - dot) * dcap[i * S + j];
          for (int64_t dd = 0; dd < D; ++dd) {
            row(dq, b, i, NH, h)[dd] += scale * dS * row(k, b, j, NKV, kvh)[dd];
            row(dk, b, j, NKV, kvh)[dd] += scale * dS * row(q, b, i, NH, h)[dd];
          }
        }
      }
    }
}

}  // namespace autosp::cpu
