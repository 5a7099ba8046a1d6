// The autosp pass: the golden per-rank program of a small transformer, the exact set of
// collectives it inserts (four all_to_all per attention with their dimensions, the one
// loss-count all_reduce, nothing else), sharding and padding, and its errors.
#include <gtest/gtest.h>

#include "frontend/tracer.h"
#include "models/llama.h"
#include "ops/op.h"
#include "passes/autodiff.h"
#include "passes/autosp.h"
#include "testing/errors.h"
#include "testing/golden.h"
#include "testing/tiny_block.h"

namespace autosp {
namespace {

TEST(AutospPass, GoldenTinyTransformerP2) {
  // NH = 2, NKV = 1 < P = 2: the kv head is repeated; S = 5 pads to 6.
  Graph g = autosp(testing::tiny_transformer(), {.sp_size = 2});
  testing::expect_golden(print_graph(g), "autosp_tiny_transformer_p2.ir");
}

models::LlamaConfig small_llama(int64_t layers, int64_t nh, int64_t nkv) {
  models::LlamaConfig c;
  c.vocab_size = 50;
  c.hidden_size = 8 * nh;
  c.intermediate_size = 24;
  c.num_hidden_layers = layers;
  c.num_attention_heads = nh;
  c.num_key_value_heads = nkv;
  c.head_dim = 8;
  return c;
}

// GPT-2's per-token ops: layer_norm (y, mean and rstd) and gelu keep the sequence sharding
// of their operand, with no collective.
TEST(AutospPass, LayerNormAndGeluArePerTokenOps) {
  Tracer t;
  Tensor tok = t.input(Role::tokens, "tokens", DType::i32, {2, 6});
  Tensor x = t.embedding(t.parameter("wte", {11, 8}), tok);
  Tensor h = t.layer_norm(x, t.parameter("ln.weight", {8}), t.parameter("ln.bias", {8}), 1e-5);
  t.output("y", t.gelu(t.linear(h, t.parameter("fc", {16, 8})), true));
  Graph g = autosp(t.finish(), {.sp_size = 2});
  int seen = 0;
  for (const Node& n : g.nodes()) {
    EXPECT_NE(n.op, OpKind::all_to_all);
    EXPECT_NE(n.op, OpKind::all_gather);
    if (n.op != OpKind::layer_norm && n.op != OpKind::gelu) continue;
    ++seen;
    for (ValueId v : n.outputs) EXPECT_EQ(g.value(v).sharding, shard(1)) << op_name(n.op);
  }
  EXPECT_EQ(seen, 2);
  EXPECT_EQ(g.shape(g.output("y")), (Shape{2, 3, 16}));
}

struct Collective {
  OpKind op;
  Attrs attrs;
};

std::vector<Collective> collectives(const Graph& g) {
  std::vector<Collective> out;
  for (const Node& n : g.nodes())
    if (n.op == OpKind::all_to_all || n.op == OpKind::all_reduce || n.op == OpKind::all_gather ||
        n.op == OpKind::reduce_scatter)
      out.push_back({n.op, n.attrs});
  return out;
}

TEST(AutospPass, FourAllToAllPerAttentionAndOneLossCountAllReduce) {
  for (int64_t P : {2, 4}) {
    SCOPED_TRACE(str("P=", P));
    const int64_t layers = 3;
    Graph fwd = models::llama_forward(small_llama(layers, 4, 2), {.batch = 2, .seq_len = 13});
    Graph g = autosp(fwd, {.sp_size = P});
    auto cs = collectives(g);
    ASSERT_EQ(cs.size(), size_t(4 * layers + 1));
    int a2a = 0;
    for (const Collective& c : cs) {
      EXPECT_EQ(c.attrs.get_str("group"), "sp");
      EXPECT_EQ(c.attrs.get_int("size"), P);
      if (c.op == OpKind::all_to_all) {
        // q, k, v: sequence -> heads; then the output: heads -> sequence.
        const bool back = a2a % 4 == 3;
        EXPECT_EQ(c.attrs.get_int("scatter_dim"), back ? 1 : 2) << "all_to_all " << a2a;
        EXPECT_EQ(c.attrs.get_int("gather_dim"), back ? 2 : 1) << "all_to_all " << a2a;
        ++a2a;
      } else {
        EXPECT_EQ(c.op, OpKind::all_reduce);
      }
    }
    EXPECT_EQ(a2a, 4 * layers);
    // The all_reduce sums the label count, and feeds the loss divisor.
    for (const Node& n : g.nodes())
      if (n.op == OpKind::all_reduce) {
        EXPECT_EQ(g.node(g.value(n.inputs[0]).producer).op, OpKind::count_valid);
      }
    EXPECT_EQ(g.value(g.output("loss")).sharding, partial());
  }
}

// Qwen2 (q/k/v biases), Qwen3 (per-head q/k norms) and Mistral (a sliding window) are the
// same decoder to the pass, which knows none of their names: the same collectives, the
// biases and q/k norms run on this rank's sequence slice before the exchange (row-wise, with
// replicated weights), and the window stays on each attention, which runs on the whole
// (padded) sequence, so it counts global positions.
TEST(AutospPass, QwenAndMistralGetTheSameCollectivesAndKeepTheWindow) {
  for (const char* family : {"qwen2", "qwen3", "mistral"}) {
    SCOPED_TRACE(family);
    const int64_t layers = 2, S = 13, P = 2;
    models::LlamaConfig c = small_llama(layers, 4, 1);
    c.qkv_bias = std::string(family) == "qwen2";
    c.qk_norm = std::string(family) == "qwen3";
    c.sliding_window = std::string(family) == "mistral" ? 5 : 0;
    Graph g = autosp(models::llama_forward(c, {.batch = 2, .seq_len = S}), {.sp_size = P});
    EXPECT_EQ(collectives(g).size(), size_t(4 * layers + 1));
    int attentions = 0, norms_before = 0, biased = 0;
    for (const Node& n : g.nodes()) {
      if (n.op == OpKind::attention) {
        ++attentions;
        EXPECT_EQ(g.shape(n.inputs[0])[1], 14);  // the whole sequence, padded to a multiple of P
        EXPECT_EQ(n.attrs.get_int("window", 0), c.sliding_window);
      }
      if (n.op == OpKind::rms_norm && g.shape(n.inputs[0]).size() == 4) {
        ++norms_before;
        EXPECT_EQ(g.shape(n.inputs[0])[1], 7);  // this rank's slice
      }
      if (n.op == OpKind::linear && n.inputs.size() == 3) ++biased;
    }
    EXPECT_EQ(attentions, layers);
    EXPECT_EQ(norms_before, c.qk_norm ? 2 * layers : 0);
    EXPECT_EQ(biased, c.qkv_bias ? 3 * layers : 0);
  }
}

// Packed samples: the document ids are a sequence input, split like the others, and one
// all_gather (dim 1, over the group) makes them whole for every attention, which then runs
// on head shards over the whole padded sequence; tokens, positions and labels stay sharded.
TEST(AutospPass, GoldenPackedLlamaGathersDocumentIdsOnce) {
  const int64_t layers = 2, P = 2;
  Graph fwd = models::llama_forward(small_llama(layers, 2, 1), {.batch = 1, .seq_len = 5, .documents = true});
  Graph g = autosp(fwd, {.sp_size = P});
  testing::expect_golden(print_graph(g), "autosp_packed_llama2_p2.ir");
  const ValueId docs = g.find_input("document_ids");
  EXPECT_EQ(g.value(docs).sharding, shard(1));
  EXPECT_EQ(g.shape(docs), (Shape{1, 3}));
  int gathers = 0, attentions = 0;
  ValueId whole = -1;
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::all_gather) {
      ++gathers;
      EXPECT_EQ(n.inputs[0], docs);
      EXPECT_EQ(n.attrs.get_int("dim"), 1);
      EXPECT_EQ(n.attrs.get_str("group"), "sp");
      whole = n.outputs[0];
      EXPECT_EQ(g.shape(whole), (Shape{1, 6}));  // S = 5 padded to P * 3
    }
    if (n.op == OpKind::attention) {
      ++attentions;
      ASSERT_EQ(n.inputs.size(), 4u);
      EXPECT_EQ(n.inputs[3], whole);
      EXPECT_EQ(g.value(n.inputs[0]).sharding, shard(2));
    }
  }
  EXPECT_EQ(gathers, 1);
  EXPECT_EQ(attentions, layers);
  // Through autodiff: each attention_backward reads the same gathered ids.
  Graph joint = autodiff(g);
  for (const Node& n : joint.nodes())
    if (n.op == OpKind::attention_backward) {
      ASSERT_EQ(n.inputs.size(), 7u);
      EXPECT_EQ(joint.node(joint.value(n.inputs[6]).producer).op, OpKind::all_gather);
    }
}

// Padding gets a document of its own (the last real id + 1), so no query sees it.
TEST(AutospPass, PaddingIsADocumentOfItsOwn) {
  SequenceBatch full{1, 5, {1, 2, 3, 4, 5}, {2, 3, 4, 5, -100}, {7, 8, 0, 1, 2}, {0, 0, 1, 1, 1}};
  SequenceBatch r1 = prepare_autosp_inputs(full, 1, 2);
  EXPECT_EQ(r1.document_ids, (std::vector<int32_t>{1, 1, 2}));
  EXPECT_EQ(r1.position_ids, (std::vector<int32_t>{1, 2, 5}));
  EXPECT_EQ(r1.labels, (std::vector<int32_t>{5, -100, -100}));
}

TEST(AutospPass, SplitsSequenceInputsWithPaddingAndKeepsParametersWhole) {
  Graph fwd = models::llama_forward(small_llama(1, 4, 4), {.batch = 2, .seq_len = 13});
  Graph g = autosp(fwd, {.sp_size = 4});
  for (ValueId v : g.inputs()) {
    const Role r = g.role(v);
    if (r == Role::parameter) {
      EXPECT_EQ(g.shape(v), fwd.shape(fwd.find_input(g.value(v).name)));
      EXPECT_EQ(g.value(v).sharding, replicated());
    } else {
      EXPECT_EQ(g.shape(v), (Shape{2, 4})) << g.value(v).name;  // ceil(13 / 4)
      EXPECT_EQ(g.value(v).sharding, shard(1));
    }
  }
  EXPECT_EQ(split_sequence(13, 4).padded, 16);
  EXPECT_EQ(split_sequence(13, 4).begin(3), 12);
}

TEST(AutospPass, TheJointGraphDifferentiatesEachCollectiveIntoItsInverse) {
  Graph fwd = models::llama_forward(small_llama(1, 4, 2), {.batch = 1, .seq_len = 8});
  Graph joint = autodiff(autosp(fwd, {.sp_size = 2}));
  verify(joint);
  int forward_a2a = 0, total_a2a = 0, all_reduces = 0;
  for (NodeId n = 0; n < static_cast<NodeId>(joint.nodes().size()); ++n) {
    const Node& node = joint.node(n);
    total_a2a += node.op == OpKind::all_to_all;
    all_reduces += node.op == OpKind::all_reduce;
  }
  const Graph sharded = autosp(fwd, {.sp_size = 2});
  for (const Node& node : sharded.nodes()) forward_a2a += node.op == OpKind::all_to_all;
  EXPECT_EQ(total_a2a, 2 * forward_a2a);  // one inverse exchange each
  EXPECT_EQ(all_reduces, 1);              // the count has no gradient
}

// ALiBi: a rank attends over its part of the heads, so its attention (and the backward, which
// takes the forward's attributes) reads its part of the slopes: the model's whole list stays
// on the node, and alibi_split P tells the kernel to read from rank x NH / P (the executor
// hands it the sp group). One graph for every rank, as ever.
TEST(AutospPass, AlibiAttentionReadsTheRanksPartOfTheSlopes) {
  const std::vector<double> slopes = {0.5, 0.25, 0.125, 0.0625};
  Tracer t;
  Tensor x = t.embedding(t.parameter("wte", {11, 16}), t.input(Role::tokens, "tokens", DType::i32, {1, 6}));
  Tensor q = t.reshape(t.linear(x, t.parameter("wq", {32, 16})), {1, 6, 4, 8});
  Tensor k = t.reshape(t.linear(x, t.parameter("wk", {16, 16})), {1, 6, 2, 8});
  Tensor v = t.reshape(t.linear(x, t.parameter("wv", {16, 16})), {1, 6, 2, 8});
  t.output("loss", t.sum(t.attention(q, k, v, true, 0.35, 0, 0, slopes)));
  const Graph fwd = t.finish();
  int attentions = 0;
  for (const Node& n : fwd.nodes()) {
    if (n.op == OpKind::attention) {
      EXPECT_FALSE(n.attrs.has("alibi_split"));
    }
  }
  const Graph joint = autodiff(autosp(fwd, {.sp_size = 2}));
  for (const Node& n : joint.nodes()) {
    if (n.op != OpKind::attention && n.op != OpKind::attention_backward) continue;
    ++attentions;
    EXPECT_EQ(n.attrs.get_floats("alibi"), slopes);
    EXPECT_EQ(n.attrs.get_int("alibi_split"), 2);
    EXPECT_EQ(joint.shape(n.inputs[n.op == OpKind::attention ? 0 : 1])[2], 2);  // NH / P query heads
  }
  EXPECT_EQ(attentions, 2);
}

// Heads split any other way than by the pass's exchange (no alibi_split) would read the first
// heads' slopes on every rank: the attention's sharding rule refuses it.
TEST(AutospPass, AlibiOnHeadsSplitWithoutTheExchangeIsRefused) {
  const OpDef& def = op_def(OpKind::attention);
  const Types qkv = {{DType::f32, {1, 6, 4, 8}}, {DType::f32, {1, 6, 2, 8}}, {DType::f32, {1, 6, 2, 8}}};
  const Shardings heads = {shard(2), shard(2), shard(2)};
  const Attrs plain{{"causal", int64_t{1}}, {"scale", 0.35}};
  Attrs alibi = plain;
  alibi.set("alibi", std::vector<double>{0.5, 0.25, 0.125, 0.0625});
  EXPECT_EQ(def.shard(heads, qkv, plain), (Shardings{shard(2), shard(1)}));
  try {
    def.shard(heads, qkv, alibi);
    ADD_FAILURE() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("ALiBi on heads split other than by the autosp pass's exchange"),
              std::string::npos)
        << e.what();
  }
  alibi.set("alibi_split", int64_t{2});
  EXPECT_EQ(def.shard(heads, qkv, alibi), (Shardings{shard(2), shard(1)}));
}

// broadcast repeats a whole x over like's first dims: the result is split as like is, on one of
// those dims; an x that is split, or like split within x's dims, is refused.
TEST(AutospPass, ABroadcastIsSplitAsTheOperandItRepeatsOver) {
  const OpDef& def = op_def(OpKind::broadcast);
  const Types types = {{DType::f32, {8}}, {DType::f32, {1, 6, 8}}};
  const Attrs rows{{"dims", int64_t{2}}};
  EXPECT_EQ(def.shard({replicated(), shard(1)}, types, rows), Shardings{shard(1)});
  EXPECT_EQ(def.shard({replicated(), replicated()}, types, rows), Shardings{replicated()});
  for (const auto& [in, what] : {std::pair<Shardings, const char*>{{shard(0), shard(1)}, "x must be replicated"},
                                 {{replicated(), partial()}, "like must not be a partial sum"}}) {
    try {
      def.shard(in, types, rows);
      ADD_FAILURE() << what;
    } catch (const ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
  try {
    def.shard({replicated(), shard(1)}, types, {{"dims", int64_t{1}}});
    ADD_FAILURE() << "like split within x's dims";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("like must be split on one of the dims x is repeated over"), std::string::npos)
        << e.what();
  }
}

// A mixture-of-experts layer with its load-balancing loss, as torch_import builds it: the moe op
// keeps its rows' sharding with no collective; the balance statistics (@partial) are all-reduced
// over the group once, the loss built of them is whole, and added to the cross-entropy's share
// (@partial) as 1/P of it on each rank. A length P does not divide is refused (padded positions
// would count as tokens).
Graph moe_with_balance_loss(int64_t S) {
  Tracer t;
  Tensor tok = t.input(Role::tokens, "tokens", DType::i32, {1, S});
  Tensor lab = t.input(Role::labels, "labels", DType::i32, {1, S});
  Tensor x = t.embedding(t.parameter("wte", {11, 8}), tok);
  Tensor logits = t.linear(x, t.parameter("router", {3, 8}));
  std::vector<Tensor> experts;
  for (int e = 0; e < 3; ++e)
    for (const char* m : {"gate", "up", "down"})
      experts.push_back(t.parameter(str(m, e), std::string(m) == "down" ? Shape{8, 4} : Shape{4, 8}));
  Tensor y = t.moe(x, logits, experts, 2, true);
  Tensor ce = t.linear_cross_entropy(y, t.parameter("head", {11, 8}), lab);
  Tensor stats = t.moe_balance({logits}, 2);
  Tensor aux = t.scale(t.sum(t.mul(t.slice(stats, 0, 0, 1), t.slice(stats, 0, 1, 2))), 3.0 / double(S * S));
  t.output("loss", t.add(ce, t.scale(aux, 0.1)));
  return t.finish();
}

TEST(AutospPass, GoldenMoeLoadBalancingLossP2) {
  const Graph g = autosp(moe_with_balance_loss(6), {.sp_size = 2});
  testing::expect_golden(print_graph(g), "autosp_moe_balance_p2.ir");
  const std::string e = testing::user_error_of([] { autosp(moe_with_balance_loss(5), {.sp_size = 2}); });
  EXPECT_NE(e.find("the load-balancing loss (moe_balance, node"), std::string::npos) << e;
  EXPECT_NE(e.find("needs the sequence length (5) to be a multiple of sequence_parallel_size (2)"), std::string::npos)
      << e;
}

TEST(AutospPass, OneRankIsTheIdentity) {
  Graph fwd = testing::tiny_transformer();
  EXPECT_EQ(print_graph(autosp(fwd, {.sp_size = 1})), print_graph(fwd));
}

void expect_user_error(const Graph& fwd, int64_t P, const std::string& fragment) {
  try {
    autosp(fwd, {.sp_size = P});
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(AutospPass, HeadCountsThatCannotBeSplitAreClearErrors) {
  expect_user_error(models::llama_forward(small_llama(1, 6, 6), {.batch = 1, .seq_len = 8}), 4,
                    "NH=6 query heads, not divisible by sequence_parallel_size P=4");
  expect_user_error(models::llama_forward(small_llama(1, 12, 3), {.batch = 1, .seq_len = 8}), 4,
                    "NKV=3 kv heads");
}

}  // namespace
}  // namespace autosp

namespace autosp {
namespace {

TEST(PrepareAutospInputs, SlicesEachRowAndPadsTheLastRank) {
  SequenceBatch full{2, 5, {}, {}, {}};
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 5; ++i) {
      full.input_ids.push_back(10 * b + i);
      full.labels.push_back(100 + 10 * b + i);
      full.position_ids.push_back(i);
    }
  SequenceBatch r0 = prepare_autosp_inputs(full, 0, 2), r1 = prepare_autosp_inputs(full, 1, 2);
  EXPECT_EQ(r0.S, 3);
  EXPECT_EQ(r0.input_ids, (std::vector<int32_t>{0, 1, 2, 10, 11, 12}));
  EXPECT_EQ(r1.input_ids, (std::vector<int32_t>{3, 4, 0, 13, 14, 0}));
  EXPECT_EQ(r1.labels, (std::vector<int32_t>{103, 104, -100, 113, 114, -100}));
  EXPECT_EQ(r1.position_ids, (std::vector<int32_t>{3, 4, 5, 3, 4, 5}));
}

}  // namespace
}  // namespace autosp

namespace autosp {
namespace {

TEST(AutospPass, FullAttentionWithPaddingIsAnErrorNotAWrongResult) {
  Tracer t;
  Tensor q = t.input(Role::tokens, "q_tokens", DType::i32, {1, 5});  // a sequence input fixing S = 5
  (void)q;
  Tensor w = t.parameter("w", {10, 8});
  Tensor x = t.reshape(t.embedding(w, q), {1, 5, 2, 4});
  t.output("y", t.sum(t.attention(x, x, x, /*causal=*/false, 0.5)));
  Graph fwd = t.finish();
  try {
    autosp(fwd, {.sp_size = 2});
    FAIL() << "padded full attention was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("is not causal and S=5 is not divisible"), std::string::npos) << e.what();
  }
  // Divisible: no padding, so full attention is exact and allowed.
  Tracer t4;
  Tensor q4 = t4.input(Role::tokens, "q_tokens", DType::i32, {1, 4});
  Tensor w4 = t4.parameter("w", {10, 8});
  Tensor x4 = t4.reshape(t4.embedding(w4, q4), {1, 4, 2, 4});
  t4.output("y", t4.sum(t4.attention(x4, x4, x4, /*causal=*/false, 0.5)));
  EXPECT_NO_THROW(autosp(t4.finish(), {.sp_size = 2}));
}

}  // namespace
}  // namespace autosp
