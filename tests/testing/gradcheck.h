// Finite-difference gradient checking of graphs, for the op tests and the block test.
//
// The graph under test is a forward graph whose `parameter` inputs are the differentiated
// operands and whose outputs y0, y1, ... are the differentiated results. The check builds
// L = sum_i <y_i, r_i> with fixed random r_i, takes the joint graph from autodiff, and
// compares each parameter's gradient with central differences of L. L is accumulated in
// double on the host from the fp32 outputs, so the differences see only the fp32 rounding
// of y (about 1e-7 relative), not a rounded fp32 loss.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ops/op.h"
#include "passes/autodiff.h"
#include "runtime/executor.h"

namespace autosp::testing {

// Host data for every input of a graph, by name (f32 in `f`, i32 in `i`).
struct Feed {
  std::map<std::string, std::vector<float>> f;
  std::map<std::string, std::vector<int32_t>> i;

  void bind(CpuExecutor& ex, const Graph& g) const {
    for (ValueId v : g.inputs()) {
      const std::string& name = g.value(v).name;
      if (g.type(v).dtype == DType::i32) ex.bind(v, i.at(name).data());
      else ex.bind(v, f.at(name).data());
    }
  }
};

inline std::vector<float> random_normal(int64_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Random f32 data for every f32 input not already in the feed.
inline void fill_random(Feed& feed, const Graph& g, uint32_t seed) {
  for (ValueId v : g.inputs()) {
    const Value& val = g.value(v);
    if (val.type.dtype == DType::f32 && !feed.f.count(val.name))
      feed.f[val.name] = random_normal(numel(val.type.shape), seed++);
  }
}

inline std::vector<std::string> y_outputs(const Graph& g) {
  std::vector<std::string> names;
  for (const GraphOutput& o : g.outputs())
    if (o.name.size() > 1 && o.name[0] == 'y') names.push_back(o.name);
  return names;
}

// Adds constant inputs r_i and the scalar output "loss" = sum_i sum(y_i * r_i).
inline Graph with_probe_loss(const Graph& forward) {
  for (const GraphOutput& o : forward.outputs())
    AUTOSP_CHECK(o.name != "loss", "the graph under test already has an output named 'loss'");
  Graph g = forward;
  GraphBuilder b(g);
  ValueId loss = -1;
  for (const std::string& name : y_outputs(forward)) {
    ValueId y = forward.output(name);
    ValueId r = g.add_input(Role::constant, forward.type(y), "r_" + name);
    ValueId term = b.emit1(OpKind::sum, {b.emit1(OpKind::mul, {y, r})});
    loss = loss < 0 ? term : b.emit1(OpKind::add, {loss, term});
  }
  g.add_output("loss", loss);
  return g;
}

// L of the executor's last run, its r_i read from `feed`.
inline double probe_loss(const Executor& ex, const Graph& forward, const Feed& feed) {
  double L = 0;
  for (const std::string& name : y_outputs(forward)) {
    std::vector<float> y = ex.output_vector(name);
    const std::vector<float>& r = feed.f.at("r_" + name);
    for (size_t k = 0; k < y.size(); ++k) L += double(y[k]) * double(r[k]);
  }
  return L;
}

struct GradCheckOptions {
  double step = 1e-2;  // central-difference step, scaled by max(1, |x|)
  // |fd - analytic| <= atol + rtol * max|fd| per tensor. The defaults hold because fp32
  // rounding of y perturbs L by ~1e-7 |L| and the O(step^2) truncation error of smooth
  // ops at step 1e-2 is ~1e-4 relative; observed errors are listed where a test overrides.
  double atol = 2e-3, rtol = 5e-3;
};

// Checks every parameter's gradient; returns the worst normalised error seen.
inline double check_gradients(const Graph& forward, Feed feed, uint32_t seed = 1,
                              GradCheckOptions opt = {}) {
  verify(forward);
  Graph probed = with_probe_loss(forward);
  fill_random(feed, probed, seed);
  Graph joint = autodiff(probed);
  verify(joint);

  HeapAllocator alloc;
  CpuExecutor ex(joint, alloc);
  feed.bind(ex, joint);
  ex.run();

  // The forward of the probe graph evaluates L on the host: one executor, run again for each
  // perturbed element of its bound inputs (a rerun must not depend on the previous one).
  Feed probe = feed;
  HeapAllocator probe_alloc;
  CpuExecutor probe_ex(probed, probe_alloc);
  probe.bind(probe_ex, probed);
  const auto L_at = [&](std::vector<float>& xs, size_t k, float value) {
    const float saved = xs[k];
    xs[k] = value;
    probe_ex.run();
    xs[k] = saved;
    return probe_loss(probe_ex, probed, probe);
  };
  double worst = 0;
  for (ValueId p : forward.inputs_with_role(Role::parameter)) {
    const std::string& name = forward.value(p).name;
    std::vector<float> analytic = ex.output_vector(kGradPrefix + name);
    std::vector<double> fd(analytic.size());
    double fd_max = 0;
    std::vector<float>& xs = probe.f.at(name);
    for (size_t k = 0; k < analytic.size(); ++k) {
      const double x = xs[k];
      const double h = opt.step * std::max(1.0, std::abs(x));
      const float plus = float(x + h), minus = float(x - h);
      // The step actually taken after rounding to fp32.
      const double taken = double(plus) - double(minus);
      fd[k] = (L_at(xs, k, plus) - L_at(xs, k, minus)) / taken;
      fd_max = std::max(fd_max, std::abs(fd[k]));
    }
    double err = 0;
    size_t worst_k = 0;
    for (size_t k = 0; k < analytic.size(); ++k) {
      const double e = std::abs(fd[k] - analytic[k]);
      if (e > err) { err = e; worst_k = k; }
    }
    const double bound = opt.atol + opt.rtol * fd_max;
    EXPECT_LE(err, bound) << "gradient of '" << name << "' at element " << worst_k
                          << ": analytic " << analytic[worst_k] << ", finite difference "
                          << fd[worst_k] << " (max |fd| " << fd_max << ")";
    worst = std::max(worst, err / std::max(bound, 1e-30));
  }
  return worst;
}

}  // namespace autosp::testing
