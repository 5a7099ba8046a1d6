// Skips a GPU test, visibly (ctest lists it as skipped), where there is no CUDA device.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "runtime/cuda_executor.h"

#define SKIP_WITHOUT_GPU()                                                                          \
  do {                                                                                              \
    std::string why;                                                                                \
    if (::autosp::cuda_device_count(&why) == 0)                                                    \
      GTEST_SKIP() << "no CUDA device here (" << why                                                \
                   << "): the cuda backend is built but not run; scripts/gpu_check.sh runs this on a GPU"; \
  } while (0)
