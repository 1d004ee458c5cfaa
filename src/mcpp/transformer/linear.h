// Linear layer with Megatron's weight layout W[out, in]:  y[n, out] = x[n, in] @ W^T (+ b[out]).
// Backward: dW, db ACCUMULATE into main_grad; dx is returned (overwritten). Saves x in LinearCtx.
// (Tensor-parallel Column/Row variants wrap the same math in tensor_parallel/ — distributed issue.)
#pragma once
#include <string>

#include "mcpp/core/tensor.h"
#include "mcpp/distributed/param_and_grad_buffer.h"

namespace mcpp {

struct LinearCtx {
  Tensor x;  // [n, in]
};

struct LinearOptions {
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool bias = true;
  float init_std = 0.02f;
};

class Linear {
 public:
  Linear(ParamAndGradBuffer& params, const std::string& prefix, const LinearOptions& opt);
  Tensor forward(LinearCtx& ctx, const Tensor& x) const;  // x [..., in] -> [..., out]
  Tensor backward(LinearCtx& ctx, const Tensor& dy, bool need_dx = true) const;  // -> dx [..., in]
  Parameter* weight() const { return weight_; }
  Parameter* bias() const { return bias_; }

 private:
  Parameter* weight_ = nullptr;  // [out, in]
  Parameter* bias_ = nullptr;    // [out] or null
  int64_t in_ = 0, out_ = 0;
};

}  // namespace mcpp
