// ModuleSpec (Megatron-Core's ModuleSpec / TransformerLayerSubmodules): what a transformer layer is built from.
// A TransformerLayerSpec names one implementation of each replaceable part — the attention (SelfAttention or
// MLASelfAttention), its core attention (flash / unfused; the ring form under --cp-comm-type p2p), the MLP (dense
// MLP or MoELayer) and the two norms — as factories, and the implementation of the layer's linears ("local": the
// model's dtype, or "fp8": FP8 GEMMs with its Fp8Options; Megatron's spec names TE or local linear modules);
// models/gpt/gpt_layer_specs.h chooses them from the config (as Megatron's get_gpt_layer_local_spec). The layer
// holds one AttentionModule and one MlpModule behind the small interfaces below and never names an implementation.
// The modules build their Column/RowParallelLinears with spec.linear_fp8 (attention linear_qkv / linear_proj, MLP
// and shared-expert linear_fc1 / linear_fc2), never with the config's FP8 fields. The model's other linears — the
// output layer, the MTP depths' eh_proj and output layer, MLA's down/up projections, the routed experts — and the
// embeddings are not the layer spec's: they stay in the model's dtype.
//
// Adding an attention (or MLP) variant: write the module (its class with forward(ctx, ...) / backward(ctx, ...) over
// its own *Ctx struct, and for_each_tensor(const ItsCtx&, visitor) beside it for the activation-memory walk), then
// add its factory to models/gpt/gpt_layer_specs.cpp (std::make_unique<AttentionOf<ItsClass, ItsCtx>>(...)). Nothing
// else changes: not the layer, the block, the model or the memory walk.
//
// Contexts: a submodule's saved state lives in a SubmoduleCtx the caller owns inside TransformerLayerCtx (DESIGN.md
// decision 1); the layer passes the box to its module, which fills it with its own Ctx type on the forward. Copying
// a box copies the Ctx (its tensors are shared handles, as copying the Ctx struct itself); as<Ctx>() reads it back
// (tests, tools).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mcpp/core/error.h"
#include "mcpp/core/tensor.h"
#include "mcpp/transformer/ctx_tensors.h"
#include "mcpp/tensor_parallel/tp_context.h"
#include "mcpp/tensor_parallel/fp8_options.h"
#include "mcpp/transformer/dot_product_attention.h"
#include "mcpp/transformer/module.h"
#include "mcpp/transformer/norms.h"
#include "mcpp/transformer/rope.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp {

namespace moe {
class MoELayer;
}

// A submodule context of any type, owned by value (copy = a copy of the Ctx struct).
class SubmoduleCtx {
 public:
  SubmoduleCtx() = default;
  SubmoduleCtx(const SubmoduleCtx& o) : p_(o.p_ ? o.p_->clone() : nullptr) {}
  SubmoduleCtx(SubmoduleCtx&&) noexcept = default;
  SubmoduleCtx& operator=(const SubmoduleCtx& o) {
    if (this != &o) p_ = o.p_ ? o.p_->clone() : nullptr;
    return *this;
  }
  SubmoduleCtx& operator=(SubmoduleCtx&&) noexcept = default;

  // The Ctx held, default-constructed first when empty (a module's forward).
  template <class Ctx>
  Ctx& get() {
    if (!p_) p_ = std::make_unique<Holder<Ctx>>();
    auto* h = dynamic_cast<Holder<Ctx>*>(p_.get());
    if (!h) throw_wrong_type();
    return h->value;
  }
  // The Ctx held, or null when empty or of another type.
  template <class Ctx>
  const Ctx* as() const {
    auto* h = dynamic_cast<const Holder<Ctx>*>(p_.get());
    return h ? &h->value : nullptr;
  }
  bool empty() const { return p_ == nullptr; }
  void reset() { p_.reset(); }
  void for_each_tensor(const TensorVisitor& f) const {
    if (p_) p_->for_each_tensor(f);
  }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual std::unique_ptr<Base> clone() const = 0;
    virtual void for_each_tensor(const TensorVisitor& f) const = 0;
  };
  template <class Ctx>
  struct Holder final : Base {
    Ctx value;
    std::unique_ptr<Base> clone() const override { return std::make_unique<Holder>(*this); }
    void for_each_tensor(const TensorVisitor& f) const override { visit_ctx_tensors(value, f); }
  };
  [[noreturn]] static void throw_wrong_type();
  std::unique_ptr<Base> p_;
};

// The layer's attention: x [s(/tp), b, h] -> [s(/tp), b, h] (linear_proj's output, before the residual add).
class AttentionModule {
 public:
  virtual ~AttentionModule() = default;
  virtual Tensor forward(SubmoduleCtx& ctx, const Tensor& x, const RopeTables* rope,
                         const ForwardOptions& opt) const = 0;
  // output_bias_grad_elsewhere: linear_proj's bias grad is taken from the residual stream (output_bias()).
  virtual Tensor backward(SubmoduleCtx& ctx, const Tensor& dy, const RopeTables* rope,
                          bool output_bias_grad_elsewhere) const = 0;
  virtual Parameter* output_bias() const = 0;  // RowParallelLinear::residual_bias, or null
  // Selective recompute "layernorm": drop the input the first linear keeps / set it again before the backward.
  virtual void release_input(SubmoduleCtx& ctx) const = 0;
  virtual void restore_input(SubmoduleCtx& ctx, const Tensor& x) const = 0;
  // Whether forward takes ForwardOptions::input_norm (its first linear applies the input's norm in an FP8 cast).
  virtual bool fuses_input_norm() const { return false; }
};

// The layer's MLP: x [s(/tp), b, h] -> [s(/tp), b, h] (before the residual add).
class MlpModule {
 public:
  virtual ~MlpModule() = default;
  // opt: training, the RNG streams (MoE router noise), the MoE loss tracker (null: not recorded, e.g. a re-run).
  virtual Tensor forward(SubmoduleCtx& ctx, const Tensor& x, const ForwardOptions& opt) const = 0;
  // loss_grad_scale: the MoE router losses' coefficient; output_bias_grad_elsewhere: fc2's bias grad is taken from
  // the residual stream (output_bias()).
  virtual Tensor backward(SubmoduleCtx& ctx, const Tensor& dy, float loss_grad_scale,
                          bool output_bias_grad_elsewhere) const = 0;
  virtual Parameter* output_bias() const = 0;  // null when the output has no bias of its own (MoE)
  virtual void release_input(SubmoduleCtx& ctx) const = 0;
  virtual void restore_input(SubmoduleCtx& ctx, const Tensor& x) const = 0;
  // Selective recompute's name for this MLP ("mlp" dense, "moe" MoE) and whether its forward draws from the RNG
  // streams (then a recompute re-run replays a copy of them).
  virtual const char* recompute_name() const = 0;
  virtual bool draws_rng() const = 0;
  virtual moe::MoELayer* moe_layer() const { return nullptr; }  // the router lives here (the trainer's bias update)
  virtual bool fuses_input_norm() const { return false; }  // as AttentionModule's
};

// Adapters: a module class M with forward(Ctx&, ...) / backward(Ctx&, ...) as SelfAttention's, behind
// AttentionModule. M's constructor arguments are forwarded.
template <class M, class Ctx>
class AttentionOf final : public AttentionModule {
 public:
  template <class... Args>
  explicit AttentionOf(Args&&... args) : m_(std::forward<Args>(args)...) {}
  Tensor forward(SubmoduleCtx& ctx, const Tensor& x, const RopeTables* rope, const ForwardOptions& opt) const override {
    MCPP_CHECK(!opt.input_norm || fuses_input_norm(), "this attention does not apply its input's norm");
    return m_.forward(ctx.get<Ctx>(), x, rope, opt);
  }
  Tensor backward(SubmoduleCtx& ctx, const Tensor& dy, const RopeTables* rope,
                  bool output_bias_grad_elsewhere) const override {
    return m_.backward(ctx.get<Ctx>(), dy, rope, output_bias_grad_elsewhere);
  }
  Parameter* output_bias() const override { return m_.output_bias(); }
  void release_input(SubmoduleCtx& ctx) const override { m_.release_input(ctx.get<Ctx>()); }
  void restore_input(SubmoduleCtx& ctx, const Tensor& x) const override { m_.restore_input(ctx.get<Ctx>(), x); }
  bool fuses_input_norm() const override {
    if constexpr (requires { m_.fuses_input_norm(); }) return m_.fuses_input_norm();
    return false;
  }
  const M& module() const { return m_; }

 private:
  M m_;
};

// Builders, called by the layer in Megatron's registration order (input_layernorm, self_attention,
// pre_mlp_layernorm, mlp): each registers its parameters under `prefix`.
using CoreAttentionFactory =
    std::function<std::unique_ptr<CoreAttention>(const CoreAttentionOptions&, const tensor_parallel::TPContext&)>;
struct TransformerLayerSpec;
using AttentionFactory = std::function<std::unique_ptr<AttentionModule>(
    ParameterRegistry& params, const std::string& prefix, const TransformerConfig& config,
    const TransformerLayerSpec& spec, const tensor_parallel::TPContext& tp)>;
// expert_params: where a MoE layer registers its experts (moe_layer.h).
using MlpFactory = std::function<std::unique_ptr<MlpModule>(
    ParameterRegistry& params, ParameterRegistry& expert_params, const std::string& prefix,
    const TransformerConfig& config, const TransformerLayerSpec& spec, const tensor_parallel::TPContext& tp)>;
// A norm over `hidden` channels (sequence_parallel: it runs on [s/tp, b, h] shards).
using NormFactory = std::function<Norm(ParameterRegistry& params, const std::string& prefix, int64_t hidden,
                                       bool sequence_parallel)>;

// One layer's parts; each name says which implementation its factory builds (logs, tests, errors).
struct TransformerLayerSpec {
  std::string core_attention;  // "flash" | "unfused" (| "ring" under cp p2p, chosen by the factory)
  CoreAttentionFactory make_core_attention;
  std::string attention;  // "self_attention" | "mla"
  AttentionFactory make_attention;
  std::string mlp;  // "mlp" | "moe"
  MlpFactory make_mlp;
  std::string norm;  // "LayerNorm" | "RMSNorm"
  NormFactory make_input_layernorm, make_pre_mlp_layernorm;
  std::string linear = "local";  // "local" (the model's dtype) | "fp8" (FP8 GEMMs, recipe in linear_fp8)
  tensor_parallel::Fp8Options linear_fp8;  // what the layer's linears get (enabled only for "fp8")
};

// Megatron's TransformerBlockSubmodules: one layer spec per decoder layer (global index) and the final norm.
struct TransformerBlockSpec {
  std::vector<TransformerLayerSpec> layer_specs;
  NormFactory make_final_layernorm;
};

}  // namespace mcpp
