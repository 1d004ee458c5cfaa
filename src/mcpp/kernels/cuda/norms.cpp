// CUDA LayerNorm and RMSNorm over the last dim h (Megatron's FusedLayerNorm / RMSNorm), norms_kernels.cu.
//   layernorm_fwd: mean[n], rstd[n] float32 saved; y = (x - mean) rstd gamma (+ beta)   (biased var)
//   layernorm_bwd: dx = rstd (g - mean_h(g) - xhat mean_h(g xhat)), g = dy gamma        (overwritten)
//                  dgamma_acc += sum_n dy xhat; dbeta_acc += sum_n dy                   (ACCUMULATE, fp32)
//   rmsnorm_fwd:   rstd = 1/sqrt(mean(x^2) + eps); y = x rstd gamma
//   rmsnorm_bwd:   dx = rstd (g - xhat mean_h(g xhat)); dgamma_acc += sum_n dy xhat     (ACCUMULATE, fp32)
// x/y/dy/dx: float32 or bf16 [.., h]; gamma/beta float32 or bf16 (h elements); statistics float32 math.
// Asynchronous on stream_of(stream). The backward's vector path (h % 8 == 0, 16-byte aligned) sums
// dgamma/dbeta deterministically through an fp32 scratch [2, parts, h] allocated here per call (stream
// ordered on compute_stream(); a foreign stream is joined with events both ways).
#include "mcpp/kernels/cuda/cuda_check.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cuda {
using namespace cuda_detail;

namespace {
struct RowDims {
  int64_t n, h;
};
RowDims row_dims(const char* op, const Tensor& x, const Tensor& gamma) {
  require_float(op, "x", x);
  require_float(op, "gamma", gamma);
  const int64_t h = last_dim(op, "x", x);
  require_numel(op, "gamma", gamma, h, "hidden = x.size(-1)");
  MCPP_CHECK(h > 0, "{}: hidden size must be positive; got x {}", op, x.str());
  return {x.numel() / h, h};
}
float* stat(const char* op, const char* arg, const Tensor& t, int64_t n) {
  require_float(op, arg, t, /*bf16_ok=*/false);
  require_numel(op, arg, t, n, "one per row of x");
  return t.data<float>();
}
void check_like_x(const char* op, const char* arg, const Tensor& t, const Tensor& x) {
  require_float(op, arg, t);
  require_same_shape(op, arg, t, "x", x);
}
// launch_norm_bwd with its dgamma/dbeta partials scratch.
void norm_bwd(FOut dx, float* dg, float* db, FIn dy, FIn x, FIn gamma, const float* mean, const float* rstd,
              int64_t n, int64_t h, cudaStream_t s) {
  const int64_t parts = norm_bwd_partial_blocks(n, h);
  if (parts == 0) {
    launch_norm_bwd(dx, dg, db, dy, x, gamma, mean, rstd, n, h, nullptr, 0, s);
    return;
  }
  Tensor scratch = Tensor::empty({2 * parts * h}, DType::F32, Device::CUDA);  // ordered on compute_stream()
  const cudaStream_t cs = compute_stream();
  cudaEvent_t ev = nullptr;
  if (s != cs) {
    MCPP_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    MCPP_CUDA_CHECK(cudaEventRecord(ev, cs));
    MCPP_CUDA_CHECK(cudaStreamWaitEvent(s, ev, 0));
  }
  launch_norm_bwd(dx, dg, db, dy, x, gamma, mean, rstd, n, h, scratch.data<float>(), parts, s);
  if (s != cs) {  // the scratch is freed on compute_stream(): after this op's kernels
    MCPP_CUDA_CHECK(cudaEventRecord(ev, s));
    MCPP_CUDA_CHECK(cudaStreamWaitEvent(cs, ev, 0));
    MCPP_CUDA_CHECK(cudaEventDestroy(ev));
  }
}
}  // namespace

void layernorm_fwd(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& gamma, const Tensor* beta,
                   float eps, Stream stream) {
  const char* op = "layernorm_fwd";
  const RowDims d = row_dims(op, x, gamma);
  check_like_x(op, "y", y, x);
  FIn fb{nullptr, kF32};
  if (beta) {
    fb = fin_of(op, "beta", *beta);
    require_numel(op, "beta", *beta, d.h, "hidden = x.size(-1)");
  }
  launch_norm_fwd(fout_of(op, "y", y), stat(op, "mean", mean, d.n), stat(op, "rstd", rstd, d.n), fin_of(op, "x", x),
                  fin_of(op, "gamma", gamma), fb, d.n, d.h, eps, stream_of(stream));
}

void layernorm_bwd(Tensor& dx, Tensor& dgamma_acc, Tensor* dbeta_acc, const Tensor& dy, const Tensor& x,
                   const Tensor& gamma, const Tensor& mean, const Tensor& rstd, Stream stream) {
  const char* op = "layernorm_bwd";
  const RowDims d = row_dims(op, x, gamma);
  check_like_x(op, "dx", dx, x);
  check_like_x(op, "dy", dy, x);
  float* dg = stat(op, "dgamma_acc", dgamma_acc, d.h);
  float* db = dbeta_acc ? stat(op, "dbeta_acc", *dbeta_acc, d.h) : nullptr;
  norm_bwd(fout_of(op, "dx", dx), dg, db, fin_of(op, "dy", dy), fin_of(op, "x", x), fin_of(op, "gamma", gamma),
           stat(op, "mean", mean, d.n), stat(op, "rstd", rstd, d.n), d.n, d.h, stream_of(stream));
}

void rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& gamma, float eps, Stream stream) {
  const char* op = "rmsnorm_fwd";
  const RowDims d = row_dims(op, x, gamma);
  check_like_x(op, "y", y, x);
  launch_norm_fwd(fout_of(op, "y", y), nullptr, stat(op, "rstd", rstd, d.n), fin_of(op, "x", x),
                  fin_of(op, "gamma", gamma), FIn{nullptr, kF32}, d.n, d.h, eps, stream_of(stream));
}

void rmsnorm_bwd(Tensor& dx, Tensor& dgamma_acc, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                 const Tensor& rstd, Stream stream) {
  const char* op = "rmsnorm_bwd";
  const RowDims d = row_dims(op, x, gamma);
  check_like_x(op, "dx", dx, x);
  check_like_x(op, "dy", dy, x);
  norm_bwd(fout_of(op, "dx", dx), stat(op, "dgamma_acc", dgamma_acc, d.h), nullptr, fin_of(op, "dy", dy),
           fin_of(op, "x", x), fin_of(op, "gamma", gamma), nullptr, stat(op, "rstd", rstd, d.n), d.n, d.h,
           stream_of(stream));
}

}  // namespace mcpp::ops::cuda
