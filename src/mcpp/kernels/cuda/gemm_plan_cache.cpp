// The cuBLASLt plan cache (gemm_lt.h): descriptors, layouts and candidate algorithms per GEMM key, at most
// kMaxPlans (least recently used evicted), shape families past kMaxTunedPerFamily borrowing an algorithm untimed;
// lt_matmul runs one GEMM through it. One handle and one 32 MiB workspace per process.
#include <algorithm>

#include "mcpp/kernels/cuda/gemm_lt.h"

namespace mcpp::ops::cuda::gemm_lt {

cudaDataType_t cuda_type(Kind k) { return k == kBF16 ? CUDA_R_16BF : k == kF16 ? CUDA_R_16F : CUDA_R_32F; }

int alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && (a % static_cast<uintptr_t>(al)) != 0) al >>= 1;
  return al;
}

FusionCounters& fusion_counters() {
  static FusionCounters c;
  return c;
}

LtState& lt_state() {
  static LtState* st = [] {
    auto* s = new LtState();  // lives for the process: destroying handles at exit races the driver's teardown
    MCPP_CUBLAS_CHECK(cublasLtCreate(&s->handle));
    MCPP_CUDA_CHECK(cudaMalloc(&s->workspace, kWorkspaceBytes));
    return s;
  }();
  return *st;
}


namespace {

// Sets the epilogue attributes of a matmul descriptor; the first failing status, else success.
cublasStatus_t set_epilogue(cublasLtMatmulDesc_t op, const PlanKey& key, const Epilogue& e) {
  if (e.kind == CUBLASLT_EPILOGUE_DEFAULT) return CUBLAS_STATUS_SUCCESS;
  cublasStatus_t st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e.kind, sizeof(e.kind));
  if (st == CUBLAS_STATUS_SUCCESS && e.bias) {
    const cudaDataType_t bt = cuda_type(e.kbias);
    st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e.bias, sizeof(e.bias));
  }
  if (st == CUBLAS_STATUS_SUCCESS && e.aux) {
    const int64_t ld = key.ldc;  // aux [m, n] row-major = column-major n rows, like C
    st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e.aux, sizeof(e.aux));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld));
  }
  return st;
}

// Column-major operands of the cuBLASLt call: "A" is our B, "B" is our A (see the header comment).
// may_fail: a fused epilogue cuBLASLt cannot run gives a plan with ok = false instead of an error.
// borrow (non-null): an algorithm of the same GEMM at another m / k (kMaxTunedPerFamily); used without the
// heuristic's query (~0.3-1 ms a shape) when cublasLtMatmulAlgoCheck accepts it for this shape.
Plan make_plan(LtState& st, const PlanKey& key, const Epilogue& e, bool may_fail,
               const cublasLtMatmulAlgo_t* borrow = nullptr) {
  Plan p;
  MCPP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // on our B
  const cublasOperation_t opb = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N;  // on our A
  MCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  MCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  const cublasStatus_t epi_status = set_epilogue(p.op, key, e);
  if (epi_status != CUBLAS_STATUS_SUCCESS && may_fail) {
    p.ok = false;
    return p;
  }
  MCPP_CUBLAS_CHECK(epi_status);
  const cudaDataType_t tin = cuda_type(static_cast<Kind>(key.ka)), tc = cuda_type(static_cast<Kind>(key.kc));
  // our B as stored, column-major: rows = its row length (ldb), cols = its row count
  const int64_t b_rows = key.ldb, b_cols = key.tb ? key.n : key.k;
  const int64_t a_rows = key.lda, a_cols = key.ta ? key.k : key.m;
  MCPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.la, tin, b_rows, b_cols, key.ldb));
  MCPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lb, tin, a_rows, a_cols, key.lda));
  MCPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lc, tc, key.n, key.m, key.ldc));
  if (borrow) {
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoCheck(st.handle, p.op, p.la, p.lb, p.lc, p.lc, borrow, &check) == CUBLAS_STATUS_SUCCESS &&
        check.state == CUBLAS_STATUS_SUCCESS && check.workspaceSize <= kWorkspaceBytes) {
      p.algos.push_back(*borrow);
      return p;
    }
  }

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
  cublasLtMatmulHeuristicResult_t results[kMaxCandidates] = {};
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(st.handle, p.op, p.la, p.lb, p.lc, p.lc, pref,
                                                           kMaxCandidates, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  for (int i = 0; hs == CUBLAS_STATUS_SUCCESS && i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) p.algos.push_back(results[i].algo);
  if (may_fail && (hs != CUBLAS_STATUS_SUCCESS || p.algos.empty())) {
    p.ok = false;
    return p;
  }
  MCPP_CUBLAS_CHECK(hs);
  MCPP_CHECK(!p.algos.empty(), "gemm: cuBLASLt found no algorithm for m={} n={} k={} (trans_a={}, trans_b={})", key.m,
             key.n, key.k, key.ta, key.tb);
  return p;
}


}  // namespace

cublasStatus_t launch(LtState& st, const Plan& p, const cublasLtMatmulAlgo_t& algo, const Operands& x, void* d,
                      cudaStream_t s) {
  return cublasLtMatmul(st.handle, p.op, &x.alpha, x.b, p.la, x.a, p.lb, &x.beta, x.c, p.lc, d, p.lc, &algo,
                        st.workspace, kWorkspaceBytes, s);
}


// The plan cache's key of C = op(A) op(B) with epilogue e (shapes checked by lt_matmul).
PlanKey plan_key(const Tensor& c, const Tensor& a, const Tensor& b, const GemmOptions& opt, const Epilogue& e) {
  const int64_t m = opt.trans_a ? a.size(1) : a.size(0), k = opt.trans_a ? a.size(0) : a.size(1);
  const int64_t n = opt.trans_b ? b.size(0) : b.size(1);
  return PlanKey{opt.trans_a, opt.trans_b, m, n, k, a.size(1), b.size(1), n, require_float("gemm", "a", a),
                 require_float("gemm", "c", c),
                 e.bias ? e.kbias : kF32, static_cast<int>(e.kind), alignment_of(a.raw()), alignment_of(b.raw()),
                 alignment_of(c.raw()), e.bias ? alignment_of(e.bias) : 0, e.aux ? alignment_of(e.aux) : 0};
}

namespace {
void destroy_plan(Plan& p) {
  if (p.la) cublasLtMatrixLayoutDestroy(p.la);
  if (p.lb) cublasLtMatrixLayoutDestroy(p.lb);
  if (p.lc) cublasLtMatrixLayoutDestroy(p.lc);
  if (p.op) cublasLtMatmulDescDestroy(p.op);
  p = Plan{};
}
}  // namespace

// The cached plan of key, created on first use (st.mu held): the first kMaxTunedPerFamily plans of a family from
// the heuristic (and tuned at their first call), later ones with the family's last heuristic pick when cuBLASLt
// accepts it for the shape (else the heuristic), untimed.
Plan& plan_for(LtState& st, const PlanKey& key, const Epilogue& e, bool may_fail) {
  auto it = st.plans.find(key);
  if (it == st.plans.end()) {
    if (st.plans.size() >= kMaxPlans) {  // evict the least recently used (host descriptors only: launches done)
      const auto oldest = st.lru.begin();
      const auto victim = st.plans.find(oldest->second);
      destroy_plan(victim->second);
      st.plans.erase(victim);
      st.lru.erase(oldest);
    }
    const FamilyKey fam{key.ta, key.tb, key.n, key.ka, key.kc, key.kbias, key.epi};
    const bool untuned = ++st.family_plans[fam] > kMaxTunedPerFamily;
    PlanKey shape_free = key;
    shape_free.m = shape_free.k = 0;
    const auto fa = st.family_algo.find(shape_free);
    Plan p = make_plan(st, key, e, may_fail, untuned && fa != st.family_algo.end() ? &fa->second : nullptr);
    if (p.ok && !p.algos.empty()) st.family_algo[shape_free] = p.algos[0];
    if (untuned) {
      p.untuned = true;
      p.tuned = 0;
      p.bias_split = 0;
    }
    it = st.plans.emplace(key, std::move(p)).first;
  } else {
    st.lru.erase(it->second.last_use);
  }
  it->second.last_use = ++st.clock;
  st.lru.emplace(it->second.last_use, key);
  return it->second;
}

// C[m,n] = alpha op(A) op(B) + beta C, then the epilogue e. may_fail (fused epilogues only): returns false,
// having written nothing, when cuBLASLt cannot run this epilogue here; otherwise errors throw.
bool lt_matmul(Tensor& c, const Tensor& a, const Tensor& b, const GemmOptions& opt, const Epilogue& e,
               cudaStream_t stream, bool may_fail) {
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
  if (may_fail && (m == 0 || n == 0 || k == 0)) return false;  // the unfused path handles empty shapes
  if (m == 0 || n == 0) return true;
  if (k == 0) {  // no product: C = beta C (+ bias handled by the caller never reaching here with k == 0)
    if (opt.beta == 0.0f) MCPP_CUDA_CHECK(cudaMemsetAsync(c.raw(), 0, c.nbytes(), stream));
    else scale_inplace(c, opt.beta, Stream{stream});
    return true;
  }
  const PlanKey key = plan_key(c, a, b, opt, e);
  LtState& st = lt_state();
  std::lock_guard<std::mutex> lock(st.mu);
  Plan& p = plan_for(st, key, e, may_fail);
  if (!p.ok) return false;
  const Operands x{.a = a.raw(), .b = b.raw(), .c = c.raw(), .alpha = opt.alpha, .beta = opt.beta};
  int idx = 0;
  if (gemm_autotune()) {
    if (p.tuned < 0 && !is_capturing(stream)) p.tuned = tune(st, p, key, e, x, stream);
    idx = std::max(p.tuned, 0);
  }
  if (e.bias)  // the caller's pointers (tuning pointed the outputs at its scratch)
    MCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e.bias, sizeof(e.bias)));
  if (e.aux)
    MCPP_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e.aux, sizeof(e.aux)));
  const cublasStatus_t ms = launch(st, p, p.algos[idx], x, c.raw(), stream);
  if (ms == CUBLAS_STATUS_SUCCESS) st.last_algo = idx;
  if (may_fail && (ms == CUBLAS_STATUS_NOT_SUPPORTED || ms == CUBLAS_STATUS_INVALID_VALUE)) {
    p.ok = false;  // rejected before launching: nothing written; later calls go straight to the fallback
    return false;
  }
  MCPP_CUBLAS_CHECK(ms);
  return true;
}

}  // namespace mcpp::ops::cuda::gemm_lt
