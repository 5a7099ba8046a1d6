// lower: the golden bindings of a small joint graph on each backend (the CPU's per
// instruction set, its workspaces following each copy's register tile; cuda's on any
// machine); lower adds attributes and changes nothing else; what a backend cannot run is a
// user error at compile time, naming the backend, the op and the node; plan_memory plans
// with the lowered workspaces and in-place rules.
#include <gtest/gtest.h>

#include "frontend/tracer.h"
#include "models/llama.h"
#include "passes/autodiff.h"
#include "passes/lower.h"
#include "passes/pipeline.h"
#include "passes/plan_memory.h"
#include "testing/golden.h"
#include "testing/isa.h"
#include "testing/tiny_block.h"
#include "testing/tiny_llama.h"
#include "util/error.h"

namespace autosp {
namespace {

// The graph without lower's attributes.
Graph unlowered(const Graph& g) {
  Graph r = g;
  for (NodeId n = 0; n < NodeId(r.nodes().size()); ++n)
    for (const char* key : {"kernel", "workspace", "inplace"}) r.mutable_attrs(n).erase(key);
  return r;
}

class LowerCpuGolden : public ::testing::TestWithParam<cpu::Isa> {};

TEST_P(LowerCpuGolden, TinyTransformer) {
  AUTOSP_SKIP_UNLESS_CPU_RUNS(GetParam());
  testing::ScopedIsa isa(GetParam());
  const Graph joint = autodiff(testing::tiny_transformer());
  // One thread: attention's workspace is per thread.
  const Graph lowered = lower(joint, {.backend = Backend::cpu, .threads = 1});
  testing::expect_golden(print_graph(lowered),
                         std::string("lower_tiny_transformer.cpu.") + cpu::isa_name(GetParam()) + ".ir");
  verify(lowered);
  EXPECT_TRUE(unlowered(lowered) == joint);
  EXPECT_EQ(lowered_backend(lowered), Backend::cpu);
  EXPECT_EQ(lowered_backend(joint), std::nullopt);
  // Every attention kernel is the active set's copy; ops with one copy carry no set.
  for (const Node& node : lowered.nodes()) {
    if (node.op == OpKind::input) continue;
    const std::string kernel = lowered_binding(node).kernel;
    if (node.op == OpKind::attention) {
      EXPECT_EQ(kernel, std::string("cpu.") + cpu::isa_name(GetParam()) + ".attention");
    }
    if (node.op == OpKind::linear) {
      EXPECT_EQ(kernel, "cpu.linear");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Lower, LowerCpuGolden, ::testing::ValuesIn(cpu::built_isas()), testing::isa_param_name);

// The cuda bindings need no GPU and no nvcc: the same on every machine.
TEST(Lower, CudaGoldenTinyTransformer) {
  const Graph joint = autodiff(testing::tiny_transformer());
  const Graph lowered = lower(joint, {.backend = Backend::cuda, .threads = 1});
  testing::expect_golden(print_graph(lowered), "lower_tiny_transformer.cuda.ir");
  verify(lowered);
  EXPECT_TRUE(unlowered(lowered) == joint);
  EXPECT_EQ(lowered_backend(lowered), Backend::cuda);
  // Lowering again, for the other backend, replaces the binding.
  const Graph relowered = lower(lowered, {.backend = Backend::cpu, .threads = 1});
  EXPECT_TRUE(relowered == lower(joint, {.backend = Backend::cpu, .threads = 1}));
}

// plan_memory reads the lowered workspaces: the cuda plan of a graph is not the CPU's (the
// attention backward's scratch is delta [B, NH, S] on the GPU, per-thread tiles on the CPU),
// and planning a lowered graph equals planning the unlowered one for that backend.
TEST(Lower, PlanMemoryPlansWithTheLoweredKernels) {
  const Graph joint = autodiff(testing::tiny_transformer());
  for (Backend backend : {Backend::cpu, Backend::cuda}) {
    SCOPED_TRACE(backend_name(backend));
    const Graph lowered = lower(joint, {.backend = backend, .threads = 1});
    const Graph planned = plan_memory(lowered, {.threads = 1});
    EXPECT_TRUE(unlowered(planned) == unlowered(plan_memory(joint, {.threads = 1, .backend = backend})));
    for (NodeId n = 0; n < NodeId(planned.nodes().size()); ++n) {
      const Node& node = planned.node(n);
      const int64_t ws = node.attrs.get_int("workspace", 0);
      if (ws > 0) EXPECT_EQ(node.attrs.get_ints("mem_workspace").at(1), ws) << op_name(node.op);
      else EXPECT_FALSE(node.attrs.has("mem_workspace")) << op_name(node.op);
    }
  }
  auto plan = [&](Backend backend) {
    return read_memory_plan(plan_memory(lower(joint, {.backend = backend, .threads = 1}), {.threads = 1}));
  };
  EXPECT_NE(plan(Backend::cpu).workspace_offsets, plan(Backend::cuda).workspace_offsets);
}

std::string user_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no user error)";
}

TEST(Lower, RefusesWhatTheBackendCannotRunAtCompileTime) {
  models::LlamaConfig model = testing::tiny_llama(1);
  const Graph bf16 = models::llama_forward(model, {.batch = 1, .seq_len = 8, .dtype = DType::bf16});
  // bf16 on the CPU's fp32 kernels: through compile(), before anything runs.
  std::string e = user_error_of([&] { compile(bf16, {.backend = Backend::cpu}); });
  EXPECT_NE(e.find("cpu backend: "), std::string::npos) << e;
  EXPECT_NE(e.find("CPU kernels are fp32"), std::string::npos) << e;
  EXPECT_NE(e.find("(node "), std::string::npos) << e;
  EXPECT_NO_THROW(compile(bf16, {.backend = Backend::cuda}));

  // A head dim above the cuda kernels' limit (kernels/cuda/limits.h): refused by the first
  // op that cannot take it, naming the kernel and the limit; the CPU runs it.
  model.head_dim = 512;
  const Graph wide = models::llama_forward(model, {.batch = 1, .seq_len = 8});
  e = user_error_of([&] { compile(wide, {.backend = Backend::cuda}); });
  EXPECT_NE(e.find("cuda backend: rope"), std::string::npos) << e;
  EXPECT_NE(e.find("head dim D = 512 exceeds the kernel's 256"), std::string::npos) << e;
  EXPECT_NO_THROW(compile(wide, {.backend = Backend::cpu}));
}

// ALiBi on cuda takes its slopes by value, for at most kAttentionMaxAlibiHeads (128) query heads
// a rank: 130 heads are refused when lowering for cuda, naming the limit; the CPU runs them.
TEST(Lower, RefusesAlibiOverMoreHeadsThanTheCudaKernelsTake) {
  for (int64_t NH : {128, 130}) {
    SCOPED_TRACE(NH);
    Tracer t;
    Tensor x = t.embedding(t.parameter("wte", {11, 8}), t.input(Role::tokens, "tokens", DType::i32, {1, 4}));
    Tensor q = t.reshape(t.linear(x, t.parameter("wq", {NH * 2, 8})), {1, 4, NH, 2});
    Tensor kv = t.reshape(t.linear(x, t.parameter("wk", {2, 8})), {1, 4, 1, 2});
    t.output("loss", t.sum(t.attention(q, kv, kv, true, 0.7, 0, 0, std::vector<double>(size_t(NH), 0.5))));
    const Graph g = t.finish();
    EXPECT_NO_THROW(compile(g, {.backend = Backend::cpu}));
    if (NH <= 128) {
      EXPECT_NO_THROW(compile(g, {.backend = Backend::cuda}));
      continue;
    }
    const std::string e = user_error_of([&] { compile(g, {.backend = Backend::cuda}); });
    EXPECT_NE(e.find("cuda backend: attention"), std::string::npos) << e;
    EXPECT_NE(e.find("ALiBi slopes for at most 128 query heads"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace autosp
