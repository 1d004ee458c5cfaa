// CPU mixture-of-experts ops (ops.inc), the reference for the CUDA kernels:
//   row movement (moe_permute / moe_unpermute / moe_unpermute_bwd): float32 activations; idx int32 [n, k] of
//     distinct rows < m, or -1 (a dropped route); w, dw float32 [n, k]. Sums over a token's k routes run in route order, in float32 (as
//     the CUDA kernels accumulate).
//   the router (moe_topk_softmax / _bwd, moe_route_positions, moe_capacity_positions): float32 logits, per token;
//     softmax sums in double.
//     Tokens are split over OpenMP threads; every value is computed the same way on any thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "mcpp/kernels/cpu/checks.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {
namespace {

struct Routes {
  int64_t n, k, m, h;
};

// idx [n, k] int32 against x-like rows [n, h] and buffer rows [m, h]; every entry in [0, m).
Routes check_routes(const char* op, const Tensor& tokens, const char* tokens_name, const Tensor& buffer,
                    const char* buffer_name, const Tensor& idx) {
  detail::require_cpu_f32(op, tokens_name, tokens);
  detail::require_cpu_f32(op, buffer_name, buffer);
  MCPP_CHECK(idx.defined() && idx.is_cpu() && idx.dtype() == DType::I32 && idx.ndim() == 2,
             "{}: idx must be a CPU int32 [n, k] tensor; got {}", op, idx.defined() ? idx.str() : "undefined");
  MCPP_CHECK(tokens.ndim() == 2 && buffer.ndim() == 2 && tokens.size(1) == buffer.size(1) &&
                 tokens.size(0) == idx.size(0),
             "{}: {} must be [n={}, h] and {} [m, h] with the same h; got {} and {}", op, tokens_name, idx.size(0),
             buffer_name, tokens.str(), buffer.str());
  const Routes r{idx.size(0), idx.size(1), buffer.size(0), tokens.size(1)};
  const int32_t* p = idx.data<int32_t>();
  for (int64_t j = 0; j < r.n * r.k; ++j)
    MCPP_CHECK(p[j] >= -1 && p[j] < r.m, "{}: idx entry {} = {} is not a row of {} (m = {}) or -1 (dropped)", op,
               j, p[j], buffer_name, r.m);
  return r;
}

void check_weights(const char* op, const char* arg, const Tensor& w, const Routes& r) {
  detail::require_cpu_f32(op, arg, w);
  MCPP_CHECK(w.ndim() == 2 && w.size(0) == r.n && w.size(1) == r.k, "{}: {} must be [n={}, k={}]; got {}", op, arg,
             r.n, r.k, w.str());
}

}  // namespace

void moe_permute(Tensor& out, const Tensor& x, const Tensor& idx, Stream) {
  const Routes r = check_routes("moe_permute", x, "x", out, "out", idx);
  const int32_t* ip = idx.data<int32_t>();
  const float* xp = x.data<float>();
  float* op = out.data<float>();
  for (int64_t t = 0; t < r.n; ++t)
    for (int64_t i = 0; i < r.k; ++i)
      if (ip[t * r.k + i] >= 0)
        std::memcpy(op + ip[t * r.k + i] * r.h, xp + t * r.h, static_cast<size_t>(r.h) * sizeof(float));
}

void moe_unpermute(Tensor& y, const Tensor& in, const Tensor& idx, const Tensor* w, Stream) {
  const Routes r = check_routes("moe_unpermute", y, "y", in, "in", idx);
  if (w) check_weights("moe_unpermute", "w", *w, r);
  const int32_t* ip = idx.data<int32_t>();
  const float* src = in.data<float>();
  const float* wp = w ? w->data<float>() : nullptr;
  float* yp = y.data<float>();
  for (int64_t t = 0; t < r.n; ++t) {
    float* row = yp + t * r.h;
    for (int64_t c = 0; c < r.h; ++c) row[c] = 0.0f;
    for (int64_t i = 0; i < r.k; ++i) {
      if (ip[t * r.k + i] < 0) continue;  // dropped
      const float wi = wp ? wp[t * r.k + i] : 1.0f;
      const float* s = src + ip[t * r.k + i] * r.h;
      for (int64_t c = 0; c < r.h; ++c) row[c] += wi * s[c];
    }
  }
}

void moe_unpermute_bwd(Tensor& din, Tensor& dw, const Tensor& dy, const Tensor& in, const Tensor& idx,
                       const Tensor& w, Stream) {
  const Routes r = check_routes("moe_unpermute_bwd", dy, "dy", in, "in", idx);
  detail::require_same_shape("moe_unpermute_bwd", "din", din, "in", in);
  detail::require_cpu_f32("moe_unpermute_bwd", "din", din);
  check_weights("moe_unpermute_bwd", "w", w, r);
  check_weights("moe_unpermute_bwd", "dw", dw, r);
  const int32_t* ip = idx.data<int32_t>();
  const float *dyp = dy.data<float>(), *src = in.data<float>(), *wp = w.data<float>();
  float *dinp = din.data<float>(), *dwp = dw.data<float>();
  for (int64_t t = 0; t < r.n; ++t) {
    const float* g = dyp + t * r.h;
    for (int64_t i = 0; i < r.k; ++i) {
      const int64_t j = ip[t * r.k + i];
      if (j < 0) {  // dropped: no row, no weight gradient
        dwp[t * r.k + i] = 0.0f;
        continue;
      }
      const float wi = wp[t * r.k + i];
      const float* s = src + j * r.h;
      float* d = dinp + j * r.h;
      float dot = 0.0f;
      for (int64_t c = 0; c < r.h; ++c) {
        dot += g[c] * s[c];
        d[c] = wi * g[c];
      }
      dwp[t * r.k + i] = dot;
    }
  }
}

namespace {
// softmax of v[0..n) into out (double accumulation); returns logsumexp.
double softmax_into(const float* v, int64_t n, float* out) {
  const float mx = *std::max_element(v, v + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(v[i]) - mx);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(std::exp(static_cast<double>(v[i]) - mx) / sum);
  return mx + std::log(sum);
}

void check_i32(const char* op, const char* arg, const Tensor& t, int64_t n, int64_t k) {
  MCPP_CHECK(t.defined() && t.is_cpu() && t.dtype() == DType::I32 && t.ndim() == 2 && t.size(0) == n &&
                 t.size(1) == k,
             "{}: {} must be a CPU int32 [{}, {}] tensor; got {}", op, arg, n, k, t.defined() ? t.str() : "undefined");
}
void check_f32(const char* op, const char* arg, const Tensor& t, const Shape& shape) {
  detail::require_cpu_f32(op, arg, t);
  MCPP_CHECK(t.shape() == shape, "{}: {} must be {}; got {}", op, arg, shape_str(shape), t.str());
}
}  // namespace

namespace {
// Group-limited routing (opt.num_groups > 0): allowed[j] = 1 for the experts of the group_topk groups with the
// largest sums of their k / group_topk largest values v (ties to the lower group), else 0. scratch: E doubles.
void allowed_groups(const double* v, int64_t e, int64_t k, const MoeTopkOptions& opt, char* allowed,
                    double* scratch) {
  const int64_t groups = opt.num_groups, per = e / groups, m = k / opt.group_topk;
  double gs[kMaxMoeRouterGroups];
  for (int64_t g = 0; g < groups; ++g) {  // the sum of the m largest (ties do not change a sum)
    std::copy(v + g * per, v + (g + 1) * per, scratch);
    std::partial_sort(scratch, scratch + m, scratch + per, std::greater<>());
    gs[g] = 0.0;
    for (int64_t i = 0; i < m; ++i) gs[g] += scratch[i];
  }
  uint64_t chosen = 0;
  for (int64_t i = 0; i < opt.group_topk; ++i) {
    int64_t best = -1;
    for (int64_t g = 0; g < groups; ++g)
      if (!((chosen >> g) & 1) && (best < 0 || gs[g] > gs[best])) best = g;
    chosen |= uint64_t{1} << best;
  }
  for (int64_t j = 0; j < e; ++j) allowed[j] = static_cast<char>((chosen >> (j / per)) & 1);
}
}  // namespace

void moe_topk_softmax(Tensor& topk, Tensor& probs, Tensor& scores, Tensor& lse, const Tensor& logits,
                      const MoeTopkOptions& opt, Stream) {
  const char* op = "moe_topk_softmax";
  detail::require_cpu_f32(op, "logits", logits);
  MCPP_CHECK(logits.ndim() == 2, "{}: logits must be [n, E]; got {}", op, logits.str());
  const int64_t n = logits.size(0), e = logits.size(1), k = topk.ndim() == 2 ? topk.size(1) : 0;
  MCPP_CHECK(k >= 1 && k <= e && k <= 64, "{}: topk must be [n, k] with 1 <= k <= min(E = {}, 64); got {}", op, e,
             topk.str());
  check_i32(op, "topk", topk, n, k);
  check_f32(op, "probs", probs, {n, k});
  check_f32(op, "scores", scores, {n, e});
  check_f32(op, "lse", lse, {n});
  check_moe_topk_options(op, opt, e, k);
  MCPP_CHECK(!opt.expert_bias.defined() || opt.expert_bias.is_cpu(), "{}: the expert bias must be on the CPU", op);
  MCPP_CHECK(!opt.logit_bias.defined() || opt.logit_bias.is_cpu(), "{}: the logit bias must be on the CPU", op);
  const float* bias = opt.expert_bias.defined() ? opt.expert_bias.data<float>() : nullptr;
  const float* lbias = opt.logit_bias.defined() ? opt.logit_bias.data<float>() : nullptr;
  const float* lgp = logits.data<float>();
  float *sp = scores.data<float>(), *pp = probs.data<float>(), *lp = lse.data<float>();
  int32_t* tp = topk.data<int32_t>();
#pragma omp parallel
  {
    std::vector<double> v(static_cast<size_t>(e)), scratch(static_cast<size_t>(e));
    std::vector<char> allowed(static_cast<size_t>(e), 1);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      const float* lg = lgp + t * e;
      float* sc = sp + t * e;
      if (opt.sigmoid) {  // s = sigmoid(logits); scores = s normalized for the load-balancing loss when k > 1
        double z = 0.0;
        for (int64_t j = 0; j < e; ++j) z += v[static_cast<size_t>(j)] = 1.0 / (1.0 + std::exp(-double{lg[j]}));
        z += 1e-20;
        for (int64_t j = 0; j < e; ++j) {
          const double sj = v[static_cast<size_t>(j)];
          sc[j] = static_cast<float>(k > 1 ? sj / z : sj);
        }
        lp[t] = static_cast<float>(z);
        if (bias)  // the routing's values: s + b (the groups' too)
          for (int64_t j = 0; j < e; ++j) v[static_cast<size_t>(j)] += bias[j];
      } else {
        lp[t] = static_cast<float>(softmax_into(lg, e, sc));
        for (int64_t j = 0; j < e; ++j) v[static_cast<size_t>(j)] = opt.pre_softmax ? sc[j] : lg[j];
      }
      if (opt.num_groups > 0) allowed_groups(v.data(), e, k, opt, allowed.data(), scratch.data());
      int32_t* top = tp + t * k;
      float* pr = pp + t * k;
      // k passes of max over the allowed experts: the largest logit not yet taken (the order of every score
      // function's values), or with an expert bias the largest s + b, with a logit bias the largest logit + lb (in
      // float32, as the CUDA kernel); ties to the lower expert
      auto key = [&](int32_t j) {
        if (lbias) return static_cast<double>(lg[j] + lbias[j]);
        return bias ? v[static_cast<size_t>(j)] : static_cast<double>(lg[j]);
      };
      for (int64_t i = 0; i < k; ++i) {
        int32_t best = -1;
        for (int32_t j = 0; j < static_cast<int32_t>(e); ++j) {
          if (!allowed[static_cast<size_t>(j)]) continue;
          bool taken = false;
          for (int64_t q = 0; q < i && !taken; ++q) taken = top[q] == j;
          if (!taken && (best < 0 || key(j) > key(best))) best = j;
        }
        top[i] = best;
      }
      if (opt.sigmoid) {
        auto s_of = [&](int32_t j) { return 1.0 / (1.0 + std::exp(-double{lg[j]})); };  // s, without the bias
        double zk = 0.0;
        for (int64_t i = 0; i < k; ++i) zk += s_of(top[i]);
        for (int64_t i = 0; i < k; ++i) {
          const double si = s_of(top[i]);
          pr[i] = static_cast<float>(k > 1 ? si / (zk + 1e-20) : si);
        }
      } else if (opt.pre_softmax) {
        for (int64_t i = 0; i < k; ++i) pr[i] = sc[top[i]];
      } else {
        float sel[64];
        for (int64_t i = 0; i < k; ++i) sel[i] = lg[top[i]];
        softmax_into(sel, k, pr);
      }
    }
  }
}

namespace {
// The sigmoid score function's backward for one token (opt.sigmoid): s_j = sigmoid(logit_j) = scores[j] * z when
// k > 1 (scores = s / z, z = lse = sum s + 1e-20), else scores[j]. probs = s[top] / (sum s[top] + 1e-20) and
// scores' normalization each give ds by their Jacobians; dlogits = ds s (1 - s). ds: E doubles of scratch.
void sigmoid_bwd(float* dl, const float* scores, float z, const int32_t* top, const float* pr, const float* dp,
                 const float* ag, int64_t e, int64_t k, double* ds) {
  auto sig = [&](int64_t j) { return k > 1 ? static_cast<double>(scores[j]) * z : static_cast<double>(scores[j]); };
  double ga = 0.0;  // <g, scores>
  for (int64_t j = 0; j < e; ++j) ga += static_cast<double>(ag[j]) * scores[j];
  for (int64_t j = 0; j < e; ++j) ds[j] = k > 1 ? (ag[j] - ga) / z : ag[j];
  double zk = 0.0, dot = 0.0;
  for (int64_t i = 0; i < k; ++i) zk += sig(top[i]), dot += static_cast<double>(dp[i]) * pr[i];
  for (int64_t i = 0; i < k; ++i) ds[top[i]] += k > 1 ? (dp[i] - dot) / (zk + 1e-20) : dp[i];
  for (int64_t j = 0; j < e; ++j) dl[j] = static_cast<float>(ds[j] * sig(j) * (1.0 - sig(j)));
}
}  // namespace

void moe_topk_softmax_bwd(Tensor& dlogits, const Tensor& dprobs, const Tensor& probs, const Tensor& topk,
                          const Tensor& scores, const Tensor& lse, const Tensor& aux_grad, const MoeTopkOptions& opt,
                          Stream) {
  const char* op = "moe_topk_softmax_bwd";
  detail::require_cpu_f32(op, "scores", scores);
  MCPP_CHECK(scores.ndim() == 2, "{}: scores must be [n, E]; got {}", op, scores.str());
  const int64_t n = scores.size(0), e = scores.size(1), k = topk.ndim() == 2 ? topk.size(1) : 0;
  check_i32(op, "topk", topk, n, k);
  check_f32(op, "dlogits", dlogits, {n, e});
  check_f32(op, "dprobs", dprobs, {n, k});
  check_f32(op, "probs", probs, {n, k});
  check_f32(op, "lse", lse, {n});
  const int64_t rows = moe_aux_grad_rows(op, aux_grad, e);
  detail::require_cpu_f32(op, "aux_grad", aux_grad);
  check_moe_topk_options(op, opt, e, k);
  MCPP_CHECK(!opt.sigmoid || opt.z_coef == 0.0f, "{}: the z-loss is not implemented with the sigmoid score function",
             op);
  const int32_t* tp = topk.data<int32_t>();
  const float *pp = probs.data<float>(), *dpp = dprobs.data<float>(), *sp = scores.data<float>();
  const float *lp = lse.data<float>(), *ag = aux_grad.data<float>();
  float* dl0 = dlogits.data<float>();
#pragma omp parallel
  {
    std::vector<double> g(static_cast<size_t>(e));  // per thread
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      const int32_t* top = tp + t * k;
      const float *pr = pp + t * k, *dp = dpp + t * k, *s = sp + t * e, *agt = ag + (t % rows) * e;
      float* dl = dl0 + t * e;
      for (int64_t j = 0; j < e; ++j) {
        g[static_cast<size_t>(j)] = agt[j];
        dl[j] = 0.0f;
      }
      if (opt.sigmoid) {
        sigmoid_bwd(dl, s, lp[t], top, pr, dp, agt, e, k, g.data());
        continue;
      }
      if (opt.pre_softmax) {
        for (int64_t i = 0; i < k; ++i) g[static_cast<size_t>(top[i])] += dp[i];
      } else {  // probs = softmax(logits[top]): d logits[top_i] = p_i (dp_i - sum_j p_j dp_j)
        double dot = 0.0;
        for (int64_t i = 0; i < k; ++i) dot += static_cast<double>(pr[i]) * dp[i];
        for (int64_t i = 0; i < k; ++i) dl[top[i]] += static_cast<float>(pr[i] * (dp[i] - dot));
      }
      double sg = 0.0;  // scores = softmax(logits): d logits = s (g - <s, g>)
      for (int64_t j = 0; j < e; ++j) sg += s[j] * g[static_cast<size_t>(j)];
      for (int64_t j = 0; j < e; ++j)
        dl[j] += static_cast<float>(s[j] * (g[static_cast<size_t>(j)] - sg) +
                                    static_cast<double>(opt.z_coef) * lp[t] * s[j]);
    }
  }
}

void moe_sinkhorn(Tensor& log_d1, const Tensor& logits, float tol, Stream) {
  const char* op = "moe_sinkhorn";
  detail::require_cpu_f32(op, "logits", logits);
  MCPP_CHECK(logits.ndim() == 2 && logits.size(1) >= 1, "{}: logits must be [n, E]; got {}", op, logits.str());
  const int64_t n = logits.size(0), e = logits.size(1);
  check_f32(op, "log_d1", log_d1, {e});
  const float* lg = logits.data<float>();
  std::vector<double> cost(static_cast<size_t>(n * e)), d0(static_cast<size_t>(n), 1.0);
  std::vector<double> d1(static_cast<size_t>(e), 1.0);
  for (int64_t q = 0; q < n * e; ++q) cost[static_cast<size_t>(q)] = std::exp(double{lg[q]});
  constexpr double eps = 1e-8;
  for (int it = 0; it < kMaxSinkhornIterations && n > 0; ++it) {
    for (int64_t t = 0; t < n; ++t) {  // d0 = (1 / n) / (cost d1 + eps)
      double sum = 0.0;
      for (int64_t j = 0; j < e; ++j) sum += d1[static_cast<size_t>(j)] * cost[static_cast<size_t>(t * e + j)];
      d0[static_cast<size_t>(t)] = 1.0 / static_cast<double>(n) / (sum + eps);
    }
    std::vector<double> col(static_cast<size_t>(e), 0.0);  // cost^T d0
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < e; ++j)
        col[static_cast<size_t>(j)] += d0[static_cast<size_t>(t)] * cost[static_cast<size_t>(t * e + j)];
    double error = 0.0;
    for (int64_t j = 0; j < e; ++j) {
      const double next = 1.0 / static_cast<double>(e) / (col[static_cast<size_t>(j)] + eps);
      error += std::abs(next - d1[static_cast<size_t>(j)]);
      d1[static_cast<size_t>(j)] = next;
    }
    if (!(error / static_cast<double>(e) > tol)) break;  // Megatron's `while error > tol` (NaN stops it)
  }
  for (int64_t j = 0; j < e; ++j) log_d1.data<float>()[j] = static_cast<float>(std::log(d1[static_cast<size_t>(j)]));
}

void moe_route_counts(Tensor& counts, const Tensor& topk, const Tensor* idx, Stream) {
  const char* op = "moe_route_counts";
  MCPP_CHECK(topk.defined() && topk.is_cpu() && topk.dtype() == DType::I32 && topk.ndim() == 2,
             "{}: topk must be a CPU int32 [n, k] tensor; got {}", op, topk.defined() ? topk.str() : "undefined");
  const int64_t n = topk.size(0), k = topk.size(1);
  if (idx) check_i32(op, "idx", *idx, n, k);
  detail::require_cpu_f32(op, "counts", counts);
  MCPP_CHECK(counts.ndim() == 2 && counts.size(0) >= 1, "{}: counts must be [G, E]; got {}", op, counts.str());
  const int64_t g = counts.size(0), e = counts.size(1);
  const int32_t *tp = topk.data<int32_t>(), *ip = idx ? idx->data<int32_t>() : nullptr;
  float* cp = counts.data<float>();
  std::fill(cp, cp + g * e, 0.0f);
  for (int64_t q = 0; q < n * k; ++q) {
    MCPP_CHECK(tp[q] >= 0 && tp[q] < e, "{}: topk entry {} = {} is not an expert of {}", op, q, tp[q], e);
    if (!ip || ip[q] >= 0) cp[(q / k) % g * e + tp[q]] += 1.0f;
  }
}

void moe_route_positions(Tensor& idx, Tensor& counts, const Tensor& topk, Stream) {
  const char* op = "moe_route_positions";
  MCPP_CHECK(topk.defined() && topk.is_cpu() && topk.dtype() == DType::I32 && topk.ndim() == 2,
             "{}: topk must be a CPU int32 [n, k] tensor; got {}", op, topk.defined() ? topk.str() : "undefined");
  const int64_t n = topk.size(0), k = topk.size(1);
  check_i32(op, "idx", idx, n, k);
  MCPP_CHECK(counts.defined() && counts.is_cpu() && counts.dtype() == DType::I64 && counts.ndim() == 1,
             "{}: counts must be a CPU int64 [E] tensor; got {}", op, counts.defined() ? counts.str() : "undefined");
  const int64_t e = counts.numel();
  const int32_t* tp = topk.data<int32_t>();
  int64_t* cp = counts.data<int64_t>();
  std::fill(cp, cp + e, 0);
  for (int64_t q = 0; q < n * k; ++q) {
    MCPP_CHECK(tp[q] >= 0 && tp[q] < e, "{}: topk entry {} = {} is not an expert of {}", op, q, tp[q], e);
    ++cp[tp[q]];
  }
  std::vector<int64_t> cursor(static_cast<size_t>(e), 0);
  for (int64_t j = 1; j < e; ++j) cursor[static_cast<size_t>(j)] = cursor[static_cast<size_t>(j - 1)] + cp[j - 1];
  int32_t* ip = idx.data<int32_t>();
  for (int64_t q = 0; q < n * k; ++q) ip[q] = static_cast<int32_t>(cursor[static_cast<size_t>(tp[q])]++);
}

void moe_capacity_positions(Tensor& idx, Tensor& kept, const Tensor& topk, const Tensor& probs, const Tensor& counts,
                            const MoeCapacityOptions& opt, Stream) {
  const char* op = "moe_capacity_positions";
  MCPP_CHECK(topk.defined() && topk.is_cpu() && topk.dtype() == DType::I32 && topk.ndim() == 2,
             "{}: topk must be a CPU int32 [n, k] tensor; got {}", op, topk.defined() ? topk.str() : "undefined");
  const int64_t n = topk.size(0), k = topk.size(1);
  check_i32(op, "idx", idx, n, k);
  detail::require_cpu_f32(op, "probs", probs);
  MCPP_CHECK(probs.ndim() == 2 && probs.size(0) == n && probs.size(1) == k, "{}: probs must be [n={}, k={}]; got {}",
             op, n, k, probs.str());
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"counts", &counts}, {"kept", &kept}})
    MCPP_CHECK(t->defined() && t->is_cpu() && t->dtype() == DType::I64 && t->ndim() == 1,
               "{}: {} must be a CPU int64 [E] tensor; got {}", op, name, t->defined() ? t->str() : "undefined");
  MCPP_CHECK(kept.numel() == counts.numel(), "{}: kept {} and counts {} differ", op, kept.str(), counts.str());
  MCPP_CHECK(opt.capacity >= 0, "{}: capacity must be >= 0; got {}", op, opt.capacity);
  const int64_t e = counts.numel(), cap = opt.capacity;
  const int32_t* tp = topk.data<int32_t>();
  const float* pp = probs.data<float>();
  std::vector<std::vector<int64_t>> routes(static_cast<size_t>(e));  // each expert's routes in token order
  for (int64_t q = 0; q < n * k; ++q) {
    MCPP_CHECK(tp[q] >= 0 && tp[q] < e, "{}: topk entry {} = {} is not an expert of {}", op, q, tp[q], e);
    routes[static_cast<size_t>(tp[q])].push_back(q);
  }
  int32_t* ip = idx.data<int32_t>();
  std::fill(ip, ip + n * k, -1);
  int64_t* kp = kept.data<int64_t>();
  int64_t base = 0;
  for (int64_t j = 0; j < e; ++j) {
    std::vector<int64_t>& r = routes[static_cast<size_t>(j)];
    MCPP_CHECK(counts.data<int64_t>()[j] == static_cast<int64_t>(r.size()),
               "{}: counts[{}] = {} but {} routes choose expert {}", op, j, counts.data<int64_t>()[j], r.size(), j);
    if (static_cast<int64_t>(r.size()) > cap) {
      if (opt.by_probs) {  // the cap largest probabilities (ties: the earlier route), then back in token order
        auto key = [&](int64_t q) { return std::isnan(pp[q]) ? -INFINITY : pp[q]; };  // a strict weak order
        std::stable_sort(r.begin(), r.end(), [&](int64_t a, int64_t b) { return key(a) > key(b); });
        r.resize(static_cast<size_t>(cap));
        std::sort(r.begin(), r.end());
      } else {
        r.resize(static_cast<size_t>(cap));
      }
    }
    for (size_t q = 0; q < r.size(); ++q) ip[r[q]] = static_cast<int32_t>(base + static_cast<int64_t>(q));
    kp[j] = static_cast<int64_t>(r.size());
    base += opt.pad ? cap : kp[j];
  }
}

}  // namespace mcpp::ops::cpu
