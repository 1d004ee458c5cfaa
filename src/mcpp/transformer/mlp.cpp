#include "mcpp/transformer/mlp.h"

#include <cmath>

#include "mcpp/core/error.h"
#include "mcpp/core/module_trace.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {

MLP::MLP(ParameterRegistry& params, const std::string& prefix, const TransformerConfig& c,
         const tensor_parallel::TPContext& tp, const tensor_parallel::Fp8Options& fp8, bool is_expert)
    : swiglu_(c.swiglu),
      // (with "moe" too the whole layer is re-run right before its backward: dropping the activation again would only
      // compute it a third time)
      recompute_act_(is_expert && c.recomputes("moe_act") && !c.recomputes("moe")),
      ffn_(c.ffn_hidden_size / tp.size()),
      linear_fc1_(params, prefix + ".linear_fc1",
                  {.input_size = c.hidden_size,
                   .output_size = c.swiglu ? 2 * c.ffn_hidden_size : c.ffn_hidden_size,
                   .bias = c.add_bias_linear,
                   .init_std = c.init_method_std,
                   .sequence_parallel = tp.sequence_parallel && !is_expert,
                   .tp_comm_overlap = tp.comm_overlap && !is_expert,
                   .stride_chunks = c.swiglu ? 2 : 1,
                   .explicit_expert_comm = is_expert,
                   .fp8 = fp8},
                  tp.group),
      linear_fc2_(params, prefix + ".linear_fc2",
                  {.input_size = c.ffn_hidden_size,
                   .output_size = c.hidden_size,
                   .bias = c.add_bias_linear,
                   .init_std = c.init_method_std / std::sqrt(2.0f * static_cast<float>(c.num_layers)),
                   .sequence_parallel = tp.sequence_parallel && !is_expert,
                   .tp_comm_overlap = tp.comm_overlap && !is_expert,
                   .explicit_expert_comm = is_expert,
                   .fp8 = fp8},
                  tp.group) {}

Tensor MLP::forward(MLPCtx& ctx, const Tensor& x, const tensor_parallel::Fp8Recompute* fp8_recompute,
                    const ops::Fp8Norm* x_norm) const {
  const ModuleScope m("mlp", x);
  MCPP_CHECK(!x_norm || fuses_input_norm(), "mlp: the input's norm in fc1's cast needs FP8 delayed scaling");
  Tensor y;
  if (fp8_act_in_casts()) {  // FP8 delayed: fc1's output is the pre-activation; the activation rides in fc2's cast
    Tensor h1 = linear_fc1_.forward(ctx.fc1, x, fp8_recompute, x_norm);  // [s, b, f/tp] (SwiGLU: [s, b, 2f/tp])
    ctx.pre_act = h1.view({-1, h1.size(-1)});                             // [n, f/tp] or [n, 2f/tp], kept for backward
    y = linear_fc2_.forward(ctx.fc2, h1, fp8_recompute,
                            swiglu_ ? ops::Fp8Act::Swiglu : ops::Fp8Act::Gelu);  // [s(/tp), b, h]
  } else if (!swiglu_) {  // GELU: bias + GELU ride in fc1's GEMM (linear_gelu_fwd); pre_act kept for backward
    Tensor act = linear_fc1_.forward_gelu(ctx.fc1, x, ctx.pre_act, fp8_recompute);  // [s, b, f/tp]; pre_act [n, f/tp]
    y = linear_fc2_.forward(ctx.fc2, act, fp8_recompute);             // [s(/tp), b, h]
  } else {
    Tensor h1 = linear_fc1_.forward(ctx.fc1, x, fp8_recompute, x_norm);  // [s, b, 2f/tp]
    ctx.pre_act = h1.view({-1, 2 * ffn_});                            // [n, 2f/tp]
    Tensor act = Tensor::empty({ctx.pre_act.size(0), ffn_}, h1.dtype(), x.device());  // [n, f/tp]
    ops::swiglu_fwd(act, ctx.pre_act);
    y = linear_fc2_.forward(ctx.fc2, act.view({h1.size(0), h1.size(1), ffn_}), fp8_recompute);  // [s(/tp), b, h]
  }
  if (recompute_act_) ctx.fc2.x = Tensor();  // moe_act: re-run from pre_act in backward
  return m.ret(y);
}

Tensor MLP::backward(MLPCtx& ctx, const Tensor& dy, bool output_bias_grad_elsewhere) const {
  const ModuleScope m("mlp", dy, ModuleScope::kBackward);
  if (recompute_act_ && !ctx.fc2.x.defined()) {  // moe_act: fc2's input again, from the kept pre_act
    Tensor act = Tensor::empty({ctx.pre_act.size(0), ffn_}, ctx.pre_act.dtype(), ctx.pre_act.device());
    if (swiglu_) ops::swiglu_fwd(act, ctx.pre_act);
    else ops::gelu_fwd(act, ctx.pre_act);
    ctx.fc2.x = act;
  }
  if (fp8_act_in_casts()) {  // FP8 delayed: fc2 returns the gradient of the activation's output; the activation's
                             // backward rides in fc1's gradient cast
    Tensor dact = linear_fc2_.backward(ctx.fc2, dy, output_bias_grad_elsewhere);  // [s, b, f/tp]
    return m.ret(linear_fc1_.backward(ctx.fc1, dact, &ctx.pre_act,
                                      swiglu_ ? ops::Fp8Act::DSwiglu : ops::Fp8Act::DGelu));  // [s(/tp), b, h]
  }
  if (!swiglu_) {  // GELU: gelu' rides in fc2's dgrad GEMM (linear_dgelu_bwd); fc1's bias grad in fc1's wgrad
    Tensor dpre = linear_fc2_.backward_dgelu(ctx.fc2, dy, ctx.pre_act, output_bias_grad_elsewhere);  // [s, b, f/tp]
    return m.ret(linear_fc1_.backward(ctx.fc1, dpre));                    // [s(/tp), b, h]
  }
  Tensor dact3 = linear_fc2_.backward(ctx.fc2, dy, output_bias_grad_elsewhere);  // [s, b, f/tp]
  Tensor dact = dact3.view({-1, ffn_});
  Tensor dpre = Tensor::empty(ctx.pre_act.shape(), dact.dtype(), dy.device());
  if (swiglu_) ops::swiglu_bwd(dpre, dact, ctx.pre_act);
  else ops::gelu_bwd(dpre, dact, ctx.pre_act);
  return m.ret(linear_fc1_.backward(ctx.fc1, dpre.view({dact3.size(0), dact3.size(1), -1})));  // [s(/tp), b, h]
}

int64_t MLP::saved_bytes(const TransformerConfig& m, const ActivationDims& d, int64_t rows, int64_t f,
                         bool keeps_input) {
  const int64_t fc1_out = (m.swiglu ? 2 : 1) * f;
  if (d.fp8)  // fc1's and fc2's casts; the pre-activation (fc2's input, the activation, dropped or never written)
    return fp8_saved_bytes(d, rows, d.h, fc1_out) + rows * fc1_out * d.e + fp8_saved_bytes(d, rows, f, d.h);
  return (keeps_input ? rows * d.h * d.e : 0) + (m.swiglu ? 3 : 2) * rows * f * d.e;
}

}  // namespace mcpp
