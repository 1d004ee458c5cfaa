// CPU vocab-parallel cross entropy pieces (ops.inc: vocab_parallel_ce_partials / vocab_parallel_ce_bwd).
// logits[n, Vl] float32 hold vocabulary ids [vocab_start, vocab_start + Vl); targets int32 [n] are global
// ids (any value in [0, V)); rows whose target is outside the slice contribute target_logit 0 and no
// onehot. Partials: row max, sum of exp(logit - row max) accumulated in float64, target logit.
// Backward: dlogits = (exp(logit - lse) - onehot) * dloss, overwritten, may alias logits. OpenMP over rows.
// Combine steps (local_lse / rescale / finish): float32 elementwise with std::log / std::exp on floats.
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

namespace {
void check_rows(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> ts) {
  const int64_t n = ts.begin()->second->numel();
  for (const auto& [name, t] : ts)
    MCPP_CHECK(t->defined() && t->is_cpu() && t->dtype() == DType::F32 && t->numel() == n,
               "{}: {} must be float32 [n={}] on CPU, got {}", op, name, n, t->defined() ? t->str() : "undefined");
}
}  // namespace

void vocab_parallel_ce_local_lse(Tensor& local_lse, const Tensor& row_max, const Tensor& sum_exp, Stream) {
  check_rows("vocab_parallel_ce_local_lse", {{"local_lse", &local_lse}, {"row_max", &row_max}, {"sum_exp", &sum_exp}});
  const float *mx = row_max.data<float>(), *se = sum_exp.data<float>();
  float* out = local_lse.data<float>();
  for (int64_t r = 0; r < local_lse.numel(); ++r) out[r] = mx[r] + std::log(se[r]);
}

void vocab_parallel_ce_rescale(Tensor& scaled, const Tensor& local_lse, const Tensor& gmax, Stream) {
  check_rows("vocab_parallel_ce_rescale", {{"scaled", &scaled}, {"local_lse", &local_lse}, {"gmax", &gmax}});
  const float *l = local_lse.data<float>(), *g = gmax.data<float>();
  float* out = scaled.data<float>();
  for (int64_t r = 0; r < scaled.numel(); ++r) out[r] = std::exp(l[r] - g[r]);
}

void vocab_parallel_ce_finish(Tensor& loss, Tensor& lse, const Tensor& gmax, const Tensor& sum_scaled,
                              const Tensor& target_logit, Stream) {
  check_rows("vocab_parallel_ce_finish", {{"loss", &loss}, {"lse", &lse}, {"gmax", &gmax}, {"sum_scaled", &sum_scaled},
                                          {"target_logit", &target_logit}});
  const float *g = gmax.data<float>(), *ss = sum_scaled.data<float>(), *tl = target_logit.data<float>();
  float *lo = loss.data<float>(), *ls = lse.data<float>();
  for (int64_t r = 0; r < loss.numel(); ++r) {
    ls[r] = g[r] + std::log(ss[r]);
    lo[r] = ls[r] - tl[r];
  }
}

}  // namespace mcpp::ops::cpu
