// cuBLASLt FP8 GEMMs with per-tensor or block scaling, their plan cache and autotuning (contract: fp8_gemm.h).
#include "mcpp/kernels/cuda/fp8_gemm.h"

#include <cublasLt.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "mcpp/kernels/cuda/gemm_lt.h"

namespace mcpp::ops::cuda::fp8_detail {
namespace {

struct Fp8Plan {
  bool ok = true;  // false: cuBLASLt has no algorithm for the key (cached; fp8_gemm refuses it by name)
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  std::vector<cublasLtMatmulAlgo_t> algos;  // the heuristic's candidates, its order (#0 = its pick)
  int tuned = -1;                           // the autotuned index; -1 = not tuned yet (runs #0)
};

// At most this many FP8 plans are timed in a process (a few ms and a device sync each); later ones run the
// heuristic's #0 — the shapes of a training run are fixed, so this bounds only odd callers with ever-new shapes.
constexpr int kMaxTunedFp8Plans = 256;

int32_t lt_scale_mode(Fp8Scaling s) {
  switch (s) {
    case Fp8Scaling::Vec128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case Fp8Scaling::Blk128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    case Fp8Scaling::Tensor: break;
  }
  return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

const char* scaling_name(Fp8Scaling s) {
  return s == Fp8Scaling::Tensor ? "per-tensor" : s == Fp8Scaling::Vec128 ? "1x128" : "128x128";
}

// The plan cache's key: the GEMM's key plus the operands' alignments (the heuristic's MIN_ALIGNMENT preferences).
struct PlanKey {
  Fp8GemmKey g;
  int al_a, al_b, al_d;
  auto tie() const {
    return std::tie(g.m, g.n, g.k, g.ta, g.tb, g.td, g.fast_accum, g.sa, g.sb, g.tbias, al_a, al_b, al_d);
  }
  bool operator<(const PlanKey& o) const { return tie() < o.tie(); }
};

// Builds (once per key) the descriptors and the heuristic's algorithm, with this call's scale pointers set: the
// heuristic picks kernels for the scaling the descriptor shows, a null pointer meaning none.
Fp8Plan& fp8_plan(const PlanKey& pk, const float* sa, const float* sb, const void* bias) {
  static std::mutex mu;
  static std::map<PlanKey, Fp8Plan> plans;  // lives for the process, like the GEMMs' plan cache
  const std::lock_guard<std::mutex> lock(mu);
  auto it = plans.find(pk);
  if (it != plans.end()) return it->second;
  const Fp8GemmKey& key = pk.g;
  Fp8Plan p;
  auto& st = gemm_lt::lt_state();
  MCPP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
  MCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
  MCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)));
  const int8_t fast = key.fast_accum ? 1 : 0;
  MCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
  if (key.sa != Fp8Scaling::Tensor || key.sb != Fp8Scaling::Tensor) {  // block scaling (the default: one float)
    const int32_t ma = lt_scale_mode(key.sa), mb = lt_scale_mode(key.sb);
    p.ok = cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof(ma)) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof(mb)) ==
               CUBLAS_STATUS_SUCCESS;
    if (!p.ok) return plans.emplace(pk, p).first->second;  // a cuBLASLt without these scale modes
  }
  MCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
  MCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
  if (key.tbias >= 0) {  // a cuBLASLt without FP8 bias epilogues: no plan (the caller adds the bias itself)
    const cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
    const auto bt = static_cast<cudaDataType_t>(key.tbias);
    p.ok = cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e)) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)) ==
               CUBLAS_STATUS_SUCCESS;
    if (!p.ok) return plans.emplace(pk, p).first->second;
  }
  MCPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.la, static_cast<cudaDataType_t>(key.ta), key.k, key.m, key.k));
  MCPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lb, static_cast<cudaDataType_t>(key.tb), key.k, key.n, key.k));
  MCPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.ld, static_cast<cudaDataType_t>(key.td), key.m, key.n, key.m));
  cublasLtMatmulPreference_t pref = nullptr;
  MCPP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = gemm_lt::kWorkspaceBytes;
  MCPP_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t al[4] = {static_cast<uint32_t>(pk.al_a), static_cast<uint32_t>(pk.al_b),
                          static_cast<uint32_t>(pk.al_d), static_cast<uint32_t>(pk.al_d)};
  const cublasLtMatmulPreferenceAttributes_t al_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i)
    MCPP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, al_attr[i], &al[i], sizeof(al[i])));
  cublasLtMatmulHeuristicResult_t res[gemm_lt::kMaxCandidates] = {};
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(st.handle, p.op, p.la, p.lb, p.ld, p.ld, pref,
                                                           gemm_lt::kMaxCandidates, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  for (int i = 0; hs == CUBLAS_STATUS_SUCCESS && i < found; ++i)
    if (res[i].state == CUBLAS_STATUS_SUCCESS) p.algos.push_back(res[i].algo);
  p.ok = !p.algos.empty();
  return plans.emplace(pk, p).first->second;
}

// Times the plan's candidates on this call's operands (D into a scratch, C = the caller's D only read when beta != 0)
// and returns the index to run (gemm_lt::fastest_candidate: another than #0 only when >= 3% faster); one record in
// gemm_tune_records. The descriptor's scale and bias pointers are this call's.
int tune(Fp8Plan& p, const Fp8GemmKey& key, const uint8_t* a, const uint8_t* b, float beta, void* d,
         cudaStream_t s) {
  auto& st = gemm_lt::lt_state();
  GemmTuneRecord rec;
  rec.gemm = fmt::format("fp8 m{} n{} k{} A{} B{} -> D{} beta{:g}{}{}", key.m, key.n, key.k, key.ta, key.tb, key.td,
                         beta, key.fast_accum ? " fast-accum" : "", key.tbias >= 0 ? " BIAS" : "");
  rec.m = key.m, rec.n = key.n, rec.k = key.k;
  for (const cublasLtMatmulAlgo_t& al : p.algos) rec.candidate_config.push_back(gemm_lt::algo_config(al));
  auto done = [&](int chosen, const char* note) {
    rec.chosen = chosen;
    rec.note = note;
    const std::lock_guard<std::mutex> lock(st.mu);
    st.records.push_back(rec);
    return chosen;
  };
  const size_t elt = key.td == CUDA_R_32F ? 4 : 2;
  gemm_lt::TuneScratch sc(static_cast<size_t>(key.m * key.n) * elt);
  if (!sc.mem) return done(0, "no device memory for the timing scratch");
  const void* c = beta != 0.0f ? d : sc.mem;
  const float alpha = 1.0f;
  auto run = [&](int i) {
    return cublasLtMatmul(st.handle, p.op, &alpha, a, p.la, b, p.lb, &beta, c, p.ld, sc.mem, p.ld, &p.algos[i],
                          st.workspace, gemm_lt::kWorkspaceBytes, s);
  };
  const int count = static_cast<int>(p.algos.size());
  std::vector<char> ok(count);
  for (int i = 0; i < count; ++i) ok[i] = run(i) == CUBLAS_STATUS_SUCCESS;  // warm-up; a refusal launches nothing
  if (!ok[0]) return done(0, "cuBLASLt refused candidate 0");
  rec.candidate_ms = gemm_lt::timed_medians(sc, ok, [&](int i) { MCPP_CUBLAS_CHECK(run(i)); }, s);
  return done(gemm_lt::fastest_candidate(rec.candidate_ms), "");
}

}  // namespace

bool try_fp8_gemm(void* d, const Fp8GemmKey& key, const uint8_t* a, const float* sa, const uint8_t* b,
                  const float* sb, float beta, cudaStream_t s, const void* bias) {
  using gemm_lt::alignment_of;
  MCPP_CHECK((key.tbias >= 0) == (bias != nullptr), "fp8 GEMM: a bias pointer needs the key's bias type and back");
  Fp8Plan& p = fp8_plan({key, alignment_of(a), alignment_of(b), alignment_of(d)}, sa, sb, bias);
  if (!p.ok) return false;
  auto& st = gemm_lt::lt_state();
  // The scale pointers are descriptor attributes: set per call (the descriptor is only used by this stream's host
  // thread, as the GEMMs' plans are).
  MCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
  MCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
  if (bias)
    MCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  int algo = 0;
  if (gemm_autotune()) {  // off: cuBLASLt's #0 (--deterministic-mode)
    static std::atomic<int> tuned_plans{0};  // plans timed so far in this process
    if (p.tuned < 0 && !cuda_detail::is_capturing(s) && tuned_plans < kMaxTunedFp8Plans) {
      p.tuned = tune(p, key, a, b, beta, d, s);
      ++tuned_plans;
    }
    algo = std::max(p.tuned, 0);
  }
  const float alpha = 1.0f;
  MCPP_CUBLAS_CHECK(cublasLtMatmul(st.handle, p.op, &alpha, a, p.la, b, p.lb, &beta, d, p.ld, d, p.ld, &p.algos[algo],
                                   st.workspace, gemm_lt::kWorkspaceBytes, s));
  return true;
}

void fp8_gemm(void* d, const Fp8GemmKey& key, const uint8_t* a, const float* sa, const uint8_t* b, const float* sb,
              float beta, cudaStream_t s, const void* bias) {
  MCPP_CHECK(try_fp8_gemm(d, key, a, sa, b, sb, beta, s, bias),
             "fp8 GEMM: cuBLASLt has no FP8 algorithm for m {} n {} k {} (A type {} {} scaled, B type {} {} scaled, D "
             "type {}): per-tensor scaling needs a Hopper (sm_90) or Ada GPU, block scaling a Hopper GPU and cuBLAS "
             "12.9+",
             key.m, key.n, key.k, key.ta, scaling_name(key.sa), key.tb, scaling_name(key.sb), key.td);
}

}  // namespace mcpp::ops::cuda::fp8_detail
