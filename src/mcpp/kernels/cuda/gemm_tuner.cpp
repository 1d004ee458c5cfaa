// The GEMM autotuner (gemm_lt.h; the rules in gemm.cpp's header): times a plan's candidate algorithms on the
// call's own operands (outputs into a scratch outside the caching pool) and keeps cuBLASLt's #0 unless another is
// >= 3% faster; decides linear_bwd's bias-grad path (BGRADB epilogue vs plain GEMM + column sum) by timing both;
// keeps one GemmTuneRecord per decision (gemm_tune_records, `mcpp gemm-tune`).
#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "mcpp/kernels/cuda/gemm_lt.h"

namespace mcpp::ops::cuda {
namespace gemm_lt {
namespace {

const char* kind_name(int k) { return k == kBF16 ? "bf16" : k == kF16 ? "f16" : "f32"; }
size_t elt_bytes(int k) { return k == kF32 ? 4 : 2; }
size_t round256(size_t b) { return (b + 255) / 256 * 256; }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

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

TuneScratch::TuneScratch(size_t bytes) {
  if (cudaMalloc(&mem, bytes) != cudaSuccess) {
    cudaGetLastError();  // clear the (non-sticky) allocation error
    mem = nullptr;
  }
}

TuneScratch::~TuneScratch() {
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  if (mem) cudaFree(mem);
}

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

int fastest_candidate(const std::vector<double>& ms) {
  int best = 0;
  for (int i = 0; i < static_cast<int>(ms.size()); ++i)
    if (!std::isnan(ms[i]) && ms[i] < ms[best]) best = i;
  return ms[0] >= kMinSpeedup * ms[best] ? best : 0;
}

// Times the plan's candidates on this call's operands (see gemm.cpp's header: outputs into scratch, C only read)
// and returns the index to use: the fastest when it beats #0 by kMinSpeedup, else 0; p.tuned_ms = its
// time. Appends a record unless record == false.
int tune(LtState& st, Plan& p, const PlanKey& key, const Epilogue& e, const Operands& x, cudaStream_t s,
         bool record) {
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
  TuneScratch sc(d_bytes * (aux_out ? 2 : 1) + (bias_out ? bias_bytes : 0));
  if (!sc.mem) return done(0, "no device memory for the timing scratch");
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
  return done(fastest_candidate(rec.candidate_ms), "");
}

namespace {

// Times launch_column_sum_acc over dy [n, out] (db and the partials in a scratch outside the pool; db's
// contents do not matter): the median of kTimedRounds launches after one warm-up; NaN without memory.
double time_column_sum(FIn dy, int64_t n, int64_t out, cudaStream_t s) {
  const size_t db_bytes = round256(static_cast<size_t>(out) * 4);
  TuneScratch sc(db_bytes + static_cast<size_t>(column_sum_parts(n) * out) * 4);
  if (!sc.mem) return NAN;
  float* db = static_cast<float*>(sc.mem);
  float* partial = reinterpret_cast<float*>(static_cast<char*>(sc.mem) + db_bytes);
  launch_column_sum_acc(db, dy, n, out, partial, s);
  return timed_medians(sc, {1}, [&](int) { launch_column_sum_acc(db, dy, n, out, partial, s); }, s)[0];
}

}  // namespace

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

}  // namespace gemm_lt

using namespace gemm_lt;

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

}  // namespace mcpp::ops::cuda
