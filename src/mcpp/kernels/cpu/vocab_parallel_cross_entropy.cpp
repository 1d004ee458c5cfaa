// CPU vocab-parallel cross entropy pieces (ops.inc: vocab_parallel_ce_partials / vocab_parallel_ce_bwd).
// logits[n, Vl] float32 hold vocabulary ids [vocab_start, vocab_start + Vl); targets int32 [n] are global
// ids (any value in [0, V)); rows whose target is outside the slice contribute target_logit 0 and no
// onehot. Partials: row max, sum of exp(logit - row max) accumulated in float64, target logit.
// Backward: dlogits = (exp(logit - lse) - onehot) * dloss, overwritten, may alias logits. OpenMP over rows.
#include <algorithm>
#include <cmath>

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {
namespace {
void check(const char* op, const Tensor& logits, const Tensor& targets, std::initializer_list<const Tensor*> vecs) {
  MCPP_CHECK(logits.is_cpu() && logits.dtype() == DType::F32 && logits.ndim() == 2,
             "{}: logits must be float32 [n, V/tp] on CPU, got {}", op, logits.str());
  const int64_t n = logits.size(0);
  MCPP_CHECK(targets.dtype() == DType::I32 && targets.numel() == n, "{}: targets must be int32 [n={}], got {}", op, n,
             targets.str());
  for (const Tensor* v : vecs)
    MCPP_CHECK(v->dtype() == DType::F32 && v->numel() == n, "{}: per-row tensors must be float32 [n={}], got {}", op,
               n, v->str());
}
}  // namespace

void vocab_parallel_ce_partials(Tensor& row_max, Tensor& sum_exp, Tensor& target_logit, const Tensor& logits,
                                const Tensor& targets, int64_t vocab_start, Stream) {
  check("vocab_parallel_ce_partials", logits, targets, {&row_max, &sum_exp, &target_logit});
  const int64_t n = logits.size(0), V = logits.size(1);
  const float* x = logits.data<float>();
  const int32_t* t = targets.data<int32_t>();
  float* mx = row_max.data<float>();
  float* se = sum_exp.data<float>();
  float* tl = target_logit.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    const float* row = x + r * V;
    const float m = *std::max_element(row, row + V);
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(static_cast<double>(row[v] - m));
    mx[r] = m;
    se[r] = static_cast<float>(s);
    const int64_t local = static_cast<int64_t>(t[r]) - vocab_start;
    tl[r] = (local >= 0 && local < V) ? row[local] : 0.0f;
  }
}

void vocab_parallel_ce_bwd(Tensor& dlogits, const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                           const Tensor& lse, int64_t vocab_start, Stream) {
  check("vocab_parallel_ce_bwd", logits, targets, {&dloss, &lse});
  MCPP_CHECK(dlogits.numel() == logits.numel() && dlogits.dtype() == DType::F32,
             "vocab_parallel_ce_bwd: dlogits must match logits {}, got {}", logits.str(), dlogits.str());
  const int64_t n = logits.size(0), V = logits.size(1);
  const float* x = logits.data<float>();
  float* dx = dlogits.data<float>();
  const int32_t* t = targets.data<int32_t>();
  const float* dl = dloss.data<float>();
  const float* l = lse.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t v = 0; v < V; ++v) dx[r * V + v] = std::exp(x[r * V + v] - l[r]) * dl[r];
    const int64_t local = static_cast<int64_t>(t[r]) - vocab_start;
    if (local >= 0 && local < V) dx[r * V + local] -= dl[r];
  }
}

}  // namespace mcpp::ops::cpu
