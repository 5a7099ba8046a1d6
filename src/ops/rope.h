// What the rope op's attributes say about its frequencies, for every backend's kernel (the
// attributes are defined in rope.cpp).
#pragma once
#include "ir/graph.h"
#include "kernels/cpu/fused.h"

namespace autosp {

// The scaling of theta's frequencies (linear, llama3, yarn; none for "frequencies").
cpu::RopeScaling rope_scaling(const Attrs& attrs);

// The D/2 inverse frequencies the kernels rotate by: the `inv_freq` table itself where rope_type
// is "frequencies", else cpu::rope_inv_freq of theta and the scaling.
void rope_frequencies(const Attrs& attrs, int64_t D, double* inv_freq);

}  // namespace autosp
