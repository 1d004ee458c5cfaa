// The four norm forwards of ops.inc behind one call, for tests that run each (either backend): LayerNorm or RMSNorm
// (mean and beta unused), of x itself or with the fused residual add (sum = a + b written into x). An undefined y:
// the statistics only.
#pragma once
#include "mcpp/core/tensor.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::testing {

inline void norm_forward(bool layernorm, bool add, Tensor& x, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& a,
                         const Tensor& b, const Tensor& gamma, const Tensor& beta, float eps) {
  if (add && layernorm) ops::add_layernorm_fwd(x, y, mean, rstd, a, b, gamma, &beta, eps, {});
  else if (add) ops::add_rmsnorm_fwd(x, y, rstd, a, b, gamma, eps, {});
  else if (layernorm) ops::layernorm_fwd(y, mean, rstd, x, gamma, &beta, eps);
  else ops::rmsnorm_fwd(y, rstd, x, gamma, eps);
}

}  // namespace mcpp::testing
