// The floating dtypes of the cuda backend's kernels, as host constants without CUDA headers, so
// that host-only sizing and selection headers (cudnn_attention.h) can name them on machines
// without nvcc too.
#pragma once
#include <cstdint>

namespace autosp::cuda {

enum class Dt : int { f32 = 0, bf16 = 1 };
inline int64_t dt_size(Dt dt) { return dt == Dt::f32 ? 4 : 2; }

}  // namespace autosp::cuda
