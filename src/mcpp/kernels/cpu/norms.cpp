// CPU LayerNorm and RMSNorm over the last dim h (Megatron's FusedLayerNorm / RMSNorm math), fp32 I/O
// with float64 row statistics.
//
//   layernorm_fwd: mean[n] = mean(x), rstd[n] = 1/sqrt(var + eps) (biased var, as torch);
//                  y[n,h] = (x - mean) * rstd * gamma[h] (+ beta[h])
//   layernorm_bwd: xhat = (x - mean) * rstd, g = dy * gamma;
//                  dx = rstd * (g - mean_h(g) - xhat * mean_h(g * xhat))           (overwritten)
//                  dgamma_acc[h] += sum_n dy * xhat;  dbeta_acc[h] += sum_n dy      (ACCUMULATE)
//   rmsnorm_fwd:   rstd[n] = 1/sqrt(mean(x^2) + eps); y = x * rstd * gamma
//   rmsnorm_bwd:   xhat = x * rstd, g = dy * gamma; dx = rstd * (g - xhat * mean_h(g * xhat));
//                  dgamma_acc[h] += sum_n dy * xhat                                (ACCUMULATE)
//   an undefined y: the statistics only (the forwards' values; y is not computed)
//   add_layernorm_fwd / add_rmsnorm_fwd: add(sum, a, b), then the norm of sum (exactly that composition);
//                  with a residual dropout, b = dropout_fwd(b) first (into a temporary)
//   add_layernorm_bwd / add_rmsnorm_bwd: the norm's bwd into dx, then add_inplace(dx, dres); with a residual
//                  dropout then dropout_bwd(dbranch, dx); the optional residual bias sums are linear_bwd's
//                  column sums of dres and of the branch's gradient (dbranch, else that dx)
// x/y/dy/dx: [.., h] (n = product of leading dims); gamma/beta: h elements; mean/rstd: float32, n elements.
// Parallel over rows for y/dx; parameter grads are parallel over hidden-dim blocks, each column summed
// over rows in order in double, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "mcpp/kernels/cpu/checks.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {
using detail::require_cpu_f32;

namespace {
struct RowDims {
  int64_t n, h;
};

RowDims row_dims(const char* op, const Tensor& x, const Tensor& gamma) {
  require_cpu_f32(op, "x", x);
  require_cpu_f32(op, "gamma", gamma);
  const int64_t h = detail::last_dim(op, "x", x);
  detail::require_numel(op, "gamma", gamma, h, "hidden = x.size(-1)");
  return {h ? x.numel() / h : 0, h};
}

void require_stat(const char* op, const char* arg, const Tensor& t, int64_t n) {
  require_cpu_f32(op, arg, t);
  detail::require_numel(op, arg, t, n, "one per row of x");
}

void require_like_x(const char* op, const char* arg, const Tensor& t, const Tensor& x) {
  require_cpu_f32(op, arg, t);
  detail::require_same_shape(op, arg, t, "x", x);
}

// acc[h] += sum_r dy[r, :] * xhat(r, :) (and dbeta[h] += sum_r dy[r, :] when dbeta != nullptr), where
// xhat(r, c) = (x[r, c] - mean[r]) * rstd[r]; mean == nullptr means mean 0 (RMSNorm).
void param_grads(float* dgamma, float* dbeta, const float* dy, const float* x, const float* mean,
                 const float* rstd, RowDims d) {
  constexpr int64_t kBlock = 64;  // hidden columns per task
  const int64_t blocks = (d.h + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (d.n * d.h > (1 << 15))
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kBlock, c1 = std::min(d.h, c0 + kBlock);
    double ag[kBlock] = {}, ab[kBlock] = {};
    for (int64_t r = 0; r < d.n; ++r) {
      const float* xr = x + r * d.h;
      const float* dyr = dy + r * d.h;
      const double mu = mean ? mean[r] : 0.0, rs = rstd[r];
      for (int64_t c = c0; c < c1; ++c) {
        ag[c - c0] += static_cast<double>(dyr[c]) * ((xr[c] - mu) * rs);
        ab[c - c0] += dyr[c];
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      dgamma[c] += static_cast<float>(ag[c - c0]);
      if (dbeta) dbeta[c] += static_cast<float>(ab[c - c0]);
    }
  }
}

// dx[r, :] = rstd * (g - mean_h(g) * center - xhat * mean_h(g * xhat)), g = dy * gamma; center = 0 for RMSNorm.
void input_grad(float* dx, const float* dy, const float* x, const float* gamma, const float* mean,
                const float* rstd, RowDims d) {
#pragma omp parallel for schedule(static) if (d.n * d.h > (1 << 15))
  for (int64_t r = 0; r < d.n; ++r) {
    const float* xr = x + r * d.h;
    const float* dyr = dy + r * d.h;
    const double mu = mean ? mean[r] : 0.0, rs = rstd[r];
    double sum_g = 0.0, sum_gx = 0.0;
    for (int64_t c = 0; c < d.h; ++c) {
      const double g = static_cast<double>(dyr[c]) * gamma[c];
      sum_g += g;
      sum_gx += g * ((xr[c] - mu) * rs);
    }
    const double mean_g = mean ? sum_g / d.h : 0.0, mean_gx = sum_gx / d.h;
    float* dxr = dx + r * d.h;
    for (int64_t c = 0; c < d.h; ++c) {
      const double g = static_cast<double>(dyr[c]) * gamma[c];
      const double xhat = (xr[c] - mu) * rs;
      dxr[c] = static_cast<float>(rs * (g - mean_g - xhat * mean_gx));
    }
  }
}
}  // namespace

void layernorm_fwd(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& gamma, const Tensor* beta,
                   float eps, Stream) {
  const RowDims d = row_dims("layernorm_fwd", x, gamma);
  if (y.defined()) require_like_x("layernorm_fwd", "y", y, x);
  require_stat("layernorm_fwd", "mean", mean, d.n);
  require_stat("layernorm_fwd", "rstd", rstd, d.n);
  if (beta) {
    require_cpu_f32("layernorm_fwd", "beta", *beta);
    detail::require_numel("layernorm_fwd", "beta", *beta, d.h, "hidden = x.size(-1)");
  }
  MCPP_CHECK(d.h > 0, "layernorm_fwd: hidden size must be positive; got x {}", x.str());
  const float* px = x.data<float>();
  const float* pg = gamma.data<float>();
  const float* pb = beta ? beta->data<float>() : nullptr;
  float* py = y.defined() ? y.data<float>() : nullptr;
  float* pm = mean.data<float>();
  float* pr = rstd.data<float>();
#pragma omp parallel for schedule(static) if (d.n * d.h > (1 << 15))
  for (int64_t r = 0; r < d.n; ++r) {
    const float* xr = px + r * d.h;
    double s = 0.0;
    for (int64_t c = 0; c < d.h; ++c) s += xr[c];
    const double mu = s / d.h;
    double ss = 0.0;
    for (int64_t c = 0; c < d.h; ++c) ss += (xr[c] - mu) * (xr[c] - mu);
    const double rs = 1.0 / std::sqrt(ss / d.h + eps);
    for (int64_t c = 0; py && c < d.h; ++c) {
      const double v = (xr[c] - mu) * rs * pg[c] + (pb ? pb[c] : 0.0f);
      py[r * d.h + c] = static_cast<float>(v);
    }
    pm[r] = static_cast<float>(mu);
    pr[r] = static_cast<float>(rs);
  }
}

void layernorm_bwd(Tensor& dx, Tensor& dgamma_acc, Tensor* dbeta_acc, const Tensor& dy, const Tensor& x,
                   const Tensor& gamma, const Tensor& mean, const Tensor& rstd, Stream) {
  const RowDims d = row_dims("layernorm_bwd", x, gamma);
  require_like_x("layernorm_bwd", "dx", dx, x);
  require_like_x("layernorm_bwd", "dy", dy, x);
  require_stat("layernorm_bwd", "mean", mean, d.n);
  require_stat("layernorm_bwd", "rstd", rstd, d.n);
  require_cpu_f32("layernorm_bwd", "dgamma_acc", dgamma_acc);
  detail::require_numel("layernorm_bwd", "dgamma_acc", dgamma_acc, d.h, "hidden = x.size(-1)");
  if (dbeta_acc) {
    require_cpu_f32("layernorm_bwd", "dbeta_acc", *dbeta_acc);
    detail::require_numel("layernorm_bwd", "dbeta_acc", *dbeta_acc, d.h, "hidden = x.size(-1)");
  }
  // Parameter grads first: dx may alias dy (in-place backward), and they read dy.
  param_grads(dgamma_acc.data<float>(), dbeta_acc ? dbeta_acc->data<float>() : nullptr, dy.data<float>(),
              x.data<float>(), mean.data<float>(), rstd.data<float>(), d);
  input_grad(dx.data<float>(), dy.data<float>(), x.data<float>(), gamma.data<float>(), mean.data<float>(),
             rstd.data<float>(), d);
}

void rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& gamma, float eps, Stream) {
  const RowDims d = row_dims("rmsnorm_fwd", x, gamma);
  if (y.defined()) require_like_x("rmsnorm_fwd", "y", y, x);
  require_stat("rmsnorm_fwd", "rstd", rstd, d.n);
  MCPP_CHECK(d.h > 0, "rmsnorm_fwd: hidden size must be positive; got x {}", x.str());
  const float* px = x.data<float>();
  const float* pg = gamma.data<float>();
  float* py = y.defined() ? y.data<float>() : nullptr;
  float* pr = rstd.data<float>();
#pragma omp parallel for schedule(static) if (d.n * d.h > (1 << 15))
  for (int64_t r = 0; r < d.n; ++r) {
    const float* xr = px + r * d.h;
    double ss = 0.0;
    for (int64_t c = 0; c < d.h; ++c) ss += static_cast<double>(xr[c]) * xr[c];
    const double rs = 1.0 / std::sqrt(ss / d.h + eps);
    for (int64_t c = 0; py && c < d.h; ++c) py[r * d.h + c] = static_cast<float>(xr[c] * rs * pg[c]);
    pr[r] = static_cast<float>(rs);
  }
}

void rmsnorm_bwd(Tensor& dx, Tensor& dgamma_acc, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                 const Tensor& rstd, Stream) {
  const RowDims d = row_dims("rmsnorm_bwd", x, gamma);
  require_like_x("rmsnorm_bwd", "dx", dx, x);
  require_like_x("rmsnorm_bwd", "dy", dy, x);
  require_stat("rmsnorm_bwd", "rstd", rstd, d.n);
  require_cpu_f32("rmsnorm_bwd", "dgamma_acc", dgamma_acc);
  detail::require_numel("rmsnorm_bwd", "dgamma_acc", dgamma_acc, d.h, "hidden = x.size(-1)");
  param_grads(dgamma_acc.data<float>(), nullptr, dy.data<float>(), x.data<float>(), nullptr, rstd.data<float>(), d);
  input_grad(dx.data<float>(), dy.data<float>(), x.data<float>(), gamma.data<float>(), nullptr, rstd.data<float>(),
             d);
}

// ---- fused residual add + norm: the unfused ops composed, so results equal them bit for bit
namespace {
void require_drop(const char* op, const ResidualDropout& drop) {
  MCPP_CHECK(drop.p >= 0.0f && drop.p <= 1.0f, "{}: residual dropout probability p must be in [0, 1]; got {}", op,
             drop.p);
}
void require_sum_operands(const char* op, const Tensor& sum, const Tensor& a, const Tensor& b,
                          const ResidualDropout& drop) {
  require_cpu_f32(op, "sum", sum);
  require_cpu_f32(op, "a", a);
  require_cpu_f32(op, "b", b);
  detail::require_same_shape(op, "a", a, "sum", sum);
  detail::require_same_shape(op, "b", b, "sum", sum);
  require_drop(op, drop);
}
// sum = a + b, or a + dropout_fwd(b) (the dropped b in a temporary: b is the caller's).
void residual_add(Tensor& sum, const Tensor& a, const Tensor& b, const ResidualDropout& drop, Stream stream) {
  if (!drop.active()) return add(sum, a, b, stream);
  Tensor dropped = Tensor::empty(b.shape(), b.dtype(), b.device());
  dropout_fwd(dropped, b, drop.p, drop.key, stream);
  add(sum, a, dropped, stream);
}
}  // namespace

void add_layernorm_fwd(Tensor& sum, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& a, const Tensor& b,
                       const Tensor& gamma, const Tensor* beta, float eps, const ResidualDropout& drop,
                       Stream stream) {
  require_sum_operands("add_layernorm_fwd", sum, a, b, drop);
  residual_add(sum, a, b, drop, stream);
  layernorm_fwd(y, mean, rstd, sum, gamma, beta, eps, stream);
}

void add_rmsnorm_fwd(Tensor& sum, Tensor& y, Tensor& rstd, const Tensor& a, const Tensor& b, const Tensor& gamma,
                     float eps, const ResidualDropout& drop, Stream stream) {
  require_sum_operands("add_rmsnorm_fwd", sum, a, b, drop);
  residual_add(sum, a, b, drop, stream);
  rmsnorm_fwd(y, rstd, sum, gamma, eps, stream);
}

namespace {
void require_dres(const char* op, const Tensor& dres, const Tensor& dx, const Tensor& x) {
  require_like_x(op, "dres", dres, x);
  MCPP_CHECK(dres.raw() != dx.raw(), "{}: dres must not alias dx (dx is written before dres is added)", op);
}
void require_sum_acc(const char* op, const char* arg, const Tensor* acc, int64_t h) {
  if (!acc) return;
  require_cpu_f32(op, arg, *acc);
  detail::require_numel(op, arg, *acc, h, "hidden = x.size(-1)");
}
void require_dbranch(const char* op, const ResidualDropout& drop, const Tensor* dbranch, const Tensor& dx,
                     const Tensor& dy, const Tensor& dres, const Tensor& x) {
  require_drop(op, drop);
  if (!drop.active()) return;
  MCPP_CHECK(dbranch, "{}: a residual dropout needs dbranch (the gradient of the dropped branch)", op);
  require_like_x(op, "dbranch", *dbranch, x);
  for (const Tensor* t : {&dx, &dy, &dres, &x})
    MCPP_CHECK(dbranch->raw() != t->raw(), "{}: dbranch must not alias dx, dy, dres or x", op);
}
// With a residual dropout dbranch = dropout_bwd(dx); then the residual bias sums (linear_bwd's column sums of
// dres and of the branch's gradient: dbranch, else dx).
void branch_grad_and_sums(const Tensor& dx, const Tensor& dres, Tensor* dres_sum_acc, Tensor* dx_sum_acc,
                          const ResidualDropout& drop, Tensor* dbranch, Stream stream) {
  const int64_t h = dx.size(-1);
  if (drop.active()) dropout_bwd(*dbranch, dx, drop.p, drop.key, stream);
  const Tensor& branch = drop.active() ? *dbranch : dx;
  if (dres_sum_acc) detail::column_sum_acc(*dres_sum_acc, dres.view({-1, h}));
  if (dx_sum_acc) detail::column_sum_acc(*dx_sum_acc, branch.view({-1, h}));
}
}  // namespace

void add_layernorm_bwd(Tensor& dx, Tensor& dgamma_acc, Tensor* dbeta_acc, const Tensor& dy, const Tensor& dres,
                       const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                       Tensor* dres_sum_acc, Tensor* dx_sum_acc, const ResidualDropout& drop, Tensor* dbranch,
                       Stream stream) {
  const char* op = "add_layernorm_bwd";
  require_dres(op, dres, dx, x);
  require_sum_acc(op, "dres_sum_acc", dres_sum_acc, gamma.numel());
  require_sum_acc(op, "dx_sum_acc", dx_sum_acc, gamma.numel());
  require_dbranch(op, drop, dbranch, dx, dy, dres, x);
  layernorm_bwd(dx, dgamma_acc, dbeta_acc, dy, x, gamma, mean, rstd, stream);
  add_inplace(dx, dres, stream);
  branch_grad_and_sums(dx, dres, dres_sum_acc, dx_sum_acc, drop, dbranch, stream);
}

void add_rmsnorm_bwd(Tensor& dx, Tensor& dgamma_acc, const Tensor& dy, const Tensor& dres, const Tensor& x,
                     const Tensor& gamma, const Tensor& rstd, Tensor* dres_sum_acc, Tensor* dx_sum_acc,
                     const ResidualDropout& drop, Tensor* dbranch, Stream stream) {
  const char* op = "add_rmsnorm_bwd";
  require_dres(op, dres, dx, x);
  require_sum_acc(op, "dres_sum_acc", dres_sum_acc, gamma.numel());
  require_sum_acc(op, "dx_sum_acc", dx_sum_acc, gamma.numel());
  require_dbranch(op, drop, dbranch, dx, dy, dres, x);
  rmsnorm_bwd(dx, dgamma_acc, dy, x, gamma, rstd, stream);
  add_inplace(dx, dres, stream);
  branch_grad_and_sums(dx, dres, dres_sum_acc, dx_sum_acc, drop, dbranch, stream);
}

}  // namespace mcpp::ops::cpu
