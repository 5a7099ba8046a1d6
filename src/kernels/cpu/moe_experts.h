// The fused experts' element functions (moe.h's MoeExperts: gate_up [E, H, 2 I] in one product),
// written once for the CPU kernels (moe.cpp) and the cuda ones (cuda/moe.cu compiles them):
// where each expert column's gate and up products sit in the fused row, and the GLU of the two.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/cpu/moe_routing.h"  // AUTOSP_HOST_DEVICE

namespace autosp::moe_experts {

// gpt-oss's (interleaved columns: g_j at 2 j, u_j at 2 j + 1; the clamped GLU with alpha and
// limit) or Llama 4's (the gate's I columns, then the up's: g_j at j, u_j at I + j; SwiGLU).
struct FusedForm {
  bool gpt_oss = false;
  float alpha = 1.702f, limit = 7.0f;
};
AUTOSP_HOST_DEVICE inline int64_t gate_column(const FusedForm& f, int64_t, int64_t j) { return f.gpt_oss ? 2 * j : j; }
AUTOSP_HOST_DEVICE inline int64_t up_column(const FusedForm& f, int64_t I, int64_t j) {
  return f.gpt_oss ? 2 * j + 1 : I + j;
}

// One element's GLU h and its gradient's two parts dh/dg and dh/du.
struct Glu {
  float h, dg, du;
};
// gpt-oss's: h = (clamp(u, -L, L) + 1) c sigmoid(alpha c), c = min(g, L). The clamps pass the
// gradient where the value is within its bounds, bounds included (torch's clamp).
AUTOSP_HOST_DEVICE inline Glu clamped_glu(float g, float u, float alpha, float limit) {
  const float c = g < limit ? g : limit, uc = u < -limit ? -limit : (u > limit ? limit : u);
  const float s = 1.0f / (1.0f + expf(-alpha * c)), glu = c * s;
  // d/dc (c s(alpha c)) = s + alpha c s (1 - s)
  const float dc = g <= limit ? s + alpha * c * s * (1.0f - s) : 0.0f;
  return {(uc + 1.0f) * glu, (uc + 1.0f) * dc, u >= -limit && u <= limit ? glu : 0.0f};
}
// The form's: gpt-oss's clamped GLU, or SwiGLU silu(g) u (silu' = s + g s (1 - s)).
AUTOSP_HOST_DEVICE inline Glu glu(const FusedForm& f, float g, float u) {
  if (f.gpt_oss) return clamped_glu(g, u, f.alpha, f.limit);
  const float s = 1.0f / (1.0f + expf(-g)), silu = g * s;
  return {silu * u, u * (s + silu * (1.0f - s)), silu};
}

}  // namespace autosp::moe_experts
