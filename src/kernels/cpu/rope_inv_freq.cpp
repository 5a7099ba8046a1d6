// rope's inverse frequencies (fused.h): scalar double maths, once per call, so built for
// the baseline rather than per instruction set.
#include <cmath>

#include "kernels/cpu/fused.h"
#include "util/error.h"

namespace autosp::cpu {

void rope_inv_freq(int64_t D, double theta, const RopeScaling& scaling, double* inv_freq) {
  AUTOSP_CHECK(D % 2 == 0 && D > 0, "rope head dim D = ", D, " must be even and positive");
  const double orig = scaling.original_max_position_embeddings;
  const double low = scaling.low_freq_factor, high = scaling.high_freq_factor;
  if (scaling.llama3) {
    AUTOSP_CHECK(high != low, "llama3 rope scaling needs high_freq_factor != low_freq_factor");
  }
  constexpr double kPi = 3.14159265358979323846;
  for (int64_t i = 0; i < D / 2; ++i) {
    double f = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(D));
    if (scaling.llama3) {
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
