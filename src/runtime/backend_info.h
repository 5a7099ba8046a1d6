// What `autosp --version` says about the backends and communicators built in, and whether
// the cuda backend has been verified on a GPU (by scripts/gpu_check.sh, whose result file
// docs/gpu_check.json is read when CMake configures the build).
#pragma once
#include <string>

namespace autosp {

// "cpu; cuda (built ..., <verification>)" or "cpu; cuda (not built: ...)".
std::string backends_summary();
// ", nccl 2.x.y" when the cuda backend is built, else "".
std::string nccl_summary();
// One line: verified on a GPU or not, from docs/gpu_check.json at configure time.
std::string gpu_verification();

}  // namespace autosp
