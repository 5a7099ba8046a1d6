// A bf16 Llama through the whole compiler: the golden forward graph, and compile() under
// sequence parallelism and every checkpoint policy, with the types of every value checked
// against the f32 graph of the same model (src/ops/op.h, "Types").
#include <gtest/gtest.h>

#include "models/llama.h"
#include "ops/op.h"
#include "passes/autodiff.h"
#include "passes/pipeline.h"
#include "testing/golden.h"

namespace autosp {
namespace {

models::LlamaConfig tiny_llama(bool tied = false) {
  models::LlamaConfig c;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;  // under SP 2 the kv head is repeated: concat runs on bf16
  c.head_dim = 4;
  c.tie_word_embeddings = tied;
  return c;
}

TEST(Bf16Pipeline, GoldenLlamaForward) {
  models::LlamaConfig c = tiny_llama();
  c.num_hidden_layers = 1;
  const Graph g = models::llama_forward(c, {.batch = 1, .seq_len = 4, .dtype = DType::bf16});
  verify(g);
  testing::expect_golden(print_graph(g), "llama_bf16_forward.ir");
}

TEST(Bf16Pipeline, ForwardIsTheF32GraphWithBf16ValuesAndAnF32Loss) {
  for (bool logits : {false, true}) {
    SCOPED_TRACE(logits ? "logits and unfused loss" : "fused loss");
    const models::LlamaTraceOptions o32{.batch = 2, .seq_len = 6, .output_logits = logits};
    models::LlamaTraceOptions o16 = o32;
    o16.dtype = DType::bf16;
    const Graph f32 = models::llama_forward(tiny_llama(), o32), bf16 = models::llama_forward(tiny_llama(), o16);
    ASSERT_EQ(bf16.nodes().size(), f32.nodes().size());
    for (ValueId p : bf16.inputs_with_role(Role::parameter)) EXPECT_EQ(bf16.type(p).dtype, DType::bf16);
    EXPECT_EQ(bf16.type(bf16.output("loss")), (TensorType{DType::f32, {}}));
    if (logits) {
      EXPECT_EQ(bf16.type(bf16.output("logits")), (TensorType{DType::bf16, {2, 6, 11}}));
    }
  }
  try {
    models::llama_forward(tiny_llama(), {.batch = 1, .seq_len = 4, .dtype = DType::f16});
    ADD_FAILURE() << "an f16 model was traced";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model dtype must be f32 or bf16, got f16"), std::string::npos) << e.what();
  }
}

// Values a rule keeps in f32 for bf16 operands: the per-row statistics (result 1 of the
// norm, attention and the losses), and scalars (loss sum, count, loss, their gradients).
bool f32_by_rule(const Graph& g, ValueId v) {
  if (g.shape(v).empty()) return true;
  const Value& value = g.value(v);
  const OpKind op = g.node(value.producer).op;
  return value.output_index == 1 && (op == OpKind::rms_norm || op == OpKind::attention ||
                                     op == OpKind::cross_entropy || op == OpKind::linear_cross_entropy);
}

struct Setting {
  int64_t sp;
  CheckpointOptions checkpoint;
  bool tied;
};

std::string setting_name(const Setting& s) {
  return str("SP=", s.sp, " checkpoint=", checkpoint_policy_name(s.checkpoint.policy),
             s.checkpoint.recompute_matmuls ? "+matmuls" : "", s.tied ? " tied" : "");
}

TEST(Bf16Pipeline, CompilesUnderSequenceParallelismAndEveryCheckpointPolicy) {
  std::vector<Setting> settings;
  for (int64_t sp : {1, 2})
    for (CheckpointOptions ck : {CheckpointOptions{CheckpointPolicy::none}, CheckpointOptions{CheckpointPolicy::full},
                                 CheckpointOptions{CheckpointPolicy::sac},
                                 CheckpointOptions{CheckpointPolicy::sac, /*recompute_matmuls=*/true}})
      for (bool tied : {false, true}) settings.push_back({sp, ck, tied});
  for (const Setting& s : settings) {
    SCOPED_TRACE(setting_name(s));
    const int64_t B = 1, S = 8, H = 8;
    CompileOptions options{.sequence_parallel_size = s.sp, .checkpoint = s.checkpoint};
    if (s.sp > 1) {
      options.passes = {"autosp"};
      options.deepcompile = true;
    }
    // Compared after the checkpoint pass: the schedule pass may order the two graphs
    // differently, since bf16 halves some sizes and not the f32 statistics.
    auto trace = [&](DType dtype) {
      options.backend = dtype == DType::bf16 ? Backend::cuda : Backend::cpu;  // the CPU kernels are fp32
      Graph checkpointed;
      compile(models::llama_forward(tiny_llama(s.tied), {.batch = B, .seq_len = S, .dtype = dtype}), options,
              [&](const std::string& stage, const Graph& graph) {
                if (stage == "checkpoint") checkpointed = graph;
              });
      return checkpointed;
    };
    const Graph g = trace(DType::bf16);  // compile() verifies after every pass
    const Graph ref = trace(DType::f32);

    // The same graph as the f32 one, node for node; only dtypes differ, and only where
    // the f32 graph has f32 values that are not f32 by a rule.
    ASSERT_EQ(g.nodes().size(), ref.nodes().size());
    int bf16_values = 0, f32_stats = 0;
    for (ValueId v = 0; v < ValueId(g.values().size()); ++v) {
      const TensorType &t = g.type(v), &t32 = ref.type(v);
      ASSERT_EQ(g.node(g.value(v).producer).op, ref.node(ref.value(v).producer).op) << "%" << v;
      EXPECT_EQ(t.shape, t32.shape) << "%" << v;
      if (t32.dtype == DType::i32) {
        EXPECT_EQ(t.dtype, DType::i32) << "%" << v;
      } else if (f32_by_rule(g, v)) {
        EXPECT_EQ(t.dtype, DType::f32) << "%" << v << " " << type_str(t);
        f32_stats += !t.shape.empty();
      } else {
        // no f32 activation, gradient or recomputed copy of [B, S/P, H] or any other size
        EXPECT_EQ(t.dtype, DType::bf16) << "%" << v << " " << type_str(t) << " (" << op_name(g.node(g.value(v).producer).op)
                                        << ")";
        ++bf16_values;
      }
    }
    EXPECT_GT(bf16_values, 100);
    // per layer two norms' rstd and attention's lse; the final norm's rstd, the loss's lse
    EXPECT_GE(f32_stats, 2 * 3 + 2);

    // Parameters and their gradients are bf16; the loss is f32.
    EXPECT_EQ(g.type(g.output("loss")), (TensorType{DType::f32, {}}));
    for (ValueId p : g.inputs_with_role(Role::parameter)) {
      EXPECT_EQ(g.type(p).dtype, DType::bf16) << g.value(p).name;
      EXPECT_EQ(g.type(g.output(kGradPrefix + g.value(p).name)), g.type(p)) << g.value(p).name;
    }
    // The residual stream under SP: a bf16 [B, S/P, H] shard.
    bool found_residual = false;
    for (const Node& node : g.nodes())
      if (node.op == OpKind::embedding) {
        EXPECT_EQ(g.type(node.outputs[0]), (TensorType{DType::bf16, {B, S / s.sp, H}}));
        found_residual = true;
      }
    EXPECT_TRUE(found_residual);
  }
}

TEST(Bf16Pipeline, HalvesTheBytesOfEveryBf16Node) {
  // Compared before schedule, which may order the two differently (bf16 halves some sizes,
  // not the f32 statistics); bf16 compiles for the cuda backend (the CPU's kernels are fp32).
  auto checkpointed = [](DType dtype) {
    Graph g;
    compile(models::llama_forward(tiny_llama(), {.batch = 1, .seq_len = 8, .dtype = dtype}),
            {.backend = dtype == DType::bf16 ? Backend::cuda : Backend::cpu},
            [&](const std::string& stage, const Graph& graph) {
              if (stage == "checkpoint") g = graph;
            });
    return g;
  };
  const Graph g32 = checkpointed(DType::f32), g16 = checkpointed(DType::bf16);
  ASSERT_EQ(g16.nodes().size(), g32.nodes().size());
  for (NodeId n = 0; n < NodeId(g16.nodes().size()); ++n) {
    const Node& node = g16.node(n);
    if (node.op != OpKind::linear && node.op != OpKind::matmul && node.op != OpKind::swiglu) continue;
    const Cost c16 = node_cost(g16, node), c32 = node_cost(g32, g32.node(n));
    EXPECT_EQ(c16.flops, c32.flops) << op_name(node.op);
    EXPECT_EQ(2 * c16.bytes, c32.bytes) << op_name(node.op);
  }
}

TEST(Bf16Pipeline, AnUnusedBf16ParameterGetsBf16Zeros) {
  Tracer t;
  Tensor x = t.parameter("x", {3}, DType::bf16);
  t.parameter("unused", {2, 5}, DType::bf16);
  t.output("loss", t.convert(t.sum(t.mul(x, x)), DType::f32));
  const Graph joint = autodiff(t.finish());
  verify(joint);
  const ValueId zeros = joint.output("grad:unused");
  EXPECT_EQ(joint.type(zeros), (TensorType{DType::bf16, {2, 5}}));
  EXPECT_EQ(joint.node(joint.value(zeros).producer).op, OpKind::fill);
  EXPECT_EQ(joint.type(joint.output("grad:x")), (TensorType{DType::bf16, {3}}));
  // text form round trip of a graph with a bf16 fill and converts
  EXPECT_TRUE(parse_graph(print_graph(joint)) == joint);
}

}  // namespace
}  // namespace autosp
