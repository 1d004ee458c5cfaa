// GroupedMLP; contract in grouped_mlp.h.
#include "mcpp/transformer/moe/grouped_mlp.h"

#include <string>

#include "mcpp/core/error.h"
#include "mcpp/core/module_trace.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::moe {
namespace {
bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

Parameter* find(const std::vector<Parameter*>& ps, const std::string& tail) {
  for (Parameter* p : ps)
    if (ends_with(p->spec.key, tail)) return p;
  return nullptr;
}

// take_grad_overwrite over a list: Overwrite when every main grad is stale (the grouped wgrad's beta = 0), else
// the stale ones zeroed and Accumulate.
ops::GradWrite grad_write(const std::vector<Parameter*>& ps) {
  bool all_stale = true;
  for (Parameter* p : ps) all_stale = all_stale && p->grad_stale;
  if (!all_stale) {
    zero_stale_main_grads(ps);
    return ops::GradWrite::Accumulate;
  }
  for (Parameter* p : ps) p->grad_stale = false;
  return ops::GradWrite::Overwrite;
}
}  // namespace

std::vector<Tensor> GroupedMLP::Linear::weights() const {
  std::vector<Tensor> out;
  for (Parameter* p : weight) out.push_back(p->data);
  return out;
}
std::vector<Tensor> GroupedMLP::Linear::biases() const {
  std::vector<Tensor> out;
  for (Parameter* p : bias) out.push_back(p->data);
  return out;
}

GroupedMLP::GroupedMLP(const SequentialMLP& experts, const TransformerConfig& c, int etp_rank)
    : swiglu_(c.swiglu),
      recompute_act_(c.recomputes("moe_act") && !c.recomputes("moe")),  // MLP's rule for routed experts
      fc2_bias_(c.add_bias_linear && etp_rank == 0) {
  MCPP_CHECK(experts.num_local_experts() <= ops::kMaxGemmGroups,
             "moe_grouped_gemm: {} local experts; at most {} (use expert_model_parallel_size or drop the flag)",
             experts.num_local_experts(), ops::kMaxGemmGroups);
  for (int64_t j = 0; j < experts.num_local_experts(); ++j) {
    const std::vector<Parameter*>& ps = experts.params(j);
    Parameter* w1 = find(ps, ".linear_fc1.weight");
    Parameter* w2 = find(ps, ".linear_fc2.weight");
    MCPP_CHECK(w1 && w2, "GroupedMLP: local expert {} has no linear_fc1 / linear_fc2 weights", j);
    fc1_.weight.push_back(w1);
    fc2_.weight.push_back(w2);
    if (c.add_bias_linear) {
      Parameter* b1 = find(ps, ".linear_fc1.bias");
      Parameter* b2 = find(ps, ".linear_fc2.bias");
      MCPP_CHECK(b1 && b2, "GroupedMLP: local expert {} has no linear_fc1 / linear_fc2 biases", j);
      fc1_.bias.push_back(b1);
      fc2_.bias.push_back(b2);
    }
  }
}

Tensor GroupedMLP::forward(ExpertsCtx& ctx, const Tensor& x, const Tensor& counts) const {
  MCPP_CHECK(x.ndim() == 2 && counts.numel() == static_cast<int64_t>(fc1_.weight.size()),
             "GroupedMLP: x must be [rows, h] with {} expert counts; got {} and {}", fc1_.weight.size(), x.str(),
             counts.str());
  const ModuleScope m("mlp", x);
  const int64_t rows = x.size(0), f1 = fc1_.weight[0]->data.size(0), h = fc2_.weight[0]->data.size(0);
  ctx.x = x;
  ctx.counts = counts;
  ctx.pre_act = Tensor::empty({rows, f1}, x.dtype(), x.device());  // [rows, f or 2f] (per expert-TP rank)
  ctx.act = Tensor::empty({rows, swiglu_ ? f1 / 2 : f1}, x.dtype(), x.device());  // [rows, f]
  if (swiglu_) {
    ops::grouped_linear_fwd(ctx.pre_act, x, fc1_.weights(), fc1_.biases(), counts);
    ops::swiglu_fwd(ctx.act, ctx.pre_act);
  } else {  // bias + GELU with fc1's GEMM (grouped_mlp.h: in its epilogue where cuBLASLt runs it), pre_act kept
    ops::grouped_linear_gelu_fwd(ctx.act, ctx.pre_act, x, fc1_.weights(), fc1_.biases(), counts);
  }
  Tensor y = Tensor::empty({rows, h}, x.dtype(), x.device());  // [rows, h] (partial sums over expert-TP)
  ops::grouped_linear_fwd(y, ctx.act, fc2_.weights(), fc2_bias_ ? fc2_.biases() : std::vector<Tensor>{}, counts);
  if (recompute_act_) ctx.act = Tensor();  // moe_act: re-run from pre_act in backward
  return m.ret(y);
}

void GroupedMLP::linear_backward(const Linear& l, Tensor* dx, const Tensor& dy, const Tensor& x,
                                 const Tensor& counts) const {
  if (dx) ops::grouped_linear_dgrad(*dx, dy, l.weights(), counts);  // dx rows = dy rows @ W_e
  std::vector<Parameter*> ps = l.weight;
  ps.insert(ps.end(), l.bias.begin(), l.bias.end());
  const ops::GradWrite gw = grad_write(ps);
  std::vector<Tensor> dw, db;
  for (Parameter* p : l.weight) dw.push_back(p->main_grad);
  for (Parameter* p : l.bias) db.push_back(p->main_grad);
  ops::grouped_linear_wgrad(dw, db, dy, x, counts, gw);  // dW_e (+)= dy_e^T x_e, db_e (+)= sum dy_e
}

Tensor GroupedMLP::backward(ExpertsCtx& ctx, const Tensor& dy) const {
  MCPP_CHECK(ctx.pre_act.defined(), "GroupedMLP::backward needs the context of its forward");
  const ModuleScope m("mlp", dy, ModuleScope::kBackward);
  const int64_t rows = dy.size(0), f1 = ctx.pre_act.size(1);
  if (!ctx.act.defined()) {  // moe_act: fc2's input again, from the kept pre_act
    ctx.act = Tensor::empty({rows, swiglu_ ? f1 / 2 : f1}, dy.dtype(), dy.device());
    if (swiglu_) ops::swiglu_fwd(ctx.act, ctx.pre_act);
    else ops::gelu_fwd(ctx.act, ctx.pre_act);
  }
  Tensor dpre = Tensor::empty(ctx.pre_act.shape(), dy.dtype(), dy.device());  // [rows, f or 2f]
  if (swiglu_) {
    Tensor dact = Tensor::empty(ctx.act.shape(), dy.dtype(), dy.device());  // [rows, f]
    linear_backward(fc2_, &dact, dy, ctx.act, ctx.counts);
    ops::swiglu_bwd(dpre, dact, ctx.pre_act);
  } else {  // gelu' with fc2's dgrad GEMM (in its epilogue where cuBLASLt runs it), then fc2's wgrad
    ops::grouped_linear_dgelu_bwd(dpre, dy, fc2_.weights(), ctx.pre_act, ctx.counts);
    linear_backward(fc2_, nullptr, dy, ctx.act, ctx.counts);
  }
  ctx.act = Tensor();
  ctx.pre_act = Tensor();
  Tensor dx = Tensor::empty(ctx.x.shape(), dy.dtype(), dy.device());  // [rows, h]
  linear_backward(fc1_, &dx, dpre, ctx.x, ctx.counts);
  // ready in SequentialMLP's order: the experts in reverse, each fc2's then fc1's (weight, bias)
  for (size_t j = fc1_.weight.size(); j-- > 0;) {
    fc2_.weight[j]->grad_ready();
    if (!fc2_.bias.empty()) fc2_.bias[j]->grad_ready();
    fc1_.weight[j]->grad_ready();
    if (!fc1_.bias.empty()) fc1_.bias[j]->grad_ready();
  }
  ctx.x = Tensor();
  ctx.counts = Tensor();
  return m.ret(dx);
}

}  // namespace mcpp::moe
