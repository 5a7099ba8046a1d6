// The trainer refuses to apply a non-finite update instead of silently training on NaN, and
// evaluates under ZeRO-3 as under ZeRO-0.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "testing/counting_data.h"
#include "testing/tiny_llama.h"
#include "train/trainer.h"

namespace autosp::train {
namespace {

// Every label ignored: the mean over labelled tokens is 0 / 0.
class NoLabels final : public DataSource {
 public:
  void read_sample(int64_t, int64_t S, int32_t* inputs, int32_t* labels) const override {
    for (int64_t i = 0; i < S; ++i) {
      inputs[i] = static_cast<int32_t>(i % 7);
      labels[i] = kIgnoreLabel;
    }
  }
  std::string describe(int64_t) const override { return "no labels"; }
};

TEST(Trainer, ANonFiniteLossStopsBeforeTheUpdate) {
  const models::LlamaConfig model = testing::tiny_llama(1, 7);
  TrainConfig config;
  config.train_micro_batch_size_per_gpu = 1;
  resolve_batch(config, 1, "test");
  ModelState initial = ModelState::initial(model, 3);
  Trainer trainer(model, config, 6, initial);
  try {
    trainer.train_step(NoLabels());
    FAIL() << "a NaN loss was trained on";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("step 1: the loss is"), std::string::npos) << e.what();
  }
  EXPECT_EQ(trainer.state().step, 0);
  EXPECT_EQ(trainer.state().params, initial.params);  // untouched
}

using Counting = testing::CountingData;

// Under ZeRO-3 the trainer holds only parameter shards; evaluation gathers them, and gives
// the logits a ZeRO-0 trainer of the same state gives, before and after a step.
TEST(Trainer, LogitsUnderZeroStage3EqualZeroStage0) {
  const models::LlamaConfig model = testing::tiny_llama(2, 7);
  const ModelState initial = ModelState::initial(model, 5);
  auto make = [&](int stage) {
    TrainConfig config;
    config.train_micro_batch_size_per_gpu = 1;
    config.zero_stage = stage;
    resolve_batch(config, 1, "test");
    return std::make_unique<Trainer>(model, config, 6, initial);
  };
  auto zero0 = make(0), zero3 = make(3);
  const std::vector<int32_t> inputs = {1, 2, 3, 4, 5, 6};
  EXPECT_EQ(zero3->logits(inputs.data(), 1, 6), zero0->logits(inputs.data(), 1, 6));
  EXPECT_TRUE(zero3->state().params.empty()) << "the gathered parameters are dropped after evaluating";
  zero0->train_step(Counting());
  zero3->train_step(Counting());
  const std::vector<float> a = zero0->logits(inputs.data(), 1, 6), b = zero3->logits(inputs.data(), 1, 6);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5f * (1 + std::abs(a[i]))) << i;
  std::vector<int32_t> argmax(6);
  zero3->predict(inputs.data(), 1, 6, argmax.data());  // what the demo's evaluation calls
}

}  // namespace
}  // namespace autosp::train
