// MoELayer; contract in moe_layer.h.
#include "mcpp/transformer/moe/moe_layer.h"

#include <algorithm>
#include <cmath>

#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/core/error.h"
#include "mcpp/core/module_trace.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/transformer/mlp.h"

namespace mcpp::moe {
namespace {
// The experts' TP context: the expert-TP group (tp.etp), or at expert TP 1 a size-1 group — one for the process,
// shared by every MoE layer (no collective ever runs on it; its recorder keeps a single entry). Under TP the layer
// needs sequence parallelism (Megatron's rule): each TP rank then routes its own s/tp tokens, and the experts see
// TP peers' tokens only through the dispatcher (over expert-TP, whatever the TP size).
tensor_parallel::TPContext expert_tp(const tensor_parallel::TPContext& tp) {
  MCPP_CHECK(tp.size() == 1 || tp.sequence_parallel,
             "MoE layers with tensor_model_parallel_size {} need sequence parallelism (Megatron's rule)", tp.size());
  if (tp.etp) return {.group = tp.etp};
  static const comm::CommPtr group = comm::make_local_world(1);
  return {.group = group};
}
TransformerConfig shared_expert_config(const TransformerConfig& c) {
  TransformerConfig s = c;
  s.ffn_hidden_size = c.moe_shared_expert_intermediate_size;
  return s;
}
}  // namespace

MoELayer::MoELayer(ParameterRegistry& params, ParameterRegistry& expert_params, const std::string& prefix,
                   const TransformerConfig& c, const tensor_parallel::TPContext& tp,
                   const tensor_parallel::Fp8Options& shared_expert_fp8)
    : pad_(c.moe_expert_capacity_factor > 0.0 && c.moe_pad_expert_input_to_capacity),
      recompute_shared_(c.recomputes("shared_experts") && !c.recomputes("moe")),  // "moe" re-runs all of it anyway
      router_(params, prefix + ".router", c, tp),
      dispatcher_(c.num_moe_experts, tp.ep, tp.etp),
      experts_(expert_params, prefix + ".experts", c, expert_tp(tp), dispatcher_.first_local_expert(),
               dispatcher_.num_local_experts()) {
  if (c.moe_grouped_gemm) {
    grouped_ = std::make_unique<GroupedMLP>(experts_, c, dispatcher_.etp_rank());
    device_counts_ = counts_on_device(c, dispatcher_.ep_size(), dispatcher_.etp_size());
    router_.set_device_counts(device_counts_);
  }
  if (c.moe_shared_expert_intermediate_size > 0)
    shared_experts_ = std::make_unique<MLP>(params, prefix + ".shared_experts", shared_expert_config(c), tp,
                                            shared_expert_fp8);
  if (c.moe_shared_expert_gate) {  // Megatron's gate_weight: replicated, a sequence-parallel parameter under SP
    MCPP_CHECK(shared_experts_, "moe_shared_expert_gate needs a shared expert");
    shared_gate_ = params.add(ParamSpec{.key = prefix + ".shared_experts.gate_weight", .shape = {1, c.hidden_size},
                                        .init = InitKind::Normal, .std = c.init_method_std,
                                        .sequence_parallel = tp.sequence_parallel && tp.size() > 1});
  }
}

const Tensor& MoELayer::rows(int64_t n, Device dev) const {
  if (!rows_.defined() || rows_.numel() != n || rows_.device() != dev) {
    Tensor h = Tensor::empty({n, 1}, DType::I32);
    for (int64_t t = 0; t < n; ++t) h.data<int32_t>()[t] = static_cast<int32_t>(t);
    rows_ = h.to(dev);
  }
  return rows_;
}

const Tensor& MoELayer::expert_counts(const std::vector<int64_t>& counts) const {
  if (!counts_.defined() || counts_.numel() != static_cast<int64_t>(counts.size()) ||
      !std::equal(counts.begin(), counts.end(), counts_.data<int64_t>())) {
    counts_ = Tensor::empty({static_cast<int64_t>(counts.size())}, DType::I64);
    std::copy(counts.begin(), counts.end(), counts_.data<int64_t>());
  }
  return counts_;
}

Tensor MoELayer::forward(MoELayerCtx& ctx, const Tensor& x, LossTracker* losses, bool training,
                        tensor_parallel::RngTracker* rng, const tensor_parallel::Fp8Recompute* fp8_recompute) const {
  MCPP_CHECK(x.ndim() == 3, "MoELayer: x must be [s, b, h]; got {}", x.str());
  const ModuleScope m("moe", x);
  const int64_t h = x.size(2), n = x.size(0) * x.size(1), k = router_.topk();
  Tensor x2 = x.view({n, h});
  {  // the routing on x's device (x.size(1) sequences; its losses added to `losses`), the buffer's rows on the host
    const ModuleScope router_scope("router", x2);
    router_.forward(ctx.router, x2, x.size(1), losses, training, rng);
    router_scope.out(ctx.router.topk);
  }
  // padded: every EP rank's blocks are the capacity of as many tokens (no all-gather of the counts)
  ctx.plan = device_counts_ ? dispatcher_.plan_local(ctx.router.idx, n, k)
                           : dispatcher_.plan(ctx.router.idx, ctx.router.rows_per_expert, n, k, pad_);
  // [m, h] expert-major (m = n*k dropless; the kept routes, or E * capacity padded: the padding rows zero)
  Tensor permuted = pad_
                        ? Tensor::zeros({ctx.plan.rows, h}, x.dtype(), x.device())
                        : Tensor::empty({ctx.plan.rows, h}, x.dtype(), x.device());
  ops::moe_permute(permuted, x2, ctx.plan.idx);
  Tensor grouped = dispatcher_.to_experts(ctx.plan, permuted);  // [rows, h] by local expert
  Tensor out;
  {
    const ModuleScope experts_scope("experts", grouped);
    if (grouped_)  // the per-expert rows: the router's on the device (dropless, EP 1), else the plan's on the host
      out = experts_scope.ret(grouped_->forward(
          ctx.experts, grouped, device_counts_ ? ctx.router.counts : expert_counts(ctx.plan.tokens_per_local_expert)));
    else
      out = experts_scope.ret(experts_.forward(ctx.experts, grouped, ctx.plan.tokens_per_local_expert));
  }
  ctx.combined = dispatcher_.from_experts(ctx.plan, out);  // [m, h]
  ctx.probs = ctx.router.weights;  // [n, k] fp32: the combine weights
  Tensor y = Tensor::empty({n, h}, x.dtype(), x.device());
  ops::moe_unpermute(y, ctx.combined, ctx.plan.idx, &ctx.probs);
  if (shared_experts_) {
    // recompute "shared_experts": its FP8 linears' scales recorded for the re-run in backward (fp8_recompute.h)
    const bool dropped = recompute_shared_ && training;
    ctx.shared_fp8 = {};
    using tensor_parallel::Fp8Recompute;
    const Fp8Recompute rc = dropped ? Fp8Recompute::recording(fp8_recompute, ctx.shared_fp8) : Fp8Recompute{};
    Tensor shared = shared_experts_->forward(ctx.shared, x, dropped ? &rc : fp8_recompute).view({n, h});
    if (shared_gate_) {  // y += sigmoid(x w^T) * shared, per token
      Tensor logit = Tensor::empty({n, 1}, x.dtype(), x.device());
      ops::linear_fwd(logit, x2, shared_gate_->data, nullptr);
      ctx.gate_top = Tensor::empty({n, 1}, DType::I32, x.device());
      ctx.gate = Tensor::empty({n, 1}, DType::F32, x.device());
      ctx.gate_scores = Tensor::empty({n, 1}, DType::F32, x.device());
      ctx.gate_lse = Tensor::empty({n}, DType::F32, x.device());
      ops::moe_topk_softmax(ctx.gate_top, ctx.gate, ctx.gate_scores, ctx.gate_lse, logit, {.sigmoid = true});
      ctx.shared_out = shared;
      Tensor gated = Tensor::empty({n, h}, x.dtype(), x.device());
      ops::moe_unpermute(gated, shared, rows(n, x.device()), &ctx.gate);
      shared = gated;
    }
    ops::add_inplace(y, shared);
    if (dropped) {  // keep the input only; backward re-runs the shared expert
      ctx.shared = {};
      ctx.shared_input = x;
    }
  }
  return m.ret(y.view(x.shape()));
}

void MoELayer::release_input(MoELayerCtx& ctx) const {
  ctx.router.x = Tensor();
  ctx.shared_input = Tensor();
  if (shared_experts_) shared_experts_->release_input(ctx.shared);
}

void MoELayer::restore_input(MoELayerCtx& ctx, const Tensor& x) const {
  ctx.router.x = x.view({ctx.router.n, x.size(-1)});
  if (!shared_experts_) return;
  if (recompute_shared_) ctx.shared_input = x;  // the shared expert is re-run from it
  else shared_experts_->restore_input(ctx.shared, x);
}

Tensor MoELayer::backward(MoELayerCtx& ctx, const Tensor& dy, float loss_grad_scale) const {
  MCPP_CHECK(ctx.combined.defined(), "MoELayer::backward needs the context of its forward");
  const ModuleScope m("moe", dy, ModuleScope::kBackward);
  const int64_t h = dy.size(-1), n = ctx.plan.n, k = ctx.plan.k;
  Tensor dy2 = dy.view({n, h});
  Tensor dx_shared;  // first: the reverse of the registration order (router, experts, shared experts, gate)
  if (ctx.shared_input.defined()) {  // recompute "shared_experts": its context again (the gate's was kept)
    const auto replay = tensor_parallel::Fp8Recompute::replaying(ctx.shared_fp8);  // the first forward's FP8 scales
    shared_experts_->forward(ctx.shared, ctx.shared_input, &replay);
    ctx.shared_input = Tensor();
    ctx.shared_fp8 = {};
  }
  if (shared_gate_) {  // d shared = g dy, dg = <dy, shared> -> d logit = dg g (1 - g) -> the gate's dx and grad
    Tensor dshared = Tensor::empty({n, h}, dy.dtype(), dy.device());
    Tensor dg = Tensor::empty({n, 1}, DType::F32, dy.device());
    ops::moe_unpermute_bwd(dshared, dg, dy2, ctx.shared_out, rows(n, dy.device()), ctx.gate);
    Tensor dlogit = Tensor::empty({n, 1}, dy.dtype(), dy.device());
    ops::moe_topk_softmax_bwd(dlogit, dg, ctx.gate, ctx.gate_top, ctx.gate_scores, ctx.gate_lse,
                              Tensor::zeros({1, 1}, DType::F32, dy.device()), {.sigmoid = true});
    Tensor dx_gate = Tensor::empty({n, h}, dy.dtype(), dy.device());
    const ops::GradWrite gw =
        take_grad_overwrite({shared_gate_}) ? ops::GradWrite::Overwrite : ops::GradWrite::Accumulate;
    ops::linear_bwd(&dx_gate, shared_gate_->main_grad, nullptr, dlogit, ctx.router.x, shared_gate_->data, gw);
    shared_gate_->grad_ready();
    dx_shared = shared_experts_->backward(ctx.shared, dshared.view(dy.shape()));
    ops::add_inplace(dx_shared, dx_gate.view(dy.shape()));
  } else if (shared_experts_) {
    dx_shared = shared_experts_->backward(ctx.shared, dy);
  }
  // [m, h]; padding rows (named by no route) get a zero gradient
  Tensor dcombined = pad_ ? Tensor::zeros(ctx.combined.shape(), dy.dtype(), dy.device())
                          : Tensor::empty(ctx.combined.shape(), dy.dtype(), dy.device());
  Tensor dprobs = Tensor::empty({n, k}, DType::F32, dy.device());
  ops::moe_unpermute_bwd(dcombined, dprobs, dy2, ctx.combined, ctx.plan.idx, ctx.probs);
  ctx.combined = Tensor();
  Tensor dgrouped = dispatcher_.to_experts(ctx.plan, dcombined);
  Tensor dexperts_in;
  {
    const ModuleScope experts_scope("experts", dgrouped, ModuleScope::kBackward);
    dexperts_in = experts_scope.ret(grouped_ ? grouped_->backward(ctx.experts, dgrouped)
                                             : experts_.backward(ctx.experts, dgrouped));
  }
  Tensor dpermuted = dispatcher_.from_experts(ctx.plan, dexperts_in);  // [m, h]
  Tensor dx = Tensor::empty({n, h}, dy.dtype(), dy.device());
  ops::moe_unpermute(dx, dpermuted, ctx.plan.idx, nullptr);  // the permute's backward: each token's k rows summed
  Tensor dx_router;
  {
    const ModuleScope router_scope("router", dprobs, ModuleScope::kBackward);
    dx_router = router_scope.ret(router_.backward(ctx.router, dprobs, loss_grad_scale));
  }
  ops::add_inplace(dx, dx_router);
  if (dx_shared.defined()) ops::add_inplace(dx, dx_shared.view({n, h}));
  ctx = {};
  return m.ret(dx.view(dy.shape()));
}

namespace {
// The router's load-balancing statistics kept for the backward: [1, E] (aux_loss), [b, E] (seq_aux_loss), none.
int64_t aux_count_rows(const TransformerConfig& m, int64_t micro_batch) {
  if (m.moe_aux_loss_coeff <= 0.0f) return 0;
  if (m.moe_router_load_balancing_type == "aux_loss") return 1;
  return m.moe_router_load_balancing_type == "seq_aux_loss" ? micro_batch : 0;
}
}  // namespace

bool MoELayer::counts_on_device(const TransformerConfig& c, int64_t ep, int64_t etp) {
  return c.moe_grouped_gemm && c.moe_expert_capacity_factor <= 0.0 && ep == 1 && etp == 1;
}

int64_t MoELayer::saved_bytes(const TransformerConfig& m, const ActivationDims& d, int64_t norm_out) {
  const bool sigmoid_z = m.moe_router_score_function == "sigmoid" && m.moe_z_loss_coeff > 0.0f;
  const int64_t routes = d.n_local * m.moe_router_topk;
  int64_t rows = routes;  // the experts' rows: every route (dropless), at most E * capacity, or exactly (padded)
  if (m.moe_expert_capacity_factor > 0.0) {
    const int64_t cap = static_cast<int64_t>(std::ceil(static_cast<double>(routes) /
                                                       static_cast<double>(m.num_moe_experts) *
                                                       m.moe_expert_capacity_factor));
    rows = m.moe_pad_expert_input_to_capacity ? m.num_moe_experts * cap : std::min(routes, m.num_moe_experts * cap);
  }
  int64_t bytes = norm_out * d.n_local * d.h * d.e                           // the router's input (not gathered)
                  + (m.moe_input_jitter_eps > 0.0f ? d.n_local * d.h * d.e : 0)  // ... and its jittered copy
                  + 3 * routes * 4                                          // topk, idx (int32), probs (fp32)
                  + d.n_local * (m.num_moe_experts + 1) * 4                 // scores [n_l, E] + lse [n_l] (fp32)
                  + aux_count_rows(m, d.b) * m.num_moe_experts * 4          // the load-balancing counts (fp32)
                  + (sigmoid_z ? d.n_local * (m.num_moe_experts + 1) * 4 : 0)  // the z-loss's softmax + lse
                  + (d.etp + 1) * rows * d.h * d.e              // the experts' rows in (gathered over expert-TP) + out
                  + ((m.swiglu ? 3 : 2) - (m.recomputes("moe_act") ? 1 : 0))  // every expert's MLP context (moe_act:
                        * d.etp * rows * (m.moe_ffn_hidden_size / d.etp) * d.e;  // without the activation's output)
  // grouped GEMM, dropless at EP 1 and expert-TP 1: the router's int64 [E] counts, the grouped experts' row counts on
  // the device (RouterCtx::counts; otherwise the plan's, on the host)
  if (counts_on_device(m, d.ep, d.etp)) bytes += m.num_moe_experts * 8;
  if (m.moe_shared_expert_intermediate_size > 0) {  // a dense MLP of width fs per TP rank on every token
    // its fc1 input gathered under SP (else the router's) and its MLP context; none when recomputed
    // ("shared_experts": re-run in backward), the gate's kept either way
    if (!m.recomputes("shared_experts"))
      bytes += MLP::saved_bytes(m, d, d.n, m.moe_shared_expert_intermediate_size / d.tp,
                                d.sequence_parallel() && norm_out > 0);
    bytes += m.moe_shared_expert_gate ? d.n_local * (d.h * d.e + 4 * 4) : 0;  // ungated output, g, s, lse, top
  }
  return bytes;
}

}  // namespace mcpp::moe
