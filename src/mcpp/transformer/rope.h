// Rotary position embedding tables (Megatron's RotaryEmbedding): rot_dim = kv_channels * rotary_percent,
// inv_freq[i] = base^(-2i/rot_dim), angle[p, i] = p * inv_freq[i]; cos/sin float32 [s, rot_dim/2] for
// positions 0..s-1 (computed in float64), applied by ops::rope_fwd / rope_bwd (non-interleaved rotate_half, as
// Megatron/HF).
// scaling_factor > 0: Llama 3.1's frequency scaling (Megatron's RotaryEmbedding._apply_scaling, HF's rope_type
// "llama3"), with L = 8192 (original_max_position_embeddings), wavelength w = 2 pi / inv_freq:
//   w < L / 4 (high frequencies): unchanged;  w > L / 1 (low frequencies): inv_freq / factor;
//   between: (1 - t) inv_freq / factor + t inv_freq with t = (L / w - 1) / (4 - 1).
#pragma once
#include "mcpp/core/tensor.h"

namespace mcpp {

struct RopeTables {
  Tensor cos;  // [s, rot_dim/2]
  Tensor sin;  // [s, rot_dim/2]
};

RopeTables make_rope_tables(int64_t seq_length, int64_t rot_dim, float base, Device device,
                            double scaling_factor = 0.0);
// The frequency of pair i (the tables' angle per position), with the scaling above when scaling_factor > 0.
double rope_inv_freq(int64_t i, int64_t rot_dim, double base, double scaling_factor = 0.0);

}  // namespace mcpp
