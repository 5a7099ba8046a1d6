// The fuse pass: the golden joint graph of a two-layer Llama with its loss and gradient as
// one node; the step's loss and every gradient bit for bit the unfused graph's (one chunk,
// and chunks of 3 rows with an all-ignored chunk and a short last one); under sequence
// parallelism the count's all-reduce moves before the fused node and the shardings stay;
// cuda graphs, a pair whose dloss depends on the loss and a log-sum-exp read elsewhere are
// left as they are.
#include <gtest/gtest.h>

#include <algorithm>

#include "models/llama.h"
#include "passes/autodiff.h"
#include "passes/autosp.h"
#include "passes/checkpoint.h"
#include "passes/fuse.h"
#include "runtime/executor.h"
#include "testing/golden.h"
#include "testing/gradcheck.h"
#include "testing/tiny_llama.h"

namespace autosp {
namespace {

using testing::tiny_llama;

Graph joint_graph(int64_t S, int64_t sp = 1, int64_t chunk = 0) {
  Graph forward = models::llama_forward(tiny_llama(2), {.batch = 1, .seq_len = S});
  for (NodeId n = 0; chunk > 0 && n < NodeId(forward.nodes().size()); ++n)
    if (forward.node(n).op == OpKind::linear_cross_entropy) forward.mutable_attrs(n).set("chunk", chunk);
  if (sp > 1) forward = autosp(forward, {sp});
  return autodiff(forward);
}

int count(const Graph& g, OpKind op) {
  return int(std::count_if(g.nodes().begin(), g.nodes().end(), [&](const Node& n) { return n.op == op; }));
}

NodeId the_node(const Graph& g, OpKind op) {
  for (NodeId n = 0; n < NodeId(g.nodes().size()); ++n)
    if (g.node(n).op == op) return n;
  return -1;
}

TEST(Fuse, GoldenTwoLayerLlama) {
  const Graph fused = fuse(checkpoint(joint_graph(4), {CheckpointPolicy::sac}), {});
  verify(fused);
  testing::expect_golden(print_graph(fused), "fuse_sac_llama2.ir");
}

// One node instead of two; the dloss chain (count_valid, the seed, its division) before it.
TEST(Fuse, OneNodeAfterItsDlossChain) {
  const Graph joint = joint_graph(4);
  const Graph fused = fuse(joint, {});
  verify(fused);
  EXPECT_EQ(count(fused, OpKind::linear_cross_entropy), 0);
  EXPECT_EQ(count(fused, OpKind::linear_cross_entropy_backward), 0);
  ASSERT_EQ(count(fused, OpKind::linear_cross_entropy_with_grad), 1);
  EXPECT_EQ(fused.nodes().size(), joint.nodes().size() - 1);
  const NodeId n = the_node(fused, OpKind::linear_cross_entropy_with_grad);
  for (ValueId in : fused.node(n).inputs) EXPECT_LT(fused.value(in).producer, n);
  EXPECT_EQ(fused.node(n).attrs, joint.node(the_node(joint, OpKind::linear_cross_entropy)).attrs);
  ASSERT_EQ(fused.outputs().size(), joint.outputs().size());
  for (size_t i = 0; i < joint.outputs().size(); ++i) {
    EXPECT_EQ(fused.outputs()[i].name, joint.outputs()[i].name);
    EXPECT_EQ(fused.type(fused.outputs()[i].value), joint.type(joint.outputs()[i].value));
  }
}

// The step's loss and every gradient, bit for bit, with and without the fused node: the
// default chunk (all 8 rows), and chunks of 3 rows where rows 3-5 have no label (a chunk
// whose gemms both forms skip) and the last chunk has 2 rows.
TEST(Fuse, TheStepIsBitForBitTheUnfusedOne) {
  for (int64_t chunk : {int64_t{0}, int64_t{3}}) {
    SCOPED_TRACE(str("chunk ", chunk));
    const Graph joint = joint_graph(8, 1, chunk);
    const Graph fused = fuse(joint, {});
    ASSERT_EQ(count(fused, OpKind::linear_cross_entropy_with_grad), 1);
    testing::Feed feed;
    for (int i = 0; i < 8; ++i) {
      feed.i["input_ids"].push_back(int32_t(i * 7 % 11));
      feed.i["labels"].push_back(i >= 3 && i < 6 ? -100 : int32_t(i * 5 % 11));
      feed.i["position_ids"].push_back(int32_t(i));
    }
    for (ValueId p : joint.inputs_with_role(Role::parameter))
      feed.f[joint.value(p).name] = testing::random_normal(numel(joint.shape(p)), uint32_t(p) + 3, 0.5f);
    auto run = [&](const Graph& g) {
      HeapAllocator alloc;
      CpuExecutor ex(g, alloc, 1);
      feed.bind(ex, g);
      ex.run();
      std::map<std::string, std::vector<float>> out;
      for (const GraphOutput& o : g.outputs()) out[o.name] = ex.output_vector(o.name);
      return out;
    };
    const auto want = run(joint), got = run(fused);
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, w] : want) {
      const std::vector<float>& f = got.at(name);
      ASSERT_EQ(f.size(), w.size()) << name;
      for (size_t k = 0; k < w.size(); ++k) ASSERT_EQ(f[k], w[k]) << name << "[" << k << "]";
    }
    EXPECT_NE(want.at("loss")[0], 0.0f);
  }
}

// Under sequence parallelism dloss is the seed over the all-reduced count: the all-reduce
// comes before the fused node, whose results keep the pair's shardings.
TEST(Fuse, SequenceParallelKeepsShardingsAndTheCountsAllReduce) {
  const Graph joint = joint_graph(8, 2);
  const Graph fused = fuse(joint, {});
  verify(fused);
  const NodeId n = the_node(fused, OpKind::linear_cross_entropy_with_grad);
  ASSERT_GE(n, 0);
  const NodeId f = the_node(joint, OpKind::linear_cross_entropy), b = the_node(joint, OpKind::linear_cross_entropy_backward);
  EXPECT_EQ(fused.value(fused.node(n).outputs[0]).sharding, joint.value(joint.node(f).outputs[0]).sharding);
  EXPECT_EQ(fused.value(fused.node(n).outputs[1]).sharding, joint.value(joint.node(b).outputs[0]).sharding);
  EXPECT_EQ(fused.value(fused.node(n).outputs[2]).sharding, joint.value(joint.node(b).outputs[1]).sharding);
  const NodeId reduce = the_node(fused, OpKind::all_reduce);
  ASSERT_GE(reduce, 0);
  EXPECT_LT(reduce, n);
  EXPECT_EQ(count(fused, OpKind::all_reduce), count(joint, OpKind::all_reduce));
}

TEST(Fuse, CudaGraphsAreUnchanged) {
  const Graph joint = joint_graph(4);
  EXPECT_EQ(fuse(joint, {.backend = Backend::cuda}), joint);
}

// Pairs that do not match are kept: a dloss made from the loss itself (the fused node would
// need its own result), and a log-sum-exp that something else reads.
TEST(Fuse, PairsThatDoNotMatchAreKept) {
  for (const bool dloss_from_loss : {true, false}) {
    SCOPED_TRACE(dloss_from_loss ? "dloss from the loss" : "lse read elsewhere");
    Graph g;
    GraphBuilder b(g);
    const ValueId x = g.add_input(Role::parameter, {DType::f32, {2, 3, 4}}, "x");
    const ValueId w = g.add_input(Role::parameter, {DType::f32, {5, 4}}, "w");
    const ValueId labels = g.add_input(Role::labels, {DType::i32, {2, 3}}, "labels");
    const Attrs attrs{{"ignore_index", int64_t{-100}}};
    const auto loss = b.emit(OpKind::linear_cross_entropy, {x, w, labels}, attrs);
    const ValueId count = b.emit1(OpKind::count_valid, {labels}, attrs);
    const ValueId d = dloss_from_loss ? b.emit1(OpKind::div_scalar, {loss[0], count})
                                      : b.emit1(OpKind::div_scalar, {b.emit1(OpKind::fill, {}, {{"shape", Shape{}},
                                                                                               {"value", 1.0}}),
                                                                     count});
    const auto grads = b.emit(OpKind::linear_cross_entropy_backward, {d, x, w, labels, loss[1]}, attrs);
    g.add_output("loss", loss[0]);
    g.add_output("grad:x", grads[0]);
    g.add_output("grad:w", grads[1]);
    if (!dloss_from_loss) g.add_output("lse", loss[1]);
    verify(g);
    EXPECT_EQ(fuse(g, {}), g);
  }
}

}  // namespace
}  // namespace autosp
