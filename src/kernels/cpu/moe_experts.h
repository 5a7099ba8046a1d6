// gpt-oss's experts' clamped GLU (moe.h's MoeExperts), one element, written once for the CPU
// kernels (moe.cpp) and the cuda ones (cuda/moe.cu compiles it for the device).
#pragma once
#include <cmath>

#include "kernels/cpu/moe_routing.h"  // AUTOSP_HOST_DEVICE

namespace autosp::moe_experts {

// h = (clamp(u, -L, L) + 1) c sigmoid(alpha c), c = min(g, L), and its gradient's two parts:
// dh/dg and dh/du. The clamps pass the gradient where the value is within its bounds, bounds
// included (torch's clamp).
struct ClampedGlu {
  float h, dg, du;
};
AUTOSP_HOST_DEVICE inline ClampedGlu clamped_glu(float g, float u, float alpha, float limit) {
  const float c = g < limit ? g : limit, uc = u < -limit ? -limit : (u > limit ? limit : u);
  const float s = 1.0f / (1.0f + expf(-alpha * c)), glu = c * s;
  // d/dc (c s(alpha c)) = s + alpha c s (1 - s)
  const float dc = g <= limit ? s + alpha * c * s * (1.0f - s) : 0.0f;
  return {(uc + 1.0f) * glu, (uc + 1.0f) * dc, u >= -limit && u <= limit ? glu : 0.0f};
}

}  // namespace autosp::moe_experts
