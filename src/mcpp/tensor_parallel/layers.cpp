#include "mcpp/tensor_parallel/layers.h"

#include <functional>

#include "mcpp/core/error.h"
#include "mcpp/core/module_trace.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/tensor_parallel/mappings.h"

namespace mcpp::tensor_parallel {

TensorShard tp_shard(const Shape& global, int dim, int tp_size, int tp_rank, int64_t stride_chunks) {
  TensorShard sh;
  if (tp_size == 1) return sh;
  const int64_t total = global[static_cast<size_t>(dim)];
  MCPP_CHECK(total % (stride_chunks * tp_size) == 0, "dimension {} of {} is not divisible by {} x tp={}", dim,
             shape_str(global), stride_chunks, tp_size);
  const int64_t chunk = total / stride_chunks, part = chunk / tp_size;
  sh.partition_dim = dim;
  sh.global_shape = global;
  for (int64_t c = 0; c < stride_chunks; ++c)
    sh.segments.push_back({.global_offset = c * chunk + tp_rank * part, .local_offset = c * part, .length = part});
  return sh;
}

namespace {
Tensor rows(const Tensor& t, int64_t last) { return t.view({-1, last}); }
Shape with_last(Shape s, int64_t last) {
  s.back() = last;
  return s;
}
// How a linear backward writes the weight's (and bias's) main grad: overwritten by the step's first write
// (ParamAndGradBuffer::set_overwrite_main_grad), accumulated otherwise.
ops::GradWrite grad_write(Parameter* weight, Parameter* bias) {
  return take_grad_overwrite({weight, bias}) ? ops::GradWrite::Overwrite : ops::GradWrite::Accumulate;
}

// The layer's FP8 state (registered for checkpoints), or null without FP8.
std::shared_ptr<Fp8LinearState> make_fp8(ParameterRegistry& params, const std::string& prefix,
                                         const ParallelLinearOptions& opt, const comm::CommPtr& tp) {
  if (!opt.fp8.enabled) return nullptr;
  MCPP_CHECK(!opt.tp_comm_overlap, "{}: FP8 linears do not run with --tp-comm-overlap", prefix);
  MCPP_CHECK(!opt.explicit_expert_comm, "{}: FP8 is not supported for an expert's linear", prefix);
  auto st = std::make_shared<Fp8LinearState>(opt.fp8, prefix, tp);
  for (const auto& [key, t] : st->state_tensors()) params.add_rank_state(key, t);
  return st;
}

// y [n, out] = x [n, in] W^T (+ bias) with FP8 GEMMs; ctx keeps the scales the backward casts x and w with (blockwise:
// the op scales per block, nothing kept). x_act Gelu: the GEMM's input is gelu(x), applied in x's cast; Norm: the
// norm x_norm of x. Under activation recompute (rc, fp8_recompute.h) a re-run casts with its first forward's stashed
// scales and leaves the state alone; a first forward stashes the scales it used.
void fp8_forward(Fp8LinearState& st, ParallelLinearCtx& ctx, Tensor& y, const Tensor& x, const Tensor& w,
                 const Tensor* bias, const Fp8Recompute* rc, ops::Fp8Act x_act = ops::Fp8Act::None,
                 const ops::Fp8Norm* x_norm = nullptr) {
  MCPP_CHECK(x_act == ops::Fp8Act::None || st.delayed(), "{}: an activation fused into the FP8 input cast needs the "
             "delayed recipe", st.prefix());
  MCPP_CHECK((x_act == ops::Fp8Act::Norm) == (x_norm != nullptr), "{}: the Norm input cast needs its norm",
             st.prefix());
  if (st.blockwise()) {  // per-call block scales from x and w themselves: nothing to keep, replay or update
    ops::fp8_block_linear_fwd(y, x, w);
    if (bias) ops::bias_add_inplace(y, *bias);
    return;
  }
  const bool replay = rc && rc->replay;
  Fp8LinearState::Forward f;
  if (replay) {
    const Fp8ScaleStash::Entry& e = rc->replay->take(&st, st.prefix());
    f = st.replayed(e.x_scale, e.w_scale);
  } else {
    f = st.forward(x, w);
  }
  f.x.act = x_act;
  if (x_norm) f.x.norm = *x_norm;
  ops::fp8_linear_fwd(y, x, w, bias, f.x, f.w, &ctx.fp8_saved);  // the bias in the GEMM's epilogue
  if (!replay) st.after_forward();
  ctx.fp8_x_scale = f.x_scale;
  ctx.fp8_w_scale = f.w_scale;
  if (rc)
    for (Fp8ScaleStash* s : rc->record) s->push(&st, f.x_scale, f.w_scale);
}

// The FP8 backward: dx [n, in] (skipped when null), dw += dy^T x, db += sum dy, with the forward's x / w scales.
// pre_act (null: none): dy is the gradient of act(y), pre_act = y; the layer's own gradient (dy_act DGelu:
// dy * gelu'(pre_act); DSwiglu: swiglu_bwd(dy, pre_act)) is taken in dy's cast.
void fp8_backward(Fp8LinearState& st, ParallelLinearCtx& ctx, Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy,
                  const Tensor& w, ops::GradWrite gw, const Tensor* pre_act = nullptr,
                  ops::Fp8Act dy_act = ops::Fp8Act::DGelu) {
  MCPP_CHECK(!pre_act || st.delayed(), "{}: an activation fused into the FP8 gradient cast needs the delayed recipe",
             st.prefix());
  if (st.blockwise()) {
    ops::fp8_block_linear_bwd(dx, dw, db, dy, ctx.x, w, st.grad_format(), gw);
    return;
  }
  MCPP_CHECK(ctx.fp8_x_scale.defined(), "FP8 linear backward without its forward's scales");
  ops::Fp8Operand g = st.backward(dy);
  if (pre_act) g.act = dy_act, g.act_input = *pre_act;
  ops::fp8_linear_bwd(dx, dw, db, dy, ctx.x, w, g, {.scale = ctx.fp8_x_scale}, {.scale = ctx.fp8_w_scale},
                      &ctx.fp8_saved, gw);
  ctx.fp8_saved = {};
  st.after_backward();
}

// The end of a forward: n recorded; under an FP8 per-tensor recipe x dropped (the backward reads ctx.fp8_saved).
void finish_forward(ParallelLinearCtx& ctx) {
  ctx.rows = ctx.x.size(0);
  if (ctx.fp8_saved.x.defined()) ctx.x = Tensor();
}
int64_t input_rows(const ParallelLinearCtx& ctx) { return ctx.x.defined() ? ctx.x.size(0) : ctx.rows; }
}  // namespace

ColumnParallelLinear::ColumnParallelLinear(ParameterRegistry& params, const std::string& prefix,
                                           const ParallelLinearOptions& opt, comm::CommPtr tp)
    : tp_(std::move(tp)), opt_(opt), name_(prefix) {
  const int t = tp_->size();
  MCPP_CHECK(!opt.explicit_expert_comm || !opt.sequence_parallel, "{}: an expert's linear is not sequence parallel",
             prefix);
  MCPP_CHECK(opt.output_size % t == 0, "{}: output size {} not divisible by tp={}", prefix, opt.output_size, t);
  out_local_ = opt.output_size / t;
  weight_ = params.add({.key = prefix + ".weight",
                        .shape = {out_local_, opt.input_size},
                        .init = InitKind::Normal,
                        .std = opt.init_std,
                        .shard = tp_shard({opt.output_size, opt.input_size}, 0, t, tp_->rank(), opt.stride_chunks)});
  if (opt.bias)
    bias_ = params.add({.key = prefix + ".bias",
                        .shape = {out_local_},
                        .init = InitKind::Zeros,
                        .no_weight_decay = true,
                        .shard = tp_shard({opt.output_size}, 0, t, tp_->rank(), opt.stride_chunks)});
  fp8_ = make_fp8(params, prefix, opt, tp_);
}

ColumnParallelLinear::ColumnParallelLinear(Parameter* shared_weight, const ParallelLinearOptions& opt,
                                           comm::CommPtr tp)
    : tp_(std::move(tp)), opt_(opt), out_local_(shared_weight->spec.shape[0]), weight_(shared_weight),
      owns_weight_(false), name_("output_layer") {}

namespace {
// The SP all-gather of x [s/tp, b, cols] -> [s, b, cols] with `gemm(first, in_rows)` run on gathered rows
// [first, first + in_rows.size(0)) of the [s*b, cols] result: one all-gather then one call over all rows
// (first = 0), or with --tp-comm-overlap the ring, each chunk's call overlapping the next chunk's transfer.
Tensor gather_then(comm::Communicator& tp, const Tensor& x, int64_t cols, bool ring,
                   const std::function<void(int64_t first, const Tensor& in_rows)>& gemm) {
  if (!ring) {
    Tensor full = all_gather_sp(tp, x);
    gemm(0, rows(full, cols));
    return full;
  }
  const int64_t n = x.numel() / cols;  // rows per chunk
  return all_gather_sp_ring(tp, x, [&](int c, const Tensor& chunk) { gemm(c * n, rows(chunk, cols)); });
}
}  // namespace

Tensor ColumnParallelLinear::forward(ParallelLinearCtx& ctx, const Tensor& x, const Fp8Recompute* fp8_recompute,
                                     const ops::Fp8Norm* x_norm) const {
  const ModuleScope m(name_, x);
  MCPP_CHECK(!x_norm || fp8_fuses_norm(), "{}: a norm in the input cast needs FP8 delayed scaling without SP", name_);
  const Tensor* bias = bias_ ? &bias_->data : nullptr;
  if (!opt_.sequence_parallel) {  // copy_to_tp: identity
    ctx.x = rows(x, opt_.input_size);                                                 // [s*b, in]
    Tensor y = Tensor::empty({ctx.x.size(0), out_local_}, x.dtype(), x.device());  // [s*b, out/tp]
    if (fp8_)
      fp8_forward(*fp8_, ctx, y, ctx.x, weight_->data, bias, fp8_recompute,
                  x_norm ? ops::Fp8Act::Norm : ops::Fp8Act::None, x_norm);
    else ops::linear_fwd(y, ctx.x, weight_->data, bias);
    finish_forward(ctx);  // under FP8 x (here the norm's input) dropped: the backward reads the saved casts
    return m.ret(y.view(with_last(x.shape(), out_local_)));
  }
  const int64_t n_full = x.numel() / opt_.input_size * tp_->size();
  Tensor y = Tensor::empty({n_full, out_local_}, x.dtype(), x.device());  // [s*b, out/tp]
  Tensor full = gather_then(*tp_, x, opt_.input_size, opt_.tp_comm_overlap,  // gather_from_sp
                            [&](int64_t first, const Tensor& in) {
                              Tensor out = y.narrow0(first, in.size(0));
                              if (fp8_) fp8_forward(*fp8_, ctx, out, in, weight_->data, bias, fp8_recompute);
                              else ops::linear_fwd(out, in, weight_->data, bias);
                            });
  ctx.x = rows(full, opt_.input_size);  // [s*b, in]
  finish_forward(ctx);
  return m.ret(y.view(with_last(full.shape(), out_local_)));
}

void ColumnParallelLinear::restore_input(ParallelLinearCtx& ctx, const Tensor& x) const {
  if (ctx.fp8_saved.x.defined()) return;  // FP8: the backward reads the saved cast, not x
  ctx.x = rows(opt_.sequence_parallel ? all_gather_sp(*tp_, x) : x, opt_.input_size);  // as forward's
}

Tensor ColumnParallelLinear::recompute_output(const ParallelLinearCtx& ctx) const {
  MCPP_CHECK(ctx.x.defined(), "ColumnParallelLinear::recompute_output: the forward's input is not kept");
  const Tensor* bias = bias_ ? &bias_->data : nullptr;
  const int64_t n = ctx.x.size(0);
  Tensor y = Tensor::empty({n, out_local_}, ctx.x.dtype(), ctx.x.device());
  const int64_t chunks = opt_.sequence_parallel && opt_.tp_comm_overlap ? tp_->size() : 1;  // the forward's GEMMs
  for (int64_t c = 0; c < chunks; ++c) {
    Tensor out = y.narrow0(c * (n / chunks), n / chunks);
    if (fp8_) {  // the forward's casts again (its saved scales, no amax recorded; blockwise: the same block scales)
      const Tensor in = ctx.x.narrow0(c * (n / chunks), n / chunks);
      if (fp8_->blockwise()) {
        ops::fp8_block_linear_fwd(out, in, weight_->data);
        if (bias) ops::bias_add_inplace(out, *bias);
      } else {
        ops::fp8_linear_fwd(out, in, weight_->data, bias, {.scale = ctx.fp8_x_scale}, {.scale = ctx.fp8_w_scale},
                            nullptr);
      }
      continue;
    }
    ops::linear_fwd(out, ctx.x.narrow0(c * (n / chunks), n / chunks), weight_->data, bias);
  }
  return y;
}

Tensor ColumnParallelLinear::forward_gelu(ParallelLinearCtx& ctx, const Tensor& x, Tensor& pre_act,
                                          const Fp8Recompute* fp8_recompute) const {
  const ModuleScope m(name_, x);
  const Tensor* bias = bias_ ? &bias_->data : nullptr;
  const int64_t n_full = x.numel() / opt_.input_size * (opt_.sequence_parallel ? tp_->size() : 1);
  pre_act = Tensor::empty({n_full, out_local_}, x.dtype(), x.device());    // [s*b, out/tp]
  Tensor act = Tensor::empty({n_full, out_local_}, x.dtype(), x.device());  // [s*b, out/tp]
  if (!opt_.sequence_parallel) {  // copy_to_tp: identity
    ctx.x = rows(x, opt_.input_size);
    if (fp8_) {  // the FP8 GEMM into pre_act, then GELU
      fp8_forward(*fp8_, ctx, pre_act, ctx.x, weight_->data, bias, fp8_recompute);
      ops::gelu_fwd(act, pre_act);
    } else {
      ops::linear_gelu_fwd(act, pre_act, ctx.x, weight_->data, bias);
    }
    finish_forward(ctx);
    return m.ret(act.view(with_last(x.shape(), out_local_)));
  }
  Tensor full = gather_then(*tp_, x, opt_.input_size, opt_.tp_comm_overlap,  // gather_from_sp
                            [&](int64_t first, const Tensor& in) {
                              Tensor a = act.narrow0(first, in.size(0)), p = pre_act.narrow0(first, in.size(0));
                              if (fp8_) {
                                fp8_forward(*fp8_, ctx, p, in, weight_->data, bias, fp8_recompute);
                                ops::gelu_fwd(a, p);
                              } else {
                                ops::linear_gelu_fwd(a, p, in, weight_->data, bias);
                              }
                            });
  ctx.x = rows(full, opt_.input_size);                   // [s*b, in]
  finish_forward(ctx);
  return m.ret(act.view(with_last(full.shape(), out_local_)));  // [s, b, out/tp]
}

Tensor ColumnParallelLinear::backward(ParallelLinearCtx& ctx, const Tensor& dy, const Tensor* pre_act,
                                      ops::Fp8Act dy_act) const {
  const ModuleScope m(name_, dy, ModuleScope::kBackward);
  MCPP_CHECK(!pre_act || fp8_fuses_act(), "{}: an activation folded into the backward needs FP8 delayed scaling",
             name_);
  MCPP_CHECK(dy_act == ops::Fp8Act::DGelu || dy_act == ops::Fp8Act::DSwiglu, "{}: dy_act is DGelu or DSwiglu", name_);
  const bool dswiglu = pre_act && dy_act == ops::Fp8Act::DSwiglu;
  Tensor dy2 = rows(dy, dswiglu ? out_local_ / 2 : out_local_);  // [s*b, out/tp] (DSwiglu: [s*b, out/2tp])
  Tensor dx = Tensor::empty({input_rows(ctx), opt_.input_size}, dy.dtype(), dy.device());  // [s*b, in] partial
  Tensor* db_acc = bias_ ? &bias_->main_grad : nullptr;
  Tensor dx_full = dx.view(with_last(dy.shape(), opt_.input_size));  // [s, b, in]
  auto grads_ready = [&] {
    if (owns_weight_) weight_->grad_ready();
    if (bias_) bias_->grad_ready();
  };
  const ops::GradWrite gw = grad_write(weight_, bias_);
  if (fp8_) {  // dgrad and wgrad in one call, then dx's reduction (no overlap with the wgrad)
    fp8_backward(*fp8_, ctx, &dx, weight_->main_grad, db_acc, dy2, weight_->data, gw, pre_act, dy_act);
    grads_ready();
    if (tp_->size() == 1) return m.ret(dx_full);
    AsyncResult red =
        opt_.sequence_parallel ? reduce_scatter_sp_async(*tp_, dx_full) : all_reduce_tp_async(*tp_, dx_full);
    red.work.wait();
    return m.ret(red.out);
  }
  if (tp_->size() == 1 || opt_.explicit_expert_comm) {  // nothing to reduce here: dgrad and wgrad in one call
    ops::linear_bwd(&dx, weight_->main_grad, db_acc, dy2, ctx.x, weight_->data, gw);
    grads_ready();
    return m.ret(dx_full);
  }
  // Megatron's async grad communication: dgrad first, then dx's reduction (gather_from_sp backward:
  // reduce-scatter; copy_to_tp backward: all-reduce) posted on the communicator while the wgrad GEMM runs
  // (on GPUs: the comm stream beside the compute stream), waited before dx is returned.
  ops::gemm(dx, dy2, weight_->data, {});  // dx = dy @ W
  AsyncResult red =
      opt_.sequence_parallel ? reduce_scatter_sp_async(*tp_, dx_full) : all_reduce_tp_async(*tp_, dx_full);
  ops::linear_bwd(nullptr, weight_->main_grad, db_acc, dy2, ctx.x, weight_->data, gw);
  grads_ready();
  red.work.wait();
  return m.ret(red.out);
}

RowParallelLinear::RowParallelLinear(ParameterRegistry& params, const std::string& prefix,
                                     const ParallelLinearOptions& opt, comm::CommPtr tp)
    : tp_(std::move(tp)), opt_(opt), name_(prefix) {
  const int t = tp_->size();
  MCPP_CHECK(!opt.explicit_expert_comm || !opt.sequence_parallel, "{}: an expert's linear is not sequence parallel",
             prefix);
  MCPP_CHECK(opt.input_size % t == 0, "{}: input size {} not divisible by tp={}", prefix, opt.input_size, t);
  in_local_ = opt.input_size / t;
  weight_ = params.add({.key = prefix + ".weight",
                        .shape = {opt.output_size, in_local_},
                        .init = InitKind::Normal,
                        .std = opt.init_std,
                        .shard = tp_shard({opt.output_size, opt.input_size}, 1, t, tp_->rank())});
  if (opt.bias)
    bias_ = params.add({.key = prefix + ".bias", .shape = {opt.output_size}, .init = InitKind::Zeros, .no_weight_decay = true});
  fp8_ = make_fp8(params, prefix, opt, tp_);
}

Tensor RowParallelLinear::forward(ParallelLinearCtx& ctx, const Tensor& x, const Fp8Recompute* fp8_recompute,
                                  ops::Fp8Act x_act) const {
  const ModuleScope m(name_, x);
  MCPP_CHECK(x_act == ops::Fp8Act::None || fp8_fuses_act(), "{}: an input activation needs FP8 delayed scaling",
             name_);
  MCPP_CHECK(x_act == ops::Fp8Act::None || x_act == ops::Fp8Act::Gelu || x_act == ops::Fp8Act::Swiglu,
             "{}: the input activation is Gelu or Swiglu", name_);
  ctx.x = rows(x, x_act == ops::Fp8Act::Swiglu ? 2 * in_local_ : in_local_);  // [s*b, in/tp] (Swiglu: [s*b, 2 in/tp])
  // tp == 1: the reduction is the identity, so the bias rides in the GEMM (a cuBLASLt epilogue on CUDA, FP8 too); an
  // expert's linear adds it on group rank 0 only and leaves the reduction to the dispatcher.
  const bool expert = opt_.explicit_expert_comm;
  const bool bias_in_gemm =
      bias_ && !(fp8_ && fp8_->blockwise()) && (tp_->size() == 1 || (expert && tp_->rank() == 0));
  Tensor out;
  if (opt_.sequence_parallel && opt_.tp_comm_overlap) {  // reduce_scatter_to_sp as a ring, GEMM per chunk
    Shape chunk = with_last(x.shape(), opt_.output_size);
    chunk[0] /= tp_->size();
    const int64_t n = ctx.x.size(0) / tp_->size();
    out = reduce_scatter_sp_ring(*tp_, chunk, x.dtype(), x.device(), [&](int c, Tensor& part) {
      Tensor part_rows = rows(part, opt_.output_size);
      ops::linear_fwd(part_rows, ctx.x.narrow0(c * n, n), weight_->data, bias_in_gemm ? &bias_->data : nullptr);
    });
  } else {
    Tensor y = Tensor::empty({ctx.x.size(0), opt_.output_size}, x.dtype(), x.device());  // [s*b, out] partial
    if (fp8_)
      fp8_forward(*fp8_, ctx, y, ctx.x, weight_->data, bias_in_gemm ? &bias_->data : nullptr, fp8_recompute, x_act);
    else ops::linear_fwd(y, ctx.x, weight_->data, bias_in_gemm ? &bias_->data : nullptr);
    out = y.view(with_last(x.shape(), opt_.output_size));            // [s, b, out]
    if (expert) return m.ret(out);                                   // the dispatcher reduces
    if (opt_.sequence_parallel) out = reduce_scatter_sp(*tp_, out);  // [s/tp, b, out]
    else all_reduce_tp(*tp_, out);                                   // reduce_from_tp
  }
  finish_forward(ctx);
  if (bias_ && !bias_in_gemm) {
    Tensor o2 = rows(out, opt_.output_size);
    ops::bias_add_inplace(o2, bias_->data);  // bias added after the reduction
  }
  return m.ret(out);
}

Tensor RowParallelLinear::backward(ParallelLinearCtx& ctx, const Tensor& dy, bool bias_grad_elsewhere) const {
  const ModuleScope m(name_, dy, ModuleScope::kBackward);
  MCPP_CHECK(!bias_grad_elsewhere || residual_bias(), "RowParallelLinear: no bias grad to take elsewhere");
  Tensor dx = Tensor::empty({input_rows(ctx), in_local_}, dy.dtype(), dy.device());  // [s*b, in/tp]
  Parameter* bias = bias_grad_elsewhere ? nullptr : bias_;
  Tensor* db = bias ? &bias->main_grad : nullptr;
  Tensor dy_full = dy;
  const ops::GradWrite gw = grad_write(weight_, bias);
  if (fp8_) {  // reduce_scatter_to_sp backward (SP): all-gather dy, then the FP8 dgrad + wgrad
    if (opt_.sequence_parallel) dy_full = all_gather_sp(*tp_, dy);  // [s, b, out]
    fp8_backward(*fp8_, ctx, &dx, weight_->main_grad, db, rows(dy_full, opt_.output_size), weight_->data, gw);
  } else if (!opt_.sequence_parallel) {
    ops::linear_bwd(&dx, weight_->main_grad, db, rows(dy, opt_.output_size), ctx.x, weight_->data, gw);
  } else if (!opt_.tp_comm_overlap) {  // reduce_scatter_to_sp backward: all-gather dy, then both GEMMs
    dy_full = all_gather_sp(*tp_, dy);  // [s, b, out]
    ops::linear_bwd(&dx, weight_->main_grad, db, rows(dy_full, opt_.output_size), ctx.x, weight_->data, gw);
  } else {  // the ring: each chunk's dgrad GEMM beside the next chunk's transfer, then the wgrad on all of dy
    dy_full = gather_then(*tp_, dy, opt_.output_size, true, [&](int64_t first, const Tensor& in) {
      Tensor out = dx.narrow0(first, in.size(0));
      ops::gemm(out, in, weight_->data, {});  // dx rows = dy rows @ W
    });
    ops::linear_bwd(nullptr, weight_->main_grad, db, rows(dy_full, opt_.output_size), ctx.x, weight_->data, gw);
  }
  weight_->grad_ready();
  if (bias) bias->grad_ready();
  return m.ret(dx.view(with_last(dy_full.shape(), in_local_)));
}

Tensor RowParallelLinear::backward_dgelu(ParallelLinearCtx& ctx, const Tensor& dy, const Tensor& pre_act,
                                         bool bias_grad_elsewhere) const {
  const ModuleScope m(name_, dy, ModuleScope::kBackward);
  MCPP_CHECK(!bias_grad_elsewhere || residual_bias(), "RowParallelLinear: no bias grad to take elsewhere");
  Tensor dpre = Tensor::empty({input_rows(ctx), in_local_}, dy.dtype(), dy.device());  // [s*b, in/tp]
  Tensor dy_full = dy;
  if (fp8_) {  // the FP8 dgrad + wgrad, then GELU' (a separate op)
    if (opt_.sequence_parallel) dy_full = all_gather_sp(*tp_, dy);  // [s, b, out]
    Parameter* bias = bias_grad_elsewhere ? nullptr : bias_;
    Tensor dx = Tensor::empty(dpre.shape(), dy.dtype(), dy.device());  // [s*b, in/tp]
    fp8_backward(*fp8_, ctx, &dx, weight_->main_grad, bias ? &bias->main_grad : nullptr,
                 rows(dy_full, opt_.output_size), weight_->data, grad_write(weight_, bias));
    ops::gelu_bwd(dpre, dx, pre_act);
    weight_->grad_ready();
    if (bias) bias->grad_ready();
    return m.ret(dpre.view(with_last(dy_full.shape(), in_local_)));
  }
  if (!opt_.sequence_parallel) {
    ops::linear_dgelu_bwd(dpre, nullptr, rows(dy, opt_.output_size), weight_->data, pre_act);
  } else {  // reduce_scatter_to_sp backward: all-gather dy (--tp-comm-overlap: the ring, dgrad per chunk)
    auto dgrad = [&](int64_t first, const Tensor& in) {
      Tensor out = dpre.narrow0(first, in.size(0));
      ops::linear_dgelu_bwd(out, nullptr, in, weight_->data, pre_act.narrow0(first, in.size(0)));
    };
    dy_full = gather_then(*tp_, dy, opt_.output_size, opt_.tp_comm_overlap, dgrad);
  }
  Tensor dy2 = rows(dy_full, opt_.output_size);
  Parameter* bias = bias_grad_elsewhere ? nullptr : bias_;
  ops::linear_bwd(nullptr, weight_->main_grad, bias ? &bias->main_grad : nullptr, dy2, ctx.x, weight_->data,
                  grad_write(weight_, bias));
  weight_->grad_ready();
  if (bias) bias->grad_ready();
  return m.ret(dpre.view(with_last(dy_full.shape(), in_local_)));  // [s, b, in/tp]
}

}  // namespace mcpp::tensor_parallel
