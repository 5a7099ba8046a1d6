// bench_cuda: autosp's bf16 training step on one GPU (the cuda backend), for the GPU check
// (scripts/gpu_check.sh), against PyTorch on the same GPU (bench/bench_cuda_torch.py).
//
//   bench_cuda --model DIR --seq-len S [--batch B] [--steps N] [--checkpoint none|full|sac]
//              [--max-seq] [--out FILE.json]
//
// A step is the compiled bf16 joint graph on the CudaExecutor (parameters bound in device
// memory as bf16 compute copies, gradients left on the device), then per parameter: its
// bf16 gradient into an fp32 buffer and AdamW on the fp32 master weights and moments, which
// rewrites the bf16 copy (DESIGN.md "Numbers and types"). Step time is the median of the
// timed steps after one warm-up step, each ended by a device synchronisation.
//
// Memory: what autosp allocates on the device (the step's arena, the inputs' block, model
// state at 18 bytes per parameter: fp32 master, gradient and two moments, bf16 copy), and
// what the device reports used (cudaMemGetInfo, which adds the CUDA context and cuBLAS's
// workspace). The torch side reports torch.cuda.max_memory_allocated: compare the first.
//
// --plan-only: compile and plan, print the planned device bytes (no device needed).
// --max-seq: for the checkpoint policy given, the longest S (doubling from --seq-len) whose
// planned device memory fits in 95% of the free memory, and whether its arena then
// allocates. The step at that S is not run (attention's work grows as S^2: a step at the
// longest S would outlast the GPU check's time); the JSON says so.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "kernels/cuda/kernels.h"
#include "models/llama.h"
#include "ops/cuda_kernels.h"
#include "ops/op.h"
#include "passes/autodiff.h"
#include "passes/pipeline.h"
#include "passes/plan_memory.h"
#include "runtime/cuda_executor.h"
#include "train/cuda_adamw.h"

namespace autosp {
namespace {

struct DeviceState {
  std::vector<models::ParameterSpec> specs;
  std::vector<float*> master, grad, m, v;
  std::vector<void*> copy;  // bf16
  int64_t bytes = 0;
  ~DeviceState() {
    for (auto* vec : {&master, &grad, &m, &v})
      for (float* p : *vec) cudaFree(p);
    for (void* p : copy) cudaFree(p);
  }
};

template <typename T>
T* device_alloc(int64_t n, int64_t elem, int64_t& total, const std::string& what) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, size_t(std::max<int64_t>(n * elem, 1))), "cudaMalloc", what);
  total += n * elem;
  return static_cast<T*>(p);
}

void init_state(DeviceState& s, const models::LlamaConfig& model) {
  s.specs = models::llama_parameters(model);
  for (const auto& spec : s.specs) {
    const int64_t n = numel(spec.shape);
    s.master.push_back(device_alloc<float>(n, 4, s.bytes, spec.name));
    s.grad.push_back(device_alloc<float>(n, 4, s.bytes, spec.name));
    s.m.push_back(device_alloc<float>(n, 4, s.bytes, spec.name));
    s.v.push_back(device_alloc<float>(n, 4, s.bytes, spec.name));
    s.copy.push_back(device_alloc<void>(n, 2, s.bytes, spec.name));
    const std::vector<float> init = models::llama_init(model, spec, 42);
    check_cuda(cudaMemcpy(s.master.back(), init.data(), size_t(4 * n), cudaMemcpyHostToDevice), "cudaMemcpy", spec.name);
    check_cuda(cudaMemset(s.m.back(), 0, size_t(4 * n)), "cudaMemset", spec.name);
    check_cuda(cudaMemset(s.v.back(), 0, size_t(4 * n)), "cudaMemset", spec.name);
    cuda::convert(cuda::Dt::f32, cuda::Dt::bf16, s.master.back(), n, s.copy.back(), nullptr);
  }
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize", "model state");
}

Graph compile_step(const models::LlamaConfig& model, int64_t B, int64_t S, CheckpointPolicy policy) {
  const Graph forward = models::llama_forward(model, {.batch = B, .seq_len = S, .dtype = DType::bf16});
  CompileOptions options;
  options.threads = 1;
  options.backend = Backend::cuda;
  options.checkpoint.policy = policy;
  return compile(forward, options);
}

// What plan_memory gives the cuda executor for this step, and its inputs' block.
int64_t planned_device_bytes(const Graph& joint) {
  const MemoryPlan plan = read_memory_plan(executable_graph(joint, Backend::cuda, 1));
  int64_t inputs = 0;
  for (ValueId v : joint.inputs()) inputs += (joint.type(v).bytes() + 63) / 64 * 64;
  return plan.arena_bytes + inputs;
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

int run(int argc, char** argv) {
  std::string model_dir, out_path, policy_name = "none";
  int64_t S = 4096, B = 1, steps = 5;
  double peak_tflops = 989.0;  // H200 SXM dense bf16
  bool max_seq = false;
  CLI::App app{"autosp's bf16 training step on one GPU"};
  app.add_option("--model", model_dir, "Model directory (config.json)")->required();
  app.add_option("--seq-len", S, "Sequence length");
  app.add_option("--batch", B, "Micro batch");
  app.add_option("--steps", steps, "Timed steps (after one warm-up)");
  app.add_option("--checkpoint", policy_name, "none | full | sac");
  app.add_option("--peak-tflops", peak_tflops, "The GPU's dense bf16 peak, for MFU");
  app.add_flag("--max-seq", max_seq, "Find the longest S that fits (planned, allocated, not run)");
  app.add_option("--out", out_path, "Write the result as JSON here");
  bool plan_only = false;
  app.add_flag("--plan-only", plan_only, "Compile and plan the step's device memory; no device needed");
  CLI11_PARSE(app, argc, argv);
  const models::LlamaConfig model = models::load_llama_config(model_dir + "/config.json");
  const CheckpointPolicy policy = parse_checkpoint_policy(policy_name, "--checkpoint");
  nlohmann::json result = {{"model", model_dir}, {"parameters", models::llama_num_parameters(model)},
                           {"checkpoint", policy_name}, {"batch", B}};
  if (plan_only) {
    const int64_t need = planned_device_bytes(compile_step(model, B, S, policy));
    const int64_t state = 18 * models::llama_num_parameters(model);
    std::printf("S %lld, %s: planned arena + inputs %.2f GiB, model state %.2f GiB (18 bytes per parameter)\n",
                (long long)S, policy_name.c_str(), double(need) / double(1 << 30), double(state) / double(1 << 30));
    return 0;
  }
  std::string why;
  if (cuda_device_count(&why) == 0) user_error("bench_cuda: no CUDA device (", why, ")");
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties", "bench_cuda");
  result["gpu"] = prop.name;
  size_t free0 = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free0, &total), "cudaMemGetInfo", "bench_cuda");

  DeviceState state;
  init_state(state, model);
  result["model_state_bytes"] = state.bytes;

  if (max_seq) {
    size_t free1 = 0;
    check_cuda(cudaMemGetInfo(&free1, &total), "cudaMemGetInfo", "bench_cuda");
    const double budget = 0.95 * double(free1);
    int64_t best = 0, best_bytes = 0;
    nlohmann::json tried = nlohmann::json::array();
    for (int64_t s = S; s <= (int64_t{1} << 22); s *= 2) {
      const Graph joint = compile_step(model, B, s, policy);
      const int64_t need = planned_device_bytes(joint);
      tried.push_back({{"seq_len", s}, {"planned_bytes", need}});
      std::printf("max-seq %s: S %lld plans %.2f GiB of %.2f GiB free\n", policy_name.c_str(), (long long)s,
                  double(need) / double(1 << 30), double(free1) / double(1 << 30));
      std::fflush(stdout);
      if (double(need) > budget) break;
      best = s;
      best_bytes = need;
    }
    result["max_seq"] = {{"seq_len", best}, {"planned_bytes", best_bytes}, {"tried", tried}, {"step_run", false}};
    if (best > 0) {
      bool allocated = true;
      try {
        const Graph joint = compile_step(model, B, best, policy);
        CudaExecutor ex(joint);
      } catch (const CudaError& e) {
        allocated = false;
        result["max_seq"]["allocation_error"] = e.what();
      }
      result["max_seq"]["allocated"] = allocated;
    }
  } else {
    const Graph joint = compile_step(model, B, S, policy);
    double graph_flops = 0;
    for (const Node& node : joint.nodes()) graph_flops += node_cost(joint, node).flops;
    CudaExecutor ex(joint);
    ex.set_copy_outputs(false);
    for (size_t i = 0; i < state.specs.size(); ++i) ex.bind_device(joint.find_input(state.specs[i].name), state.copy[i]);
    std::mt19937 rng(1);
    std::vector<int32_t> ids(size_t(B * S)), labels(size_t(B * S)), pos(size_t(B * S));
    for (auto& x : ids) x = static_cast<int32_t>(rng() % uint32_t(model.vocab_size));
    for (size_t i = 0; i < ids.size(); ++i) {
      labels[i] = i + 1 < ids.size() ? ids[i + 1] : -100;
      pos[i] = static_cast<int32_t>(int64_t(i) % S);
    }
    ex.bind("input_ids", ids.data());
    ex.bind("labels", labels.data());
    ex.bind("position_ids", pos.data());
    const train::AdamWParams adam{.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    std::vector<double> times, losses;
    for (int64_t step = 0; step <= steps; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      ex.run();
      for (size_t i = 0; i < state.specs.size(); ++i) {
        const int64_t n = numel(state.specs[i].shape);
        cuda::accumulate_grad(cuda::Dt::bf16, ex.output_device(kGradPrefix + state.specs[i].name), n, state.grad[i],
                              true, ex.stream());
        train::cuda_adamw_step(state.master[i], state.grad[i], state.m[i], state.v[i], n, adam, step + 1, adam.lr,
                               state.copy[i], ex.stream());
      }
      check_cuda(cudaStreamSynchronize(ex.stream()), "cudaStreamSynchronize", "the optimizer step");
      check_cuda(cudaGetLastError(), "the optimizer kernels", "bench_cuda");
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      float loss = 0;
      check_cuda(cudaMemcpy(&loss, ex.output_device("loss"), 4, cudaMemcpyDeviceToHost), "cudaMemcpy", "loss");
      std::printf("step %lld: %.3f s, loss %.4f\n", (long long)step, sec, double(loss));
      std::fflush(stdout);
      losses.push_back(loss);
      if (step > 0) times.push_back(sec);
    }
    std::sort(times.begin(), times.end());
    const double median = times.empty() ? 0 : times[times.size() / 2];
    size_t free2 = 0;
    check_cuda(cudaMemGetInfo(&free2, &total), "cudaMemGetInfo", "bench_cuda");
    const double flops = model_flops(model, B, S);
    result["seq_len"] = S;
    result["step_seconds"] = median;
    result["losses"] = losses;
    result["allocated_bytes"] = ex.arena_bytes() + ex.input_bytes() + state.bytes;
    result["arena_bytes"] = ex.arena_bytes();
    result["device_used_bytes"] = int64_t(free0) - int64_t(free2);
    result["model_flops"] = flops;
    result["graph_flops"] = graph_flops;
    result["mfu"] = median > 0 ? flops / median / (peak_tflops * 1e12) : 0;
    result["peak_tflops"] = peak_tflops;
    std::printf("autosp cuda: S %lld, %s: %.3f s/step, MFU %.1f%%, allocated %.2f GiB\n", (long long)S,
                policy_name.c_str(), median, 100 * double(result["mfu"]),
                double(result["allocated_bytes"].get<int64_t>()) / double(1 << 30));
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
