// Kernel interface (DESIGN.md decision 4): each op declared once in ops.inc; this header instantiates
// the list three times. Callers use mcpp::ops::<op>, which dispatches on the output tensor's device to
// mcpp::ops::cpu::<op> (kernels/cpu, the reference) or mcpp::ops::cuda::<op> (kernels/cuda, or the
// stub in a build without CUDA).
#pragma once
#include <cstdint>
#include <vector>

#include "mcpp/core/rng.h"
#include "mcpp/core/stream.h"
#include "mcpp/core/tensor.h"

namespace mcpp::ops {

struct GemmOptions {
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;
};

// How a backward op writes its parameter-gradient outputs: Accumulate (+=, across microbatches into the fp32
// main grads) or Overwrite (=, the step's first write into a main grad whose old contents are stale:
// ParamAndGradBuffer::set_overwrite_main_grad). Overwrite equals Accumulate into a zeroed output.
enum class GradWrite { Accumulate, Overwrite };

struct AttentionOptions {
  float softmax_scale = 1.0f;  // usually 1/sqrt(d)
  bool causal = true;
  // CUDA bf16 calls run cuDNN's fused attention where it has an engine: false = its fastest backward (dQ
  // added with atomics: not bit-identical run to run); true = its deterministic backward graph (bitwise
  // repeatable, slower), or the mcpp kernels where cuDNN has none. CPU: always deterministic.
  bool deterministic = false;
  // Attention dropout on the softmax probabilities (Megatron's --attention-dropout): element (bb, h, i, j) of
  // the [b, nq, s, s] probabilities is kept iff philox_uniform_at(dropout_key, ((bb nq + h) s + i) s + j) >=
  // dropout_p, and kept ones are scaled by 1 / (1 - dropout_p) — the mask ops::dropout_fwd draws with the
  // same key over the unfused path's [b * nq, s, s] probs, drawn here per tile and never stored. lse stays
  // the undropped softmax's; the backward regenerates the mask from the same key. 0 <= dropout_p < 1; 0 =
  // off (the key is ignored). CUDA: the mcpp kernels draw exactly this mask; cuDNN's fused attention (the
  // bf16 default where it has an engine) draws its own Philox numbers from the key's seed and offset — the
  // same rate, another mask (kernels/cudnn/cudnn_attention.cpp). A key with a device base (CUDA graphs) is
  // read when the kernels run.
  float dropout_p = 0.0f;
  PhiloxKey dropout_key{};
  // Where this call's [s, s] block lies in a longer sequence's mask (ring context parallelism: every block of
  // queries x keys draws the unsplit run's mask): element (bb, h, i, j) takes the mask of (bb, h, i + row offset,
  // j + col offset) in a [b, nq, S, S] mask, S = dropout_seq_length (0: S = s, offsets 0). CUDA: such calls run the
  // mcpp kernels (cuDNN's RNG cannot draw this mask).
  int64_t dropout_seq_length = 0;
  int64_t dropout_row_offset = 0, dropout_col_offset = 0;
  // Document masking of packed sequences (Megatron's --reset-attention-mask, packed_seq_params' cu_seqlens):
  // int32 [b, s] on the op's device, doc_start[bb, i] = the first position of the document that holds position i
  // of sample bb (0 <= doc_start[bb, i] <= i, non-decreasing in i). Query i then attends keys j with
  // doc_start[bb, i] <= j <= i: each document of the row attends only within itself. Causal only; undefined:
  // one document a sample. Built by transformer/packed_seq_params.h; checked there (the CPU kernels check too).
  Tensor doc_start{};
};

// mcpp::Error naming `op` unless doc_start (when defined) is int32 [b, s] on `device` and the call is causal.
void check_attention_doc_start(const char* op, const AttentionOptions& opt, int64_t b, int64_t s, Device device);

// mcpp::Error naming `op` unless the block placement of `opt` fits an [s, s] call: with dropout_seq_length 0 the
// offsets are 0; else both offsets are >= 0 and offset + s <= dropout_seq_length.
void check_attention_dropout_block(const char* op, const AttentionOptions& opt, int64_t s);

// Dropout on the residual branch b of a fused add + norm (Megatron's bias-dropout-add with hidden dropout):
// the op adds dropout_fwd(b, p, key) instead of b — the same mask (over b's flat index) and the same values,
// rounded to b's dtype, as that op's output. 0 <= p <= 1; p == 0 is off (the key is ignored).
struct ResidualDropout {
  float p = 0.0f;
  PhiloxKey key{};
  bool active() const { return p > 0.0f; }
};

struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;  // 1-based, for bias correction
  // Every grad is multiplied by this (one fp32 rounding) before the update: the grad-clip coefficient,
  // folded into the optimizer's pass instead of a separate scale of the fp32 grads (same values as
  // scale_inplace(grad, grad_scale) then the step; grad itself is left unscaled). Finite, >= 0.
  float grad_scale = 1.0f;
};

// The MoE router ops (moe_topk_softmax / _bwd): pre_softmax = Megatron's --moe-router-pre-softmax (top-k of the
// softmax over all experts, not renormalized); z_coef (backward): the router z-loss's per-token coefficient;
// sigmoid = --moe-router-score-function sigmoid (DeepSeek-V3); num_groups / group_topk = --moe-router-num-groups /
// --moe-router-group-topk (group-limited routing; 0 = off). See ops.inc.
// expert_bias: --moe-router-enable-expert-bias (sigmoid only): float32 [E] on the logits' device added to the scores
// for choosing the experts (and the groups), not to the probabilities; undefined = none.
// logit_bias: --moe-router-load-balancing-type sinkhorn in training: float32 [E] on the logits' device added to the
// LOGITS for choosing the experts (moe_sinkhorn's log d1: the per-token order of Megatron's sinkhorn(logits)), not to
// the probabilities; only with pre_softmax, or sigmoid at top-1 (Megatron's sinkhorn activations); not with an
// expert bias or groups; undefined = none.
struct MoeTopkOptions {
  bool pre_softmax = false;
  float z_coef = 0.0f;
  bool sigmoid = false;
  int64_t num_groups = 0;
  int64_t group_topk = 0;
  Tensor expert_bias{};
  Tensor logit_bias{};
};
constexpr int64_t kMaxSinkhornExperts = 1024;  // moe_sinkhorn's (one thread block holds a column each)
constexpr int kMaxSinkhornIterations = 1000;   // Megatron's loop has no bound; ours stops there
constexpr int64_t kMaxMoeRouterGroups = 64;
// mcpp::Error naming `op` unless the options fit E experts and top-k: not both sigmoid and pre_softmax; an expert
// bias only with sigmoid, float32 [E]; a logit bias float32 [E] only with pre_softmax or sigmoid at top-1, without an
// expert bias or groups; with groups,
// 1 <= num_groups <= kMaxMoeRouterGroups dividing E, 1 <= group_topk <= min(num_groups, k), and the kept groups
// hold at least k experts (group_topk * E / num_groups >= k).
void check_moe_topk_options(const char* op, const MoeTopkOptions& opt, int64_t num_experts, int64_t topk);

// The sizes of an mla_qkv_fwd / mla_qkv_bwd call (ops.inc), checked by both backends: the shapes agree, dc covers
// dn + dr and dv, the rotary tables are float32 [s, dr/2], the activations share one dtype (`fp32_only`: float32).
// `latent` is kv_latent [s, b, c] (forward) or dk_pe [s, b, dr] (backward, latent_is_pe).
struct MlaQkvShape {
  int64_t s, b, n, dn, dr, dv, dc, c;
};
MlaQkvShape check_mla_qkv(const char* op, const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& q,
                          const Tensor& kv, const Tensor& latent, bool latent_is_pe, const Tensor& cos,
                          const Tensor& sin, bool fp32_only);
// The sizes of a kv_cache_append / kv_cache_attention call (ops.inc), checked by both backends: step [sq, b, n, d]
// (k for the append: n = ng; q for the attention: n = nq, a multiple of ng), the caches [cap, b, ng, d] of one dtype
// and shape, lengths int32 [b]. The dtypes of the step and the caches: the caller's backend checks them.
struct KvCacheShape {
  int64_t sq, b, nq, ng, d, cap;
};
KvCacheShape check_kv_cache(const char* op, const Tensor& step, const Tensor& k_cache, const Tensor& v_cache,
                            const Tensor& lengths);
// copy_columns' checks (both backends): rows agree, the column ranges fit, one dtype. Returns the rows.
int64_t check_copy_columns(const Tensor& y, const Tensor& x, int64_t y_offset, int64_t x_offset, int64_t width);

// moe_topk_softmax_bwd's aux_grad: float32 [E] or [G, E] (mcpp::Error naming `op` otherwise); returns G (1 for [E]).
int64_t moe_aux_grad_rows(const char* op, const Tensor& aux_grad, int64_t num_experts);

// moe_capacity_positions (Megatron's --moe-expert-capacity-factor): each expert keeps at most `capacity` routes —
// by_probs: those of the highest probabilities ("probs" drop policy), else the first in token order ("position");
// pad (--moe-pad-expert-input-to-capacity): every expert's block of the buffer is `capacity` rows.
struct MoeCapacityOptions {
  int64_t capacity = 0;
  bool by_probs = true;
  bool pad = false;
};

// The most groups of one grouped_linear_* call (ops.inc; the CUDA kernels take the per-group pointers by value).
constexpr int64_t kMaxGemmGroups = 128;
// The sizes of a grouped_linear_* call, checked by both backends (mcpp::Error naming `op`): x [m, in], y [m, out],
// counts int64 [G] (1 <= G <= kMaxGemmGroups), w / dw G tensors [out, in], bias empty or G tensors [out].
struct GroupedLinearShape {
  int64_t m, in, out, groups;
};
GroupedLinearShape check_grouped_linear(const char* op, const Tensor& x, const Tensor& y, const std::vector<Tensor>& w,
                                        const std::vector<Tensor>& bias, const Tensor& counts);

// One parameter (or shard piece) of adamw_multi_step: handles sharing storage with the caller's tensors.
// param_model undefined = no model copy; weight_decay replaces opt.weight_decay for this entry.
struct AdamWTensors {
  Tensor param, exp_avg, exp_avg_sq, grad, param_model;
  float weight_decay = 0.0f;
};

// Which path the CUDA linear_gelu_fwd / linear_dgelu_bwd calls took in this process (tests and the kernel
// bench read it; all zero in a build without CUDA). fwd: GELU_AUX(_BIAS) epilogue vs linear_fwd + gelu_fwd;
// bwd: DGELU_BGRAD (fp32 bias grad in the epilogue), DGELU + column sum, or GEMM + gelu_bwd + column sum.
struct EpilogueFusionCounts {
  int64_t fwd_fused = 0, fwd_fallback = 0;
  int64_t bwd_dgelu_bgrad = 0, bwd_dgelu = 0, bwd_fallback = 0;
};
EpilogueFusionCounts cuda_epilogue_fusion_counts();

// Which path the CUDA grouped_linear_* calls with host counts took in this process (tests and benches read it; zero
// in a build without CUDA): one cuBLASLt pointer-array batched GEMM (batched_epilogue of them with a bias / GELU /
// gelu' epilogue), or one GEMM per group.
struct GroupedGemmPathCounts {
  int64_t batched = 0, batched_epilogue = 0, per_group = 0;
};
GroupedGemmPathCounts cuda_grouped_gemm_path_counts();

// How many CUDA attention calls ran on cuDNN's fused flash attention in this process (tests; all zero
// without CUDA or cuDNN). bwd_gqa: backward calls with nq != ng among bwd; bwd_gqa_repeat: those of them
// without an engine for the native GQA graph, run as the MHA graph on k/v repeated to nq heads.
// The plan cache (one cuDNN plan per direction, shape and layout; --variable-seq-lengths makes one per
// length): plans cached now, built so far, evicted so far (least recently used first beyond the capacity).
struct CudnnAttentionCounts {
  int64_t fwd = 0, bwd = 0, bwd_gqa = 0, bwd_gqa_repeat = 0;
  int64_t plans_cached = 0, plans_built = 0, plans_evicted = 0;
};
CudnnAttentionCounts cuda_cudnn_attention_counts();
// Sets the plan cache's capacity (>= 1; default kDefaultCudnnPlanCacheCapacity), evicting the least recently
// used plans beyond it; returns the previous capacity. No-op returning 0 without cuDNN.
constexpr int64_t kDefaultCudnnPlanCacheCapacity = 64;
int64_t set_cudnn_plan_cache_capacity(int64_t capacity);

// ---- FP8 (Transformer Engine's per-tensor scaling; ops.inc fp8_*). Formats: E4M3 (e4m3fn: max 448, no inf) and
// E5M2 (max 57344). A cast computes q = fp8(float(x) * scale) with round-to-nearest-even and saturation to +-max
// (NaN stays NaN): CUDA's __NV_SATFINITE conversion; the CPU backend emulates it exactly in float.
enum class Fp8Format { E4M3, E5M2 };
constexpr float fp8_max(Fp8Format f) { return f == Fp8Format::E4M3 ? 448.0f : 57344.0f; }
// The emulated cast of one value (the CPU backend's and the tests' reference): v rounded to the format.
float fp8_round(float v, Fp8Format f);

// An activation an FP8 operand applies to the tensor it is given before the cast (Transformer Engine fuses the same
// into its casts), so the activation's output is never written in the activations' dtype:
//   Gelu  (fp8_linear_fwd's fx): the operand is gelu(x), x the pre-activation;
//   DGelu (fp8_linear_bwd's fdy): the operand is dy * gelu'(act_input), dy the gradient of gelu's output and
//         act_input the pre-activation (dy's shape).
//   Norm  (fp8_linear_fwd's fx): the operand is the norm of x (Fp8Norm), x the norm's input — Transformer Engine's
//         LayerNormLinear: the norm's output is never written.
//   Swiglu  (fp8_linear_fwd's fx): the operand [n, in] is swiglu(x), x [n, 2 in] = [gate | up] the pre-activation;
//   DSwiglu (fp8_linear_bwd's fdy): the operand [n, out] is swiglu_bwd(dy, act_input), dy [n, out / 2] the gradient
//           of swiglu's output and act_input [n, out] the pre-activation.
// The values are rounded to the given tensor's dtype first, as gelu_fwd / gelu_bwd / swiglu_fwd / swiglu_bwd / the
// norms write them into it, so the casts, amax, GEMMs and bias gradient see what the unfused ops would have produced
// (CUDA: the same bytes).
enum class Fp8Act { None, Gelu, DGelu, Norm, Swiglu, DSwiglu };

// Fp8Act::Norm's norm: y = (x - mean) rstd weight + bias over x's last dim, with the statistics a norm forward wrote
// for x (layernorm_fwd / add_layernorm_fwd; RMSNorm: rmsnorm_fwd / add_rmsnorm_fwd, mean and bias undefined) — the
// bytes that forward would have written as y. CUDA applies the statistics in the cast as the norm kernels' 16-byte
// path computes y; where a backend cannot, the norm runs again on x (eps: the forward's), which writes the same.
struct Fp8Norm {
  Tensor mean, rstd, weight, bias;
  float eps = 0.0f;
};
// An Fp8Norm's parts, checked by both backends (mcpp::Error naming the op): rstd and weight, and mean with bias
// (LayerNorm) or neither (RMSNorm). Their shapes and dtypes are each backend's.
void check_fp8_norm(const char* op, const Fp8Norm& norm);

// One operand of an FP8 GEMM: its scaling state, float32 on the op's device.
//   scale: [2] = {scale, scale_inv} (the cast multiplies by scale, the GEMM's output by the scale_invs).
//   amax:  [1] or undefined; when defined the op takes amax = max(amax, max |x|) of the UNSCALED input (the
//          delayed recipe's history slot; the tensorwise recipe records it with fp8_amax before the scale).
//   act / act_input / norm: Fp8Act (None: the tensor itself; act_input: DGelu's and DSwiglu's, norm: Norm's).
struct Fp8Operand {
  Tensor scale;
  Tensor amax{};
  Fp8Format format = Fp8Format::E4M3;
  Fp8Act act = Fp8Act::None;
  Tensor act_input{};
  Fp8Norm norm{};
};
// The values of operand f given the tensor t (ops.h Fp8Act), as a tensor of t's dtype: t itself, or the activation
// written out by gelu_fwd / gelu_bwd / swiglu_fwd / swiglu_bwd / the norm's forward (the unfused form, where a
// backend's cast cannot apply it; Swiglu halves t's last dim, DSwiglu doubles it).
Tensor fp8_operand_values(const char* op, const Tensor& t, const Fp8Operand& f, Stream s = {});

// What an FP8 linear's forward keeps for its backward (fp8_linear_fwd's `saved`; Transformer Engine keeps the same):
// copies of the forward's casts in the backward's layout, so the backward casts neither x nor w again. CUDA: q(x)^T
// [in, n] and q(w)^T [in, out] as fp8 bytes (the wgrad's and the dgrad's transposed operands, written in the
// forward's cast pass), each followed by the scale_inv it was cast with; CPU: the emulated q(x) [n, in] and q(w)
// [out, in] (float32). Only fp8_linear_bwd reads them: the same bytes as its own casts with the forward's scales.
struct Fp8Saved {
  Tensor x, w;
};

// fp8_scale_update: Transformer Engine's delayed-scaling update (_default_get_amax_and_update_history then
// _default_sf_compute) of one tensor's state, on its device (no host read):
//   amax = most_recent ? history[0] : max(history);  history = roll(history, -1); history[0] = 0;
//   scale = (fp8_max / amax) / 2^margin when amax is finite and > 0, else unchanged; scale_inv = 1 / scale.
struct Fp8ScalingOptions {
  Fp8Format format = Fp8Format::E4M3;
  int margin = 0;
  bool most_recent = false;  // --fp8-amax-compute-algo most_recent (else max)
};
// One tensor's state in fp8_scale_update_multi (handles sharing storage with the caller's tensors).
struct Fp8ScaleState {
  Tensor scale;          // [2] {scale, scale_inv}
  Tensor amax_history;   // [L]
  int64_t amax_slot = 0;  // where this pass recorded its amax: the op's amax[amax_slot]
  Fp8ScalingOptions opt;
  Tensor scale_before;  // when defined ([2]): receives {scale, scale_inv} as they were before the update
};
// fp8_scale_update_multi's list, checked by both backends (mcpp::Error naming the op): every amax slot inside amax and
// taken once, every history non-empty. The dtypes and the scale shapes are each backend's.
void check_fp8_scale_update_multi(const std::vector<Fp8ScaleState>& list, const Tensor& amax);

// ---- FP8 blockwise scaling (--fp8-recipe blockwise: DeepSeek-V3's recipe as Transformer Engine's Float8BlockScaling,
// ops.inc fp8_block_*): one float32 scale per 1x128 tile (activations and gradients: 128 consecutive elements along the
// GEMM's reduction dim) or per 128x128 block (weights). A block's scale is Transformer Engine's compute_scale_from_amax
// with power-of-2 scales (its default): s = fp8_max / amax rounded down to a power of 2 (its mantissa bits cleared);
// 1 when amax is 0, inf or NaN; FLT_MAX's power of 2 when fp8_max / amax overflows. The cast is q = fp8(x * s) (exact
// scaling), the dequantization q * scale_inv with scale_inv = 1 / s (exact). No state: the scales are per call.
// Tile128x1: 128 consecutive elements along the rows (a column tile) — the wgrad's operands, whose reduction dim is
// the tokens (Transformer Engine's columnwise quantization).
enum class Fp8Block { Tile1x128, Tile128x1, Block128x128 };
constexpr int64_t kFp8BlockLen = 128;
float fp8_block_scale(float amax, Fp8Format f);  // s of a block with this amax (the CPU backend's and the tests')

#define MCPP_OP_UNPAREN(...) __VA_ARGS__
#define MCPP_OP(ret, name, params) ret name(MCPP_OP_UNPAREN params, Stream stream = {});
#include "mcpp/kernels/ops.inc"
#undef MCPP_OP
#define MCPP_OP(ret, name, params) ret name(MCPP_OP_UNPAREN params, Stream stream);
namespace cpu {
#include "mcpp/kernels/ops.inc"
}  // namespace cpu
namespace cuda {
#include "mcpp/kernels/ops.inc"
}  // namespace cuda
#undef MCPP_OP

}  // namespace mcpp::ops
