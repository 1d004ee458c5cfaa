// Dispatch of the kernel interface: the output (or first) tensor's device picks the backend; every
// other tensor argument must live on the same device.
#include "mcpp/kernels/ops.h"

#include <initializer_list>
#include <vector>

#include "mcpp/core/error.h"
#include "mcpp/kernels/op_profile.h"

namespace mcpp::ops {
namespace {
template <typename List>  // of const Tensor*
bool on_cuda_list(const List& ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t || !t->defined()) continue;
    if (!first) first = t;
    MCPP_CHECK(t->device() == first->device(), "op arguments on different devices: {} vs {}", first->str(),
               t->str());
  }
  return first && first->device() == Device::CUDA;
}
bool on_cuda(std::initializer_list<const Tensor*> ts) { return on_cuda_list(ts); }
}  // namespace

// MCPP_PROFILE_OPS=1 times each call (op_profile.h); otherwise OpTimer is one branch.
#define MCPP_DISPATCH(name, tensors, ...)   \
  const bool mcpp_cuda_ = on_cuda tensors;  \
  const OpTimer mcpp_timer_(#name, mcpp_cuda_); \
  return mcpp_cuda_ ? cuda::name(__VA_ARGS__) : cpu::name(__VA_ARGS__)

void check_attention_dropout_block(const char* op, const AttentionOptions& opt, int64_t s) {
  const int64_t big = opt.dropout_seq_length, r = opt.dropout_row_offset, c = opt.dropout_col_offset;
  if (big == 0) {
    MCPP_CHECK(r == 0 && c == 0, "{}: dropout offsets ({}, {}) need dropout_seq_length", op, r, c);
    return;
  }
  MCPP_CHECK(r >= 0 && c >= 0 && r + s <= big && c + s <= big,
             "{}: an [{}, {}] block at ({}, {}) does not fit the dropout mask of sequence length {}", op, s, s, r, c,
             big);
}

void check_attention_doc_start(const char* op, const AttentionOptions& opt, int64_t b, int64_t s, Device device) {
  if (!opt.doc_start.defined()) return;
  const Tensor& d = opt.doc_start;
  MCPP_CHECK(d.dtype() == DType::I32 && d.shape() == Shape({b, s}) && d.device() == device,
             "{}: doc_start must be int32 [b={}, s={}] on the op's device; got {}", op, b, s, d.str());
  MCPP_CHECK(opt.causal, "{}: document masking (doc_start) needs the causal mask", op);
}

void check_moe_topk_options(const char* op, const MoeTopkOptions& opt, int64_t num_experts, int64_t topk) {
  MCPP_CHECK(!(opt.sigmoid && opt.pre_softmax), "{}: pre_softmax applies to the softmax score function, not sigmoid",
             op);
  if (opt.expert_bias.defined())
    MCPP_CHECK(opt.sigmoid && opt.expert_bias.dtype() == DType::F32 && opt.expert_bias.numel() == num_experts,
               "{}: the expert bias must be float32 [{}] with the sigmoid score function; got {}", op, num_experts,
               opt.expert_bias.str());
  if (opt.logit_bias.defined()) {
    MCPP_CHECK(opt.logit_bias.dtype() == DType::F32 && opt.logit_bias.numel() == num_experts,
               "{}: the logit bias must be float32 [{}]; got {}", op, num_experts, opt.logit_bias.str());
    MCPP_CHECK(opt.pre_softmax || (opt.sigmoid && topk == 1),
               "{}: a logit bias (sinkhorn routing) needs pre_softmax, or sigmoid at top-1", op);
    MCPP_CHECK(!opt.expert_bias.defined() && opt.num_groups == 0,
               "{}: a logit bias (sinkhorn routing) takes no expert bias and no groups", op);
  }
  if (opt.num_groups == 0 && opt.group_topk == 0) return;
  const int64_t g = opt.num_groups;
  MCPP_CHECK(g >= 1 && g <= kMaxMoeRouterGroups && num_experts % g == 0,
             "{}: num_groups {} must be in [1, {}] and divide the {} experts", op, g, kMaxMoeRouterGroups, num_experts);
  MCPP_CHECK(opt.group_topk >= 1 && opt.group_topk <= g && opt.group_topk <= topk,
             "{}: group_topk {} must be in [1, min(num_groups {}, topk {})]", op, opt.group_topk, g, topk);
  MCPP_CHECK(opt.group_topk * (num_experts / g) >= topk,
             "{}: the {} kept groups of {} experts hold fewer than topk = {} experts", op, opt.group_topk,
             num_experts / g, topk);
}

MlaQkvShape check_mla_qkv(const char* op, const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& q,
                          const Tensor& kv, const Tensor& latent, bool latent_is_pe, const Tensor& cos,
                          const Tensor& sin, bool fp32_only) {
  for (const Tensor* t : {&query, &key, &value, &q, &kv, &latent, &cos, &sin})
    MCPP_CHECK(t->defined(), "{}: an argument is an undefined tensor", op);
  MCPP_CHECK(q.ndim() == 4 && kv.ndim() == 4 && query.ndim() == 4 && key.ndim() == 4 && value.ndim() == 4 &&
                 latent.ndim() == 3,
             "{}: q / kv / query / key / value must be [s, b, n, d] and the latent [s, b, c]; got q {}, kv {}, query "
             "{}, key {}, value {}, latent {}",
             op, q.str(), kv.str(), query.str(), key.str(), value.str(), latent.str());
  MlaQkvShape m{};
  m.s = q.size(0), m.b = q.size(1), m.n = q.size(2);
  MCPP_CHECK(cos.dtype() == DType::F32 && cos.ndim() == 2 && cos.size(0) == m.s && cos.shape() == sin.shape() &&
                 sin.dtype() == DType::F32,
             "{}: cos / sin must be float32 [s={}, dr/2]; got {} / {}", op, m.s, cos.str(), sin.str());
  m.dr = 2 * cos.size(1);
  m.dn = q.size(3) - m.dr;
  m.dv = kv.size(3) - m.dn;
  m.dc = query.size(3);
  m.c = latent.size(2);
  MCPP_CHECK(m.dr > 0 && m.dn > 0 && m.dv > 0,
             "{}: q {} must hold dn > 0 channels and dr = {} rotary ones, kv {} dn + dv (dv > 0)", op, q.str(), m.dr,
             kv.str());
  const Shape head{m.s, m.b, m.n, m.dc};
  MCPP_CHECK(kv.size(0) == m.s && kv.size(1) == m.b && kv.size(2) == m.n && query.shape() == head &&
                 key.shape() == head && value.shape() == head && m.dc >= m.dn + m.dr && m.dc >= m.dv,
             "{}: query / key / value must be [s={}, b={}, n={}, dc >= max(dn + dr = {}, dv = {})] and kv [s, b, n, "
             "dn + dv]; got query {}, key {}, value {}, kv {}",
             op, m.s, m.b, m.n, m.dn + m.dr, m.dv, query.str(), key.str(), value.str(), kv.str());
  MCPP_CHECK(latent.size(0) == m.s && latent.size(1) == m.b && (latent_is_pe ? m.c == m.dr : m.c >= m.dr),
             "{}: {} must be [s={}, b={}, {}]; got {}", op, latent_is_pe ? "dk_pe" : "kv_latent", m.s, m.b,
             latent_is_pe ? "dr" : "c >= dr", latent.str());
  const DType dt = q.dtype();
  for (const Tensor* t : {&query, &key, &value, &kv, &latent})
    MCPP_CHECK(t->dtype() == dt && t->device() == q.device(),
               "{}: the activations must share one dtype and device; got {} and {}", op, q.str(), t->str());
  MCPP_CHECK(dt == DType::F32 || (!fp32_only && dt == DType::BF16), "{}: activations must be float32{}; got {}", op,
             fp32_only ? "" : " or bf16", q.str());
  return m;
}

KvCacheShape check_kv_cache(const char* op, const Tensor& step, const Tensor& k_cache, const Tensor& v_cache,
                            const Tensor& lengths) {
  MCPP_CHECK(step.defined() && step.ndim() == 4, "{}: the step's tensor must be [sq, b, n, d]; got {}", op,
             step.defined() ? step.str() : "undefined");
  MCPP_CHECK(k_cache.defined() && k_cache.ndim() == 4 && k_cache.size(1) == step.size(1) &&
                 k_cache.size(3) == step.size(3),
             "{}: k_cache must be [cap, b={}, ng, d={}]; got {}", op, step.size(1), step.size(3),
             k_cache.defined() ? k_cache.str() : "undefined");
  MCPP_CHECK(v_cache.defined() && v_cache.shape() == k_cache.shape() && v_cache.dtype() == k_cache.dtype(),
             "{}: v_cache must match k_cache {}; got {}", op, k_cache.str(), v_cache.defined() ? v_cache.str() : "undefined");
  const KvCacheShape a{step.size(0), step.size(1), step.size(2), k_cache.size(2), step.size(3), k_cache.size(0)};
  MCPP_CHECK(a.ng > 0 && a.nq % a.ng == 0, "{}: the step's {} heads must be a multiple of the cache's {} groups", op,
             a.nq, a.ng);
  MCPP_CHECK(lengths.defined() && lengths.dtype() == DType::I32 && lengths.shape() == Shape({a.b}) &&
                 lengths.device() == k_cache.device(),
             "{}: lengths must be int32 [b={}] on the caches' device; got {}", op, a.b,
             lengths.defined() ? lengths.str() : "undefined");
  return a;
}

int64_t check_copy_columns(const Tensor& y, const Tensor& x, int64_t y_offset, int64_t x_offset, int64_t width) {
  MCPP_CHECK(y.defined() && x.defined() && y.ndim() >= 1 && x.ndim() >= 1,
             "copy_columns: x and y must be defined tensors of at least one dim; got {} and {}", x.str(), y.str());
  MCPP_CHECK(x.dtype() == y.dtype(), "copy_columns: x {} and y {} must share a dtype", x.str(), y.str());
  const int64_t cy = y.size(-1), cx = x.size(-1);
  const int64_t rows = cy > 0 ? y.numel() / cy : 0;
  MCPP_CHECK(cx > 0 && cy > 0 && x.numel() / cx == rows,
             "copy_columns: x {} and y {} must hold the same number of rows", x.str(), y.str());
  MCPP_CHECK(width >= 0 && y_offset >= 0 && x_offset >= 0 && y_offset + width <= cy && x_offset + width <= cx,
             "copy_columns: columns [{}, {}) of x {} into [{}, {}) of y {} do not fit", x_offset, x_offset + width,
             x.str(), y_offset, y_offset + width, y.str());
  return rows;
}

int64_t moe_aux_grad_rows(const char* op, const Tensor& aux_grad, int64_t num_experts) {
  const bool ok = aux_grad.dtype() == DType::F32 &&
                  ((aux_grad.ndim() == 1 && aux_grad.size(0) == num_experts) ||
                   (aux_grad.ndim() == 2 && aux_grad.size(0) >= 1 && aux_grad.size(1) == num_experts));
  MCPP_CHECK(ok, "{}: aux_grad must be float32 [{}] or [G, {}]; got {}", op, num_experts, num_experts, aux_grad.str());
  return aux_grad.ndim() == 1 ? 1 : aux_grad.size(0);
}

void gemm(Tensor& c, const Tensor& a, const Tensor& b, const GemmOptions& opt, Stream s) {
  MCPP_DISPATCH(gemm, ({&c, &a, &b}), c, a, b, opt, s);
}
void linear_fwd(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias, Stream s) {
  MCPP_DISPATCH(linear_fwd, ({&y, &x, &w, bias}), y, x, w, bias, s);
}
void linear_bwd(Tensor* dx, Tensor& dw_acc, Tensor* db_acc, const Tensor& dy, const Tensor& x, const Tensor& w,
                GradWrite grad_write, Stream s) {
  MCPP_DISPATCH(linear_bwd, ({dx, &dw_acc, db_acc, &dy, &x, &w}), dx, dw_acc, db_acc, dy, x, w, grad_write, s);
}
void fp8_quantize(Tensor& out, Tensor* amax_acc, const Tensor& in, const Tensor& scale, Fp8Format format, Stream s) {
  MCPP_DISPATCH(fp8_quantize, ({&out, amax_acc, &in, &scale}), out, amax_acc, in, scale, format, s);
}
void fp8_amax(Tensor& amax_acc, const Tensor& in, Stream s) { MCPP_DISPATCH(fp8_amax, ({&amax_acc, &in}), amax_acc, in, s); }
void fp8_scale_update(Tensor& scale, Tensor& amax_history, const Fp8ScalingOptions& opt, Stream s) {
  MCPP_DISPATCH(fp8_scale_update, ({&scale, &amax_history}), scale, amax_history, opt, s);
}
void check_fp8_scale_update_multi(const std::vector<Fp8ScaleState>& list, const Tensor& amax) {
  const int64_t k = amax.numel();
  std::vector<bool> taken(static_cast<size_t>(k), false);
  for (const Fp8ScaleState& e : list) {
    MCPP_CHECK(e.amax_slot >= 0 && e.amax_slot < k && !taken[static_cast<size_t>(e.amax_slot)],
               "fp8_scale_update_multi: amax slot {} is outside amax {} or taken twice", e.amax_slot, amax.str());
    taken[static_cast<size_t>(e.amax_slot)] = true;
    MCPP_CHECK(e.amax_history.defined() && e.amax_history.numel() >= 1, "fp8_scale_update_multi: amax_history of "
               "slot {} is empty", e.amax_slot);
  }
}
void fp8_scale_update_multi(const std::vector<Fp8ScaleState>& list, Tensor& amax, Stream s) {
  std::vector<const Tensor*> ts{&amax};
  for (const Fp8ScaleState& e : list) ts.insert(ts.end(), {&e.scale, &e.amax_history, &e.scale_before});
  const bool mcpp_cuda_ = on_cuda_list(ts);
  const OpTimer mcpp_timer_("fp8_scale_update_multi", mcpp_cuda_);
  return mcpp_cuda_ ? cuda::fp8_scale_update_multi(list, amax, s) : cpu::fp8_scale_update_multi(list, amax, s);
}
void fp8_linear_fwd(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias, const Fp8Operand& fx,
                    const Fp8Operand& fw, Fp8Saved* saved, Stream s) {
  MCPP_DISPATCH(fp8_linear_fwd,
                ({&y, &x, &w, bias, &fx.scale, &fw.scale, &fx.amax, &fw.amax, &fx.norm.mean, &fx.norm.rstd,
                  &fx.norm.weight, &fx.norm.bias}),
                y, x, w, bias, fx, fw, saved, s);
}
void fp8_linear_bwd(Tensor* dx, Tensor& dw_acc, Tensor* db_acc, const Tensor& dy, const Tensor& x, const Tensor& w,
                    const Fp8Operand& fdy, const Fp8Operand& fx, const Fp8Operand& fw, const Fp8Saved* saved,
                    GradWrite grad_write, Stream s) {
  MCPP_DISPATCH(fp8_linear_bwd,
                ({dx, &dw_acc, db_acc, &dy, &x, &w, &fdy.scale, &fdy.amax, &fdy.act_input, saved ? &saved->x : nullptr,
                  saved ? &saved->w : nullptr}),
                dx, dw_acc, db_acc, dy, x, w, fdy, fx, fw, saved, grad_write, s);
}
void check_fp8_norm(const char* op, const Fp8Norm& norm) {
  MCPP_CHECK(norm.rstd.defined() && norm.weight.defined() && norm.mean.defined() == norm.bias.defined(),
             "{}: the Norm operand needs rstd and weight, and mean with bias (LayerNorm) or neither (RMSNorm)", op);
}
Tensor fp8_operand_values(const char* op, const Tensor& t, const Fp8Operand& f, Stream s) {
  if (f.act == Fp8Act::None) return t;
  if (f.act == Fp8Act::Swiglu || f.act == Fp8Act::DSwiglu) {
    const bool fwd = f.act == Fp8Act::Swiglu;
    MCPP_CHECK(t.ndim() >= 1 && (fwd || (f.act_input.defined() && f.act_input.numel() == 2 * t.numel())),
               "{}: the DSwiglu operand's act_input must have twice the gradient's {} elements; got {}", op, t.numel(),
               f.act_input.defined() ? f.act_input.str() : std::string("none"));
    Shape shape = t.shape();
    shape.back() = fwd ? shape.back() / 2 : 2 * shape.back();
    Tensor v = Tensor::empty(shape, t.dtype(), t.device());
    if (fwd) swiglu_fwd(v, t, s);
    else swiglu_bwd(v, t, f.act_input.view(shape), s);
    return v;
  }
  Tensor v = Tensor::empty(t.shape(), t.dtype(), t.device());
  if (f.act == Fp8Act::Gelu) {
    gelu_fwd(v, t, s);
  } else if (f.act == Fp8Act::Norm) {  // the norm again on t: the statistics (into scratch) and y are the forward's
    const Fp8Norm& nm = f.norm;
    check_fp8_norm(op, nm);
    const int64_t n = nm.rstd.numel();
    Tensor x = t.view({n, -1}), y = v.view({n, -1}), rstd = Tensor::empty({n}, DType::F32, t.device());
    if (nm.mean.defined()) {
      Tensor mean = Tensor::empty({n}, DType::F32, t.device());
      layernorm_fwd(y, mean, rstd, x, nm.weight, &nm.bias, nm.eps, s);
    } else {
      rmsnorm_fwd(y, rstd, x, nm.weight, nm.eps, s);
    }
  } else {
    MCPP_CHECK(f.act_input.defined() && f.act_input.numel() == t.numel(),
               "{}: the DGelu operand's act_input must have the gradient's {} elements; got {}", op, t.numel(),
               f.act_input.defined() ? f.act_input.str() : std::string("none"));
    gelu_bwd(v, t, f.act_input.view(t.shape()), s);
  }
  return v;
}
void fp8_block_quantize(Tensor& out, Tensor& scale_inv, const Tensor& in, Fp8Block block, Fp8Format format,
                        Stream s) {
  MCPP_DISPATCH(fp8_block_quantize, ({&out, &scale_inv, &in}), out, scale_inv, in, block, format, s);
}
void fp8_block_linear_fwd(Tensor& y, const Tensor& x, const Tensor& w, Stream s) {
  MCPP_DISPATCH(fp8_block_linear_fwd, ({&y, &x, &w}), y, x, w, s);
}
void fp8_block_linear_bwd(Tensor* dx, Tensor& dw_acc, Tensor* db_acc, const Tensor& dy, const Tensor& x,
                          const Tensor& w, Fp8Format dy_format, GradWrite grad_write, Stream s) {
  MCPP_DISPATCH(fp8_block_linear_bwd, ({dx, &dw_acc, db_acc, &dy, &x, &w}), dx, dw_acc, db_acc, dy, x, w, dy_format,
                grad_write, s);
}
void linear_gelu_fwd(Tensor& act, Tensor& pre_act, const Tensor& x, const Tensor& w, const Tensor* bias, Stream s) {
  MCPP_DISPATCH(linear_gelu_fwd, ({&act, &pre_act, &x, &w, bias}), act, pre_act, x, w, bias, s);
}
void linear_dgelu_bwd(Tensor& dpre, Tensor* db_acc, const Tensor& dy, const Tensor& w, const Tensor& pre_act,
                      Stream s) {
  MCPP_DISPATCH(linear_dgelu_bwd, ({&dpre, db_acc, &dy, &w, &pre_act}), dpre, db_acc, dy, w, pre_act, s);
}
void add(Tensor& out, const Tensor& a, const Tensor& b, Stream s) { MCPP_DISPATCH(add, ({&out, &a, &b}), out, a, b, s); }
void add_inplace(Tensor& y, const Tensor& x, Stream s) { MCPP_DISPATCH(add_inplace, ({&y, &x}), y, x, s); }
void scale_inplace(Tensor& y, float alpha, Stream s) { MCPP_DISPATCH(scale_inplace, ({&y}), y, alpha, s); }
void bias_add_inplace(Tensor& y, const Tensor& bias, Stream s) {
  MCPP_DISPATCH(bias_add_inplace, ({&y, &bias}), y, bias, s);
}
void qkv_split(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv, Stream s) {
  MCPP_DISPATCH(qkv_split, ({&q, &k, &v, &qkv}), q, k, v, qkv, s);
}
void qkv_merge(Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v, Stream s) {
  MCPP_DISPATCH(qkv_merge, ({&qkv, &q, &k, &v}), qkv, q, k, v, s);
}
void qkv_split_rope(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                    Stream s) {
  MCPP_DISPATCH(qkv_split_rope, ({&q, &k, &v, &qkv, &cos, &sin}), q, k, v, qkv, cos, sin, s);
}
void qkv_merge_rope(Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos,
                    const Tensor& sin, Stream s) {
  MCPP_DISPATCH(qkv_merge_rope, ({&qkv, &q, &k, &v, &cos, &sin}), qkv, q, k, v, cos, sin, s);
}
void cast(Tensor& out, const Tensor& in, Stream s) { MCPP_DISPATCH(cast, ({&out, &in}), out, in, s); }
GroupedLinearShape check_grouped_linear(const char* op, const Tensor& x, const Tensor& y, const std::vector<Tensor>& w,
                                        const std::vector<Tensor>& bias, const Tensor& counts) {
  MCPP_CHECK(x.defined() && y.defined() && x.ndim() == 2 && y.ndim() == 2 && x.size(0) == y.size(0),
             "{}: the activations must be [m, in] and [m, out]; got {} and {}", op, x.defined() ? x.str() : "undefined",
             y.defined() ? y.str() : "undefined");
  MCPP_CHECK(counts.defined() && counts.dtype() == DType::I64 && counts.ndim() == 1 && counts.size(0) >= 1 &&
                 counts.size(0) <= kMaxGemmGroups && (counts.device() == x.device() || counts.device() == Device::CPU),
             "{}: counts must be int64 [G] (1 <= G <= {}) on the activations' device or the host; got {}", op,
             kMaxGemmGroups, counts.defined() ? counts.str() : "undefined");
  const GroupedLinearShape g{.m = x.size(0), .in = x.size(1), .out = y.size(1), .groups = counts.size(0)};
  MCPP_CHECK(static_cast<int64_t>(w.size()) == g.groups, "{}: {} weights for {} groups", op, w.size(), g.groups);
  MCPP_CHECK(bias.empty() || static_cast<int64_t>(bias.size()) == g.groups, "{}: {} biases for {} groups", op,
             bias.size(), g.groups);
  for (size_t i = 0; i < w.size(); ++i) {
    MCPP_CHECK(w[i].defined() && w[i].shape() == Shape({g.out, g.in}) && w[i].device() == x.device(),
               "{}: weight {} must be [out={}, in={}] on the activations' device; got {}", op, i, g.out, g.in,
               w[i].defined() ? w[i].str() : "undefined");
    if (!bias.empty())
      MCPP_CHECK(bias[i].defined() && bias[i].numel() == g.out && bias[i].device() == x.device(),
                 "{}: bias {} must be [out={}] on the activations' device; got {}", op, i, g.out,
                 bias[i].defined() ? bias[i].str() : "undefined");
  }
  return g;
}

void grouped_linear_fwd(Tensor& y, const Tensor& x, const std::vector<Tensor>& w, const std::vector<Tensor>& bias,
                        const Tensor& counts, Stream s) {
  MCPP_DISPATCH(grouped_linear_fwd, ({&y, &x}), y, x, w, bias, counts, s);
}
void grouped_linear_dgrad(Tensor& dx, const Tensor& dy, const std::vector<Tensor>& w, const Tensor& counts,
                          Stream s) {
  MCPP_DISPATCH(grouped_linear_dgrad, ({&dx, &dy}), dx, dy, w, counts, s);
}
void grouped_linear_wgrad(std::vector<Tensor>& dw_acc, std::vector<Tensor>& db_acc, const Tensor& dy, const Tensor& x,
                          const Tensor& counts, GradWrite grad_write, Stream s) {
  MCPP_DISPATCH(grouped_linear_wgrad, ({&dy, &x}), dw_acc, db_acc, dy, x, counts, grad_write, s);
}
void grouped_linear_gelu_fwd(Tensor& act, Tensor& pre_act, const Tensor& x, const std::vector<Tensor>& w,
                             const std::vector<Tensor>& bias, const Tensor& counts, Stream s) {
  MCPP_DISPATCH(grouped_linear_gelu_fwd, ({&act, &pre_act, &x}), act, pre_act, x, w, bias, counts, s);
}
void grouped_linear_dgelu_bwd(Tensor& dpre, const Tensor& dy, const std::vector<Tensor>& w, const Tensor& pre_act,
                              const Tensor& counts, Stream s) {
  MCPP_DISPATCH(grouped_linear_dgelu_bwd, ({&dpre, &dy, &pre_act}), dpre, dy, w, pre_act, counts, s);
}
void moe_permute(Tensor& out, const Tensor& x, const Tensor& idx, Stream s) {
  MCPP_DISPATCH(moe_permute, ({&out, &x, &idx}), out, x, idx, s);
}
void moe_unpermute(Tensor& y, const Tensor& in, const Tensor& idx, const Tensor* w, Stream s) {
  MCPP_DISPATCH(moe_unpermute, ({&y, &in, &idx, w}), y, in, idx, w, s);
}
void moe_unpermute_bwd(Tensor& din, Tensor& dw, const Tensor& dy, const Tensor& in, const Tensor& idx, const Tensor& w,
                       Stream s) {
  MCPP_DISPATCH(moe_unpermute_bwd, ({&din, &dw, &dy, &in, &idx, &w}), din, dw, dy, in, idx, w, s);
}
void moe_topk_softmax(Tensor& topk, Tensor& probs, Tensor& scores, Tensor& lse, const Tensor& logits,
                      const MoeTopkOptions& opt, Stream s) {
  MCPP_DISPATCH(moe_topk_softmax, ({&topk, &probs, &scores, &lse, &logits}), topk, probs, scores, lse, logits, opt, s);
}
void moe_topk_softmax_bwd(Tensor& dlogits, const Tensor& dprobs, const Tensor& probs, const Tensor& topk,
                          const Tensor& scores, const Tensor& lse, const Tensor& aux_grad, const MoeTopkOptions& opt,
                          Stream s) {
  MCPP_DISPATCH(moe_topk_softmax_bwd, ({&dlogits, &dprobs, &probs, &topk, &scores, &lse, &aux_grad}), dlogits, dprobs,
                probs, topk, scores, lse, aux_grad, opt, s);
}
void moe_route_positions(Tensor& idx, Tensor& counts, const Tensor& topk, Stream s) {
  MCPP_DISPATCH(moe_route_positions, ({&idx, &counts, &topk}), idx, counts, topk, s);
}
void moe_sinkhorn(Tensor& log_d1, const Tensor& logits, float tol, Stream s) {
  MCPP_DISPATCH(moe_sinkhorn, ({&log_d1, &logits}), log_d1, logits, tol, s);
}
void moe_route_counts(Tensor& counts, const Tensor& topk, const Tensor* idx, Stream s) {
  MCPP_DISPATCH(moe_route_counts, ({&counts, &topk, idx}), counts, topk, idx, s);
}
void moe_capacity_positions(Tensor& idx, Tensor& kept, const Tensor& topk, const Tensor& probs, const Tensor& counts,
                            const MoeCapacityOptions& opt, Stream s) {
  MCPP_DISPATCH(moe_capacity_positions, ({&idx, &kept, &topk, &probs, &counts}), idx, kept, topk, probs, counts, opt,
                s);
}
void chunk_transpose(Tensor& out, const Tensor& in, int64_t a, int64_t c, Stream s) {
  MCPP_DISPATCH(chunk_transpose, ({&out, &in}), out, in, a, c, s);
}
void embedding_fwd(Tensor& out, const Tensor& ids, const Tensor& table, int64_t vocab_start, Stream s) {
  MCPP_DISPATCH(embedding_fwd, ({&out, &ids, &table}), out, ids, table, vocab_start, s);
}
void embedding_bwd(Tensor& dtable_acc, const Tensor& ids, const Tensor& dout, int64_t vocab_start, Stream s) {
  MCPP_DISPATCH(embedding_bwd, ({&dtable_acc, &ids, &dout}), dtable_acc, ids, dout, vocab_start, s);
}
void layernorm_fwd(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& gamma, const Tensor* beta,
                   float eps, Stream s) {
  MCPP_DISPATCH(layernorm_fwd, ({&y, &mean, &rstd, &x, &gamma, beta}), y, mean, rstd, x, gamma, beta, eps, s);
}
void layernorm_bwd(Tensor& dx, Tensor& dgamma_acc, Tensor* dbeta_acc, const Tensor& dy, const Tensor& x,
                   const Tensor& gamma, const Tensor& mean, const Tensor& rstd, Stream s) {
  MCPP_DISPATCH(layernorm_bwd, ({&dx, &dgamma_acc, dbeta_acc, &dy, &x, &gamma, &mean, &rstd}), dx, dgamma_acc,
                dbeta_acc, dy, x, gamma, mean, rstd, s);
}
void rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& gamma, float eps, Stream s) {
  MCPP_DISPATCH(rmsnorm_fwd, ({&y, &rstd, &x, &gamma}), y, rstd, x, gamma, eps, s);
}
void rmsnorm_bwd(Tensor& dx, Tensor& dgamma_acc, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                 const Tensor& rstd, Stream s) {
  MCPP_DISPATCH(rmsnorm_bwd, ({&dx, &dgamma_acc, &dy, &x, &gamma, &rstd}), dx, dgamma_acc, dy, x, gamma, rstd, s);
}
void add_layernorm_fwd(Tensor& sum, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& a, const Tensor& b,
                       const Tensor& gamma, const Tensor* beta, float eps, const ResidualDropout& drop, Stream s) {
  MCPP_DISPATCH(add_layernorm_fwd, ({&sum, &y, &mean, &rstd, &a, &b, &gamma, beta}), sum, y, mean, rstd, a, b, gamma,
                beta, eps, drop, s);
}
void add_rmsnorm_fwd(Tensor& sum, Tensor& y, Tensor& rstd, const Tensor& a, const Tensor& b, const Tensor& gamma,
                     float eps, const ResidualDropout& drop, Stream s) {
  MCPP_DISPATCH(add_rmsnorm_fwd, ({&sum, &y, &rstd, &a, &b, &gamma}), sum, y, rstd, a, b, gamma, eps, drop, s);
}
void add_layernorm_bwd(Tensor& dx, Tensor& dgamma_acc, Tensor* dbeta_acc, const Tensor& dy, const Tensor& dres,
                       const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                       Tensor* dres_sum_acc, Tensor* dx_sum_acc, const ResidualDropout& drop, Tensor* dbranch,
                       Stream s) {
  MCPP_DISPATCH(add_layernorm_bwd,
                ({&dx, &dgamma_acc, dbeta_acc, &dy, &dres, &x, &gamma, &mean, &rstd, dres_sum_acc, dx_sum_acc,
                  dbranch}),
                dx, dgamma_acc, dbeta_acc, dy, dres, x, gamma, mean, rstd, dres_sum_acc, dx_sum_acc, drop, dbranch,
                s);
}
void add_rmsnorm_bwd(Tensor& dx, Tensor& dgamma_acc, const Tensor& dy, const Tensor& dres, const Tensor& x,
                     const Tensor& gamma, const Tensor& rstd, Tensor* dres_sum_acc, Tensor* dx_sum_acc,
                     const ResidualDropout& drop, Tensor* dbranch, Stream s) {
  MCPP_DISPATCH(add_rmsnorm_bwd,
                ({&dx, &dgamma_acc, &dy, &dres, &x, &gamma, &rstd, dres_sum_acc, dx_sum_acc, dbranch}), dx,
                dgamma_acc, dy, dres, x, gamma, rstd, dres_sum_acc, dx_sum_acc, drop, dbranch, s);
}
void gelu_fwd(Tensor& y, const Tensor& x, Stream s) { MCPP_DISPATCH(gelu_fwd, ({&y, &x}), y, x, s); }
void gelu_bwd(Tensor& dx, const Tensor& dy, const Tensor& x, Stream s) {
  MCPP_DISPATCH(gelu_bwd, ({&dx, &dy, &x}), dx, dy, x, s);
}
void swiglu_fwd(Tensor& y, const Tensor& x, Stream s) { MCPP_DISPATCH(swiglu_fwd, ({&y, &x}), y, x, s); }
void swiglu_bwd(Tensor& dx, const Tensor& dy, const Tensor& x, Stream s) {
  MCPP_DISPATCH(swiglu_bwd, ({&dx, &dy, &x}), dx, dy, x, s);
}
void mla_qkv_fwd(Tensor& query, Tensor& key, Tensor& value, const Tensor& q, const Tensor& kv, const Tensor& kv_latent,
                 const Tensor& cos, const Tensor& sin, Stream s) {
  MCPP_DISPATCH(mla_qkv_fwd, ({&query, &key, &value, &q, &kv, &kv_latent, &cos, &sin}), query, key, value, q, kv,
                kv_latent, cos, sin, s);
}
void mla_qkv_bwd(Tensor& dq, Tensor& dkv, Tensor& dk_pe, const Tensor& dquery, const Tensor& dkey, const Tensor& dvalue,
                 const Tensor& cos, const Tensor& sin, Stream s) {
  MCPP_DISPATCH(mla_qkv_bwd, ({&dq, &dkv, &dk_pe, &dquery, &dkey, &dvalue, &cos, &sin}), dq, dkv, dk_pe, dquery, dkey,
                dvalue, cos, sin, s);
}
void copy_columns(Tensor& y, const Tensor& x, int64_t y_offset, int64_t x_offset, int64_t width, Stream s) {
  MCPP_DISPATCH(copy_columns, ({&y, &x}), y, x, y_offset, x_offset, width, s);
}
void rope_fwd(Tensor& y, const Tensor& x, const Tensor& cos, const Tensor& sin, Stream s) {
  MCPP_DISPATCH(rope_fwd, ({&y, &x, &cos, &sin}), y, x, cos, sin, s);
}
void rope_bwd(Tensor& dx, const Tensor& dy, const Tensor& cos, const Tensor& sin, Stream s) {
  MCPP_DISPATCH(rope_bwd, ({&dx, &dy, &cos, &sin}), dx, dy, cos, sin, s);
}
void flash_attention_fwd(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttentionOptions& opt, Stream s) {
  MCPP_DISPATCH(flash_attention_fwd, ({&o, &lse, &q, &k, &v}), o, lse, q, k, v, opt, s);
}
void flash_attention_bwd(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                         const Tensor& v, const Tensor& o, const Tensor& lse, const AttentionOptions& opt, Stream s) {
  MCPP_DISPATCH(flash_attention_bwd, ({&dq, &dk, &dv, &dout, &q, &k, &v, &o, &lse}), dq, dk, dv, dout, q, k, v, o,
                lse, opt, s);
}
void flash_attention_fwd_qkv(Tensor& o, Tensor& lse, const Tensor& qkv, int64_t num_query_groups,
                             const AttentionOptions& opt, Stream s) {
  MCPP_DISPATCH(flash_attention_fwd_qkv, ({&o, &lse, &qkv}), o, lse, qkv, num_query_groups, opt, s);
}
void flash_attention_bwd_qkv(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& o, const Tensor& lse,
                             int64_t num_query_groups, const AttentionOptions& opt, Stream s) {
  MCPP_DISPATCH(flash_attention_bwd_qkv, ({&dqkv, &dout, &qkv, &o, &lse}), dqkv, dout, qkv, o, lse, num_query_groups,
                opt, s);
}
void kv_cache_append(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v, const Tensor& lengths,
                     Stream s) {
  MCPP_DISPATCH(kv_cache_append, ({&k_cache, &v_cache, &k, &v, &lengths}), k_cache, v_cache, k, v, lengths, s);
}
void kv_cache_attention(Tensor& o, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& lengths, float softmax_scale, Stream s) {
  MCPP_DISPATCH(kv_cache_attention, ({&o, &q, &k_cache, &v_cache, &lengths}), o, q, k_cache, v_cache, lengths,
                softmax_scale, s);
}
void attention_merge(Tensor& o_acc, Tensor& lse_acc, const Tensor& o_blk, const Tensor& lse_blk, Stream s) {
  MCPP_DISPATCH(attention_merge, ({&o_acc, &lse_acc, &o_blk, &lse_blk}), o_acc, lse_acc, o_blk, lse_blk, s);
}
void scaled_masked_softmax_fwd(Tensor& probs, const Tensor& scores, float scale, bool causal, Stream s) {
  MCPP_DISPATCH(scaled_masked_softmax_fwd, ({&probs, &scores}), probs, scores, scale, causal, s);
}
void scaled_masked_softmax_bwd(Tensor& dscores, const Tensor& dprobs, const Tensor& probs, float scale, Stream s) {
  MCPP_DISPATCH(scaled_masked_softmax_bwd, ({&dscores, &dprobs, &probs}), dscores, dprobs, probs, scale, s);
}
void cross_entropy_fwd(Tensor& loss, Tensor& lse, const Tensor& logits, const Tensor& targets, Stream s) {
  MCPP_DISPATCH(cross_entropy_fwd, ({&loss, &lse, &logits, &targets}), loss, lse, logits, targets, s);
}
void cross_entropy_bwd(Tensor& dlogits, const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                       const Tensor& lse, Stream s) {
  MCPP_DISPATCH(cross_entropy_bwd, ({&dlogits, &dloss, &logits, &targets, &lse}), dlogits, dloss, logits, targets,
                lse, s);
}
void cross_entropy_fwd_bwd(Tensor& loss, Tensor& lse, Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                           const Tensor& dloss, Stream s) {
  MCPP_DISPATCH(cross_entropy_fwd_bwd, ({&loss, &lse, &dlogits, &logits, &targets, &dloss}), loss, lse, dlogits,
                logits, targets, dloss, s);
}
void vocab_parallel_ce_local_lse(Tensor& local_lse, const Tensor& row_max, const Tensor& sum_exp, Stream s) {
  MCPP_DISPATCH(vocab_parallel_ce_local_lse, ({&local_lse, &row_max, &sum_exp}), local_lse, row_max, sum_exp, s);
}
void vocab_parallel_ce_rescale(Tensor& scaled, const Tensor& local_lse, const Tensor& gmax, Stream s) {
  MCPP_DISPATCH(vocab_parallel_ce_rescale, ({&scaled, &local_lse, &gmax}), scaled, local_lse, gmax, s);
}
void vocab_parallel_ce_finish(Tensor& loss, Tensor& lse, const Tensor& gmax, const Tensor& sum_scaled,
                              const Tensor& target_logit, Stream s) {
  MCPP_DISPATCH(vocab_parallel_ce_finish, ({&loss, &lse, &gmax, &sum_scaled, &target_logit}), loss, lse, gmax,
                sum_scaled, target_logit, s);
}
void masked_loss_stats(Tensor& stats, const Tensor& loss, const Tensor& mask, Stream s) {
  MCPP_DISPATCH(masked_loss_stats, ({&stats, &loss, &mask}), stats, loss, mask, s);
}
void masked_loss_grad(Tensor& dloss, const Tensor& mask, const Tensor& stats, float grad_scale, bool per_token,
                      Stream s) {
  MCPP_DISPATCH(masked_loss_grad, ({&dloss, &mask, &stats}), dloss, mask, stats, grad_scale, per_token, s);
}
void dropout_fwd(Tensor& y, const Tensor& x, float p, const PhiloxKey& key, Stream s) {
  MCPP_DISPATCH(dropout_fwd, ({&y, &x}), y, x, p, key, s);
}
void dropout_bwd(Tensor& dx, const Tensor& dy, float p, const PhiloxKey& key, Stream s) {
  MCPP_DISPATCH(dropout_bwd, ({&dx, &dy}), dx, dy, p, key, s);
}
void random_normal(Tensor& out, const PhiloxKey& key, Stream s) {
  MCPP_DISPATCH(random_normal, ({&out}), out, key, s);
}
void random_scale(Tensor& y, const Tensor& x, float lo, float hi, const PhiloxKey& key, Stream s) {
  MCPP_DISPATCH(random_scale, ({&y, &x}), y, x, lo, hi, key, s);
}
void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, Tensor* param_model,
                const AdamWOptions& opt, Stream s) {
  MCPP_DISPATCH(adamw_step, ({&param, &exp_avg, &exp_avg_sq, &grad, param_model}), param, exp_avg, exp_avg_sq, grad,
                param_model, opt, s);
}
void adamw_multi_step(const std::vector<AdamWTensors>& list, const AdamWOptions& opt, Stream s) {
  std::vector<const Tensor*> ts;
  ts.reserve(list.size() * 5);
  for (const AdamWTensors& e : list)
    for (const Tensor* t : {&e.param, &e.exp_avg, &e.exp_avg_sq, &e.grad, &e.param_model}) ts.push_back(t);
  const bool mcpp_cuda_ = on_cuda_list(ts);
  const OpTimer mcpp_timer_("adamw_multi_step", mcpp_cuda_);
  return mcpp_cuda_ ? cuda::adamw_multi_step(list, opt, s) : cpu::adamw_multi_step(list, opt, s);
}
double sum_of_squares(const Tensor& x, Stream s) { MCPP_DISPATCH(sum_of_squares, ({&x}), x, s); }
bool has_non_finite(const Tensor& x, Stream s) { MCPP_DISPATCH(has_non_finite, ({&x}), x, s); }

void vocab_parallel_ce_partials(Tensor& row_max, Tensor& sum_exp, Tensor& target_logit, const Tensor& logits,
                                const Tensor& targets, int64_t vocab_start, Stream s) {
  MCPP_DISPATCH(vocab_parallel_ce_partials, ({&row_max, &sum_exp, &target_logit, &logits, &targets}), row_max, sum_exp,
                target_logit, logits, targets, vocab_start, s);
}
void vocab_parallel_ce_bwd(Tensor& dlogits, const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                           const Tensor& lse, int64_t vocab_start, Stream s) {
  MCPP_DISPATCH(vocab_parallel_ce_bwd, ({&dlogits, &dloss, &logits, &targets, &lse}), dlogits, dloss, logits, targets,
                lse, vocab_start, s);
}

#undef MCPP_DISPATCH
}  // namespace mcpp::ops
