// Megatron's num_floating_point_operations (transformer_flops) and the recompute forwards on top of it (flops.h).
#include "mcpp/training/flops.h"

#include <algorithm>
#include <array>
#include <string_view>

namespace mcpp {
namespace {

// Per token of one layer kind, the forward + backward FLOPs (3 passes x 2 per multiply-add), as Megatron groups them.
struct LayerFlops {
  double attn = 0;     // the attention's token-linear part (projections)
  double core = 0;     // the core attention, per token per token of its sequence (x s^2 per sample)
  double dense = 0;    // a dense layer's MLP
  double routed = 0;   // a MoE layer's routed experts (top-k)
  double shared = 0;   // a MoE layer's shared expert
};

struct ModelFlops {
  LayerFlops layer;
  double dec_layers = 0, dec_dense = 0, dec_moe = 0;  // the decoder's layers, dense and MoE ones
  double mtp_layers = 0, mtp_dense = 0, mtp_moe = 0;  // the MTP depths' layers (the decoder's last kind)
  double mtp_extra = 0;  // per token: the depths' eh_proj and norms
  double logits = 0;     // per token: every logits pass (depths + 1)
  double tokens = 0, seqsq = 0;
  // The layers' FLOPs: count x (token-linear x tokens + core x sum of squared lengths).
  double layers(double n_layers, double n_dense, double n_moe) const {
    return tokens * (n_layers * layer.attn + n_dense * layer.dense + n_moe * (layer.routed + layer.shared)) +
           seqsq * n_layers * layer.core;
  }
  double total() const {
    return layers(dec_layers + mtp_layers, dec_dense + mtp_dense, dec_moe + mtp_moe) +
           tokens * (mtp_extra + logits);
  }
};

ModelFlops model_flops(const Config& c, int64_t batch_size) {
  const TransformerConfig& m = c.model;
  constexpr double kPasses = 3.0, kFma = 2.0, k6 = kPasses * kFma;
  const auto h = static_cast<double>(m.hidden_size);
  const auto heads = static_cast<double>(m.num_attention_heads);
  const double ffn_factor = m.swiglu ? 3.0 : 2.0;  // SwiGLU: h -> 2f and f -> h; GELU: h -> f and f -> h
  ModelFlops f;
  const auto s = static_cast<double>(m.seq_length);
  f.tokens = static_cast<double>(batch_size) * s;
  f.seqsq = static_cast<double>(batch_size) * s * s;
  if (m.multi_latent_attention) {
    const auto qk = static_cast<double>(m.qk_head_dim), pe = static_cast<double>(m.qk_pos_emb_head_dim),
               v = static_cast<double>(m.v_head_dim), kv_lora = static_cast<double>(m.kv_lora_rank);
    const double q_term = m.q_lora_rank == 0 ? h * heads * (qk + pe)
                                             : static_cast<double>(m.q_lora_rank) * (h + heads * (qk + pe) + 1.0);
    f.layer.attn = k6 * (q_term + kv_lora * (h + heads * (qk + v) + 1.0) + h * pe + heads * v * h);
    f.layer.core = k6 * (heads * (qk + pe) / 2.0 + heads * v / 2.0);
  } else {
    const auto d = static_cast<double>(m.kv_channels);
    const auto groups = static_cast<double>(m.num_query_groups > 0 ? m.num_query_groups : m.num_attention_heads);
    const double q = d * heads, kv = d * groups;
    f.layer.attn = k6 * (h * (q + 2.0 * kv) + q * h);
    f.layer.core = k6 * q / 2.0 * 2.0;  // causal: half the scores; QK^T and AV
  }
  f.layer.dense = k6 * h * static_cast<double>(m.ffn_hidden_size) * ffn_factor;
  bool last_is_moe = false;
  double moe_layers = 0;
  if (m.num_moe_experts > 0) {
    const std::vector<bool> pattern = m.moe_layer_pattern();
    moe_layers = static_cast<double>(std::count(pattern.begin(), pattern.end(), true));
    last_is_moe = !pattern.empty() && pattern.back();
    const auto moe_ffn = static_cast<double>(m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size : m.ffn_hidden_size);
    f.layer.routed = k6 * h * moe_ffn * static_cast<double>(m.moe_router_topk) * ffn_factor;
    f.layer.shared = k6 * h * static_cast<double>(m.moe_shared_expert_intermediate_size) * ffn_factor;
  }
  f.dec_layers = static_cast<double>(m.num_layers);
  f.dec_moe = moe_layers;
  f.dec_dense = f.dec_layers - moe_layers;
  const auto mtp = static_cast<double>(m.mtp_num_layers);
  f.mtp_layers = mtp;
  (last_is_moe ? f.mtp_moe : f.mtp_dense) = mtp;
  f.mtp_extra = k6 * mtp * (3.0 * h + 2.0 * h * h);
  f.logits = k6 * h * static_cast<double>(m.padded_vocab_size) * (mtp + 1.0);
  return f;
}

}  // namespace

double num_floating_point_operations(const Config& config, int64_t batch_size) {
  return model_flops(config, batch_size).total();
}

double hardware_floating_point_operations(const Config& config, int64_t batch_size) {
  const ModelFlops f = model_flops(config, batch_size);
  const TransformerConfig& m = config.model;
  double extra = 0;  // the re-run forwards: a third of the recomputed parts' forward + backward FLOPs
  if (m.recompute_granularity == "full") {
    // uniform: every layer (in groups of recompute_num_layers); block: the first recompute_num_layers of each of
    // the pp x vpp model chunks.
    double fraction = 1.0;
    if (m.recompute_method == "block") {
      const auto& p = config.parallel;
      const int64_t pp = p.pipeline_model_parallel_size, per_vp = p.num_layers_per_virtual_pipeline_stage;
      const int64_t chunks = pp * (per_vp > 0 ? m.num_layers / pp / per_vp : 1);
      fraction =
          std::min(1.0, static_cast<double>(m.recompute_num_layers * chunks) / static_cast<double>(m.num_layers));
    }
    extra += fraction * f.layers(f.dec_layers, f.dec_dense, f.dec_moe) / 3.0;
    if (m.recomputes_mtp_depths()) extra += f.layers(f.mtp_layers, f.mtp_dense, f.mtp_moe) / 3.0;
  } else if (m.recompute_granularity == "selective") {
    const double layers = f.dec_layers + f.mtp_layers, dense = f.dec_dense + f.mtp_dense, moe = f.dec_moe + f.mtp_moe;
    if (m.recomputes("core_attn")) extra += f.seqsq * layers * f.layer.core / 3.0;
    if (m.recomputes("mlp")) extra += f.tokens * dense * f.layer.dense / 3.0;
    if (m.recomputes("moe")) extra += f.tokens * moe * (f.layer.routed + f.layer.shared) / 3.0;
    else if (m.recomputes("shared_experts")) extra += f.tokens * moe * f.layer.shared / 3.0;
  }
  return f.total() + extra;
}

double known_gpu_peak_tflops(const std::string& name) {
  // Dense bf16 tensor-core peaks (NVIDIA's data sheets, without sparsity). Order matters: the first match wins.
  struct Entry {
    std::string_view key;
    double tflops;
  };
  static constexpr std::array<Entry, 6> kTable{{{"H100 PCIe", 756.0},
                                                {"H100 NVL", 835.0},
                                                {"H100", 989.0},  // SXM5 ("NVIDIA H100 80GB HBM3")
                                                {"H200", 989.0},
                                                {"GH200", 989.0},
                                                {"A100", 312.0}}};
  for (const Entry& e : kTable)
    if (name.find(e.key) != std::string::npos) return e.tflops;
  return 0.0;
}

double peak_tflops(double flag_tflops, const std::string& device_name, bool bf16) {
  if (flag_tflops > 0.0) return flag_tflops;
  return bf16 ? known_gpu_peak_tflops(device_name) : 0.0;
}

}  // namespace mcpp
