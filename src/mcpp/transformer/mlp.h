// MLP (Megatron-Core transformer/mlp.py): x [s, b, h] -> linear_fc1 -> [s, b, f] (GELU) or [s, b, 2f]
// (SwiGLU: rows [gate; up]) -> activation -> [s, b, f] -> linear_fc2 (init scaled by 1/sqrt(2L))
// -> [s, b, h]. Backward mirrors it; parameter grads accumulate into main_grad.
#pragma once
#include <string>

#include "mcpp/transformer/linear.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp {

struct MLPCtx {
  LinearCtx fc1;
  Tensor pre_act;  // [n, f] or [n, 2f]
  LinearCtx fc2;
};

class MLP {
 public:
  MLP(ParamAndGradBuffer& params, const std::string& prefix, const TransformerConfig& config);
  Tensor forward(MLPCtx& ctx, const Tensor& x) const;
  Tensor backward(MLPCtx& ctx, const Tensor& dy) const;

 private:
  bool swiglu_;
  int64_t ffn_;
  Linear linear_fc1_;
  Linear linear_fc2_;
};

}  // namespace mcpp
