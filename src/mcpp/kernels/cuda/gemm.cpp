// CUDA GEMM and Linear (Megatron weight layout W[out, in]) through cuBLASLt.
//
//   gemm:       C[m,n] = alpha * op(A) @ op(B) + beta * C; A/B 2-D float32 or bfloat16 (the same dtype),
//               C float32 or bfloat16 (bf16 C needs bf16 A/B). fp32 accumulate (CUBLAS_COMPUTE_32F: fp32
//               inputs use full fp32 FMA, not TF32, so results track the CPU reference to ~1e-6).
//   linear_fwd: y[n,out] = x[n,in] @ W[out,in]^T (+ bias[out]) — the bias is a cuBLASLt epilogue
//               (CUBLASLT_EPILOGUE_BIAS), no extra pass. x may be [.., in].
//   linear_bwd: dx[n,in] = dy @ W (overwritten; skipped when dx == nullptr);
//               dw_acc[out,in] += dy^T @ x  (ACCUMULATES: beta = 1 into the fp32 main grad);
//               db_acc[out] += sum_n dy     (ACCUMULATES; column-sum kernel in bias_grad.cu).
// Row-major C = op(A) op(B) is computed as the column-major product C^T = op(B)^T op(A)^T, so no copies.
// Matmul descriptors, layouts and the heuristic's algorithm are cached per (shape, dtypes, transposes,
// epilogue, pointer alignment); one 32 MiB workspace per process. Runs on stream_of(stream).
#include <cublasLt.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "mcpp/kernels/cuda/cuda_check.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace ops::cuda {
using namespace cuda_detail;

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;

cudaDataType_t cuda_type(Kind k) { return k == kBF16 ? CUDA_R_16BF : k == kF16 ? CUDA_R_16F : CUDA_R_32F; }

int alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && (a % static_cast<uintptr_t>(al)) != 0) al >>= 1;
  return al;
}

struct PlanKey {
  int ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  int ka, kc, kbias, epi;
  int al_a, al_b, al_c, al_bias;
  auto tie() const { return std::tie(ta, tb, m, n, k, lda, ldb, ldc, ka, kc, kbias, epi, al_a, al_b, al_c, al_bias); }
  bool operator<(const PlanKey& o) const { return tie() < o.tie(); }
};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

struct LtState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<PlanKey, Plan> plans;
  std::mutex mu;
};

LtState& lt_state() {
  static LtState* st = [] {
    auto* s = new LtState();  // lives for the process: destroying handles at exit races the driver's teardown
    MCPP_CUBLAS_CHECK(cublasLtCreate(&s->handle));
    MCPP_CUDA_CHECK(cudaMalloc(&s->workspace, kWorkspaceBytes));
    return s;
  }();
  return *st;
}

// Column-major operands of the cuBLASLt call: "A" is our B, "B" is our A (see the header comment).
Plan make_plan(LtState& st, const PlanKey& key, const void* bias) {
  Plan p;
  MCPP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // on our B
  const cublasOperation_t opb = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N;  // on our A
  MCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  MCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  if (key.epi) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bt = cuda_type(static_cast<Kind>(key.kbias));
    MCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    MCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
    MCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  const cudaDataType_t tin = cuda_type(static_cast<Kind>(key.ka)), tc = cuda_type(static_cast<Kind>(key.kc));
  // our B as stored, column-major: rows = its row length (ldb), cols = its row count
  const int64_t b_rows = key.ldb, b_cols = key.tb ? key.n : key.k;
  const int64_t a_rows = key.lda, a_cols = key.ta ? key.k : key.m;
  MCPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.la, tin, b_rows, b_cols, key.ldb));
  MCPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lb, tin, a_rows, a_cols, key.lda));
  MCPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lc, tc, key.n, key.m, key.ldc));

  cublasLtMatmulPreference_t pref = nullptr;
  MCPP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = kWorkspaceBytes;
  MCPP_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t al_a = key.al_b, al_b = key.al_a, al_c = key.al_c;  // swapped with the operands
  MCPP_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  MCPP_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  MCPP_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
  MCPP_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  MCPP_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(st.handle, p.op, p.la, p.lb, p.lc, p.lc, pref, 1, &result, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  MCPP_CHECK(found > 0, "gemm: cuBLASLt found no algorithm for m={} n={} k={} (trans_a={}, trans_b={})", key.m, key.n,
             key.k, key.ta, key.tb);
  p.algo = result.algo;
  return p;
}

// C[m,n] = alpha op(A) op(B) + beta C (+ bias[n] broadcast over rows when bias != nullptr).
void lt_matmul(Tensor& c, const Tensor& a, const Tensor& b, const GemmOptions& opt, const Tensor* bias,
               cudaStream_t stream) {
  const Kind ka = require_float("gemm", "a", a), kb = require_float("gemm", "b", b);
  const Kind kc = require_float("gemm", "c", c);
  MCPP_CHECK(ka == kb && ka != kF16, "gemm: a and b must both be float32 or both bfloat16; got a {}, b {}", a.str(),
             b.str());
  MCPP_CHECK(kc == kF32 || kc == ka, "gemm: c must be float32 or the dtype of a/b; got c {}, a {}", c.str(), a.str());
  MCPP_CHECK(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2, "gemm: a, b, c must be 2-D; got a {}, b {}, c {}",
             a.str(), b.str(), c.str());
  const int64_t m = opt.trans_a ? a.size(1) : a.size(0), k = opt.trans_a ? a.size(0) : a.size(1);
  const int64_t kb2 = opt.trans_b ? b.size(1) : b.size(0), n = opt.trans_b ? b.size(0) : b.size(1);
  MCPP_CHECK(k == kb2, "gemm: inner dims differ: op(a) {}x{} (trans_a={}), op(b) {}x{} (trans_b={})", m, k,
             opt.trans_a, kb2, n, opt.trans_b);
  MCPP_CHECK(c.size(0) == m && c.size(1) == n, "gemm: c must be ({}, {}) for op(a) {}x{} @ op(b) {}x{}; got {}", m, n,
             m, k, kb2, n, c.str());
  if (m == 0 || n == 0) return;
  if (k == 0) {  // no product: C = beta C (+ bias handled by the caller never reaching here with k == 0)
    if (opt.beta == 0.0f) MCPP_CUDA_CHECK(cudaMemsetAsync(c.raw(), 0, c.nbytes(), stream));
    else scale_inplace(c, opt.beta, Stream{stream});
    return;
  }
  Kind kbias = kF32;
  if (bias) kbias = require_float("linear_fwd", "bias", *bias);
  PlanKey key{opt.trans_a, opt.trans_b, m, n, k, a.size(1), b.size(1), n, ka, kc, kbias, bias != nullptr,
              alignment_of(a.raw()), alignment_of(b.raw()), alignment_of(c.raw()),
              bias ? alignment_of(bias->raw()) : 0};
  LtState& st = lt_state();
  std::lock_guard<std::mutex> lock(st.mu);
  auto it = st.plans.find(key);
  if (it == st.plans.end()) it = st.plans.emplace(key, make_plan(st, key, bias ? bias->raw() : nullptr)).first;
  Plan& p = it->second;
  if (bias) {
    const void* bp = bias->raw();
    MCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)));
  }
  const float alpha = opt.alpha, beta = opt.beta;
  MCPP_CUBLAS_CHECK(cublasLtMatmul(st.handle, p.op, &alpha, b.raw(), p.la, a.raw(), p.lb, &beta, c.raw(), p.lc, c.raw(),
                                   p.lc, &p.algo, st.workspace, kWorkspaceBytes, stream));
}

struct LinearDims {
  int64_t n, in, out;
};
LinearDims linear_dims(const char* op, const Tensor& x, const Tensor& w, const Tensor& y, const char* y_name) {
  require_float(op, "x", x);
  require_float(op, "w", w);
  require_float(op, y_name, y);
  MCPP_CHECK(w.ndim() == 2, "{}: w must be 2-D [out, in]; got {}", op, w.str());
  const int64_t out = w.size(0), in = w.size(1);
  MCPP_CHECK(x.ndim() >= 1 && x.size(-1) == in, "{}: x must be [.., in={}] for w {}; got {}", op, in, w.str(), x.str());
  Shape want = x.shape();
  want.back() = out;
  MCPP_CHECK(y.shape() == want, "{}: {} must be {} for x {} and w {}; got {}", op, y_name, shape_str(want), x.str(),
             w.str(), y.str());
  return {in ? x.numel() / in : 0, in, out};
}

}  // namespace

void gemm(Tensor& c, const Tensor& a, const Tensor& b, const GemmOptions& opt, Stream stream) {
  lt_matmul(c, a, b, opt, nullptr, stream_of(stream));
}

void linear_fwd(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias, Stream stream) {
  const LinearDims d = linear_dims("linear_fwd", x, w, y, "y");
  if (bias) require_numel("linear_fwd", "bias", *bias, d.out, "out = w.size(0)");
  Tensor x2 = x.view({d.n, d.in});   // [n, in]
  Tensor y2 = y.view({d.n, d.out});  // [n, out]
  const GemmOptions opt{.trans_a = false, .trans_b = true, .alpha = 1.0f, .beta = 0.0f};
  if (d.in == 0 && bias) fail("linear_fwd: in = 0 with a bias is not supported on CUDA (x {})", x.str());
  lt_matmul(y2, x2, w, opt, bias, stream_of(stream));
}

void linear_bwd(Tensor* dx, Tensor& dw_acc, Tensor* db_acc, const Tensor& dy, const Tensor& x, const Tensor& w,
                Stream stream) {
  const LinearDims d = linear_dims("linear_bwd", x, w, dy, "dy");
  require_float("linear_bwd", "dw_acc", dw_acc);
  require_same_shape("linear_bwd", "dw_acc", dw_acc, "w", w);
  cudaStream_t s = stream_of(stream);
  Tensor x2 = x.view({d.n, d.in});     // [n, in]
  Tensor dy2 = dy.view({d.n, d.out});  // [n, out]
  if (dx) {
    require_same_shape("linear_bwd", "dx", *dx, "x", x);
    Tensor dx2 = dx->view({d.n, d.in});  // [n, in] = dy[n, out] @ w[out, in]
    lt_matmul(dx2, dy2, w, GemmOptions{}, nullptr, s);
  }
  // dw[out, in] += dy[n, out]^T @ x[n, in]
  lt_matmul(dw_acc, dy2, x2, GemmOptions{.trans_a = true, .trans_b = false, .alpha = 1.0f, .beta = 1.0f}, nullptr, s);
  if (db_acc) {
    require_float("linear_bwd", "db_acc", *db_acc, /*bf16_ok=*/false);
    require_numel("linear_bwd", "db_acc", *db_acc, d.out, "out = w.size(0)");
    const Kind kdy = require_float("linear_bwd", "dy", dy);
    launch_column_sum_acc(db_acc->data<float>(), fin(dy, kdy), d.n, d.out, s);
  }
}

}  // namespace ops::cuda
}  // namespace mcpp
