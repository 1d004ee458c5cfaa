// Rotary position embedding tables (Megatron's RotaryEmbedding): rot_dim = kv_channels * rotary_percent,
// inv_freq[i] = base^(-2i/rot_dim), angle[p, i] = p * inv_freq[i]; cos/sin float32 [s, rot_dim/2] for
// positions 0..s-1, applied by ops::rope_fwd / rope_bwd (non-interleaved rotate_half, as Megatron/HF). Computed as
// Megatron and HF compute them, in float32: inv_freq = 1 / base^(float(2i) / rot_dim) (and the scaling below) and
// the angle p * inv_freq rounded to float32 — at thousands of positions an ulp of inv_freq moves the angle by ~1e-4,
// so an imported HF model keeps its logits only with the same arithmetic (2048 positions: 3.4e-6 from
// transformers' fp32 logits, the float64 ones' own distance; with inv_freq correctly rounded instead 6e-5) — then
// cos / sin of that angle (in float64, rounded).
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

// seq_len_interpolation_factor > 0: Megatron's --rotary-seq-len-interpolation-factor (linear position interpolation,
// HF rope_type "linear"): position p enters as p * (1 / factor), in float32.
RopeTables make_rope_tables(int64_t seq_length, int64_t rot_dim, float base, Device device,
                            double scaling_factor = 0.0, double seq_len_interpolation_factor = 0.0);
// YaRN (Megatron's YarnRotaryEmbedding; multi-latent attention's rope_type "yarn"), in Megatron's float32 arithmetic:
// inv_freq = inter (1 - mask) + extra mask, extra = base^(-2i/dim), inter = extra / scaling_factor, mask = 1 - the
// linear ramp clamp((i - low) / (high - low), 0, 1) over the dim/2 pairs, where low / high = floor / ceil of YaRN's
// correction dims dim ln(L / (r 2 pi)) / (2 ln base) for r = beta_fast / beta_slow (L =
// original_max_position_embeddings; clamped to [0, dim - 1]); cos and sin multiplied by the concentration factor
// yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim).
struct YarnOptions {
  double scaling_factor = 1.0, beta_fast = 32.0, beta_slow = 1.0, mscale = 1.0, mscale_all_dim = 0.0;
  int64_t original_max_position_embeddings = 4096;
};
RopeTables make_yarn_rope_tables(int64_t seq_length, int64_t dim, float base, const YarnOptions& y, Device device);
// Per-token tables (packed sequences, packed_seq_params.h: GPTModel gathers cos / sin [s*b, rot/2] at each token's
// position, row is * b + ib). The rope ops index their tables by the first dim of x, so with such tables a
// contiguous x [s, b, ...] is passed as rope_token_rows(x): [s*b, 1, ...] (a view; x itself when the tables have one
// row per position or b = 1).
Tensor rope_token_rows(const Tensor& x, const RopeTables& tables);
// Megatron's _yarn_get_mscale: 0.1 mscale ln(scale) + 1 for scale > 1, else 1.
double yarn_get_mscale(double scale, double mscale);
// The frequency of pair i (the tables' angle per position), with the scaling above when scaling_factor > 0.
float rope_inv_freq(int64_t i, int64_t rot_dim, double base, double scaling_factor = 0.0);

}  // namespace mcpp
