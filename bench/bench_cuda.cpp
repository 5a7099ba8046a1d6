// bench_cuda: autosp's bf16 training step on one GPU, as `autosp train --backend cuda` runs it
// with bf16 enabled (train::Trainer's device-resident step, train/device_step.h), for the GPU
// check (scripts/gpu_check.sh), against PyTorch on the same GPU (bench/bench_cuda_torch.py).
//
//   bench_cuda --model DIR --seq-len S [--batch B] [--steps N] [--checkpoint none|full|sac]
//              [--max-seq [--max-seq-limit S] [--time-box SECONDS]] [--plan-only] [--out FILE.json]
//
// The model: DIR/config.json, weights from autosp's seeded init (seed 42, the distribution
// bench_cuda_torch.py draws from too). The data: uniformly random token ids (seed 1), each
// sample's labels its next tokens. AdamW lr 1e-4, betas (0.9, 0.95), weight decay 0.1,
// clipping at 1.0. Step time is the median of the steps after the first (which pays one-time
// costs: cuBLAS's and cuDNN's first calls, the allocator's first touch); each step ends with
// the trainer's one synchronisation.
//
// Memory: what autosp allocates on the device (the trainer's plan: model state at 18 bytes a
// parameter, the step's arena, the batch's two device slots), and what the device reports used
// beyond what it used before (cudaMemGetInfo, which adds the CUDA context and cuBLAS's
// workspace). The torch side reports torch.cuda.max_memory_allocated: compare the first.
//
// --plan-only: compile and plan, print the planned device bytes (no device needed).
// --max-seq: for the checkpoint policy given, S doubling from --seq-len up to --max-seq-limit
// (262144 by default): at each S the trainer is built (planned and allocated) and ONE step
// runs; the longest S whose step ran is the answer, with the plan and the device memory used
// beside it. Stops at the first S that does not plan, allocate or run, or when the next S
// (attention's work grows as S^2: 4x the last step's time) would pass the time box.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "models/llama.h"
#include "ops/cuda_kernels.h"
#include "runtime/cuda_executor.h"
#include "runtime/profile.h"
#include "train/config.h"
#include "train/data.h"
#include "train/trainer.h"
#include "util/error.h"

namespace autosp {
namespace {

// Uniformly random token ids, the same for every run: sample k is its own stream of S + 1.
class RandomTokens final : public train::DataSource {
 public:
  explicit RandomTokens(int64_t vocab) : vocab_(vocab) {}
  void read_sample(int64_t sample, int64_t S, int32_t* inputs, int32_t* labels) const override {
    std::mt19937_64 rng(uint64_t(sample) * 0x9E3779B97F4A7C15ull + 1);
    int32_t next = int32_t(rng() % uint64_t(vocab_));
    for (int64_t i = 0; i < S; ++i) {
      inputs[i] = next;
      next = int32_t(rng() % uint64_t(vocab_));
      labels[i] = next;
    }
  }
  std::string describe(int64_t S) const override { return str("random tokens, samples of ", S); }

 private:
  int64_t vocab_;
};

train::TrainConfig bench_config(int64_t B, const std::string& policy) {
  train::TrainConfig config;
  config.train_micro_batch_size_per_gpu = B;
  config.gradient_accumulation_steps = 1;
  config.gradient_clipping = 1.0;
  config.optimizer = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  config.compile.checkpoint = policy;
  config.requested_precision = "bf16";
  config.precision_key = "bf16.enabled";
  config.backend = "cuda";
  train::resolve_batch(config, 1, "bench_cuda");
  return config;
}

// Model FLOPs of one step, counted the same way for autosp and torch (no recomputation):
// 6 per parameter per token for the matmuls (the embedding gather excluded, the tied LM
// head included), and causal attention's QK^T and PV, 2 x 2 S^2 D per head forward (half
// of it masked), three times that with the backward.
double model_flops(const models::LlamaConfig& m, int64_t B, int64_t S) {
  const double T = double(B) * double(S);
  const double VH = double(m.vocab_size) * double(m.hidden_size);
  const double matmul_params =
      double(models::llama_num_parameters(m)) - VH + (m.tie_word_embeddings ? VH : 0.0);  // + a tied LM head
  const double D = double(m.head_dim > 0 ? m.head_dim : m.hidden_size / m.num_attention_heads);
  const double attn_fwd = 2.0 * 2.0 * double(B) * double(S) * double(S) * D * double(m.num_attention_heads) *
                          double(m.num_hidden_layers) * 0.5;
  return 6.0 * matmul_params * T + 3.0 * attn_fwd;
}

int64_t device_used() {
  size_t free = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo", "bench_cuda");
  return int64_t(total) - int64_t(free);
}

double gib(int64_t bytes) { return double(bytes) / double(1 << 30); }

// The per-op profile's rows (AUTOSP_PROFILE=1), for the JSON.
nlohmann::json profile_rows() {
  nlohmann::json rows = nlohmann::json::array();
  for (const ProfileRow& r : global_profile().rows())
    rows.push_back({{"phase", phase_name(r.phase)}, {"op", r.op}, {"kernel", r.kernel}, {"calls", r.calls},
                    {"seconds", r.seconds}, {"flops", r.flops}});
  return rows;
}

int run(int argc, char** argv) {
  std::string model_dir, out_path, policy = "none";
  int64_t S = 4096, B = 1, steps = 5, max_seq_limit = 262144;
  double peak_tflops = 989.0;  // H200 SXM dense bf16
  double time_box = 240;
  bool max_seq = false, plan_only = false;
  CLI::App app{"autosp's bf16 training step on one GPU"};
  app.add_option("--model", model_dir, "Model directory (config.json)")->required();
  app.add_option("--seq-len", S, "Sequence length");
  app.add_option("--batch", B, "Micro batch");
  app.add_option("--steps", steps, "Timed steps (after one warm-up)");
  app.add_option("--checkpoint", policy, "none | full | sac");
  app.add_option("--peak-tflops", peak_tflops, "The GPU's dense bf16 peak, for MFU");
  app.add_flag("--max-seq", max_seq, "The longest S whose step runs, doubling from --seq-len");
  app.add_option("--max-seq-limit", max_seq_limit, "--max-seq: the largest S tried");
  app.add_option("--time-box", time_box, "--max-seq: seconds for the whole search");
  app.add_option("--out", out_path, "Write the result as JSON here");
  app.add_flag("--plan-only", plan_only, "Compile and plan the step's device memory; no device needed");
  CLI11_PARSE(app, argc, argv);
  const models::LlamaConfig model = models::load_llama_config(model_dir + "/config.json");
  nlohmann::json result = {{"model", model_dir}, {"parameters", models::llama_num_parameters(model)},
                           {"checkpoint", policy}, {"batch", B}};
  const RandomTokens data(model.vocab_size);

  if (plan_only) {
    // The trainer plans before it touches the device: its planned peak is in the error a
    // budget of 1 byte makes it give.
    train::TrainConfig config = bench_config(B, policy);
    config.compile.memory_budget_gb = 1.0 / double(1 << 30);
    try {
      train::Trainer trainer(model, config, S, train::ModelState::initial(model, 42));
    } catch (const UserError& e) {
      std::printf("S %lld, %s: %s\n", (long long)S, policy.c_str(), e.what());
      return 0;
    }
    user_error("bench_cuda --plan-only: a budget of 1 byte was met");
  }
  std::string why;
  if (cuda_device_count(&why) == 0) user_error("bench_cuda: no CUDA device (", why, ")");
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties", "bench_cuda");
  result["gpu"] = prop.name;
  check_cuda(cudaFree(nullptr), "cudaFree (creating the context)", "bench_cuda");
  const int64_t used0 = device_used();  // the context alone

  if (max_seq) {
    nlohmann::json tried = nlohmann::json::array();
    int64_t best = 0;
    nlohmann::json best_entry;
    double last_step = 0;
    const auto begin = std::chrono::steady_clock::now();
    for (int64_t s = S; s <= max_seq_limit; s *= 2) {
      const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
      if (last_step > 0 && spent + 4.5 * last_step > time_box) {
        tried.push_back({{"seq_len", s}, {"skipped", str("the time box: ", spent, " s spent, the last step took ",
                                                          last_step, " s and this one would take about 4x")}});
        break;
      }
      nlohmann::json entry = {{"seq_len", s}};
      bool ran = false;
      try {
        train::Trainer trainer(model, bench_config(B, policy), s, train::ModelState::initial(model, 42));
        entry["planned_bytes"] = trainer.planned_peak_bytes();
        const train::StepStats st = trainer.train_step(data);
        entry["step_seconds"] = st.seconds;
        entry["loss"] = st.loss;
        entry["device_used_bytes"] = device_used() - used0;
        entry["used_over_planned"] = double(device_used() - used0) / double(trainer.planned_peak_bytes());
        last_step = st.seconds;
        ran = std::isfinite(st.loss);
      } catch (const std::exception& e) {  // a plan over the device's memory, an allocation or a step that failed
        entry["error"] = e.what();
        cudaGetLastError();
      }
      std::printf("max-seq %s: S %lld: %s\n", policy.c_str(), (long long)s, entry.dump().c_str());
      std::fflush(stdout);
      tried.push_back(entry);
      if (!ran) break;
      best = s;
      best_entry = entry;
    }
    result["max_seq"] = {{"seq_len", best}, {"at_longest", best_entry}, {"tried", tried}, {"step_run", true},
                         {"limit", max_seq_limit}};
  } else {
    train::Trainer trainer(model, bench_config(B, policy), S, train::ModelState::initial(model, 42));
    std::vector<double> times, losses;
    for (int64_t step = 0; step <= steps; ++step) {
      const train::StepStats st = trainer.train_step(data);
      std::printf("step %lld: %.3f s, loss %.4f, grad norm %.4f\n", (long long)step, st.seconds, st.loss,
                  st.grad_norm);
      std::fflush(stdout);
      losses.push_back(st.loss);
      if (step > 0) times.push_back(st.seconds);
      if (step == 0) global_profile().reset();  // AUTOSP_PROFILE=1: the timed steps only
    }
    std::sort(times.begin(), times.end());
    const double median = times.empty() ? 0 : times[times.size() / 2];
    const double flops = model_flops(model, B, S);
    result["seq_len"] = S;
    result["step_seconds"] = median;
    result["losses"] = losses;
    result["allocated_bytes"] = trainer.planned_peak_bytes();
    result["model_state_bytes"] = trainer.model_state_bytes();
    result["arena_bytes"] = trainer.planned_arena_bytes();
    result["device_used_bytes"] = device_used() - used0;
    result["model_flops"] = flops;
    result["mfu"] = median > 0 ? flops / median / (peak_tflops * 1e12) : 0;
    result["peak_tflops"] = peak_tflops;
    if (profile_enabled()) {
      std::printf("%s", global_profile().report(str("bench_cuda S ", S, " ", policy)).c_str());
      result["profile"] = profile_rows();
    }
    std::printf("autosp cuda: S %lld, %s: %.3f s/step, MFU %.1f%%, planned %.2f GiB, device used %.2f GiB\n",
                (long long)S, policy.c_str(), median, 100 * double(result["mfu"]),
                gib(trainer.planned_peak_bytes()), gib(result["device_used_bytes"].get<int64_t>()));
  }
  if (!out_path.empty()) std::ofstream(out_path) << result.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace autosp

int main(int argc, char** argv) {
  try {
    return autosp::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    return 1;
  }
}
