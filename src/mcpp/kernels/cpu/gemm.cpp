// CPU GEMM and Linear (Megatron weight layout W[out, in]) on OpenBLAS cblas_sgemm, fp32.
//
//   gemm:       C[m,n] = alpha * op(A) @ op(B) + beta * C;  op(A)[m,k], op(B)[k,n]; A/B/C 2-D.
//   linear_fwd: y[n,out] = x[n,in] @ W[out,in]^T (+ bias[out]); x may be [.., in] (leading dims = n).
//   linear_bwd: dx[n,in] = dy[n,out] @ W (overwritten; skipped when dx == nullptr)
//               dw_acc[out,in] += dy^T @ x      (ACCUMULATES: sgemm with beta = 1)
//               db_acc[out]    += sum_n dy      (ACCUMULATES; column sums in double, fixed order)
//               GradWrite::Overwrite: = instead of += (beta = 0; db zeroed first): bitwise += into zeros.
//   linear_gelu_fwd / linear_dgelu_bwd: the GELU MLP's fused ops as compositions of linear_fwd, gemm,
//               gelu_fwd / gelu_bwd and the same column sums (bitwise the unfused path).
// Deterministic for a fixed OpenBLAS thread count (OpenBLAS splits M/N, never the K reduction).
// Stream is ignored (CPU ops run synchronously).
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "mcpp/kernels/cpu/checks.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {
using detail::require_cpu_f32;

void gemm(Tensor& c, const Tensor& a, const Tensor& b, const GemmOptions& opt, Stream) {
  require_cpu_f32("gemm", "c", c);
  require_cpu_f32("gemm", "a", a);
  require_cpu_f32("gemm", "b", b);
  MCPP_CHECK(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2, "gemm: a, b, c must be 2-D; got a {}, b {}, c {}",
             a.str(), b.str(), c.str());
  const int64_t m = opt.trans_a ? a.size(1) : a.size(0);
  const int64_t k = opt.trans_a ? a.size(0) : a.size(1);
  const int64_t kb = opt.trans_b ? b.size(1) : b.size(0);
  const int64_t n = opt.trans_b ? b.size(0) : b.size(1);
  MCPP_CHECK(k == kb, "gemm: inner dims differ: op(a) {}x{} (trans_a={}), op(b) {}x{} (trans_b={})", m, k,
             opt.trans_a, kb, n, opt.trans_b);
  MCPP_CHECK(c.size(0) == m && c.size(1) == n, "gemm: c must be ({}, {}) for op(a) {}x{} @ op(b) {}x{}; got {}", m,
             n, m, k, kb, n, c.str());
  if (m == 0 || n == 0) return;
  if (k == 0) {  // BLAS leaves C * beta; do it explicitly so alpha*0 + beta*C holds for empty K.
    float* pc = c.data<float>();
    for (int64_t i = 0; i < m * n; ++i) pc[i] = opt.beta == 0.0f ? 0.0f : opt.beta * pc[i];
    return;
  }
  cblas_sgemm(CblasRowMajor, opt.trans_a ? CblasTrans : CblasNoTrans, opt.trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), opt.alpha, a.data<float>(),
              static_cast<blasint>(a.size(1)), b.data<float>(), static_cast<blasint>(b.size(1)), opt.beta,
              c.data<float>(), static_cast<blasint>(n));
}

// db[out] += sum over rows of dy[n, out]: column sums in double, each column over all rows in order (the
// result does not depend on the thread count). Declared in checks.h (the norms' residual bias sums use it).
void detail::column_sum_acc(Tensor& db, const Tensor& dy2) {
  const int64_t n = dy2.size(0), out = dy2.size(1);
  const float* pdy = dy2.data<float>();
  float* pdb = db.data<float>();
  constexpr int64_t kBlock = 256;  // columns per task; each task sums its columns over all rows in order
  const int64_t blocks = (out + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n * out > (1 << 16))
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kBlock, c1 = std::min(out, c0 + kBlock);
    std::vector<double> acc(static_cast<size_t>(c1 - c0), 0.0);
    for (int64_t r = 0; r < n; ++r) {
      const float* row = pdy + r * out;
      for (int64_t c = c0; c < c1; ++c) acc[static_cast<size_t>(c - c0)] += row[c];
    }
    for (int64_t c = c0; c < c1; ++c) pdb[c] += static_cast<float>(acc[static_cast<size_t>(c - c0)]);
  }
}

void detail::add_linear_grads(const char* op, Tensor& dw_acc, const Tensor& prod, float alpha, Tensor* db_acc,
                              const Tensor& dy2, bool overwrite) {
  const float* pp = prod.data<float>();
  float* pw = dw_acc.data<float>();
  for (int64_t i = 0; i < dw_acc.numel(); ++i) pw[i] = overwrite ? pp[i] * alpha : pw[i] + pp[i] * alpha;
  if (db_acc) {
    require_cpu_f32(op, "db_acc", *db_acc);
    if (overwrite) db_acc->fill_(0.0f);
    column_sum_acc(*db_acc, dy2);
  }
}

namespace {

struct LinearDims {
  int64_t n, in, out;
};

// x[.., in], w[out, in], y[.., out] with matching leading dims (n = product of leading dims).
LinearDims linear_dims(const char* op, const Tensor& x, const Tensor& w, const Tensor& y, const char* y_name,
                       const char* x_name = "x") {
  require_cpu_f32(op, x_name, x);
  require_cpu_f32(op, "w", w);
  require_cpu_f32(op, y_name, y);
  MCPP_CHECK(w.ndim() == 2, "{}: w must be 2-D [out, in]; got {}", op, w.str());
  const int64_t out = w.size(0), in = w.size(1);
  MCPP_CHECK(x.ndim() >= 1 && x.size(-1) == in, "{}: {} must be [.., in={}] for w {}; got {}", op, x_name, in,
             w.str(), x.str());
  const int64_t n = in ? x.numel() / in : 0;
  Shape want = x.shape();
  want.back() = out;
  MCPP_CHECK(y.shape() == want, "{}: {} must be {} for {} {} and w {}; got {}", op, y_name, shape_str(want),
             x_name, x.str(), w.str(), y.str());
  return {n, in, out};
}
}  // namespace

void linear_fwd(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias, Stream stream) {
  const LinearDims d = linear_dims("linear_fwd", x, w, y, "y");
  Tensor x2 = x.view({d.n, d.in});  // [n, in]
  Tensor y2 = y.view({d.n, d.out});  // [n, out]
  if (bias) {
    require_cpu_f32("linear_fwd", "bias", *bias);
    detail::require_numel("linear_fwd", "bias", *bias, d.out, "out = w.size(0)");
    const float* pb = bias->data<float>();
    float* py = y2.data<float>();
#pragma omp parallel for schedule(static) if (d.n * d.out > (1 << 16))
    for (int64_t r = 0; r < d.n; ++r) std::copy(pb, pb + d.out, py + r * d.out);
  }
  cpu::gemm(y2, x2, w, GemmOptions{.trans_a = false, .trans_b = true, .alpha = 1.0f, .beta = bias ? 1.0f : 0.0f},
       stream);
}

void linear_bwd(Tensor* dx, Tensor& dw_acc, Tensor* db_acc, const Tensor& dy, const Tensor& x, const Tensor& w,
                GradWrite grad_write, Stream stream) {
  const LinearDims d = linear_dims("linear_bwd", x, w, dy, "dy");
  require_cpu_f32("linear_bwd", "dw_acc", dw_acc);
  detail::require_same_shape("linear_bwd", "dw_acc", dw_acc, "w", w);
  Tensor x2 = x.view({d.n, d.in});     // [n, in]
  Tensor dy2 = dy.view({d.n, d.out});  // [n, out]
  if (dx) {
    require_cpu_f32("linear_bwd", "dx", *dx);
    detail::require_same_shape("linear_bwd", "dx", *dx, "x", x);
    Tensor dx2 = dx->view({d.n, d.in});  // [n, in] = dy[n, out] @ w[out, in]
    cpu::gemm(dx2, dy2, w, GemmOptions{}, stream);
  }
  // dw[out, in] += dy[n, out]^T @ x[n, in]  (Overwrite: beta = 0, the GEMM never reads dw)
  const bool overwrite = grad_write == GradWrite::Overwrite;
  const GemmOptions wgrad{.trans_a = true, .trans_b = false, .alpha = 1.0f, .beta = overwrite ? 0.0f : 1.0f};
  cpu::gemm(dw_acc, dy2, x2, wgrad, stream);
  if (db_acc) {
    require_cpu_f32("linear_bwd", "db_acc", *db_acc);
    detail::require_numel("linear_bwd", "db_acc", *db_acc, d.out, "out = w.size(0)");
    if (overwrite) db_acc->zero_();
    detail::column_sum_acc(*db_acc, dy2);
  }
}

// The fused ops of the GELU MLP, as the composition of the unfused ones (so the CPU path is bitwise the
// unfused path; the CUDA backend fuses them into cuBLASLt epilogues).
void linear_gelu_fwd(Tensor& act, Tensor& pre_act, const Tensor& x, const Tensor& w, const Tensor* bias,
                     Stream stream) {
  const LinearDims d = linear_dims("linear_gelu_fwd", x, w, act, "act");
  if (bias) {
    require_cpu_f32("linear_gelu_fwd", "bias", *bias);
    detail::require_numel("linear_gelu_fwd", "bias", *bias, d.out, "out = w.size(0)");
  }
  require_cpu_f32("linear_gelu_fwd", "pre_act", pre_act);
  detail::require_same_shape("linear_gelu_fwd", "pre_act", pre_act, "act", act);
  cpu::linear_fwd(pre_act, x, w, bias, stream);  // [n, out] = x W^T + b
  cpu::gelu_fwd(act, pre_act, stream);           // [n, out]
}

void linear_dgelu_bwd(Tensor& dpre, Tensor* db_acc, const Tensor& dy, const Tensor& w, const Tensor& pre_act,
                      Stream stream) {
  // w [out, in] is the next linear's weight: dy [.., out] -> dpre [.., in]; pre_act [.., in]
  const LinearDims d = linear_dims("linear_dgelu_bwd", pre_act, w, dy, "dy", "pre_act");
  require_cpu_f32("linear_dgelu_bwd", "dpre", dpre);
  detail::require_same_shape("linear_dgelu_bwd", "dpre", dpre, "pre_act", pre_act);
  Tensor dpre2 = dpre.view({d.n, d.in});  // [n, in] = dy[n, out] @ w[out, in]
  cpu::gemm(dpre2, dy.view({d.n, d.out}), w, GemmOptions{}, stream);
  cpu::gelu_bwd(dpre2, dpre2, pre_act, stream);  // in place: each element reads its dy before writing
  if (db_acc) {
    require_cpu_f32("linear_dgelu_bwd", "db_acc", *db_acc);
    detail::require_numel("linear_dgelu_bwd", "db_acc", *db_acc, d.in, "in = w.size(1)");
    detail::column_sum_acc(*db_acc, dpre2);
  }
}

}  // namespace mcpp::ops::cpu
