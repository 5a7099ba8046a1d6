// rope's inverse frequencies (fused.h): scalar double maths, once per call, so built for
// the baseline rather than per instruction set.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/fused.h"
#include "util/error.h"

namespace autosp::cpu {

void rope_inv_freq(int64_t D, double theta, const RopeScaling& scaling, double* inv_freq) {
  AUTOSP_CHECK(D % 2 == 0 && D > 0, "rope head dim D = ", D, " must be even and positive");
  const double orig = scaling.original_max_position_embeddings;
  const double low = scaling.low_freq_factor, high = scaling.high_freq_factor;
  if (scaling.kind == RopeScaling::llama3) {
    AUTOSP_CHECK(high != low, "llama3 rope scaling needs high_freq_factor != low_freq_factor");
  }
  constexpr double kPi = 3.14159265358979323846;
  // yarn's correction range, in dimensions: the one at which a frequency turns `rotations`
  // times over the original positions.
  const double dim = static_cast<double>(D);
  const auto correction_dim = [&](double rotations) {
    return dim * std::log(orig / (rotations * 2 * kPi)) / (2 * std::log(theta));
  };
  double ramp_low = correction_dim(scaling.beta_fast), ramp_high = correction_dim(scaling.beta_slow);
  if (scaling.truncate) ramp_low = std::floor(ramp_low), ramp_high = std::ceil(ramp_high);
  ramp_low = std::max(ramp_low, 0.0);
  ramp_high = std::min(ramp_high, dim - 1);
  if (ramp_low == ramp_high) ramp_high += 0.001;  // as transformers, against a zero width
  for (int64_t i = 0; i < D / 2; ++i) {
    double f = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(D));
    if (scaling.kind == RopeScaling::linear) f /= scaling.factor;
    if (scaling.kind == RopeScaling::yarn) {
      const double ramp = std::clamp((double(i) - ramp_low) / (ramp_high - ramp_low), 0.0, 1.0);
      f = f / scaling.factor * ramp + f * (1.0 - ramp);
    }
    if (scaling.kind == RopeScaling::llama3) {
      const double wavelen = 2.0 * kPi / f;
      if (wavelen > orig / low) {
        f = f / scaling.factor;
      } else if (!(wavelen < orig / high)) {
        const double smooth = (orig / wavelen - low) / (high - low);
        f = (1.0 - smooth) * f / scaling.factor + smooth * f;
      }
    }
    inv_freq[i] = f;
  }
}

}  // namespace autosp::cpu
