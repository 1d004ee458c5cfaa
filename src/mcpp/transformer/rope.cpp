#include "mcpp/transformer/rope.h"

#include <cmath>
#include <vector>

#include "mcpp/core/error.h"

namespace mcpp {

float rope_inv_freq(int64_t i, int64_t rot_dim, double base, double scaling_factor) {
  const float f = 1.0f / std::pow(static_cast<float>(base), static_cast<float>(2 * i) / static_cast<float>(rot_dim));
  if (scaling_factor <= 0.0) return f;
  const float factor = static_cast<float>(scaling_factor);
  constexpr float kPi = 3.14159265358979323846f;
  constexpr float kOldContext = 8192.0f, kLowFreqFactor = 1.0f, kHighFreqFactor = 4.0f;  // Megatron's defaults
  const float wavelen = 2.0f * kPi / f;
  if (wavelen < kOldContext / kHighFreqFactor) return f;                  // high frequency: kept
  if (wavelen > kOldContext / kLowFreqFactor) return f / factor;  // low frequency: scaled
  const float smooth = (kOldContext / wavelen - kLowFreqFactor) / (kHighFreqFactor - kLowFreqFactor);
  return (1.0f - smooth) * f / factor + smooth * f;
}

RopeTables make_rope_tables(int64_t seq_length, int64_t rot_dim, float base, Device device, double scaling_factor,
                            double seq_len_interpolation_factor) {
  MCPP_CHECK(rot_dim > 0 && rot_dim % 2 == 0, "rotary dim must be even and positive, got {}", rot_dim);
  const int64_t half = rot_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[static_cast<size_t>(i)] = rope_inv_freq(i, rot_dim, static_cast<double>(base), scaling_factor);
  // Megatron's seq_len_interpolation_factor: the positions times 1 / factor (float32)
  const float position_scale =
      seq_len_interpolation_factor > 0.0 ? 1.0f / static_cast<float>(seq_len_interpolation_factor) : 1.0f;
  Tensor c = Tensor::empty({seq_length, half}), s = Tensor::empty({seq_length, half});
  for (int64_t p = 0; p < seq_length; ++p) {
    const float position = static_cast<float>(p) * position_scale;
    for (int64_t i = 0; i < half; ++i) {
      // Megatron's and HF's angle: position x inv_freq in float32 (its rounding at large positions is part of the
      // RoPE those frameworks train with), then cos / sin of that float32 angle
      const float f = inv_freq[static_cast<size_t>(i)];
      const auto angle = static_cast<double>(position * f);  // (a float32 product)
      c.data<float>()[p * half + i] = static_cast<float>(std::cos(angle));
      s.data<float>()[p * half + i] = static_cast<float>(std::sin(angle));
    }
  }
  return {c.to(device), s.to(device)};
}

}  // namespace mcpp
