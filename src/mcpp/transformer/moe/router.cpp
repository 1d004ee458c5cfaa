// TopKRouter; contract in router.h.
#include "mcpp/transformer/moe/router.h"

#include <algorithm>
#include <cmath>

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::moe {

TopKRouter::TopKRouter(ParameterRegistry& params, const std::string& prefix, const TransformerConfig& c,
                       const tensor_parallel::TPContext& tp)
    : experts_(c.num_moe_experts),
      k_(c.moe_router_topk),
      // sinkhorn routing's activations (Megatron's _sinkhorn_activation): sigmoid at top-1, the softmax above
      sinkhorn_(c.moe_router_load_balancing_type == "sinkhorn"),
      pre_softmax_(c.moe_router_pre_softmax || (sinkhorn_ && c.moe_router_topk > 1)),
      sigmoid_(c.moe_router_score_function == "sigmoid" || (sinkhorn_ && c.moe_router_topk == 1)),
      fp32_logits_(c.moe_router_dtype == "fp32"),
      num_groups_(c.moe_router_num_groups),
      group_topk_(c.moe_router_group_topk),
      aux_loss_on_(c.moe_router_load_balancing_type == "aux_loss"),
      seq_aux_loss_(c.moe_router_load_balancing_type == "seq_aux_loss"),
      capacity_factor_(c.moe_expert_capacity_factor),
      scaling_(c.moe_router_topk_scaling_factor),
      drop_by_probs_(c.moe_token_drop_policy == "probs"),
      pad_to_capacity_(c.moe_pad_expert_input_to_capacity),
      aux_coeff_(c.moe_aux_loss_coeff),
      z_coeff_(c.moe_z_loss_coeff),
      jitter_eps_(c.moe_input_jitter_eps),
      force_balance_(c.moe_router_force_load_balancing),
      sp_group_(tp.sequence_parallel && tp.size() > 1 ? tp.group : nullptr),
      cp_group_(tp.cp_size() > 1 ? tp.cp : nullptr),
      split_((sp_group_ ? sp_group_->size() : 1) * (cp_group_ ? cp_group_->size() : 1)) {
  MCPP_CHECK(experts_ > 0 && k_ >= 1 && k_ <= std::min(experts_, kMaxTopk),
             "TopKRouter: moe_router_topk {} must be in [1, min(num_moe_experts, {})] = [1, {}]", k_, kMaxTopk,
             std::min(experts_, kMaxTopk));
  weight_ = params.add(ParamSpec{.key = prefix + ".weight", .shape = {experts_, c.hidden_size},
                                 .init = InitKind::Normal, .std = c.init_method_std,
                                 .sequence_parallel = sp_group_ != nullptr});
  if (c.moe_router_enable_expert_bias) {  // Megatron's router.expert_bias buffer: zeros at the start
    bias_key_ = prefix + ".expert_bias";
    expert_bias_ = Tensor::zeros({experts_}, DType::F32);  // the model's device is known at the first forward
    route_counts_ = Tensor::zeros({1, experts_}, DType::F32);
  }
}

void LossTracker::add(const Tensor& v, int64_t layer) {
  MCPP_CHECK(v.dtype() == DType::F32 && v.numel() == 3, "LossTracker: expected float32 [3], got {}", v.str());
  MCPP_CHECK(layer >= 0 && layer < layers_, "LossTracker: layer {} outside [0, {})", layer, layers_);
  if (!sums_.defined()) sums_ = Tensor::zeros({layers_, 3}, DType::F32, v.device());
  Tensor row = sums_.flat_slice(layer * 3, {3});
  ops::add_inplace(row, v);
}

std::vector<LossTracker::Sums> LossTracker::take() {
  std::vector<Sums> out(static_cast<size_t>(layers_));
  if (!sums_.defined()) return out;
  const Tensor h = sums_.to(Device::CPU);  // (on the CPU: the sums themselves, so read before zeroing)
  const float* p = h.data<float>();
  for (int64_t l = 0; l < layers_; ++l)
    out[static_cast<size_t>(l)] = {.load_balancing = p[3 * l], .z = p[3 * l + 1], .calls = p[3 * l + 2]};
  sums_.zero_();
  return out;
}

void LossTracker::add_load(const Tensor& v, int64_t layer) {
  MCPP_CHECK(v.dtype() == DType::F32 && v.ndim() == 1 && v.numel() >= 4 && v.numel() % 2 == 0,
             "LossTracker: expected float32 [2E + 2], got {}", v.str());
  MCPP_CHECK(layer >= 0 && layer < layers_, "LossTracker: layer {} outside [0, {})", layer, layers_);
  if (!load_.defined()) load_ = Tensor::zeros({layers_, v.numel()}, DType::F32, v.device());
  MCPP_CHECK(load_.size(1) == v.numel(), "LossTracker: expert load of {} values, expected {}", v.numel(),
             load_.size(1));
  Tensor row = load_.flat_slice(layer * v.numel(), {v.numel()});
  ops::add_inplace(row, v);
}

std::vector<std::vector<double>> LossTracker::take_load() {
  std::vector<std::vector<double>> out(static_cast<size_t>(layers_));
  if (!load_.defined()) return out;
  const Tensor h = load_.to(Device::CPU);
  const int64_t w = load_.size(1);
  const float* p = h.data<float>();
  for (int64_t l = 0; l < layers_; ++l) out[static_cast<size_t>(l)].assign(p + l * w, p + (l + 1) * w);
  load_.zero_();
  return out;
}

std::vector<int64_t> TopKRouter::take_route_counts() {
  std::vector<int64_t> out(static_cast<size_t>(experts_), 0);
  if (!has_expert_bias()) return out;
  const Tensor h = route_counts_.to(Device::CPU);
  for (int64_t j = 0; j < experts_; ++j) out[static_cast<size_t>(j)] = std::llround(h.data<float>()[j]);
  route_counts_.zero_();  // after the read: on the CPU h is the counts themselves
  return out;
}

const Tensor& TopKRouter::ones(int64_t n, Device dev) const {
  if (!ones_.defined() || ones_.numel() < n || ones_.device() != dev) {
    Tensor h = Tensor::empty({std::max<int64_t>(n, 1)});
    h.fill_(1.0f);
    ones_ = h.to(dev);
  }
  return ones_;
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
  route_counts_.zero_();
}

void TopKRouter::forward(RouterCtx& ctx, const Tensor& x, int64_t batch, LossTracker* losses, bool training,
                         tensor_parallel::RngTracker* rng) const {
  MCPP_CHECK(x.ndim() == 2 && x.size(1) == weight_->data.size(1), "TopKRouter: x must be [n, h={}]; got {}",
             weight_->data.size(1), x.str());
  const int64_t n = x.size(0), e = experts_, k = k_;
  MCPP_CHECK(batch >= 1 && n % batch == 0, "TopKRouter: {} tokens are not {} sequences of equal length", n, batch);
  const Device dev = x.device();
  if (has_expert_bias() && expert_bias_.device() != dev) {  // the first forward: the model's device
    expert_bias_ = expert_bias_.to(dev);
    route_counts_ = route_counts_.to(dev);
  }
  ctx = {};
  ctx.x = x;
  const bool jitter = training && jitter_eps_ > 0.0f, random_logits = training && force_balance_;
  MCPP_CHECK(rng || !(jitter || random_logits),
             "TopKRouter: moe_input_jitter_eps / moe_router_force_load_balancing need an RNG stream in training");
  const bool sharded = sp_group_ != nullptr;  // the stream hidden dropout on these tokens uses
  if (jitter) {  // the GEMM's input: x times uniform noise in [1 - eps, 1 + eps)
    ctx.jitter_key = rng->draw(static_cast<uint64_t>(n * x.size(1)), sharded);
    ctx.jittered = Tensor::empty(x.shape(), x.dtype(), dev);
    ops::random_scale(ctx.jittered, x, 1.0f - jitter_eps_, 1.0f + jitter_eps_, ctx.jitter_key);
  }
  const Tensor& gx = jitter ? ctx.jittered : x;
  Tensor logits = Tensor::empty({n, e}, logit_dtype(x), dev);  // [n, E]
  if (random_logits) {  // Megatron's RandomSTE: the router's logits replaced (so not computed)
    ops::random_normal(logits, rng->draw(static_cast<uint64_t>(2 * n * e), sharded));
  } else if (logit_dtype(x) == x.dtype()) {
    ops::linear_fwd(logits, gx, weight_->data, nullptr);
  } else {  // --moe-router-dtype fp32: the GEMM on the upcast input and weight
    ops::linear_fwd(logits, upcast(gx), upcast(weight_->data), nullptr);
  }
  ctx.n = n;
  ctx.batch = batch;
  ctx.topk = Tensor::empty({n, k}, DType::I32, dev);
  ctx.probs = Tensor::empty({n, k}, DType::F32, dev);
  ctx.scores = Tensor::empty({n, e}, DType::F32, dev);
  ctx.lse = Tensor::empty({n}, DType::F32, dev);
  ctx.idx = Tensor::empty({n, k}, DType::I32, dev);
  ops::MoeTopkOptions opt = topk_options(0.0f);
  if (sinkhorn_ && training) {  // the experts by Megatron's sinkhorn(logits) in float32: logits + log d1
    opt.logit_bias = Tensor::empty({e}, DType::F32, dev);
    ops::moe_sinkhorn(opt.logit_bias, logits.dtype() == DType::F32 ? logits : upcast(logits), kSinkhornTol);
  }
  ops::moe_topk_softmax(ctx.topk, ctx.probs, ctx.scores, ctx.lse, logits, opt);
  if (sigmoid_ && z_coeff_ > 0.0f) {  // the z-loss is on the logits' logsumexp, whatever the score function
    Tensor top1 = Tensor::empty({n, 1}, DType::I32, dev), p1 = Tensor::empty({n, 1}, DType::F32, dev);
    ctx.z_scores = Tensor::empty({n, e}, DType::F32, dev);
    ctx.z_lse = Tensor::empty({n}, DType::F32, dev);
    ops::moe_topk_softmax(top1, p1, ctx.z_scores, ctx.z_lse, logits, {});  // softmax(logits) and its logsumexp
  }
  ctx.weights = ctx.probs;
  if (scaling_ > 0.0f) {  // Megatron's probs * scaling_factor (the capacity's probs policy ranks the same)
    ctx.weights = ctx.probs.clone();
    ops::scale_inplace(ctx.weights, scaling_);
  }
  const bool capped = capacity_factor_ > 0.0;
  // the routes per expert, then (capped) the kept ones: one host read of both
  Tensor both = Tensor::empty({capped ? 2 * e : e}, DType::I64, dev);
  Tensor counts = both.flat_slice(0, {e}), kept = capped ? both.flat_slice(e, {e}) : Tensor();
  ops::moe_route_positions(ctx.idx, counts, ctx.topk);
  if (capped) {  // Megatron's get_capacity(n * k, E, c): ceil((n * k / E) * c), in float64
    ctx.capacity = static_cast<int64_t>(std::ceil(static_cast<double>(n * k) / static_cast<double>(e) *
                                                  capacity_factor_));
    ops::moe_capacity_positions(ctx.idx, kept, ctx.topk, ctx.probs, counts,
                                {.capacity = ctx.capacity, .by_probs = drop_by_probs_, .pad = pad_to_capacity_});
  }
  // The load-balancing statistics (on the device): T over every route (switch), or C over the kept routes of each
  // sequence (sequence-wise); summed over the ranks that split the sequences.
  const bool aux = (aux_loss_on_ || seq_aux_loss_) && aux_coeff_ > 0.0f && n > 0 && training;
  const int64_t groups = aux && seq_aux_loss_ ? batch : 1;
  // The expert bias's step counts: the routes each expert kept (Megatron: the routing map after dropping) — dropless
  // with the switch loss, this rank's T (before its all-reduce), else counted apart.
  const bool bias_counts = losses && has_expert_bias();
  const bool bias_from_aux = bias_counts && aux && !capped && !seq_aux_loss_;
  if (aux) {
    ctx.aux_counts = Tensor::empty({groups, e}, DType::F32, dev);
    ops::moe_route_counts(ctx.aux_counts, ctx.topk, seq_aux_loss_ ? &ctx.idx : nullptr);
    if (bias_from_aux) ops::add_inplace(route_counts_, ctx.aux_counts);
    for (const comm::CommPtr& g : {sp_group_, cp_group_})
      if (g) g->all_reduce(ctx.aux_counts, comm::ReduceOp::Sum).wait();
  }
  if (losses) {
    if (bias_counts && !bias_from_aux) {
      Tensor step = Tensor::empty({1, e}, DType::F32, dev);
      ops::moe_route_counts(step, ctx.topk, capped ? &ctx.idx : nullptr);
      ops::add_inplace(route_counts_, step);
    }
    // (load_balancing, z, 1): the losses over their coefficients, on the device
    Tensor v = Tensor::zeros({3}, DType::F32, dev);
    const Tensor& one = ones(n, dev);
    v.flat_slice(2, {1}).copy_from(one.flat_slice(0, {1}));
    if (aux) {  // sum_{b, e} (sum_{t in b} scores[t, e]) C[b, e]  (B = 1, C = T: the switch loss)
      Tensor col = Tensor::empty({1, groups * e}, DType::F32, dev);
      ops::gemm(col, one.flat_slice(0, {n / groups}).view({1, n / groups}), ctx.scores.view({n / groups, groups * e}),
                {});
      Tensor lb = v.flat_slice(0, {1}).view({1, 1});
      ops::gemm(lb, col, ctx.aux_counts.view({groups * e, 1}), {});
      ops::scale_inplace(lb, static_cast<float>(aux_loss_scale(n, batch) / aux_coeff_));
    }
    if (z_coeff_ > 0.0f && n > 0) {  // sum_t lse[t]^2 / N
      Tensor zl = v.flat_slice(1, {1}).view({1, 1});
      const Tensor& lse = sigmoid_ ? ctx.z_lse : ctx.lse;
      ops::gemm(zl, lse.view({1, n}), lse.view({n, 1}), {});
      ops::scale_inplace(zl, static_cast<float>(1.0 / static_cast<double>(n * split_)));
    }
    losses->add(v, layer_);
    losses->add_load(expert_load(ctx, logits, capped), layer_);
  }
  // The one host read: the buffer's rows per expert (none when padded: every expert's block is the capacity).
  if (capped && pad_to_capacity_) {
    ctx.rows_per_expert.assign(static_cast<size_t>(e), ctx.capacity);
    return;
  }
  if (!capped && device_counts_) {  // GroupedMLP reads them on the device (kept for its backward)
    ctx.counts = counts;
    ctx.tokens_per_expert.clear();
    ctx.rows_per_expert.clear();
    return;
  }
  const Tensor both_h = (capped ? both : counts).to(Device::CPU);
  const int64_t* bh = both_h.data<int64_t>();
  ctx.tokens_per_expert.assign(bh, bh + e);
  ctx.rows_per_expert.assign(bh + (capped ? e : 0), bh + (capped ? 2 * e : e));
}

Tensor TopKRouter::expert_load(const RouterCtx& ctx, const Tensor& logits, bool capped) const {
  const int64_t n = ctx.n, e = experts_;
  const Device dev = logits.device();
  Tensor load = Tensor::zeros({2 * e + 2}, DType::F32, dev);  // [routes | kept | entropy sum | tokens]
  Tensor routes = load.flat_slice(0, {e}).view({1, e}), kept = load.flat_slice(e, {e}).view({1, e});
  ops::moe_route_counts(routes, ctx.topk, nullptr);
  if (capped) ops::moe_route_counts(kept, ctx.topk, &ctx.idx);
  else ops::add_inplace(kept, routes);
  if (n == 0) return load;
  // sum_t H(softmax(logits[t])) = sum_t lse[t] - sum_{t, e} softmax(logits)[t, e] logits[t, e]: two GEMMs over the
  // softmax the router computed (its scores and lse with the softmax score function; sigmoid scores are not a
  // softmax, so the z-loss's softmax, or one computed here).
  Tensor p = ctx.scores, lse = ctx.lse;
  if (sigmoid_) {
    p = ctx.z_scores;
    lse = ctx.z_lse;
    if (!p.defined()) {
      Tensor top1 = Tensor::empty({n, 1}, DType::I32, dev), p1 = Tensor::empty({n, 1}, DType::F32, dev);
      p = Tensor::empty({n, e}, DType::F32, dev);
      lse = Tensor::empty({n}, DType::F32, dev);
      ops::moe_topk_softmax(top1, p1, p, lse, logits, {});
    }
  }
  const Tensor l32 = logits.dtype() == DType::F32 ? logits : upcast(logits);
  Tensor ent = load.flat_slice(2 * e, {1}).view({1, 1});
  ops::gemm(ent, ones(n, dev).flat_slice(0, {n}).view({1, n}), lse.view({n, 1}), {});
  ops::gemm(ent, p.view({1, n * e}), l32.view({n * e, 1}), {.alpha = -1.0f, .beta = 1.0f});
  Tensor tokens = load.flat_slice(2 * e + 1, {1});
  tokens.copy_from(ones(n, dev).flat_slice(0, {1}));
  ops::scale_inplace(tokens, static_cast<float>(n));
  return load;
}

double TopKRouter::aux_loss_scale(int64_t n, int64_t batch) const {
  const double big_n = static_cast<double>(n * split_), b = static_cast<double>(seq_aux_loss_ ? batch : 1);
  const double seq_len = big_n / b;
  return aux_coeff_ * static_cast<double>(experts_) / (b * seq_len * seq_len * static_cast<double>(k_));
}

DType TopKRouter::logit_dtype(const Tensor& x) const { return fp32_logits_ ? DType::F32 : x.dtype(); }

Tensor TopKRouter::upcast(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), DType::F32, t.device());
  ops::cast(out, t);
  return out;
}

ops::MoeTopkOptions TopKRouter::topk_options(float z_coef) const {
  return {.pre_softmax = pre_softmax_, .z_coef = z_coef, .sigmoid = sigmoid_, .num_groups = num_groups_,
          .group_topk = group_topk_, .expert_bias = expert_bias_};
}

Tensor TopKRouter::backward(RouterCtx& ctx, Tensor& dprobs, float loss_grad_scale) const {
  const int64_t n = ctx.n, e = experts_, k = k_;
  MCPP_CHECK(dprobs.numel() == n * k, "TopKRouter::backward: dprobs has {} values, expected {}", dprobs.numel(), n * k);
  if (scaling_ > 0.0f) ops::scale_inplace(dprobs, scaling_);  // d weights -> d probs
  const Device dev = ctx.x.device();
  // The load-balancing loss's d / d scores[t, e] = aux_loss_scale * T[e] (switch), or * C[b, e] for token t of
  // sequence b (sequence-wise: aux_grad's row b), x the loss's gradient scale.
  Tensor aux_grad;
  if (ctx.aux_counts.defined()) {
    aux_grad = ctx.aux_counts.clone();
    ops::scale_inplace(aux_grad, static_cast<float>(static_cast<double>(loss_grad_scale) *
                                                    aux_loss_scale(n, ctx.batch)));
  } else {
    aux_grad = Tensor::zeros({1, e}, DType::F32, dev);
  }
  const double z_c = z_coeff_ > 0.0f && n > 0
                         ? static_cast<double>(loss_grad_scale) * z_coeff_ * 2.0 / static_cast<double>(n * split_)
                         : 0.0;
  const DType ldt = logit_dtype(ctx.x);
  Tensor dlogits = Tensor::empty({n, e}, ldt, dev);
  ops::moe_topk_softmax_bwd(dlogits, dprobs.view({n, k}), ctx.probs, ctx.topk, ctx.scores, ctx.lse, aux_grad,
                            topk_options(sigmoid_ ? 0.0f : static_cast<float>(z_c)));
  if (sigmoid_ && z_c != 0.0) {  // + z_c lse[t] softmax(logits[t]): the softmax backward with nothing else
    Tensor dz = Tensor::empty({n, e}, ldt, dev);
    const Tensor none = Tensor::zeros({n, 1}, DType::F32, dev), top0 = Tensor::zeros({n, 1}, DType::I32, dev);
    ops::moe_topk_softmax_bwd(dz, none, none, top0, ctx.z_scores, ctx.z_lse, Tensor::zeros({1, e}, DType::F32, dev),
                              {.z_coef = static_cast<float>(z_c)});
    ops::add_inplace(dlogits, dz);
  }
  Tensor dx = Tensor::empty(ctx.x.shape(), ldt, dev);
  const ops::GradWrite gw = take_grad_overwrite({weight_}) ? ops::GradWrite::Overwrite : ops::GradWrite::Accumulate;
  const Tensor& gx = ctx.jittered.defined() ? ctx.jittered : ctx.x;  // the GEMM's input
  if (ldt == ctx.x.dtype()) {
    ops::linear_bwd(&dx, weight_->main_grad, nullptr, dlogits, gx, weight_->data, gw);
  } else {  // fp32 logits: dx and the weight grad from the upcast operands (recast: no fp32 copy kept)
    ops::linear_bwd(&dx, weight_->main_grad, nullptr, dlogits, upcast(gx), upcast(weight_->data), gw);
  }
  weight_->grad_ready();
  if (ctx.jittered.defined())  // d(x * noise) / dx = noise: the same factors again
    ops::random_scale(dx, dx, 1.0f - jitter_eps_, 1.0f + jitter_eps_, ctx.jitter_key);
  if (ldt != ctx.x.dtype()) {  // dx rounded to the model's dtype
    Tensor dx_model = Tensor::empty(ctx.x.shape(), ctx.x.dtype(), dev);
    ops::cast(dx_model, dx);
    dx = dx_model;
  }
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
