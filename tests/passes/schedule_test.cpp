// schedule: the golden order of two independent chains (the greedy frees each chain's big
// buffer before starting the other); the same nodes in a valid order; never a larger
// planned arena than the input order; and bitwise the input order's results, on the tiny
// Llama in a deliberately bad order that the pass repairs.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <map>

#include "frontend/tracer.h"
#include "passes/autodiff.h"
#include "passes/autosp.h"
#include "passes/plan_memory.h"
#include "passes/schedule.h"
#include "runtime/executor.h"
#include "testing/golden.h"
#include "testing/memory.h"

namespace autosp {
namespace {

int64_t arena_of(const Graph& g, int threads = 1) {
  return read_memory_plan(plan_memory(g, {.threads = threads})).arena_bytes;
}

// The graph with its nodes in `order` (a topological order of g's nodes, inputs first).
Graph in_order(const Graph& g, const std::vector<NodeId>& order) {
  Graph out;
  std::vector<ValueId> map(g.values().size(), -1);
  for (NodeId n : order) {
    const Node& node = g.node(n);
    std::vector<ValueId> inputs;
    for (ValueId v : node.inputs) inputs.push_back(map.at(v));
    std::vector<TensorType> types;
    for (ValueId v : node.outputs) types.push_back(g.type(v));
    const NodeId m = out.add_node(node.op, inputs, node.attrs, types);
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      map[node.outputs[i]] = out.node(m).outputs[i];
      out.mutable_value(map[node.outputs[i]]).name = g.value(node.outputs[i]).name;
      out.mutable_value(map[node.outputs[i]]).sharding = g.value(node.outputs[i]).sharding;
    }
  }
  for (const GraphOutput& o : g.outputs()) out.add_output(o.name, map[o.value]);
  verify(out);
  return out;
}

// A bad order: each step runs the ready node that keeps the most bytes live (largest result
// first, frees last), so big buffers pile up before anything reads them.
Graph hoarding_order(const Graph& g) {
  std::vector<int> pending(g.nodes().size(), 0), uses(g.values().size(), 0);
  for (const Node& n : g.nodes())
    for (ValueId v : n.inputs) ++uses[v];
  std::vector<NodeId> order, ready;
  for (NodeId n = 0; n < static_cast<NodeId>(g.nodes().size()); ++n) {
    pending[n] = static_cast<int>(g.node(n).inputs.size());
    if (g.node(n).op == OpKind::input) order.push_back(n);
    else if (pending[n] == 0) ready.push_back(n);
  }
  std::vector<std::vector<NodeId>> consumers(g.values().size());
  for (NodeId n = 0; n < static_cast<NodeId>(g.nodes().size()); ++n)
    for (ValueId v : g.node(n).inputs) consumers[v].push_back(n);
  auto done = [&](NodeId n) {
    for (ValueId out : g.node(n).outputs)
      for (NodeId c : consumers[out])
        if (--pending[c] == 0) ready.push_back(c);
  };
  for (NodeId n : std::vector<NodeId>(order)) done(n);
  auto kept = [&](NodeId n) {
    int64_t bytes = 0;
    for (ValueId out : g.node(n).outputs) bytes += g.type(out).bytes();
    return bytes;
  };
  while (!ready.empty()) {
    auto it = std::max_element(ready.begin(), ready.end(), [&](NodeId a, NodeId b) {
      return kept(a) != kept(b) ? kept(a) < kept(b) : a > b;
    });
    const NodeId n = *it;
    ready.erase(it);
    order.push_back(n);
    done(n);
  }
  return in_order(g, order);
}

std::map<std::string, int> op_counts(const Graph& g) {
  std::map<std::string, int> counts;
  for (const Node& n : g.nodes()) ++counts[op_name(n.op)];
  return counts;
}

// What must not change: the node multiset, the inputs in their order, the outputs.
void expect_same_program(const Graph& scheduled, const Graph& input) {
  verify(scheduled);
  EXPECT_EQ(op_counts(scheduled), op_counts(input));
  const std::vector<ValueId> a = scheduled.inputs(), b = input.inputs();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(scheduled.value(a[i]).name, input.value(b[i]).name);
    EXPECT_EQ(scheduled.type(a[i]), input.type(b[i]));
  }
  ASSERT_EQ(scheduled.outputs().size(), input.outputs().size());
  for (size_t i = 0; i < input.outputs().size(); ++i) {
    EXPECT_EQ(scheduled.outputs()[i].name, input.outputs()[i].name);
    EXPECT_EQ(scheduled.type(scheduled.outputs()[i].value), input.type(input.outputs()[i].value));
  }
}

TEST(Schedule, GoldenTwoChainsFreeEachBigBufferBeforeTheNext) {
  Tracer t;
  Tensor x = t.input(Role::constant, "x", DType::f32, {1000});
  Tensor y = t.input(Role::constant, "y", DType::f32, {1000});
  Tensor p = t.silu(x);
  Tensor q = t.silu(y);  // traced before p is reduced: p and q are live together
  t.output("loss", t.add(t.sum(p), t.sum(q)));
  Graph g = t.finish();
  Graph s = schedule(g, {.threads = 1});
  testing::expect_golden(print_graph(s), "schedule_two_chains.ir");
  expect_same_program(s, g);
  std::printf("two chains: arena %lld bytes in the traced order, %lld scheduled\n", (long long)arena_of(g),
              (long long)arena_of(s));
  // Each sum also needs a 64-byte workspace for its one partial (cpu::sum_scratch_doubles),
  // live only at its own node.
  EXPECT_EQ(arena_of(g), 2 * 4032 + 64 + 64);
  EXPECT_EQ(arena_of(s), 4032 + 2 * 64 + 64);
}

TEST(Schedule, KeepsTheInputOrderWhenItCannotLowerThePeak) {
  Tracer t;
  Tensor x = t.input(Role::constant, "x", DType::f32, {1000});
  t.output("y", t.silu(t.silu(x)));
  Graph g = t.finish();
  EXPECT_EQ(schedule(g, {.threads = 1}), g);
}

// The tiny Llama's joint graph at SP 1 and 2, in its traced order and in a hoarding order:
// the schedule is the same program and never planned larger than its input, and it plans
// the hoarding order's program smaller than that order.
TEST(Schedule, TinyLlamaJointGraphNeverPlansLargerAndRepairsABadOrder) {
  const int threads = 2;
  for (int64_t P : {1, 2})
    for (int64_t S : {256, 2048}) {
      SCOPED_TRACE(str("P=", P, " S=", S));
      Graph joint = autodiff(autosp(models::llama_forward(testing::tiny_llama(), {.batch = 1, .seq_len = S}), {P}));
      Graph bad = hoarding_order(joint);
      Graph from_joint = schedule(joint, {.threads = threads}), from_bad = schedule(bad, {.threads = threads});
      expect_same_program(from_joint, joint);
      expect_same_program(from_bad, joint);
      const int64_t traced = arena_of(joint, threads), hoarding = arena_of(bad, threads);
      std::printf("tiny llama P=%lld S=%lld arena: traced order %lld, scheduled %lld; hoarding order %lld, "
                  "scheduled %lld\n",
                  (long long)P, (long long)S, (long long)traced, (long long)arena_of(from_joint, threads),
                  (long long)hoarding, (long long)arena_of(from_bad, threads));
      EXPECT_LE(arena_of(from_joint, threads), traced);
      EXPECT_LT(arena_of(from_bad, threads), hoarding);
    }
}

// Reordering changes no number: the repaired order's loss and gradients are bitwise those
// of the traced order (both run in their planned arenas).
TEST(Schedule, ResultsAreBitwiseTheInputOrders) {
  const int threads = 2;
  Graph joint = autodiff(models::llama_forward(testing::tiny_llama(), {.batch = 1, .seq_len = 128}));
  Graph scheduled = schedule(hoarding_order(joint), {.threads = threads});
  ASSERT_FALSE(scheduled == joint);
  const testing::Feed feed = testing::llama_feed(joint);
  HeapAllocator a1, a2;
  CpuExecutor reference(joint, a1, threads), reordered(scheduled, a2, threads);
  feed.bind(reference, joint);
  feed.bind(reordered, scheduled);
  reference.run();
  reordered.run();
  for (const GraphOutput& o : joint.outputs())
    EXPECT_EQ(std::memcmp(reference.output_data(o.name), reordered.output_data(o.name), joint.type(o.value).bytes()), 0)
        << o.name;
}

}  // namespace
}  // namespace autosp
