// ActivationDims; the contract is in activation_dims.h.
#include "mcpp/transformer/activation_dims.h"

namespace mcpp {

ActivationDims ActivationDims::of(const TransformerConfig& m, const ParallelConfig& parallel, int64_t micro_batch_size,
                                  DType activation_dtype) {
  ActivationDims d;
  d.tp = parallel.tensor_model_parallel_size;
  d.cp = parallel.context_parallel_size;
  d.ep = parallel.expert_model_parallel_size;
  d.etp = parallel.expert_tp();
  d.cp_ring = parallel.cp_ring();
  d.s = m.seq_length / d.cp;
  d.b = micro_batch_size;
  d.n = d.s * d.b;
  d.n_local = parallel.sequence_parallel ? d.n / d.tp : d.n;
  d.h = m.hidden_size;
  d.hn = m.head_dim();
  d.np = m.num_attention_heads / d.tp;
  d.ng = m.num_query_groups / d.tp;
  d.f = m.ffn_hidden_size / d.tp;
  d.e = static_cast<int64_t>(dtype_size(activation_dtype));
  return d;
}

int64_t norm_stats_bytes(const TransformerConfig& m, const ActivationDims& d) {
  return d.n_local * 4 * (m.normalization == Normalization::LayerNorm ? 2 : 1);
}

int64_t fp8_saved_bytes(const ActivationDims& d, int64_t rows, int64_t in, int64_t out) {
  if (d.device == Device::CPU) return (rows * in + out * in) * 4;
  const auto cast = [](int64_t nb) { return (nb + 15) / 16 * 16 + 32; };  // the bytes, the scale_inv slot
  return cast(rows * in) + cast(out * in);
}

bool fp8_keeps_casts(const TransformerConfig& m, int64_t layer) {
  return m.fp8() && m.fp8_recipe != "blockwise" && !m.is_first_last_bf16_layer(layer);
}

}  // namespace mcpp
