#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/basic.h"
#include "kernels/cpu/fused.h"
#include "kernels/cpu/moe_experts.h"
#include "kernels/cpu/moe_routing.h"

namespace autosp::cpu {

namespace {

// One token's scores s [E] (double), its k experts in descending order of the choice, and
// their weights w [k] (moe_routing.h).
void route_token(const MoeDims& d, const moe_routing::Route& route, const float* l, double* s, int32_t* chosen,
                 double* w) {
  moe_routing::scores(route.sigmoid, [l](int64_t e) { return double(l[e]); }, d.E, s);
  moe_routing::choose(route, s, d.E, d.k, chosen, w);
}

// The routing's integer arrays, laid out at the start of the workspace.
struct Routing {
  int32_t* experts;  // [T, k]
  float* weights;    // [T, k]
  int32_t* slots;    // [T k]: the slots t k + j, by expert, ascending t within each
  int32_t* start;    // [E + 1]: expert e's slots are slots[start[e] .. start[e + 1])
};

int64_t routing_floats(const MoeDims& d) { return 3 * d.T * d.k + d.E + 1; }

Routing route(const MoeDims& d, const float* logits, float* ws) {
  Routing r{reinterpret_cast<int32_t*>(ws), ws + d.T * d.k, reinterpret_cast<int32_t*>(ws + 2 * d.T * d.k),
            reinterpret_cast<int32_t*>(ws + 3 * d.T * d.k)};
  moe_route(d, logits, r.experts, r.weights);
  moe_slots(d, r.experts, r.slots, r.start);
  return r;
}

// The router's gradient dlogits [T, E] from each slot's dw [T k], in double (moe_routing.h).
void router_backward(const MoeDims& d, const float* logits, const float* dws, float* dlogits) {
  const moe_routing::Route router = moe_route_of(d);
#pragma omp parallel
  {
    std::vector<double> s(d.E), w(d.k);
    std::vector<int32_t> chosen(d.k);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < d.T; ++t) {
      route_token(d, router, logits + t * d.E, s.data(), chosen.data(), w.data());
      float* dl = dlogits + t * d.E;
      moe_routing::backward(router, s.data(), d.E, d.k, chosen.data(), w.data(), dws + t * d.k,
                            [dl](int64_t e, float v) { dl[e] = v; });
    }
  }
}

// y[t] += w_j o_i for each of n rows o [n, H] of the slots (transformers' order: the expert's
// output weighted, then added); weights null: w_j = 1. A token is one expert's at most once, so
// the rows' threads never share a y row.
void scatter_weighted(const MoeDims& d, const float* o, const int32_t* slots, const float* weights, int64_t n,
                      float* y) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float wj = weights ? weights[slots[i]] : 1.0f;
    float* yt = y + int64_t(slots[i] / d.k) * d.H;
    const float* oi = o + i * d.H;
    for (int64_t h = 0; h < d.H; ++h) yt[h] += wj * oi[h];
  }
}

// The gradient of each of n slots' weight, dws[slot] = <dy_i, o_i>, and the expert's output
// gradient dout_i = w_j dy_i (weights null: w_j = 1, the input weighted instead), from the
// gathered dy [n, H] and the expert's outputs o [n, H].
void output_grad(const MoeDims& d, const float* dys, const float* o, const int32_t* slots, const float* weights,
                 int64_t n, float* dout, float* dws) {
  const int64_t H = d.H;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float *dyi = dys + i * H, *oi = o + i * H;
    float* di = dout + i * H;
    double s = 0;
    for (int64_t h = 0; h < H; ++h) s += double(dyi[h]) * double(oi[h]);
    dws[slots[i]] = float(s);
    const float wj = weights ? weights[slots[i]] : 1.0f;
    for (int64_t h = 0; h < H; ++h) di[h] = wj * dyi[h];
  }
}

// rows[i, :] = src[slots[i] / k, :] for i < n (a token's row, gathered).
void gather_rows(const float* src, const int32_t* slots, int64_t n, int64_t k, int64_t H, float* rows) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) std::copy_n(src + int64_t(slots[i] / k) * H, H, rows + i * H);
}

// The gathered rows of x as the experts take them: x[t] itself, or with the input weighted
// (MoeExperts::weight_input) w_j x[t].
void gather_inputs(const MoeDims& d, const float* x, const int32_t* slots, const float* weights, int64_t n,
                   float* rows) {
  gather_rows(x, slots, n, d.k, d.H, rows);
  if (!d.experts.weight_input) return;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float wj = weights[slots[i]];
    for (int64_t h = 0; h < d.H; ++h) rows[i * d.H + h] *= wj;
  }
}

// The weights the outputs are scattered with (null: 1, the inputs were weighted), and the ones
// the inputs' gradients are.
const float* output_weights(const MoeDims& d, const float* weights) { return d.experts.weight_input ? nullptr : weights; }
const float* input_weights(const MoeDims& d, const float* weights) { return d.experts.weight_input ? weights : nullptr; }

// With the input weighted, each slot's weight gradient from the gradient at the expert's input
// dxs [n, H]: dws[slot] = <dxs_i, x[t]> (output_grad's were of the unweighted output).
void input_weight_grad(const MoeDims& d, const float* dxs, const float* x, const int32_t* slots, int64_t n,
                       float* dws) {
  if (!d.experts.weight_input) return;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float *di = dxs + i * d.H, *xt = x + int64_t(slots[i] / d.k) * d.H;
    double s = 0;
    for (int64_t h = 0; h < d.H; ++h) s += double(di[h]) * double(xt[h]);
    dws[slots[i]] = float(s);
  }
}

// The zero-computation experts' slots (MoeDims::zero_experts), after the computed ones':
// y[t] += w_j x[t], chunk by chunk through xs [R, H].
void identity_forward(const MoeDims& d, const Routing& r, const float* x, float* xs, float* y) {
  const int64_t R = std::min(d.T * d.k, kMoeChunkRows);
  for_each_expert_chunk(d.experts_with_weights(), d.E, r.start, R, [&](int64_t, int64_t at, int64_t n) {
    gather_rows(x, r.slots + at, n, d.k, d.H, xs);
    scatter_weighted(d, xs, r.slots + at, r.weights, n, y);
  });
}
// ... and their gradients: dws[slot] = <dy[t], x[t]>, dx[t] += w_j dy[t] (through xs, dys, dout [R, H]).
void identity_backward(const MoeDims& d, const Routing& r, const float* dy, const float* x, float* xs, float* dys,
                       float* dout, float* dws, float* dx) {
  const int64_t R = std::min(d.T * d.k, kMoeChunkRows);
  for_each_expert_chunk(d.experts_with_weights(), d.E, r.start, R, [&](int64_t, int64_t at, int64_t n) {
    gather_rows(x, r.slots + at, n, d.k, d.H, xs);
    gather_rows(dy, r.slots + at, n, d.k, d.H, dys);
    output_grad(d, dys, xs, r.slots + at, r.weights, n, dout, dws);
    scatter_weighted(d, dout, r.slots + at, nullptr, n, dx);
  });
}

}  // namespace

moe_routing::Route moe_route_of(const MoeDims& d) {
  const MoeRouting& r = d.routing;
  return {.normalize = d.normalize, .sigmoid = r.sigmoid, .group_top2 = r.group_top2, .dropped_zero = r.dropped_zero,
          .groups = int32_t(r.groups), .topk_group = int32_t(r.topk_group), .scale = r.scale, .norm_eps = r.norm_eps,
          .bias = r.bias.empty() ? nullptr : r.bias.data()};
}

void moe_route(const MoeDims& d, const float* logits, int32_t* experts, float* weights) {
  const moe_routing::Route router = moe_route_of(d);
#pragma omp parallel
  {
    std::vector<double> s(d.E), w(d.k);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < d.T; ++t) {
      route_token(d, router, logits + t * d.E, s.data(), experts + t * d.k, w.data());
      for (int64_t j = 0; j < d.k; ++j) weights[t * d.k + j] = float(w[j]);
    }
  }
}

void moe_slots(const MoeDims& d, const int32_t* experts, int32_t* slots, int32_t* start) {
  std::fill_n(start, d.E + 1, 0);
  for (int64_t s = 0; s < d.T * d.k; ++s) ++start[experts[s] + 1];
  for (int64_t e = 0; e < d.E; ++e) start[e + 1] += start[e];
  std::vector<int32_t> next(start, start + d.E);
  for (int64_t s = 0; s < d.T * d.k; ++s) slots[next[experts[s]]++] = int32_t(s);
}

int64_t moe_saved_floats(const MoeDims& d) { return d.T * d.k * (2 * d.I + d.H); }

int64_t moe_workspace_floats(const MoeDims& d, bool backward) {
  const int64_t R = std::min(d.T * d.k, kMoeChunkRows);
  // forward: x rows, the swiglu (fused: and the fused gate and up products); backward: each
  // slot's dw, and x, dy and dout rows, the swiglu, its gradient and the gate's and up's (fused:
  // the two fused, in the same room).
  const int64_t forward = R * (d.H + d.I + (d.experts.fused() ? 2 * d.I : 0));
  return routing_floats(d) + (backward ? d.T * d.k + R * (3 * d.H + 4 * d.I) : forward);
}

void moe_forward(const MoeDims& d, const float* x, const float* logits, const float* const* w, float* y, float* saved,
                 float* workspace) {
  const Routing r = route(d, logits, workspace);
  const int64_t R = std::min(d.T * d.k, kMoeChunkRows), H = d.H, I = d.I;
  float* xs = workspace + routing_floats(d);
  float* hh = xs + R * H;
  std::fill_n(y, d.T * H, 0.0f);
  for_each_expert_chunk(d.experts_with_weights(), r.start, R, [&](int64_t e, int64_t at, int64_t n) {
    const int32_t* slots = r.slots + at;
    const MoeSavedAt s = moe_saved_at(d, at);
    float *g = saved + s.g, *u = saved + s.u, *o = saved + s.o;
    gather_inputs(d, x, slots, r.weights, n, xs);
    gemm(false, true, n, I, H, xs, w[3 * e], g);
    gemm(false, true, n, I, H, xs, w[3 * e + 1], u);
    swiglu_forward(g, u, n * I, hh);
    gemm(false, !d.down_transposed, n, H, I, hh, w[3 * e + 2], o);
    scatter_weighted(d, o, slots, output_weights(d, r.weights), n, y);
  });
  identity_forward(d, r, x, xs, y);
}

void moe_backward(const MoeDims& d, const float* dy, const float* x, const float* logits, const float* saved,
                  const float* const* w, float* dx, float* dlogits, float* const* dw, float* workspace) {
  const Routing r = route(d, logits, workspace);
  const int64_t R = std::min(d.T * d.k, kMoeChunkRows), H = d.H, I = d.I;
  float* dws = workspace + routing_floats(d);  // [T k]: dw of each slot
  float* xs = dws + d.T * d.k;
  float *dys = xs + R * H, *dout = dys + R * H, *hh = dout + R * H, *dh = hh + R * I, *dg = dh + R * I;
  float* du = dg + R * I;
  std::fill_n(dx, d.T * H, 0.0f);
  for (int64_t m = 0; m < 3 * d.experts_with_weights(); ++m) std::fill_n(dw[m], I * H, 0.0f);
  for_each_expert_chunk(d.experts_with_weights(), r.start, R, [&](int64_t e, int64_t at, int64_t n) {
    const int32_t* slots = r.slots + at;
    const MoeSavedAt s = moe_saved_at(d, at);
    const float *g = saved + s.g, *u = saved + s.u, *o = saved + s.o;
    gather_inputs(d, x, slots, r.weights, n, xs);
    gather_rows(dy, slots, n, d.k, H, dys);
    swiglu_forward(g, u, n * I, hh);
    output_grad(d, dys, o, slots, output_weights(d, r.weights), n, dout, dws);
    if (d.down_transposed)
      gemm(true, false, I, H, n, hh, dout, dw[3 * e + 2], true);  // ddown^T += h^T dout
    else
      gemm(true, false, H, I, n, dout, hh, dw[3 * e + 2], true);  // ddown += dout^T h
    gemm(false, d.down_transposed, n, I, H, dout, w[3 * e + 2], dh);  // dh = dout down
    swiglu_backward(dh, g, u, n * I, dg, du);
    gemm(true, false, I, H, n, dg, xs, dw[3 * e], true);      // dgate_e += dg^T x
    gemm(true, false, I, H, n, du, xs, dw[3 * e + 1], true);  // dup_e += du^T x
    gemm(false, false, n, H, I, dg, w[3 * e], dys);           // dx rows = dg gate + du up
    gemm(false, false, n, H, I, du, w[3 * e + 1], dys, true);
    input_weight_grad(d, dys, x, slots, n, dws);
    scatter_weighted(d, dys, slots, input_weights(d, r.weights), n, dx);
  });
  identity_backward(d, r, dy, x, xs, dys, dout, dws, dx);
  router_backward(d, logits, dws, dlogits);
}

void moe_fused_forward(const MoeDims& d, const float* x, const float* logits, const FusedExperts& w, float* y,
                       float* saved, float* workspace) {
  const Routing r = route(d, logits, workspace);
  const int64_t R = std::min(d.T * d.k, kMoeChunkRows), H = d.H, I = d.I;
  const moe_experts::FusedForm form = d.experts.fused_form();
  float* xs = workspace + routing_floats(d);
  float *hh = xs + R * H, *gu = hh + R * I;
  std::fill_n(y, d.T * H, 0.0f);
  for_each_expert_chunk(d.experts_with_weights(), r.start, R, [&](int64_t e, int64_t at, int64_t n) {
    const float *b_gu = w.gate_up_bias ? w.gate_up_bias + e * 2 * I : nullptr;
    const float* b_d = w.down_bias ? w.down_bias + e * H : nullptr;
    const int32_t* slots = r.slots + at;
    const MoeSavedAt s = moe_saved_at(d, at);
    float *g = saved + s.g, *u = saved + s.u, *o = saved + s.o;
    gather_inputs(d, x, slots, r.weights, n, xs);
    gemm(false, false, n, 2 * I, H, xs, w.gate_up + e * H * 2 * I, gu);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < I; ++j) {
        const int64_t cg = moe_experts::gate_column(form, I, j), cu = moe_experts::up_column(form, I, j);
        g[i * I + j] = gu[i * 2 * I + cg] + (b_gu ? b_gu[cg] : 0.0f);
        u[i * I + j] = gu[i * 2 * I + cu] + (b_gu ? b_gu[cu] : 0.0f);
        hh[i * I + j] = moe_experts::glu(form, g[i * I + j], u[i * I + j]).h;
      }
    gemm(false, false, n, H, I, hh, w.down + e * I * H, o);
    if (b_d) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t h = 0; h < H; ++h) o[i * H + h] += b_d[h];
    }
    scatter_weighted(d, o, slots, output_weights(d, r.weights), n, y);
  });
  identity_forward(d, r, x, xs, y);
}

void moe_fused_backward(const MoeDims& d, const float* dy, const float* x, const float* logits, const float* saved,
                        const FusedExperts& w, float* dx, float* dlogits, const FusedExpertGrads& dw,
                        float* workspace) {
  const Routing r = route(d, logits, workspace);
  const int64_t R = std::min(d.T * d.k, kMoeChunkRows), H = d.H, I = d.I;
  const moe_experts::FusedForm form = d.experts.fused_form();
  float* dws = workspace + routing_floats(d);  // [T k]: dw of each slot
  float* xs = dws + d.T * d.k;
  float *dys = xs + R * H, *dout = dys + R * H, *hh = dout + R * H, *dh = hh + R * I, *dgu = dh + R * I;
  std::fill_n(dx, d.T * H, 0.0f);
  const int64_t Ew = d.experts_with_weights();
  std::fill_n(dw.gate_up, Ew * H * 2 * I, 0.0f);
  std::fill_n(dw.down, Ew * I * H, 0.0f);
  if (dw.gate_up_bias) std::fill_n(dw.gate_up_bias, Ew * 2 * I, 0.0f);
  if (dw.down_bias) std::fill_n(dw.down_bias, Ew * H, 0.0f);
  for_each_expert_chunk(Ew, r.start, R, [&](int64_t e, int64_t at, int64_t n) {
    const int32_t* slots = r.slots + at;
    const MoeSavedAt s = moe_saved_at(d, at);
    const float *g = saved + s.g, *u = saved + s.u, *o = saved + s.o;
    gather_inputs(d, x, slots, r.weights, n, xs);
    gather_rows(dy, slots, n, d.k, H, dys);
    // (o with its bias: the expert's output)
    output_grad(d, dys, o, slots, output_weights(d, r.weights), n, dout, dws);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n * I; ++i) hh[i] = moe_experts::glu(form, g[i], u[i]).h;
    gemm(true, false, I, H, n, hh, dout, dw.down + e * I * H, true);  // ddown += h^T dout
    gemm(false, true, n, I, H, dout, w.down + e * I * H, dh);         // dh = dout down^T
    // d[g | u], in gate_up's columns
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < I; ++j) {
        const moe_experts::Glu a = moe_experts::glu(form, g[i * I + j], u[i * I + j]);
        dgu[i * 2 * I + moe_experts::gate_column(form, I, j)] = dh[i * I + j] * a.dg;
        dgu[i * 2 * I + moe_experts::up_column(form, I, j)] = dh[i * I + j] * a.du;
      }
    gemm(true, false, H, 2 * I, n, xs, dgu, dw.gate_up + e * H * 2 * I, true);  // dgate_up += x^T d[g | u]
    gemm(false, true, n, H, 2 * I, dgu, w.gate_up + e * H * 2 * I, dys);        // dx rows = d[g | u] gate_up^T
    // the biases' sums over the rows, in the rows' order (the same on any thread count)
    if (float* db_gu = dw.gate_up_bias ? dw.gate_up_bias + e * 2 * I : nullptr) {
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < 2 * I; ++j)
        for (int64_t i = 0; i < n; ++i) db_gu[j] += dgu[i * 2 * I + j];
    }
    if (float* db_d = dw.down_bias ? dw.down_bias + e * H : nullptr) {
#pragma omp parallel for schedule(static)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < n; ++i) db_d[h] += dout[i * H + h];
    }
    input_weight_grad(d, dys, x, slots, n, dws);
    scatter_weighted(d, dys, slots, input_weights(d, r.weights), n, dx);
  });
  identity_backward(d, r, dy, x, xs, dys, dout, dws, dx);
  router_backward(d, logits, dws, dlogits);
}

void moe_balance_stats(const float* logits, int64_t T, int64_t E, int64_t k, double* counts, double* psum) {
  std::vector<double> p(E);
  std::vector<int32_t> chosen(k);
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    moe_routing::scores(false, [l](int64_t e) { return double(l[e]); }, E, p.data());
    moe_routing::top_k([&p](int64_t e) { return p[e]; }, E, k, chosen.data());
    for (int64_t j = 0; j < k; ++j) counts[chosen[j]] += 1.0;
    for (int64_t e = 0; e < E; ++e) psum[e] += p[e];
  }
}

void moe_balance_backward(const float* g, const float* logits, int64_t T, int64_t E, float* dlogits) {
#pragma omp parallel
  {
    std::vector<double> p(E);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* l = logits + t * E;
      moe_routing::scores(false, [l](int64_t e) { return double(l[e]); }, E, p.data());
      double dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += double(g[e]) * p[e];
      for (int64_t e = 0; e < E; ++e) dlogits[t * E + e] = float(p[e] * (double(g[e]) - dot));
    }
  }
}

}  // namespace autosp::cpu
