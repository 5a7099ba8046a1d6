// One libFuzzer binary per target: FUZZ_TARGET (a function of fuzz_entries.h) is set by
// CMake (fuzz/CMakeLists.txt). `make fuzz` builds and runs them.
#include <cstddef>
#include <cstdint>

#include "fuzz_entries.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  autosp::fuzz::FUZZ_TARGET(data, size);
  return 0;
}
