// The checkpoint pass: golden joint graphs of a two-layer Llama under full and sac, the
// invariants of every copy it makes, what each policy keeps, and that recomputation gives
// bitwise the numbers of keeping everything while the activation peak falls.
#include <gtest/gtest.h>

#include <map>

#include "models/llama.h"
#include "ops/op.h"
#include "passes/autodiff.h"
#include "passes/autosp.h"
#include "passes/checkpoint.h"
#include "testing/golden.h"
#include "train/trainer.h"
#include "testing/tiny_llama.h"

namespace autosp {
namespace {

using testing::tiny_llama;

Graph joint_graph(int64_t S, int64_t sp = 1, int layers = 2) {
  Graph forward = models::llama_forward(tiny_llama(layers), {.batch = 1, .seq_len = S});
  if (sp > 1) forward = autosp(forward, {sp});
  return autodiff(forward);
}

// The forward value a copy stands for (from its name "recompute:%N"), or -1.
ValueId original_of(const Graph& g, ValueId v) {
  const std::string& name = g.value(v).name;
  return name.starts_with("recompute:%") ? std::stoi(name.substr(11)) : -1;
}

// Every copy: the forward node it copies, with the same op and attributes, reading the same
// operands or their copies. Returns how many copies each op has.
std::map<OpKind, int> check_copies(const Graph& joint, const Graph& g) {
  std::map<OpKind, int> copies;
  for (const Node& node : g.nodes()) {
    const ValueId original = original_of(g, node.outputs[0]);
    if (original < 0) continue;
    const Node& of = joint.node(joint.value(original).producer);
    EXPECT_EQ(node.op, of.op);
    EXPECT_EQ(node.attrs, of.attrs);
    EXPECT_EQ(node.inputs.size(), of.inputs.size());
    for (size_t i = 0; i < node.inputs.size() && i < of.inputs.size(); ++i) {
      const ValueId in = node.inputs[i];
      EXPECT_TRUE(in == of.inputs[i] || original_of(g, in) == of.inputs[i])
          << op_name(node.op) << " operand " << i << " is %" << in << ", not %" << of.inputs[i] << " or its copy";
    }
    for (size_t i = 0; i < node.outputs.size(); ++i) EXPECT_EQ(g.type(node.outputs[i]), joint.type(of.outputs[i]));
    ++copies[node.op];
  }
  return copies;
}

TEST(Checkpoint, GoldenTwoLayerLlamaFull) {
  testing::expect_golden(print_graph(checkpoint(joint_graph(4), {CheckpointPolicy::full})),
                         "checkpoint_full_llama2.ir");
}

TEST(Checkpoint, GoldenTwoLayerLlamaSac) {
  testing::expect_golden(print_graph(checkpoint(joint_graph(4), {CheckpointPolicy::sac})),
                         "checkpoint_sac_llama2.ir");
}

TEST(Checkpoint, NoneIsTheJointGraph) {
  const Graph joint = joint_graph(8);
  EXPECT_TRUE(checkpoint(joint, {CheckpointPolicy::none}) == joint);
}

TEST(Checkpoint, KeepsTheForwardPartAndTheOutputs) {
  const Graph joint = joint_graph(8, 2);
  for (CheckpointPolicy policy : {CheckpointPolicy::full, CheckpointPolicy::sac}) {
    SCOPED_TRACE(checkpoint_policy_name(policy));
    const Graph g = checkpoint(joint, {policy});
    verify(g);
    const NodeId forward_end = joint.value(joint.output("loss")).producer + 1;
    for (NodeId n = 0; n < forward_end; ++n) {
      EXPECT_EQ(g.node(n).op, joint.node(n).op) << "node " << n;
      EXPECT_EQ(g.node(n).inputs, joint.node(n).inputs) << "node " << n;
    }
    ASSERT_EQ(g.outputs().size(), joint.outputs().size());
    for (size_t i = 0; i < g.outputs().size(); ++i) {
      EXPECT_EQ(g.outputs()[i].name, joint.outputs()[i].name);
      EXPECT_EQ(g.type(g.outputs()[i].value), joint.type(joint.outputs()[i].value));
    }
  }
}

TEST(Checkpoint, SacRecomputesLinearCostOpsAndKeepsAttentionMatmulsAndCollectives) {
  const Graph joint = joint_graph(8, 2);  // under autosp: all-to-alls around attention
  std::map<OpKind, int> copies = check_copies(joint, checkpoint(joint, {CheckpointPolicy::sac}));
  for (OpKind kept : {OpKind::attention, OpKind::linear, OpKind::all_to_all, OpKind::embedding})
    EXPECT_EQ(copies[kept], 0) << op_name(kept);
  EXPECT_EQ(copies[OpKind::rms_norm], 2 * 2);  // two norms per layer
  EXPECT_EQ(copies[OpKind::swiglu], 2);
  // Under autosp rope's results only feed the (kept) all-to-alls, and rope's gradient needs
  // no forward value: nothing to recompute. On one device attention reads them directly.
  EXPECT_EQ(copies[OpKind::rope], 0);
  const Graph single = joint_graph(8);
  EXPECT_EQ(check_copies(single, checkpoint(single, {CheckpointPolicy::sac}))[OpKind::rope], 2 * 2);  // q and k

  copies = check_copies(joint, checkpoint(joint, {CheckpointPolicy::sac, /*recompute_matmuls=*/true}));
  EXPECT_EQ(copies[OpKind::attention], 0);
  EXPECT_GT(copies[OpKind::linear], 0);
}

TEST(Checkpoint, FullRecomputesEachLayerFromItsInputOnly) {
  const Graph joint = joint_graph(8, 2);
  const Graph g = checkpoint(joint, {CheckpointPolicy::full});
  std::map<OpKind, int> copies = check_copies(joint, g);
  EXPECT_EQ(copies[OpKind::attention], 2);  // one per layer
  EXPECT_EQ(copies[OpKind::all_to_all], 2 * 4);  // q, k, v in and the output back, per layer
  EXPECT_EQ(copies[OpKind::embedding], 0);  // outside the layers
  // What backward still reads of the forward part: values crossing a layer boundary, values
  // outside the layers, and inputs; no value made inside a layer for that layer alone.
  const NodeId forward_end = joint.value(joint.output("loss")).producer + 1;
  for (NodeId n = forward_end; n < NodeId(g.nodes().size()); ++n)
    for (ValueId in : g.node(n).inputs) {
      const NodeId p = g.value(in).producer;
      if (p >= forward_end || g.node(p).op == OpKind::input) continue;
      EXPECT_TRUE(g.node(p).op == OpKind::add || g.node(p).op == OpKind::embedding || g.node(p).op == OpKind::rms_norm ||
                  g.node(p).op == OpKind::count_valid || g.node(p).op == OpKind::all_reduce ||
                  g.node(p).op == OpKind::slice || g.node(p).op == OpKind::linear_cross_entropy)
          << "backward node " << n << " (" << op_name(g.node(n).op) << ") reads %" << in << " of "
          << op_name(g.node(p).op);
    }
}

// Every label of the recording source; tokens derived from the sample index.
class Counting final : public train::DataSource {
 public:
  void read_sample(int64_t sample, int64_t S, int32_t* inputs, int32_t* labels) const override {
    for (int64_t i = 0; i < S; ++i) {
      inputs[i] = static_cast<int32_t>((sample * 7 + i * 3) % 11);
      labels[i] = static_cast<int32_t>((sample * 5 + i) % 11);
    }
  }
  std::string describe(int64_t) const override { return "counting"; }
};

TEST(Checkpoint, RecomputationIsBitwiseTheSameAndLowersTheActivationPeak) {
  const models::LlamaConfig model = tiny_llama(2);
  std::map<std::string, train::StepStats> stats;
  std::map<std::string, std::vector<std::vector<float>>> params;
  for (const char* policy : {"none", "full", "sac"}) {
    train::TrainConfig config;
    config.train_micro_batch_size_per_gpu = 1;
    config.compile.checkpoint = policy;
    train::resolve_batch(config, 1, "test");
    train::Trainer trainer(model, config, 512, train::ModelState::initial(model, 5));
    Counting data;
    trainer.train_step(data);
    stats[policy] = trainer.train_step(data);
    params[policy] = trainer.state().params;
  }
  for (const char* policy : {"full", "sac"}) {
    EXPECT_EQ(stats[policy].loss, stats["none"].loss) << policy;
    EXPECT_EQ(stats[policy].grad_norm, stats["none"].grad_norm) << policy;
    EXPECT_EQ(params[policy], params["none"]) << policy;
  }
  std::printf("activation peak at S=512: none %lld B, sac %lld B, full %lld B\n",
              (long long)stats["none"].activation_bytes, (long long)stats["sac"].activation_bytes,
              (long long)stats["full"].activation_bytes);
  EXPECT_LT(stats["sac"].activation_bytes, stats["none"].activation_bytes);
  EXPECT_LT(stats["full"].activation_bytes, stats["sac"].activation_bytes);
}

}  // namespace
}  // namespace autosp
