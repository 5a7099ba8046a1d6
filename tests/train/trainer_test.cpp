// The trainer refuses to apply a non-finite update instead of silently training on NaN.
#include <gtest/gtest.h>

#include "train/trainer.h"
#include "testing/tiny_llama.h"

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

}  // namespace
}  // namespace autosp::train
