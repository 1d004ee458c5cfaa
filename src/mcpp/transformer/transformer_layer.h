// TransformerLayer (pre-norm, Megatron-Core transformer_layer.py):
//   x1 = x  + dropout(self_attention(input_layernorm(x)))      (bias-dropout-add, hidden_dropout)
//   y  = x1 + dropout(mlp(pre_mlp_layernorm(x1)))
// In/out [s, b, h], or [s/tp, b, h] shards with sequence parallelism (norms, dropout and residuals run on
// the shard; hidden dropout then draws from the model-parallel RNG stream, else from the default one).
// Backward returns dx; parameter grads accumulate into main_grad.
// TransformerBlock (transformer_block.py): the stack of layers + final_layernorm.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "mcpp/transformer/attention.h"
#include "mcpp/transformer/mlp.h"
#include "mcpp/transformer/norms.h"

namespace mcpp {

struct TransformerLayerCtx {
  NormCtx input_layernorm;
  SelfAttentionCtx self_attention;
  PhiloxKey attn_dropout_key;
  NormCtx pre_mlp_layernorm;
  MLPCtx mlp;
  PhiloxKey mlp_dropout_key;
  bool dropout = false;
};

class TransformerLayer {
 public:
  TransformerLayer(ParamAndGradBuffer& params, const std::string& prefix, const TransformerConfig& config,
                   const TransformerLayerSpec& spec, const tensor_parallel::TPContext& tp);
  Tensor forward(TransformerLayerCtx& ctx, const Tensor& x, const RopeTables* rope, const ForwardOptions& opt) const;
  Tensor backward(TransformerLayerCtx& ctx, const Tensor& dy, const RopeTables* rope) const;

 private:
  float hidden_dropout_;
  bool sequence_parallel_;
  Norm input_layernorm_;
  SelfAttention self_attention_;
  Norm pre_mlp_layernorm_;
  MLP mlp_;
};

struct TransformerBlockCtx {
  std::vector<TransformerLayerCtx> layers;
  NormCtx final_layernorm;
};

class TransformerBlock {
 public:
  // Builds layers [first_layer, first_layer + num_layers) named decoder.layers.<global index>; the final
  // norm only when post_process (the last pipeline stage holds it).
  TransformerBlock(ParamAndGradBuffer& params, const TransformerConfig& config, const TransformerLayerSpec& spec,
                   const tensor_parallel::TPContext& tp, int64_t first_layer, int64_t num_layers, bool post_process);
  Tensor forward(TransformerBlockCtx& ctx, const Tensor& x, const RopeTables* rope, const ForwardOptions& opt) const;
  Tensor backward(TransformerBlockCtx& ctx, const Tensor& dy, const RopeTables* rope) const;

 private:
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  std::unique_ptr<Norm> final_layernorm_;
};

}  // namespace mcpp
