// The tile pass: golden graphs of a two-layer Llama (the tile stage, and the joint graph
// after checkpoint sac), the tiles' coverage of the rows, that no [S, F] value of the MLP
// exists whole in forward or backward (and what is alive at once), the budget rule, the
// numbers against the untiled run, and the trainer's activation peak at S = 2048.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include "models/llama.h"
#include "ops/op.h"
#include "passes/autodiff.h"
#include "passes/autosp.h"
#include "passes/pipeline.h"
#include "passes/tile.h"
#include "testing/golden.h"
#include "train/config.h"
#include "train/trainer.h"
#include "testing/tiny_llama.h"
#include "testing/compare.h"

namespace autosp {
namespace {

using testing::normalised_error;

using testing::tiny_llama;  // F = 12: a value with 12 in its shape is an MLP value

Graph compiled(const models::LlamaConfig& model, int64_t B, int64_t S, int64_t tile_rows, CheckpointPolicy policy,
               int64_t sp = 1, const std::string& stage = "checkpoint") {
  CompileOptions options{sp, sp > 1 ? std::vector<std::string>{"autosp"} : std::vector<std::string>{}, sp > 1};
  options.checkpoint.policy = policy;
  options.tile.tile_rows = tile_rows;
  Graph out;
  compile(models::llama_forward(model, {.batch = B, .seq_len = S}), options,
          [&](const std::string& s, const Graph& g) {
            if (s == stage) out = g;
          });
  return out;
}

int64_t tile_of(const Node& node) { return node.attrs.get_int(kTileAttribute, -1); }

// The concat that joins a region's tiles (autosp's kv-head repeat is a concat too).
bool joins_tiles(const Graph& g, const Node& node) {
  return node.op == OpKind::concat && tile_of(g.node(g.value(node.inputs[0]).producer)) >= 0;
}

bool has_dim(const Shape& shape, int64_t d) { return std::find(shape.begin(), shape.end(), d) != shape.end(); }

TEST(Tile, GoldenTwoLayerLlamaTileStage) {
  testing::expect_golden(print_graph(compiled(tiny_llama(), 1, 4, 2, CheckpointPolicy::none, 1, "tile")),
                         "tile_llama2.ir");
}

TEST(Tile, GoldenTwoLayerLlamaJointWithSac) {
  testing::expect_golden(print_graph(compiled(tiny_llama(), 1, 4, 2, CheckpointPolicy::sac)),
                         "tile_sac_llama2.ir");
}

TEST(Tile, OffOrOneTileIsTheGraphUnchanged) {
  const Graph forward = models::llama_forward(tiny_llama(), {.batch = 1, .seq_len = 8});
  EXPECT_TRUE(tile(forward, {}) == forward);
  EXPECT_TRUE(tile(forward, {.tile_rows = 8}) == forward);
  EXPECT_TRUE(tile(forward, {.tile_rows = 100}) == forward);
  EXPECT_THROW(tile(forward, {.tile_rows = -1}), UserError);
}

// The slices of each region partition [0, S) in order, each tile's nodes carry its index,
// and the concat joins the tiles in order; nodes outside the regions are the forward's.
void check_tiles(const Graph& forward, const Graph& g, int64_t S, int64_t R, int layers) {
  SCOPED_TRACE(str("S=", S, " R=", R));
  const int64_t T = (S + R - 1) / R;
  int regions = 0;
  int64_t outside = 0;
  for (const Node& node : g.nodes()) {
    if (node.op == OpKind::input) continue;
    if (tile_of(node) < 0 && !joins_tiles(g, node)) ++outside;
    if (!joins_tiles(g, node)) continue;
    ++regions;
    ASSERT_EQ(node.inputs.size(), size_t(T));
    int64_t next = 0;
    for (int64_t t = 0; t < T; ++t) {
      const Node& last = g.node(g.value(node.inputs[t]).producer);
      EXPECT_EQ(last.op, OpKind::add);  // the residual add is in the region
      EXPECT_EQ(tile_of(last), t);
      EXPECT_EQ(g.shape(node.inputs[t])[1], std::min(R, S - t * R));
      // Walk back to the tile's slice: every node on the way is of tile t.
      std::vector<ValueId> stack = {node.inputs[t]};
      int slices = 0;
      while (!stack.empty()) {
        const ValueId v = stack.back();
        stack.pop_back();
        if (g.is_input(v)) continue;
        const Node& p = g.node(g.value(v).producer);
        if (tile_of(p) != t) continue;  // the region's input x
        if (p.op == OpKind::slice) {
          ++slices;
          EXPECT_EQ(p.attrs.get_int("dim"), 1);
          EXPECT_EQ(p.attrs.get_int("start"), next);
          EXPECT_EQ(p.attrs.get_int("end"), std::min(next + R, S));
          EXPECT_EQ(g.shape(p.inputs[0])[1], S);
          continue;
        }
        for (ValueId in : p.inputs) stack.push_back(in);
      }
      EXPECT_GE(slices, 1) << "tile " << t;
      next = std::min(next + R, S);
    }
    EXPECT_EQ(next, S);
  }
  EXPECT_EQ(regions, layers);
  // Each region replaced 6 nodes (norm, gate, up, swiglu, down, add) by T x 7 and a concat.
  int64_t forward_ops = 0;
  for (const Node& node : forward.nodes()) forward_ops += node.op != OpKind::input;
  EXPECT_EQ(outside, forward_ops - 6 * layers);
}

TEST(Tile, TilesCoverTheRowsExactlyOnceDivisibleOrNot) {
  for (auto [S, R] : {std::pair{12, 4}, {10, 4}, {9, 8}, {7, 1}}) {
    const Graph forward = models::llama_forward(tiny_llama(3), {.batch = 2, .seq_len = S});
    check_tiles(forward, tile(forward, {.tile_rows = R}), S, R, 3);
  }
}

// Under autosp the tiles split this rank's shard and keep its @shard(1) annotation.
TEST(Tile, UnderAutospTilesSplitTheLocalShardAndStaySharded) {
  const int64_t S = 15, P = 2, R = 3;  // S_local = 8: tiles of 3, 3, 2
  const Graph sharded = autosp(models::llama_forward(tiny_llama(), {.batch = 1, .seq_len = S}), {P});
  const Graph g = tile(sharded, {.tile_rows = R});
  check_tiles(sharded, g, split_sequence(S, P).local, R, 2);
  int tiled_values = 0;
  for (const Node& node : g.nodes()) {
    if (tile_of(node) < 0 && !joins_tiles(g, node)) continue;
    for (ValueId v : node.outputs) {
      EXPECT_EQ(g.value(v).sharding, shard(1)) << op_name(node.op) << " %" << v;
      ++tiled_values;
    }
  }
  EXPECT_EQ(tiled_values, 2 * (3 * 8 + 1));  // per layer: 3 tiles of 8 values, one concat
  // The joint graph under autosp compiles and verifies with tiling on.
  verify(compiled(tiny_llama(), 1, S, R, CheckpointPolicy::sac, P));
}

// The largest MLP value (one with F in its shape) of a graph, in elements; a weight or its
// gradient is [F, H] or [H, F].
int64_t largest_mlp_value(const Graph& g, int64_t F) {
  int64_t most = 0;
  for (const Value& v : g.values())
    if (has_dim(v.type.shape, F)) most = std::max(most, numel(v.type.shape));
  return most;
}

TEST(Tile, NoSequenceByFValueExistsWholeInForwardOrBackward) {
  const models::LlamaConfig model = tiny_llama();
  const int64_t B = 2, S = 64, R = 16, F = model.intermediate_size, H = model.hidden_size;
  ASSERT_LT(F * H, B * R * F);  // weights are smaller than one tile
  for (CheckpointPolicy policy : {CheckpointPolicy::none, CheckpointPolicy::full, CheckpointPolicy::sac}) {
    SCOPED_TRACE(checkpoint_policy_name(policy));
    EXPECT_EQ(largest_mlp_value(compiled(model, B, S, 0, policy), F), B * S * F);  // untiled
    EXPECT_EQ(largest_mlp_value(compiled(model, B, S, R, policy), F), B * R * F);
    EXPECT_EQ(largest_mlp_value(compiled(model, B, S, R, policy, 2), F), B * R * F);  // S_local = 32
  }
}

// Under every policy backward reads no value of a tiled forward node, only its copy made
// for that tile's backward; the tile copies are bitwise copies (same op, attributes, tile).
TEST(Tile, CheckpointRecomputesEveryTileUnderEveryPolicy) {
  for (CheckpointPolicy policy : {CheckpointPolicy::none, CheckpointPolicy::full, CheckpointPolicy::sac}) {
    SCOPED_TRACE(checkpoint_policy_name(policy));
    const Graph g = compiled(tiny_llama(), 1, 12, 4, policy, 2);  // S_local = 6: tiles of 4, 2
    const NodeId forward_end = g.value(g.output("loss")).producer + 1;
    std::map<int64_t, int> copies;
    for (NodeId n = forward_end; n < NodeId(g.nodes().size()); ++n) {
      const Node& node = g.node(n);
      for (ValueId in : node.inputs) {
        const NodeId p = g.value(in).producer;
        EXPECT_FALSE(p < forward_end && tile_of(g.node(p)) >= 0)
            << "backward node " << n << " (" << op_name(node.op) << ") reads %" << in << " of tile "
            << tile_of(g.node(p));
      }
      if (tile_of(node) < 0) continue;
      EXPECT_TRUE(g.value(node.outputs[0]).name.starts_with("recompute:%")) << "node " << n;
      ++copies[tile_of(node)];
    }
    // Per layer and tile: slice, rms_norm, gate, up and swiglu (down and add: nothing reads them).
    EXPECT_EQ(copies, (std::map<int64_t, int>{{0, 2 * 5}, {1, 2 * 5}}));
  }
}

// Bytes of MLP values alive at once at the worst point of the executor's order: a value
// lives from its node to its last use (a reshape shares its operand's buffer).
int64_t peak_live_mlp_bytes(const Graph& g, int64_t F) {
  const auto& nodes = g.nodes();
  std::vector<ValueId> root(g.values().size());
  std::vector<NodeId> last(g.values().size(), -1);
  for (NodeId n = 0; n < NodeId(nodes.size()); ++n) {
    for (ValueId out : nodes[n].outputs)
      root[out] = nodes[n].op == OpKind::reshape ? root[nodes[n].inputs[0]] : out;
    for (ValueId in : nodes[n].inputs) last[root[in]] = n;
  }
  for (const GraphOutput& o : g.outputs()) last[root[o.value]] = NodeId(nodes.size());
  int64_t live = 0, peak = 0;
  std::vector<std::vector<ValueId>> dies(nodes.size() + 1);
  for (NodeId n = 0; n < NodeId(nodes.size()); ++n) {
    for (ValueId out : nodes[n].outputs) {
      if (root[out] != out || g.is_input(out) || !has_dim(g.shape(out), F)) continue;
      live += g.type(out).bytes();
      dies[std::max(last[out], n)].push_back(out);
    }
    peak = std::max(peak, live);
    for (ValueId v : dies[n]) live -= g.type(v).bytes();
  }
  return peak;
}

// What tiling is for: one tile's MLP values at a time, in forward and backward, however
// many tiles; without tiling sac keeps gate and up of every layer whole.
TEST(Tile, BackwardHoldsOneTileOfMlpValuesAtATime) {
  const models::LlamaConfig model = tiny_llama(3);
  const int64_t B = 1, S = 256, F = model.intermediate_size;
  const int64_t whole = B * S * F * 4;
  for (CheckpointPolicy policy : {CheckpointPolicy::none, CheckpointPolicy::full, CheckpointPolicy::sac}) {
    SCOPED_TRACE(checkpoint_policy_name(policy));
    const int64_t untiled = peak_live_mlp_bytes(compiled(model, B, S, 0, policy), F);
    const int64_t at32 = peak_live_mlp_bytes(compiled(model, B, S, 32, policy), F);
    const int64_t at16 = peak_live_mlp_bytes(compiled(model, B, S, 16, policy), F);
    std::printf("%s: peak live MLP bytes untiled %lld, tiles of 32 rows %lld, of 16 rows %lld ([S, F] = %lld)\n",
                checkpoint_policy_name(policy), (long long)untiled, (long long)at32, (long long)at16,
                (long long)whole);
    // Observed: five [R, F] values at the worst point (dswiglu, the recomputed gate and up,
    // dgate and dup, in swiglu_backward), beside [F, H] values: the finished gradients of
    // the MLP weights (graph outputs) and those being summed over tiles. Allow six.
    const int64_t weights = (3 * model.num_hidden_layers + 3) * F * model.hidden_size * 4;
    EXPECT_LE(at32, 6 * whole / 8 + weights);
    EXPECT_LE(at16, 6 * whole / 16 + weights);
    EXPECT_LT(at16, at32);
    EXPECT_GE(untiled, policy == CheckpointPolicy::full ? 3 * whole : 3 * 2 * whole);
  }
}

TEST(Tile, TheBudgetChoosesTheFewestTilesThatFit) {
  // 1000 bytes per row, 4096 rows: 4 MB of region values.
  const TileOptions budget{.budget_bytes = 16 << 20, .budget_fraction = 1.0 / 16};  // 1 MiB per tile
  const int64_t rows = choose_tile_rows(4096, 1000, budget);
  EXPECT_EQ(rows, 1024);  // ceil(4096000 / 1048576) = 4 tiles
  EXPECT_LE(rows * 1000, (16 << 20) / 16);
  EXPECT_GT(((4096 + 2) / 3) * 1000, (16 << 20) / 16);  // 3 tiles would not fit
  EXPECT_EQ(choose_tile_rows(4096, 100, budget), 4096);  // fits whole: no tiling
  EXPECT_EQ(choose_tile_rows(4096, 1 << 20, budget), 64);  // never below min_rows
  EXPECT_EQ(choose_tile_rows(4096, 1000, {}), 4096);       // no budget: no tiling
  EXPECT_EQ(choose_tile_rows(4096, 1000, {.tile_rows = 100, .budget_bytes = 1}), 100);  // forced
  EXPECT_EQ(choose_tile_rows(10, 1000, {.tile_rows = 100}), 10);

  // Through the pass: each MLP tile's values (rms_norm's y and rstd, gate, up, swiglu,
  // down, add) are (3 H + 1 + 3 F) floats per row.
  const models::LlamaConfig model = tiny_llama();
  const int64_t S = 1000, per_row = 4 * (3 * model.hidden_size + 1 + 3 * model.intermediate_size);
  const Graph forward = models::llama_forward(model, {.batch = 1, .seq_len = S});
  const Graph g = tile(forward, {.budget_bytes = S * per_row * 16 / 5, .budget_fraction = 1.0 / 16, .min_rows = 1});
  int regions = 0;
  for (const Node& node : g.nodes()) {
    if (node.op != OpKind::concat) continue;
    ++regions;
    EXPECT_EQ(node.inputs.size(), 5u);  // a tile may take 1/5 of the region: 5 tiles of 200 rows
    EXPECT_EQ(g.shape(node.inputs[0])[1], 200);
  }
  EXPECT_EQ(regions, 2);
}

TEST(Tile, ConfigKeyTileRows) {
  auto parse = [](const nlohmann::json& compile) {
    return train::parse_train_config({{"train_micro_batch_size_per_gpu", 1}, {"compile", compile}}, "c.json",
                                     nullptr);
  };
  EXPECT_EQ(parse({{"tile_rows", 256}}).compile.tile_rows, 256);
  EXPECT_EQ(parse(nlohmann::json::object()).compile.tile_rows, 0);
  for (const nlohmann::json& bad : {nlohmann::json(-1), nlohmann::json("256"), nlohmann::json(2.5)}) {
    try {
      parse({{"tile_rows", bad}});
      ADD_FAILURE() << "accepted tile_rows " << bad.dump();
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("compile.tile_rows"), std::string::npos) << e.what();
    }
  }
}

// Every label of the recording source; tokens derived from the sample index.
class Counting final : public train::DataSource {
 public:
  explicit Counting(int64_t V) : V_(V) {}
  void read_sample(int64_t sample, int64_t S, int32_t* inputs, int32_t* labels) const override {
    for (int64_t i = 0; i < S; ++i) {
      inputs[i] = static_cast<int32_t>((sample * 7 + i * 3) % V_);
      labels[i] = static_cast<int32_t>((sample * 5 + i) % V_);
    }
  }
  std::string describe(int64_t) const override { return "counting"; }

 private:
  int64_t V_;
};

// Tiling changes no forward value and reorders the sums over rows of parameter gradients;
// every checkpoint policy gives bitwise the numbers of `none` with the same tiles.
TEST(Tile, NumbersEqualTheUntiledRunUpToTheOrderOfGradientSums) {
  models::LlamaConfig model = tiny_llama();
  model.hidden_size = 32;
  model.intermediate_size = 96;
  model.vocab_size = 50;
  const int64_t B = 2, S = 100;
  const train::ModelState state = train::ModelState::initial(model, 3);
  std::vector<int32_t> inputs(B * S), labels(B * S);
  Counting data(model.vocab_size);
  for (int64_t j = 0; j < B; ++j) data.read_sample(j, S, inputs.data() + j * S, labels.data() + j * S);
  auto run = [&](int64_t tile_rows, const char* policy, std::vector<std::vector<float>>& grads) {
    train::TrainConfig config;
    config.train_micro_batch_size_per_gpu = B;
    config.compile.checkpoint = policy;
    config.compile.tile_rows = tile_rows;
    train::resolve_batch(config, 1, "test");
    train::Trainer trainer(model, config, S, state);
    return trainer.loss_and_grads(inputs.data(), labels.data(), grads);
  };
  std::vector<std::vector<float>> untiled;
  const double loss = run(0, "none", untiled);
  for (int64_t R : {64, 32, 7}) {  // 100 rows: 64 + 36, 3 x 32 + 4, 14 x 7 + 2
    std::vector<std::vector<float>> none;
    const double tiled_loss = run(R, "none", none);
    // Every forward op is row by row, and cpu::gemm sums along K in one FMA chain per
    // element whatever the row count (kernels/cpu/gemm.h): observed bitwise equal; the bound
    // is only fp32 rounding of the loss, as for a BLAS that blocks K by the row count.
    EXPECT_NEAR(tiled_loss, loss, 1e-6 * std::abs(loss)) << "R=" << R;
    double worst = 0;
    for (size_t i = 0; i < none.size(); ++i) {
      const double err = normalised_error(none[i], untiled[i]);
      worst = std::max(worst, err);
      // A sum over B S = 200 rows becomes per-tile sums and a sum over tiles: fp32
      // reordering, observed at most 5.0e-7 (R = 32; 4.2e-7 at 64, 3.3e-7 at 7). A row
      // missed or counted twice moves a gradient by about 1/200 of its scale.
      EXPECT_LT(err, 2e-6) << state.specs[i].name << " R=" << R;
    }
    std::printf("tiles of %lld rows vs untiled: loss %s, worst parameter gradient (normalised) %.2e\n",
                (long long)R, tiled_loss == loss ? "bitwise equal" : "differs", worst);
    for (const char* policy : {"full", "sac"}) {
      std::vector<std::vector<float>> grads;
      EXPECT_EQ(run(R, policy, grads), tiled_loss) << policy;
      EXPECT_EQ(grads, none) << policy << " R=" << R;  // recomputation: the same kernels on the same inputs
    }
  }
}

// The point of it all: at S = 2048 with F = 16 H, the activation peak with tiles + sac is
// well below sac alone.
TEST(Tile, LowersTheActivationPeakAtLongSequence) {
  models::LlamaConfig model;
  model.vocab_size = 64;
  model.hidden_size = 32;
  model.intermediate_size = 512;
  model.num_hidden_layers = 2;
  model.num_attention_heads = 4;
  model.num_key_value_heads = 2;
  model.head_dim = 8;
  const int64_t S = 2048;
  std::map<std::string, train::StepStats> stats;
  for (const char* policy : {"none", "full", "sac"})
    for (int64_t R : {0, 256}) {
      train::TrainConfig config;
      config.train_micro_batch_size_per_gpu = 1;
      config.compile.checkpoint = policy;
      config.compile.tile_rows = R;
      train::resolve_batch(config, 1, "test");
      train::Trainer trainer(model, config, S, train::ModelState::initial(model, 5));
      Counting data(model.vocab_size);
      stats[str(policy, R)] = trainer.train_step(data);
      std::printf("S=%lld checkpoint %s, tile_rows %lld: activation peak %lld B (%.2f MiB)\n", (long long)S, policy,
                  (long long)R, (long long)stats[str(policy, R)].activation_bytes,
                  double(stats[str(policy, R)].activation_bytes) / (1 << 20));
    }
  // [S, F] fp32 is 4 MiB. Untiled sac keeps gate and up of both layers (16 MiB) and the
  // last layer's backward adds about 4 more [S, F] values; tiled sac keeps none of them.
  // Observed: none 35.9 -> 6.3 MiB, full 22.4 -> 5.0 MiB, sac 30.9 -> 5.8 MiB.
  EXPECT_LT(stats["sac256"].activation_bytes, stats["sac0"].activation_bytes / 2);
  EXPECT_LT(stats["none256"].activation_bytes, stats["none0"].activation_bytes / 2);
  EXPECT_LT(stats["full256"].activation_bytes, stats["full0"].activation_bytes);
}

}  // namespace
}  // namespace autosp
