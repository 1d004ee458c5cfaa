// SequentialMLP; contract in experts.h.
#include "mcpp/transformer/moe/experts.h"

#include <fmt/format.h>

#include "mcpp/core/error.h"

namespace mcpp::moe {
namespace {
TransformerConfig expert_config(const TransformerConfig& c) {
  TransformerConfig e = c;
  e.ffn_hidden_size = c.moe_ffn_hidden_size;
  return e;
}
}  // namespace

SequentialMLP::SequentialMLP(ParameterRegistry& params, const std::string& prefix, const TransformerConfig& c,
                             const tensor_parallel::TPContext& expert_tp, int64_t first_expert,
                             int64_t num_local_experts) {
  MCPP_CHECK(c.moe_ffn_hidden_size % expert_tp.size() == 0,
             "moe_ffn_hidden_size ({}) must be divisible by expert_tensor_parallel_size ({})", c.moe_ffn_hidden_size,
             expert_tp.size());
  const TransformerConfig ec = expert_config(c);
  experts_.reserve(static_cast<size_t>(num_local_experts));
  for (int64_t j = 0; j < num_local_experts; ++j) {
    const size_t before = params.params().size();
    experts_.emplace_back(params, fmt::format("{}.local_experts.{}", prefix, first_expert + j), ec, expert_tp,
                          tensor_parallel::Fp8Options{} /* routed experts: the model's dtype */, /*is_expert=*/true);
    std::vector<Parameter*> ps;
    for (size_t q = before; q < params.params().size(); ++q) {
      ps.push_back(params.params()[q].get());
      ps.back()->spec.expert = true;
    }
    params_.push_back(std::move(ps));
  }
}

Tensor SequentialMLP::forward(ExpertsCtx& ctx, const Tensor& x, const std::vector<int64_t>& rows) const {
  MCPP_CHECK(rows.size() == experts_.size(), "SequentialMLP: {} row counts for {} experts", rows.size(),
             experts_.size());
  const int64_t h = x.size(1);
  ctx.mlp.assign(experts_.size(), {});
  ctx.rows = rows;
  ctx.x = x;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  int64_t off = 0;
  for (size_t j = 0; j < experts_.size(); ++j) {
    const int64_t r = rows[j];
    if (r > 0) {
      Tensor out = experts_[j].forward(ctx.mlp[j], x.narrow0(off, r).view({r, 1, h}));  // [r, 1, h]
      y.narrow0(off, r).copy_from(out);
    }
    off += r;
  }
  MCPP_CHECK(off == x.size(0), "SequentialMLP: the row counts sum to {}, x has {} rows", off, x.size(0));
  return y;
}

Tensor SequentialMLP::backward(ExpertsCtx& ctx, const Tensor& dy) const {
  MCPP_CHECK(ctx.mlp.size() == experts_.size(), "SequentialMLP::backward needs the context of its forward");
  const int64_t h = dy.size(1);
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
  int64_t off = dy.size(0);
  for (size_t j = experts_.size(); j-- > 0;) {  // reverse: the order the gradients' buffer expects them ready
    const int64_t r = ctx.rows[j];
    off -= r;
    if (r > 0) {
      Tensor d = experts_[j].backward(ctx.mlp[j], dy.narrow0(off, r).view({r, 1, h}));
      dx.narrow0(off, r).copy_from(d);
    } else {
      for (Parameter* p : params_[j]) {
        materialize_grads({p});
        p->grad_ready();
      }
    }
    ctx.mlp[j] = {};
  }
  ctx.x = Tensor();
  return dx;
}

}  // namespace mcpp::moe
