#include "mcpp/models/gpt/gpt_layer_specs.h"

#include <fmt/ranges.h>

#include <map>
#include <memory>

#include "mcpp/core/error.h"
#include "mcpp/transformer/attention.h"
#include "mcpp/transformer/mlp.h"
#include "mcpp/transformer/moe/moe_layer.h"
#include "mcpp/transformer/multi_latent_attention.h"
#include "mcpp/transformer/ring_attention.h"

namespace mcpp {

namespace tp = tensor_parallel;

namespace {

using CoreMaker = std::unique_ptr<CoreAttention> (*)(const CoreAttentionOptions&);

const std::map<std::string, CoreMaker>& core_registry() {
  static const std::map<std::string, CoreMaker> registry = {
      {"flash", &make_flash_attention},
      {"unfused", &make_unfused_attention},
  };
  return registry;
}

// The dense MLP behind MlpModule: no RNG draws, no router losses, fc2's bias may ride in the residual stream.
class DenseMlp final : public MlpModule {
 public:
  DenseMlp(ParameterRegistry& params, const std::string& prefix, const TransformerConfig& c,
           const TransformerLayerSpec& spec, const tp::TPContext& t)
      : m_(params, prefix, c, t, spec.linear_fp8) {}
  Tensor forward(SubmoduleCtx& ctx, const Tensor& x, const ForwardOptions& opt) const override {
    return m_.forward(ctx.get<MLPCtx>(), x, opt.fp8_recompute, opt.input_norm);
  }
  Tensor backward(SubmoduleCtx& ctx, const Tensor& dy, float /*loss_grad_scale*/,
                  bool output_bias_grad_elsewhere) const override {
    return m_.backward(ctx.get<MLPCtx>(), dy, output_bias_grad_elsewhere);
  }
  Parameter* output_bias() const override { return m_.output_bias(); }
  void release_input(SubmoduleCtx& ctx) const override { m_.release_input(ctx.get<MLPCtx>()); }
  void restore_input(SubmoduleCtx& ctx, const Tensor& x) const override { m_.restore_input(ctx.get<MLPCtx>(), x); }
  const char* recompute_name() const override { return "mlp"; }
  bool draws_rng() const override { return false; }
  bool fuses_input_norm() const override { return m_.fuses_input_norm(); }

 private:
  MLP m_;
};

// The MoE layer behind MlpModule: the router draws from the RNG streams and records its losses; its output has no
// bias of its own.
class MoeMlp final : public MlpModule {
 public:
  MoeMlp(ParameterRegistry& params, ParameterRegistry& expert_params, const std::string& prefix,
         const TransformerConfig& c, const TransformerLayerSpec& spec, const tp::TPContext& t)
      : m_(std::make_unique<moe::MoELayer>(params, expert_params, prefix, c, t, spec.linear_fp8)) {}
  Tensor forward(SubmoduleCtx& ctx, const Tensor& x, const ForwardOptions& opt) const override {
    MCPP_CHECK(!opt.input_norm, "a MoE layer does not apply its input's norm (the router reads the norm's output)");
    return m_->forward(ctx.get<moe::MoELayerCtx>(), x, opt.moe_losses, opt.training, opt.rng,
                     opt.fp8_recompute);
  }
  Tensor backward(SubmoduleCtx& ctx, const Tensor& dy, float loss_grad_scale,
                  bool /*output_bias_grad_elsewhere*/) const override {
    return m_->backward(ctx.get<moe::MoELayerCtx>(), dy, loss_grad_scale);
  }
  Parameter* output_bias() const override { return nullptr; }
  void release_input(SubmoduleCtx& ctx) const override { m_->release_input(ctx.get<moe::MoELayerCtx>()); }
  void restore_input(SubmoduleCtx& ctx, const Tensor& x) const override {
    m_->restore_input(ctx.get<moe::MoELayerCtx>(), x);
  }
  const char* recompute_name() const override { return "moe"; }
  bool draws_rng() const override { return true; }
  moe::MoELayer* moe_layer() const override { return m_.get(); }

 private:
  std::unique_ptr<moe::MoELayer> m_;
};

}  // namespace

std::vector<std::string> core_attention_names() {
  std::vector<std::string> names;
  for (const auto& [name, _] : core_registry()) names.push_back(name);
  return names;
}

CoreAttentionFactory core_attention_factory(const std::string& name) {
  const auto it = core_registry().find(name);
  if (it == core_registry().end())
    fail("attention_impl: unknown core attention '{}' (registered: {})", name, fmt::join(core_attention_names(), ", "));
  const CoreMaker make = it->second;
  return [make](const CoreAttentionOptions& o, const tp::TPContext& t) -> std::unique_ptr<CoreAttention> {
    if (t.cp_size() > 1 && t.cp_p2p) return make_ring_attention(o, t.cp);  // every head, this CP rank's rows
    return make(o);
  };
}

AttentionFactory self_attention_factory() {
  return [](ParameterRegistry& params, const std::string& prefix, const TransformerConfig& c,
            const TransformerLayerSpec& spec, const tp::TPContext& t) -> std::unique_ptr<AttentionModule> {
    return std::make_unique<AttentionOf<SelfAttention, SelfAttentionCtx>>(params, prefix, c, spec, t);
  };
}

AttentionFactory mla_factory() {
  return [](ParameterRegistry& params, const std::string& prefix, const TransformerConfig& c,
            const TransformerLayerSpec& spec, const tp::TPContext& t) -> std::unique_ptr<AttentionModule> {
    return std::make_unique<AttentionOf<MLASelfAttention, MLASelfAttentionCtx>>(params, prefix, c, spec, t);
  };
}

MlpFactory dense_mlp_factory() {
  return [](ParameterRegistry& params, ParameterRegistry&, const std::string& prefix, const TransformerConfig& c,
            const TransformerLayerSpec& spec, const tp::TPContext& t) -> std::unique_ptr<MlpModule> {
    return std::make_unique<DenseMlp>(params, prefix, c, spec, t);
  };
}

MlpFactory moe_factory() {
  return [](ParameterRegistry& params, ParameterRegistry& expert_params, const std::string& prefix,
            const TransformerConfig& c, const TransformerLayerSpec& spec,
            const tp::TPContext& t) -> std::unique_ptr<MlpModule> {
    return std::make_unique<MoeMlp>(params, expert_params, prefix, c, spec, t);
  };
}

NormFactory norm_factory(const TransformerConfig& c) {
  return [kind = c.normalization, eps = c.norm_epsilon](ParameterRegistry& params, const std::string& prefix,
                                                        int64_t hidden, bool sequence_parallel) {
    return Norm(params, prefix, hidden, kind, eps, sequence_parallel);
  };
}

void set_layer_linear(TransformerLayerSpec& spec, const std::string& linear, const TransformerConfig& c) {
  if (linear == "local") {
    spec.linear_fp8 = {};
  } else if (linear == "fp8") {
    if (!c.fp8()) fail("layer spec: linear 'fp8' needs FP8 on (--fp8-format e4m3|hybrid)");
    spec.linear_fp8 = c.fp8_options();
  } else {
    fail("layer spec: unknown linear implementation '{}' (expected local|fp8)", linear);
  }
  spec.linear = linear;
}

std::string gpt_layer_linear(const TransformerConfig& c, int64_t layer) {
  return c.fp8() && !c.is_first_last_bf16_layer(layer) ? "fp8" : "local";
}

TransformerLayerSpec get_gpt_layer_local_spec(const TransformerConfig& c, LayerMlp mlp, const std::string& linear) {
  const bool mla = c.multi_latent_attention, moe = mlp == LayerMlp::MoE;
  TransformerLayerSpec spec{.core_attention = c.attention_impl,
          .make_core_attention = core_attention_factory(c.attention_impl),
          .attention = mla ? "mla" : "self_attention",
          .make_attention = mla ? mla_factory() : self_attention_factory(),
          .mlp = moe ? "moe" : "mlp",
          .make_mlp = moe ? moe_factory() : dense_mlp_factory(),
          .norm = c.normalization == Normalization::RMSNorm ? "RMSNorm" : "LayerNorm",
          .make_input_layernorm = norm_factory(c),
          .make_pre_mlp_layernorm = norm_factory(c)};
  set_layer_linear(spec, linear, c);
  return spec;
}

TransformerBlockSpec get_gpt_decoder_block_spec(const TransformerConfig& c) {
  TransformerBlockSpec spec{.layer_specs = {}, .make_final_layernorm = norm_factory(c)};
  const std::vector<bool> moe_layers = c.moe_layer_pattern();
  for (int64_t layer = 0; layer < static_cast<int64_t>(moe_layers.size()); ++layer)
    spec.layer_specs.push_back(get_gpt_layer_local_spec(c, moe_layers[static_cast<size_t>(layer)] ? LayerMlp::MoE
                                                                                                  : LayerMlp::Dense,
                                                        gpt_layer_linear(c, layer)));
  return spec;
}

MtpLayerSpec get_gpt_mtp_layer_spec(const TransformerConfig& c, const TransformerLayerSpec& transformer_layer) {
  return {.make_enorm = norm_factory(c),
          .make_hnorm = norm_factory(c),
          .make_final_layernorm = norm_factory(c),
          .transformer_layer = transformer_layer};
}

GPTModelSpec get_gpt_model_spec(const TransformerConfig& c) {
  GPTModelSpec spec{.decoder = get_gpt_decoder_block_spec(c), .mtp_layer = {}};
  if (!spec.decoder.layer_specs.empty())  // Megatron: the decoder's last layer spec
    spec.mtp_layer = get_gpt_mtp_layer_spec(c, spec.decoder.layer_specs.back());
  return spec;
}

}  // namespace mcpp
