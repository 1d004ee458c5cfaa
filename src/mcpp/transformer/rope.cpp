#include "mcpp/transformer/rope.h"

#include <cmath>

#include "mcpp/core/error.h"

namespace mcpp {

RopeTables make_rope_tables(int64_t seq_length, int64_t rot_dim, float base, Device device) {
  MCPP_CHECK(rot_dim > 0 && rot_dim % 2 == 0, "rotary dim must be even and positive, got {}", rot_dim);
  const int64_t half = rot_dim / 2;
  Tensor c = Tensor::empty({seq_length, half}), s = Tensor::empty({seq_length, half});
  for (int64_t p = 0; p < seq_length; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      double inv_freq = std::pow(static_cast<double>(base), -2.0 * static_cast<double>(i) / rot_dim);
      double angle = static_cast<double>(p) * inv_freq;
      c.data<float>()[p * half + i] = static_cast<float>(std::cos(angle));
      s.data<float>()[p * half + i] = static_cast<float>(std::sin(angle));
    }
  }
  return {c.to(device), s.to(device)};
}

}  // namespace mcpp
