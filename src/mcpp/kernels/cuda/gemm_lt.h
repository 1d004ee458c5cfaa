// cuBLASLt internals of the CUDA GEMMs (gemm.cpp's linear ops), shared by three files, one concern each:
//   gemm_plan_cache.cpp  the plan cache: matmul descriptors, layouts and the heuristic's candidate algorithms per
//                        (shape, dtypes, transposes, epilogue, alignment), LRU-bounded, shape families; lt_matmul
//   gemm_tuner.cpp       the autotuner: times a plan's candidates on the call's operands (tune) and decides the
//                        bias-grad path (bias_grad_split); gemm_tune_records / reset_gemm_tuning; its timing
//                        helpers (TuneScratch, timed_medians, fastest_candidate) also tune the FP8 GEMMs (fp8_gemm.cpp)
//   gemm.cpp             the ops: gemm, linear_fwd / linear_bwd, linear_gelu_fwd / linear_dgelu_bwd
// gemm.cpp's header comment describes the behaviour (epilogues, fallbacks, tuning rules). Not part of the kernel
// interface (kernels/ops.h): only src/mcpp/kernels/cuda includes this.
#pragma once
#include <cublasLt.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "mcpp/kernels/cuda/cuda_check.h"
#include "mcpp/kernels/gemm_autotune.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cuda::gemm_lt {
using namespace cuda_detail;

constexpr size_t kWorkspaceBytes = 32u << 20;
constexpr int kMaxCandidates = 8;    // heuristic candidates per plan (asking for 32 returned <= 8 on the H200)
constexpr int kTimedRounds = 5;      // timed launches per candidate (median)
constexpr double kMinSpeedup = 1.03;  // a candidate replaces #0 only when #0's time / its time >= this
// Data-dependent shapes (MoE experts' row counts, --variable-seq-lengths): the first kMaxTunedPerFamily plans of a
// shape family are autotuned, later ones borrow the family's algorithm untimed (a tuning costs ~1-10 ms and a
// device sync, a heuristic query ~0.3-1 ms: at new shapes every step they would dominate the step); the cache
// keeps the kMaxPlans most recently used plans.
constexpr int64_t kMaxTunedPerFamily = 16;
constexpr size_t kMaxPlans = 4096;

cudaDataType_t cuda_type(Kind k);
int alignment_of(const void* p);  // the largest power of two <= 256 dividing p

// What one cuBLASLt call does after the product (all pointers device; null = unused).
//   BIAS, GELU_AUX_BIAS: bias = input vector [n] (our columns), dtype kbias.
//   DGELU_BGRAD:         bias = OUTPUT vector [n] = column sums of the result, dtype kbias (overwritten).
//   BGRADB:              bias = OUTPUT vector [m] = sums of our A (cuBLASLt's B) over k (overwritten).
//   GELU_AUX*:           aux = pre-activation OUTPUT [m, n] (ld n, the dtype of C);  DGELU*: aux = its input.
struct Epilogue {
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  Kind kbias = kF32;
  const void* aux = nullptr;
};

struct PlanKey {
  int ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  int ka, kc, kbias, epi;  // epi: the cublasLtEpilogue_t
  int al_a, al_b, al_c, al_bias, al_aux;
  auto tie() const {
    return std::tie(ta, tb, m, n, k, lda, ldb, ldc, ka, kc, kbias, epi, al_a, al_b, al_c, al_bias, al_aux);
  }
  bool operator<(const PlanKey& o) const { return tie() < o.tie(); }
};

struct Plan {
  bool ok = true;  // false: cuBLASLt has no algorithm for this fused epilogue (cached; callers fall back)
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  std::vector<cublasLtMatmulAlgo_t> algos;  // the heuristic's candidates, its order (#0 = its pick)
  int tuned = -1;                           // the autotuned index; -1 = not tuned yet
  double tuned_ms = NAN;                    // its measured time (NaN: not timed)
  int bias_split = -1;  // BGRADB wgrad plans: 1 = plain GEMM + column sum is faster, 0 = fused; -1 undecided
  // A member of a shape family past kMaxTunedPerFamily (rows / reduction length vary call to call: MoE experts'
  // token counts, variable sequence lengths): its one algorithm (borrowed or the heuristic's #0), never timed
  // (tuned = 0, fused bias grad).
  bool untuned = false;
  uint64_t last_use = 0;  // the LRU clock (kMaxPlans)
};

// The GEMMs that differ only in m, k and the pointers' alignment (the shapes data-dependent row counts give).
struct FamilyKey {
  int ta, tb;
  int64_t n;
  int ka, kc, kbias, epi;
  auto tie() const { return std::tie(ta, tb, n, ka, kc, kbias, epi); }
  bool operator<(const FamilyKey& o) const { return tie() < o.tie(); }
};

struct FusionCounters {
  std::atomic<int64_t> fwd_fused{0}, fwd_fallback{0}, bwd_dgelu_bgrad{0}, bwd_dgelu{0}, bwd_fallback{0};
};
FusionCounters& fusion_counters();

struct LtState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<PlanKey, Plan> plans;           // at most kMaxPlans, least recently used evicted
  std::map<uint64_t, PlanKey> lru;         // each plan's last use (Plan::last_use) -> its key, oldest first
  std::map<FamilyKey, int64_t> family_plans;  // plans created per family (ever)
  std::map<PlanKey, cublasLtMatmulAlgo_t> family_algo;  // per PlanKey with m = k = 0: the last heuristic #0
  uint64_t clock = 0;
  std::vector<GemmTuneRecord> records;  // one per tuning (gemm_tune_records)
  std::atomic<int> last_algo{-1};       // heuristic index of the last launch (last_gemm_algo_index)
  std::mutex mu;
};

// The process-wide cuBLASLt handle, workspace and plan cache (created on first use, never destroyed).
LtState& lt_state();

// What one cuBLASLt launch reads: our A and B, C (read when beta != 0), the scalars.
struct Operands {
  const void* a;
  const void* b;
  const void* c;
  float alpha, beta;
};

cublasStatus_t launch(LtState& st, const Plan& p, const cublasLtMatmulAlgo_t& algo, const Operands& x, void* d,
                      cudaStream_t s);

// The plan cache's key of C = op(A) op(B) with epilogue e (shapes checked by lt_matmul).
PlanKey plan_key(const Tensor& c, const Tensor& a, const Tensor& b, const GemmOptions& opt, const Epilogue& e);

// The cached plan of key, created on first use (st.mu held): the first kMaxTunedPerFamily plans of a family from
// the heuristic (and tuned at their first call), later ones with the family's last heuristic pick when cuBLASLt
// accepts it for the shape (else the heuristic), untimed.
Plan& plan_for(LtState& st, const PlanKey& key, const Epilogue& e, bool may_fail);

// C[m,n] = alpha op(A) op(B) + beta C, then the epilogue e. may_fail (fused epilogues only): returns false,
// having written nothing, when cuBLASLt cannot run this epilogue here; otherwise errors throw. Tunes the plan at
// its first call when autotuning is on (gemm_tuner.cpp).
bool lt_matmul(Tensor& c, const Tensor& a, const Tensor& b, const GemmOptions& opt, const Epilogue& e,
               cudaStream_t stream, bool may_fail = false);

// Times the plan's candidates on this call's operands (outputs into a scratch, C only read) and returns the index
// to use: the fastest when it beats #0 by kMinSpeedup, else 0; p.tuned_ms = its time. Appends a record unless
// record == false. (st.mu held.)
int tune(LtState& st, Plan& p, const PlanKey& key, const Epilogue& e, const Operands& x, cudaStream_t s,
         bool record = true);

// The tuners' shared parts (gemm_tuner.cpp; the FP8 GEMMs' tuner in fp8_gemm.cpp uses them too):
// cuBLASLt's configuration of one algorithm, short: "a<id> t<tile> s<stages> k<split-k> r<reduction> w<swizzle>
// c<cluster shape>" (the cublasLtMatmulTile_t / StagesId / ClusterShape enum values).
std::string algo_config(const cublasLtMatmulAlgo_t& algo);
// An epilogue's short name in tuning records ("plain", "BIAS", "GELU_AUX_BIAS", ...).
const char* epilogue_name(cublasLtEpilogue_t k);
// The timing scratch (outputs) and events of one tuning, outside the caching pool, released on every exit; cudaFree
// synchronizes the device, so no launch still writes the scratch when it is freed. mem null: no memory (not timed).
struct TuneScratch {
  void* mem = nullptr;
  std::vector<cudaEvent_t> events;
  explicit TuneScratch(size_t bytes);
  TuneScratch(const TuneScratch&) = delete;
  TuneScratch& operator=(const TuneScratch&) = delete;
  ~TuneScratch();
};
// The median over kTimedRounds cudaEvent-timed launches of each launcher i with ok[i] (NaN for the others); the
// rounds interleave the launchers, so clock drift hits all alike. The events live in sc. Synchronizes s.
std::vector<double> timed_medians(TuneScratch& sc, const std::vector<char>& ok,
                                  const std::function<void(int)>& launch_i, cudaStream_t s);
// The index to run: the fastest candidate when #0's time / its time >= kMinSpeedup, else 0.
int fastest_candidate(const std::vector<double>& ms);

// linear_bwd's bias grad next to the wgrad dw_acc += dy2^T x2 (set_bias_grad_path): true = the plain GEMM
// then the column sum, false = the BGRADB epilogue. Decided once per BGRADB plan (kept in the plan).
bool bias_grad_split(Tensor& dw_acc, const Tensor& dy2, const Tensor& x2, const GemmOptions& wgrad,
                     const Epilogue& fused, FIn dy, cudaStream_t s);

}  // namespace mcpp::ops::cuda::gemm_lt
