// `autosp plan`: its answer is the trainer's own plan (same pipeline, same model state and
// reserve), its longest sequence is the longest that fits, and it orders strategies as
// their memory does.
#include <gtest/gtest.h>

#include <fstream>
#include <numeric>
#include <regex>
#include <set>
#include <nlohmann/json.hpp>
#include <omp.h>

#include "frontend/torch_import.h"
#include "models/llama.h"
#include "models/model.h"
#include "passes/pipeline.h"
#include "runtime/executor.h"
#include "testing/process.h"
#include "train/device_layout.h"
#include "train/planner.h"
#include "train/step_options.h"
#include "util/error.h"

namespace autosp {
namespace {

using nlohmann::json;
using testing::run_command;

models::LlamaConfig small_llama() {
  models::LlamaConfig c;
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.intermediate_size = 256;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  return c;
}

// The attribute `name` of an SVG element's text (`<tag a="..." ...>`); empty if absent.
std::string attribute(const std::string& element, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(element, m, std::regex(str("\\s", name, "=\"([^\"]*)\"")))) return "";
  return m[1].str();
}

// The plot is well-formed XML as far as its elements go (every tag closed, in order, one
// root), has one polyline per strategy, each with a colour of its own, and a legend whose
// box lies inside the canvas and holds every label (at the width the writer allows each
// character, data-width).
void check_plot(const std::string& svg, size_t series) {
  std::vector<std::string> open;
  std::vector<std::string> elements;  // the start tags, in order
  int roots = 0;
  for (size_t at = svg.find('<'); at != std::string::npos; at = svg.find('<', at + 1)) {
    const size_t end = svg.find('>', at);
    ASSERT_NE(end, std::string::npos) << "unterminated tag at " << at;
    const std::string tag = svg.substr(at, end - at + 1);
    const std::string name = tag.substr(tag[1] == '/' ? 2 : 1, tag.find_first_of(" />", 2) - (tag[1] == '/' ? 2 : 1));
    if (tag[1] == '/') {
      ASSERT_FALSE(open.empty()) << tag;
      ASSERT_EQ(open.back(), name) << "closes " << tag << " inside <" << open.back() << ">";
      open.pop_back();
      continue;
    }
    if (open.empty()) ++roots;
    elements.push_back(tag);
    if (tag[tag.size() - 2] != '/') open.push_back(name);
  }
  EXPECT_TRUE(open.empty()) << "<" << open.back() << "> never closed";
  EXPECT_EQ(roots, 1);
  ASSERT_FALSE(elements.empty());
  ASSERT_TRUE(elements[0].starts_with("<svg"));
  const double W = std::stod(attribute(elements[0], "width")), H = std::stod(attribute(elements[0], "height"));
  EXPECT_EQ(attribute(elements[0], "viewBox"), str("0 0 ", attribute(elements[0], "width"), " ",
                                                    attribute(elements[0], "height")));
  std::set<std::string> colours;
  size_t lines = 0, labels = 0;
  double lx = -1, ly = -1, lw = 0, lh = 0;
  for (const std::string& e : elements) {
    const std::string cls = attribute(e, "class");
    if (e.starts_with("<polyline") && cls == "series") {
      ++lines;
      EXPECT_TRUE(colours.insert(attribute(e, "stroke")).second) << "a second series in " << attribute(e, "stroke");
    }
    if (cls == "legend") {
      lx = std::stod(attribute(e, "x")), ly = std::stod(attribute(e, "y"));
      lw = std::stod(attribute(e, "width")), lh = std::stod(attribute(e, "height"));
      EXPECT_GE(lx, 0);
      EXPECT_GE(ly, 0);
      EXPECT_LE(lx + lw, W);
      EXPECT_LE(ly + lh, H);
    }
    if (cls == "legend-label") {
      ++labels;
      ASSERT_GE(lx, 0) << "a label before the legend's box";
      const double x = std::stod(attribute(e, "x")), y = std::stod(attribute(e, "y"));
      EXPECT_GE(x, lx);
      EXPECT_LE(x + std::stod(attribute(e, "data-width")), lx + lw);
      EXPECT_GT(y, ly);
      EXPECT_LT(y, ly + lh);
      EXPECT_GE(std::stod(attribute(elements[0], "font-size")), 12);
    }
  }
  EXPECT_EQ(lines, series);
  EXPECT_EQ(labels, series);
  EXPECT_NE(svg.find("device memory"), std::string::npos);
}

// An imported PyTorch program is planned from its own graph: transformers' Llama exported
// (tests/fixtures/torch_export/llama) plans as autosp's Llama of its config does, under each
// policy, ZeRO stage and dtype, at SP 1 and 2: the same model state and the same bytes live at
// the arena's peak, by what they hold; only the gaps the packing leaves may differ (within 1%).
TEST(Plan, AnImportedLlamaPlansAsItsConfig) {
  const TorchProgram program = TorchProgram::load(testing::source_path("tests/fixtures/torch_export/llama/model.pt2"));
  models::LlamaConfig c;  // make_torch_export_fixtures.py's llama
  c.vocab_size = 64, c.hidden_size = 32, c.intermediate_size = 48, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 8, c.rms_norm_eps = 1e-6;
  const auto imported = std::make_shared<const models::Model>(program.model());
  for (DType dtype : {DType::f32, DType::bf16})
    for (int zero : {0, 3})
      for (int sp : {1, 2})
        for (CheckpointPolicy policy : {CheckpointPolicy::none, CheckpointPolicy::sac, CheckpointPolicy::full}) {
          const train::MemoryStrategy strategy{{policy}, {}};
          SCOPED_TRACE(str(dtype_name(dtype), " ZeRO-", zero, " SP ", sp, " ", train::strategy_name(strategy)));
          const train::PlanSetup built{.model = c, .world = 2, .sp = sp, .zero = zero, .dtype = dtype};
          train::PlanSetup setup = built;
          setup.program = imported;
          const train::MemoryBreakdown a = train::plan_step(setup, strategy, 4096);
          const train::MemoryBreakdown b = train::plan_step(built, strategy, 4096);
          EXPECT_EQ(a.parameters, b.parameters);
          EXPECT_EQ(a.optimizer_state, b.optimizer_state);
          EXPECT_EQ(a.runtime_reserve, b.runtime_reserve);
          const train::ArenaParts &x = a.arena_parts, &y = b.arena_parts;
          EXPECT_EQ(x.total() - x.fragmentation, y.total() - y.fragmentation);
          EXPECT_EQ(x.activations, y.activations);
          EXPECT_EQ(x.activation_gradients, y.activation_gradients);
          EXPECT_EQ(x.workspaces, y.workspaces);
          EXPECT_EQ(x.gradient_buckets, y.gradient_buckets);
          EXPECT_EQ(x.gathered_parameters, y.gathered_parameters);
          // (the graphs list some nodes in another order, which packs the arena's gaps otherwise)
          EXPECT_NEAR(double(a.arena), double(b.arena), 0.01 * double(b.arena));
        }
}

// Parameters a program's user froze (nanogpt_frozen's: requires_grad=False) are planned as the
// trainer holds them: beside the trained ones, without gradients or optimizer state; fp32 on the
// CPU, their bf16 copy on the device (the device step's own flat buffer).
TEST(Plan, AProgramsFrozenParametersAreHeldWithoutOptimizerState) {
  const TorchProgram frozen =
      TorchProgram::load(testing::source_path("tests/fixtures/torch_export/nanogpt_frozen/model.pt2"));
  const TorchProgram whole = TorchProgram::load(testing::source_path("tests/fixtures/torch_export/nanogpt/model.pt2"));
  int64_t trained = 0, all = 0;
  std::vector<int64_t> constants;
  for (const models::ParameterSpec& p : frozen.parameters()) trained += numel(p.shape);
  for (const models::ParameterSpec& p : whole.parameters()) all += numel(p.shape);
  for (const models::ParameterSpec& c : frozen.constants()) constants.push_back(numel(c.shape));
  ASSERT_EQ(trained + std::accumulate(constants.begin(), constants.end(), int64_t{0}), all);
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    train::PlanSetup a{.dtype = dtype}, b{.dtype = dtype};
    a.program = std::make_shared<const models::Model>(frozen.model());
    b.program = std::make_shared<const models::Model>(whole.model());
    const train::MemoryBreakdown x = train::plan_step(a, {{CheckpointPolicy::none}, {}}, 32);
    const train::MemoryBreakdown y = train::plan_step(b, {{CheckpointPolicy::none}, {}}, 32);
    if (dtype == DType::f32) {
      EXPECT_EQ(x.parameters, 4 * all);
      EXPECT_EQ(y.parameters, 4 * all);
      EXPECT_EQ(x.optimizer_state, 8 * trained);
    } else {
      EXPECT_EQ(x.parameters, 2 * trained + train::device_constant_bytes(constants));
      EXPECT_EQ(x.optimizer_state, 12 * trained);
      EXPECT_EQ(x.gradient_sum, 4 * trained);
    }
  }
}

// A length the program refuses (its position table is shorter) does not fit: the search stops
// below it and says why.
TEST(Plan, AProgramsLongestSequenceStopsAtItsPositionTable) {
  const TorchProgram program = TorchProgram::load(testing::source_path("tests/fixtures/torch_export/gpt2/model.pt2"));
  train::PlanSetup setup;
  setup.program = std::make_shared<const models::Model>(program.model());
  const train::StrategyResult r = train::longest_sequence(setup, {}, int64_t(1) << 30, 16);
  EXPECT_EQ(r.max_seq_len, 64);  // its 64 positions; 1 GiB would hold far more
  EXPECT_NE(r.refused.find("a learned position table of 64 rows"), std::string::npos) << r.refused;
}

TEST(Plan, TheLongestSequenceFitsAndTheNextDoesNot) {
  train::PlanSetup setup{.model = small_llama(), .world = 2, .sp = 2, .zero = 1, .dtype = DType::bf16};
  const int64_t device = int64_t(1280) << 20;  // the bf16 plan reserves 1 GiB for the GPU runtime
  for (CheckpointPolicy policy : {CheckpointPolicy::none, CheckpointPolicy::sac, CheckpointPolicy::full}) {
    const train::MemoryStrategy strategy{{policy}, {}};
    const train::StrategyResult r = train::longest_sequence(setup, strategy, device, 512);
    SCOPED_TRACE(r.name);
    ASSERT_GT(r.max_seq_len, 0);
    EXPECT_EQ(r.max_seq_len % 512, 0);
    EXPECT_LE(train::plan_step(setup, strategy, r.max_seq_len).total(), device);
    EXPECT_GT(train::plan_step(setup, strategy, r.max_seq_len + 512).total(), device);
    EXPECT_EQ(r.peak_bytes, train::plan_step(setup, strategy, r.max_seq_len).total());
  }
}

TEST(Plan, IsWhatTheTrainerPlans) {
  // The f32 plan of one process is the trainer's planned peak less the compiled program's
  // tables (which the planner has no executor to count); with gradient accumulation too,
  // where ZeRO 0 and 1 compile a second program (sharing the arena) and keep the gradient sum.
  const models::LlamaConfig model = small_llama();
  for (const char* policy : {"none", "sac", "full"})
    for (int zero : {0, 1})
      for (int64_t accumulation : {1, 2}) {
        SCOPED_TRACE(str(policy, " ZeRO-", zero, " accumulation ", accumulation));
        train::TrainConfig config;
        config.train_micro_batch_size_per_gpu = 1;
        config.gradient_accumulation_steps = accumulation;
        config.zero_stage = config.zero.stage = zero;
        config.compile.checkpoint = policy;
        train::resolve_batch(config, 1, "test");
        train::Trainer trainer(model, config, 1024, train::ModelState::initial(model, 1));
        EXPECT_EQ(trainer.earlier_graph().nodes().empty(), accumulation == 1);
        train::PlanSetup setup{.model = model, .zero = zero, .accumulation_steps = accumulation,
                               .threads = omp_get_max_threads()};
        const train::MemoryBreakdown b =
            train::plan_step(setup, {{parse_checkpoint_policy(policy, "test")}, {}}, 1024);
        EXPECT_EQ(b.total(), trainer.planned_peak_bytes() - trainer.program_bytes());
        EXPECT_EQ(b.arena, trainer.planned_arena_bytes());
        EXPECT_EQ(b.parameters + b.gradient_sum + b.optimizer_state + b.communication, trainer.model_state_bytes());
      }
}

// ZeRO-2 and ZeRO-3 in one process (their collectives run over one rank): the planner's
// model state and arena are the trainer's, and at 8 ranks with gradient accumulation ZeRO-3
// plans longer sequences than ZeRO-2 (parameters sharded), ZeRO-2 than ZeRO-1 (the gradient
// sum sharded), ZeRO-1 than ZeRO-0 (moments sharded). Without accumulation ZeRO-1 and ZeRO-2
// hold the same: both keep only the reduced shards the step outputs.
TEST(Plan, StagesTwoAndThreeAreWhatTheTrainerPlansAndGoFurther) {
  const models::LlamaConfig model = small_llama();
  train::TrainConfig config;
  config.train_micro_batch_size_per_gpu = 1;
  config.compile.checkpoint = "sac";
  config.zero_stage = config.zero.stage = 2;
  train::resolve_batch(config, 1, "test");
  train::Trainer trainer(model, config, 1024, train::ModelState::initial(model, 1));
  train::PlanSetup setup{.model = model, .zero = 2, .threads = omp_get_max_threads()};
  const train::MemoryStrategy sac{{CheckpointPolicy::sac}, {}};
  const train::MemoryBreakdown b = train::plan_step(setup, sac, 1024);
  EXPECT_EQ(b.total(), trainer.planned_peak_bytes() - trainer.program_bytes());
  EXPECT_EQ(b.arena, trainer.planned_arena_bytes());
  EXPECT_EQ(b.parameters + b.gradient_sum + b.optimizer_state + b.communication, trainer.model_state_bytes());

  // ZeRO-3 too: parameters sharded, each layer's gathered ones in the arena.
  config.zero_stage = config.zero.stage = 3;
  train::Trainer trainer3(model, config, 1024, train::ModelState::initial(model, 1));
  setup.zero = 3;
  const train::MemoryBreakdown b3 = train::plan_step(setup, sac, 1024);
  EXPECT_EQ(b3.total(), trainer3.planned_peak_bytes() - trainer3.program_bytes());
  EXPECT_EQ(b3.arena, trainer3.planned_arena_bytes());
  EXPECT_EQ(b3.parameters + b3.gradient_sum + b3.optimizer_state + b3.communication, trainer3.model_state_bytes());

  // Accumulating, stages 2 and 3 keep their shards of the gradient sum.
  for (int zero : {2, 3}) {
    SCOPED_TRACE(str("ZeRO-", zero, ", 2 micro batches a step"));
    config.zero_stage = config.zero.stage = zero;
    config.gradient_accumulation_steps = 2;
    config.train_batch_size.reset();
    train::resolve_batch(config, 1, "test");
    train::Trainer accumulating(model, config, 1024, train::ModelState::initial(model, 1));
    EXPECT_TRUE(accumulating.earlier_graph().nodes().empty()) << "stages 2 and 3 reduce every micro batch";
    train::PlanSetup s{.model = model, .zero = zero, .accumulation_steps = 2, .threads = omp_get_max_threads()};
    const train::MemoryBreakdown a = train::plan_step(s, sac, 1024);
    EXPECT_EQ(a.total(), accumulating.planned_peak_bytes() - accumulating.program_bytes());
    EXPECT_EQ(a.parameters + a.gradient_sum + a.optimizer_state + a.communication, accumulating.model_state_bytes());
    EXPECT_GT(a.gradient_sum, 0);
  }

  int64_t longest[2][4];
  for (int64_t accumulation : {1, 2})
    for (int zero : {0, 1, 2, 3}) {
      // 6 MiB beside the 1 GiB GPU reserve: ZeRO-0's 3.4 MB of model state is a good part of it.
      train::PlanSetup s{.model = model, .world = 8, .sp = 4, .zero = zero, .dtype = DType::bf16,
                         .accumulation_steps = accumulation};
      longest[accumulation - 1][zero] =
          train::longest_sequence(s, sac, (int64_t(1024) << 20) + (int64_t(6) << 20), 64).max_seq_len;
    }
  const int64_t* acc = longest[1];
  EXPECT_GT(acc[1], acc[0]);
  EXPECT_GT(acc[2], acc[1]);
  EXPECT_GT(acc[3], acc[2]);
  EXPECT_EQ(longest[0][2], longest[0][1]);
  EXPECT_GT(longest[0][3], longest[0][2]);
  for (int zero : {0, 1, 2, 3}) EXPECT_GE(longest[0][zero], acc[zero]) << "ZeRO-" << zero;
  std::printf("small llama, 8 ranks, SP 4, sac, 1030 MiB: longest S ZeRO-0 %lld, ZeRO-1 %lld, ZeRO-2 %lld, "
              "ZeRO-3 %lld (2 micro batches a step: %lld, %lld, %lld, %lld)\n", (long long)longest[0][0],
              (long long)longest[0][1], (long long)longest[0][2], (long long)longest[0][3], (long long)acc[0],
              (long long)acc[1], (long long)acc[2], (long long)acc[3]);
}

// The arena's parts are the buffers live at its peak, classified by the nodes that made
// them: they sum to the arena, gradient buckets are among them at every stage (grad_sync
// makes buckets at every stage), and ZeRO-3's gathered layers only under ZeRO-3.
TEST(Plan, TheArenaIsBrokenDownIntoWhatItHolds) {
  const models::LlamaConfig model = small_llama();
  const int64_t N = models::llama_num_parameters(model);
  for (int zero : {0, 3})
    for (CheckpointPolicy policy : {CheckpointPolicy::none, CheckpointPolicy::full})
      for (int64_t accumulation : {1, 2}) {
        const train::MemoryStrategy strategy{{policy}, {}};
        SCOPED_TRACE(str("ZeRO-", zero, " ", strategy_name(strategy), " accumulation ", accumulation));
        train::PlanSetup setup{.model = model, .world = 4, .sp = 2, .zero = zero, .dtype = DType::bf16,
                               .accumulation_steps = accumulation};
        const train::MemoryBreakdown b = train::plan_step(setup, strategy, 1024);
        const train::ArenaParts& a = b.arena_parts;
        EXPECT_EQ(a.total(), b.arena);
        EXPECT_GE(a.fragmentation, 0);
        EXPECT_GT(a.activations, 0);
        // The peak is in the backward, after the head's gradient (the first one final; under
        // ZeRO-0 all-reduced whole into a step output, from ZeRO-1 on reduce-scattered).
        EXPECT_GT(a.gradient_buckets, 0);
        if (zero == 0) {
          EXPECT_GE(a.gradient_buckets, 2 * model.vocab_size * model.hidden_size);
        }
        // At most every bf16 gradient twice (at a bucket's concat its gradients and the bucket
        // are both live), and the alignment of the few buffers.
        EXPECT_LE(a.gradient_buckets, 2 * 2 * N + 64 * 64);
        if (zero == 3) EXPECT_GT(a.gathered_parameters, 0);
        else EXPECT_EQ(a.gathered_parameters, 0);
      }
}

// The searches of `autosp plan` share a PlanCache: a tiled strategy whose tiles change
// nothing at S takes the untiled plan. Every result is what planning each S afresh gives,
// at tile sizes that tile the longer S searched (8192 rows, from the budget) and none (2^20 rows).
// f32 for the CPU backend: its plans' peak is in the tiled MLP and loss at these S (the cuda
// kernels' plans peak where tiles change nothing).
TEST(Plan, PlansFromTheCacheAreThePlansMadeAfresh) {
  train::PlanSetup setup{.model = small_llama(), .world = 2, .sp = 2, .zero = 1, .dtype = DType::f32};
  const int64_t device = int64_t(100) << 20;
  train::PlanCache cache;
  for (CheckpointPolicy policy : {CheckpointPolicy::sac, CheckpointPolicy::full}) {
    const train::StrategyResult untiled = train::longest_sequence(setup, {{policy}, {}}, device, 512);
    for (TileOptions tiles : {TileOptions{}, TileOptions{.tile_rows = 8192}, TileOptions{.budget_bytes = device / 8},
                              TileOptions{.tile_rows = 1 << 20}}) {
      const train::MemoryStrategy strategy{{policy}, tiles};
      SCOPED_TRACE(train::strategy_name(strategy));
      const train::StrategyResult cached = train::longest_sequence(setup, strategy, device, 512, &cache);
      const train::StrategyResult fresh = train::longest_sequence(setup, strategy, device, 512);
      ASSERT_GT(fresh.max_seq_len, 0);
      // The cases cover both: plans that tiles change (8192 rows, the budget) and that they do not.
      if (tiles.tile_rows == 8192 || tiles.budget_bytes > 0) EXPECT_NE(fresh.samples, untiled.samples);
      else EXPECT_EQ(fresh.samples, untiled.samples);
      EXPECT_EQ(cached.max_seq_len, fresh.max_seq_len);
      EXPECT_EQ(cached.peak_bytes, fresh.peak_bytes);
      EXPECT_EQ(cached.samples, fresh.samples);
      const train::MemoryBreakdown a = cache.plan(setup, strategy, fresh.max_seq_len);
      const train::MemoryBreakdown b = train::plan_step(setup, strategy, fresh.max_seq_len);
      EXPECT_EQ(a.total(), b.total());
      EXPECT_EQ(a.arena_parts.activations, b.arena_parts.activations);
      EXPECT_EQ(a.arena_parts.peak_node, b.arena_parts.peak_node);
    }
  }
}

// Llama-3.1-8B at S = 1K on one rank (the case): the arena is the bf16 gradients and
// their buckets (8.03B x 2 bytes = 14.96 GiB of the 15.06 GiB), not activations.
TEST(Plan, TheEightBillionArenaAtOneKIsItsGradientBuckets) {
  const models::LlamaConfig model =
      models::load_llama_config(str(AUTOSP_SOURCE_DIR, "/fuzz/corpus/model_config/llama-3.1-8b.json"));
  const int64_t N = models::llama_num_parameters(model);
  train::PlanSetup setup{.model = model, .dtype = DType::bf16};
  const train::MemoryBreakdown b = train::plan_step(setup, {{CheckpointPolicy::none}, {}}, 1024);
  const train::ArenaParts& a = b.arena_parts;
  EXPECT_EQ(a.total(), b.arena);
  EXPECT_GE(a.gradient_buckets, 2 * N);
  EXPECT_LT(a.activations, b.arena / 50) << a.activations;
  std::printf("Llama-3.1-8B, S = 1024, one rank, bf16: arena %lld = gradient buckets %lld + activations %lld + "
              "activation gradients %lld + workspaces %lld + fragmentation %lld\n",
              (long long)b.arena, (long long)a.gradient_buckets, (long long)a.activations,
              (long long)a.activation_gradients, (long long)a.workspaces, (long long)a.fragmentation);
}

TEST(Plan, TheCliOrdersStrategiesAsTheirMemory) {
  testing::TempDir dir("plan");
  std::ofstream(dir / "config.json") << models::llama_config_json(small_llama()).dump(2);
  const auto r = run_command(str(AUTOSP_BINARY, " plan --model ", dir / "config.json",
                                 " --world 4 --sp 2 --zero 1 --device-memory 1280MiB --dtype bf16 --json --plot ",
                                 dir / "plan.svg"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output);
  std::map<std::string, int64_t> longest;  // "sp/checkpoint/tiled"
  for (const json& s : j["strategies"]) {
    for (const char* key : {"name", "sp", "zero", "checkpoint", "tiled", "max_seq_len", "peak_bytes"})
      EXPECT_TRUE(s.contains(key)) << key;
    EXPECT_LE(s["peak_bytes"].get<int64_t>(), int64_t(1280) << 20);
    longest[str(s["sp"], "/", s["checkpoint"].get<std::string>(), "/", s["tiled"])] = s["max_seq_len"];
  }
  EXPECT_EQ(j["strategies"].size(), 16u);  // {no SP, SP} x {none, sac, full, auto} x {tiled, not}
  for (const char* tiled : {"false", "true"})
    for (int sp : {1, 2}) {
      SCOPED_TRACE(str("sp ", sp, " tiled ", tiled));
      EXPECT_LE(longest[str(sp, "/none/", tiled)], longest[str(sp, "/sac/", tiled)]);
      EXPECT_LT(longest[str(sp, "/sac/", tiled)], longest[str(sp, "/full/", tiled)]);
      EXPECT_EQ(longest[str(sp, "/auto/", tiled)], longest[str(sp, "/full/", tiled)]);
    }
  EXPECT_GT(longest["2/full/false"], longest["1/full/false"]);  // SP 2 holds half of each sequence
  const json& b = j["breakdown"];
  EXPECT_EQ(b["total"].get<int64_t>(), b["parameters"].get<int64_t>() + b["gradient_sum"].get<int64_t>() +
                                           b["optimizer_state"].get<int64_t>() + b["arena"].get<int64_t>() +
                                           b["communication"].get<int64_t>() + b["runtime_reserve"].get<int64_t>());
  int64_t parts = 0;
  for (const char* key : {"gradient_buckets", "gathered_parameters", "activations", "activation_gradients",
                          "workspaces", "fragmentation"})
    parts += b["arena_parts"][key].get<int64_t>();
  EXPECT_EQ(parts, b["arena"].get<int64_t>());
  EXPECT_GT(b["arena_parts"]["gradient_buckets"].get<int64_t>(), 0);
  std::ifstream svg(dir / "plan.svg");
  const std::string text((std::istreambuf_iterator<char>(svg)), {});
  check_plot(text, 16);

  // At SP 1 the strategies are the 6 without SP and auto with and without tiles, once each.
  const auto one = run_command(str(AUTOSP_BINARY, " plan --model ", dir / "config.json",
                                   " --device-memory 1280MiB --json"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  std::set<std::string> kinds;
  const json at_one = json::parse(one.output);
  for (const json& s : at_one["strategies"])
    EXPECT_TRUE(kinds.insert(str(s["checkpoint"].get<std::string>(), "/", s["tiled"])).second) << s.dump();
  EXPECT_EQ(kinds.size(), 8u);
  EXPECT_TRUE(kinds.count("auto/true") && kinds.count("auto/false"));

  const auto bad = run_command(str(AUTOSP_BINARY, " plan --model ", dir / "config.json", " --device-memory '80 parsecs'"));
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("--device-memory 80 parsecs: unknown unit"), std::string::npos) << bad.output;
}

// `autosp plan --backend cuda` plans the arena the cuda executor allocates, on a machine
// without a GPU: the step the trainer compiles for --backend cuda (its options from the
// config, train/step_options.h; lowered for cuda, so its plan holds the CUDA kernels'
// workspaces), made executable as the cuda executor makes it, has the planner's arena. Where
// the peak holds a kernel's scratch the CPU kernels' plan differs (measured: 2 of these 18
// steps at S 2048), so a planner that sized scratch with the CPU's kernels (as
// `autosp plan` did before the lower pass) fails here.
TEST(Plan, TheCudaPlanIsTheArenaTheCudaExecutorAllocates) {
  const models::LlamaConfig model = small_llama();
  const int64_t S = 2048;
  int differs_from_cpu = 0, cases = 0;
  for (int zero : {0, 1, 3})
    for (const char* policy : {"none", "sac", "full"})
      for (int64_t accumulation : {1, 2}) {
        SCOPED_TRACE(str("ZeRO-", zero, " ", policy, " accumulation ", accumulation));
        const int64_t W = 2;
        train::TrainConfig config;  // what `autosp train --backend cuda` runs at SP 2 on 2 ranks
        config.sequence_parallel_size = 2;
        config.compile = {.deepcompile = true, .passes = {"autosp"}, .checkpoint = policy};
        config.zero_stage = config.zero.stage = zero;
        config.train_micro_batch_size_per_gpu = 1;
        config.gradient_accumulation_steps = accumulation;
        config.backend = "cuda";
        train::resolve_batch(config, 1, "test");
        const train::MemoryStrategy strategy = train::strategy_candidates(config.compile, 0).front();
        // As Trainer compiles its step, and the cuda executor plans the graphs it is given.
        const CompiledStep step =
            compile_step(models::llama_forward(model, {.batch = 1, .seq_len = S}),
                         train::step_compile_options(config, W, omp_get_max_threads(), strategy), accumulation);
        const int64_t executor_arena =
            std::max(cuda_arena_bytes(step.last), step.has_earlier() ? cuda_arena_bytes(step.earlier) : 0);

        train::PlanSetup setup{.model = model, .world = W, .sp = 2, .zero = zero, .dtype = DType::f32,
                               .accumulation_steps = accumulation, .threads = omp_get_max_threads(),
                               .backend = Backend::cuda};
        EXPECT_EQ(train::plan_step(setup, strategy, S).arena, executor_arena);
        setup.backend = Backend::cpu;
        differs_from_cpu += train::plan_step(setup, strategy, S).arena != executor_arena;
        ++cases;
      }
  EXPECT_GT(differs_from_cpu, 0) << "of " << cases;
}

}  // namespace
}  // namespace autosp
