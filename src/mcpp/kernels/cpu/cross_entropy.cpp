// CPU cross entropy over logits[n, V] with int32 targets[n] (fused softmax + NLL, no [n, V] probs kept).
//
// Contract:
//   cross_entropy_fwd: loss[n] = logsumexp(logits[r, :]) - logits[r, target[r]];  lse[n] saved.
//   cross_entropy_bwd: dlogits[n, V] = (softmax(logits[r, :]) - onehot(target[r])) * dloss[r], recomputing
//                      softmax from the saved lse. dlogits is OVERWRITTEN and may alias logits (in place:
//                      each element is read before it is written).
//   All float32 on CPU; targets int32 with 0 <= target < V (else mcpp::Error naming the index).
//   Numerically stable: logsumexp subtracts the row max and sums in float64. OpenMP over rows.
#include <algorithm>
#include <cmath>
#include <limits>

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {
namespace {

void check_f32(const Tensor& t, const char* op, const char* field) {
  if (!t.defined() || !t.is_cpu() || t.dtype() != DType::F32)
    fail("{}: {} must be a float32 CPU tensor, got {}", op, field, t.defined() ? t.str() : "undefined");
}

// Shared shape checks: logits [n, V], targets int32 [n], every target in [0, V).
void check_logits_targets(const char* op, const Tensor& logits, const Tensor& targets) {
  check_f32(logits, op, "logits");
  if (logits.ndim() != 2) fail("{}: logits must be [n, V], got {}", op, logits.str());
  if (!targets.defined() || !targets.is_cpu() || targets.dtype() != DType::I32 || targets.ndim() != 1 ||
      targets.size(0) != logits.size(0))
    fail("{}: targets must be int32 [n={}] on CPU, got {}", op, logits.size(0),
         targets.defined() ? targets.str() : "undefined");
  const int64_t n = logits.size(0), V = logits.size(1);
  const int32_t* t = targets.data<int32_t>();
  for (int64_t r = 0; r < n; ++r)
    if (t[r] < 0 || t[r] >= V) fail("{}: targets[{}] = {} outside [0, V={})", op, r, t[r], V);
}

void check_vec(const char* op, const char* field, const Tensor& t, int64_t n) {
  check_f32(t, op, field);
  if (t.ndim() != 1 || t.size(0) != n) fail("{}: {} must be [n={}], got {}", op, field, n, t.str());
}

}  // namespace

void cross_entropy_fwd(Tensor& loss, Tensor& lse, const Tensor& logits, const Tensor& targets, Stream) {
  check_logits_targets("cross_entropy_fwd", logits, targets);
  const int64_t n = logits.size(0), V = logits.size(1);
  check_vec("cross_entropy_fwd", "loss", loss, n);
  check_vec("cross_entropy_fwd", "lse", lse, n);
  const float* x = logits.data<float>();   // [n, V]
  const int32_t* t = targets.data<int32_t>();  // [n]
  float* lo = loss.data<float>();          // [n]
  float* ls = lse.data<float>();           // [n]
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    const float* row = x + r * V;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, row[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(static_cast<double>(row[j] - mx));
    const double l = static_cast<double>(mx) + std::log(sum);
    ls[r] = static_cast<float>(l);
    lo[r] = static_cast<float>(l - static_cast<double>(row[t[r]]));
  }
}

void cross_entropy_bwd(Tensor& dlogits, const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                       const Tensor& lse, Stream) {
  check_logits_targets("cross_entropy_bwd", logits, targets);
  const int64_t n = logits.size(0), V = logits.size(1);
  check_f32(dlogits, "cross_entropy_bwd", "dlogits");
  if (dlogits.shape() != logits.shape())
    fail("cross_entropy_bwd: dlogits must match logits {}, got {}", logits.str(), dlogits.str());
  check_vec("cross_entropy_bwd", "dloss", dloss, n);
  check_vec("cross_entropy_bwd", "lse", lse, n);
  const float* x = logits.data<float>();   // [n, V]
  float* dx = dlogits.data<float>();       // [n, V], may be x
  const int32_t* t = targets.data<int32_t>();
  const float* dl = dloss.data<float>();   // [n]
  const float* ls = lse.data<float>();     // [n]
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    const float* row = x + r * V;
    float* drow = dx + r * V;
    const float l = ls[r], g = dl[r];
    for (int64_t j = 0; j < V; ++j) drow[j] = std::exp(row[j] - l) * g;
    drow[t[r]] -= g;
  }
}

}  // namespace mcpp::ops::cpu
