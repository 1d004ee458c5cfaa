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
#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "mcpp/kernels/cuda/cuda_check.h"
#include "mcpp/kernels/gemm_autotune.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace ops::cuda {
using namespace cuda_detail;

namespace {

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

cudaDataType_t cuda_type(Kind k) { return k == kBF16 ? CUDA_R_16BF : k == kF16 ? CUDA_R_16F : CUDA_R_32F; }

int alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && (a % static_cast<uintptr_t>(al)) != 0) al >>= 1;
  return al;
}

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
FusionCounters& fusion_counters() {
  static FusionCounters c;
  return c;
}

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

LtState& lt_state() {
  static LtState* st = [] {
    auto* s = new LtState();  // lives for the process: destroying handles at exit races the driver's teardown
    MCPP_CUBLAS_CHECK(cublasLtCreate(&s->handle));
    MCPP_CUDA_CHECK(cudaMalloc(&s->workspace, kWorkspaceBytes));
    return s;
  }();
  return *st;
}

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

// What one cuBLASLt launch reads: our A and B, C (read when beta != 0), the scalars.
struct Operands {
  const void* a;
  const void* b;
  const void* c;
  float alpha, beta;
};

cublasStatus_t launch(LtState& st, const Plan& p, const cublasLtMatmulAlgo_t& algo, const Operands& x, void* d,
                      cudaStream_t s) {
  return cublasLtMatmul(st.handle, p.op, &x.alpha, x.b, p.la, x.a, p.lb, &x.beta, x.c, p.lc, d, p.lc, &algo,
                        st.workspace, kWorkspaceBytes, s);
}

const char* epilogue_name(cublasLtEpilogue_t k) {
  switch (k) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "plain";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: return "DGELU_BGRAD";
    case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
    default: return "other";
  }
}
// cuBLASLt's configuration of one algorithm, short: "a<id> t<tile> s<stages> k<split-k> r<reduction>
// w<swizzle> c<cluster shape>" (the cublasLtMatmulTile_t / StagesId / ClusterShape enum values).
std::string algo_config(const cublasLtMatmulAlgo_t& algo) {
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr) -> int64_t {
    uint32_t v = 0;  // every attribute read here is 32-bit (int32 / uint32)
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS)
      return -1;
    return v;
  };
  return fmt::format("a{} t{} s{} k{} r{} w{} c{}", get(CUBLASLT_ALGO_CONFIG_ID), get(CUBLASLT_ALGO_CONFIG_TILE_ID),
                     get(CUBLASLT_ALGO_CONFIG_STAGES_ID), get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                     get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                     get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
}

const char* kind_name(int k) { return k == kBF16 ? "bf16" : k == kF16 ? "f16" : "f32"; }
size_t elt_bytes(int k) { return k == kF32 ? 4 : 2; }
size_t round256(size_t b) { return (b + 255) / 256 * 256; }

// The timing scratch (D, aux / bias-grad outputs) and events of one tuning, released on every exit;
// cudaFree synchronizes the device, so no launch still writes the scratch when it is freed.
struct TuneScratch {
  void* mem = nullptr;
  std::vector<cudaEvent_t> events;
  TuneScratch() = default;
  TuneScratch(const TuneScratch&) = delete;
  TuneScratch& operator=(const TuneScratch&) = delete;
  ~TuneScratch() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    if (mem) cudaFree(mem);
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median over kTimedRounds cudaEvent-timed launches of each launcher i with ok[i] (NaN for the others);
// the rounds interleave the launchers, so clock drift hits all alike. The events live in sc.
std::vector<double> timed_medians(TuneScratch& sc, const std::vector<char>& ok,
                                  const std::function<void(int)>& launch_i, cudaStream_t s) {
  const int count = static_cast<int>(ok.size());
  sc.events.resize(static_cast<size_t>(2 * kTimedRounds * count));
  for (cudaEvent_t& ev : sc.events) MCPP_CUDA_CHECK(cudaEventCreate(&ev));
  for (int r = 0; r < kTimedRounds; ++r)
    for (int i = 0; i < count; ++i) {
      if (!ok[i]) continue;
      cudaEvent_t* ev = &sc.events[static_cast<size_t>(2 * (r * count + i))];
      MCPP_CUDA_CHECK(cudaEventRecord(ev[0], s));
      launch_i(i);
      MCPP_CUDA_CHECK(cudaEventRecord(ev[1], s));
    }
  MCPP_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> out(static_cast<size_t>(count), NAN);
  for (int i = 0; i < count; ++i) {
    if (!ok[i]) continue;
    std::vector<double> ms(kTimedRounds);
    for (int r = 0; r < kTimedRounds; ++r) {
      float t = 0.0f;
      const cudaEvent_t* ev = &sc.events[static_cast<size_t>(2 * (r * count + i))];
      MCPP_CUDA_CHECK(cudaEventElapsedTime(&t, ev[0], ev[1]));
      ms[static_cast<size_t>(r)] = t;
    }
    out[static_cast<size_t>(i)] = median(ms);
  }
  return out;
}

// Times the plan's candidates on this call's operands (see the header: outputs into scratch, C only read)
// and returns the index to use: the fastest when it beats #0 by kMinSpeedup, else 0; p.tuned_ms = its
// time. Appends a record unless record == false.
int tune(LtState& st, Plan& p, const PlanKey& key, const Epilogue& e, const Operands& x, cudaStream_t s,
         bool record = true) {
  GemmTuneRecord rec;
  rec.gemm = fmt::format("m{} n{} k{} {} {} {}->{} beta{:g} {}", key.m, key.n, key.k, key.ta ? "a^T" : "a",
                         key.tb ? "b^T" : "b", kind_name(key.ka), kind_name(key.kc), x.beta, epilogue_name(e.kind));
  rec.m = key.m, rec.n = key.n, rec.k = key.k;
  for (const cublasLtMatmulAlgo_t& a : p.algos) rec.candidate_config.push_back(algo_config(a));
  auto done = [&](int chosen, const char* note) {
    rec.chosen = chosen;
    rec.note = note;
    if (!rec.candidate_ms.empty()) p.tuned_ms = rec.candidate_ms[chosen];
    if (record) st.records.push_back(rec);
    return chosen;
  };
  const int count = static_cast<int>(p.algos.size());  // one candidate is timed too (bias_grad_split)
  const bool aux_out = e.aux && (e.kind == CUBLASLT_EPILOGUE_GELU_AUX || e.kind == CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
  const bool bias_out = e.bias && (e.kind == CUBLASLT_EPILOGUE_BGRADB || e.kind == CUBLASLT_EPILOGUE_DGELU_BGRAD);
  const size_t d_bytes = round256(static_cast<size_t>(key.m * key.ldc) * elt_bytes(key.kc));
  const size_t bias_bytes = round256(static_cast<size_t>(std::max(key.m, key.n)) * elt_bytes(key.kbias));
  TuneScratch sc;
  if (cudaMalloc(&sc.mem, d_bytes * (aux_out ? 2 : 1) + (bias_out ? bias_bytes : 0)) != cudaSuccess) {
    cudaGetLastError();  // clear the (non-sticky) allocation error
    sc.mem = nullptr;
    return done(0, "no device memory for the timing scratch");
  }
  char* d = static_cast<char*>(sc.mem);
  if (aux_out) {  // lt_matmul sets the caller's pointers back before the real launch
    const void* aux = d + d_bytes;
    MCPP_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  }
  if (bias_out) {
    const void* bias = d + d_bytes * (aux_out ? 2 : 1);
    MCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  Operands xs = x;
  if (x.beta == 0.0f) xs.c = d;  // not read; beta != 0 reads the caller's C and writes only the scratch D
  std::vector<char> ok(count);
  for (int i = 0; i < count; ++i)  // warm-up; a refused candidate launches nothing
    ok[i] = launch(st, p, p.algos[i], xs, d, s) == CUBLAS_STATUS_SUCCESS;
  if (!ok[0]) return done(0, "cuBLASLt refused candidate 0");
  rec.candidate_ms = timed_medians(sc, ok, [&](int i) { MCPP_CUBLAS_CHECK(launch(st, p, p.algos[i], xs, d, s)); }, s);
  int best = 0;
  for (int i = 0; i < count; ++i)
    if (ok[i] && rec.candidate_ms[i] < rec.candidate_ms[best]) best = i;
  return done(rec.candidate_ms[0] >= kMinSpeedup * rec.candidate_ms[best] ? best : 0, "");
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

void destroy_plan(Plan& p) {
  if (p.la) cublasLtMatrixLayoutDestroy(p.la);
  if (p.lb) cublasLtMatrixLayoutDestroy(p.lb);
  if (p.lc) cublasLtMatrixLayoutDestroy(p.lc);
  if (p.op) cublasLtMatmulDescDestroy(p.op);
  p = Plan{};
}

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
               cudaStream_t stream, bool may_fail = false) {
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

// Times launch_column_sum_acc over dy [n, out] (db and the partials in a scratch outside the pool; db's
// contents do not matter): the median of kTimedRounds launches after one warm-up; NaN without memory.
double time_column_sum(FIn dy, int64_t n, int64_t out, cudaStream_t s) {
  TuneScratch sc;
  const size_t db_bytes = round256(static_cast<size_t>(out) * 4);
  if (cudaMalloc(&sc.mem, db_bytes + static_cast<size_t>(column_sum_parts(n) * out) * 4) != cudaSuccess) {
    cudaGetLastError();
    sc.mem = nullptr;
    return NAN;
  }
  float* db = static_cast<float*>(sc.mem);
  float* partial = reinterpret_cast<float*>(static_cast<char*>(sc.mem) + db_bytes);
  launch_column_sum_acc(db, dy, n, out, partial, s);
  return timed_medians(sc, {1}, [&](int) { launch_column_sum_acc(db, dy, n, out, partial, s); }, s)[0];
}

// linear_bwd's bias grad next to the wgrad dw_acc += dy2^T x2 (set_bias_grad_path): true = the plain GEMM
// then the column sum, false = the BGRADB epilogue. Decided once per BGRADB plan (kept in the plan).
bool bias_grad_split(Tensor& dw_acc, const Tensor& dy2, const Tensor& x2, const GemmOptions& wgrad,
                     const Epilogue& fused, FIn dy, cudaStream_t s) {
  const BiasGradPath forced = bias_grad_path();
  if (forced != BiasGradPath::kAuto) return forced == BiasGradPath::kSplit;
  LtState& st = lt_state();
  std::lock_guard<std::mutex> lock(st.mu);
  const PlanKey kf = plan_key(dw_acc, dy2, x2, wgrad, fused);
  Plan& pf = plan_for(st, kf, fused, /*may_fail=*/true);
  if (!pf.ok) return true;  // cuBLASLt has no BGRADB here
  if (pf.bias_split >= 0) return pf.bias_split == 1;
  if (!gemm_autotune() || is_capturing(s)) return false;  // undecided: the fused default, decided later
  const Operands x{.a = dy2.raw(), .b = x2.raw(), .c = dw_acc.raw(), .alpha = wgrad.alpha, .beta = wgrad.beta};
  if (pf.tuned < 0) pf.tuned = tune(st, pf, kf, fused, x, s, /*record=*/false);
  const PlanKey kp = plan_key(dw_acc, dy2, x2, wgrad, Epilogue{});
  Plan& pp = plan_for(st, kp, Epilogue{}, /*may_fail=*/false);
  if (pp.tuned < 0) pp.tuned = tune(st, pp, kp, Epilogue{}, x, s, /*record=*/false);
  const double tc = time_column_sum(dy, kf.k, kf.m, s);
  const double tf = pf.tuned_ms, ts = pp.tuned_ms + tc;
  pf.bias_split = tf >= kMinSpeedup * ts ? 1 : 0;  // any NaN (not timed): fused
  GemmTuneRecord rec;
  rec.gemm = fmt::format("bias grad beside m{} n{} k{} a^T b {}->f32 beta{:g}: BGRADB vs plain + column sum", kf.m,
                         kf.n, kf.k, kind_name(kf.ka), wgrad.beta);
  rec.m = kf.m, rec.n = kf.n, rec.k = kf.k;
  rec.candidate_ms = {tf, ts};
  rec.candidate_config = {fmt::format("BGRADB {}", algo_config(pf.algos[std::max(pf.tuned, 0)])),
                          fmt::format("plain {:.3f} ms {} + column sum {:.3f} ms", pp.tuned_ms,
                                      algo_config(pp.algos[std::max(pp.tuned, 0)]), tc)};
  rec.chosen = pf.bias_split;
  st.records.push_back(rec);
  return pf.bias_split == 1;
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

std::vector<GemmTuneRecord> gemm_tune_records() {
  LtState& st = lt_state();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.records;
}

void reset_gemm_tuning() {
  LtState& st = lt_state();
  std::lock_guard<std::mutex> lock(st.mu);
  for (auto& [key, plan] : st.plans) {
    if (plan.untuned) continue;
    plan.tuned = -1;
    plan.tuned_ms = NAN;
    plan.bias_split = -1;
  }
  st.records.clear();
}

int last_gemm_algo_index() { return lt_state().last_algo.load(); }

}  // namespace ops::cuda

ops::EpilogueFusionCounts ops::cuda_epilogue_fusion_counts() {
  const auto& c = ops::cuda::fusion_counters();
  return {.fwd_fused = c.fwd_fused, .fwd_fallback = c.fwd_fallback, .bwd_dgelu_bgrad = c.bwd_dgelu_bgrad,
          .bwd_dgelu = c.bwd_dgelu, .bwd_fallback = c.bwd_fallback};
}
}  // namespace mcpp
