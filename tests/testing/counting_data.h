// A DataSource for trainer tests: tokens 0..6 repeating from sample k on, each labelled with
// the next, so any sample index reads a valid, learnable sample.
#pragma once
#include <cstdint>
#include <string>

#include "train/data.h"

namespace autosp::testing {

class CountingData final : public train::DataSource {
 public:
  void read_sample(int64_t k, int64_t S, int32_t* inputs, int32_t* labels) const override {
    for (int64_t i = 0; i < S; ++i) {
      inputs[i] = static_cast<int32_t>((k + i) % 7);
      labels[i] = static_cast<int32_t>((k + i + 1) % 7);
    }
  }
  std::string describe(int64_t) const override { return "counting"; }
};

}  // namespace autosp::testing
