// CPU cross entropy over logits[n, V] with int32 targets[n] (fused softmax + NLL, no [n, V] probs kept).
//
// Contract:
//   cross_entropy_fwd: loss[n] = logsumexp(logits[r, :]) - logits[r, target[r]];  lse[n] saved.
//   cross_entropy_bwd: dlogits[n, V] = (softmax(logits[r, :]) - onehot(target[r])) * dloss[r], recomputing
//                      softmax from the saved lse. dlogits is OVERWRITTEN and may alias logits (in place:
//                      each element is read before it is written).
//   masked_loss_stats: stats[2] = {sum loss*mask, sum mask} in float64, index order, stored float32.
//   masked_loss_grad:  dloss = mask * coef, coef = grad_scale (per token) or float(grad_scale / stats[1]).
//   All float32 on CPU; targets int32 with 0 <= target < V (else mcpp::Error naming the index).
//   Numerically stable: logsumexp subtracts the row max. OpenMP over rows; each row is computed by one
//   thread in a fixed order, so results do not depend on the thread count (deterministic).
// Speed (the [b*s, V=50304] logits of the LM head dominate a small GPT step): exp is detail::exp_approx
// (vec_math.h: within 1 ulp, vectorizes); the row loops are MCPP_VEC_CLONES (AVX-512 where present); the row
// max is a 16-lane vector max (exact in any order); the row sum runs in kLanes float partial sums over
// kChunk-element chunks (each lane adds kChunk/kLanes = 16 terms <= 1: <= ~16 ulp relative) and adds the
// chunk partials in float64. A masked token (dloss = 0) gets dlogits = 0 without the exps.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "mcpp/core/error.h"
#include "mcpp/kernels/cpu/vec_math.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {
namespace {
using detail::exp_approx;

// Max over row[0, V). Explicit 16-lane vector (GCC vector extension; the compare-select stays a vector op,
// which a plain or `omp simd` loop does not under -ftrapping-math). Exact in any order.
MCPP_VEC_CLONES float row_max(const float* row, int64_t V) {
  using v16f = float __attribute__((vector_size(64)));
  constexpr int64_t kLanes = 16;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  v16f m{kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf,
         kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf};
  int64_t j = 0;
  for (; j + kLanes <= V; j += kLanes) {
    v16f x;
    std::memcpy(&x, row + j, sizeof(x));
    m = x > m ? x : m;
  }
  float mx = kNegInf;
  for (int64_t l = 0; l < kLanes; ++l) mx = std::max(mx, m[l]);
  for (; j < V; ++j) mx = std::max(mx, row[j]);
  return mx;
}

// sum_j exp(row[j] - shift) for shift >= max(row): float lanes within a chunk, float64 across chunks.
MCPP_VEC_CLONES double row_sum_exp(const float* row, int64_t V, float shift) {
  constexpr int64_t kLanes = 16, kChunk = 256;
  double sum = 0.0;
  for (int64_t c0 = 0; c0 < V; c0 += kChunk) {
    const int64_t c1 = std::min(V, c0 + kChunk);
    float acc[kLanes] = {};
    int64_t j = c0;
    for (; j + kLanes <= c1; j += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) acc[l] += exp_approx(row[j + l] - shift);  // vectorized
    for (; j < c1; ++j) acc[0] += exp_approx(row[j] - shift);
    for (int64_t l = 0; l < kLanes; ++l) sum += static_cast<double>(acc[l]);
  }
  return sum;
}

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

// drow[j] = exp(row[j] - lse) * g (softmax times the loss gradient); drow may alias row.
MCPP_VEC_CLONES void row_softmax_scaled(float* drow, const float* row, int64_t V, float lse, float g) {
  for (int64_t j = 0; j < V; ++j) drow[j] = exp_approx(row[j] - lse) * g;  // vectorized; row[j] - lse <= ~0
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
    const float mx = row_max(row, V);
    const double sum = row_sum_exp(row, V, mx);
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
    if (g == 0.0f) {  // masked token: softmax * 0 (finite logits), skip the exps
      std::fill_n(drow, V, 0.0f);
      continue;
    }
    row_softmax_scaled(drow, row, V, l, g);
    drow[t[r]] -= g;
  }
}

void cross_entropy_fwd_bwd(Tensor& loss, Tensor& lse, Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                           const Tensor& dloss, Stream s) {
  cross_entropy_fwd(loss, lse, logits, targets, s);
  cross_entropy_bwd(dlogits, dloss, logits, targets, lse, s);
}

void masked_loss_stats(Tensor& stats, const Tensor& loss, const Tensor& mask, Stream) {
  check_f32(loss, "masked_loss_stats", "loss");
  if (loss.ndim() != 1) fail("masked_loss_stats: loss must be [n], got {}", loss.str());
  const int64_t n = loss.size(0);
  check_vec("masked_loss_stats", "mask", mask, n);
  check_vec("masked_loss_stats", "stats", stats, 2);
  const float* lo = loss.data<float>();
  const float* m = mask.data<float>();
  double sum = 0, count = 0;
  for (int64_t i = 0; i < n; ++i) {
    sum += static_cast<double>(lo[i]) * m[i];
    count += m[i];
  }
  stats.data<float>()[0] = static_cast<float>(sum);
  stats.data<float>()[1] = static_cast<float>(count);
}

void masked_loss_grad(Tensor& dloss, const Tensor& mask, const Tensor& stats, float grad_scale, bool per_token,
                      Stream) {
  check_f32(mask, "masked_loss_grad", "mask");
  if (mask.ndim() != 1) fail("masked_loss_grad: mask must be [n], got {}", mask.str());
  const int64_t n = mask.size(0);
  check_vec("masked_loss_grad", "dloss", dloss, n);
  check_vec("masked_loss_grad", "stats", stats, 2);
  const double count = stats.data<float>()[1];
  const float coef = per_token ? grad_scale : count > 0 ? static_cast<float>(grad_scale / count) : 0.0f;
  const float* m = mask.data<float>();
  float* d = dloss.data<float>();
  for (int64_t i = 0; i < n; ++i) d[i] = m[i] * coef;
}

}  // namespace mcpp::ops::cpu
