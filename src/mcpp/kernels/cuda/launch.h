// The boundary between the CUDA backend's host code (*.cpp: argument checks, Tensor, mcpp::Error, fmt)
// and its device code (*.cu: kernels and their launchers). This header is plain C++ and CUDA runtime
// only, so nvcc never parses fmt or the Tensor headers (keeps CI compile time low and nvcc's C++20
// front end away from fmt 9). Each launcher runs one op's kernels on `stream` and checks the launch.
//
// FIn / FOut read and write element i of a float32, bfloat16 or float16 buffer as float. The kind is a
// kernel argument, uniform across the launch, so one kernel serves every dtype (no dtype template
// matrix). bf16/f16 stores round to nearest even, as core/dtype.h does. Math is float32 throughout.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define MCPP_DEV __device__ __forceinline__
#endif

namespace mcpp::cuda_detail {

enum Kind : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

struct FIn {
  const void* p;
  int kind;
#ifdef __CUDACC__
  MCPP_DEV float operator[](int64_t i) const {
    if (kind == kBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    if (kind == kF16) return __half2float(static_cast<const __half*>(p)[i]);
    return static_cast<const float*>(p)[i];
  }
#endif
};

struct FOut {
  void* p;
  int kind;
#ifdef __CUDACC__
  MCPP_DEV float get(int64_t i) const { return FIn{p, kind}[i]; }
  MCPP_DEV void set(int64_t i, float v) const {
    if (kind == kBF16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
    else if (kind == kF16) static_cast<__half*>(p)[i] = __float2half_rn(v);
    else static_cast<float*>(p)[i] = v;
  }
#endif
};

// Throw mcpp::Error naming file:line when the last launch / a runtime call failed (device_memory.cpp).
void check_launch(const char* file, int line);
void check_runtime(cudaError_t e, const char* expr, const char* file, int line);

// ---- qkv_kernels.cu: Megatron's fused QKV rows <-> q/k/v heads (see ops.inc qkv_split / qkv_merge).
// sb = s * b tokens; r = nq / ng; to_heads: qkv -> q, k, v, else q, k, v -> qkv.
struct QkvShape {
  int64_t sb, nq, ng, d;
};
void launch_qkv_split(FOut q, FOut k, FOut v, FIn qkv, const QkvShape& a, cudaStream_t s);
void launch_qkv_merge(FOut qkv, FIn q, FIn k, FIn v, const QkvShape& a, cudaStream_t s);

// ---- mla_kernels.cu: multi-latent attention's query / key / value assembly and its backward (ops.inc mla_qkv_*).
struct MlaShape {
  int64_t sb, n, dn, dr, dv, dc, c;  // tokens s * b, heads, head dims (ops.inc), the latent's width
};
void launch_mla_qkv_fwd(FOut query, FOut key, FOut value, FIn q, FIn kv, FIn kv_latent, const float* cos,
                        const float* sin, int64_t b, const MlaShape& m, cudaStream_t s);
void launch_mla_qkv_bwd(FOut dq, FOut dkv, FOut dk_pe, FIn dquery, FIn dkey, FIn dvalue, const float* cos,
                        const float* sin, int64_t b, const MlaShape& m, cudaStream_t s);

// ---- elementwise_kernels.cu
void launch_add(FOut out, FIn a, FIn b, int64_t n, cudaStream_t s);
void launch_bias_add_inplace(FOut y, FIn bias, int64_t n, int64_t m, cudaStream_t s);  // y[n, m] += bias[m]
void launch_axpby_inplace(FOut y, FIn x, float alpha, float beta, int64_t n, cudaStream_t s);  // y = a y + b x
void launch_cast(FOut out, FIn in, int64_t n, cudaStream_t s);
// db[out] += sum over n rows of dy[n, out], deterministic; partial: fp32 scratch [column_sum_parts(n), out]
int64_t column_sum_parts(int64_t n);
void launch_column_sum_acc(float* db, FIn dy, int64_t n, int64_t out, float* partial, cudaStream_t s);
// The ordered fold behind every column sum (bias grads, norm dgamma / dbeta / residual sums): for each
// target t < targets with acc[t] non-null, acc[t][c] += sum over p < parts of partial[(t parts + p) cols + c],
// the parts added p = y, y + 32, ... per lane y, then the 32 lanes in order (fixed for a given parts count).
struct ColumnReduceTargets {
  float* acc[4];
};
void launch_column_reduce_acc(const ColumnReduceTargets& t, int targets, const float* partial, int64_t parts,
                              int64_t cols, cudaStream_t s);

// ---- activations_kernels.cu
void launch_gelu_fwd(FOut y, FIn x, int64_t n, cudaStream_t s);
void launch_gelu_bwd(FOut dx, FIn dy, FIn x, int64_t n, cudaStream_t s);
void launch_swiglu_fwd(FOut y, FIn x, int64_t rows, int64_t f, cudaStream_t s);
void launch_swiglu_bwd(FOut dx, FIn dy, FIn x, int64_t rows, int64_t f, cudaStream_t s);
// keep element i iff philox_uniform_at({seed, offset + *base}, i) >= p (base: device uint64 or nullptr);
// kept values scaled by `scale`
void launch_dropout(FOut y, FIn x, float p, float scale, uint64_t seed, uint64_t offset, const uint64_t* base,
                    int64_t n, cudaStream_t s);
// ops.inc random_normal (Box-Muller in float64 from words 2i, 2i + 1) and random_scale (y = x fma(width, u_i, lo))
// at the key {seed, offset + *base}
void launch_random_normal(FOut out, uint64_t seed, uint64_t offset, const uint64_t* base, int64_t n, cudaStream_t s);
void launch_random_scale(FOut y, FIn x, float lo, float width, uint64_t seed, uint64_t offset, const uint64_t* base,
                         int64_t n, cudaStream_t s);

// ---- embedding_kernels.cu
void launch_embedding_fwd(FOut out, const int32_t* ids, FIn table, int64_t n, int64_t v, int64_t h,
                          int64_t vocab_start, cudaStream_t s);
// ordered: every table row owned by one block adding its tokens in position order (deterministic)
void launch_embedding_bwd(float* dtable, const int32_t* ids, FIn dout, int64_t n, int64_t v, int64_t h,
                          int64_t vocab_start, bool ordered, cudaStream_t s);

// ---- moe_kernels.cu (ops.inc's moe_* contracts; idx [n, k] int32, w / dw float32 [n, k], w == nullptr: ones)
void launch_moe_permute(FOut out, FIn x, const int32_t* idx, int64_t n, int64_t k, int64_t h, cudaStream_t s);
void launch_moe_unpermute(FOut y, FIn in, const int32_t* idx, const float* w, int64_t n, int64_t k, int64_t h,
                          cudaStream_t s);
void launch_moe_unpermute_bwd(FOut din, float* dw, FIn dy, FIn in, const int32_t* idx, const float* w, int64_t n,
                              int64_t k, int64_t h, cudaStream_t s);
// The router's options (ops.h MoeTopkOptions) as the kernels read them; num_groups <= kMaxGroups.
constexpr int64_t kMaxGroups = 64;
struct MoeTopkArgs {
  bool pre_softmax = false, sigmoid = false;
  int64_t num_groups = 0, group_topk = 0;
  const float* expert_bias = nullptr;  // [E] device, or null
  const float* logit_bias = nullptr;   // [E] device, or null (sinkhorn routing: the experts by logits + it)
};
void launch_moe_topk_softmax(int32_t* topk, float* probs, float* scores, float* lse, FIn logits, int64_t n, int64_t e,
                             int64_t k, const MoeTopkArgs& a, cudaStream_t s);
// aux_grad [aux_rows, E]: token t reads row t % aux_rows (ops.inc)
void launch_moe_topk_softmax_bwd(FOut dlogits, const float* dprobs, const float* probs, const int32_t* topk,
                                 const float* scores, const float* lse, const float* aux_grad, int64_t aux_rows,
                                 int64_t n, int64_t e, int64_t k, const MoeTopkArgs& a, float z_coef, cudaStream_t s);
// log_d1 [e] float32 (overwritten; ops.inc moe_sinkhorn), d0 [n] and cost [n, e] float32 scratch; e <= 1024
void launch_moe_sinkhorn(float* log_d1, float* d0, float* cost, const float* logits, int64_t n, int64_t e, float tol,
                         int max_iter, cudaStream_t s);
// counts [g, e] float32 (overwritten): the routes (of tokens t % g == row), only those with idx >= 0 when idx is set
void launch_moe_route_counts(float* counts, const int32_t* topk, const int32_t* idx, int64_t routes, int64_t k,
                             int64_t g, int64_t e, cudaStream_t s);
// counts [e] int64 (overwritten), idx [routes] int32: the expert-major rows (ops.inc moe_route_positions);
// scratch: moe_route_positions_scratch(routes, e) int32 (0: none needed)
int64_t moe_route_positions_scratch(int64_t routes, int64_t e);
void launch_moe_route_positions(int32_t* idx, int64_t* counts, const int32_t* topk, int64_t routes, int64_t e,
                                int32_t* scratch, cudaStream_t s);
// ops.inc moe_capacity_positions: idx [routes] int32 in: the dropless rows, out: the capacity rows; kept [e] int64;
// keys / route [routes]: scratch
void launch_moe_capacity_positions(int32_t* idx, int64_t* kept, const int64_t* counts, const float* probs,
                                   uint32_t* keys, int32_t* route, int64_t routes, int64_t e, int64_t capacity,
                                   bool by_probs, bool pad, cudaStream_t s);

// ---- norms_kernels.cu (mean == nullptr / beta.p == nullptr: RMSNorm / no bias)
// A residual branch's dropout (ops::ResidualDropout): element i of the branch is kept iff the uniform of word
// i % 4 of Philox counter offset (+ *base when base != nullptr, read when the kernel runs) + i / 4 is >= p,
// and kept ones are scaled by scale = 1 / (1 - p) (as launch_dropout). p == 0: off.
struct NormDrop {
  float p = 0.0f, scale = 0.0f;
  uint64_t seed = 0, offset = 0;
  const uint64_t* base = nullptr;
  bool on() const { return p > 0.0f; }
};
// fwd: res.p != nullptr fuses the residual add: sum = x + res (rounded to sum's kind, as launch_add), and y is
// the norm of that rounded sum; res.p == nullptr: plain norm of x (sum unused). drop.on() (needs res): res is
// first replaced by launch_dropout's output of it (rounded to res's kind), never stored.
// y.p null: the statistics (and the sum) only.
void launch_norm_fwd(FOut y, FOut sum, float* mean, float* rstd, FIn x, FIn res, FIn gamma, FIn beta, int64_t n,
                     int64_t h, float eps, cudaStream_t s, const NormDrop& drop = {});
// Whether launch_norm_fwd over rows of h with these pointers takes its 16-byte path, whose y is norm_apply
// (activation_math.cuh) of the statistics it writes.
bool norm_fwd_vector_path(int64_t h, std::initializer_list<const void*> ptrs);
// bwd: dx = norm_bwd(dy) (+ dres when dres.p != nullptr); with dres and drop.on(), also dbranch = the dropout
// backward of dx as stored (launch_dropout on it); with dres, dres_sum / dx_sum (nullable) += the column
// sums of dres and of the branch's gradient as stored (dbranch with drop, else dx) (`sums` = either
// requested). `partial` = fp32 scratch of norm_bwd_scratch_floats(n, h, parts, sums) floats (16-byte
// aligned; parts = norm_bwd_partial_blocks(..) with the same arguments) for the deterministic reductions:
// the vector path's per-block rows, or the scalar path's per-256-row-chunk rows.
int64_t norm_bwd_partial_blocks(int64_t n, int64_t h, FOut dx, FIn dy, FIn x, FIn dres, FIn gamma, bool sums,
                                FOut dbranch = {nullptr, 0});
int64_t norm_bwd_scratch_floats(int64_t n, int64_t h, int64_t parts, bool sums);
void launch_norm_bwd(FOut dx, float* dgamma, float* dbeta, FIn dy, FIn x, FIn dres, FIn gamma, const float* mean,
                     const float* rstd, int64_t n, int64_t h, float* dres_sum, float* dx_sum, float* partial,
                     int64_t parts, cudaStream_t s, FOut dbranch = {nullptr, 0}, const NormDrop& drop = {});

// ---- rope_kernels.cu (sign = +1 forward rotation, -1 its transpose)
void launch_rope(FOut y, FIn x, const float* cos, const float* sin, int64_t s_len, int64_t b, int64_t heads,
                 int64_t d, int64_t half, float sign, cudaStream_t s);
// qkv_split_rope (split) / qkv_merge_rope in one kernel: the fused rows fused_out / fused_in, the heads q/k/v_out or
// _in (the unused side's pointers null); tokens t = s_i * b + b_i. false (nothing launched): the 16-byte vector
// layout does not apply (half or d not a multiple of 8, unaligned) — the caller composes the ops.
bool launch_qkv_rope(bool split, FOut fused_out, FOut q_out, FOut k_out, FOut v_out, FIn fused_in, FIn q_in, FIn k_in,
                     FIn v_in, const float* cos, const float* sin, const QkvShape& a, int64_t b, int64_t half,
                     cudaStream_t s);

// ---- softmax_kernels.cu
void launch_softmax_fwd(FOut probs, FIn scores, int64_t rows, int64_t sq, int64_t sk, float scale, bool causal,
                        cudaStream_t s);
void launch_softmax_bwd(FOut dscores, FIn dprobs, FIn probs, int64_t rows, int64_t sk, float scale, cudaStream_t s);
void launch_cross_entropy_fwd(float* loss, float* lse, FIn logits, const int32_t* targets, int64_t n, int64_t v,
                              cudaStream_t s);
void launch_cross_entropy_bwd(FOut dlogits, const float* dloss, FIn logits, const int32_t* targets, const float* lse,
                              int64_t n, int64_t v, cudaStream_t s);
// false: no fused kernel for this shape / dtype / alignment (the caller runs fwd then bwd).
bool launch_cross_entropy_fwd_bwd(float* loss, float* lse, FOut dlogits, const float* dloss, FIn logits,
                                  const int32_t* targets, int64_t n, int64_t v, cudaStream_t s);
void launch_masked_loss_stats(float* stats, const float* loss, const float* mask, int64_t n, cudaStream_t s);
void launch_masked_loss_grad(float* dloss, const float* mask, const float* stats, float grad_scale, bool per_token,
                             int64_t n, cudaStream_t s);
// ---- vocab_parallel_ce_kernels.cu
void launch_vocab_parallel_ce_partials(float* row_max, float* sum_exp, float* target_logit, FIn logits,
                                       const int32_t* targets, int64_t n, int64_t v, int64_t vocab_start,
                                       cudaStream_t s);
void launch_vocab_parallel_ce_bwd(FOut dlogits, const float* dloss, FIn logits, const int32_t* targets,
                                  const float* lse, int64_t n, int64_t v, int64_t vocab_start, cudaStream_t s);
// step 0: out = a + log(b); 1: out = exp(a - b); 2: out2 = a + log(b), out = out2 - c (loss, lse)
void launch_vocab_parallel_ce_combine(int step, float* out, const float* a, const float* b, const float* c, float* out2,
                                      int64_t n, cudaStream_t s);

// ---- attention_kernels.cu: q[s,b,nq,d], k/v[s,b,ng,d], o[s,b,nq,d], lse[b,nq,s]; d a multiple of 8 up to 256
// (the fp32 CUDA-core kernels; (s + 15) / 16 <= 65535). The tensor-core kernels below: d in {64, 128}.
struct AttnShape {
  int64_t s, b, nq, ng, d;
  float scale;
  bool causal;
  // Tensor-core kernels only: where q/dq and k/v/dk/dv live. Query head h = g * (nq / ng) + j of token i,
  // batch bb is at i * q_row + bb * q_batch + g * q_group + j * d from the q (dq) pointer; kv group g at
  // i * kv_row + bb * kv_batch + g * kv_group from the k, v (dk, dv) pointers. o / dout are always
  // [s, b, nq, d]. split_layout(): q[s, b, nq, d], k/v[s, b, ng, d] (separate tensors); packed_layout():
  // Megatron's fused qkv [s, b, ng, (nq / ng + 2) d] with k = qkv + (nq / ng) d and v = k + d.
  int64_t q_row = 0, q_batch = 0, q_group = 0, kv_row = 0, kv_batch = 0, kv_group = 0;
  // Attention dropout (ops::AttentionOptions; device side: philox.cuh AttnDropout). drop_p = 0: off.
  float drop_p = 0.0f;
  uint64_t drop_seed = 0, drop_offset = 0;
  const uint64_t* drop_base = nullptr;  // CUDA-graph key: device offset base added when the kernel runs
  // The mask's sequence length and this block's place in it (AttentionOptions::dropout_seq_length and offsets;
  // set_attention_dropout: drop_s = s and 0 offsets for a plain call). drop_aligned: drop_s % 4 == 0 and
  // drop_j0 % 4 == 0 (a key's flat index % 4 = key % 4: the mma kernels' shared Philox counters).
  int64_t drop_s = 0, drop_i0 = 0, drop_j0 = 0;
  bool drop_aligned = false;
  // Document masking (AttentionOptions::doc_start, packed sequences): device int32 [b, s]; query i of sample bb
  // also masks keys j < doc[bb * s + i]. CUDA-core kernels only (the dispatch sends such calls there); null: off.
  const int32_t* doc = nullptr;
  AttnShape& split_layout() {
    q_row = b * nq * d, q_batch = nq * d, q_group = (nq / ng) * d;
    kv_row = b * ng * d, kv_batch = ng * d, kv_group = d;
    return *this;
  }
  AttnShape& packed_layout() {
    kv_group = q_group = (nq / ng + 2) * d;
    kv_batch = q_batch = ng * q_group;
    kv_row = q_row = b * q_batch;
    return *this;
  }
};
void launch_attention_fwd(FOut o, float* lse, FIn q, FIn k, FIn v, const AttnShape& a, cudaStream_t s);
// out[0] = seed, out[1] = offset + *base (base may be null), written when the stream reaches it (cuDNN's
// attention dropout reads its Philox seed / offset from device memory; CUDA-graph keys add the base then).
void launch_philox_args(int64_t* out, uint64_t seed, uint64_t offset, const uint64_t* base, cudaStream_t s);
// delta: float32 scratch [b, nq, s] (rowsum(dout * o)).
void launch_attention_bwd(FOut dq, FOut dk, FOut dv, FIn dout, FIn q, FIn k, FIn v, FIn o, const float* lse,
                          float* delta, const AttnShape& a, cudaStream_t s);
// GQA around an MHA backward (bf16, d % 8 == 0, 16-byte aligned): k/v [kv layout of a, ng groups] ->
// k_exp/v_exp contiguous [s, b, nq, d] (group g repeated for its nq / ng heads); dk/dv [kv layout] = the
// per-group sums of dk_exp/dv_exp [s, b, nq, d] (fp32, heads in order, one bf16 rounding).
void launch_gqa_expand_kv(void* k_exp, void* v_exp, const void* k, const void* v, const AttnShape& a,
                          cudaStream_t s);
void launch_gqa_reduce_dkv(void* dk, void* dv, const void* dk_exp, const void* dv_exp, const AttnShape& a,
                           cudaStream_t s);
// attention_merge (ring context parallelism): o_acc float32 [rows, d], lse_acc / lse_blk float32 [b * nq, s]
// where rows = s * b * nq (row = (i * b + bb) * nq + h reads lse index (bb * nq + h) * s + i).
void launch_attention_merge(float* o_acc, float* lse_acc, FIn o_blk, const float* lse_blk, int64_t s, int64_t bnq,
                            int64_t d, cudaStream_t st);

// ---- kv_cache_kernels.cu (ops.inc kv_cache_*): caches [cap, b, ng, d], step tensors [sq, b, n, d], lengths int32 [b]
// on the device (rows cached before the step). append: rows >= cap are skipped; attention: 0 < d <= 256, keys
// j <= min(lengths[bb] + i, cap - 1) of query i.
struct KvShape {
  int64_t sq, b, nq, ng, d, cap;
};
void launch_kv_cache_append(FOut k_cache, FOut v_cache, FIn k, FIn v, const int32_t* lengths, const KvShape& a,
                            cudaStream_t s);
void launch_kv_cache_attention(FOut o, FIn q, FIn k_cache, FIn v_cache, const int32_t* lengths, float scale,
                               const KvShape& a, cudaStream_t s);

// ---- attention_mma_{fwd,bwd}_kernels.cu: the same ops on tensor cores, every tensor bf16 (void* = bf16*),
// 16-byte aligned, q/k/v/dq/dk/dv addressed by the AttnShape layout fields; (s + 63) / 64 <= 65535. bwd: delta scratch as above; dk/dv overwritten.
void launch_attention_fwd_mma(void* o, float* lse, const void* q, const void* k, const void* v, const AttnShape& a,
                              cudaStream_t s);
void launch_attention_bwd_mma(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                              const void* v, const void* o, const float* lse, float* delta, const AttnShape& a,
                              cudaStream_t s);

// ---- optimizer_kernels.cu
struct AdamWCoeffs {
  float decay, beta1, beta2, one_minus_b1, one_minus_b2, eps, bc2_sqrt, step_size, grad_scale;
};
void launch_adamw(float* param, float* m, float* v, const float* grad, FOut model, const AdamWCoeffs& c, int64_t n,
                  cudaStream_t s);
// Multi-tensor AdamW: one launch per table of up to kAdamMaxTensors tensors / kAdamMaxChunks chunks of
// kAdamChunk elements (passed by value as the kernel argument, < 4 KB); block b updates chunk
// chunk_index[b] of tensor chunk_tensor[b]. vec4: every pointer 16-byte aligned (8 for a 2-byte model).
constexpr int kAdamMaxTensors = 32, kAdamMaxChunks = 320;
constexpr int64_t kAdamChunk = 65536;
struct AdamWTensorArgs {
  float* p;
  float* m;
  float* v;
  const float* g;
  void* model;  // nullptr: no model copy
  int64_t n;
  float decay;  // 1 - lr * weight_decay (this tensor's)
  int model_kind;
  int vec4;
};
struct AdamWMultiArgs {
  AdamWTensorArgs t[kAdamMaxTensors];
  int32_t chunk_index[kAdamMaxChunks];
  uint8_t chunk_tensor[kAdamMaxChunks];
  int blocks;
};
void launch_adamw_multi(const AdamWMultiArgs& a, const AdamWCoeffs& c, cudaStream_t s);
// partial: scratch of kReduceBlocks doubles; result: one double (device). Deterministic order.
constexpr int kReduceBlocks = 1024;
void launch_sum_of_squares(double* result, double* partial, FIn x, int64_t n, cudaStream_t s);
void launch_has_non_finite(int* flag, FIn x, int64_t n, cudaStream_t s);  // *flag must be 0 before

}  // namespace mcpp::cuda_detail

#define MCPP_CUDA_LAUNCH_CHECK() ::mcpp::cuda_detail::check_launch(__FILE__, __LINE__)
#define MCPP_CUDA_CHECK_RT(expr) ::mcpp::cuda_detail::check_runtime((expr), #expr, __FILE__, __LINE__)
