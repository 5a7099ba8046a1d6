// AUTOSP_PROFILE (runtime/profile.h): which phase each node is in, and that the per-op table
// accounts for every node the executor ran. Nothing here is timed (STYLE.md rule 10): the
// times are only checked to be times.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "models/llama.h"
#include "ops/op.h"
#include "passes/autodiff.h"
#include "passes/checkpoint.h"
#include "passes/pipeline.h"
#include "passes/lower.h"
#include "runtime/executor.h"
#include "runtime/profile.h"
#include "testing/memory.h"

namespace autosp {
namespace {

// Profiling on for one test, and the process-wide profile emptied before and after.
struct ProfileOn {
  explicit ProfileOn(bool on = true) {
    set_profile_enabled(on);
    global_profile().reset();
  }
  ~ProfileOn() {
    set_profile_enabled(false);
    global_profile().reset();
  }
};

Graph tiny_forward(int64_t S = 16) {
  return models::llama_forward(testing::tiny_llama(), {.batch = 1, .seq_len = S});
}

// autodiff keeps the forward nodes and appends the backward ones: the rule (the loss's
// ancestors are forward) gives exactly that split.
TEST(ProfilePhases, AreAutodiffsSplitOnTheJointGraph) {
  const Graph forward = tiny_forward();
  const Graph joint = autodiff(forward);
  const std::vector<Phase> phases = node_phases(joint);
  ASSERT_EQ(phases.size(), joint.nodes().size());
  ASSERT_GT(joint.nodes().size(), forward.nodes().size());
  for (NodeId n = 0; n < static_cast<NodeId>(joint.nodes().size()); ++n)
    EXPECT_EQ(phases[n], n < static_cast<NodeId>(forward.nodes().size()) ? Phase::forward : Phase::backward)
        << "node " << n << " (" << op_name(joint.node(n).op) << ")";
}

// checkpoint's copies of forward nodes run for the backward; the forward nodes stay forward.
TEST(ProfilePhases, RecomputedNodesAreBackward) {
  const Graph forward = tiny_forward();
  const Graph joint = checkpoint(autodiff(forward), {.policy = CheckpointPolicy::full});
  const std::vector<Phase> phases = node_phases(joint);
  int recomputed = 0;
  for (NodeId n = 0; n < static_cast<NodeId>(joint.nodes().size()); ++n) {
    const Node& node = joint.node(n);
    const bool copy = !node.outputs.empty() && joint.value(node.outputs[0]).name.starts_with("recompute:");
    recomputed += copy;
    const bool in_forward = n < static_cast<NodeId>(forward.nodes().size());
    EXPECT_EQ(phases[n], in_forward ? Phase::forward : Phase::backward) << "node " << n;
    if (copy) {
      EXPECT_FALSE(in_forward);
    }
  }
  EXPECT_GT(recomputed, 0) << "policy full recomputed nothing: the test checks nothing";
}

TEST(ProfilePhases, AGraphWithoutALossIsForward) {
  const Graph g = models::llama_forward(testing::tiny_llama(),
                                        {.batch = 1, .seq_len = 8, .output_loss = false, .output_logits = true});
  for (Phase p : node_phases(g)) EXPECT_EQ(p, Phase::forward);
}

// On, the table has every node that ran, once per run, in its phase, with the node's FLOPs;
// the shares are of the graph time and sum to 1.
TEST(Profile, CoversEveryNodeThatRan) {
  ProfileOn on;
  const int threads = 2, runs = 3;
  const Graph planned = compile(tiny_forward(64), {.threads = threads, .checkpoint = {.policy = CheckpointPolicy::full}});
  const testing::Feed feed = testing::llama_feed(planned);
  HeapAllocator alloc;
  CpuExecutor ex(planned, alloc, threads);
  feed.bind(ex, planned);
  for (int r = 0; r < runs; ++r) ex.run();

  const std::vector<Phase> phases = node_phases(planned);
  std::map<Phase, int64_t> nodes;
  std::map<Phase, double> flops;
  std::map<std::string, int64_t> per_op;  // "phase op" -> nodes
  for (NodeId n = 0; n < static_cast<NodeId>(planned.nodes().size()); ++n) {
    const Node& node = planned.node(n);
    if (node.op == OpKind::input) continue;
    nodes[phases[n]] += runs;
    flops[phases[n]] += runs * node_cost(planned, node).flops;
    const bool copy = planned.value(node.outputs[0]).name.starts_with("recompute:");
    per_op[str(phase_name(phases[n]), " ", op_name(node.op), copy ? " (recompute)" : "")] += runs;
  }
  ASSERT_GT(nodes[Phase::forward], 0);
  ASSERT_GT(nodes[Phase::backward], 0);

  const std::vector<ProfileRow> rows = global_profile().rows();
  std::map<Phase, int64_t> calls;
  std::map<Phase, double> row_flops;
  std::map<std::string, int64_t> row_per_op;
  double shares = 0;
  for (const ProfileRow& r : rows) {
    calls[r.phase] += r.calls;
    row_flops[r.phase] += r.flops;
    row_per_op[str(phase_name(r.phase), " ", r.op)] += r.calls;
    shares += r.share;
    EXPECT_GE(r.seconds, 0) << r.op;
    EXPECT_GE(r.share, 0) << r.op;
    EXPECT_TRUE(r.kernel.starts_with("cpu.")) << r.op << ": kernel '" << r.kernel << "'";
  }
  EXPECT_EQ(calls, nodes);
  EXPECT_EQ(row_per_op, per_op);
  for (Phase p : {Phase::forward, Phase::backward})
    EXPECT_NEAR(row_flops[p], flops[p], 1e-9 * flops[p]) << phase_name(p);
  EXPECT_NEAR(shares, 1.0, 1e-9);
  // Forward first, each phase largest first.
  for (size_t i = 1; i < rows.size(); ++i) {
    if (rows[i].phase == rows[i - 1].phase) {
      EXPECT_GE(rows[i - 1].seconds, rows[i].seconds);
    } else {
      EXPECT_TRUE(rows[i - 1].phase == Phase::forward && rows[i].phase == Phase::backward);
    }
  }

  const std::string table = global_profile().report("test");
  EXPECT_NE(table.find("| forward | linear | cpu.linear |"), std::string::npos) << table;
  EXPECT_NE(table.find("| backward |"), std::string::npos) << table;
  EXPECT_NE(table.find("(recompute)"), std::string::npos) << table;
}

TEST(Profile, StepsAndTimeOutsideTheGraphsAreReportedPerStep) {
  Profile p;
  const int fwd = p.row(Phase::forward, "linear", "cpu.linear");
  const int bwd = p.row(Phase::backward, "linear", "cpu.linear");
  EXPECT_NE(fwd, bwd);
  EXPECT_EQ(p.row(Phase::forward, "linear", "cpu.linear"), fwd);
  for (int step = 0; step < 2; ++step) {
    p.add(fwd, 0.25, 2e9);
    p.add(bwd, 0.5, 4e9);
    p.add_outside("optimizer", 0.125);
    p.add_step(1.0);
  }
  const std::string table = p.report("test");
  EXPECT_NE(table.find("| forward | linear | cpu.linear | 1 | 250.00 | 0.333 | 8.0 |"), std::string::npos) << table;
  EXPECT_NE(table.find("| backward | linear | cpu.linear | 1 | 500.00 | 0.667 | 8.0 |"), std::string::npos) << table;
  EXPECT_NE(table.find("step 1.000 s: forward 0.250 s (25.0%), backward 0.500 s (50.0%), optimizer 0.125 s "
                       "(12.5%), the rest 0.125 s (12.5%)"),
            std::string::npos)
      << table;
  // reset keeps the rows (executors hold their ids) and zeroes them.
  p.reset();
  EXPECT_TRUE(p.rows().empty());
  EXPECT_EQ(p.row(Phase::backward, "linear", "cpu.linear"), bwd);
}

// The cuda executor learns its nodes' times after the run (CUDA events, read after the
// step's synchronisation) and hands them over as one vector (NodeProfiler::add_run): every
// node but the inputs is one call in its (phase, op, kernel) row, with its time and FLOPs, so
// the table is the CPU's with the cuda kernels' names. No GPU needed: the times are made up.
TEST(Profile, NodeTimesOfARunGoToTheirRows) {
  const Graph joint = executable_graph(autodiff(tiny_forward()), Backend::cuda, 1);
  Profile p;
  NodeProfiler profiler(joint, 1, p);
  const std::vector<Phase> phases = node_phases(joint);
  std::vector<double> seconds(joint.nodes().size());
  std::map<std::string, double> want_s, want_flops;  // "phase op kernel"
  std::map<std::string, int64_t> want_calls;
  const int runs = 2;
  for (NodeId n = 0; n < static_cast<NodeId>(joint.nodes().size()); ++n) {
    const Node& node = joint.node(n);
    seconds[n] = node.op == OpKind::reshape ? 0.0 : 1e-6 * double(n + 1);  // a view launches nothing
    if (node.op == OpKind::input) continue;
    const std::string key = str(phase_name(phases[n]), " ", op_name(node.op), " ", lowered_binding(node).kernel);
    want_s[key] += runs * seconds[n];
    want_flops[key] += runs * node_cost(joint, node).flops;
    want_calls[key] += runs;
  }
  for (int r = 0; r < runs; ++r) profiler.add_run(seconds);
  std::map<std::string, double> got_s, got_flops;
  std::map<std::string, int64_t> got_calls;
  for (const ProfileRow& r : p.rows()) {
    const std::string key = str(phase_name(r.phase), " ", r.op, " ", r.kernel);
    got_s[key] = r.seconds, got_flops[key] = r.flops, got_calls[key] = r.calls;
    EXPECT_TRUE(r.kernel.starts_with("cuda.")) << key;
  }
  EXPECT_EQ(got_calls, want_calls);
  ASSERT_EQ(got_s.size(), want_s.size());
  for (const auto& [key, s] : want_s) {
    EXPECT_NEAR(got_s[key], s, 1e-12) << key;
    EXPECT_NEAR(got_flops[key], want_flops[key], 1e-9 * want_flops[key]) << key;
  }
  EXPECT_TRUE(want_calls.count("forward rms_norm cuda.rms_norm_fused")) << "the fused kernels name the rows";
  EXPECT_TRUE(want_calls.count("backward rms_norm_backward cuda.rms_norm_backward_fused"));
  const std::string table = p.report("cuda");
  EXPECT_NE(table.find("| forward | rms_norm | cuda.rms_norm_fused |"), std::string::npos) << table;
  // One time per node, or it is a bug in the executor.
  EXPECT_THROW(profiler.add_run(std::vector<double>(seconds.size() - 1, 0.0)), InternalError);
}

// Off (the default), an executor records nothing.
TEST(Profile, OffRecordsNothing) {
  ProfileOn off(false);
  const Graph planned = compile(tiny_forward(), {.threads = 1});
  const testing::Feed feed = testing::llama_feed(planned);
  HeapAllocator alloc;
  CpuExecutor ex(planned, alloc, 1);
  feed.bind(ex, planned);
  ex.run();
  EXPECT_TRUE(global_profile().rows().empty());
}

}  // namespace
}  // namespace autosp
