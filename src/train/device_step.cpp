#include "train/device_step.h"

#include "util/error.h"

namespace autosp::train {

#ifndef AUTOSP_HAVE_CUDA
// A build without the cuda backend (cuda_device_step.cpp is not in it).
std::unique_ptr<DeviceStep> make_device_step(const Graph&, const std::vector<models::ParameterSpec>&,
                                             const DeviceConstants&, int64_t, bool, const ProcessGroups*) {
  user_error("backend cuda: this autosp was built without the cuda backend (no nvcc at configure time, or "
             "-DAUTOSP_CUDA=OFF); rebuild with the CUDA toolkit installed, or use --backend cpu");
}
#endif

}  // namespace autosp::train
