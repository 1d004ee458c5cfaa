// TopKRouter; contract in router.h.
#include "mcpp/moe/router.h"

#include <algorithm>
#include <cmath>

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::moe {
namespace {
Tensor host_copy(const Tensor& t) { return t.is_cpu() ? t : t.to(Device::CPU); }
}  // namespace

TopKRouter::TopKRouter(ParamAndGradBuffer& params, const std::string& prefix, const TransformerConfig& c,
                       const tensor_parallel::TPContext& tp)
    : experts_(c.num_moe_experts),
      k_(c.moe_router_topk),
      pre_softmax_(c.moe_router_pre_softmax),
      sigmoid_(c.moe_router_score_function == "sigmoid"),
      num_groups_(c.moe_router_num_groups),
      group_topk_(c.moe_router_group_topk),
      aux_loss_on_(c.moe_router_load_balancing_type == "aux_loss"),
      capacity_factor_(c.moe_expert_capacity_factor),
      scaling_(c.moe_router_topk_scaling_factor),
      drop_by_probs_(c.moe_token_drop_policy == "probs"),
      pad_to_capacity_(c.moe_pad_expert_input_to_capacity),
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
  if (c.moe_router_enable_expert_bias) {  // Megatron's router.expert_bias buffer: zeros at the start
    bias_key_ = prefix + ".expert_bias";
    expert_bias_ = Tensor::zeros({experts_}, DType::F32);  // the model's device is known at the first forward
    route_counts_.assign(static_cast<size_t>(experts_), 0);
  }
}

std::vector<int64_t> TopKRouter::take_route_counts() {
  std::vector<int64_t> out(static_cast<size_t>(experts_), 0);
  if (has_expert_bias()) std::swap(out, route_counts_);
  return out;
}

void TopKRouter::update_expert_bias(const int64_t* counts, float rate) {
  MCPP_CHECK(has_expert_bias(), "TopKRouter::update_expert_bias: the router has no expert bias");
  double mean = 0.0;
  for (int64_t j = 0; j < experts_; ++j) mean += static_cast<double>(counts[j]);
  mean /= static_cast<double>(experts_);
  Tensor b = expert_bias_.is_cpu() ? expert_bias_ : expert_bias_.to(Device::CPU);
  float* pb = b.data<float>();
  for (int64_t j = 0; j < experts_; ++j) {  // torch.sign(offset) * rate, in float32
    const double offset = mean - static_cast<double>(counts[j]);
    pb[j] += static_cast<float>(offset > 0.0 ? 1.0 : offset < 0.0 ? -1.0 : 0.0) * rate;
  }
  if (!expert_bias_.is_cpu()) expert_bias_.copy_from(b);
  route_counts_.assign(static_cast<size_t>(experts_), 0);
}

void TopKRouter::forward(RouterCtx& ctx, const Tensor& x, bool count_routes) const {
  MCPP_CHECK(x.ndim() == 2 && x.size(1) == weight_->data.size(1), "TopKRouter: x must be [n, h={}]; got {}",
             weight_->data.size(1), x.str());
  const int64_t n = x.size(0), e = experts_, k = k_;
  const Device dev = x.device();
  if (has_expert_bias() && expert_bias_.device() != dev) expert_bias_ = expert_bias_.to(dev);
  Tensor logits = Tensor::empty({n, e}, x.dtype(), dev);  // [n, E]
  ops::linear_fwd(logits, x, weight_->data, nullptr);
  ctx.x = x;
  ctx.n = n;
  ctx.topk = Tensor::empty({n, k}, DType::I32, dev);
  ctx.probs = Tensor::empty({n, k}, DType::F32, dev);
  ctx.scores = Tensor::empty({n, e}, DType::F32, dev);
  ctx.lse = Tensor::empty({n}, DType::F32, dev);
  ctx.idx = Tensor::empty({n, k}, DType::I32, dev);
  ops::moe_topk_softmax(ctx.topk, ctx.probs, ctx.scores, ctx.lse, logits, topk_options(0.0f));
  ctx.weights = ctx.probs;
  if (scaling_ > 0.0f) {  // Megatron's probs * scaling_factor (the capacity's probs policy ranks the same)
    ctx.weights = ctx.probs.clone();
    ops::scale_inplace(ctx.weights, scaling_);
  }
  Tensor both = Tensor::empty({2 * e}, DType::I64, dev);  // the routes per expert, then the kept ones
  Tensor counts = both.flat_slice(0, {e}), kept = both.flat_slice(e, {e});
  ops::moe_route_positions(ctx.idx, counts, ctx.topk);
  ctx.capacity = 0;
  if (capacity_factor_ > 0.0) {  // Megatron's get_capacity(n * k, E, c): ceil((n * k / E) * c), in float64
    ctx.capacity = static_cast<int64_t>(std::ceil(static_cast<double>(n * k) / static_cast<double>(e) *
                                                  capacity_factor_));
    ops::moe_capacity_positions(ctx.idx, kept, ctx.topk, ctx.probs, counts,
                                {.capacity = ctx.capacity, .by_probs = drop_by_probs_, .pad = pad_to_capacity_});
  }
  const bool aux = aux_loss_on_ && aux_coeff_ > 0.0f && n > 0;
  Tensor col;  // [1, E] the scores' column sums (the load-balancing loss's value), queued before the first read
  if (aux) {
    Tensor ones = Tensor::empty({1, n});
    ones.fill_(1.0f);
    col = Tensor::empty({1, e}, DType::F32, dev);
    ops::gemm(col, dev == Device::CPU ? ones : ones.to(dev), ctx.scores, {});
  }
  // Host reads: the counts (+ the token count; the one wait for the device), the losses' sums.
  Tensor stats = Tensor::empty({e + 1}, DType::I64);
  const Tensor both_h = host_copy(capacity_factor_ > 0.0 ? both : counts);
  stats.flat_slice(0, {e}).copy_from(both_h.flat_slice(0, {e}));
  const int64_t* cp = stats.data<int64_t>();
  ctx.tokens_per_expert.assign(cp, cp + e);
  if (capacity_factor_ == 0.0) ctx.rows_per_expert = ctx.tokens_per_expert;
  else if (pad_to_capacity_) ctx.rows_per_expert.assign(static_cast<size_t>(e), ctx.capacity);
  else ctx.rows_per_expert.assign(both_h.data<int64_t>() + e, both_h.data<int64_t>() + 2 * e);
  if (count_routes && has_expert_bias())  // the routes each expert kept (Megatron: the routing map after dropping)
    for (int64_t j = 0; j < e; ++j)
      route_counts_[static_cast<size_t>(j)] += capacity_factor_ > 0.0 ? both_h.data<int64_t>()[e + j] : cp[j];
  stats.data<int64_t>()[e] = n;
  // The whole sequences' counts (the load-balancing statistics): summed over the ranks that split them.
  for (const comm::CommPtr& g : {sp_group_, cp_group_})
    if (g) g->host().all_reduce(stats, comm::ReduceOp::Sum).wait();
  ctx.global_tokens_per_expert.assign(cp, cp + e);
  ctx.global_tokens = cp[e];
  const auto big_n = static_cast<double>(ctx.global_tokens);
  ctx.aux_loss = 0.0;
  if (aux && big_n > 0) {  // sum_e (sum_t scores[t, e]) T[e]
    const Tensor colh = host_copy(col);
    double s = 0.0;
    for (int64_t j = 0; j < e; ++j) {
      const auto tokens = static_cast<double>(ctx.global_tokens_per_expert[static_cast<size_t>(j)]);
      s += static_cast<double>(colh.data<float>()[j]) * tokens;
    }
    ctx.aux_loss = s * aux_coeff_ * static_cast<double>(e) / (big_n * big_n * static_cast<double>(k));
  }
  ctx.z_loss = z_coeff_ > 0.0f && big_n > 0 && n > 0 ? z_coeff_ * ops::sum_of_squares(ctx.lse) / big_n : 0.0;
}

ops::MoeTopkOptions TopKRouter::topk_options(float z_coef) const {
  return {.pre_softmax = pre_softmax_, .z_coef = z_coef, .sigmoid = sigmoid_, .num_groups = num_groups_,
          .group_topk = group_topk_, .expert_bias = expert_bias_};
}

Tensor TopKRouter::backward(RouterCtx& ctx, Tensor& dprobs, float loss_grad_scale) const {
  const int64_t n = ctx.n, e = experts_, k = k_;
  MCPP_CHECK(dprobs.numel() == n * k, "TopKRouter::backward: dprobs has {} values, expected {}", dprobs.numel(), n * k);
  if (scaling_ > 0.0f) ops::scale_inplace(dprobs, scaling_);  // d weights -> d probs
  const auto big_n = static_cast<double>(ctx.global_tokens);
  // The load-balancing loss's d / d scores[t, e] = coeff * E / (N^2 k) * T[e] (x the loss's coefficient).
  const double aux_c = aux_loss_on_ && aux_coeff_ > 0.0f && big_n > 0
                           ? static_cast<double>(loss_grad_scale) * aux_coeff_ * e / (big_n * big_n * k)
                           : 0.0;
  Tensor aux_grad = Tensor::empty({e});
  for (int64_t j = 0; j < e; ++j)
    aux_grad.data<float>()[j] =
        static_cast<float>(aux_c * static_cast<double>(ctx.global_tokens_per_expert[static_cast<size_t>(j)]));
  const double z_c = z_coeff_ > 0.0f && big_n > 0 ? static_cast<double>(loss_grad_scale) * z_coeff_ * 2.0 / big_n : 0.0;
  const Device dev = ctx.x.device();
  Tensor dlogits = Tensor::empty({n, e}, ctx.x.dtype(), dev);
  ops::moe_topk_softmax_bwd(dlogits, dprobs.view({n, k}), ctx.probs, ctx.topk, ctx.scores, ctx.lse,
                            dev == Device::CPU ? aux_grad : aux_grad.to(dev),
                            topk_options(static_cast<float>(z_c)));
  Tensor dx = Tensor::empty(ctx.x.shape(), ctx.x.dtype(), dev);
  const ops::GradWrite gw = take_grad_overwrite({weight_}) ? ops::GradWrite::Overwrite : ops::GradWrite::Accumulate;
  ops::linear_bwd(&dx, weight_->main_grad, nullptr, dlogits, ctx.x, weight_->data, gw);
  weight_->grad_ready();
  return dx;
}

void update_expert_biases(const std::vector<TopKRouter*>& routers, const std::vector<comm::CommPtr>& groups,
                          float rate) {
  std::vector<TopKRouter*> with_bias;
  for (TopKRouter* r : routers)
    if (r->has_expert_bias()) with_bias.push_back(r);
  if (with_bias.empty()) return;
  const int64_t e = with_bias.front()->num_experts();
  Tensor counts = Tensor::empty({static_cast<int64_t>(with_bias.size()) * e}, DType::I64);
  for (size_t i = 0; i < with_bias.size(); ++i) {
    const std::vector<int64_t> c = with_bias[i]->take_route_counts();
    std::copy(c.begin(), c.end(), counts.data<int64_t>() + static_cast<int64_t>(i) * e);
  }
  for (const comm::CommPtr& g : groups)
    if (g && g->size() > 1) g->host().all_reduce(counts, comm::ReduceOp::Sum).wait();
  for (size_t i = 0; i < with_bias.size(); ++i)
    with_bias[i]->update_expert_bias(counts.data<int64_t>() + static_cast<int64_t>(i) * e, rate);
}

}  // namespace mcpp::moe
