// The grad_sync pass (ZeRO stages 0-2): the golden joint graphs of a two-layer Llama with
// its bucketed reduce-scatters (stage 2) and, for the last micro batch of an accumulating
// step, its accumulation adds and all-reduces (stage 0); where each reduction sits (right
// after the node that finalises its bucket's last gradient, so later backward compute can
// overlap it) and each add (right after its gradient's); the buckets partition the
// parameters within reduce_bucket_size; stage 1's graph is stage 2's; the scheduled and
// memory-planned step still reduces before backward ends, every reduction is in the plan,
// and the plan is smaller than keeping every full gradient to the end of the step; at one
// rank the shards are bitwise the gradients, and the reduced sums bitwise gradient +
// accumulated input; at one rank stage 0 copies no gradient into a bucket.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "models/llama.h"
#include "ops/op.h"
#include "passes/autodiff.h"
#include "passes/autosp.h"
#include "passes/grad_sync.h"
#include "passes/pipeline.h"
#include "passes/plan_memory.h"
#include "runtime/executor.h"
#include "testing/golden.h"
#include "testing/memory.h"
#include "testing/tiny_llama.h"

namespace autosp {
namespace {

models::LlamaConfig tiny() { return testing::tiny_llama(2); }

Graph joint_graph(int64_t S, int64_t sp = 1) {
  Graph forward = models::llama_forward(tiny(), {.batch = 1, .seq_len = S});
  if (sp > 1) forward = autosp(forward, {sp});
  return autodiff(forward);
}

// Tiny Llama: 88-element embedding and head, 8-element norms, 32 / 64 / 96-element
// projections. Buckets of at most 100 elements: one to three gradients each.
constexpr GradSyncOptions kTwoRanks{.zero_stage = 2, .world_size = 2, .bucket_elements = 100};

TEST(GradSync, GoldenTwoLayerLlamaTwoRanks) {
  testing::expect_golden(print_graph(grad_sync(joint_graph(4), kTwoRanks)), "grad_sync_llama2_w2.ir");
}

TEST(GradSync, GoldenStageZeroLastMicroBatchTwoRanks) {
  const GradSyncOptions options{.zero_stage = 0, .reduce = true, .accumulated = true, .world_size = 2,
                                .bucket_elements = 100};
  testing::expect_golden(print_graph(grad_sync(joint_graph(4), options)), "grad_sync_zero0_accumulated_llama2_w2.ir");
}

// Without `reduce` (the micro batches before a step's last) stages 0 and 1 keep the graph;
// with it stage 1 reduce-scatters as stage 2 does (the stages differ in what the trainer
// keeps between micro batches), and stage 0 all-reduces the same buckets, unpadded.
TEST(GradSync, StagesZeroAndOneReduceOnlyWhenAsked) {
  const Graph joint = joint_graph(4);
  for (int stage : {0, 1}) EXPECT_EQ(grad_sync(joint, {.zero_stage = stage, .world_size = 4}), joint);
  const Graph one = grad_sync(joint, {.zero_stage = 1, .reduce = true, .world_size = 4, .bucket_elements = 100});
  EXPECT_EQ(one, grad_sync(joint, {.zero_stage = 2, .world_size = 4, .bucket_elements = 100}));
  const Graph zero = grad_sync(joint, {.zero_stage = 0, .reduce = true, .world_size = 4, .bucket_elements = 100});
  verify(zero);
  const std::vector<GradBucket> sharded = read_grad_buckets(one), whole = read_grad_buckets(zero);
  ASSERT_EQ(whole.size(), sharded.size());
  for (size_t k = 0; k < whole.size(); ++k) {
    EXPECT_EQ(whole[k].params, sharded[k].params);
    EXPECT_TRUE(whole[k].whole);
    EXPECT_FALSE(sharded[k].whole);
    int64_t elements = 0;
    for (int64_t n : whole[k].numel) elements += n;
    EXPECT_EQ(whole[k].shard, elements);  // every rank has the whole bucket
  }
  for (const GraphOutput& o : zero.outputs())
    EXPECT_TRUE(o.name == "loss" || o.name.starts_with(kGradReducedPrefix)) << o.name;
}

// A world of one reduces nothing: at stage 0 every gradient is its own bucket whatever
// bucket_elements says, so no concat copies the gradients; two ranks still bucket them.
TEST(GradSync, StageZeroAtOneRankBucketsNothing) {
  const Graph joint = joint_graph(4);
  auto concats = [](const Graph& g) {
    return std::count_if(g.nodes().begin(), g.nodes().end(), [](const Node& n) { return n.op == OpKind::concat; });
  };
  const Graph one = grad_sync(joint, {.zero_stage = 0, .reduce = true, .world_size = 1, .bucket_elements = 100});
  verify(one);
  EXPECT_EQ(concats(one), 0);
  const std::vector<GradBucket> buckets = read_grad_buckets(one);
  size_t grads = 0;
  for (const GraphOutput& o : joint.outputs()) grads += o.name.starts_with(kGradPrefix);
  ASSERT_EQ(buckets.size(), grads);
  for (const GradBucket& bucket : buckets) EXPECT_EQ(bucket.params.size(), 1u);
  const Graph two = grad_sync(joint, {.zero_stage = 0, .reduce = true, .world_size = 2, .bucket_elements = 100});
  EXPECT_GT(concats(two), 0);
  EXPECT_LT(read_grad_buckets(two).size(), grads);
}

// The last micro batch of an accumulating step: one input "grad_acc:<name>" per parameter,
// of its type; each add follows the node that makes its gradient final (only the adds of
// that node's other gradients between them), and the buckets reduce the sums.
TEST(GradSync, EachAccumulationAddFollowsItsGradient) {
  const Graph joint = joint_graph(4, 2);
  for (int stage : {0, 1}) {
    SCOPED_TRACE(str("stage ", stage));
    const Graph g =
        grad_sync(joint, {.zero_stage = stage, .reduce = true, .accumulated = true, .world_size = 4,
                          .bucket_elements = 100});
    verify(g);
    std::map<std::string, ValueId> acc;
    for (ValueId in : g.inputs_with_role(Role::gradient)) acc[g.value(in).name] = in;
    std::map<std::string, NodeId> producer;  // of each gradient, in the rewritten graph
    int adds = 0;
    for (NodeId n = 0; n < NodeId(g.nodes().size()); ++n) {
      const Node& node = g.node(n);
      if (node.op != OpKind::add || !g.value(node.outputs[0]).name.starts_with("grad_total:")) continue;
      ++adds;
      const std::string param = g.value(node.outputs[0]).name.substr(std::string("grad_total:").size());
      ASSERT_EQ(node.inputs.size(), 2u);
      EXPECT_EQ(node.inputs[1], acc.at(kGradAccPrefix + param)) << param;
      EXPECT_EQ(g.type(node.inputs[1]), g.type(g.find_input(param))) << param;
      const NodeId made = g.value(node.inputs[0]).producer;
      for (NodeId between = made + 1; between < n; ++between)
        EXPECT_TRUE(g.node(between).op == OpKind::add) << param << ": node " << between << " before its add";
      producer[param] = made;
    }
    EXPECT_EQ(adds, int(acc.size()));
    EXPECT_EQ(acc.size(), joint.inputs_with_role(Role::parameter).size());
    // Each bucket concatenates the sums, not the gradients.
    for (const GraphOutput& o : g.outputs()) {
      if (o.name == "loss") continue;
      const Node& reduce = g.node(g.value(o.value).producer);
      const Node& cat = g.node(g.value(reduce.inputs[0]).producer);
      const std::vector<ValueId> parts = cat.op == OpKind::concat ? cat.inputs : std::vector<ValueId>{reduce.inputs[0]};
      for (ValueId part : parts) {
        if (g.node(g.value(part).producer).op == OpKind::fill) continue;
        const ValueId summed = g.node(g.value(part).producer).inputs[0];  // the flattening reshape's operand
        EXPECT_TRUE(g.value(summed).name.starts_with("grad_total:")) << o.name << " reduces " << g.value(summed).name;
      }
    }
  }
}

// Each bucket's reduce_scatter follows the node that makes its last gradient final, with
// only the bucket's own reshapes, padding and concat between them.
TEST(GradSync, EachReductionFollowsItsBucketsLastGradient) {
  const Graph joint = joint_graph(4, 2);
  for (int64_t W : {2, 4, 3}) {
    SCOPED_TRACE(str("W = ", W));
    const GradSyncOptions options{.zero_stage = 2, .world_size = W, .bucket_elements = 100};
    const Graph g = grad_sync(joint, options);
    verify(g);
    const std::vector<GradBucket> buckets = read_grad_buckets(g);
    ASSERT_GT(buckets.size(), 3u);
    // The buckets partition the parameters, within the bucket size unless alone.
    std::map<std::string, int64_t> params;
    for (ValueId p : joint.inputs_with_role(Role::parameter)) params[joint.value(p).name] = numel(joint.shape(p));
    std::set<std::string> seen;
    for (const GradBucket& b : buckets) {
      int64_t elements = 0;
      for (size_t i = 0; i < b.params.size(); ++i) {
        EXPECT_TRUE(seen.insert(b.params[i]).second) << b.params[i] << " in two buckets";
        EXPECT_EQ(b.numel[i], params.at(b.params[i]));
        elements += b.numel[i];
      }
      EXPECT_TRUE(elements <= options.bucket_elements || b.params.size() == 1) << elements;
      EXPECT_EQ(b.shard, (elements + W - 1) / W);
    }
    EXPECT_EQ(seen.size(), params.size());
    // No full gradient is an output any more: the loss and the shards are.
    for (const GraphOutput& o : g.outputs())
      EXPECT_TRUE(o.name == "loss" || o.name.starts_with(kGradShardPrefix)) << o.name;
    // Placement: the distance from the last gradient's producer to the reduce_scatter is
    // the bucket's own nodes (a reshape per gradient, perhaps a fill, perhaps a concat).
    int k = 0;
    for (const GraphOutput& o : g.outputs()) {
      if (!o.name.starts_with(kGradShardPrefix)) continue;
      const NodeId rs = g.value(o.value).producer;
      NodeId last = -1;
      std::function<void(ValueId)> grads_of = [&](ValueId v) {
        const Node& n = g.node(g.value(v).producer);
        if (g.value(v).name.starts_with(kGradPrefix)) {
          last = std::max(last, g.value(n.inputs[0]).producer);  // reshape's operand: the gradient
          return;
        }
        for (ValueId in : n.inputs) grads_of(in);
      };
      grads_of(g.node(rs).inputs[0]);
      const int own = int(buckets[k].params.size()) + 2;  // reshapes, fill, concat
      EXPECT_LE(rs - last, own + 1) << o.name;
      EXPECT_GT(rs, last);
      ++k;
    }
  }
}

// Through the whole pipeline (autosp, checkpoint, schedule, plan_memory): the first
// reduction runs while backward still has compute to do, every reduction has its place in
// the arena, and the arena is smaller than stage 0's, where every full gradient is an
// output kept to the end of the step.
TEST(GradSync, ThePlannedStepReducesDuringBackwardAndHoldsLess) {
  Graph forward = models::llama_forward(tiny(), {.batch = 1, .seq_len = 8});
  CompileOptions options{2, {"autosp"}, true, 1};
  options.checkpoint = {CheckpointPolicy::sac};
  const Graph stage0 = compile(forward, options);
  options.grad_sync = {.zero_stage = 2, .world_size = 4, .bucket_elements = 100};
  std::vector<std::string> stages;
  const Graph stage2 = compile(forward, options, [&](const std::string& s, const Graph&) { stages.push_back(s); });
  EXPECT_EQ(stages, pipeline_stages());
  ASSERT_TRUE(has_memory_plan(stage2));
  testing::expect_no_live_overlap(stage2);
  const MemoryPlan plan = read_memory_plan(stage2);
  NodeId first_rs = -1, last_compute = -1;
  for (NodeId n = 0; n < NodeId(stage2.nodes().size()); ++n) {
    const Node& node = stage2.node(n);
    if (node.op == OpKind::reduce_scatter) {
      if (first_rs < 0) first_rs = n;
      EXPECT_GE(plan.offsets[node.outputs[0]], 0) << "reduce_scatter %" << node.outputs[0] << " is not in the plan";
    }
    if (node.op == OpKind::linear || node.op == OpKind::matmul || node.op == OpKind::attention_backward)
      last_compute = n;
  }
  ASSERT_GE(first_rs, 0);
  EXPECT_LT(first_rs, last_compute) << "the first reduction waits for the end of backward";
  const int64_t a0 = read_memory_plan(stage0).arena_bytes, a2 = plan.arena_bytes;
  EXPECT_LT(a2, a0);
  std::printf("tiny llama S=8 SP=2: arena stage 0 %lld bytes, stage 2 (W=4, buckets of 100) %lld bytes\n",
              (long long)a0, (long long)a2);
}

// At one rank: single communicators, and one micro batch of 8 tokens of the tiny Llama.
ProcessGroups one_rank() {
  ProcessGroups groups;
  groups.world = make_single_communicator();
  groups.sp = make_single_communicator();
  groups.dp = make_single_communicator();
  return groups;
}

struct Batch {
  std::vector<int32_t> tokens, labels, positions;
  Batch() {
    for (int i = 0; i < 8; ++i) {
      tokens.push_back((3 * i + 1) % 11);
      labels.push_back((5 * i + 2) % 11);
      positions.push_back(i);
    }
  }
};

// At one rank a reduce-scatter is a copy: each shard is its bucket's gradients, bitwise.
TEST(GradSync, AtOneRankTheShardsAreTheGradients) {
  Graph forward = models::llama_forward(tiny(), {.batch = 1, .seq_len = 8});
  CompileOptions options;
  options.threads = 1;
  const Graph stage0 = compile(forward, options);
  options.grad_sync = {.zero_stage = 2, .world_size = 1, .bucket_elements = 150};
  const Graph stage2 = compile(forward, options);
  const ProcessGroups groups = one_rank();
  std::vector<std::vector<float>> params;
  const Batch batch;
  HeapAllocator a0, a2;
  CpuExecutor e0(stage0, a0, 1, &groups), e2(stage2, a2, 1, &groups);
  for (ValueId p : stage0.inputs_with_role(Role::parameter)) {
    std::vector<float> w(numel(stage0.shape(p)));
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.05f * float((i * 7 + p) % 13) - 0.3f;
    params.push_back(std::move(w));
    e0.bind(stage0.value(p).name, params.back().data());
    e2.bind(stage0.value(p).name, params.back().data());
  }
  for (CpuExecutor* e : {&e0, &e2}) {
    e->bind("input_ids", batch.tokens.data());
    e->bind("labels", batch.labels.data());
    e->bind("position_ids", batch.positions.data());
    e->run();
  }
  const std::vector<GradBucket> buckets = read_grad_buckets(stage2);
  ASSERT_GT(buckets.size(), 1u);
  for (size_t k = 0; k < buckets.size(); ++k) {
    const float* shard = e2.output(str(kGradShardPrefix, k));
    int64_t at = 0;
    for (size_t i = 0; i < buckets[k].params.size(); ++i) {
      const float* grad = e0.output(kGradPrefix + buckets[k].params[i]);
      for (int64_t j = 0; j < buckets[k].numel[i]; ++j)
        ASSERT_EQ(shard[at + j], grad[j]) << buckets[k].params[i] << "[" << j << "]";
      at += buckets[k].numel[i];
    }
  }
  EXPECT_EQ(e2.output("loss")[0], e0.output("loss")[0]);
}

// At one rank an all-reduce is the identity: the last micro batch's reduced buckets are
// bitwise each gradient plus its accumulated input (one fp32 add).
TEST(GradSync, AtOneRankTheReducedSumsAreGradientPlusAccumulation) {
  Graph forward = models::llama_forward(tiny(), {.batch = 1, .seq_len = 8});
  CompileOptions options;
  options.threads = 1;
  options.grad_sync = {.zero_stage = 0, .world_size = 1, .bucket_elements = 150};
  const CompiledStep step = compile_step(forward, options, 2);
  ASSERT_TRUE(step.has_earlier());
  const Graph& earlier = step.earlier;  // its gradients stay outputs
  const Graph& last = step.last;
  for (const Node& node : earlier.nodes()) EXPECT_FALSE(node.attrs.has("group")) << op_name(node.op);
  const ProcessGroups groups = one_rank();
  const Batch batch;
  HeapAllocator a0, a1;
  CpuExecutor e0(earlier, a0, 1, &groups), e1(last, a1, 1, &groups);
  std::vector<std::vector<float>> params, acc;
  for (ValueId p : earlier.inputs_with_role(Role::parameter)) {
    std::vector<float> w(numel(earlier.shape(p))), a(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] = 0.05f * float((i * 7 + p) % 13) - 0.3f;
      a[i] = 0.01f * float((i * 5 + p) % 17) - 0.08f;
    }
    params.push_back(std::move(w));
    acc.push_back(std::move(a));
    e0.bind(earlier.value(p).name, params.back().data());
    e1.bind(earlier.value(p).name, params.back().data());
    e1.bind(kGradAccPrefix + earlier.value(p).name, acc.back().data());
  }
  for (CpuExecutor* e : {&e0, &e1}) {
    e->bind("input_ids", batch.tokens.data());
    e->bind("labels", batch.labels.data());
    e->bind("position_ids", batch.positions.data());
    e->run();
  }
  std::map<std::string, const float*> acc_of;
  const std::vector<ValueId> ps = earlier.inputs_with_role(Role::parameter);
  for (size_t i = 0; i < ps.size(); ++i) acc_of[earlier.value(ps[i]).name] = acc[i].data();
  const std::vector<GradBucket> buckets = read_grad_buckets(last);
  ASSERT_GT(buckets.size(), 1u);
  for (size_t k = 0; k < buckets.size(); ++k) {
    const float* sum = e1.output(str(kGradReducedPrefix, k));
    int64_t at = 0;
    for (size_t i = 0; i < buckets[k].params.size(); ++i) {
      const float* grad = e0.output(kGradPrefix + buckets[k].params[i]);
      const float* a = acc_of.at(buckets[k].params[i]);
      for (int64_t j = 0; j < buckets[k].numel[i]; ++j)
        ASSERT_EQ(sum[at + j], grad[j] + a[j]) << buckets[k].params[i] << "[" << j << "]";
      at += buckets[k].numel[i];
    }
  }
  EXPECT_EQ(e1.output("loss")[0], e0.output("loss")[0]);
}

}  // namespace
}  // namespace autosp
