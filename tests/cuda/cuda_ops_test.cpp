// The cuda backend's op-test matrix (ggml's test-backend-ops): every op on the cuda backend
// against the CPU backend, in f32 and in bf16, by normalised error per result, and every
// differentiable op's CUDA gradient against central differences of its CUDA forward.
// Also: the kernels the op graphs cannot reach yet (attention with document ids while the
// op takes three operands, AdamW, NCCL on one rank).
//
// Without a GPU every test is skipped with the reason (GTEST_SKIP), and ctest lists them as
// skipped. The tolerances (cuda/cuda_test_util.h) are set from the arithmetic; on an H200
// (scripts/gpu_check.sh, docs/gpu_check.json, 2026-12-04) the worst errors seen were 5.7e-7
// in f32 (attention with a window and documents), 7.2e-3 in bf16 (attention and its backward
// with documents) and 1.5e-4 of max(1, |fd|) against finite differences (cross_entropy's dz).
// (The bf16 attention cases run cuDNN's attention where it takes them, since it exists.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/nccl_communicator.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/basic.h"
#include "kernels/cuda/kernels.h"
#include "models/llama.h"
#include "passes/plan_memory.h"
#include "ops/cuda_attention.h"
#include "ops/cuda_kernels.h"
#include "ops/op.h"
#include "passes/autodiff.h"
#include "runtime/cuda_executor.h"
#include "runtime/executor.h"
#include "cuda/cuda_test_util.h"
#include "testing/compare.h"
#include "testing/gradcheck.h"
#include "train/adamw.h"
#include "train/cuda_adamw.h"

namespace autosp {
namespace {

using testing::normalised_error;
// cuda/cuda_test_util.h
using testing::as_float;
using testing::attention_reference;
using testing::AttentionImpl;
using testing::AttentionRun;
using testing::AttnRef;
using testing::DeviceBuffer;
using testing::from_bf16;
using testing::kAttentionImpls;
using testing::kBf16Tol;
using testing::kF32Tol;
using testing::random_normal;
using testing::round_bf16;
using testing::to_bf16;

// One test case: a small graph built from its inputs, whose results are the outputs
// y0, y1, ... Floating inputs are made with `dtype` (f32 or bf16) unless `keep_f32` names
// them (statistics and scalars the op rules keep in f32); i32 inputs get `ints`.
struct InputSpec {
  std::string name;
  DType dtype;  // f32 (floating, follows the case's dtype unless keep_f32) or i32
  Shape shape;
  bool keep_f32 = false;
  bool differentiate = true;  // a parameter, for the finite-difference check
};

struct OpCase {
  std::string name;
  std::vector<InputSpec> inputs;
  std::function<std::vector<ValueId>(GraphBuilder&, const std::vector<ValueId>&)> build;
  std::map<std::string, std::vector<int32_t>> ints;
  std::map<std::string, std::vector<float>> floats;  // fixed values (else random normal)
  bool fd = true;  // check gradients against finite differences
  // Results the finite-difference probe differentiates (-1: all): not the log-sum-exp
  // results, through which nothing differentiates.
  int fd_outputs = -1;
};

Graph build_graph(const OpCase& c, DType dtype, int max_outputs = -1) {
  Graph g;
  std::vector<ValueId> ins;
  for (const InputSpec& s : c.inputs) {
    const DType t = s.dtype == DType::i32 ? DType::i32 : (s.keep_f32 ? DType::f32 : dtype);
    const Role role = s.dtype == DType::i32 || !s.differentiate ? Role::constant : Role::parameter;
    ins.push_back(g.add_input(role, {t, s.shape}, s.name));
  }
  GraphBuilder b(g);
  std::vector<ValueId> outs = c.build(b, ins);
  for (size_t i = 0; i < outs.size(); ++i)
    if (max_outputs < 0 || static_cast<int>(i) < max_outputs) g.add_output(str("y", i), outs[i]);
  verify(g);
  return g;
}

// Host data for every input, f32 (bf16-rounded where the bf16 graph will see bf16).
std::map<std::string, std::vector<float>> case_floats(const OpCase& c, bool round) {
  std::map<std::string, std::vector<float>> f;
  uint32_t seed = 7;
  for (const InputSpec& s : c.inputs) {
    if (s.dtype == DType::i32) continue;
    std::vector<float> v = c.floats.count(s.name) ? c.floats.at(s.name) : random_normal(numel(s.shape), seed++);
    f[s.name] = round && !s.keep_f32 ? round_bf16(v) : v;
  }
  return f;
}

// Runs `g` and returns every y output as f32.
std::vector<std::vector<float>> run_outputs(Executor& ex, const Graph& g, const OpCase& c,
                                            const std::map<std::string, std::vector<float>>& floats) {
  std::vector<std::vector<uint16_t>> bf16_inputs;
  bf16_inputs.reserve(g.inputs().size());
  for (ValueId v : g.inputs()) {
    const std::string& name = g.value(v).name;
    const DType t = g.type(v).dtype;
    if (t == DType::i32) ex.bind(v, c.ints.at(name).data());
    else if (t == DType::f32) ex.bind(v, floats.at(name).data());
    else {
      bf16_inputs.push_back(to_bf16(floats.at(name)));
      ex.bind(v, bf16_inputs.back().data());
    }
  }
  ex.run();
  std::vector<std::vector<float>> outs;
  for (const GraphOutput& o : g.outputs()) {
    const TensorType& t = g.type(o.value);
    const void* p = ex.output_data(o.name);
    if (t.dtype == DType::bf16) outs.push_back(from_bf16(static_cast<const uint16_t*>(p), numel(t.shape)));
    else if (t.dtype == DType::f32) {
      const auto* f = static_cast<const float*>(p);
      outs.emplace_back(f, f + numel(t.shape));
    } else {
      const auto* i = static_cast<const int32_t*>(p);
      outs.emplace_back(i, i + numel(t.shape));
    }
  }
  return outs;
}

// ---- the cases ---------------------------------------------------------------------------

std::vector<int32_t> ids(int64_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int32_t>(rng() % uint32_t(vocab));
  return v;
}
std::vector<int32_t> positions(int64_t B, int64_t S, int32_t offset = 0) {
  std::vector<int32_t> v;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) v.push_back(static_cast<int32_t>(s) + offset + int32_t(b) * 3);
  return v;
}
std::vector<int32_t> labels_with_ignored(int64_t n, int32_t V, uint32_t seed) {
  std::vector<int32_t> v = ids(n, V, seed);
  for (size_t i = 0; i < v.size(); i += 4) v[i] = -100;
  return v;
}

using B = GraphBuilder;
using Ins = std::vector<ValueId>;

std::vector<OpCase> op_cases() {
  const int64_t Bt = 2, S = 9, NH = 4, NKV = 2, D = 8, H = 16, V = 13;
  std::vector<OpCase> cases;
  auto one = [](OpKind op, Attrs attrs = {}) {
    return [op, attrs](B& b, const Ins& in) { return b.emit(op, in, attrs); };
  };
  const double scale = 1.0 / std::sqrt(double(D));
  cases.push_back({"fill", {}, [](B& b, const Ins&) { return b.emit(OpKind::fill, {}, {{"shape", Shape{3, 5}}, {"value", 1.5}}); },
                   {}, {}, false});
  cases.push_back({"expand", {{"x", DType::f32, {}}}, one(OpKind::expand, {{"shape", Shape{4, 3}}})});
  cases.push_back({"broadcast", {{"x", DType::f32, {2, 7}}, {"like", DType::i32, {3, 5}}},
                   one(OpKind::broadcast, {{"dims", int64_t{2}}}), {{"like", ids(15, 3, 3)}}});
  cases.push_back({"embedding", {{"w", DType::f32, {11, 8}}, {"t", DType::i32, {2, 5}}}, one(OpKind::embedding),
                   {{"t", ids(10, 11, 1)}}});
  cases.push_back({"embedding_backward", {{"dy", DType::f32, {2, 5, 8}}, {"t", DType::i32, {2, 5}}},
                   one(OpKind::embedding_backward, {{"vocab", int64_t{11}}}), {{"t", ids(10, 4, 2)}}, {}, false});
  cases.push_back({"linear", {{"x", DType::f32, {2, 5, H}}, {"w", DType::f32, {12, H}}}, one(OpKind::linear)});
  cases.push_back({"linear_bias", {{"x", DType::f32, {2, 5, H}}, {"w", DType::f32, {12, H}}, {"b", DType::f32, {12}}},
                   one(OpKind::linear)});
  cases.push_back({"matmul", {{"a", DType::f32, {6, 7}}, {"b", DType::f32, {7, 5}}}, one(OpKind::matmul)});
  cases.push_back({"matmul_ta", {{"a", DType::f32, {7, 6}}, {"b", DType::f32, {7, 5}}},
                   one(OpKind::matmul, {{"trans_a", int64_t{1}}})});
  cases.push_back({"matmul_tb", {{"a", DType::f32, {2, 6, 7}}, {"b", DType::f32, {5, 7}}},
                   one(OpKind::matmul, {{"trans_b", int64_t{1}}})});
  cases.push_back({"matmul_ta_tb", {{"a", DType::f32, {7, 6}}, {"b", DType::f32, {5, 7}}},
                   one(OpKind::matmul, {{"trans_a", int64_t{1}}, {"trans_b", int64_t{1}}})});
  cases.push_back({"add", {{"a", DType::f32, {4, 33}}, {"b", DType::f32, {4, 33}}}, one(OpKind::add)});
  cases.push_back({"mul", {{"a", DType::f32, {4, 33}}, {"b", DType::f32, {4, 33}}}, one(OpKind::mul)});
  cases.push_back({"scale", {{"x", DType::f32, {4, 33}}}, one(OpKind::scale, {{"alpha", 0.7}})});
  cases.push_back({"scale_beta", {{"x", DType::f32, {4, 33}}}, one(OpKind::scale, {{"alpha", 0.5}, {"beta", 0.5}})});
  cases.push_back({"sum", {{"x", DType::f32, {3000}}}, one(OpKind::sum)});
  cases.push_back({"div_scalar", {{"x", DType::f32, {4, 5}}, {"s", DType::f32, {}}}, one(OpKind::div_scalar), {},
                   {{"s", {2.5f}}}});
  // a / b, b held 0.5 or more from 0
  std::vector<float> divisor(4 * 33);
  for (size_t i = 0; i < divisor.size(); ++i) divisor[i] = (i % 2 ? 1.0f : -1.0f) * (0.5f + 0.1f * float(i % 17));
  cases.push_back({"div", {{"a", DType::f32, {4, 33}}, {"b", DType::f32, {4, 33}}}, one(OpKind::div), {},
                   {{"b", divisor}}});
  cases.push_back({"stop_gradient", {{"x", DType::f32, {4, 33}}}, one(OpKind::stop_gradient), {}, {}, false});
  // rows of 300: each block's threads take several elements
  cases.push_back({"vector_norm", {{"x", DType::f32, {5, 300}}}, one(OpKind::vector_norm)});
  cases.push_back({"vector_norm_backward",
                   {{"dy", DType::f32, {5}}, {"x", DType::f32, {5, 33}}, {"y", DType::f32, {5}}},
                   one(OpKind::vector_norm_backward), {}, {{"y", {1.5f, 0.7f, 2.0f, 0.0f, 3.0f}}}, false});
  cases.push_back({"convert_roundtrip", {{"x", DType::f32, {5, 7}}},
                   [](B& b, const Ins& in) {
                     ValueId h = b.emit1(OpKind::convert, {in[0]}, {{"dtype", std::string("bf16")}});
                     return std::vector<ValueId>{b.emit1(OpKind::convert, {h}, {{"dtype", std::string("f32")}})};
                   }, {}, {}, false});
  cases.push_back({"silu", {{"x", DType::f32, {4, 33}}}, one(OpKind::silu)});
  cases.push_back({"silu_backward", {{"dy", DType::f32, {4, 33}}, {"x", DType::f32, {4, 33}}}, one(OpKind::silu_backward),
                   {}, {}, false});
  // relu's x at least 0.1 from the kink, where the finite difference is exact.
  std::vector<float> away_from_zero(4 * 33);
  for (size_t i = 0; i < away_from_zero.size(); ++i) away_from_zero[i] = 0.1f + 0.2f * float((i * 37) % 23) - 2.2f;
  cases.push_back({"relu", {{"x", DType::f32, {4, 33}}}, one(OpKind::relu), {}, {{"x", away_from_zero}}});
  cases.push_back({"relu_backward", {{"dy", DType::f32, {4, 33}}, {"x", DType::f32, {4, 33}}}, one(OpKind::relu_backward),
                   {}, {}, false});
  cases.push_back({"tanh", {{"x", DType::f32, {4, 33}}}, one(OpKind::tanh)});
  // clamp to [-1, 1] (x at odd tenths: 0.1 from the bounds), and to a max alone.
  const Attrs clip{{"min", -1.0}, {"max", 1.0}};
  cases.push_back({"clamp", {{"x", DType::f32, {4, 33}}}, one(OpKind::clamp, clip), {}, {{"x", away_from_zero}}});
  cases.push_back({"clamp_max", {{"x", DType::f32, {4, 33}}}, one(OpKind::clamp, {{"max", 1.0}}), {},
                   {{"x", away_from_zero}}});
  cases.push_back({"clamp_backward", {{"dy", DType::f32, {4, 33}}, {"x", DType::f32, {4, 33}}},
                   one(OpKind::clamp_backward, clip), {}, {{"x", away_from_zero}}, false});
  // xIELU's x held 0.1 from its kinks at 0 and eps, as relu's.
  cases.push_back({"xielu", {{"x", DType::f32, {4, 33}}, {"ap", DType::f32, {1}}, {"an", DType::f32, {1}}},
                   one(OpKind::xielu, {{"beta", 0.5}, {"eps", -1e-6}}), {}, {{"x", away_from_zero}}});
  cases.push_back({"tanh_backward",
                   {{"dy", DType::f32, {4, 33}}, {"y", DType::f32, {4, 33}}},
                   one(OpKind::tanh_backward),
                   {},
                   {},
                   false});
  cases.push_back({"swiglu", {{"g", DType::f32, {4, 33}}, {"u", DType::f32, {4, 33}}}, one(OpKind::swiglu)});
  cases.push_back({"swiglu_backward",
                   {{"dy", DType::f32, {4, 33}}, {"g", DType::f32, {4, 33}}, {"u", DType::f32, {4, 33}}},
                   one(OpKind::swiglu_backward), {}, {}, false});
  cases.push_back({"rms_norm", {{"x", DType::f32, {2, 5, H}}, {"w", DType::f32, {H}}},
                   [](B& b, const Ins& in) {
                     return std::vector<ValueId>{b.emit(OpKind::rms_norm, in, {{"eps", 1e-5}})[0]};
                   }});
  cases.push_back({"rms_norm_and_backward", {{"x", DType::f32, {2, 5, H}}, {"w", DType::f32, {H}}, {"dy", DType::f32, {2, 5, H}}},
                   [](B& b, const Ins& in) {
                     auto f = b.emit(OpKind::rms_norm, {in[0], in[1]}, {{"eps", 1e-5}});
                     auto d = b.emit(OpKind::rms_norm_backward, {in[2], in[0], in[1], f[1]});
                     return std::vector<ValueId>{f[0], f[1], d[0], d[1]};
                   }, {}, {}, false});
  for (const char* approximate : {"none", "tanh"}) {
    const Attrs a{{"approximate", std::string(approximate)}};
    cases.push_back({str("gelu_", approximate), {{"x", DType::f32, {4, 33}}}, one(OpKind::gelu, a)});
    cases.push_back({str("gelu_backward_", approximate), {{"dy", DType::f32, {4, 33}}, {"x", DType::f32, {4, 33}}},
                     one(OpKind::gelu_backward, a), {}, {}, false});
  }
  cases.push_back({"layer_norm", {{"x", DType::f32, {2, 5, H}}, {"w", DType::f32, {H}}, {"b", DType::f32, {H}}},
                   [](B& b, const Ins& in) {
                     return std::vector<ValueId>{b.emit(OpKind::layer_norm, in, {{"eps", 1e-5}})[0]};
                   }});
  cases.push_back({"layer_norm_and_backward",
                   {{"x", DType::f32, {2, 5, H}}, {"w", DType::f32, {H}}, {"b", DType::f32, {H}}, {"dy", DType::f32, {2, 5, H}}},
                   [](B& b, const Ins& in) {
                     auto f = b.emit(OpKind::layer_norm, {in[0], in[1], in[2]}, {{"eps", 1e-5}});
                     auto d = b.emit(OpKind::layer_norm_backward, {in[3], in[0], in[1], f[1], f[2]});
                     return std::vector<ValueId>{f[0], f[1], f[2], d[0], d[1], d[2]};
                   }, {}, {}, false});
  cases.push_back({"rope", {{"x", DType::f32, {Bt, 6, 3, D}}, {"p", DType::i32, {Bt, 6}}},
                   one(OpKind::rope, {{"theta", 10000.0}}), {{"p", positions(Bt, 6)}}});
  cases.push_back({"rope_interleaved", {{"x", DType::f32, {Bt, 6, 3, D}}, {"p", DType::i32, {Bt, 6}}},
                   one(OpKind::rope, {{"theta", 10000.0}, {"interleaved", int64_t{1}}}), {{"p", positions(Bt, 6)}}});
  cases.push_back({"rope_frequencies", {{"x", DType::f32, {Bt, 6, 3, D}}, {"p", DType::i32, {Bt, 6}}},
                   one(OpKind::rope, {{"rope_type", std::string("frequencies")},
                                      {"inv_freq", std::vector<double>{0.8, 0.31, 0.0125, 3.5e-4}}}),
                   {{"p", positions(Bt, 6, 100)}}});
  cases.push_back({"rope_inverse_llama3", {{"x", DType::f32, {Bt, 6, 3, D}}, {"p", DType::i32, {Bt, 6}}},
                   one(OpKind::rope, {{"theta", 500000.0}, {"inverse", int64_t{1}}, {"rope_type", std::string("llama3")},
                                      {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                      {"original_max_position_embeddings", 8.0}}),
                   {{"p", positions(Bt, 6, 100)}}});
  // The fused kernels' paths at the op level (cuda_fused_test.cpp holds them to the reference
  // kernels): 16-byte vectors over whole rows (H = 4096, 40), a row of 257 vectors (2048 + 8),
  // the scalar fallback (1030), over an odd number of rows (7); swiglu's flat tail (7 H % 8);
  // rope with D = 128 (vectors in both dtypes). The values are O(1) and each result rounds
  // once in bf16, so kBf16Tol's reasoning holds at these sizes; the finite differences stay
  // with the small cases above.
  for (const int64_t h : {int64_t{4096}, int64_t{2048 + 8}, int64_t{40}, int64_t{1030}}) {
    cases.push_back({str("rms_norm_and_backward_H", h),
                     {{"x", DType::f32, {1, 7, h}}, {"w", DType::f32, {h}}, {"dy", DType::f32, {1, 7, h}}},
                     [](B& b, const Ins& in) {
                       auto f = b.emit(OpKind::rms_norm, {in[0], in[1]}, {{"eps", 1e-5}});
                       auto d = b.emit(OpKind::rms_norm_backward, {in[2], in[0], in[1], f[1]});
                       return std::vector<ValueId>{f[0], f[1], d[0], d[1]};
                     }, {}, {}, false});
    cases.push_back({str("swiglu_and_backward_H", h),
                     {{"g", DType::f32, {1, 7, h}}, {"u", DType::f32, {1, 7, h}}, {"dy", DType::f32, {1, 7, h}}},
                     [](B& b, const Ins& in) {
                       auto d = b.emit(OpKind::swiglu_backward, {in[2], in[0], in[1]});
                       return std::vector<ValueId>{b.emit1(OpKind::swiglu, {in[0], in[1]}), d[0], d[1]};
                     }, {}, {}, false});
    cases.push_back({str("embedding_and_backward_H", h),
                     {{"w", DType::f32, {11, h}}, {"t", DType::i32, {1, 7}}, {"dy", DType::f32, {1, 7, h}}},
                     [](B& b, const Ins& in) {
                       return std::vector<ValueId>{b.emit1(OpKind::embedding, {in[0], in[1]}),
                                                   b.emit1(OpKind::embedding_backward, {in[2], in[1]},
                                                           {{"vocab", int64_t{11}}})};
                     }, {{"t", {3, 9, 3, 0, 10, 3, 9}}}, {}, false});
  }
  cases.push_back({"rope_D128", {{"x", DType::f32, {1, 3, 4, 128}}, {"p", DType::i32, {1, 3}}},
                   one(OpKind::rope, {{"theta", 500000.0}}), {{"p", positions(1, 3, 4000)}}, {}, false});
  // attention(q, k, v[, doc]) alone (finite differences through out, not lse), and its
  // backward fed by it; doc empty: no document ids.
  // Dv: v's head dim (0: D).
  auto attention_case = [&](const std::string& name, const Attrs& a, const std::vector<int32_t>& doc = {},
                            int64_t Dv = 0) {
    std::vector<InputSpec> in = {{"q", DType::f32, {Bt, S, NH, D}}, {"k", DType::f32, {Bt, S, NKV, D}},
                                 {"v", DType::f32, {Bt, S, NKV, Dv ? Dv : D}}};
    if (!doc.empty()) in.push_back({"doc", DType::i32, {Bt, S}});
    cases.push_back({name, in, [a](B& b, const Ins& x) { return b.emit(OpKind::attention, x, a); },
                     doc.empty() ? std::map<std::string, std::vector<int32_t>>{}
                                 : std::map<std::string, std::vector<int32_t>>{{"doc", doc}},
                     {}, true, 1});
  };
  auto attention_and_backward_case = [&](const std::string& name, const Attrs& a,
                                         const std::vector<int32_t>& doc = {}, int64_t Dv = 0) {
    std::vector<InputSpec> in = {{"q", DType::f32, {Bt, S, NH, D}}, {"k", DType::f32, {Bt, S, NKV, D}},
                                 {"v", DType::f32, {Bt, S, NKV, Dv ? Dv : D}},
                                 {"dout", DType::f32, {Bt, S, NH, Dv ? Dv : D}}};
    const bool docs = !doc.empty();
    if (docs) in.push_back({"doc", DType::i32, {Bt, S}});
    cases.push_back({name, in,
                     [a, docs](B& b, const Ins& x) {
                       std::vector<ValueId> fwd = {x[0], x[1], x[2]};
                       if (docs) fwd.push_back(x[4]);
                       auto f = b.emit(OpKind::attention, fwd, a);
                       std::vector<ValueId> bwd = {x[3], x[0], x[1], x[2], f[0], f[1]};
                       if (docs) bwd.push_back(x[4]);
                       return b.emit(OpKind::attention_backward, bwd, a);
                     },
                     docs ? std::map<std::string, std::vector<int32_t>>{{"doc", doc}}
                          : std::map<std::string, std::vector<int32_t>>{},
                     {}, false});
  };
  for (int causal : {1, 0}) {
    const Attrs a{{"causal", int64_t{causal}}, {"scale", scale}};
    attention_case(str("attention_", causal ? "causal" : "full"), a);
    attention_and_backward_case(str("attention_and_backward_", causal ? "causal" : "full"), a);
  }
  // Document ids: row 0 of three documents, row 1 of two.
  {
    std::vector<int32_t> doc;
    for (int64_t b = 0; b < Bt; ++b)
      for (int64_t i = 0; i < S; ++i) doc.push_back(static_cast<int32_t>(b == 0 ? i / 3 : (i < 5 ? 0 : 1)));
    const Attrs a{{"causal", int64_t{1}}, {"scale", scale}};
    attention_case("attention_documents", a, doc);
    attention_and_backward_case("attention_and_backward_documents", a, doc);
  }
  // A sliding window shorter than S (Mistral's), alone and with documents.
  {
    std::vector<int32_t> doc;
    for (int64_t b = 0; b < Bt; ++b)
      for (int64_t i = 0; i < S; ++i) doc.push_back(static_cast<int32_t>(i < S / 2 ? 0 : 1));
    const Attrs a{{"causal", int64_t{1}}, {"scale", scale}, {"window", int64_t{3}}};
    attention_case("attention_window", a);
    attention_and_backward_case("attention_and_backward_window_documents", a, doc);
  }
  // Gemma 2's attention logit softcap, with a window: the cuda blocks against the CPU kernels.
  {
    const Attrs a{{"causal", int64_t{1}}, {"scale", scale}, {"window", int64_t{3}}, {"softcap", 0.5}};
    attention_case("attention_softcap", a);
    attention_and_backward_case("attention_and_backward_softcap", a);
  }
  // gpt-oss's sinks, with documents, GQA and a window: the fold after the kernels and dsinks.
  {
    const Attrs a{{"causal", int64_t{1}}, {"scale", scale}, {"window", int64_t{3}}, {"sinks", int64_t{1}}};
    std::vector<int32_t> doc;
    for (int64_t b = 0; b < Bt; ++b)
      for (int64_t i = 0; i < S; ++i) doc.push_back(static_cast<int32_t>(b == 1 && i >= 4));
    const std::vector<InputSpec> in = {{"q", DType::f32, {Bt, S, NH, D}},   {"k", DType::f32, {Bt, S, NKV, D}},
                                       {"v", DType::f32, {Bt, S, NKV, D}},  {"sinks", DType::f32, {NH}},
                                       {"dout", DType::f32, {Bt, S, NH, D}}, {"doc", DType::i32, {Bt, S}}};
    cases.push_back({"attention_sinks", {in[0], in[1], in[2], in[3], in[5]}, one(OpKind::attention, a),
                     {{"doc", doc}}, {}, true, 1});
    cases.push_back({"attention_and_backward_sinks", in,
                     [a](B& b, const Ins& x) {
                       const auto f = b.emit(OpKind::attention, {x[0], x[1], x[2], x[3], x[5]}, a);
                       return b.emit(OpKind::attention_backward, {x[4], x[0], x[1], x[2], f[0], f[1], x[3], x[5]}, a);
                     },
                     {{"doc", doc}}, {}, false});
  }
  // Llama 4's chunks (of 3, with documents) and temperature (factors up to 1.8 at S 10): the chunks'
  // document ids and the tempered queries made on the device, then the kernels as they are.
  {
    std::vector<int32_t> doc;
    for (int64_t b = 0; b < Bt; ++b)
      for (int64_t i = 0; i < S; ++i) doc.push_back(static_cast<int32_t>(b == 1 && i >= 4));
    const Attrs chunked{{"causal", int64_t{1}}, {"scale", scale}, {"chunk", int64_t{3}}};
    attention_case("attention_chunked", chunked);
    attention_and_backward_case("attention_and_backward_chunked_documents", chunked, doc);
    const Attrs tempered{{"causal", int64_t{1}}, {"scale", scale}, {"temperature", std::vector<double>{2.0, 0.5}}};
    attention_case("attention_tempered", tempered);
    attention_and_backward_case("attention_and_backward_tempered", tempered);
  }
  // Values of their own head dim, narrower (DeepSeek-V3's) and wider: the cuda kernels run on
  // zero-padded copies of the narrower side (ops/attention.cpp's CudaPadding).
  for (int64_t Dv : {D / 2, D + 4}) {
    const Attrs a{{"causal", int64_t{1}}, {"scale", scale}};
    attention_case(str("attention_values_", Dv), a, {}, Dv);
    attention_and_backward_case(str("attention_and_backward_values_", Dv), a, {}, Dv);
  }
  // ALiBi (BLOOM, MPT) with documents: the cuda blocks, slopes by value, against the CPU kernels.
  {
    std::vector<double> slopes;
    for (int64_t h = 0; h < NH; ++h) slopes.push_back(1.0 / double(2 << h));
    const Attrs a{{"causal", int64_t{1}}, {"scale", scale}, {"alibi", slopes}};
    std::vector<int32_t> doc;  // row 0 one document, row 1 two
    for (int64_t b = 0; b < Bt; ++b)
      for (int64_t i = 0; i < S; ++i) doc.push_back(static_cast<int32_t>(b == 1 && i >= 4));
    attention_and_backward_case("attention_and_backward_alibi", a, doc);
  }
  cases.push_back({"cross_entropy", {{"z", DType::f32, {2, 5, V}}, {"l", DType::i32, {2, 5}}},
                   one(OpKind::cross_entropy), {{"l", labels_with_ignored(10, V, 3)}}, {}, true, 1});
  cases.push_back({"cross_entropy_and_backward",
                   {{"z", DType::f32, {2, 5, V}}, {"l", DType::i32, {2, 5}}, {"d", DType::f32, {}, true}},
                   [](B& b, const Ins& in) {
                     auto f = b.emit(OpKind::cross_entropy, {in[0], in[1]});
                     auto d = b.emit1(OpKind::cross_entropy_backward, {in[2], in[0], in[1], f[1]});
                     return std::vector<ValueId>{f[0], f[1], d};
                   }, {{"l", labels_with_ignored(10, V, 4)}}, {{"d", {0.75f}}}, false});
  cases.push_back({"linear_cross_entropy", {{"x", DType::f32, {2, 5, H}}, {"w", DType::f32, {V, H}}, {"l", DType::i32, {2, 5}}},
                   one(OpKind::linear_cross_entropy, {{"chunk", int64_t{3}}}), {{"l", labels_with_ignored(10, V, 5)}}, {},
                   true, 1});
  cases.push_back({"linear_cross_entropy_and_backward",
                   {{"x", DType::f32, {2, 5, H}}, {"w", DType::f32, {V, H}}, {"l", DType::i32, {2, 5}},
                    {"d", DType::f32, {}, true}},
                   [](B& b, const Ins& in) {
                     const Attrs a{{"chunk", int64_t{3}}};
                     auto f = b.emit(OpKind::linear_cross_entropy, {in[0], in[1], in[2]}, a);
                     auto d = b.emit(OpKind::linear_cross_entropy_backward, {in[3], in[0], in[1], in[2], f[1]}, a);
                     return std::vector<ValueId>{f[0], f[1], d[0], d[1]};
                   }, {{"l", labels_with_ignored(10, V, 6)}}, {{"d", {1.25f}}}, false});
  // With Gemma 2's final logit softcap (capped in the row kernels).
  cases.push_back({"linear_cross_entropy_and_backward_softcap",
                   {{"x", DType::f32, {2, 5, H}}, {"w", DType::f32, {V, H}}, {"l", DType::i32, {2, 5}},
                    {"d", DType::f32, {}, true}},
                   [](B& b, const Ins& in) {
                     const Attrs a{{"chunk", int64_t{3}}, {"softcap", 1.5}};
                     auto f = b.emit(OpKind::linear_cross_entropy, {in[0], in[1], in[2]}, a);
                     auto d = b.emit(OpKind::linear_cross_entropy_backward, {in[3], in[0], in[1], in[2], f[1]}, a);
                     return std::vector<ValueId>{f[0], f[1], d[0], d[1]};
                   }, {{"l", labels_with_ignored(10, V, 6)}}, {{"d", {1.25f}}}, false});
  // The fuse pass's form of the pair (the cuda kernel runs the pair's two kernels).
  cases.push_back({"linear_cross_entropy_with_grad",
                   {{"x", DType::f32, {2, 5, H}}, {"w", DType::f32, {V, H}}, {"l", DType::i32, {2, 5}},
                    {"d", DType::f32, {}, true}},
                   one(OpKind::linear_cross_entropy_with_grad, {{"chunk", int64_t{3}}}),
                   {{"l", labels_with_ignored(10, V, 6)}}, {{"d", {1.25f}}}, false});
  // The mixture-of-experts block: 4 experts, top 2, normalised; each token's logits a permutation
  // of 0, 0.5, 1, 1.5 (exact in bf16, and no difference step changes a token's experts).
  {
    const int64_t E = 4, I = 12;
    std::vector<float> logits;
    std::vector<int> order = {0, 1, 2, 3};
    for (int64_t r = 0; r < 2 * 5; ++r) {
      std::next_permutation(order.begin(), order.end());
      for (int e = 0; e < E; ++e) logits.push_back(0.5f * float(order[e]));
    }
    std::vector<InputSpec> in = {{"x", DType::f32, {2, 5, H}}, {"logits", DType::f32, {2, 5, E}}};
    for (int64_t e = 0; e < E; ++e) {
      in.push_back({str("gate", e), DType::f32, {I, H}});
      in.push_back({str("up", e), DType::f32, {I, H}});
      in.push_back({str("down", e), DType::f32, {H, I}});
    }
    const Attrs a{{"top_k", int64_t{2}}, {"normalize", int64_t{1}}};
    // (the saved products are compared too; the gradient probe differentiates y alone)
    cases.push_back({"moe", in, one(OpKind::moe, a), {}, {{"logits", logits}}, true, 1});
    std::vector<InputSpec> back = in;
    back.insert(back.begin(), InputSpec{"dy", DType::f32, {2, 5, H}});
    cases.push_back({"moe_backward", back,
                     [a](B& b, const Ins& x) {
                       const Ins w(x.begin() + 3, x.end());
                       Ins fwd{x[1], x[2]};
                       fwd.insert(fwd.end(), w.begin(), w.end());
                       const auto f = b.emit(OpKind::moe, fwd, a);
                       Ins ins{x[0], x[1], x[2], f[1]};
                       ins.insert(ins.end(), w.begin(), w.end());
                       return b.emit(OpKind::moe_backward, ins, a);
                     },
                     {}, {{"logits", logits}}, false});
    // The same experts stacked as transformers 5 keeps them (gate_up [E, 2 I, H], down [E, H, I]):
    // the kernels read each expert's matrices in place, and write its gradients there.
    const std::vector<InputSpec> stacked = {{"x", DType::f32, {2, 5, H}}, {"logits", DType::f32, {2, 5, E}},
                                            {"gate_up", DType::f32, {E, 2 * I, H}}, {"down", DType::f32, {E, H, I}}};
    cases.push_back({"moe_stacked", stacked, one(OpKind::moe, a), {}, {{"logits", logits}}, true, 1});
    std::vector<InputSpec> stacked_back = stacked;
    stacked_back.insert(stacked_back.begin(), InputSpec{"dy", DType::f32, {2, 5, H}});
    cases.push_back({"moe_stacked_backward", stacked_back,
                     [a](B& b, const Ins& x) {
                       const auto f = b.emit(OpKind::moe, {x[1], x[2], x[3], x[4]}, a);
                       return b.emit(OpKind::moe_backward, {x[0], x[1], x[2], f[1], x[3], x[4]}, a);
                     },
                     {}, {{"logits", logits}}, false});
    // Routers beyond softmax top-k (moe_routing.h, the CPU's functions compiled for the device),
    // forward and backward: GLM-4.5's and DeepSeek-V3's (sigmoid scores plus a correction bias, 2
    // groups of 2 scored by their two best, 1 kept, normalised over the chosen plus 1e-20, times
    // 2.5) and Ernie 4.5's kind with the weights unnormalised (softmax plus a bias, times 2: the
    // backward through the full softmax). The biases keep every choice 0.05 or more from a tie.
    const std::vector<double> bias = {0.1, -0.2, 0.05, 0.3};
    const Attrs grouped{{"top_k", int64_t{2}},    {"normalize", int64_t{1}},  {"score", std::string("sigmoid")},
                        {"groups", int64_t{2}},   {"topk_group", int64_t{1}}, {"group_score", std::string("top2")},
                        {"scale", 2.5},           {"norm_eps", 1e-20},        {"bias", bias}};
    const Attrs biased{{"top_k", int64_t{2}}, {"normalize", int64_t{0}}, {"scale", 2.0}, {"bias", bias}};
    for (const auto& [name, attrs] : {std::pair<const char*, Attrs>{"moe_grouped_sigmoid", grouped},
                                      {"moe_biased_softmax", biased}}) {
      cases.push_back({name, stacked, one(OpKind::moe, attrs), {}, {{"logits", logits}}, true, 1});
      cases.push_back({str(name, "_backward"), stacked_back,
                       [attrs](B& b, const Ins& x) {
                         const auto f = b.emit(OpKind::moe, {x[1], x[2], x[3], x[4]}, attrs);
                         return b.emit(OpKind::moe_backward, {x[0], x[1], x[2], f[1], x[3], x[4]}, attrs);
                       },
                       {}, {{"logits", logits}}, false});
    }
    // gpt-oss's experts (biases, gate and up interleaved, the clamped GLU; a limit of 1 that
    // clamps some of these products), forward and backward.
    {
      const Attrs oss{{"top_k", int64_t{2}}, {"normalize", int64_t{1}}, {"experts", std::string("gpt_oss")},
                      {"alpha", 1.702}, {"limit", 1.0}};
      const std::vector<InputSpec> w = {{"x", DType::f32, {2, 5, H}},           {"logits", DType::f32, {2, 5, E}},
                                        {"gate_up", DType::f32, {E, H, 2 * I}}, {"gate_up_bias", DType::f32, {E, 2 * I}},
                                        {"down", DType::f32, {E, I, H}},        {"down_bias", DType::f32, {E, H}}};
      cases.push_back({"moe_gpt_oss", w, one(OpKind::moe, oss), {}, {{"logits", logits}}, true, 1});
      std::vector<InputSpec> back = w;
      back.insert(back.begin(), InputSpec{"dy", DType::f32, {2, 5, H}});
      cases.push_back({"moe_gpt_oss_backward", back,
                       [oss](B& b, const Ins& x) {
                         const auto f = b.emit(OpKind::moe, {x[1], x[2], x[3], x[4], x[5], x[6]}, oss);
                         return b.emit(OpKind::moe_backward, {x[0], x[1], x[2], f[1], x[3], x[4], x[5], x[6]}, oss);
                       },
                       {}, {{"logits", logits}}, false});
    }
    // Llama 4's experts (gate_up [E, H, 2 I] of the gate's columns then the up's, SwiGLU, no biases),
    // its sigmoid router weighting each expert's input; and the input weighted on stacked experts.
    {
      const Attrs llama4{{"top_k", int64_t{2}}, {"normalize", int64_t{0}}, {"experts", std::string("llama4")},
                         {"weight_input", int64_t{1}}, {"score", std::string("sigmoid")}};
      const std::vector<InputSpec> w = {{"x", DType::f32, {2, 5, H}}, {"logits", DType::f32, {2, 5, E}},
                                        {"gate_up", DType::f32, {E, H, 2 * I}}, {"down", DType::f32, {E, I, H}}};
      const Attrs weighted{{"top_k", int64_t{2}}, {"normalize", int64_t{1}}, {"weight_input", int64_t{1}}};
      // LongCat-Flash's zero-computation experts: the last 2 of the E the logits score, identities
      const Attrs zero{{"top_k", int64_t{2}}, {"normalize", int64_t{0}}, {"zero_experts", int64_t{2}}, {"scale", 2.0}};
      const std::vector<InputSpec> fewer = {{"x", DType::f32, {2, 5, H}}, {"logits", DType::f32, {2, 5, E}},
                                            {"gate_up", DType::f32, {E - 2, 2 * I, H}},
                                            {"down", DType::f32, {E - 2, H, I}}};
      for (const auto& [name, form, inputs] :
           {std::tuple<const char*, Attrs, std::vector<InputSpec>>{"moe_llama4", llama4, w},
            {"moe_stacked_input_weighted", weighted, stacked}, {"moe_zero_experts", zero, fewer}}) {
        const Attrs attrs = form;
        cases.push_back({name, inputs, one(OpKind::moe, attrs), {}, {{"logits", logits}}, true, 1});
        std::vector<InputSpec> back = inputs;
        back.insert(back.begin(), InputSpec{"dy", DType::f32, {2, 5, H}});
        cases.push_back({str(name, "_backward"), back,
                         [attrs](B& b, const Ins& x) {
                           const auto f = b.emit(OpKind::moe, {x[1], x[2], x[3], x[4]}, attrs);
                           return b.emit(OpKind::moe_backward, {x[0], x[1], x[2], f[1], x[3], x[4]}, attrs);
                         },
                         {}, {{"logits", logits}}, false});
      }
    }
    // The load-balancing statistics of two layers' logits (the same spaced values), and their
    // backward.
    cases.push_back({"moe_balance", {{"a", DType::f32, {2, 5, E}}, {"b", DType::f32, {2, 5, E}}},
                     one(OpKind::moe_balance, {{"top_k", int64_t{2}}}), {}, {{"a", logits}, {"b", logits}}});
    cases.push_back({"moe_balance_backward",
                     {{"d", DType::f32, {2, E}, true}, {"a", DType::f32, {2, 5, E}}, {"b", DType::f32, {2, 5, E}}},
                     one(OpKind::moe_balance_backward, {{"top_k", int64_t{2}}}), {}, {{"a", logits}, {"b", logits}},
                     false});
  }
  cases.push_back({"count_valid", {{"l", DType::i32, {2, 5}}},
                   one(OpKind::count_valid), {{"l", labels_with_ignored(10, V, 7)}}, {}, false});
  cases.push_back({"reshape_then_scale", {{"x", DType::f32, {2, 3, 4}}},
                   [](B& b, const Ins& in) {
                     ValueId r = b.emit1(OpKind::reshape, in, {{"shape", Shape{6, 4}}});
                     return std::vector<ValueId>{b.emit1(OpKind::scale, {r}, {{"alpha", 2.0}})};
                   }});
  cases.push_back({"transpose", {{"x", DType::f32, {2, 3, 4, 5}}}, one(OpKind::transpose, {{"perm", Shape{2, 0, 3, 1}}})});
  cases.push_back({"slice", {{"x", DType::f32, {2, 7, 3}}}, one(OpKind::slice, {{"dim", int64_t{1}}, {"start", int64_t{1}}, {"end", int64_t{5}}})});
  cases.push_back({"slice_backward", {{"x", DType::f32, {2, 3, 3}}},
                   one(OpKind::slice_backward, {{"dim", int64_t{1}}, {"start", int64_t{2}}, {"size", int64_t{7}}}),
                   {}, {}, false});
  cases.push_back({"concat", {{"a", DType::f32, {2, 3, 4}}, {"b", DType::f32, {2, 2, 4}}}, one(OpKind::concat, {{"dim", int64_t{1}}})});
  return cases;
}

class CudaOps : public ::testing::TestWithParam<OpCase> {};

// Every result of every case: cuda f32 and cuda bf16 against the CPU's f32.
TEST_P(CudaOps, MatchesTheCpuBackend) {
  SKIP_WITHOUT_GPU();
  const OpCase& c = GetParam();
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const bool bf16 = dtype == DType::bf16;
    const auto floats = case_floats(c, bf16);
    const Graph cpu_graph = build_graph(c, DType::f32), cuda_graph = build_graph(c, dtype);
    HeapAllocator alloc;
    CpuExecutor cpu(cpu_graph, alloc);
    CudaExecutor gpu(cuda_graph);
    const auto want = run_outputs(cpu, cpu_graph, c, floats);
    const auto got = run_outputs(gpu, cuda_graph, c, floats);
    ASSERT_EQ(want.size(), got.size());
    for (size_t i = 0; i < want.size(); ++i) {
      const double err = normalised_error(got[i], want[i]);
      std::printf("%-36s %-4s y%zu normalised error %.2e\n", c.name.c_str(), dtype_name(dtype), i, err);
      EXPECT_LT(err, bf16 ? kBf16Tol : kF32Tol) << c.name << " y" << i;
    }
  }
}

// The CUDA gradient (the joint graph on cuda, f32) against central differences of the CUDA
// forward, at up to 12 elements of every differentiated input. L = sum_i <y_i, r_i> in
// double on the host; step 1e-2 * max(1, |x|): truncation O(step^2) ~ 1e-4 relative, fp32
// rounding of y ~ 1e-7 |L| / step: |fd - analytic| <= 2e-3 + 5e-3 max|fd| (gradcheck.h's
// CPU tolerance, whose reasoning is the same on the device).
TEST_P(CudaOps, GradientsMatchFiniteDifferences) {
  SKIP_WITHOUT_GPU();
  const OpCase& c = GetParam();
  if (!c.fd) GTEST_SKIP() << c.name << ": a backward op or one without a gradient (checked against the CPU above)";
  const Graph forward = build_graph(c, DType::f32, c.fd_outputs);
  if (forward.inputs_with_role(Role::parameter).empty()) GTEST_SKIP() << c.name << ": no floating input";
  Graph probed = testing::with_probe_loss(forward);
  auto floats = case_floats(c, false);
  uint32_t seed = 100;
  for (const std::string& y : testing::y_outputs(forward))
    floats["r_" + y] = random_normal(numel(forward.type(forward.output(y)).shape), seed++);
  OpCase probe_case = c;
  for (const auto& [name, v] : floats) probe_case.floats[name] = v;
  const Graph joint = autodiff(probed);
  CudaExecutor grad_ex(joint);
  run_outputs(grad_ex, joint, probe_case, floats);

  CudaExecutor fwd(forward);
  auto L = [&](const std::map<std::string, std::vector<float>>& f) {
    const auto ys = run_outputs(fwd, forward, c, f);
    double sum = 0;
    const auto names = testing::y_outputs(forward);
    for (size_t i = 0; i < names.size(); ++i) {
      const auto& r = floats.at("r_" + names[i]);
      for (size_t k = 0; k < ys[i].size(); ++k) sum += double(ys[i][k]) * double(r[k]);
    }
    return sum;
  };
  for (ValueId p : forward.inputs_with_role(Role::parameter)) {
    const std::string& name = forward.value(p).name;
    const float* g = static_cast<const float*>(grad_ex.output_data(kGradPrefix + name));
    std::vector<float>& x = floats.at(name);
    std::vector<double> fd, an;
    const size_t stride = std::max<size_t>(1, x.size() / 12);
    for (size_t k = 0; k < x.size(); k += stride) {
      const float x0 = x[k];
      const float h = 1e-2f * std::max(1.0f, std::abs(x0));
      x[k] = x0 + h;
      const double up = L(floats);
      x[k] = x0 - h;
      const double down = L(floats);
      x[k] = x0;
      fd.push_back((up - down) / (double(x0 + h) - double(x0 - h)));
      an.push_back(g[k]);
    }
    double worst = 0, scale = 0;
    for (size_t k = 0; k < fd.size(); ++k) worst = std::max(worst, std::abs(fd[k] - an[k])), scale = std::max(scale, std::abs(fd[k]));
    std::printf("%-36s d%s: |fd - cuda| %.2e (max |fd| %.2e)\n", c.name.c_str(), name.c_str(), worst, scale);
    EXPECT_LE(worst, 2e-3 + 5e-3 * scale) << c.name << " d" << name;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryOp, CudaOps, ::testing::ValuesIn(op_cases()),
                         [](const auto& info) { return info.param.name; });

// Every op kind has a CUDA kernel in this build (the rules are checked by
// tests/passes/lower_test.cpp, in every build).
TEST(CudaKernelTable, EveryOpHasAKernel) {
  std::string missing;
  for (int i = 0; i < kNumOps; ++i) {
    const OpKind op = static_cast<OpKind>(i);
    if (op != OpKind::input && !op_def(op).cuda.run) missing += str(op_name(op), " ");
  }
  EXPECT_EQ(missing, "") << "ops without a CUDA kernel";
}

// The reference attention kernels keep a row of D floats in registers: a larger D is refused
// on the host before any launch (so this runs without a GPU too), never written past.
TEST(CudaAttentionKernel, ReferenceRefusesAHeadDimPastItsRegisters) {
  const cuda::AttentionDims d{1, 8, 2, 1, cuda::kAttentionMaxD + 1};
  for (const bool backward : {false, true}) {
    try {
      if (backward)
        cuda::attention_backward(cuda::Dt::f32, d, true, 0, 1.0f, 0.0f, nullptr, nullptr, nullptr, nullptr, nullptr,
                                 nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
      else
        cuda::attention_forward(cuda::Dt::f32, d, true, 0, 1.0f, 0.0f, nullptr, nullptr, nullptr, nullptr, nullptr,
                                nullptr, nullptr);
      ADD_FAILURE() << "D = " << d.D << " was launched (backward " << backward << ")";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("head dim D = 257"), std::string::npos) << e.what();
    }
  }
}

// Without a GPU (this test runs only there): asking for the backend is a UserError that
// says why and what to do, not a crash.
TEST(CudaExecutorNoDevice, IsAClearUserError) {
  std::string why;
  if (cuda_device_count(&why) > 0) GTEST_SKIP() << "a CUDA device is present";
  Graph g;
  ValueId x = g.add_input(Role::constant, {DType::f32, {4}}, "x");
  GraphBuilder b(g);
  g.add_output("y", b.emit1(OpKind::scale, {x}, {{"alpha", 2.0}}));
  HeapAllocator alloc;
  try {
    make_executor(Backend::cuda, g, alloc);
    ADD_FAILURE() << "a cuda executor was made without a device";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--backend cpu"), std::string::npos) << e.what();
  }
}

// ---- attention with document ids, at the kernel (the op takes them as a 4th operand) -------


// f32 kernels against the double reference, packed documents (ids non-decreasing), causal
// and not, one tile and several (S = 150 > the 64-row blocks and the tile of 4096 / D keys).
TEST(CudaAttentionKernel, DocumentIdsMaskAcrossDocuments) {
  SKIP_WITHOUT_GPU();
  for (const AttentionImpl& impl : kAttentionImpls) {
    const AttentionRun runner(impl);
    for (int64_t S : {9, 150}) {
      for (bool causal : {true, false}) {
        SCOPED_TRACE(str(impl.name, ", S=", S, causal ? " causal" : " full"));
        const cuda::AttentionDims d{2, S, 4, 2, 16};
        const double scale = 1.0 / std::sqrt(16.0);
        const auto q = random_normal(d.B * S * d.NH * d.D, 1), k = random_normal(d.B * S * d.NKV * d.D, 2),
                   v = random_normal(d.B * S * d.NKV * d.D, 3), dout = random_normal(d.B * S * d.NH * d.D, 4);
        std::vector<int32_t> doc;
        for (int64_t b = 0; b < d.B; ++b)
          for (int64_t i = 0; i < S; ++i) doc.push_back(static_cast<int32_t>(b == 0 ? i / 4 : (i < S / 2 ? 0 : 1)));
        const AttnRef ref = attention_reference(d, causal, scale, q, k, v, dout, doc);
        DeviceBuffer<float> dq_(q), dk_(k), dv_(v), ddout(dout), out(q.size()), lse(ref.lse.size()), gq(q.size()),
            gk(k.size()), gv(v.size()), delta(ref.lse.size());
        DeviceBuffer<int32_t> ddoc(doc);
        runner.run(d, causal, float(scale), dq_.p, dk_.p, dv_.p, ddoc.p, out.p, lse.p, ddout.p, gq.p, gk.p, gv.p,
                   delta.p);
        check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize", "attention kernels");
        // f32 against double over sums of <= S terms: ~S * 2^-24; 2e-5 as kF32Tol.
        EXPECT_LT(normalised_error(out.host(), as_float(ref.out)), kF32Tol);
        EXPECT_LT(normalised_error(lse.host(), as_float(ref.lse)), kF32Tol);
        EXPECT_LT(normalised_error(gq.host(), as_float(ref.dq)), kF32Tol);
        EXPECT_LT(normalised_error(gk.host(), as_float(ref.dk)), kF32Tol);
        EXPECT_LT(normalised_error(gv.host(), as_float(ref.dv)), kF32Tol);
      }
    }
  }
}

// Without document ids the kernels equal the double reference (kernels/cpu/attention.h's) on a
// sequence of several tiles and blocks (the op cases above use S = 9, inside one), with and
// without a sliding window (which starts a block's keys after the sequence's first), and with
// and without Gemma 2's logit softcap c tanh(s / c): c = 2 with scores ~ N(0, 1) bends most of
// them (tanh(0.5) is 8% under 0.5), so a missing cap, or a backward without its 1 - tanh^2, is
// far outside kF32Tol; and with ALiBi (slopes 1/2 and 1/16: a bias of -150 and -19 at the far
// keys), which a missing or misplaced bias misses by far more.
TEST(CudaAttentionKernel, LongSequenceMatchesTheDoubleReference) {
  SKIP_WITHOUT_GPU();
  for (const AttentionImpl& impl : kAttentionImpls)
    for (int64_t window : {int64_t{0}, int64_t{50}})
      for (int variant : {0, 1, 2}) {  // plain, softcap 2, ALiBi slopes 1/2 and 1/16
        const double softcap = variant == 1 ? 2.0 : 0.0;
        const bool with_alibi = variant == 2;
        SCOPED_TRACE(str(impl.name, ", window ", window, ", softcap ", softcap, with_alibi ? ", alibi" : ""));
        const std::vector<double> slopes64 = {0.5, 0.0625};
        cuda::AlibiSlopes slopes;
        if (with_alibi) slopes.n = 2, slopes.a[0] = 0.5f, slopes.a[1] = 0.0625f;
        const double* alibi64 = with_alibi ? slopes64.data() : nullptr;
        const AttentionRun runner(impl);
        const cuda::AttentionDims d{1, 300, 2, 1, 64};
        const cpu::AttentionDims cd{d.B, d.S, d.NH, d.NKV, d.D};
        const double scale = 0.125;
        const auto q = random_normal(d.S * d.NH * d.D, 5), k = random_normal(d.S * d.NKV * d.D, 6),
                   v = random_normal(d.S * d.NKV * d.D, 7), dout = random_normal(d.S * d.NH * d.D, 8);
        auto dbl = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
        const std::vector<double> q64 = dbl(q), k64 = dbl(k), v64 = dbl(v), dout64 = dbl(dout);
        AttnRef ref{std::vector<double>(q.size()), std::vector<double>(size_t(d.NH * d.S)),
                    std::vector<double>(q.size()), std::vector<double>(k.size()), std::vector<double>(v.size())};
        cpu::attention_forward_reference(cd, true, scale, q64.data(), k64.data(), v64.data(), ref.out.data(),
                                         ref.lse.data(), nullptr, window, softcap, alibi64);
        cpu::attention_backward_reference(cd, true, scale, q64.data(), k64.data(), v64.data(), dout64.data(),
                                          ref.dq.data(), ref.dk.data(), ref.dv.data(), nullptr, window, softcap,
                                          alibi64);
        DeviceBuffer<float> dq_(q), dk_(k), dv_(v), ddout(dout), out(q.size()), lse(ref.lse.size()), gq(q.size()),
            gk(k.size()), gv(v.size()), delta(ref.lse.size());
        runner.run(d, true, float(scale), dq_.p, dk_.p, dv_.p, nullptr, out.p, lse.p, ddout.p, gq.p, gk.p, gv.p,
                   delta.p, window, cuda::Dt::f32, float(softcap), slopes);
        check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize", "attention kernels");
        EXPECT_LT(normalised_error(out.host(), as_float(ref.out)), kF32Tol);
        EXPECT_LT(normalised_error(lse.host(), as_float(ref.lse)), kF32Tol);
        EXPECT_LT(normalised_error(gq.host(), as_float(ref.dq)), kF32Tol);
        EXPECT_LT(normalised_error(gk.host(), as_float(ref.dk)), kF32Tol);
        EXPECT_LT(normalised_error(gv.host(), as_float(ref.dv)), kF32Tol);
      }
}

// The blocks in bf16, the cuda backend's training dtype, over a sequence of several blocks:
// the op cases run bf16 attention only at S = 9, inside one block, so a causal block's
// shorter key range, GQA's second kv head and a window's later first key meet bf16 only
// here. Inputs bf16-rounded, the double reference from the same rounded values. lse is fp32
// from fp32 scores (cuBLAS accumulates bf16 products in fp32): kF32Tol. out, dq, dk, dv are
// bf16 results, P and dS are rounded to bf16 before their products and the backward reads
// the bf16 out (delta): kBf16Tol's two or three roundings. A float64 model of these
// roundings (numpy, four seeds, with and without the window) gives 1.9e-3 to 4.6e-3 here.
TEST(CudaAttentionKernel, Bf16BlocksOverALongSequenceMatchTheDoubleReference) {
  SKIP_WITHOUT_GPU();
  const auto as_f32 = [](const DeviceBuffer<uint16_t>& b) {
    const std::vector<uint16_t> h = b.host();
    return from_bf16(h.data(), static_cast<int64_t>(h.size()));
  };
  for (const AttentionImpl& impl : kAttentionImpls) {
    if (impl.rows == 0) continue;  // the blocks only: the ops' bf16 path
    const AttentionRun runner(impl);
    for (int64_t window : {int64_t{0}, int64_t{50}}) {
      SCOPED_TRACE(str(impl.name, ", window ", window));
      const cuda::AttentionDims d{1, 300, 4, 2, 64};
      const double scale = 0.125;
      const auto q = round_bf16(random_normal(d.S * d.NH * d.D, 9)), k = round_bf16(random_normal(d.S * d.NKV * d.D, 10)),
                 v = round_bf16(random_normal(d.S * d.NKV * d.D, 11)),
                 dout = round_bf16(random_normal(d.S * d.NH * d.D, 12));
      const std::vector<int32_t> doc(size_t(d.S), 0);  // one document: no mask beyond causality and the window
      const AttnRef ref = attention_reference(d, true, scale, q, k, v, dout, doc, window);
      DeviceBuffer<uint16_t> bq(to_bf16(q)), bk(to_bf16(k)), bv(to_bf16(v)), bdout(to_bf16(dout)), out(q.size()),
          gq(q.size()), gk(k.size()), gv(v.size());
      DeviceBuffer<float> lse(ref.lse.size());
      runner.run(d, true, float(scale), bq.p, bk.p, bv.p, nullptr, out.p, lse.p, bdout.p, gq.p, gk.p, gv.p, nullptr,
                 window, cuda::Dt::bf16);
      EXPECT_LT(normalised_error(lse.host(), as_float(ref.lse)), kF32Tol);
      EXPECT_LT(normalised_error(as_f32(out), as_float(ref.out)), kBf16Tol);
      EXPECT_LT(normalised_error(as_f32(gq), as_float(ref.dq)), kBf16Tol);
      EXPECT_LT(normalised_error(as_f32(gk), as_float(ref.dk)), kBf16Tol);
      EXPECT_LT(normalised_error(as_f32(gv), as_float(ref.dv)), kBf16Tol);
    }
  }
}

// ---- AdamW on the device against train::adamw_step -------------------------------------------

// The same fp32 operations in the same order with the same fused multiply-adds (explicit
// __fmaf_rn / std::fma, IEEE division and square root on both sides): equal to fp32
// rounding; 1e-6 normalised allows one ulp where a compiler contracts differently.
TEST(CudaAdamW, EqualsTheHostUpdateAndWritesTheBf16Copy) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 5000;
  for (bool decoupled : {true, false}) {
    SCOPED_TRACE(decoupled ? "AdamW" : "Adam (L2)");
    train::AdamWParams params{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                              .decoupled_weight_decay = decoupled};
    auto p = random_normal(n, 1), g = random_normal(n, 2), m = random_normal(n, 3, 0.1f), v = random_normal(n, 4, 0.1f);
    for (float& x : v) x = x * x;
    DeviceBuffer<float> dp(p), dg(g), dm(m), dv(v);
    DeviceBuffer<uint16_t> copy{static_cast<size_t>(n)};
    for (int64_t step = 1; step <= 3; ++step) {
      train::adamw_step(p.data(), g.data(), m.data(), v.data(), n, params, step, params.lr);
      train::cuda_adamw_step(dp.p, dg.p, dm.p, dv.p, n, params, step, params.lr, copy.p, nullptr);
    }
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize", "adamw");
    EXPECT_LT(normalised_error(dp.host(), p), 1e-6);
    EXPECT_LT(normalised_error(dm.host(), m), 1e-6);
    EXPECT_LT(normalised_error(dv.host(), v), 1e-6);
    const auto c = copy.host();
    EXPECT_EQ(from_bf16(c.data(), n), round_bf16(dp.host())) << "the bf16 copy is the fp32 weight rounded once";
  }
}

// ---- NCCL on one rank, and the collectives as graph ops on it ----------------------------

TEST(CudaNccl, OneRankCollectivesAreCopiesAndSums) {
  SKIP_WITHOUT_GPU();
  auto comm = NcclCommunicator::single("test group");
  ASSERT_EQ(comm->size(), 1);
  const auto x = random_normal(100, 9);
  DeviceBuffer<float> a(x), b(x.size());
  comm->all_reduce_sum(a.p, 100);
  EXPECT_EQ(a.host(), x);
  comm->all_gather(a.p, b.p, 100);
  EXPECT_EQ(b.host(), x);
  comm->all_to_all(a.p, b.p, 100);
  EXPECT_EQ(b.host(), x);
  comm->reduce_scatter_sum(a.p, b.p, 100);
  EXPECT_EQ(b.host(), x);
  comm->barrier();
}

TEST(CudaNccl, CollectiveOpsRunInTheExecutor) {
  SKIP_WITHOUT_GPU();
  ProcessGroups groups;
  groups.world = NcclCommunicator::single("world");
  groups.sp = NcclCommunicator::single("sp");
  groups.dp = NcclCommunicator::single("dp");
  Graph g;
  ValueId x = g.add_input(Role::constant, {DType::f32, {2, 4, 3}}, "x");
  GraphBuilder b(g);
  const Attrs group{{"group", std::string("sp")}, {"size", int64_t{1}}};
  Attrs a2a = group, ag = group;
  a2a.set("scatter_dim", int64_t{2});
  a2a.set("gather_dim", int64_t{1});
  ag.set("dim", int64_t{1});
  g.add_output("y0", b.emit1(OpKind::all_to_all, {x}, a2a));
  g.add_output("y1", b.emit1(OpKind::all_reduce, {x}, group));
  g.add_output("y2", b.emit1(OpKind::all_gather, {x}, ag));
  g.add_output("y3", b.emit1(OpKind::reduce_scatter, {x}, ag));
  CudaExecutor ex(g, &groups);
  const auto data = random_normal(24, 10);
  ex.bind("x", data.data());
  ex.run();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ex.output_vector(str("y", i)), data) << "y" << i;
}

// A bad token id is a UserError after the step, naming the op.
TEST(CudaExecutor, OutOfRangeTokenIsAUserError) {
  SKIP_WITHOUT_GPU();
  Graph g;
  ValueId w = g.add_input(Role::parameter, {DType::f32, {5, 4}}, "w");
  ValueId t = g.add_input(Role::tokens, {DType::i32, {3}}, "t");
  GraphBuilder b(g);
  g.add_output("y", b.emit1(OpKind::embedding, {w, t}));
  CudaExecutor ex(g);
  const auto wd = random_normal(20, 1);
  const std::vector<int32_t> ids{0, 7, 1};
  ex.bind("w", wd.data());
  ex.bind("t", ids.data());
  EXPECT_THROW(ex.run(), UserError);
}

}  // namespace
}  // namespace autosp
