// ZeRO-1, 2 and 3 exist to save memory. Under mpirun the per-rank model state (parameters,
// gradients kept beside the compiled step, AdamW moments and the optimizer's scratch: the
// CLI's model_state_bytes_per_rank metric) must be what each stage promises, below ZeRO-0's
// where there is something to shard, and as one process (nothing to shard) the same; every
// run trains the same numbers. With gradient accumulation, ZeRO 0 and 1 keep the whole sum
// of a step's earlier micro batches; without it no gradient outlives the step's program
// (the reduced buckets are its outputs, in its arena).
//
// The model is a seeded random init of a tiny Llama (no weights file), so the test needs
// neither torch nor the reference generator and runs in a few seconds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "testing/process.h"
#include "util/error.h"

namespace autosp {
namespace {

using nlohmann::json;
using testing::run_command;
using testing::TempDir;

constexpr int kSeqLen = 16;
constexpr int kSteps = 3;
constexpr int kVocab = 67;
const char* kMpiEnv = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 ";

void write_model_and_data(const TempDir& dir) {
  const json model = {{"architectures", {"LlamaForCausalLM"}},
                      {"model_type", "llama"},
                      {"vocab_size", kVocab},
                      {"hidden_size", 32},
                      {"intermediate_size", 48},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"head_dim", 8},
                      {"rms_norm_eps", 1e-5},
                      {"rope_theta", 10000.0},
                      {"tie_word_embeddings", false},
                      {"max_position_embeddings", 64}};
  std::ofstream(dir / "config.json") << model.dump(2);
  // Enough tokens for every sample of kSteps global batches of 4.
  std::mt19937 rng(7);
  std::vector<uint32_t> tokens(kSteps * 4 * kSeqLen + 1);
  for (uint32_t& t : tokens) t = rng() % kVocab;
  std::ofstream(dir / "tokens.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 4));
}

// Parameters of the model above: embedding and head 67 x 32, final norm 32, and per layer
// q, o 32 x 32, k, v 16 x 32, three 32 x 48 MLP projections, two norms of 32.
constexpr double kParams = 2 * kVocab * 32 + 32 + 2 * (2 * 32 * 32 + 2 * 16 * 32 + 3 * 32 * 48 + 2 * 32);

// The global batch is 4 in every run: micro (4 / dp / accumulation) x accumulation x dp.
std::string write_config(const TempDir& dir, int dp, int zero, int accumulation = 2) {
  const json c = {{"train_micro_batch_size_per_gpu", 4 / dp / accumulation},
                  {"gradient_accumulation_steps", accumulation},
                  {"train_batch_size", 4},
                  {"gradient_clipping", 1.0},
                  {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}, {"weight_decay", 0.1}}}}},
                  {"zero_optimization", {{"stage", zero}}}};
  const std::string path = dir / str("dp", dp, "_zero", zero, "_acc", accumulation, ".json");
  std::ofstream(path) << c.dump(2);
  return path;
}

struct TrainRun {
  std::vector<double> loss;
  std::vector<std::vector<int64_t>> model_state;  // [step][rank]
};

TrainRun train(const TempDir& dir, int dp, int zero, int accumulation = 2) {
  const std::string metrics = dir / str("m_dp", dp, "_zero", zero, "_acc", accumulation, ".jsonl");
  std::string cmd = str(AUTOSP_BINARY, " train --config ", write_config(dir, dp, zero, accumulation), " --model ",
                        dir.path(),
                        " --data ", dir / "tokens.bin", " --seq-len ", kSeqLen, " --steps ", kSteps, " --metrics ",
                        metrics);
  if (dp > 1) cmd = str(kMpiEnv, "timeout 300 ", AUTOSP_MPIEXEC, " -np ", dp, " --oversubscribe ", cmd);
  const auto r = run_command(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  TrainRun run;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const json m = json::parse(line);
    run.loss.push_back(m["loss"].get<double>());
    run.model_state.push_back(m["model_state_bytes_per_rank"].get<std::vector<int64_t>>());
  }
  EXPECT_EQ(run.loss.size(), size_t(kSteps)) << cmd << "\n" << r.output;
  return run;
}

TEST(ZeroMemory, StageOneHoldsLessPerRankAndTrainsTheSameNumbers) {
  TempDir dir("zero_memory");
  write_model_and_data(dir);
  const TrainRun z0_dp1 = train(dir, 1, 0), z1_dp1 = train(dir, 1, 1), z0_dp2 = train(dir, 2, 0), z1_dp2 = train(dir, 2, 1);
  ASSERT_FALSE(HasFailure());

  for (int t = 0; t < kSteps; ++t) {
    // One process: ZeRO-1 has nothing to shard and must cost exactly what ZeRO-0 does.
    ASSERT_EQ(z0_dp1.model_state[t].size(), 1u);
    ASSERT_EQ(z1_dp1.model_state[t].size(), 1u);
    EXPECT_EQ(z1_dp1.model_state[t][0], z0_dp1.model_state[t][0]) << "step " << t + 1;
    ASSERT_EQ(z0_dp2.model_state[t].size(), 2u);
    ASSERT_EQ(z1_dp2.model_state[t].size(), 2u);
    // Parameters, the gradient sum of the step's first micro batch, two moments.
    EXPECT_EQ(double(z0_dp1.model_state[t][0]), 16 * kParams) << "step " << t + 1;
    for (int r = 0; r < 2; ++r) {
      const int64_t z0 = z0_dp2.model_state[t][r], z1 = z1_dp2.model_state[t][r];
      // Data parallelism alone does not shard ZeRO-0's state.
      EXPECT_EQ(z0, z0_dp1.model_state[t][0]) << "step " << t + 1 << " rank " << r;
      EXPECT_LT(z1, z0) << "step " << t + 1 << " rank " << r;
      // With N parameters ZeRO-0 holds 16 N bytes (parameters, gradient sum, two moments);
      // ZeRO-1 over 2 ranks holds 8 N + 8 ceil(N / 2) (one bucket at the default
      // reduce_bucket_size) + at most (N + 1) / 8 scratch floats (grad_sync.h), so at most
      // 12.5 N + 4.5 bytes. Full-size scratch would break this.
      EXPECT_LE(double(z1), double(z0) * 12.5 / 16 + 4.5) << "step " << t + 1 << " rank " << r;
    }
    // The same global batch in every run, so the same loss up to fp32 reordering (the
    // tolerance of tests/sp/sequence_parallel_test.cpp, where observed <= 2e-7).
    const double a = z0_dp1.loss[t];
    EXPECT_NEAR(z1_dp1.loss[t], a, 2e-6 * std::abs(a)) << "step " << t + 1;
    EXPECT_NEAR(z0_dp2.loss[t], a, 2e-6 * std::abs(a)) << "step " << t + 1;
    EXPECT_NEAR(z1_dp2.loss[t], a, 2e-6 * std::abs(a)) << "step " << t + 1;
  }
  std::printf("model_state_bytes per rank: DP 1 ZeRO-0 %lld, ZeRO-1 %lld; DP 2 ZeRO-0 %lld, ZeRO-1 %lld\n",
              (long long)z0_dp1.model_state[0][0], (long long)z1_dp1.model_state[0][0],
              (long long)z0_dp2.model_state[0][0], (long long)z1_dp2.model_state[0][0]);
}

// Without gradient accumulation nothing of the gradients is kept beside the step: ZeRO-0
// holds its parameters and moments (12 N), ZeRO-1 over 2 ranks its parameters and its shard
// of the moments (8 ceil(N / 2)) and the all-gather's scratch; the reduced gradients are the
// step's outputs, planned in its arena.
TEST(ZeroMemory, WithoutAccumulationNoGradientOutlivesTheStep) {
  TempDir dir("zero_memory_acc1");
  write_model_and_data(dir);
  const TrainRun z0 = train(dir, 2, 0, 1), z1 = train(dir, 2, 1, 1), with = train(dir, 2, 0, 2);
  ASSERT_FALSE(HasFailure());
  for (int t = 0; t < kSteps; ++t)
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(double(z0.model_state[t][r]), 12 * kParams) << "step " << t + 1 << " rank " << r;
      EXPECT_EQ(double(with.model_state[t][r]), 16 * kParams) << "step " << t + 1 << " rank " << r;
      EXPECT_LE(double(z1.model_state[t][r]), 4 * kParams + 8 * std::ceil(kParams / 2) + 4 * (kParams + 1) / 8)
          << "step " << t + 1 << " rank " << r;
    }
  // One micro batch of 2 or two of 1: the same global batch, the same numbers.
  for (int t = 0; t < kSteps; ++t) {
    EXPECT_NEAR(z1.loss[t], z0.loss[t], 2e-6 * std::abs(z0.loss[t])) << "step " << t + 1;
    EXPECT_NEAR(with.loss[t], z0.loss[t], 2e-6 * std::abs(z0.loss[t])) << "step " << t + 1;
  }
  std::printf("model_state_bytes per rank, DP 2, N = %.0f: ZeRO-0 %lld (2 micro batches: %lld), ZeRO-1 %lld\n",
              kParams, (long long)z0.model_state[0][0], (long long)with.model_state[0][0],
              (long long)z1.model_state[0][0]);
}

// W = 4 ranks (SP 2 x DP 2, the autosp pass), global batch 4 (micro 1, 2 accumulated):
// per-rank model state under stages 0 to 3, and the same loss curve under each.
TrainRun train_w4(const TempDir& dir, int zero) {
  const json c = {{"train_micro_batch_size_per_gpu", 1},
                  {"gradient_accumulation_steps", 2},
                  {"train_batch_size", 4},
                  {"gradient_clipping", 1.0},
                  {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}, {"weight_decay", 0.1}}}}},
                  {"sequence_parallel_size", 2},
                  {"compile", {{"deepcompile", true}, {"passes", {"autosp"}}}},
                  {"zero_optimization", {{"stage", zero}}}};
  const std::string config = dir / str("w4_zero", zero, ".json"), metrics = dir / str("m_w4_zero", zero, ".jsonl");
  std::ofstream(config) << c.dump(2);
  const std::string cmd = str(kMpiEnv, "timeout 300 ", AUTOSP_MPIEXEC, " -np 4 --oversubscribe ", AUTOSP_BINARY,
                              " train --config ", config, " --model ", dir.path(), " --data ", dir / "tokens.bin",
                              " --seq-len ", kSeqLen, " --steps ", kSteps, " --metrics ", metrics);
  const auto r = run_command(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  TrainRun run;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const json m = json::parse(line);
    run.loss.push_back(m["loss"].get<double>());
    run.model_state.push_back(m["model_state_bytes_per_rank"].get<std::vector<int64_t>>());
  }
  EXPECT_EQ(run.loss.size(), size_t(kSteps)) << cmd << "\n" << r.output;
  return run;
}

TEST(ZeroMemory, StagesTwoAndThreeAtFourRanksHoldAFractionOfStageZero) {
  TempDir dir("zero_memory_w4");
  write_model_and_data(dir);
  const TrainRun z0 = train_w4(dir, 0), z1 = train_w4(dir, 1), z2 = train_w4(dir, 2), z3 = train_w4(dir, 3);
  ASSERT_FALSE(HasFailure());
  for (int t = 0; t < kSteps; ++t) {
    ASSERT_EQ(z2.model_state[t].size(), 4u);
    for (int r = 0; r < 4; ++r) {
      // ZeRO-0 holds 16 N bytes: parameters, gradient sum and two moments, all full.
      const int64_t b0 = z0.model_state[t][r], b1 = z1.model_state[t][r], b2 = z2.model_state[t][r];
      const double N = kParams;
      EXPECT_EQ(double(b0), 16 * N) << "step " << t + 1 << " rank " << r;
      // ZeRO-1: 8 N (parameters, gradient sum) + 8 ceil(N / 4) + at most (N + 4) / 8 scratch
      // floats (grad_sync.h): <= 10.5 N + 16 bytes.
      EXPECT_LE(double(b1), 10.5 * N + 16) << "step " << t + 1 << " rank " << r;
      // ZeRO-2: 4 N parameters + 12 bytes per element of this rank's shard of each bucket
      // (ceil(n / 4); one bucket at the default reduce_bucket_size) + at most (N + 4) / 8
      // all-gather scratch floats: <= 7.5 N + 28 bytes, 0.47 of ZeRO-0. A full-size
      // gradient kept between micro batches (+4 N, as ZeRO-1 does) would break it.
      EXPECT_LE(double(b2), 7.5 * N + 28) << "step " << t + 1 << " rank " << r;
      EXPECT_LT(b2, b1) << "step " << t + 1 << " rank " << r;
      // ZeRO-3: 16 bytes per element of this rank's shard of each parameter group
      // (parameters, accumulated gradients, two moments; ceil(n / 4) of each of the 5
      // groups): <= 4 N + 16 x 5 bytes, the bound 0.3 x ZeRO-0 with room to spare.
      // (Each layer's gathered parameters live in the step's arena, not here: see
      // tests/passes/zero3_test.cpp.)
      const int64_t b3 = z3.model_state[t][r];
      EXPECT_LE(double(b3), 4 * N + 80) << "step " << t + 1 << " rank " << r;
      EXPECT_LE(double(b3), 0.3 * double(b0)) << "step " << t + 1 << " rank " << r;
    }
    // The same global batch: the same loss up to fp32 reordering (as above).
    EXPECT_NEAR(z1.loss[t], z0.loss[t], 2e-6 * std::abs(z0.loss[t])) << "step " << t + 1;
    EXPECT_NEAR(z2.loss[t], z0.loss[t], 2e-6 * std::abs(z0.loss[t])) << "step " << t + 1;
    EXPECT_NEAR(z3.loss[t], z0.loss[t], 2e-6 * std::abs(z0.loss[t])) << "step " << t + 1;
  }
  const double b0 = double(z0.model_state[0][0]);
  std::printf("model_state_bytes per rank at W=4 (SP 2 x DP 2), N = %.0f parameters: ZeRO-0 %lld, ZeRO-1 %lld "
              "(%.3fx), ZeRO-2 %lld (%.3fx), ZeRO-3 %lld (%.3fx)\n", b0 / 16, (long long)z0.model_state[0][0],
              (long long)z1.model_state[0][0], double(z1.model_state[0][0]) / b0, (long long)z2.model_state[0][0],
              double(z2.model_state[0][0]) / b0, (long long)z3.model_state[0][0], double(z3.model_state[0][0]) / b0);
}

}  // namespace
}  // namespace autosp
