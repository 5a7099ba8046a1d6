#include "train/data.h"

#include "util/error.h"

namespace autosp::train {

std::string TokenFileSource::describe(int64_t S) const {
  return str(file_.path(), ": ", file_.num_tokens(), " tokens, ", file_.num_samples(S),
             " samples of ", S, " tokens");
}

}  // namespace autosp::train
