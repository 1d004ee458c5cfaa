// Rotary position embedding tables (Megatron's RotaryEmbedding): rot_dim = kv_channels * rotary_percent,
// inv_freq[i] = base^(-2i/rot_dim), angle[p, i] = p * inv_freq[i]; cos/sin float32 [s, rot_dim/2] for
// positions 0..s-1, applied by ops::rope_fwd / rope_bwd (non-interleaved rotate_half, as Megatron/HF).
#pragma once
#include "mcpp/core/tensor.h"

namespace mcpp {

struct RopeTables {
  Tensor cos;  // [s, rot_dim/2]
  Tensor sin;  // [s, rot_dim/2]
};

RopeTables make_rope_tables(int64_t seq_length, int64_t rot_dim, float base, Device device);

}  // namespace mcpp
