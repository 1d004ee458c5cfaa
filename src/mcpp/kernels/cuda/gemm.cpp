// CUDA GEMM and Linear (Megatron weight layout W[out, in]) through cuBLASLt.
//
//   gemm:       C[m,n] = alpha * op(A) @ op(B) + beta * C; A/B 2-D float32 or bfloat16 (the same dtype),
//               C float32 or bfloat16 (bf16 C needs bf16 A/B). fp32 accumulate (CUBLAS_COMPUTE_32F: fp32
//               inputs use full fp32 FMA, not TF32, so results track the CPU reference to ~1e-6).
//   linear_fwd: y[n,out] = x[n,in] @ W[out,in]^T (+ bias[out]) — the bias is a cuBLASLt epilogue
//               (CUBLASLT_EPILOGUE_BIAS), no extra pass. x may be [.., in].
//   linear_bwd: dx[n,in] = dy @ W (overwritten; skipped when dx == nullptr);
//               dw_acc[out,in] += dy^T @ x  (ACCUMULATES: beta = 1 into the fp32 main grad);
//               db_acc[out] += sum_n dy     (ACCUMULATES; the BGRADB epilogue of the dw GEMM, fp32, no extra
//               pass and deterministic; or the plain dw GEMM + the (deterministic) column-sum kernel where
//               cuBLASLt refuses BGRADB or that pair was timed faster: set_bias_grad_path, gemm_autotune.h).
//               GradWrite::Overwrite: dw_acc = (beta = 0, dw_acc never read), db_acc = (BGRADB into it).
//   linear_gelu_fwd: pre_act = x W^T (+ bias), act = gelu_tanh(pre_act) in ONE GEMM: the GELU_AUX(_BIAS)
//               epilogue writes act as D and pre_act as the aux matrix (Transformer Engine's fc1 fusion).
//   linear_dgelu_bwd: dpre = (dy @ W) * gelu'(pre_act) in ONE GEMM with the DGELU epilogue (aux = pre_act
//               as input); db_acc += sum_n dpre through DGELU_BGRAD's fp32 bias-grad output (it overwrites,
//               so into a scratch vector, then added; bitwise deterministic), or DGELU + the column-sum
//               kernel where cuBLASLt has no fp32 bias grad for the dtype (bf16 on the H200; the column sum
//               adds fixed row-chunk partials in a fixed order: deterministic too).
//   Fused only when cuBLASLt takes it: x/w/D/aux one dtype (float32 or bfloat16), aux ld = D's column-major
//   rows (`out` here) divisible by 8 and the aux pointer 16-byte aligned (cuBLASLt's AUX_LD rule), and the
//   heuristic returning an algorithm; otherwise the explicit fallback runs the unfused ops (GEMM, gelu_fwd /
//   gelu_bwd, column sum) — cuda_epilogue_fusion_counts() (ops.h) counts which path ran.
// Row-major C = op(A) op(B) is computed as the column-major product C^T = op(B)^T op(A)^T, so no copies.
// Matmul descriptors, layouts and the heuristic's candidate algorithms (up to 8, its order) are cached per
// (shape, dtypes, transposes, epilogue, pointer alignment), at most kMaxPlans plans (least recently used evicted:
// data-dependent shapes — MoE experts' row counts — would otherwise grow the cache every step); one 32 MiB
// workspace per process. Runs on stream_of(stream).
// Algorithm autotuning (gemm_autotune.h; switch set_gemm_autotune / env MCPP_GEMM_AUTOTUNE=0|1, default on;
// --deterministic-mode turns it off; only the first kMaxTunedPerFamily plans of a family of shapes that differ
// only in m / k / alignment, later ones run an algorithm borrowed from the family, untimed: plan_for): the first
// call of a plan with the switch on times each candidate
// (one warm-up launch each, then 5 interleaved rounds of one launch per candidate, cudaEvents, median) on
// the call's own operands, and keeps cuBLASLt's #0 unless another is >= 3% faster (a stable choice; noise
// cannot flip between near-equal kernels). Timing never writes the caller's outputs: D, a bias-grad output
// (BGRADB, DGELU_BGRAD) and a GELU aux output go to a scratch cudaMalloc'd for the tuning (outside the
// caching pool, so the pool's high-water mark and reuse are untouched; freed before returning, which
// synchronizes the device once per plan; no memory for it = no tuning), and with beta != 0 the caller's C
// is only read (C != D), so an accumulating dw_acc (beta = 1) is accumulated exactly once, by the real
// call after the timing. Inputs (A, B, a bias, DGELU's aux) are read as they are. Never while the stream is
// capturing a CUDA graph (cudaStreamIsCapturing: the plan runs #0 and tunes at a later uncaptured call).
// With the switch off every call runs #0 (a tuned choice is kept but unused), the pre-autotune behaviour
// and bitwise reproducible across processes; with it on the choice may differ between processes (timing
// noise), so results may differ in the last bits between runs, never within one run.
// The files: gemm.cpp (these ops), gemm_plan_cache.cpp (the plan cache, lt_matmul), gemm_tuner.cpp (the
// autotuner and the bias-grad path), gemm_lt.h (what they share).
#include <algorithm>

#include "mcpp/kernels/cuda/gemm_lt.h"

namespace mcpp {
namespace ops::cuda {
using namespace gemm_lt;

namespace {

struct LinearDims {
  int64_t n, in, out;
};
LinearDims linear_dims(const char* op, const Tensor& x, const Tensor& w, const Tensor& y, const char* y_name,
                       const char* x_name = "x") {
  require_float(op, x_name, x);
  require_float(op, "w", w);
  require_float(op, y_name, y);
  MCPP_CHECK(w.ndim() == 2, "{}: w must be 2-D [out, in]; got {}", op, w.str());
  const int64_t out = w.size(0), in = w.size(1);
  MCPP_CHECK(x.ndim() >= 1 && x.size(-1) == in, "{}: {} must be [.., in={}] for w {}; got {}", op, x_name, in,
             w.str(), x.str());
  Shape want = x.shape();
  want.back() = out;
  MCPP_CHECK(y.shape() == want, "{}: {} must be {} for {} {} and w {}; got {}", op, y_name, shape_str(want), x_name,
             x.str(), w.str(), y.str());
  return {in ? x.numel() / in : 0, in, out};
}

// The GELU epilogues' preconditions (see the header): one dtype for the GEMM inputs, D and the aux matrix,
// float32 or bfloat16; aux ld (= cols, D's column-major rows) divisible by 8; aux 16-byte aligned.
bool gelu_epilogue_eligible(const Tensor& a, const Tensor& w, const Tensor& d, const Tensor& aux, int64_t cols) {
  const DType dt = d.dtype();
  if (dt != DType::F32 && dt != DType::BF16) return false;
  if (a.dtype() != dt || w.dtype() != dt || aux.dtype() != dt) return false;
  return cols % 8 == 0 && alignment_of(aux.raw()) >= 16;
}

void column_sum_into(Tensor& db_acc, const Tensor& m2, cudaStream_t s) {  // db_acc[cols] += sum_rows m2
  Tensor partial = Tensor::empty({column_sum_parts(m2.size(0)), m2.size(1)}, DType::F32, Device::CUDA);
  launch_column_sum_acc(db_acc.data<float>(), fin(m2, require_float("column_sum", "m", m2)), m2.size(0), m2.size(1),
                        partial.data<float>(), s);
}

}  // namespace

void gemm(Tensor& c, const Tensor& a, const Tensor& b, const GemmOptions& opt, Stream stream) {
  lt_matmul(c, a, b, opt, Epilogue{}, stream_of(stream));
}

void linear_fwd(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias, Stream stream) {
  const LinearDims d = linear_dims("linear_fwd", x, w, y, "y");
  if (bias) require_numel("linear_fwd", "bias", *bias, d.out, "out = w.size(0)");
  Tensor x2 = x.view({d.n, d.in});   // [n, in]
  Tensor y2 = y.view({d.n, d.out});  // [n, out]
  const GemmOptions opt{.trans_a = false, .trans_b = true, .alpha = 1.0f, .beta = 0.0f};
  if (d.in == 0 && bias) fail("linear_fwd: in = 0 with a bias is not supported on CUDA (x {})", x.str());
  Epilogue e;
  if (bias)
    e = {.kind = CUBLASLT_EPILOGUE_BIAS, .bias = bias->raw(), .kbias = require_float("linear_fwd", "bias", *bias)};
  lt_matmul(y2, x2, w, opt, e, stream_of(stream));
}

void linear_bwd(Tensor* dx, Tensor& dw_acc, Tensor* db_acc, const Tensor& dy, const Tensor& x, const Tensor& w,
                GradWrite grad_write, Stream stream) {
  const LinearDims d = linear_dims("linear_bwd", x, w, dy, "dy");
  require_float("linear_bwd", "dw_acc", dw_acc);
  require_same_shape("linear_bwd", "dw_acc", dw_acc, "w", w);
  cudaStream_t s = stream_of(stream);
  Tensor x2 = x.view({d.n, d.in});     // [n, in]
  Tensor dy2 = dy.view({d.n, d.out});  // [n, out]
  if (dx) {
    require_same_shape("linear_bwd", "dx", *dx, "x", x);
    Tensor dx2 = dx->view({d.n, d.in});  // [n, in] = dy[n, out] @ w[out, in]
    lt_matmul(dx2, dy2, w, GemmOptions{}, Epilogue{}, s);
  }
  // dw[out, in] += dy[n, out]^T @ x[n, in]; Overwrite: beta = 0 (no read of dw_acc, no zeroing pass before)
  const bool overwrite = grad_write == GradWrite::Overwrite;
  const GemmOptions wgrad{.trans_a = true, .trans_b = false, .alpha = 1.0f, .beta = overwrite ? 0.0f : 1.0f};
  if (db_acc) {
    require_float("linear_bwd", "db_acc", *db_acc, /*bf16_ok=*/false);
    require_numel("linear_bwd", "db_acc", *db_acc, d.out, "out = w.size(0)");
    const Kind kdy = require_float("linear_bwd", "dy", dy);
    // The bias grad rides in the weight-grad GEMM: BGRADB reduces cuBLASLt's B operand (our dy) over the
    // GEMM's k (= n) into an fp32 vector [out] — no extra pass over dy, deterministic. It overwrites: into
    // db_acc itself under Overwrite (when 16-byte aligned, as cuBLASLt's vector pointers want), else a
    // scratch, then db_acc += it (or = it). Where cuBLASLt refuses it, or the plain GEMM + the column-sum
    // kernel was timed faster (bias_grad_split): those two.
    const bool direct = overwrite && reinterpret_cast<uintptr_t>(db_acc->raw()) % 16 == 0;
    Tensor db = direct ? *db_acc : Tensor::empty({d.out}, DType::F32, Device::CUDA);  // [out]
    const Epilogue e{.kind = CUBLASLT_EPILOGUE_BGRADB, .bias = db.raw(), .kbias = kF32};
    if (d.n > 0 && d.in > 0 && d.out > 0 && !bias_grad_split(dw_acc, dy2, x2, wgrad, e, fin(dy, kdy), s) &&
        lt_matmul(dw_acc, dy2, x2, wgrad, e, s, /*may_fail=*/true)) {
      if (overwrite && !direct)  // a copy: the stale contents may hold anything (NaN * 0 is NaN)
        MCPP_CUDA_CHECK(cudaMemcpyAsync(db_acc->raw(), db.raw(), db.nbytes(), cudaMemcpyDeviceToDevice, s));
      else if (!overwrite)
        launch_axpby_inplace(FOut{db_acc->raw(), kF32}, FIn{db.raw(), kF32}, 1.0f, 1.0f, d.out, s);
      return;
    }
    lt_matmul(dw_acc, dy2, x2, wgrad, Epilogue{}, s);
    if (overwrite) MCPP_CUDA_CHECK(cudaMemsetAsync(db_acc->raw(), 0, db_acc->nbytes(), s));
    column_sum_into(*db_acc, dy2, s);
    return;
  }
  lt_matmul(dw_acc, dy2, x2, wgrad, Epilogue{}, s);
}

void linear_gelu_fwd(Tensor& act, Tensor& pre_act, const Tensor& x, const Tensor& w, const Tensor* bias,
                     Stream stream) {
  const LinearDims d = linear_dims("linear_gelu_fwd", x, w, act, "act");
  require_float("linear_gelu_fwd", "pre_act", pre_act);
  require_same_shape("linear_gelu_fwd", "pre_act", pre_act, "act", act);
  Kind kbias = kF32;
  if (bias) {
    kbias = require_float("linear_gelu_fwd", "bias", *bias);
    require_numel("linear_gelu_fwd", "bias", *bias, d.out, "out = w.size(0)");
  }
  if (gelu_epilogue_eligible(x, w, act, pre_act, d.out)) {
    Tensor x2 = x.view({d.n, d.in});       // [n, in]
    Tensor act2 = act.view({d.n, d.out});  // [n, out] = gelu(pre_act), pre_act [n, out] the aux output
    const Epilogue e{.kind = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX,
                     .bias = bias ? bias->raw() : nullptr,
                     .kbias = kbias,
                     .aux = pre_act.raw()};
    const GemmOptions opt{.trans_a = false, .trans_b = true, .alpha = 1.0f, .beta = 0.0f};
    if (lt_matmul(act2, x2, w, opt, e, stream_of(stream), /*may_fail=*/true)) {
      ++fusion_counters().fwd_fused;
      return;
    }
  }
  ++fusion_counters().fwd_fallback;  // the unfused ops: GEMM with the bias epilogue, then gelu_fwd
  linear_fwd(pre_act, x, w, bias, stream);
  gelu_fwd(act, pre_act, stream);
}

void linear_dgelu_bwd(Tensor& dpre, Tensor* db_acc, const Tensor& dy, const Tensor& w, const Tensor& pre_act,
                      Stream stream) {
  // w [out, in] (the next linear's weight): dy [.., out] -> dpre [.., in]; pre_act [.., in]
  const LinearDims d = linear_dims("linear_dgelu_bwd", pre_act, w, dy, "dy", "pre_act");
  require_float("linear_dgelu_bwd", "dpre", dpre);
  require_same_shape("linear_dgelu_bwd", "dpre", dpre, "pre_act", pre_act);
  if (db_acc) {
    require_float("linear_dgelu_bwd", "db_acc", *db_acc, /*bf16_ok=*/false);
    require_numel("linear_dgelu_bwd", "db_acc", *db_acc, d.in, "in = w.size(1)");
  }
  cudaStream_t s = stream_of(stream);
  Tensor dy2 = dy.view({d.n, d.out});     // [n, out]
  Tensor dpre2 = dpre.view({d.n, d.in});  // [n, in] = dy @ w, times gelu'(pre_act)
  if (gelu_epilogue_eligible(dy, w, dpre, pre_act, d.in)) {
    if (db_acc) {  // DGELU_BGRAD: the bias grad (fp32) overwrites its vector, so a scratch then db_acc += it
      Tensor db = Tensor::empty({d.in}, DType::F32, Device::CUDA);  // [in]
      const Epilogue e{.kind = CUBLASLT_EPILOGUE_DGELU_BGRAD, .bias = db.raw(), .kbias = kF32, .aux = pre_act.raw()};
      if (lt_matmul(dpre2, dy2, w, GemmOptions{}, e, s, /*may_fail=*/true)) {
        launch_axpby_inplace(FOut{db_acc->raw(), kF32}, FIn{db.raw(), kF32}, 1.0f, 1.0f, d.in, s);
        ++fusion_counters().bwd_dgelu_bgrad;
        return;
      }
    }
    const Epilogue e{.kind = CUBLASLT_EPILOGUE_DGELU, .aux = pre_act.raw()};
    if (lt_matmul(dpre2, dy2, w, GemmOptions{}, e, s, /*may_fail=*/true)) {
      if (db_acc) column_sum_into(*db_acc, dpre2, s);
      ++fusion_counters().bwd_dgelu;
      return;
    }
  }
  ++fusion_counters().bwd_fallback;  // the unfused ops: dgrad GEMM, gelu_bwd in place, column sum
  lt_matmul(dpre2, dy2, w, GemmOptions{}, Epilogue{}, s);
  gelu_bwd(dpre2, dpre2, pre_act, stream);
  if (db_acc) column_sum_into(*db_acc, dpre2, s);
}

}  // namespace ops::cuda

ops::EpilogueFusionCounts ops::cuda_epilogue_fusion_counts() {
  const auto& c = ops::cuda::gemm_lt::fusion_counters();
  return {.fwd_fused = c.fwd_fused, .fwd_fallback = c.fwd_fallback, .bwd_dgelu_bgrad = c.bwd_dgelu_bgrad,
          .bwd_dgelu = c.bwd_dgelu, .bwd_fallback = c.bwd_fallback};
}
}  // namespace mcpp
