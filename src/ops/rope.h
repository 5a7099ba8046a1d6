// What the rope op's attributes say about frequency scaling (linear, llama3, yarn), for every backend's
// kernel (the attributes are defined in rope.cpp).
#pragma once
#include "ir/graph.h"
#include "kernels/cpu/fused.h"

namespace autosp {

cpu::RopeScaling rope_scaling(const Attrs& attrs);

}  // namespace autosp
