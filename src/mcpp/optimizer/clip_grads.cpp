// Global L2 norm of the fp32 main grads and clipping by it; contract in clip_grads.h.
#include "mcpp/optimizer/clip_grads.h"

#include <cmath>

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {

double get_grad_norm_fp32(const std::vector<Tensor>& grads, const SumReduceFn& allreduce_sum) {
  double local = 0.0;
  for (const Tensor& g : grads) {
    if (!g.defined()) fail("clip_grad_norm: a gradient tensor is undefined");
    local += ops::sum_of_squares(g);
  }
  const double total = allreduce_sum ? allreduce_sum(local) : local;
  return std::sqrt(total);
}

double clip_grad_norm_fp32(const std::vector<Tensor>& grads, double max_norm, const SumReduceFn& allreduce_sum) {
  const double total_norm = get_grad_norm_fp32(grads, allreduce_sum);
  if (max_norm > 0.0 && std::isfinite(total_norm)) {
    const double clip_coeff = max_norm / (total_norm + 1.0e-6);
    if (clip_coeff < 1.0) {
      for (const Tensor& g : grads) {
        Tensor t = g;  // a handle to the same storage
        ops::scale_inplace(t, static_cast<float>(clip_coeff));
      }
    }
  }
  return total_norm;
}

}  // namespace mcpp
