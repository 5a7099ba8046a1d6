// grad_sync under ZeRO stage 3: the golden joint graph of a two-layer Llama with its
// parameter shards, per-layer gathers and reduce-scatters; where each gather sits (before
// the first use of the layer before it, or of its own layer without prefetch), that every
// forward reader reads a forward gather and every backward reader (recomputation
// included) a backward one, that each group is gathered exactly twice, and that the
// planned step frees gathered parameters after their last use; at one rank the step's
// numbers are bitwise stage 2's.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "models/llama.h"
#include "ops/op.h"
#include "passes/autodiff.h"
#include "passes/autosp.h"
#include "passes/checkpoint.h"
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

Graph joint_graph(int64_t S, int64_t sp = 1, CheckpointPolicy policy = CheckpointPolicy::none) {
  Graph forward = models::llama_forward(tiny(), {.batch = 1, .seq_len = S});
  if (sp > 1) forward = autosp(forward, {sp});
  return checkpoint(autodiff(forward), {policy});
}

TEST(Zero3, GoldenTwoLayerLlamaTwoRanks) {
  testing::expect_golden(print_graph(grad_sync(joint_graph(4), {.zero_stage = 3, .world_size = 2})),
                         "grad_sync_zero3_llama2_w2.ir");
}

TEST(Zero3, ParameterGroupsAreLayers) {
  EXPECT_EQ(parameter_group("model.layers.12.mlp.up_proj.weight"), "model.layers.12");
  EXPECT_EQ(parameter_group("model.layers.3.input_layernorm.weight"), "model.layers.3");
  EXPECT_EQ(parameter_group("model.embed_tokens.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(parameter_group("lm_head.weight"), "lm_head.weight");
}

// Which group a gathered value belongs to (from its all_gather's "param_gather:<k>" name),
// and whether it is a forward ("gathered:") or backward ("regathered:") one.
struct Gathered {
  int group = -1;
  bool forward = true;
};

std::map<ValueId, Gathered> gathered_values(const Graph& g) {
  std::map<ValueId, Gathered> out;
  for (const Node& node : g.nodes()) {
    const std::string& name = g.value(node.outputs[0]).name;
    if (!name.starts_with("gathered:") && !name.starts_with("regathered:")) continue;
    ValueId v = node.inputs[0];  // reshape of a slice of the all_gather, or of the all_gather
    while (g.node(g.value(v).producer).op != OpKind::all_gather) v = g.node(g.value(v).producer).inputs[0];
    const std::string& all = g.value(v).name;
    EXPECT_TRUE(all.starts_with("param_gather:")) << all;
    out[node.outputs[0]] = {std::stoi(all.substr(13)), name.starts_with("gathered:")};
  }
  return out;
}

TEST(Zero3, EachLayerIsGatheredBeforeUseOnceInForwardAndOnceInBackward) {
  for (CheckpointPolicy policy : {CheckpointPolicy::none, CheckpointPolicy::full, CheckpointPolicy::sac}) {
    for (int64_t prefetch : {int64_t{50000000}, int64_t{0}}) {
      SCOPED_TRACE(str("policy ", checkpoint_policy_name(policy), ", prefetch ", prefetch));
      const Graph joint = joint_graph(4, 2, policy);
      const Graph g = grad_sync(joint, {.zero_stage = 3, .world_size = 4, .prefetch_elements = prefetch});
      verify(g);
      // The parameters are gone; one shard input per group: embedding, 2 layers, norm, head.
      EXPECT_TRUE(g.inputs_with_role(Role::parameter).size() == 5);
      for (ValueId in : g.inputs_with_role(Role::parameter))
        EXPECT_TRUE(g.value(in).name.starts_with(kParamShardPrefix)) << g.value(in).name;
      const std::vector<GradBucket> groups = read_grad_buckets(g);
      ASSERT_EQ(groups.size(), 5u);
      EXPECT_EQ(groups[1].params.size(), 9u);  // a layer's nine tensors
      for (size_t k = 0; k < groups.size(); ++k)
        EXPECT_EQ(numel(g.shape(g.find_input(str(kParamShardPrefix, k)))), groups[k].shard);

      // Forward nodes (ancestors of the loss) read forward gathers, all others backward ones.
      std::vector<bool> fwd(g.nodes().size(), false);
      std::vector<NodeId> stack{g.value(g.output("loss")).producer};
      while (!stack.empty()) {
        const NodeId n = stack.back();
        stack.pop_back();
        if (fwd[n]) continue;
        fwd[n] = true;
        for (ValueId in : g.node(n).inputs) stack.push_back(g.value(in).producer);
      }
      const auto gathered = gathered_values(g);
      std::map<std::pair<int, bool>, int> gathers;  // (group, forward) -> all_gather count
      std::map<std::pair<int, bool>, NodeId> gather_at, first_use;
      for (NodeId n = 0; n < NodeId(g.nodes().size()); ++n) {
        const Node& node = g.node(n);
        if (node.op == OpKind::all_gather) {
          const int k = std::stoi(g.value(node.outputs[0]).name.substr(13));
          const bool forward = fwd[n];
          ++gathers[std::make_pair(k, forward)];
          gather_at[std::make_pair(k, forward)] = n;
        }
        const std::string& out = g.value(node.outputs[0]).name;
        if (out.starts_with("gathered:") || out.starts_with("regathered:")) continue;
        for (ValueId in : node.inputs) {
          const auto it = gathered.find(in);
          if (it == gathered.end()) continue;
          EXPECT_EQ(it->second.forward, bool(fwd[n])) << op_name(node.op) << " (node " << n << ") reads a "
                                                      << (it->second.forward ? "forward" : "backward") << " gather";
          const auto key = std::make_pair(it->second.group, it->second.forward);
          if (!first_use.count(key)) first_use[key] = n;
        }
      }
      for (int k = 0; k < 5; ++k) {
        // Forward: a forward gather per group; backward: one per group a backward node reads
        // (the embedding's backward reads only the tokens, not its weight).
        EXPECT_EQ(gathers[std::make_pair(k, true)], 1) << "group " << k;
        EXPECT_LE(gathers[std::make_pair(k, false)], 1) << "group " << k;
        for (bool forward : {true, false})
          if (first_use.count(std::make_pair(k, forward))) {
            EXPECT_LT(gather_at[std::make_pair(k, forward)], first_use[std::make_pair(k, forward)]);
          }
      }
      // Prefetch: layer 1's forward gather is issued before layer 0's first use; without
      // prefetch, after it (just before layer 1's own).
      const NodeId layer0_use = first_use[std::make_pair(1, true)], layer1_gather = gather_at[std::make_pair(2, true)];
      if (prefetch > 0) {
        EXPECT_LT(layer1_gather, layer0_use);
      } else {
        EXPECT_GT(layer1_gather, layer0_use);
      }
      // In backward, layer 1 comes first, so layer 0 is the prefetched one.
      if (prefetch > 0) {
        EXPECT_LT(gather_at[std::make_pair(1, false)], first_use[std::make_pair(2, false)]);
      } else {
        EXPECT_GT(gather_at[std::make_pair(1, false)], first_use[std::make_pair(2, false)]);
      }
    }
  }
}

// The planned step at W = 4: every gathered value is in the arena and dies before the
// step ends (after its last reader), so at most a few layers' parameters are alive at once.
TEST(Zero3, ThePlannedStepFreesGatheredParametersAfterTheirLastUse) {
  Graph forward = models::llama_forward(testing::tiny_llama(4), {.batch = 1, .seq_len = 8});
  CompileOptions options{2, {"autosp"}, true, 1};
  options.checkpoint = {CheckpointPolicy::full};
  options.grad_sync = {.zero_stage = 3, .world_size = 4};
  const Graph g = compile(forward, options);
  ASSERT_TRUE(has_memory_plan(g));
  testing::expect_no_live_overlap(g);
  // Last reader of each all_gather's result (directly or through its slices/views).
  std::vector<NodeId> last(g.values().size(), -1);
  for (NodeId n = 0; n < NodeId(g.nodes().size()); ++n)
    for (ValueId in : g.node(n).inputs) last[in] = n;
  int64_t layer_bytes = 0, live = 0, peak = 0;
  std::vector<std::pair<NodeId, int64_t>> frees;
  for (NodeId n = 0; n < NodeId(g.nodes().size()); ++n) {
    const Node& node = g.node(n);
    const std::string& name = g.value(node.outputs[0]).name;
    if (name.starts_with("gathered:") || name.starts_with("regathered:")) {
      // The reshape of a slice copy: its bytes are what stays gathered.
      const int64_t bytes = g.type(node.outputs[0]).bytes();
      live += bytes;
      frees.push_back({last[node.outputs[0]], bytes});
      ASSERT_GE(last[node.outputs[0]], 0) << name << " is never read";
      if (name.find("model.layers.1.") != std::string::npos && name.starts_with("gathered:")) layer_bytes += bytes;
    }
    peak = std::max(peak, live);
    for (auto& [at, bytes] : frees)
      if (at == n) live -= bytes, bytes = 0;
  }
  EXPECT_EQ(live, 0);
  // Four layers: all gathered at once would be 4 layers; the schedule keeps at most three
  // (the one in use, the prefetched one, and the head or embedding beside them).
  EXPECT_LE(peak, 3 * layer_bytes + 4 * 11 * 8 * 2) << "layer " << layer_bytes << " bytes";
  std::printf("tiny llama 4 layers, W=4: gathered parameters live at once at most %lld bytes (one layer %lld)\n",
              (long long)peak, (long long)layer_bytes);
}

}  // namespace
}  // namespace autosp
