// The kernels compiled once per instruction set (see isa.h): each public function named
// here has a copy with the same signature in autosp::cpu::avx2 and autosp::cpu::avx512,
// defined by attention.cpp, fused.cpp and gemm.cpp built with that set's flags. Only
// dispatch.cpp and tests that compare the copies call them directly.
#pragma once
#include "kernels/cpu/attention.h"
#include "kernels/cpu/fused.h"
#include "kernels/cpu/gemm.h"

#define AUTOSP_CPU_ISA_KERNELS(X)                                                          \
  X(attention_forward_workspace_floats) X(attention_backward_workspace_floats)             \
  X(attention_forward) X(attention_backward) X(attention_backward_is_split)                \
  X(embedding_forward) X(embedding_backward)                                               \
  X(rms_norm_forward) X(rms_norm_backward) X(rms_norm_backward_scratch_doubles)            \
  X(rope_forward)                                                                          \
  X(silu_forward) X(silu_backward) X(swiglu_forward) X(swiglu_backward)                    \
  X(cross_entropy_forward) X(cross_entropy_backward)                                      \
  X(gemm_workspace_floats) X(gemm_packed)

// decltype(f) of a function is its function type, so `decltype(cpu::f) f;` declares the
// copy with exactly the public signature (default arguments stay with the public one).
#define AUTOSP_DECLARE_ISA_KERNEL(name) decltype(::autosp::cpu::name) name;

namespace autosp::cpu::avx2 {
AUTOSP_CPU_ISA_KERNELS(AUTOSP_DECLARE_ISA_KERNEL)
}
namespace autosp::cpu::avx512 {
AUTOSP_CPU_ISA_KERNELS(AUTOSP_DECLARE_ISA_KERNEL)
}
