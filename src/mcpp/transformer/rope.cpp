#include "mcpp/transformer/rope.h"

#include <cmath>
#include <vector>

#include "mcpp/core/error.h"

namespace mcpp {

double rope_inv_freq(int64_t i, int64_t rot_dim, double base, double scaling_factor) {
  const double f = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim));
  if (scaling_factor <= 0.0) return f;
  constexpr double kPi = 3.14159265358979323846;
  constexpr double kOldContext = 8192.0, kLowFreqFactor = 1.0, kHighFreqFactor = 4.0;  // Megatron's defaults
  const double wavelen = 2.0 * kPi / f;
  if (wavelen < kOldContext / kHighFreqFactor) return f;                  // high frequency: kept
  if (wavelen > kOldContext / kLowFreqFactor) return f / scaling_factor;  // low frequency: scaled
  const double smooth = (kOldContext / wavelen - kLowFreqFactor) / (kHighFreqFactor - kLowFreqFactor);
  return (1.0 - smooth) * f / scaling_factor + smooth * f;
}

RopeTables make_rope_tables(int64_t seq_length, int64_t rot_dim, float base, Device device, double scaling_factor) {
  MCPP_CHECK(rot_dim > 0 && rot_dim % 2 == 0, "rotary dim must be even and positive, got {}", rot_dim);
  const int64_t half = rot_dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[static_cast<size_t>(i)] = rope_inv_freq(i, rot_dim, static_cast<double>(base), scaling_factor);
  Tensor c = Tensor::empty({seq_length, half}), s = Tensor::empty({seq_length, half});
  for (int64_t p = 0; p < seq_length; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      double angle = static_cast<double>(p) * inv_freq[static_cast<size_t>(i)];
      c.data<float>()[p * half + i] = static_cast<float>(std::cos(angle));
      s.data<float>()[p * half + i] = static_cast<float>(std::sin(angle));
    }
  }
  return {c.to(device), s.to(device)};
}

}  // namespace mcpp
