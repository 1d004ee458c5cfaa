// CUDA LayerNorm and RMSNorm over the last dim h (Megatron's FusedLayerNorm / RMSNorm), norms_kernels.cu.
//   layernorm_fwd: mean[n], rstd[n] float32 saved; y = (x - mean) rstd gamma (+ beta)   (biased var)
//   layernorm_bwd: dx = rstd (g - mean_h(g) - xhat mean_h(g xhat)), g = dy gamma        (overwritten)
//                  dgamma_acc += sum_n dy xhat; dbeta_acc += sum_n dy                   (ACCUMULATE, fp32)
//   rmsnorm_fwd:   rstd = 1/sqrt(mean(x^2) + eps); y = x rstd gamma
//   rmsnorm_bwd:   dx = rstd (g - xhat mean_h(g xhat)); dgamma_acc += sum_n dy xhat     (ACCUMULATE, fp32)
//   an undefined y: the statistics only (the same values)
//   add_layernorm_fwd / add_rmsnorm_fwd: sum = a + b rounded to sum's dtype (as `add`), y = norm(sum) — one
//                  pass, bitwise equal to add + the norm when both take the vector path (16-byte aligned)
//                  with a residual dropout b is dropped in registers first (as dropout_fwd stores it)
//   add_layernorm_bwd / add_rmsnorm_bwd: dx = the norm's dx + dres, added in fp32 before dx's one rounding
//                  (fp32: bitwise equal to the norm's bwd + add_inplace); dres must not alias dx; with a
//                  residual dropout also dbranch = dropout_bwd(dx as stored) in the same kernel; the
//                  optional residual bias sums (column sums of dres and of the branch's gradient as stored)
//                  ride in the same kernel (vector path) or run the column-sum kernel after it (scalar path)
// x/y/dy/dx: float32 or bf16 [.., h]; gamma/beta float32 or bf16 (h elements); statistics float32 math.
// Asynchronous on stream_of(stream). The backward sums dgamma/dbeta deterministically (both paths) through
// an fp32 scratch [2, parts, h] allocated here per call (stream
// ordered on compute_stream(); a foreign stream is joined with events both ways).
#include "mcpp/kernels/cuda/cuda_check.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cuda {
using namespace cuda_detail;

namespace {
struct RowDims {
  int64_t n, h;
};
// x_name: the normalized input's argument name (x, or sum for the fused forward).
RowDims row_dims(const char* op, const Tensor& x, const Tensor& gamma, const char* x_name = "x") {
  require_float(op, x_name, x);
  require_float(op, "gamma", gamma);
  const int64_t h = last_dim(op, x_name, x);
  require_numel(op, "gamma", gamma, h, "hidden = the last dim of x / sum");
  MCPP_CHECK(h > 0, "{}: hidden size must be positive; got {} {}", op, x_name, x.str());
  return {x.numel() / h, h};
}
// A parameter gradient accumulator: float32 [h].
float* param_acc(const char* op, const char* arg, Tensor& t, int64_t h) {
  require_float(op, arg, t, /*bf16_ok=*/false);
  require_numel(op, arg, t, h, "hidden = x.size(-1)");
  return t.data<float>();
}
void check_like_x(const char* op, const char* arg, const Tensor& t, const Tensor& x) {
  require_float(op, arg, t);
  require_same_shape(op, arg, t, "x", x);
}
// The branch dropout of a fused add + norm as the kernels take it.
NormDrop norm_drop(const char* op, const ResidualDropout& drop) {
  MCPP_CHECK(drop.p >= 0.0f && drop.p <= 1.0f, "{}: residual dropout probability p must be in [0, 1]; got {}", op,
             drop.p);
  if (!drop.active()) return {};
  return {drop.p, drop.p < 1.0f ? 1.0f / (1.0f - drop.p) : 0.0f, drop.key.seed, drop.key.offset,
          drop.key.device_base};
}
// dbranch of a fused backward with a residual dropout (x's shape, aliasing none of the op's inputs / dx).
FOut dbranch_of(const char* op, const ResidualDropout& drop, Tensor* dbranch, const Tensor& dx, const Tensor& dy,
                const Tensor& dres, const Tensor& x) {
  if (!drop.active()) return FOut{nullptr, kF32};
  MCPP_CHECK(dbranch, "{}: a residual dropout needs dbranch (the gradient of the dropped branch)", op);
  check_like_x(op, "dbranch", *dbranch, x);
  for (const Tensor* t : {&dx, &dy, &dres, &x})
    MCPP_CHECK(dbranch->raw() != t->raw(), "{}: dbranch must not alias dx, dy, dres or x", op);
  return fout_of(op, "dbranch", *dbranch);
}
// launch_norm_bwd with its partials scratch (dgamma/dbeta, and the residual sums when asked).
void norm_bwd(FOut dx, float* dg, float* db, FIn dy, FIn x, FIn dres, FIn gamma, const float* mean,
              const float* rstd, int64_t n, int64_t h, cudaStream_t s, float* dres_sum = nullptr,
              float* dx_sum = nullptr, FOut dbranch = {nullptr, kF32}, const NormDrop& drop = {}) {
  const bool sums = dres.p && (dres_sum || dx_sum);
  const int64_t parts = norm_bwd_partial_blocks(n, h, dx, dy, x, dres, gamma, sums, dbranch);
  if (parts == 0) return;  // no rows
  // ordered on compute_stream()
  Tensor scratch = Tensor::empty({norm_bwd_scratch_floats(n, h, parts, sums)}, DType::F32, Device::CUDA);
  const cudaStream_t cs = compute_stream();
  cudaEvent_t ev = nullptr;
  if (s != cs) {
    MCPP_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    MCPP_CUDA_CHECK(cudaEventRecord(ev, cs));
    MCPP_CUDA_CHECK(cudaStreamWaitEvent(s, ev, 0));
  }
  launch_norm_bwd(dx, dg, db, dy, x, dres, gamma, mean, rstd, n, h, dres_sum, dx_sum, scratch.data<float>(), parts,
                  s, dbranch, drop);
  if (s != cs) {  // the scratch is freed on compute_stream(): after this op's kernels
    MCPP_CUDA_CHECK(cudaEventRecord(ev, s));
    MCPP_CUDA_CHECK(cudaStreamWaitEvent(cs, ev, 0));
    MCPP_CUDA_CHECK(cudaEventDestroy(ev));
  }
}
FIn beta_of(const char* op, const Tensor* beta, int64_t h) {
  if (!beta) return FIn{nullptr, kF32};
  require_numel(op, "beta", *beta, h, "hidden = x.size(-1)");
  return fin_of(op, "beta", *beta);
}
// A forward's y shaped like x, or none (undefined: the statistics only).
FOut y_of(const char* op, Tensor& y, const Tensor& x) {
  if (!y.defined()) return FOut{nullptr, kF32};
  check_like_x(op, "y", y, x);
  return fout_of(op, "y", y);
}
// The residual operands of the fused forward: a and b shaped like sum.
void check_sum_operands(const char* op, const Tensor& sum, const Tensor& a, const Tensor& b) {
  require_float(op, "sum", sum);
  require_same_shape(op, "a", a, "sum", sum);
  require_same_shape(op, "b", b, "sum", sum);
}
// An optional fp32 [h] accumulator (the residual bias sums).
float* sum_acc(const char* op, const char* arg, Tensor* acc, int64_t h) {
  if (!acc) return nullptr;
  require_float(op, arg, *acc, /*bf16_ok=*/false);
  require_numel(op, arg, *acc, h, "hidden = x.size(-1)");
  return acc->data<float>();
}
FIn dres_of(const char* op, const Tensor& dres, const Tensor& dx, const Tensor& x) {
  check_like_x(op, "dres", dres, x);
  MCPP_CHECK(dres.raw() != dx.raw(), "{}: dres must not alias dx", op);
  return fin_of(op, "dres", dres);
}
}  // namespace

void layernorm_fwd(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& gamma, const Tensor* beta,
                   float eps, Stream stream) {
  const char* op = "layernorm_fwd";
  const RowDims d = row_dims(op, x, gamma);
  launch_norm_fwd(y_of(op, y, x), FOut{nullptr, kF32}, row_stat(op, "mean", mean, d.n),
                  row_stat(op, "rstd", rstd, d.n), fin_of(op, "x", x), FIn{nullptr, kF32}, fin_of(op, "gamma", gamma),
                  beta_of(op, beta, d.h), d.n, d.h, eps, stream_of(stream));
}

void add_layernorm_fwd(Tensor& sum, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& a, const Tensor& b,
                       const Tensor& gamma, const Tensor* beta, float eps, const ResidualDropout& drop,
                       Stream stream) {
  const char* op = "add_layernorm_fwd";
  check_sum_operands(op, sum, a, b);
  const RowDims d = row_dims(op, sum, gamma, "sum");
  launch_norm_fwd(y_of(op, y, sum), fout_of(op, "sum", sum), row_stat(op, "mean", mean, d.n),
                  row_stat(op, "rstd", rstd, d.n), fin_of(op, "a", a), fin_of(op, "b", b), fin_of(op, "gamma", gamma),
                  beta_of(op, beta, d.h), d.n, d.h, eps, stream_of(stream), norm_drop(op, drop));
}

void layernorm_bwd(Tensor& dx, Tensor& dgamma_acc, Tensor* dbeta_acc, const Tensor& dy, const Tensor& x,
                   const Tensor& gamma, const Tensor& mean, const Tensor& rstd, Stream stream) {
  const char* op = "layernorm_bwd";
  const RowDims d = row_dims(op, x, gamma);
  check_like_x(op, "dx", dx, x);
  check_like_x(op, "dy", dy, x);
  float* dg = param_acc(op, "dgamma_acc", dgamma_acc, d.h);
  float* db = dbeta_acc ? param_acc(op, "dbeta_acc", *dbeta_acc, d.h) : nullptr;
  norm_bwd(fout_of(op, "dx", dx), dg, db, fin_of(op, "dy", dy), fin_of(op, "x", x), FIn{nullptr, kF32},
           fin_of(op, "gamma", gamma), row_stat(op, "mean", mean, d.n), row_stat(op, "rstd", rstd, d.n), d.n, d.h,
           stream_of(stream));
}

void add_layernorm_bwd(Tensor& dx, Tensor& dgamma_acc, Tensor* dbeta_acc, const Tensor& dy, const Tensor& dres,
                       const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                       Tensor* dres_sum_acc, Tensor* dx_sum_acc, const ResidualDropout& drop, Tensor* dbranch,
                       Stream stream) {
  const char* op = "add_layernorm_bwd";
  const RowDims d = row_dims(op, x, gamma);
  check_like_x(op, "dx", dx, x);
  check_like_x(op, "dy", dy, x);
  const FIn fr = dres_of(op, dres, dx, x);
  const NormDrop nd = norm_drop(op, drop);
  const FOut fb = dbranch_of(op, drop, dbranch, dx, dy, dres, x);
  float* dg = param_acc(op, "dgamma_acc", dgamma_acc, d.h);
  float* db = dbeta_acc ? param_acc(op, "dbeta_acc", *dbeta_acc, d.h) : nullptr;
  norm_bwd(fout_of(op, "dx", dx), dg, db, fin_of(op, "dy", dy), fin_of(op, "x", x), fr, fin_of(op, "gamma", gamma),
           row_stat(op, "mean", mean, d.n), row_stat(op, "rstd", rstd, d.n), d.n, d.h, stream_of(stream),
           sum_acc(op, "dres_sum_acc", dres_sum_acc, d.h), sum_acc(op, "dx_sum_acc", dx_sum_acc, d.h), fb, nd);
}

void rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& gamma, float eps, Stream stream) {
  const char* op = "rmsnorm_fwd";
  const RowDims d = row_dims(op, x, gamma);
  launch_norm_fwd(y_of(op, y, x), FOut{nullptr, kF32}, nullptr, row_stat(op, "rstd", rstd, d.n), fin_of(op, "x", x),
                  FIn{nullptr, kF32}, fin_of(op, "gamma", gamma), FIn{nullptr, kF32}, d.n, d.h, eps,
                  stream_of(stream));
}

void add_rmsnorm_fwd(Tensor& sum, Tensor& y, Tensor& rstd, const Tensor& a, const Tensor& b, const Tensor& gamma,
                     float eps, const ResidualDropout& drop, Stream stream) {
  const char* op = "add_rmsnorm_fwd";
  check_sum_operands(op, sum, a, b);
  const RowDims d = row_dims(op, sum, gamma, "sum");
  launch_norm_fwd(y_of(op, y, sum), fout_of(op, "sum", sum), nullptr, row_stat(op, "rstd", rstd, d.n),
                  fin_of(op, "a", a), fin_of(op, "b", b), fin_of(op, "gamma", gamma), FIn{nullptr, kF32}, d.n, d.h,
                  eps, stream_of(stream), norm_drop(op, drop));
}

void rmsnorm_bwd(Tensor& dx, Tensor& dgamma_acc, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                 const Tensor& rstd, Stream stream) {
  const char* op = "rmsnorm_bwd";
  const RowDims d = row_dims(op, x, gamma);
  check_like_x(op, "dx", dx, x);
  check_like_x(op, "dy", dy, x);
  norm_bwd(fout_of(op, "dx", dx), param_acc(op, "dgamma_acc", dgamma_acc, d.h), nullptr, fin_of(op, "dy", dy),
           fin_of(op, "x", x), FIn{nullptr, kF32}, fin_of(op, "gamma", gamma), nullptr, row_stat(op, "rstd", rstd, d.n),
           d.n, d.h, stream_of(stream));
}

void add_rmsnorm_bwd(Tensor& dx, Tensor& dgamma_acc, const Tensor& dy, const Tensor& dres, const Tensor& x,
                     const Tensor& gamma, const Tensor& rstd, Tensor* dres_sum_acc, Tensor* dx_sum_acc,
                     const ResidualDropout& drop, Tensor* dbranch, Stream stream) {
  const char* op = "add_rmsnorm_bwd";
  const RowDims d = row_dims(op, x, gamma);
  check_like_x(op, "dx", dx, x);
  check_like_x(op, "dy", dy, x);
  const FIn fr = dres_of(op, dres, dx, x);
  const NormDrop nd = norm_drop(op, drop);
  const FOut fb = dbranch_of(op, drop, dbranch, dx, dy, dres, x);
  norm_bwd(fout_of(op, "dx", dx), param_acc(op, "dgamma_acc", dgamma_acc, d.h), nullptr, fin_of(op, "dy", dy),
           fin_of(op, "x", x), fr, fin_of(op, "gamma", gamma), nullptr, row_stat(op, "rstd", rstd, d.n), d.n, d.h,
           stream_of(stream), sum_acc(op, "dres_sum_acc", dres_sum_acc, d.h),
           sum_acc(op, "dx_sum_acc", dx_sum_acc, d.h), fb, nd);
}

}  // namespace mcpp::ops::cuda
