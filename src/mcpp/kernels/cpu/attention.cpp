// CPU flash attention (FlashAttention-2 algorithm, Dao 2023), forward and backward, with GQA and causal mask.
//
// Contract:
//   flash_attention_fwd: q[s, b, nq, d], k/v[s, b, ng, d] -> o[s, b, nq, d], lse float32 [b, nq, s], where
//     o_i = sum_j softmax_j(scale * q_i.k_j) v_j over keys j (j <= i when causal), lse_i = logsumexp_j of
//     scale * q_i.k_j. Query head h reads kv group h / (nq/ng).
//   flash_attention_bwd: dq[s, b, nq, d], dk/dv[s, b, ng, d] from dout[s, b, nq, d] and the saved o, lse.
//     dk/dv sum over the nq/ng query heads of a group. All three are OVERWRITTEN (activation grads).
//   float32 CPU tensors; memory is O(kBlock^2 + kBlock*d) per thread plus D[b, nq, s] — never [s, s].
//
// Algorithm: queries and keys are tiled kBlock x kBlock. Forward keeps a running row max m, sum l and the
// unnormalized output per query row (online softmax). Backward recomputes P = exp(S - lse) per tile with
// D_i = rowsum(dO_i * O_i): dV += P^T dO, dP = dO V^T, dS = P * (dP - D), dK += scale dS^T Q,
// dQ += scale dS K. Determinism without atomics: pass A runs over (b, kv group, key block) and owns its
// dK/dV rows (looping over the group's heads and all query blocks in a fixed order); pass B runs over
// (b, head, query block) and owns its dQ rows. Pass B recomputes S/P/dP (5 -> 7 tile GEMMs in total).
// Tile products are small cblas_sgemm calls (OpenBLAS; inside the OpenMP region it runs single-threaded,
// so results do not depend on the thread count). Measured in bench/attention_bench.cpp: 2.5-3x faster than
// auto-vectorized loops under our -march=x86-64-v2 (OpenBLAS picks AVX2/AVX-512 kernels at run time).
// K and V are staged transposed ([d, kBlock], zero-padded) for the S = Q K^T and dP = dO V^T products.
// Attention dropout (opt.dropout_p > 0; the mask of AttentionOptions): per tile row z_j = keep ? 1/(1-p) : 0
// from Philox; forward O += (P z) V with l summed over the undropped P (lse unchanged); backward
// dV += (P z)^T dO and dS = P (z dP - D) with D = rowsum(dO * O) as before (O is the dropped output).
// Document masking (opt.doc_start, packed sequences): query i of sample bb also masks keys j < doc_start[bb, i];
// a query block starts at the key block of its first row's document (rows' doc_start never decreases), and pass A
// stops at the first query block whose documents all start after the key block.
// OpenMP: one parallel region per pass, dynamic schedule (causal blocks have unequal work).
#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cmath>
#include <limits>
#include <vector>

#include <cblas.h>

#include "mcpp/core/error.h"
#include "mcpp/kernels/cpu/vec_math.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {
namespace {

using detail::exp_approx;

constexpr int64_t kBlock = 64;  // query and key tile size (same size: the causal block skip relies on it)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct AttnDims {
  int64_t s, b, nq, ng, d, group;  // group = nq / ng query heads per kv head
  const int32_t* doc = nullptr;    // doc_start [b, s] (document masking) or null
  const int32_t* doc_of(int64_t bb) const { return doc ? doc + bb * s : nullptr; }
  int64_t nblk() const { return (s + kBlock - 1) / kBlock; }
  int64_t q_off(int64_t i, int64_t bb, int64_t h) const { return ((i * b + bb) * nq + h) * d; }  // [s,b,nq,d]
  int64_t kv_off(int64_t j, int64_t bb, int64_t g) const { return ((j * b + bb) * ng + g) * d; }  // [s,b,ng,d]
};

void check_f32(const char* op, const char* field, const Tensor& t) {
  if (!t.defined() || !t.is_cpu() || t.dtype() != DType::F32)
    fail("{}: {} must be a float32 CPU tensor, got {}", op, field, t.defined() ? t.str() : "undefined");
}

void check_shape(const char* op, const char* field, const Tensor& t, const Shape& want) {
  check_f32(op, field, t);
  if (t.shape() != want) fail("{}: {} must be {}, got {}", op, field, shape_str(want), t.str());
}

AttnDims check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse) {
  check_f32(op, "q", q);
  if (q.ndim() != 4) fail("{}: q must be [s, b, nq, d], got {}", op, q.str());
  check_f32(op, "k", k);
  if (k.ndim() != 4 || k.size(0) != q.size(0) || k.size(1) != q.size(1) || k.size(3) != q.size(3))
    fail("{}: k must be [s, b, ng, d] matching q {}, got {}", op, q.str(), k.str());
  AttnDims a{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), 0};
  if (a.ng <= 0 || a.nq % a.ng != 0)
    fail("{}: query heads nq={} must be a multiple of kv groups ng={}", op, a.nq, a.ng);
  a.group = a.nq / a.ng;
  check_shape(op, "v", v, k.shape());
  check_shape(op, "lse", lse, {a.b, a.nq, a.s});
  return a;
}

// dst[n][d] (contiguous) = rows r0..r0+n of one head; src points at row 0 of that head, rows `stride` apart.
void load_rows(float* dst, const float* src, int64_t r0, int64_t n, int64_t stride, int64_t d) {
  for (int64_t r = 0; r < n; ++r) std::copy_n(src + (r0 + r) * stride, d, dst + r * d);
}

// dst[d][kBlock] = transpose of rows r0..r0+n (columns n..kBlock-1 zeroed so full-width loops stay finite).
void load_cols(float* dst, const float* src, int64_t r0, int64_t n, int64_t stride, int64_t d) {
  std::fill_n(dst, d * kBlock, 0.0f);
  for (int64_t r = 0; r < n; ++r) {
    const float* row = src + (r0 + r) * stride;
    for (int64_t x = 0; x < d; ++x) dst[x * kBlock + r] = row[x];
  }
}

// S[i][j] = alpha * sum_x A[i][x] * BT[x][j] for i < m, j < kBlock; A [m][d], BT [d][kBlock], S [m][kBlock].
void tile_a_bt(float* S, const float* A, const float* BT, int64_t m, int64_t d, float alpha) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, kBlock, d, alpha, A, d, BT, kBlock, 0.0f, S, kBlock);
}

// C[i][x] += sum_j P[i][j] * B[j][x]; P [m][kBlock] (cols < n used), B [n][d], C [m][d].
void tile_acc_p_b(float* C, const float* P, const float* B, int64_t m, int64_t n, int64_t d) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, d, n, 1.0f, P, kBlock, B, d, 1.0f, C, d);
}

// C[j][x] += sum_i P[i][j] * A[i][x]; P [m][kBlock], A [m][d], C [n][d].
void tile_acc_pt_a(float* C, const float* P, const float* A, int64_t m, int64_t n, int64_t d) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, d, m, 1.0f, P, kBlock, A, d, 1.0f, C, d);
}

// Mask S [m][kBlock] for query rows i0.. and key columns j0..j0+n-1: key > query (causal), j >= n (padding), or
// (doc: the sample's doc_start [s]) a key before the query's document.
void mask_tile(float* S, int64_t m, int64_t i0, int64_t j0, int64_t n, bool causal, const int32_t* doc) {
  for (int64_t i = 0; i < m; ++i) {
    const int64_t valid = causal ? std::clamp<int64_t>(i0 + i - j0 + 1, 0, n) : n;
    std::fill(S + i * kBlock + valid, S + (i + 1) * kBlock, kNegInf);
    if (doc) std::fill_n(S + i * kBlock, std::clamp<int64_t>(doc[i0 + i] - j0, 0, valid), kNegInf);
  }
}

// z[j] for keys j0 .. j0 + n - 1 of query row i of head (bb, h): 1 / (1 - p) where the dropout mask keeps
// the probability, 0 where it drops it; z[n .. kBlock) = 0. Philox counters are shared by 4 consecutive
// elements of the flat [b, nq, s, s] index, so one call serves up to 4 keys.
void dropout_row(float* z, const AttnDims& a, const AttentionOptions& opt, int64_t bb, int64_t h, int64_t i,
                 int64_t j0, int64_t n) {
  const int64_t big_s = opt.dropout_seq_length > 0 ? opt.dropout_seq_length : a.s;  // the mask's sequence
  const uint64_t base = static_cast<uint64_t>(((bb * a.nq + h) * big_s + i + opt.dropout_row_offset) * big_s + j0 +
                                              opt.dropout_col_offset);
  const float keep_scale = 1.0f / (1.0f - opt.dropout_p);
  std::array<uint32_t, 4> r{};
  uint64_t group = ~uint64_t{0};
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t idx = base + static_cast<uint64_t>(j);
    if (idx / 4 != group) r = philox4x32_10(opt.dropout_key.seed, opt.dropout_key.offset + (group = idx / 4), 0);
    z[j] = philox_uniform(r[idx % 4]) >= opt.dropout_p ? keep_scale : 0.0f;
  }
  std::fill(z + n, z + kBlock, 0.0f);
}

void check_dropout(const char* op, const AttentionOptions& opt, int64_t s) {
  if (!(opt.dropout_p >= 0.0f && opt.dropout_p < 1.0f))
    fail("{}: attention dropout probability must be in [0, 1); got {}", op, opt.dropout_p);
  check_attention_dropout_block(op, opt, s);
  if (opt.dropout_p > 0.0f && opt.dropout_key.device_base)
    fail("{}: a CUDA-graph dropout key (device offset base) on the CPU backend", op);
}

// Key blocks [first_key_block, key_blocks) query block qb of sample bb attends to.
int64_t key_blocks(const AttnDims& a, int64_t qb, bool causal) { return causal ? qb + 1 : a.nblk(); }
int64_t first_key_block(const AttnDims& a, int64_t bb, int64_t qb) {
  return a.doc ? a.doc_of(bb)[qb * kBlock] / kBlock : 0;  // the block's first row has the earliest document
}

// doc_start's shape and values: 0 <= doc[i] <= i and non-decreasing along each sample (the block skips rely on it).
// Sets a.doc from opt.doc_start (when defined) after checking it.
void check_doc_start(const char* op, const AttentionOptions& opt, AttnDims& a) {
  check_attention_doc_start(op, opt, a.b, a.s, Device::CPU);
  if (!opt.doc_start.defined()) return;
  a.doc = opt.doc_start.data<int32_t>();
  for (int64_t bb = 0; bb < a.b; ++bb)
    for (int64_t i = 0; i < a.s; ++i) {
      const int32_t d = a.doc_of(bb)[i];
      if (d < 0 || d > i || (i > 0 && d < a.doc_of(bb)[i - 1]))
        fail("{}: doc_start[{}, {}] = {} is not a document start (0 <= doc_start <= position, non-decreasing)", op, bb,
             i, d);
    }
}

// Forward for one (batch bb, head h, query block qb).
struct FwdScratch {
  std::vector<float> q, kt, v, s, acc, m, l, z;
  explicit FwdScratch(int64_t d)
      : q(kBlock * d), kt(d * kBlock), v(kBlock * d), s(kBlock * kBlock), acc(kBlock * d), m(kBlock), l(kBlock),
        z(kBlock) {}
};

void fwd_block(const AttnDims& a, FwdScratch& w, float* o, float* lse, const float* q, const float* k,
               const float* v, int64_t bb, int64_t h, int64_t qb, const AttentionOptions& opt) {
  const int64_t d = a.d, g = h / a.group, i0 = qb * kBlock, m = std::min(kBlock, a.s - i0);
  const int64_t qstride = a.b * a.nq * d, kstride = a.b * a.ng * d;
  load_rows(w.q.data(), q + a.q_off(0, bb, h), i0, m, qstride, d);  // [m, d]
  std::fill(w.m.begin(), w.m.end(), kNegInf);
  std::fill(w.l.begin(), w.l.end(), 0.0f);
  std::fill(w.acc.begin(), w.acc.end(), 0.0f);
  for (int64_t kb = first_key_block(a, bb, qb); kb < key_blocks(a, qb, opt.causal); ++kb) {
    const int64_t j0 = kb * kBlock, n = std::min(kBlock, a.s - j0);
    load_cols(w.kt.data(), k + a.kv_off(0, bb, g), j0, n, kstride, d);  // [d, kBlock]
    load_rows(w.v.data(), v + a.kv_off(0, bb, g), j0, n, kstride, d);   // [n, d]
    tile_a_bt(w.s.data(), w.q.data(), w.kt.data(), m, d, opt.softmax_scale);  // S [m, kBlock]
    mask_tile(w.s.data(), m, i0, j0, n, opt.causal, a.doc_of(bb));
    for (int64_t i = 0; i < m; ++i) {  // online softmax: P = exp(S - m_new), rescale the running state
      float* srow = w.s.data() + i * kBlock;
      float mx = w.m[i];
      for (int64_t j = 0; j < n; ++j) mx = std::max(mx, srow[j]);
      if (mx == kNegInf) {  // the whole row is masked so far: contributes nothing
        std::fill_n(srow, kBlock, 0.0f);
        continue;
      }
      const float alpha = std::exp(w.m[i] - mx);  // 0 when m was -inf
      for (int64_t j = 0; j < kBlock; ++j) srow[j] = exp_approx(srow[j] - mx);  // vectorized
      float sum = 0.0f;
      for (int64_t j = 0; j < kBlock; ++j) sum += srow[j];
      w.l[i] = w.l[i] * alpha + sum;
      w.m[i] = mx;
      if (opt.dropout_p > 0.0f) {  // O accumulates the dropped probabilities; l keeps the undropped sum
        dropout_row(w.z.data(), a, opt, bb, h, i0 + i, j0, n);
        for (int64_t j = 0; j < kBlock; ++j) srow[j] *= w.z[j];
      }
      float* acc = w.acc.data() + i * d;
      for (int64_t x = 0; x < d; ++x) acc[x] *= alpha;
    }
    tile_acc_p_b(w.acc.data(), w.s.data(), w.v.data(), m, n, d);  // acc [m, d] += P V
  }
  for (int64_t i = 0; i < m; ++i) {
    const float inv = 1.0f / w.l[i];
    float* orow = o + a.q_off(i0 + i, bb, h);
    for (int64_t x = 0; x < d; ++x) orow[x] = w.acc[i * d + x] * inv;
    lse[(bb * a.nq + h) * a.s + i0 + i] = w.m[i] + std::log(w.l[i]);
  }
}

// Backward scratch: staged tiles for one work item.
struct BwdScratch {
  std::vector<float> q, dout, kt, vt, k, p, dp, acc0, acc1, z;
  explicit BwdScratch(int64_t d)
      : q(kBlock * d), dout(kBlock * d), kt(d * kBlock), vt(d * kBlock), k(kBlock * d), p(kBlock * kBlock),
        dp(kBlock * kBlock), acc0(kBlock * d), acc1(kBlock * d), z(kBlock) {}
};

struct BwdArgs {
  const float *q, *k, *v, *dout, *lse, *D;  // D [b, nq, s] = rowsum(dout * o)
  AttnDims a;
  AttentionOptions opt;
};

// With w.q / w.dout holding query rows i0..i0+m of head h and w.kt / w.vt key block j0..j0+n:
// w.p = P = exp(scale Q K^T - lse) (masked -> 0) and w.dp = dS = P * (dO V^T - D); with dropout,
// w.p = P z (the probabilities O was made of) and w.dp = P * (z dO V^T - D).
void recompute_ds(const BwdArgs& g, BwdScratch& w, int64_t bb, int64_t h, int64_t i0, int64_t m, int64_t j0,
                  int64_t n) {
  const int64_t d = g.a.d;
  const float* lse = g.lse + (bb * g.a.nq + h) * g.a.s + i0;
  const float* D = g.D + (bb * g.a.nq + h) * g.a.s + i0;
  tile_a_bt(w.p.data(), w.q.data(), w.kt.data(), m, d, g.opt.softmax_scale);  // S [m, kBlock]
  mask_tile(w.p.data(), m, i0, j0, n, g.opt.causal, g.a.doc_of(bb));
  tile_a_bt(w.dp.data(), w.dout.data(), w.vt.data(), m, d, 1.0f);  // dP [m, kBlock]
  for (int64_t i = 0; i < m; ++i) {
    float* prow = w.p.data() + i * kBlock;
    float* dsrow = w.dp.data() + i * kBlock;
    const float lse_i = lse[i], D_i = D[i];
    for (int64_t j = 0; j < kBlock; ++j) prow[j] = exp_approx(prow[j] - lse_i);  // vectorized
    if (g.opt.dropout_p > 0.0f) {
      float* z = w.z.data();
      dropout_row(z, g.a, g.opt, bb, h, i0 + i, j0, n);
      for (int64_t j = 0; j < kBlock; ++j) {
        dsrow[j] = prow[j] * (z[j] * dsrow[j] - D_i);
        prow[j] *= z[j];
      }
      continue;
    }
    for (int64_t j = 0; j < kBlock; ++j) dsrow[j] = prow[j] * (dsrow[j] - D_i);
  }
}

// Pass A: dK/dV rows of key block kb of kv group kvg, summed over the group's heads and all query blocks.
void bwd_dkdv_block(const BwdArgs& g, BwdScratch& w, float* dk, float* dv, int64_t bb, int64_t kvg, int64_t kb) {
  const AttnDims& a = g.a;
  const int64_t d = a.d, j0 = kb * kBlock, n = std::min(kBlock, a.s - j0);
  const int64_t qstride = a.b * a.nq * d, kstride = a.b * a.ng * d;
  load_cols(w.kt.data(), g.k + a.kv_off(0, bb, kvg), j0, n, kstride, d);  // [d, kBlock]
  load_cols(w.vt.data(), g.v + a.kv_off(0, bb, kvg), j0, n, kstride, d);  // [d, kBlock]
  std::fill(w.acc0.begin(), w.acc0.end(), 0.0f);  // dK [n, d]
  std::fill(w.acc1.begin(), w.acc1.end(), 0.0f);  // dV [n, d]
  for (int64_t h = kvg * a.group; h < (kvg + 1) * a.group; ++h) {
    for (int64_t qb = g.opt.causal ? kb : 0; qb < a.nblk(); ++qb) {
      const int64_t i0 = qb * kBlock, m = std::min(kBlock, a.s - i0);
      if (a.doc && a.doc_of(bb)[i0] >= j0 + n) break;  // this block's documents (and all later) start after the keys
      load_rows(w.q.data(), g.q + a.q_off(0, bb, h), i0, m, qstride, d);        // [m, d]
      load_rows(w.dout.data(), g.dout + a.q_off(0, bb, h), i0, m, qstride, d);  // [m, d]
      recompute_ds(g, w, bb, h, i0, m, j0, n);
      tile_acc_pt_a(w.acc1.data(), w.p.data(), w.dout.data(), m, n, d);  // dV += P^T dO
      tile_acc_pt_a(w.acc0.data(), w.dp.data(), w.q.data(), m, n, d);    // dK += dS^T Q (scale below)
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    float* dkrow = dk + a.kv_off(j0 + j, bb, kvg);
    float* dvrow = dv + a.kv_off(j0 + j, bb, kvg);
    for (int64_t x = 0; x < d; ++x) {
      dkrow[x] = g.opt.softmax_scale * w.acc0[j * d + x];
      dvrow[x] = w.acc1[j * d + x];
    }
  }
}

// Pass B: dQ rows of query block qb of head h.
void bwd_dq_block(const BwdArgs& g, BwdScratch& w, float* dq, int64_t bb, int64_t h, int64_t qb) {
  const AttnDims& a = g.a;
  const int64_t d = a.d, kvg = h / a.group, i0 = qb * kBlock, m = std::min(kBlock, a.s - i0);
  const int64_t qstride = a.b * a.nq * d, kstride = a.b * a.ng * d;
  load_rows(w.q.data(), g.q + a.q_off(0, bb, h), i0, m, qstride, d);        // [m, d]
  load_rows(w.dout.data(), g.dout + a.q_off(0, bb, h), i0, m, qstride, d);  // [m, d]
  std::fill(w.acc0.begin(), w.acc0.end(), 0.0f);  // dQ [m, d]
  for (int64_t kb = first_key_block(a, bb, qb); kb < key_blocks(a, qb, g.opt.causal); ++kb) {
    const int64_t j0 = kb * kBlock, n = std::min(kBlock, a.s - j0);
    load_cols(w.kt.data(), g.k + a.kv_off(0, bb, kvg), j0, n, kstride, d);  // [d, kBlock]
    load_cols(w.vt.data(), g.v + a.kv_off(0, bb, kvg), j0, n, kstride, d);  // [d, kBlock]
    load_rows(w.k.data(), g.k + a.kv_off(0, bb, kvg), j0, n, kstride, d);   // [n, d]
    recompute_ds(g, w, bb, h, i0, m, j0, n);
    tile_acc_p_b(w.acc0.data(), w.dp.data(), w.k.data(), m, n, d);  // dQ += dS K (scale below)
  }
  for (int64_t i = 0; i < m; ++i) {
    float* dqrow = dq + a.q_off(i0 + i, bb, h);
    for (int64_t x = 0; x < d; ++x) dqrow[x] = g.opt.softmax_scale * w.acc0[i * d + x];
  }
}

}  // namespace

void flash_attention_fwd(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttentionOptions& opt, Stream) {
  const char* op = "flash_attention_fwd";
  AttnDims a = check_qkv(op, q, k, v, lse);
  check_shape(op, "o", o, q.shape());
  check_dropout(op, opt, a.s);
  check_doc_start(op, opt, a);
  const int64_t nblk = a.nblk(), items = a.b * a.nq * nblk;
  float* po = o.data<float>();
  float* pl = lse.data<float>();
  const float *pq = q.data<float>(), *pk = k.data<float>(), *pv = v.data<float>();
#pragma omp parallel
  {
    FwdScratch w(a.d);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t qb = nblk - 1 - it % nblk;  // largest causal blocks first
      const int64_t h = (it / nblk) % a.nq, bb = it / (nblk * a.nq);
      fwd_block(a, w, po, pl, pq, pk, pv, bb, h, qb, opt);
    }
  }
}

void flash_attention_bwd(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                         const Tensor& v, const Tensor& o, const Tensor& lse, const AttentionOptions& opt, Stream) {
  const char* op = "flash_attention_bwd";
  AttnDims a = check_qkv(op, q, k, v, lse);
  check_doc_start(op, opt, a);
  check_shape(op, "o", o, q.shape());
  check_shape(op, "dout", dout, q.shape());
  check_shape(op, "dq", dq, q.shape());
  check_shape(op, "dk", dk, k.shape());
  check_shape(op, "dv", dv, k.shape());
  check_dropout(op, opt, a.s);
  // D[b, nq, s] = rowsum(dout * o): O(s) extra memory, never [s, s].
  std::vector<float> D(static_cast<size_t>(a.b * a.nq * a.s));
  const float *po = o.data<float>(), *pdo = dout.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < a.b * a.nq * a.s; ++r) {
    const int64_t i = r % a.s, h = (r / a.s) % a.nq, bb = r / (a.s * a.nq);
    const float *orow = po + a.q_off(i, bb, h), *dorow = pdo + a.q_off(i, bb, h);
    float sum = 0.0f;
    for (int64_t x = 0; x < a.d; ++x) sum += orow[x] * dorow[x];
    D[r] = sum;
  }
  const BwdArgs g{q.data<float>(), k.data<float>(), v.data<float>(), pdo, lse.data<float>(), D.data(), a, opt};
  const int64_t nblk = a.nblk();
  float *pdq = dq.data<float>(), *pdk = dk.data<float>(), *pdv = dv.data<float>();
#pragma omp parallel
  {
    BwdScratch w(a.d);
    // Pass A: each (b, kv group, key block) owns its dK/dV rows; causal key block kb has nblk - kb query
    // blocks of work, so the smallest kb (most work) goes first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < a.b * a.ng * nblk; ++it)
      bwd_dkdv_block(g, w, pdk, pdv, it / (nblk * a.ng), (it / nblk) % a.ng, it % nblk);
    // Pass B: each (b, head, query block) owns its dQ rows; the largest causal query blocks first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < a.b * a.nq * nblk; ++it)
      bwd_dq_block(g, w, pdq, it / (nblk * a.nq), (it / nblk) % a.nq, nblk - 1 - it % nblk);
  }
}

}  // namespace mcpp::ops::cpu
