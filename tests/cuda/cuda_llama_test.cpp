// The Llama reference test on the cuda backend: logits, loss and every parameter gradient
// of step 0 against the float64 PyTorch reference (tests/reference/llama_reference.py, as
// tests/reference/llama_reference_test.cpp does for the CPU), in f32 and in bf16 (bf16
// parameters and activations, f32 statistics and loss: the graph a GPU run trains).
//
// Skipped, visibly, without a GPU. NOT YET RUN ON A GPU: the bf16 tolerances are set from
// the arithmetic (below); the first GPU run should replace them with observed errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "io/safetensors.h"
#include "kernels/cpu/basic.h"
#include "models/llama.h"
#include "passes/autodiff.h"
#include "passes/pipeline.h"
#include "runtime/cuda_executor.h"
#include "testing/compare.h"
#include "testing/process.h"
#include "train/checkpoint.h"
#include "train/data.h"

namespace autosp {
namespace {

using testing::normalised_error;

constexpr int64_t kSeqLen = 16, kBatch = 2;

std::string python() {
  const char* p = std::getenv("AUTOSP_PYTHON");  // the GPU machine's torch may not be /usr/bin's
  return p && *p ? p : "python3";
}

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> y(x.size());
  cpu::f32_to_bf16(x.data(), static_cast<int64_t>(x.size()), y.data());
  return y;
}

std::vector<float> output_f32(const CudaExecutor& ex, const std::string& name) {
  const TensorType& t = ex.graph().type(ex.graph().output(name));
  const void* p = ex.output_data(name);
  std::vector<float> y(static_cast<size_t>(numel(t.shape)));
  if (t.dtype == DType::bf16) cpu::bf16_to_f32(static_cast<const uint16_t*>(p), numel(t.shape), y.data());
  else std::memcpy(y.data(), p, y.size() * sizeof(float));
  return y;
}

struct Tolerances {
  double logits, loss, grad;
};
// f32: the CPU backend holds 2e-6 (logits), 1e-6 (loss) and 5e-6 (gradients) against
// float64; the GPU sums in other orders (cuBLAS, one-block reductions, fp32 atomics in the
// embedding and rms_norm weight gradients): 5x those.
constexpr Tolerances kF32{1e-5, 5e-6, 2.5e-5};
// bf16: every parameter and activation is rounded to 8 significant bits (unit roundoff
// 2^-9 = 2e-3); the longest path of the step (embedding -> 2 layers -> loss -> back) rounds
// ~30 times, and random-walk compounding gives ~sqrt(30) * 2e-3 = 1e-2 per element, up to
// a few times that where cancellation (residual adds, softmax - onehot) shrinks the
// reference. The loss is summed in fp32 from fp32 per-token losses: 1e-2 relative.
constexpr Tolerances kBf16{4e-2, 1e-2, 8e-2};

TEST(CudaLlamaReference, StepZeroLogitsLossAndGradientsInF32AndBf16) {
  std::string why;
  if (cuda_device_count(&why) == 0)
    GTEST_SKIP() << "no CUDA device here (" << why << "): scripts/gpu_check.sh runs this on a GPU";
  testing::TempDir dir("cuda_llama_ref");
  const auto r = testing::run_command(str(python(), " ", testing::source_path("tests/reference/llama_reference.py"),
                                          " --out ", dir.path(), " --tied 0 --rope llama3 --steps 1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto expected = io::read_safetensors(dir / "expected.safetensors");
  const models::LlamaConfig model = models::load_llama_config(dir / "config.json");
  const std::vector<std::vector<float>> params = train::load_weights(dir / "model.safetensors", model);
  const std::vector<models::ParameterSpec> specs = models::llama_parameters(model);

  // Step 0 reads samples 0, 1 (micro batch 0) and 2, 3 (micro batch 1); the reference
  // averages the two micro batches' losses and gradients.
  train::TokenFileSource data(dir / "tokens.bin", static_cast<int32_t>(model.vocab_size));
  std::vector<int32_t> inputs[2], labels[2], pos(kBatch * kSeqLen);
  for (int m = 0; m < 2; ++m) {
    inputs[m].resize(kBatch * kSeqLen);
    labels[m].resize(kBatch * kSeqLen);
    for (int j = 0; j < kBatch; ++j)
      data.read_sample(m * kBatch + j, kSeqLen, inputs[m].data() + j * kSeqLen, labels[m].data() + j * kSeqLen);
  }
  for (int64_t i = 0; i < kBatch * kSeqLen; ++i) pos[i] = static_cast<int32_t>(i % kSeqLen);

  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tolerances tol = dtype == DType::bf16 ? kBf16 : kF32;
    std::vector<std::vector<uint16_t>> bf16_params;
    for (const auto& p : params) bf16_params.push_back(to_bf16(p));
    auto bind_params = [&](CudaExecutor& ex) {
      for (size_t i = 0; i < specs.size(); ++i)
        ex.bind(specs[i].name, dtype == DType::bf16 ? static_cast<const void*>(bf16_params[i].data())
                                                    : static_cast<const void*>(params[i].data()));
    };

    const Graph eval = models::llama_forward(model, {.batch = kBatch, .seq_len = kSeqLen, .output_loss = false,
                                                     .output_logits = true, .dtype = dtype});
    CudaExecutor logits_ex(eval);
    bind_params(logits_ex);
    logits_ex.bind("input_ids", inputs[0].data());
    logits_ex.bind("position_ids", pos.data());
    logits_ex.run();
    const double logits_err = normalised_error(output_f32(logits_ex, "logits"), expected.at("logits").data);
    EXPECT_LT(logits_err, tol.logits);

    const Graph forward = models::llama_forward(model, {.batch = kBatch, .seq_len = kSeqLen, .dtype = dtype});
    CompileOptions options;
    options.backend = Backend::cuda;  // lowered for the kernels it runs on (a bf16 graph has no CPU kernels)
    const Graph joint = compile(forward, options);
    CudaExecutor step(joint);
    bind_params(step);
    step.bind("position_ids", pos.data());
    double loss = 0;
    std::vector<std::vector<float>> grads(specs.size());
    for (int m = 0; m < 2; ++m) {
      step.bind("input_ids", inputs[m].data());
      step.bind("labels", labels[m].data());
      step.run();
      loss += 0.5 * output_f32(step, "loss")[0];
      for (size_t i = 0; i < specs.size(); ++i) {
        const std::vector<float> g = output_f32(step, kGradPrefix + specs[i].name);
        if (m == 0) grads[i].assign(g.size(), 0.0f);
        for (size_t e = 0; e < g.size(); ++e) grads[i][e] += 0.5f * g[e];  // fp32 accumulation, as the runtime's
      }
    }
    const double ref_loss = expected.at("loss").data[0];
    EXPECT_NEAR(loss, ref_loss, tol.loss * std::abs(ref_loss));
    double worst = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      const double err = normalised_error(grads[i], expected.at("grad." + specs[i].name).data);
      worst = std::max(worst, err);
      EXPECT_LT(err, tol.grad) << specs[i].name;
    }
    std::printf("cuda %s vs float64: logits %.2e, loss %.2e (relative), worst parameter gradient %.2e\n",
                dtype_name(dtype), logits_err, std::abs(loss - ref_loss) / std::abs(ref_loss), worst);
  }
}

}  // namespace
}  // namespace autosp
