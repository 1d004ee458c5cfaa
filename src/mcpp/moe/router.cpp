// TopKRouter; contract in router.h.
#include "mcpp/moe/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::moe {
namespace {

// A [rows, cols] host fp32 copy of t (any device, fp32 / bf16 / fp16).
std::vector<float> to_host_f32(const Tensor& t) {
  Tensor h = t.is_cpu() ? t : t.to(Device::CPU);
  if (h.dtype() != DType::F32) h = h.to(DType::F32);
  const float* p = h.data<float>();
  return std::vector<float>(p, p + h.numel());
}

// softmax of v[0..n) into out (double accumulation); returns logsumexp.
double softmax_into(const float* v, int64_t n, float* out) {
  const float mx = *std::max_element(v, v + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(v[i]) - mx);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(std::exp(static_cast<double>(v[i]) - mx) / sum);
  return mx + std::log(sum);
}

}  // namespace

TopKRouter::TopKRouter(ParamAndGradBuffer& params, const std::string& prefix, const TransformerConfig& c,
                       const tensor_parallel::TPContext& tp)
    : experts_(c.num_moe_experts),
      k_(c.moe_router_topk),
      pre_softmax_(c.moe_router_pre_softmax),
      aux_loss_on_(c.moe_router_load_balancing_type == "aux_loss"),
      aux_coeff_(c.moe_aux_loss_coeff),
      z_coeff_(c.moe_z_loss_coeff),
      sp_group_(tp.sequence_parallel && tp.size() > 1 ? tp.group : nullptr),
      cp_group_(tp.cp_size() > 1 ? tp.cp : nullptr) {
  MCPP_CHECK(experts_ > 0 && k_ >= 1 && k_ <= std::min(experts_, kMaxTopk),
             "TopKRouter: moe_router_topk {} must be in [1, min(num_moe_experts, {})] = [1, {}]", k_, kMaxTopk,
             std::min(experts_, kMaxTopk));
  weight_ = params.add(ParamSpec{.key = prefix + ".weight", .shape = {experts_, c.hidden_size},
                                 .init = InitKind::Normal, .std = c.init_method_std,
                                 .sequence_parallel = sp_group_ != nullptr});
}

void TopKRouter::forward(RouterCtx& ctx, const Tensor& x) const {
  MCPP_CHECK(x.ndim() == 2 && x.size(1) == weight_->data.size(1), "TopKRouter: x must be [n, h={}]; got {}",
             weight_->data.size(1), x.str());
  const int64_t n = x.size(0), e = experts_, k = k_;
  Tensor logits = Tensor::empty({n, e}, x.dtype(), x.device());  // [n, E]
  ops::linear_fwd(logits, x, weight_->data, nullptr);
  ctx.x = x;
  ctx.n = n;
  ctx.logits = to_host_f32(logits);
  ctx.scores.assign(static_cast<size_t>(n * e), 0.0f);
  ctx.topk.assign(static_cast<size_t>(n * k), 0);
  ctx.probs.assign(static_cast<size_t>(n * k), 0.0f);
  ctx.lse.assign(static_cast<size_t>(n), 0.0);
  // Per token, independent (threads split the tokens; every value is computed the same way on any thread count).
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    const float* lg = ctx.logits.data() + t * e;
    ctx.lse[static_cast<size_t>(t)] = softmax_into(lg, e, ctx.scores.data() + t * e);
    int32_t* top = ctx.topk.data() + t * k;
    float* pr = ctx.probs.data() + t * k;
    for (int64_t i = 0; i < k; ++i) {  // k passes of max: the largest not yet taken, ties to the lower expert
      int32_t best = -1;
      for (int32_t j = 0; j < static_cast<int32_t>(e); ++j) {
        bool taken = false;
        for (int64_t q = 0; q < i && !taken; ++q) taken = top[q] == j;
        if (!taken && (best < 0 || lg[j] > lg[best])) best = j;
      }
      top[i] = best;
      pr[i] = pre_softmax_ ? ctx.scores[static_cast<size_t>(t * e + best)] : lg[best];  // softmax'd below
    }
    if (!pre_softmax_) {
      float sel[kMaxTopk];
      for (int64_t i = 0; i < k; ++i) sel[i] = pr[i];
      softmax_into(sel, k, pr);
    }
  }
  ctx.tokens_per_expert.assign(static_cast<size_t>(e), 0);
  for (const int32_t x : ctx.topk) ++ctx.tokens_per_expert[static_cast<size_t>(x)];
  // The whole sequences' counts (the load-balancing statistics): summed over the ranks that split them.
  Tensor counts = Tensor::empty({e + 1}, DType::I64);
  std::copy(ctx.tokens_per_expert.begin(), ctx.tokens_per_expert.end(), counts.data<int64_t>());
  counts.data<int64_t>()[e] = n;
  for (const comm::CommPtr& g : {sp_group_, cp_group_})
    if (g) g->host().all_reduce(counts, comm::ReduceOp::Sum).wait();
  ctx.global_tokens_per_expert.assign(counts.data<int64_t>(), counts.data<int64_t>() + e);
  ctx.global_tokens = counts.data<int64_t>()[e];
  double z_sum = 0.0;  // in token order: the same value on any thread count
  for (const double l : ctx.lse) z_sum += l * l;
  ctx.aux_loss = 0.0;
  const auto big_n = static_cast<double>(ctx.global_tokens);
  if (aux_loss_on_ && aux_coeff_ > 0.0f && big_n > 0) {
    double s = 0.0;
    for (int64_t j = 0; j < e; ++j) {
      double agg = 0.0;
      for (int64_t t = 0; t < n; ++t) agg += ctx.scores[static_cast<size_t>(t * e + j)];
      s += agg * static_cast<double>(ctx.global_tokens_per_expert[static_cast<size_t>(j)]);
    }
    ctx.aux_loss = s * aux_coeff_ * static_cast<double>(e) / (big_n * big_n * static_cast<double>(k));
  }
  ctx.z_loss = z_coeff_ > 0.0f && big_n > 0 ? z_coeff_ * z_sum / big_n : 0.0;
}

Tensor TopKRouter::backward(RouterCtx& ctx, const std::vector<float>& dprobs, float loss_grad_scale) const {
  const int64_t n = ctx.n, e = experts_, k = k_;
  MCPP_CHECK(static_cast<int64_t>(dprobs.size()) == n * k, "TopKRouter::backward: dprobs has {} values, expected {}",
             dprobs.size(), n * k);
  // g: the gradient reaching scores (the full softmax) per token; dlogits gets the top-k softmax's part directly.
  std::vector<float> dlogits(static_cast<size_t>(n * e), 0.0f);
  const auto big_n = static_cast<double>(ctx.global_tokens);
  const double aux_c = aux_loss_on_ && aux_coeff_ > 0.0f && big_n > 0
                           ? static_cast<double>(loss_grad_scale) * aux_coeff_ * e / (big_n * big_n * k)
                           : 0.0;
  const double z_c = z_coeff_ > 0.0f && big_n > 0 ? static_cast<double>(loss_grad_scale) * z_coeff_ * 2.0 / big_n : 0.0;
#pragma omp parallel
  {
  std::vector<double> g(static_cast<size_t>(e));  // per thread
#pragma omp for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    const int32_t* top = ctx.topk.data() + t * k;
    const float* pr = ctx.probs.data() + t * k;
    const float* dp = dprobs.data() + t * k;
    const float* s = ctx.scores.data() + t * e;
    float* dl = dlogits.data() + t * e;
    for (int64_t j = 0; j < e; ++j)
      g[static_cast<size_t>(j)] = aux_c * static_cast<double>(ctx.global_tokens_per_expert[static_cast<size_t>(j)]);
    if (pre_softmax_) {
      for (int64_t i = 0; i < k; ++i) g[static_cast<size_t>(top[i])] += dp[i];
    } else {  // probs = softmax(logits[top]): d logits[top_i] = p_i (dp_i - sum_j p_j dp_j)
      double dot = 0.0;
      for (int64_t i = 0; i < k; ++i) dot += static_cast<double>(pr[i]) * dp[i];
      for (int64_t i = 0; i < k; ++i) dl[top[i]] += static_cast<float>(pr[i] * (dp[i] - dot));
    }
    double sg = 0.0;  // scores = softmax(logits): d logits = s (g - <s, g>)
    for (int64_t j = 0; j < e; ++j) sg += s[j] * g[static_cast<size_t>(j)];
    const double lse = ctx.lse[static_cast<size_t>(t)];  // d(lse^2)/d logits = 2 lse softmax
    for (int64_t j = 0; j < e; ++j)
      dl[j] += static_cast<float>(s[j] * (g[static_cast<size_t>(j)] - sg) + z_c * lse * s[j]);
  }
  }  // omp parallel
  Tensor host = Tensor::from_blob(dlogits.data(), {n, e}, DType::F32);
  Tensor d = host;
  if (ctx.x.dtype() != DType::F32) d = d.to(ctx.x.dtype());
  if (!ctx.x.is_cpu()) d = d.to(ctx.x.device());
  else if (d.same_storage(host)) d = host.clone();  // the host vector dies with this call
  Tensor dx = Tensor::empty(ctx.x.shape(), ctx.x.dtype(), ctx.x.device());
  const ops::GradWrite gw = take_grad_overwrite({weight_}) ? ops::GradWrite::Overwrite : ops::GradWrite::Accumulate;
  ops::linear_bwd(&dx, weight_->main_grad, nullptr, d, ctx.x, weight_->data, gw);
  weight_->grad_ready();
  return dx;
}

}  // namespace mcpp::moe
