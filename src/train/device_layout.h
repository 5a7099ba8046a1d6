// Where the cuda backend's device-resident model state (train/device_step.h) keeps each
// parameter. Every kind of state (fp32 master weights, fp32 gradient sum, the two fp32
// moments, the bf16 compute copy the step reads) is ONE flat buffer with this layout, so that
// a tensor's element e sits at the same index in each, the optimizer is one kernel over all
// parameters, and the global gradient norm is one reduction over one buffer.
//
// Host code only (no CUDA headers): the layout is tested on machines without a GPU.
#pragma once
#include <cstdint>
#include <vector>

namespace autosp::train {

// Each tensor starts at a multiple of this many elements: 256 bytes of bf16 (cuBLAS's and
// cuDNN's preferred operand alignment, and 16 bytes for the vector loads of the kernels), 512
// of fp32. The padding between tensors is zero in every buffer and stays zero: gradients are
// only ever written inside a tensor, so it adds nothing to the norm.
constexpr int64_t kFlatAlignElements = 128;

struct FlatLayout {
  std::vector<int64_t> offset;  // per tensor: its first element in the flat buffers
  std::vector<int64_t> numel;   // per tensor: its elements
  int64_t total = 0;            // elements of each flat buffer, the last tensor's padding included
};

// Tensors in order, each at the next multiple of `align` (> 0) elements. A tensor of 0
// elements takes no space (its offset is where the next one starts).
FlatLayout flat_layout(const std::vector<int64_t>& numel, int64_t align = kFlatAlignElements);

// A piece of one tensor: elements [begin, begin + n) of tensor `tensor`.
struct TensorChunk {
  int64_t tensor = 0, begin = 0, n = 0;
};
// Every tensor cut into pieces of at most `chunk` (> 0) elements, in tensor order: a
// multi-tensor kernel gives each piece one block (empty tensors give none).
std::vector<TensorChunk> tensor_chunks(const std::vector<int64_t>& numel, int64_t chunk);

// The gradient norm's partial sums: a fixed grid of this many blocks, so the norm is the same
// on every device and every run (kernels/cuda/kernels.h, kNormBlocks, is checked equal).
constexpr int64_t kDeviceNormPartials = 1024;
// Elements of a gradient one block of the multi-tensor accumulation adds.
constexpr int64_t kGradChunkElements = int64_t{1} << 16;

// Bytes the device-resident state (train/device_step.h) allocates for these tensors: 18 per
// element of their flat layout (fp32 master, gradient sum and two moments, the bf16 copy),
// the norm's partial sums, the step's status and the accumulation's table of chunks (three
// 8-byte words each).
int64_t device_state_bytes(const std::vector<int64_t>& numel);

// Bytes the model's constants (models::Model::constants: tensors the step reads and nothing
// trains) take on the device: their bf16 copy, one flat buffer of their own layout.
inline int64_t device_constant_bytes(const std::vector<int64_t>& numel) { return 2 * flat_layout(numel).total; }

// Bytes of the batch's two device slots (train/device_step.h): input ids, labels, positions
// and, packed, document ids, int32, for `tokens` tokens a micro batch.
inline int64_t device_batch_bytes(int64_t tokens, bool packed) { return 2 * 4 * (packed ? 4 : 3) * tokens; }

}  // namespace autosp::train
