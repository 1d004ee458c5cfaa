// CPU FP8 emulation, the reference and oracle of the CUDA FP8 kernels (kernels/cuda/fp8*.{cpp,cu}).
//   fp8_round:        one float rounded to e4m3fn / e5m2 (round to nearest even, saturated to +-max, NaN kept,
//                     the sign of zero kept), as CUDA's __nv_cvt_float_to_fp8(v, __NV_SATFINITE, ...) does.
//   fp8_quantize:     out = fp8_round(in * scale[0]) (the product rounded to fp32 first), float32; amax recorded.
//   fp8_amax:         amax[0] = max(amax[0], max |in|).
//   fp8_scale_update: Transformer Engine's delayed-scaling update (ops.h Fp8ScalingOptions); _multi: one entry after
//                     the other, each history[0] set from its amax slot first.
//   fp8_linear_fwd / fp8_linear_bwd: the emulated casts of each operand into float32 copies, then fp32 GEMMs
//                     (OpenBLAS, this backend's gemm) and one multiply of the result by the two scale_invs.
// Everything float32; Stream ignored.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "mcpp/kernels/cpu/checks.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops {

float fp8_round(float v, Fp8Format f) {
  if (std::isnan(v)) return v;
  const float a = std::fabs(v), mx = fp8_max(f);
  if (a > mx) return std::copysign(mx, v);  // saturation (every value past max rounds to max or beyond)
  if (a == 0.0f) return v;
  const int mbits = f == Fp8Format::E4M3 ? 3 : 2;
  const int emin = f == Fp8Format::E4M3 ? -6 : -14;  // the smallest normal exponent; below it the subnormal grid
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): the unbiased exponent is e - 1
  const int exp = std::max(e - 1, emin);
  const double quantum = std::ldexp(1.0, exp - mbits);
  const double r = std::nearbyint(static_cast<double>(a) / quantum) * quantum;  // exact division; RNE (default mode)
  return std::copysign(static_cast<float>(r), v);
}

namespace cpu {
using detail::require_cpu_f32;

namespace {
float scale_of(const char* op, const Tensor& scale, int i) {
  require_cpu_f32(op, "scale", scale);
  detail::require_numel(op, "scale", scale, 2, "{scale, scale_inv}");
  return scale.data<float>()[i];
}

float max_abs(const Tensor& in) {
  const float* p = in.data<float>();
  float m = 0.0f;
  for (int64_t i = 0; i < in.numel(); ++i) m = std::fmax(m, std::fabs(p[i]));  // fmax: a NaN never wins
  return m;
}

void record_amax(const char* op, Tensor* amax, const Tensor& in) {
  if (!amax || !amax->defined()) return;
  require_cpu_f32(op, "amax", *amax);
  MCPP_CHECK(amax->numel() >= 1, "{}: amax must have at least one element; got {}", op, amax->str());
  float& a = amax->data<float>()[0];
  a = std::fmax(a, max_abs(in));
}

// The emulated fp8 copy of `in` (float32, same shape), its amax recorded when `op_amax` is given.
Tensor quantized(const char* op, const Tensor& in, const Fp8Operand& f, bool record) {
  require_cpu_f32(op, "operand", in);
  Tensor q = Tensor::empty(in.shape());
  const float s = scale_of(op, f.scale, 0);
  const float* pi = in.data<float>();
  float* pq = q.data<float>();
  for (int64_t i = 0; i < in.numel(); ++i) pq[i] = fp8_round(pi[i] * s, f.format);
  Tensor amax = f.amax;  // a handle on the caller's storage
  if (record) record_amax(op, &amax, in);
  return q;
}

// c[m,n] = alpha * op(a) op(b) + beta * c over row-major float32 (cblas).
void sgemm(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool ta, bool tb, float alpha,
           float beta) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(ta ? m : k), b,
              static_cast<blasint>(tb ? k : n), beta, c, static_cast<blasint>(n));
}
}  // namespace

void fp8_quantize(Tensor& out, Tensor* amax_acc, const Tensor& in, const Tensor& scale, Fp8Format format, Stream) {
  require_cpu_f32("fp8_quantize", "in", in);
  require_cpu_f32("fp8_quantize", "out", out);
  detail::require_same_shape("fp8_quantize", "out", out, "in", in);
  Tensor q = quantized("fp8_quantize", in, Fp8Operand{.scale = scale, .format = format}, false);
  out.copy_from(q);
  record_amax("fp8_quantize", amax_acc, in);
}

void fp8_amax(Tensor& amax_acc, const Tensor& in, Stream) {
  require_cpu_f32("fp8_amax", "in", in);
  MCPP_CHECK(amax_acc.defined(), "fp8_amax: amax is an undefined tensor");
  record_amax("fp8_amax", &amax_acc, in);
}

void fp8_scale_update(Tensor& scale, Tensor& amax_history, const Fp8ScalingOptions& opt, Stream) {
  require_cpu_f32("fp8_scale_update", "amax_history", amax_history);
  scale_of("fp8_scale_update", scale, 0);
  const int64_t len = amax_history.numel();
  MCPP_CHECK(len >= 1, "fp8_scale_update: amax_history is empty");
  float* h = amax_history.data<float>();
  float amax = h[0];
  if (!opt.most_recent)
    for (int64_t i = 1; i < len; ++i) amax = std::isnan(h[i]) || h[i] > amax ? h[i] : amax;  // torch.max: NaN wins
  std::rotate(h, h + 1, h + len);  // torch.roll(history, -1): h[i] = h[i + 1], h[len - 1] = old h[0]
  h[0] = 0.0f;
  float* s = scale.data<float>();
  if (std::isfinite(amax) && amax > 0.0f) {
    const float sf = (fp8_max(opt.format) / amax) / std::ldexp(1.0f, opt.margin);
    s[0] = sf;
    s[1] = 1.0f / sf;
  }
}

void fp8_scale_update_multi(const std::vector<Fp8ScaleState>& list, Tensor& amax, Stream s) {
  const char* op = "fp8_scale_update_multi";
  require_cpu_f32(op, "amax", amax);
  check_fp8_scale_update_multi(list, amax);
  for (const Fp8ScaleState& e : list) {
    require_cpu_f32(op, "amax_history", e.amax_history);
    scale_of(op, e.scale, 0);
    if (e.scale_before.defined()) scale_of(op, e.scale_before, 0);
  }
  float* a = amax.data<float>();
  for (const Fp8ScaleState& e : list) {
    Tensor scale = e.scale, history = e.amax_history;  // handles: the op writes the caller's storage
    if (e.scale_before.defined()) std::copy_n(scale.data<float>(), 2, Tensor(e.scale_before).data<float>());
    history.data<float>()[0] = a[e.amax_slot];
    a[e.amax_slot] = 0.0f;
    cpu::fp8_scale_update(scale, history, e.opt, s);
  }
}

void fp8_linear_fwd(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias, const Fp8Operand& fx,
                    const Fp8Operand& fw, Fp8Saved* saved, Stream) {
  const char* op = "fp8_linear_fwd";
  require_cpu_f32(op, "y", y);
  require_cpu_f32(op, "w", w);
  MCPP_CHECK(w.ndim() == 2, "{}: w must be [out, in]; got {}", op, w.str());
  const int64_t out = w.size(0), in = w.size(1);
  MCPP_CHECK(fw.act == Fp8Act::None, "{}: the weight's operand takes no activation", op);
  const Tensor xv = fp8_operand_values(op, x, fx);  // x, or its activation / norm ([.., in] either way)
  MCPP_CHECK(xv.ndim() >= 1 && xv.size(-1) == in && y.size(-1) == out && xv.numel() / in == y.numel() / out,
             "{}: x [.., {}] and y [.., {}] must have matching rows; got x {}, y {}", op, in, out, x.str(), y.str());
  const int64_t n = xv.numel() / in;
  Tensor qx = quantized(op, xv, fx, true), qw = quantized(op, w, fw, true);
  const float alpha = scale_of(op, fx.scale, 1) * scale_of(op, fw.scale, 1);
  sgemm(y.data<float>(), qx.data<float>(), qw.data<float>(), n, out, in, false, true, 1.0f, 0.0f);
  float* py = y.data<float>();
  for (int64_t i = 0; i < n * out; ++i) py[i] *= alpha;
  if (bias) bias_add_inplace(y, *bias, {});
  if (saved) *saved = {.x = qx, .w = qw};  // the emulated casts themselves (this backend's Fp8Saved)
}

void fp8_linear_bwd(Tensor* dx, Tensor& dw_acc, Tensor* db_acc, const Tensor& dy, const Tensor& x, const Tensor& w,
                    const Fp8Operand& fdy, const Fp8Operand& fx, const Fp8Operand& fw, const Fp8Saved* saved,
                    GradWrite grad_write, Stream) {
  const char* op = "fp8_linear_bwd";
  const bool saved_x = saved && saved->x.defined(), saved_w = saved && saved->w.defined();
  MCPP_CHECK(fw.act == Fp8Act::None, "{}: the weight's operand takes no activation", op);
  const Tensor xs = saved_x ? saved->x : fp8_operand_values(op, x, fx);  // [n, in] either way
  const Tensor dyv = fp8_operand_values(op, dy, fdy);  // dy, or its activation's gradient ([n, out] either way)
  const int64_t n = detail::linear_bwd_rows(op, dw_acc, dyv, xs, w), out = w.size(0), in = w.size(1);
  if (saved_w)
    MCPP_CHECK(saved->w.shape() == w.shape(), "{}: saved w must be the forward's q(w) {}; got {}", op, w.str(),
               saved->w.str());
  Tensor qdy = quantized(op, dyv, fdy, true);
  const float dy_inv = scale_of(op, fdy.scale, 1);
  if (dx) {  // dx[n,in] = q(dy)[n,out] @ q(w)[out,in]
    require_cpu_f32(op, "dx", *dx);
    MCPP_CHECK(dx->numel() == n * in, "{}: dx must have {} elements; got {}", op, n * in, dx->str());
    const Tensor qw = saved_w ? saved->w : quantized(op, w, fw, false);
    const float alpha = dy_inv * scale_of(op, fw.scale, 1);
    sgemm(dx->data<float>(), qdy.data<float>(), qw.data<float>(), n, in, out, false, false, 1.0f, 0.0f);
    float* p = dx->data<float>();
    for (int64_t i = 0; i < n * in; ++i) p[i] *= alpha;
  }
  // dw[out,in] (+)= (q(dy)^T @ q(x)) * scale_invs: the product rounded once, then added (as cuBLASLt's beta = 1)
  const Tensor qx = saved_x ? saved->x : quantized(op, xs, fx, false);
  const float alpha = dy_inv * scale_of(op, fx.scale, 1);
  Tensor prod = Tensor::empty({out, in});
  sgemm(prod.data<float>(), qdy.data<float>(), qx.data<float>(), out, in, n, true, false, 1.0f, 0.0f);
  detail::add_linear_grads(op, dw_acc, prod, alpha, db_acc, dyv.view({n, out}), grad_write == GradWrite::Overwrite);
}

}  // namespace cpu
}  // namespace mcpp::ops
