#include "train/data.h"

#include "util/error.h"

namespace autosp::train {

void DataSource::read_layout(int64_t /*sample*/, int64_t S, int32_t* positions, int32_t* documents) const {
  for (int64_t i = 0; i < S; ++i) {
    positions[i] = static_cast<int32_t>(i);
    documents[i] = 0;
  }
}

std::string TokenFileSource::describe(int64_t S) const {
  return str(file_.path(), ": ", file_.num_tokens(), " tokens, ", file_.num_samples(S),
             " samples of ", S, " tokens");
}

}  // namespace autosp::train
