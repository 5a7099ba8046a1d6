// The cuda executor's per-op profile (AUTOSP_PROFILE=1, runtime/cuda_executor.h): device
// times from CUDA events around each node, in the CPU profile's rows. How node times become
// rows is tested without a GPU (tests/runtime/profile_test.cpp, NodeProfiler::add_run); the
// events themselves only run here, on a GPU (skipped, with the reason, without one).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "models/llama.h"
#include "ops/op.h"
#include "passes/autodiff.h"
#include "runtime/cuda_executor.h"
#include "runtime/profile.h"
#include "testing/memory.h"
#include "cuda/skip_without_gpu.h"

namespace autosp {
namespace {

// On, every node that ran is one call per run in its (phase, op, kernel) row, named by the
// cuda kernel it is lowered to, with the device time between its two events; views (reshape)
// launch nothing and take 0 s; runs enqueued together are each counted. The table is printed
// for the log.
TEST(CudaProfile, EveryNodeIsACallWithItsDeviceTime) {
  SKIP_WITHOUT_GPU();
  struct On {
    On() { set_profile_enabled(true), global_profile().reset(); }
    ~On() { set_profile_enabled(false), global_profile().reset(); }
  } on;
  const Graph joint = autodiff(models::llama_forward(testing::tiny_llama(), {.batch = 1, .seq_len = 16}));
  CudaExecutor ex(joint);
  const testing::Feed feed = testing::llama_feed(joint);
  for (ValueId v : joint.inputs()) {
    const std::string& name = joint.value(v).name;
    if (joint.type(v).dtype == DType::i32) {
      ASSERT_TRUE(feed.i.count(name)) << name;
      ex.bind(v, feed.i.at(name).data());
    } else {
      ASSERT_TRUE(feed.f.count(name)) << name;
      ex.bind(v, feed.f.at(name).data());
    }
  }
  // Two runs as run() does them, then two as a step's micro batches: enqueued back to back,
  // one synchronisation, then check_errors (each run keeps its own events until then).
  const int runs = 4;
  ex.run();
  ex.run();
  ex.run_async();
  ex.run_async();
  check_cuda(cudaStreamSynchronize(ex.stream()), "cudaStreamSynchronize", "profile test");
  ex.check_errors();
  int64_t nodes = 0;
  for (const Node& node : ex.graph().nodes()) nodes += node.op != OpKind::input;
  int64_t calls = 0;
  double total = 0;
  bool saw_fused = false;
  for (const ProfileRow& r : global_profile().rows()) {
    calls += r.calls;
    total += r.seconds;
    EXPECT_TRUE(r.kernel.starts_with("cuda.")) << r.op << ": " << r.kernel;
    EXPECT_GE(r.seconds, 0) << r.op;
    if (r.op == "reshape") {
      EXPECT_EQ(r.seconds, 0) << "a view launches nothing";
    }
    if (r.kernel == "cuda.rms_norm_fused" || r.kernel == "cuda.swiglu_backward_fused") {
      EXPECT_GT(r.seconds, 0) << r.kernel << ": a kernel ran between its events";
      saw_fused = true;
    }
  }
  EXPECT_EQ(calls, runs * nodes);
  EXPECT_GT(total, 0);
  EXPECT_TRUE(saw_fused) << "the tiny Llama's rms_norm and swiglu_backward rows are missing";
  std::printf("%s", global_profile().report("CudaProfile test").c_str());
}

// Off (the default), the cuda executor records nothing.
TEST(CudaProfile, OffRecordsNothing) {
  SKIP_WITHOUT_GPU();
  set_profile_enabled(false);
  global_profile().reset();
  Graph g;
  const ValueId x = g.add_input(Role::constant, {DType::f32, {4, 40}}, "x");
  const ValueId w = g.add_input(Role::constant, {DType::f32, {40}}, "w");
  GraphBuilder b(g);
  g.add_output("y", b.emit(OpKind::rms_norm, {x, w}, {{"eps", 1e-5}})[0]);
  CudaExecutor ex(g);
  const std::vector<float> xs = testing::random_normal(160, 1), ws = testing::random_normal(40, 2);
  ex.bind("x", xs.data());
  ex.bind("w", ws.data());
  ex.run();
  EXPECT_TRUE(global_profile().rows().empty());
}

}  // namespace
}  // namespace autosp
