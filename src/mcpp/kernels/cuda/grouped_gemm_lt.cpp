// The grouped GEMMs with their sizes on the host (ops.inc grouped_linear_*, counts a host tensor: layers padded to
// capacity or dropping over it, EP > 1), on cuBLASLt instead of grouped_gemm_kernels.cu:
//   every group the same rows r > 0 (a padded layer): one pointer-array batched GEMM
//     (CUBLASLT_BATCH_MODE_POINTER_ARRAY, batch = the groups; each group's A / B / D address read from device arrays,
//     since the experts' parameters lie in the buffer in reverse registration order, at no common stride), with the
//     epilogue the per-group GEMM would have (gemm.cpp's): the bias (BIAS), bias + GELU with pre_act kept
//     (GELU_AUX(_BIAS), the GELU MLP's fc1) or gelu' on the dgrad (DGELU, its fc2). The epilogue's vector and aux are
//     one buffer each at one stride a group (CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, ..._EPILOGUE_AUX_BATCH_STRIDE):
//     the biases are packed into [groups, out] by one kernel first, pre_act is the grouped buffer. Where cuBLASLt has
//     no batched algorithm with the epilogue: the batched GEMM without it, then the bias-add kernel / gelu_fwd /
//     gelu_bwd. The epilogues run only under MCPP_GROUPED_GEMM_EPILOGUES=1 until their GPU tests have passed on a
//     device (CudaMoeGroupedGemm.HostCountsRunCublasLtBatchedOrPerGroup sets it; unset or 0: the unfused passes);
//   otherwise, or where cuBLASLt has no batched algorithm for the shape: one GEMM per group with rows (linear_fwd,
//     linear_gelu_fwd, linear_dgelu_bwd with their epilogues; gemm). An empty group's grads are zeroed under Overwrite.
// The bias grads either way: fp32 ones by the deterministic column-sum kernel on each group's rows (gemm.cpp's),
// others by grouped_gemm_kernels.cu's serial sum.
// Row-major tensors as column-major cuBLASLt operands (the probe bench/gpu/batched_probe.cu times these ways):
//   fwd    D[out, r] = W^T (A: W as [in, out] ld in, T) x^T (B: [in, r] ld in)
//   dgrad  D[in, r]  = W (A: [in, out] ld in) dy^T (B: [out, r] ld out)
//   wgrad  D[in, out] (+)= x^T (A: [in, r] ld in) dy (B: dy as [out, r] ld out, T)
// The batched plans (descriptors, layouts, the heuristic's candidates) are cached per shape and autotuned at their
// first uncaptured call as the other GEMMs (gemm_lt.h: each candidate timed on the call's operands, its outputs into a
// scratch; another than #0 kept when >= 3% faster; off under --deterministic-mode). One GemmTuneRecord each.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <map>
#include <tuple>
#include <vector>

#include "mcpp/kernels/cuda/gemm_lt.h"
#include "mcpp/kernels/cuda/grouped_gemm_launch.h"
#include "mcpp/kernels/cuda/grouped_gemm_lt.h"

namespace mcpp::ops::cuda::grouped_lt {
using namespace cuda_detail;
using gemm_lt::cuda_type;

namespace {
enum class Gemm { Fwd, Dgrad, Wgrad };

// The epilogue of a batched GEMM (fwd, dgrad): bias = each group's bias [out] (BIAS, GELU_AUX_BIAS; packed into one
// [groups, out] buffer, vec, for the call), aux = pre_act [groups * rows, D's rows] (written by GELU_AUX(_BIAS), read
// by DGELU): each at one stride a group.
struct BatchedEpilogue {
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
  const std::vector<Tensor>* bias = nullptr;
  void* aux = nullptr;
  const void* vec = nullptr;  // set by batched()
  Kind k_vec = kF32;
};

struct BatchedKey {
  int gemm, groups;
  int64_t rows, in, out;
  int k_in, k_out;  // Kind of A / B, of D
  bool accumulate;
  int epilogue = CUBLASLT_EPILOGUE_DEFAULT, k_vec = kF32;
  auto tie() const { return std::tie(gemm, groups, rows, in, out, k_in, k_out, accumulate, epilogue, k_vec); }
  bool operator<(const BatchedKey& o) const { return tie() < o.tie(); }
  int64_t d_rows() const { return gemm == static_cast<int>(Gemm::Dgrad) ? in : out; }  // column-major D's rows
};

struct BatchedPlan {
  bool ok = false;  // false: cuBLASLt has no pointer-array algorithm for it (the per-group GEMMs run)
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  std::vector<cublasLtMatmulAlgo_t> algos;  // the heuristic's candidates, its order
  int tuned = -1;                           // the autotuned index; -1 = not tuned yet
};

std::atomic<int64_t> g_batched{0}, g_epilogue{0}, g_per_group{0};  // cuda_grouped_gemm_path_counts

std::map<BatchedKey, BatchedPlan>& plans() {
  static auto* m = new std::map<BatchedKey, BatchedPlan>();  // lives for the process, as gemm_lt's cache
  return *m;
}

cublasLtMatrixLayout_t batched_layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int groups) {
  cublasLtMatrixLayout_t l = nullptr;
  MCPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, t, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  const int32_t count = groups;
  const auto mode = static_cast<uint32_t>(CUBLASLT_BATCH_MODE_POINTER_ARRAY);
  MCPP_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
  MCPP_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof(mode)));
  return l;
}

// The epilogue's pointers on op (they change from call to call; the plan's other attributes do not).
cublasStatus_t set_epilogue_pointers(cublasLtMatmulDesc_t op, const BatchedEpilogue& e) {
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  if (e.vec) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e.vec, sizeof(e.vec));
  if (st == CUBLAS_STATUS_SUCCESS && e.aux)
    st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e.aux, sizeof(e.aux));
  return st;
}

// The epilogue's attributes on op; false when cuBLASLt refuses one (the plan then has no algorithm).
bool set_epilogue(cublasLtMatmulDesc_t op, const BatchedKey& k, const BatchedEpilogue& e) {
  if (e.kind == CUBLASLT_EPILOGUE_DEFAULT) return true;
  auto set = [&](cublasLtMatmulDescAttributes_t a, const auto& v) {
    return cublasLtMatmulDescSetAttribute(op, a, &v, sizeof(v)) == CUBLAS_STATUS_SUCCESS;
  };
  bool ok = set(CUBLASLT_MATMUL_DESC_EPILOGUE, e.kind);
  if (e.vec) {
    const cudaDataType_t t = cuda_type(e.k_vec);
    ok = ok && set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, t) && set(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, k.out);
  }
  if (e.aux) {
    const int64_t ld = k.d_rows(), stride = k.d_rows() * k.rows;  // aux is laid out as D
    ok = ok && set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ld) &&
         set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, stride);
  }
  return ok && set_epilogue_pointers(op, e) == CUBLAS_STATUS_SUCCESS;
}

BatchedPlan make_plan(gemm_lt::LtState& st, const BatchedKey& k, const BatchedEpilogue& e) {
  BatchedPlan p;
  MCPP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const auto g = static_cast<Gemm>(k.gemm);
  const cublasOperation_t opa = g == Gemm::Fwd ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = g == Gemm::Wgrad ? CUBLAS_OP_T : CUBLAS_OP_N;
  MCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  MCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  if (!set_epilogue(p.op, k, e)) return p;  // ok false: the caller runs the plain GEMM and the passes
  const cudaDataType_t tin = cuda_type(static_cast<Kind>(k.k_in)), tout = cuda_type(static_cast<Kind>(k.k_out));
  switch (g) {  // the stored shapes (rows x cols, column-major) of A, B, D; see the header
    case Gemm::Fwd:
      p.la = batched_layout(tin, k.in, k.out, k.in, k.groups);
      p.lb = batched_layout(tin, k.in, k.rows, k.in, k.groups);
      p.ld = batched_layout(tout, k.out, k.rows, k.out, k.groups);
      break;
    case Gemm::Dgrad:
      p.la = batched_layout(tin, k.in, k.out, k.in, k.groups);
      p.lb = batched_layout(tin, k.out, k.rows, k.out, k.groups);
      p.ld = batched_layout(tout, k.in, k.rows, k.in, k.groups);
      break;
    case Gemm::Wgrad:
      p.la = batched_layout(tin, k.in, k.rows, k.in, k.groups);
      p.lb = batched_layout(tin, k.out, k.rows, k.out, k.groups);
      p.ld = batched_layout(tout, k.in, k.out, k.in, k.groups);
      break;
  }
  cublasLtMatmulPreference_t pref = nullptr;
  MCPP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = gemm_lt::kWorkspaceBytes;
  MCPP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                         sizeof(ws)));
  cublasLtMatmulHeuristicResult_t res[gemm_lt::kMaxCandidates]{};
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(st.handle, p.op, p.la, p.lb, p.ld, p.ld, pref,
                                                           gemm_lt::kMaxCandidates, res, &found);
  MCPP_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  p.ok = hs == CUBLAS_STATUS_SUCCESS && found > 0;
  for (int i = 0; p.ok && i < found; ++i) p.algos.push_back(res[i].algo);
  return p;
}

const char* gemm_name(int g) { return g == 0 ? "fwd" : g == 1 ? "dgrad" : "wgrad"; }

// Times p's candidates on this call's operands (table: the [A | B | D] address arrays of 3 x groups entries), each
// writing its D into a scratch (C, read under accumulate, stays the caller's; a GELU_AUX epilogue's pre_act is
// written in place, as the call then writes it again), and returns the index to run.
int tune(gemm_lt::LtState& st, BatchedPlan& p, const BatchedKey& k, const void** table, cudaStream_t s) {
  const int g = k.groups;
  // each group's C[m, n] = op(A)[m, kk] op(B)[kk, n] in row-major terms (GemmTuneRecord's): fwd y[rows, out] over
  // in, dgrad dx[rows, in] over out, wgrad dW[out, in] over the rows
  const auto gemm = static_cast<Gemm>(k.gemm);
  const int64_t m = gemm == Gemm::Wgrad ? k.out : k.rows, n = gemm == Gemm::Fwd ? k.out : k.in;
  const int64_t kk = gemm == Gemm::Wgrad ? k.rows : gemm == Gemm::Fwd ? k.in : k.out;
  const size_t per = (static_cast<size_t>(m * n) * (k.k_out == kF32 ? 4 : 2) + 255) / 256 * 256;  // one group's D
  gemm_lt::TuneScratch sc(per * static_cast<size_t>(g) + 4 * static_cast<size_t>(g) * sizeof(void*));
  GemmTuneRecord rec;
  rec.gemm = fmt::format("batched {} x {} groups: m{} n{} k{} ->{} beta{} {}", gemm_name(k.gemm), g, m, n, kk,
                         k.k_out == kF32 ? "f32" : "bf16", k.accumulate ? 1 : 0,
                         gemm_lt::epilogue_name(static_cast<cublasLtEpilogue_t>(k.epilogue)));
  rec.m = m, rec.n = n, rec.k = kk;
  for (const cublasLtMatmulAlgo_t& a : p.algos) rec.candidate_config.push_back(gemm_lt::algo_config(a));
  auto done = [&](int chosen, const char* note) {
    rec.chosen = chosen;
    rec.note = note;
    st.records.push_back(rec);
    return chosen;
  };
  if (!sc.mem) return done(0, "no device memory for the timing scratch");
  // [A | B | C = the caller's D | D = the scratch]
  char* scratch = static_cast<char*>(sc.mem);
  const void** tt = reinterpret_cast<const void**>(scratch + per * static_cast<size_t>(g));
  MCPP_CUDA_CHECK(cudaMemcpyAsync(tt, table, 3 * static_cast<size_t>(g) * sizeof(void*), cudaMemcpyDeviceToDevice, s));
  PointerTableArgs outs{.n = g, .p = {}};
  for (int i = 0; i < g; ++i) outs.p[i] = scratch + per * static_cast<size_t>(i);
  launch_pointer_table(tt + 3 * g, outs, s);
  const float alpha = 1.0f, beta = k.accumulate ? 1.0f : 0.0f;
  auto launch = [&](int i) {
    return cublasLtMatmul(st.handle, p.op, &alpha, tt, p.la, tt + g, p.lb, &beta, tt + 2 * g, p.ld, tt + 3 * g, p.ld,
                          &p.algos[static_cast<size_t>(i)], st.workspace, gemm_lt::kWorkspaceBytes, s);
  };
  const int count = static_cast<int>(p.algos.size());
  std::vector<char> ok(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) ok[static_cast<size_t>(i)] = launch(i) == CUBLAS_STATUS_SUCCESS;  // warm-up
  if (!ok[0]) return done(0, "cuBLASLt refused candidate 0");
  rec.candidate_ms = gemm_lt::timed_medians(sc, ok, [&](int i) { MCPP_CUBLAS_CHECK(launch(i)); }, s);
  return done(gemm_lt::fastest_candidate(rec.candidate_ms), "");
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The rows of each group and their offsets; uniform = the one row count when every group has it (> 0), else 0.
// The host counts are checked (each >= 0, summing to the buffer's m rows): the kernels and cuBLASLt trust them.
struct Rows {
  std::vector<int64_t> count, lo;  // lo has groups + 1 entries
  int64_t uniform = 0;
};
Rows rows_of(const Tensor& counts, int64_t m) {
  Rows r;
  const int64_t* c = counts.data<int64_t>();
  r.lo.push_back(0);
  for (int64_t g = 0; g < counts.numel(); ++g) {
    MCPP_CHECK(c[g] >= 0, "grouped_linear: group {} has {} rows", g, c[g]);
    r.count.push_back(c[g]);
    r.lo.push_back(r.lo.back() + c[g]);
  }
  MCPP_CHECK(r.lo.back() == m, "grouped_linear: the counts sum to {} rows; the buffer has {}", r.lo.back(), m);
  r.uniform = r.count[0];
  for (int64_t n : r.count)
    if (n != r.uniform) r.uniform = 0;
  return r;
}

// One pointer-array batched GEMM: D_g = epilogue(op(A_g) op(B_g) (+ D_g under accumulate)) for every group, the
// address arrays written on the stream. False (nothing run) when the shape has no batched algorithm (with this
// epilogue) or an address is not 16-byte aligned (cuBLASLt's kernels read 16-byte vectors; the per-group GEMMs handle
// any alignment).
bool batched(BatchedKey key, const std::vector<const void*>& a, const std::vector<const void*>& b,
             const std::vector<const void*>& d, cudaStream_t s, BatchedEpilogue e = {}) {
  for (const auto* list : {&a, &b, &d})
    for (const void* p : *list)
      if (!aligned16(p)) return false;
  if (e.aux && !aligned16(e.aux)) return false;
  const int g = key.groups;
  if (s != compute_stream()) MCPP_CUDA_CHECK(cudaStreamSynchronize(compute_stream()));  // the allocations below
  Tensor table = Tensor::empty({3 * g}, DType::I64, Device::CUDA);  // [A | B | D] addresses
  Tensor packed;                                                    // [groups, out]: the biases at one stride
  if (e.bias) {
    packed = Tensor::empty({g, key.out}, (*e.bias)[0].dtype(), Device::CUDA);
    e.vec = packed.raw();
    e.k_vec = require_float("grouped_linear_fwd", "bias", (*e.bias)[0]);
  }
  key.epilogue = e.kind;
  key.k_vec = e.k_vec;
  gemm_lt::LtState& st = gemm_lt::lt_state();
  const std::lock_guard<std::mutex> lock(st.mu);
  auto it = plans().find(key);
  if (it == plans().end()) it = plans().emplace(key, make_plan(st, key, e)).first;
  BatchedPlan& p = it->second;
  if (!p.ok) return false;
  if (e.bias) {
    PackVectorsArgs pack{.groups = g, .kind = e.k_vec, .n = key.out, .packed = packed.raw(), .v = {}};
    for (int i = 0; i < g; ++i) pack.v[i] = (*e.bias)[static_cast<size_t>(i)].raw();
    launch_pack_vectors(pack, s);
  }
  MCPP_CUBLAS_CHECK(set_epilogue_pointers(p.op, e));
  PointerTableArgs args{.n = 3 * g, .p = {}};
  for (int i = 0; i < g; ++i) {
    args.p[i] = a[static_cast<size_t>(i)];
    args.p[g + i] = b[static_cast<size_t>(i)];
    args.p[2 * g + i] = d[static_cast<size_t>(i)];
  }
  const void** ptrs = reinterpret_cast<const void**>(table.raw());
  launch_pointer_table(ptrs, args, s);
  int idx = 0;
  if (gemm_autotune()) {
    if (p.tuned < 0 && !is_capturing(s)) p.tuned = tune(st, p, key, ptrs, s);
    idx = std::max(p.tuned, 0);
  }
  const float alpha = 1.0f, beta = key.accumulate ? 1.0f : 0.0f;
  MCPP_CUBLAS_CHECK(cublasLtMatmul(st.handle, p.op, &alpha, ptrs, p.la, ptrs + g, p.lb, &beta, ptrs + 2 * g, p.ld,
                                   ptrs + 2 * g, p.ld, &p.algos[static_cast<size_t>(idx)], st.workspace,
                                   gemm_lt::kWorkspaceBytes, s));
  if (s != compute_stream()) MCPP_CUDA_CHECK(cudaStreamSynchronize(s));  // before the table is freed on compute
  ++g_batched;
  if (e.kind != CUBLASLT_EPILOGUE_DEFAULT) ++g_epilogue;
  return true;
}

// MCPP_GROUPED_GEMM_EPILOGUES=0|1 (unset: 0), read at each call (the tests switch it): the batched GEMMs' epilogues.
bool epilogues_on() {
  const char* v = std::getenv("MCPP_GROUPED_GEMM_EPILOGUES");
  if (!v || std::string(v) == "0") return false;
  if (std::string(v) == "1") return true;
  fail("MCPP_GROUPED_GEMM_EPILOGUES must be 0 or 1; got '{}'", v);
}

const void* at_row(const Tensor& t, int64_t row) {
  return static_cast<const char*>(t.raw()) + row * t.size(1) * static_cast<int64_t>(dtype_size(t.dtype()));
}

// A batched GEMM's per-group addresses: each group's first row of a grouped buffer, or each group's own tensor.
std::vector<const void*> group_rows(const Tensor& t, const Rows& r) {
  std::vector<const void*> out;
  for (size_t g = 0; g + 1 < r.lo.size(); ++g) out.push_back(at_row(t, r.lo[g]));
  return out;
}
std::vector<const void*> raws(const std::vector<Tensor>& ts) {
  std::vector<const void*> out;
  for (const Tensor& t : ts) out.push_back(t.raw());
  return out;
}

GroupedBiasAddArgs bias_add_args(Tensor& y, const std::vector<Tensor>& bias, const Rows& r) {
  GroupedBiasAddArgs a{.groups = static_cast<int>(r.count.size()),
                       .y_kind = require_float("grouped_linear_fwd", "y", y),
                       .bias_kind = require_float("grouped_linear_fwd", "bias", bias[0]), .n = y.size(1),
                       .y = y.raw(), .bias = {}, .row_lo = {}};
  for (size_t g = 0; g < r.count.size(); ++g) a.bias[g] = bias[g].raw();
  for (size_t g = 0; g < r.lo.size(); ++g) a.row_lo[g] = r.lo[g];
  return a;
}

// The per-group path (counted once): fn(g, rows) for every group with rows, rows(t) = t's rows of group g.
template <class F>
void per_group(const Rows& r, F&& fn) {
  ++g_per_group;
  for (size_t g = 0; g < r.count.size(); ++g) {
    if (r.count[g] == 0) continue;
    fn(g, [&](const Tensor& t) { return t.narrow0(r.lo[g], r.count[g]); });
  }
}

// The batched forward y = x W_g^T (+ bias_g) of every group (r.uniform rows each), the bias in the epilogue (BIAS)
// or, where cuBLASLt has no such algorithm, added by one kernel after (y then rounded twice). False: nothing run.
bool batched_fwd(Tensor& y, const Tensor& x, const std::vector<Tensor>& w, const std::vector<Tensor>& bias,
                 const Rows& r, cudaStream_t s) {
  const auto groups = static_cast<int>(w.size());
  if (r.uniform == 0 || groups < 2) return false;
  const Kind k = require_float("grouped_linear_fwd", "x", x);
  const BatchedKey key{static_cast<int>(Gemm::Fwd), groups, r.uniform, x.size(1), y.size(1), k, k, false};
  if (!bias.empty() && epilogues_on() &&
      batched(key, raws(w), group_rows(x, r), group_rows(y, r), s, {.kind = CUBLASLT_EPILOGUE_BIAS, .bias = &bias}))
    return true;
  if (!batched(key, raws(w), group_rows(x, r), group_rows(y, r), s)) return false;
  if (!bias.empty()) launch_grouped_bias_add(bias_add_args(y, bias, r), s);
  return true;
}

// The batched dgrad dx = dy W_g of every group (r.uniform rows each), times gelu'(pre_act) in the epilogue (DGELU)
// when pre_act is given. False: nothing run (with pre_act: no batched DGELU algorithm).
bool batched_dgrad(Tensor& dx, const Tensor& dy, const std::vector<Tensor>& w, const Tensor* pre_act, const Rows& r,
                   cudaStream_t s) {
  const auto groups = static_cast<int>(w.size());
  if (r.uniform == 0 || groups < 2) return false;
  const Kind k = require_float("grouped_linear_dgrad", "dy", dy);
  const BatchedKey key{static_cast<int>(Gemm::Dgrad), groups, r.uniform, dx.size(1), dy.size(1), k, k, false};
  BatchedEpilogue e;
  if (pre_act) e = {.kind = CUBLASLT_EPILOGUE_DGELU, .aux = pre_act->raw()};
  return batched(key, raws(w), group_rows(dy, r), group_rows(dx, r), s, e);
}
}  // namespace

void fwd(Tensor& y, const Tensor& x, const std::vector<Tensor>& w, const std::vector<Tensor>& bias,
         const Tensor& counts, cudaStream_t s) {
  const Rows r = rows_of(counts, x.size(0));
  if (batched_fwd(y, x, w, bias, r, s)) return;
  per_group(r, [&](size_t g, auto rows) {
    Tensor yg = rows(y);
    ops::cuda::linear_fwd(yg, rows(x), w[g], bias.empty() ? nullptr : &bias[g], Stream{s});
  });
}

void gelu_fwd(Tensor& act, Tensor& pre_act, const Tensor& x, const std::vector<Tensor>& w,
              const std::vector<Tensor>& bias, const Tensor& counts, cudaStream_t s) {
  const Rows r = rows_of(counts, x.size(0));
  const auto groups = static_cast<int>(w.size());
  const Kind k = require_float("grouped_linear_gelu_fwd", "x", x);
  if (r.uniform > 0 && groups > 1) {
    const BatchedKey key{static_cast<int>(Gemm::Fwd), groups, r.uniform, x.size(1), act.size(1), k, k, false};
    const BatchedEpilogue e{.kind = bias.empty() ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
                            .bias = bias.empty() ? nullptr : &bias, .aux = pre_act.raw()};
    if (epilogues_on() && batched(key, raws(w), group_rows(x, r), group_rows(act, r), s, e)) return;
    if (batched_fwd(pre_act, x, w, bias, r, s)) {  // no batched GELU algorithm: the GEMM, then the GELU
      ops::cuda::gelu_fwd(act, pre_act, Stream{s});
      return;
    }
  }
  per_group(r, [&](size_t g, auto rows) {
    Tensor ag = rows(act), pg = rows(pre_act);
    ops::cuda::linear_gelu_fwd(ag, pg, rows(x), w[g], bias.empty() ? nullptr : &bias[g], Stream{s});
  });
}

void dgrad(Tensor& dx, const Tensor& dy, const std::vector<Tensor>& w, const Tensor& counts, cudaStream_t s) {
  const Rows r = rows_of(counts, dy.size(0));
  if (batched_dgrad(dx, dy, w, nullptr, r, s)) return;
  per_group(r, [&](size_t g, auto rows) {
    Tensor dxg = rows(dx);
    ops::cuda::gemm(dxg, rows(dy), w[g], GemmOptions{}, Stream{s});  // [r, out] @ [out, in]
  });
}

void dgelu_bwd(Tensor& dpre, const Tensor& dy, const std::vector<Tensor>& w, const Tensor& pre_act,
               const Tensor& counts, cudaStream_t s) {
  const Rows r = rows_of(counts, dy.size(0));
  if (epilogues_on() && batched_dgrad(dpre, dy, w, &pre_act, r, s)) return;
  if (batched_dgrad(dpre, dy, w, nullptr, r, s)) {  // no batched DGELU algorithm: the GEMM, then gelu' in place
    ops::cuda::gelu_bwd(dpre, dpre, pre_act, Stream{s});
    return;
  }
  per_group(r, [&](size_t g, auto rows) {
    Tensor dg = rows(dpre);
    ops::cuda::linear_dgelu_bwd(dg, nullptr, rows(dy), w[g], rows(pre_act), Stream{s});
  });
}

void wgrad(std::vector<Tensor>& dw_acc, std::vector<Tensor>& db_acc, const Tensor& dy, const Tensor& x,
           const Tensor& counts, bool overwrite, cudaStream_t s) {
  const Rows r = rows_of(counts, x.size(0));
  const auto groups = static_cast<int>(dw_acc.size());
  const Kind k = require_float("grouped_linear_wgrad", "x", x);
  bool done = false;
  if (r.uniform > 0 && groups > 1) {
    const BatchedKey key{static_cast<int>(Gemm::Wgrad), groups, r.uniform, x.size(1), dy.size(1), k,
                         require_float("grouped_linear_wgrad", "dw_acc", dw_acc[0]), !overwrite};
    done = batched(key, group_rows(x, r), group_rows(dy, r), raws(dw_acc), s);
  }
  if (!done) ++g_per_group;
  for (size_t g = 0; g < r.count.size() && !done; ++g) {
    if (r.count[g] == 0) {  // no rows: Overwrite writes zeros, Accumulate leaves the grad
      if (overwrite) dw_acc[g].zero_();
      continue;
    }
    const GemmOptions opt{.trans_a = true, .trans_b = false, .alpha = 1.0f, .beta = overwrite ? 0.0f : 1.0f};
    // dW_g (+)= dy_g^T x_g
    ops::cuda::gemm(dw_acc[g], dy.narrow0(r.lo[g], r.count[g]), x.narrow0(r.lo[g], r.count[g]), opt, Stream{s});
  }
  if (db_acc.empty()) return;
  if (db_acc[0].dtype() == DType::F32) {  // the deterministic column-sum kernel, each group's rows in parallel tiles
    for (size_t g = 0; g < r.count.size(); ++g) {
      if (overwrite) MCPP_CUDA_CHECK(cudaMemsetAsync(db_acc[g].raw(), 0, db_acc[g].nbytes(), s));
      if (r.count[g] == 0) continue;
      Tensor partial = Tensor::empty({column_sum_parts(r.count[g]), dy.size(1)}, DType::F32, Device::CUDA);
      launch_column_sum_acc(db_acc[g].data<float>(), FIn{at_row(dy, r.lo[g]), k}, r.count[g], dy.size(1),
                            partial.data<float>(), s);
    }
    return;
  }
  GroupedBiasGradArgs b{.counts = nullptr, .groups = groups, .overwrite = overwrite,
                        .db_kind = require_float("grouped_linear_wgrad", "db_acc", db_acc[0]), .n = dy.size(1),
                        .dy = FIn{dy.raw(), k}, .db = {}, .row_lo = {}};
  for (int g = 0; g < groups; ++g) b.db[g] = db_acc[static_cast<size_t>(g)].raw();
  for (size_t g = 0; g < r.lo.size(); ++g) b.row_lo[g] = r.lo[g];
  launch_grouped_bias_grad(b, s);
}

}  // namespace mcpp::ops::cuda::grouped_lt

mcpp::ops::GroupedGemmPathCounts mcpp::ops::cuda_grouped_gemm_path_counts() {
  return {cuda::grouped_lt::g_batched.load(), cuda::grouped_lt::g_epilogue.load(),
          cuda::grouped_lt::g_per_group.load()};
}
