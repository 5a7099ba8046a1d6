// bench_cuda: autosp's bf16 training step on one GPU, as `autosp train --backend cuda` runs it
// with bf16 enabled (train::Trainer's device-resident step, train/device_step.h), for the GPU
// check (scripts/gpu_check.sh), against PyTorch on the same GPU (bench/bench_cuda_torch.py).
//
//   bench_cuda --model DIR --seq-len S [--batch B] [--steps N] [--checkpoint none|full|sac]
//              [--max-seq [--max-seq-limit S] [--time-box SECONDS]] [--plan-only] [--profile]
//              [--kernels] [--out FILE.json]
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
// --profile (or AUTOSP_PROFILE=1): the per-op device time of the timed steps (CUDA events
// around each node, runtime/cuda_executor.h; the first step left out), printed as the table
// `autosp train` prints and written to the JSON ("profile": rows, "profile_table": the table).
// --kernels: first, the fused row kernels (kernels/cuda/fused.h) against the reference ones
// (kernels.h) at this model's shapes (T = B * S rows), bf16: the median device time of each
// over 20 launches, their ratio and the fused kernel's bandwidth ("kernels").
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "kernels/cpu/fused.h"
#include "kernels/cuda/fused.h"
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

// Device memory for --kernels, freed with the scope.
struct DeviceScratch {
  std::vector<void*> blocks;
  ~DeviceScratch() {
    for (void* p : blocks) cudaFree(p);
  }
  template <typename T>
  T* alloc(int64_t n, int64_t elem = int64_t(sizeof(T))) {
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, size_t(std::max<int64_t>(n * elem, 1))), "cudaMalloc",
               str("bench_cuda --kernels (", n * elem, " bytes)"));
    blocks.push_back(p);
    return static_cast<T*>(p);
  }
};

// Median device time (ms) of `launch` over `reps` launches on the default stream, after two
// warm-up launches, each timed by its own pair of events.
double median_ms(const std::function<void()>& launch, int reps = 20) {
  cudaEvent_t a, b;
  check_cuda(cudaEventCreate(&a), "cudaEventCreate", "--kernels");
  check_cuda(cudaEventCreate(&b), "cudaEventCreate", "--kernels");
  launch();
  launch();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    check_cuda(cudaEventRecord(a, nullptr), "cudaEventRecord", "--kernels");
    launch();
    check_cuda(cudaEventRecord(b, nullptr), "cudaEventRecord", "--kernels");
    check_cuda(cudaEventSynchronize(b), "cudaEventSynchronize", "--kernels");
    check_cuda(cudaGetLastError(), "a kernel launch", "--kernels");
    float t = 0;
    check_cuda(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime", "--kernels");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The fused kernels against the reference ones, bf16, at the model's shapes: rms_norm over
// [T, H], rope over q [T, NH, D], swiglu over [T, I], the embedding's table [V, H]. min_bytes:
// what a kernel must move at least (its operands read once, its results written once).
nlohmann::json bench_kernels(const models::LlamaConfig& m, int64_t T) {
  using cuda::Dt;
  const int64_t H = m.hidden_size, I = m.intermediate_size, V = m.vocab_size, NH = m.num_attention_heads;
  const int64_t D = m.head_dim > 0 ? m.head_dim : H / NH;
  const int64_t big = std::max({T * std::max(H, NH * D), T * I, V * H});
  DeviceScratch mem;
  // Five bf16 buffers of `big` elements from a normal distribution (finite values keep expf
  // and the sums on their usual paths).
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> host(static_cast<size_t>(std::min<int64_t>(big, int64_t{1} << 24)));
  for (float& x : host) x = dist(rng);
  const int64_t chunk = int64_t(host.size());
  float* staging = mem.alloc<float>(chunk);
  check_cuda(cudaMemcpy(staging, host.data(), size_t(4 * chunk), cudaMemcpyHostToDevice), "cudaMemcpy", "--kernels");
  void* buf[5];
  for (void*& p : buf) {
    p = mem.alloc<char>(big, 2);
    for (int64_t at = 0; at < big; at += chunk)
      cuda::convert(Dt::f32, Dt::bf16, staging, std::min(chunk, big - at), static_cast<char*>(p) + 2 * at, nullptr);
  }
  float* rstd = mem.alloc<float>(T);
  float* acc = mem.alloc<float>(std::max(V * H, cuda::rms_norm_backward_workspace_bytes(T, H) / 4));
  int* error = mem.alloc<int>(1);
  check_cuda(cudaMemset(error, 0, 4), "cudaMemset", "--kernels");
  std::vector<int32_t> ids_host(static_cast<size_t>(T)), pos_host(static_cast<size_t>(T));
  for (size_t i = 0; i < ids_host.size(); ++i) ids_host[i] = int32_t(rng() % uint32_t(V)), pos_host[i] = int32_t(i);
  int32_t* ids = mem.alloc<int32_t>(T);
  int32_t* pos = mem.alloc<int32_t>(T);
  check_cuda(cudaMemcpy(ids, ids_host.data(), 4 * ids_host.size(), cudaMemcpyHostToDevice), "cudaMemcpy", "--kernels");
  check_cuda(cudaMemcpy(pos, pos_host.data(), 4 * pos_host.size(), cudaMemcpyHostToDevice), "cudaMemcpy", "--kernels");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize", "--kernels");
  std::vector<double> inv_freq(static_cast<size_t>(D / 2));
  cpu::rope_inv_freq(D, m.rope.theta, cpu::RopeScaling{}, inv_freq.data());

  void *a = buf[0], *b = buf[1], *c = buf[2], *d = buf[3], *e = buf[4];
  const float eps = float(m.rms_norm_eps);
  struct Case {
    const char* name;
    double min_bytes;
    std::function<void()> reference, fused;
  };
  const std::vector<Case> cases = {
      {"rms_norm_forward", 2.0 * (2 * T * H + H) + 4.0 * T,
       [&] { cuda::rms_norm_forward(Dt::bf16, a, b, T, H, eps, c, rstd, nullptr); },
       [&] { cuda::rms_norm_forward_fused(Dt::bf16, a, b, T, H, eps, c, rstd, nullptr); }},
      {"rms_norm_backward", 2.0 * (3 * T * H + 2 * H) + 4.0 * T,
       [&] { cuda::rms_norm_backward(Dt::bf16, a, b, c, rstd, T, H, d, e, acc, nullptr); },
       [&] { cuda::rms_norm_backward_fused(Dt::bf16, a, b, c, rstd, T, H, d, e, acc, nullptr); }},
      {"rope_q", 2.0 * 2 * T * NH * D + 4.0 * T,
       [&] { cuda::rope_forward(Dt::bf16, a, pos, inv_freq.data(), T, NH, D, false, b, nullptr); },
       [&] { cuda::rope_forward_fused(Dt::bf16, a, pos, inv_freq.data(), T, NH, D, false, b, nullptr); }},
      {"swiglu_forward", 2.0 * 3 * T * I, [&] { cuda::swiglu_forward(Dt::bf16, a, b, T * I, c, nullptr); },
       [&] { cuda::swiglu_forward_fused(Dt::bf16, a, b, T * I, c, nullptr); }},
      {"swiglu_backward", 2.0 * 5 * T * I, [&] { cuda::swiglu_backward(Dt::bf16, a, b, c, T * I, d, e, nullptr); },
       [&] { cuda::swiglu_backward_fused(Dt::bf16, a, b, c, T * I, d, e, nullptr); }},
      {"embedding_forward", 2.0 * 2 * T * H + 4.0 * T,
       [&] { cuda::embedding_forward(Dt::bf16, a, ids, T, H, V, b, error, nullptr); },
       [&] { cuda::embedding_forward_fused(Dt::bf16, a, ids, T, H, V, b, error, nullptr); }},
      // dW [V, H] is written whole (zeros where no token is): V H bf16 at least.
      {"embedding_backward", 2.0 * (T * H + V * H) + 4.0 * T,
       [&] { cuda::embedding_backward(Dt::bf16, a, ids, T, H, V, b, acc, error, nullptr); },
       [&] { cuda::embedding_backward_fused(Dt::bf16, a, ids, T, H, V, b, acc, error, nullptr); }},
  };
  nlohmann::json out = nlohmann::json::array();
  std::printf("| kernel (bf16, T %lld) | reference ms | fused ms | reference / fused | fused GB/s |\n", (long long)T);
  std::printf("|---|---:|---:|---:|---:|\n");
  for (const Case& k : cases) {
    const double ref = median_ms(k.reference), fused = median_ms(k.fused);
    const double gbs = fused > 0 ? k.min_bytes / (fused * 1e-3) * 1e-9 : 0;
    std::printf("| %s | %.4f | %.4f | %.2f | %.0f |\n", k.name, ref, fused, fused > 0 ? ref / fused : 0.0, gbs);
    out.push_back({{"kernel", k.name}, {"reference_ms", ref}, {"fused_ms", fused},
                   {"speedup", fused > 0 ? ref / fused : 0.0}, {"fused_gb_per_s", gbs}, {"min_bytes", k.min_bytes}});
  }
  std::fflush(stdout);
  return out;
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
  bool profile = false, kernels = false;
  app.add_flag("--profile", profile, "Per-op device time of the timed steps (as AUTOSP_PROFILE=1), into --out");
  app.add_flag("--kernels", kernels, "First, the fused row kernels against the reference ones at this model's shapes");
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
  if (kernels) result["kernels"] = bench_kernels(model, B * S);  // its memory is freed again
  if (profile) set_profile_enabled(true);  // before the trainer makes its executor

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
      result["profile_table"] = global_profile().report(str("bench_cuda S ", S, " ", policy));
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
