// gemm_configs_probe: are there cuBLASLt configurations faster than the heuristic's candidates for the GPT 1.3B
// step's GEMMs, inside a power-capped loop? The trainer's tuner (docs/CUDA.md) times the <= 8 candidates of
// cublasLtMatmulAlgoGetHeuristic; this probe enumerates, around each algorithm the heuristic returns, every tile x
// stages x cluster shape x CTA swizzle x custom option that cublasLtMatmulAlgoCheck accepts (split-K 1), screens
// them (18 s per GEMM, shuffled), re-times the best 6 with the heuristic's candidates in interleaved rounds, and
// then runs the step's GEMM sequence (24 layers x 12 GEMMs + the LM head's 3) with the heuristic's best versus the
// enumeration's best per GEMM, interleaved rounds after a warm-up at the power cap, median.
// The GEMMs as the trainer calls them, without epilogues: bf16 in, fp32 accumulate, bf16 out (fwd, dgrad) or fp32
// out (wgrad into the main grads, beta 0 = the first write of a step).
// build: nvcc -O3 -arch=sm_90 -o gemm_configs_probe gemm_configs_probe.cu -lcublasLt
// usage: gemm_configs_probe [rounds of the sequence test, default 15]
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#define CK(x) do { auto e_ = (x); if (e_ != 0) { std::printf("error %d at %s:%d\n", (int)e_, __FILE__, __LINE__); std::exit(1); } } while (0)

__global__ void fill_bf16(__nv_bfloat16* x, long n, float scale) {  // values, not zeros (power draw)
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    x[i] = __float2bfloat16(scale * __sinf(0.37f * (float)(i % 99991) + 1.3f));
}

constexpr size_t kWs = 32u << 20;  // the trainer's workspace

// Row-major C[m, n] = op(a) op(b): a [m, k] (ta: [k, m]), b [k, n] (tb: [n, k]). In cuBLASLt's column-major terms
// C^T[n, m] = op(b)^T op(a)^T: A_lt = b (transa = tb), B_lt = a (transb = ta).
struct Gemm {
  const char* name;
  long m, n, k;
  bool ta, tb, f32out;
  int count;  // calls per step
};

struct Plan {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
};

struct Cand {
  cublasLtMatmulAlgo_t algo;
  std::string cfg;
  float ms = 1e9f;
  bool heuristic = false;
};

cublasLtHandle_t lt;
void* ws;
cudaStream_t st;

Plan make_plan(const Gemm& g) {
  Plan p;
  CK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t tA = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N, tB = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof(tA)));
  CK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof(tB)));
  const long ar = g.tb ? g.k : g.n, ac = g.tb ? g.n : g.k;  // b stored column-major
  const long br = g.ta ? g.m : g.k, bc = g.ta ? g.k : g.m;  // a stored column-major
  CK(cublasLtMatrixLayoutCreate(&p.la, CUDA_R_16BF, ar, ac, ar));
  CK(cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_16BF, br, bc, br));
  CK(cublasLtMatrixLayoutCreate(&p.lc, g.f32out ? CUDA_R_32F : CUDA_R_16BF, g.n, g.m, g.n));
  return p;
}

std::string cfg_of(const cublasLtMatmulAlgo_t& a) {
  int32_t id = 0; uint32_t tile = 0, stages = 0, swz = 0, custom = 0; uint16_t cluster = 0; size_t w = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof(swz), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof(custom), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof(cluster), &w);
  char buf[96];
  std::snprintf(buf, sizeof buf, "a%d t%u s%u w%u o%u c%u", id, tile, stages, swz, custom, cluster);
  return buf;
}

struct Bufs { void *a, *b, *c; };

cublasStatus_t launch(const Plan& p, const cublasLtMatmulAlgo_t& algo, const Bufs& x) {
  const float one = 1.0f, zero = 0.0f;
  return cublasLtMatmul(lt, p.op, &one, x.b, p.la, x.a, p.lb, &zero, x.c, p.lc, x.c, p.lc, &algo, ws, kWs, st);
}

// Median of `reps` single-launch event timings (after one warm-up launch).
float time_ms(const Plan& p, const cublasLtMatmulAlgo_t& algo, const Bufs& x, int reps) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  if (launch(p, algo, x) != CUBLAS_STATUS_SUCCESS) return 1e9f;
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(e0, st));
    launch(p, algo, x);
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms = 0; CK(cudaEventElapsedTime(&ms, e0, e1)); t.push_back(ms);
  }
  cudaEventDestroy(e0); cudaEventDestroy(e1);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<Cand> heuristic(const Plan& p) {
  cublasLtMatmulPreference_t pref;
  CK(cublasLtMatmulPreferenceCreate(&pref));
  size_t w = kWs;
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &w, sizeof(w)));
  cublasLtMatmulHeuristicResult_t r[32]; int got = 0;
  CK(cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.la, p.lb, p.lc, p.lc, pref, 32, r, &got));
  cublasLtMatmulPreferenceDestroy(pref);
  std::vector<Cand> out;
  for (int i = 0; i < got; ++i) out.push_back({r[i].algo, cfg_of(r[i].algo), 1e9f, true});
  return out;
}

// Every configuration around each algorithm the heuristic returned (its id and inner shape kept, which an algorithm
// made by cublasLtMatmulAlgoInit lacks): tiles and stages from the algorithm's caps, cluster shapes, CTA swizzle,
// custom options 0..max; those cublasLtMatmulAlgoCheck accepts within the workspace.
std::vector<Cand> enumerate(const Plan& p, const std::vector<Cand>& heur) {
  const uint16_t clusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                               CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1, CUBLASLT_CLUSTER_SHAPE_4x1x1,
                               CUBLASLT_CLUSTER_SHAPE_1x4x1};
  std::vector<Cand> out;
  std::vector<int32_t> seen;
  long checked = 0;
  for (const Cand& h : heur) {
    int32_t id = 0; size_t w = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&h.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &w);
    if (std::find(seen.begin(), seen.end(), id) != seen.end()) continue;
    seen.push_back(id);
    const cublasLtMatmulAlgo_t base = h.algo;
    uint32_t tiles[1024], stages[256]; size_t n_t = 0, n_s = 0;
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, tiles, sizeof(tiles), &n_t);
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_STAGES_IDS, stages, sizeof(stages), &n_s);
    n_t /= sizeof(uint32_t); n_s /= sizeof(uint32_t);
    if (n_t == 0) { tiles[0] = CUBLASLT_MATMUL_TILE_UNDEFINED; n_t = 1; }
    if (n_s == 0) { stages[0] = CUBLASLT_MATMUL_STAGES_UNDEFINED; n_s = 1; }
    int32_t swz_ok = 0, custom_max = 0;
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swz_ok, sizeof(swz_ok), &w);
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &custom_max, sizeof(custom_max), &w);
    uint16_t inner = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&base, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &inner, sizeof(inner), &w);
    std::printf("  algorithm %d: %zu tiles, %zu stages, custom options 0..%d, swizzle %d, inner shape %u\n", id, n_t,
                n_s, custom_max, swz_ok, inner);
    for (size_t t = 0; t < n_t; ++t)
      for (size_t s = 0; s < n_s; ++s)
        for (uint16_t c : clusters)
          for (uint32_t swz = 0; swz <= (swz_ok ? 1u : 0u); ++swz)
            for (uint32_t o = 0; o <= (uint32_t)std::min(custom_max, 15); ++o) {
              cublasLtMatmulAlgo_t a = base;
              cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tiles[t], sizeof(uint32_t));
              cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages[s], sizeof(uint32_t));
              if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &c, sizeof(c)) !=
                  CUBLAS_STATUS_SUCCESS && c != 0)
                continue;
              cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof(swz));
              cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &o, sizeof(o));
              cublasLtMatmulHeuristicResult_t r{};
              ++checked;
              if (cublasLtMatmulAlgoCheck(lt, p.op, p.la, p.lb, p.lc, p.lc, &a, &r) != CUBLAS_STATUS_SUCCESS) continue;
              if (r.workspaceSize > kWs) continue;
              out.push_back({a, cfg_of(a), 1e9f, false});
            }
  }
  std::printf("  %ld configurations checked, %zu accepted\n", checked, out.size());
  return out;
}

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 15;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const long t = 16384, h = 2048, f = 8192, q = 6144, V = 50304, L = 24;
  const std::vector<Gemm> gemms = {
      {"qkv fwd", t, q, h, false, true, false, (int)L},   {"qkv dgrad", t, h, q, false, false, false, (int)L},
      {"qkv wgrad", q, h, t, true, false, true, (int)L},  {"proj fwd", t, h, h, false, true, false, (int)L},
      {"proj dgrad", t, h, h, false, false, false, (int)L}, {"proj wgrad", h, h, t, true, false, true, (int)L},
      {"fc1 fwd", t, f, h, false, true, false, (int)L},   {"fc1 dgrad", t, h, f, false, false, false, (int)L},
      {"fc1 wgrad", f, h, t, true, false, true, (int)L},  {"fc2 fwd", t, h, f, false, true, false, (int)L},
      {"fc2 dgrad", t, f, h, false, false, false, (int)L}, {"fc2 wgrad", h, f, t, true, false, true, (int)L},
      {"lm fwd", t, V, h, false, true, false, 1},         {"lm dgrad", t, h, V, false, false, false, 1},
      {"lm wgrad", V, h, t, true, false, true, 1}};
  CK(cublasLtCreate(&lt));
  CK(cudaMalloc(&ws, kWs));
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  // One set of operands big enough for every GEMM (values, not zeros).
  const long max_ab = t * V, max_c = t * V;  // elements
  Bufs x;
  CK(cudaMalloc(&x.a, max_ab * 2)); CK(cudaMalloc(&x.b, max_ab * 2)); CK(cudaMalloc(&x.c, max_c * 4));
  fill_bf16<<<2048, 256>>>((__nv_bfloat16*)x.a, max_ab, 1.0f);
  fill_bf16<<<2048, 256>>>((__nv_bfloat16*)x.b, max_ab, 0.02f);
  CK(cudaDeviceSynchronize());
  std::vector<Plan> plans;
  std::vector<cublasLtMatmulAlgo_t> pick_h, pick_e;
  for (const Gemm& g : gemms) {
    Plan p = make_plan(g);
    plans.push_back(p);
    const double tflop = 2.0 * g.m * g.n * g.k / 1e12;
    std::printf("== %s m%ld n%ld k%ld%s%s%s\n", g.name, g.m, g.n, g.k, g.ta ? " a^T" : "", g.tb ? " b^T" : "",
                g.f32out ? " ->f32" : "");
    std::vector<Cand> c = heuristic(p);
    const size_t n_h = c.size();
    std::vector<Cand> e = enumerate(p, c);
    std::mt19937 rng(1234);
    std::shuffle(e.begin(), e.end(), rng);
    c.insert(c.end(), e.begin(), e.end());
    // Screen: one timed launch each after a warm-up one (the board is under sustained load).
    // Screening stops after 18 s per GEMM, the enumerated ones in a shuffled order (the rest keep 1e9: not chosen).
    const auto t0 = std::chrono::steady_clock::now();
    for (Cand& k : c) {
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(18)) break;
      k.ms = time_ms(p, k.algo, x, 1);
    }
    // Re-time the heuristic's candidates and the 6 best enumerated ones in interleaved rounds.
    std::vector<size_t> idx(c.size() - n_h);
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = n_h + i;
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return c[a].ms < c[b].ms; });
    idx.resize(std::min<size_t>(idx.size(), 6));
    for (size_t i = 0; i < n_h; ++i) idx.push_back(i);
    std::vector<std::vector<float>> tt(idx.size());
    for (int r = 0; r < 9; ++r)
      for (size_t i = 0; i < idx.size(); ++i) tt[i].push_back(time_ms(p, c[idx[i]].algo, x, 3));
    size_t best_h = SIZE_MAX, best_e = SIZE_MAX;
    float ms_h = 1e9f, ms_e = 1e9f;
    for (size_t i = 0; i < idx.size(); ++i) {
      std::sort(tt[i].begin(), tt[i].end());
      const float med = tt[i][tt[i].size() / 2];
      const Cand& k = c[idx[i]];
      std::printf("  %s %-32s screen %.3f ms  re-timed %.3f ms (%.0f TFLOP/s)\n", k.heuristic ? "heur" : "enum",
                  k.cfg.c_str(), k.ms, med, tflop / med * 1e3);
      if (k.heuristic && med < ms_h) { ms_h = med; best_h = idx[i]; }
      if (med < ms_e) { ms_e = med; best_e = idx[i]; }  // the enumeration's best includes the heuristic's
    }
    std::printf("  best heuristic %.3f ms [%s], best overall %.3f ms [%s]: %.3fx\n", ms_h, c[best_h].cfg.c_str(), ms_e,
                c[best_e].cfg.c_str(), ms_h / ms_e);
    pick_h.push_back(c[best_h].algo);
    pick_e.push_back(c[best_e].algo);
  }
  // The step's GEMM sequence (forward layers, the LM head, backward layers in reverse), each GEMM at its pick.
  auto sequence = [&](const std::vector<cublasLtMatmulAlgo_t>& pick) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, st));
    const int fwd[] = {0, 3, 6, 9}, bwd[] = {10, 11, 7, 8, 4, 5, 1, 2};
    for (int l = 0; l < L; ++l)
      for (int i : fwd) launch(plans[i], pick[i], x);
    for (int i = 12; i < 15; ++i) launch(plans[i], pick[i], x);
    for (int l = 0; l < L; ++l)
      for (int i : bwd) launch(plans[i], pick[i], x);
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms = 0; CK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0); cudaEventDestroy(e1);
    return ms;
  };
  for (int r = 0; r < 10; ++r) { sequence(pick_h); sequence(pick_e); }  // warm-up to the power cap
  std::vector<float> th, te;
  for (int r = 0; r < rounds; ++r) { th.push_back(sequence(pick_h)); te.push_back(sequence(pick_e)); }
  std::sort(th.begin(), th.end()); std::sort(te.begin(), te.end());
  double flop = 0;
  for (const Gemm& g : gemms) flop += 2.0 * g.m * g.n * g.k * g.count;
  const float mh = th[th.size() / 2], me = te[te.size() / 2];
  std::printf("step GEMM sequence (%.1f TFLOP), median of %d interleaved rounds: heuristic picks %.2f ms (%.0f TFLOP/s, "
              "min %.2f max %.2f), enumerated picks %.2f ms (%.0f TFLOP/s, min %.2f max %.2f): %.3fx\n",
              flop / 1e12, rounds, mh, flop / mh / 1e9, th.front(), th.back(), me, flop / me / 1e9, te.front(),
              te.back(), mh / me);
  return 0;
}
