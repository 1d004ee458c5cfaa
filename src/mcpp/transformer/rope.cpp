#include "mcpp/transformer/rope.h"

#include <algorithm>
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

namespace {
// cos / sin tables of the float32 angles position x inv_freq[i] (positions times position_scale), times `scale`
// (float32) when it is not 1.
RopeTables tables_of(int64_t seq_length, const std::vector<float>& inv_freq, float position_scale, float scale,
                     Device device) {
  const auto half = static_cast<int64_t>(inv_freq.size());
  Tensor c = Tensor::empty({seq_length, half}), s = Tensor::empty({seq_length, half});
  for (int64_t p = 0; p < seq_length; ++p) {
    const float position = static_cast<float>(p) * position_scale;
    for (int64_t i = 0; i < half; ++i) {
      // Megatron's and HF's angle: position x inv_freq in float32 (its rounding at large positions is part of the
      // RoPE those frameworks train with), then cos / sin of that float32 angle
      const float f = inv_freq[static_cast<size_t>(i)];
      const auto angle = static_cast<double>(position * f);  // (a float32 product)
      c.data<float>()[p * half + i] = static_cast<float>(std::cos(angle)) * scale;
      s.data<float>()[p * half + i] = static_cast<float>(std::sin(angle)) * scale;
    }
  }
  return {c.to(device), s.to(device)};
}
}  // namespace

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
  return tables_of(seq_length, inv_freq, position_scale, 1.0f, device);
}

double yarn_get_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

RopeTables make_yarn_rope_tables(int64_t seq_length, int64_t dim, float base, const YarnOptions& y, Device device) {
  MCPP_CHECK(dim > 0 && dim % 2 == 0, "rotary dim must be even and positive, got {}", dim);
  const int64_t half = dim / 2;
  constexpr double kPi = 3.14159265358979323846;
  const auto correction_dim = [&](double rotations) {  // Megatron's _yarn_find_correction_dim (float64)
    return static_cast<double>(dim) *
           std::log(static_cast<double>(y.original_max_position_embeddings) / (rotations * 2.0 * kPi)) /
           (2.0 * std::log(static_cast<double>(base)));
  };
  double low = std::max(std::floor(correction_dim(y.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(y.beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // Megatron's guard against a zero-width ramp
  const auto factor = static_cast<float>(y.scaling_factor);
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float pw = std::pow(base, static_cast<float>(2 * i) / static_cast<float>(dim));
    const float extra = 1.0f / pw, inter = 1.0f / (factor * pw);
    const float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low),
                                  0.0f, 1.0f);
    const float mask = 1.0f - ramp;
    inv_freq[static_cast<size_t>(i)] = inter * (1.0f - mask) + extra * mask;
  }
  const auto concentration =
      static_cast<float>(yarn_get_mscale(y.scaling_factor, y.mscale) / yarn_get_mscale(y.scaling_factor, y.mscale_all_dim));
  return tables_of(seq_length, inv_freq, 1.0f, concentration, device);
}

Tensor rope_token_rows(const Tensor& x, const RopeTables& tables) {
  const int64_t s = x.size(0), b = x.size(1);
  if (tables.cos.size(0) == s || b == 1) return x;
  MCPP_CHECK(tables.cos.size(0) == s * b, "rotary tables of {} rows for a [s={}, b={}] input", tables.cos.size(0), s, b);
  Shape shape = x.shape();
  shape[0] = s * b;
  shape[1] = 1;
  return x.view(shape);
}

}  // namespace mcpp
