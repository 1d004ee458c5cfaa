// TopKRouter (Megatron-Core transformer/moe/router.py) with its load-balancing losses (moe_utils.py).
//   x [n, h] -> logits [n, E] = x W_r^T (W_r [E, h] "router.weight", a GEMM in x's dtype, or in float32 on the
//   upcast operands with moe_router_dtype fp32 — then the backward's GEMMs too, dx rounded to x's dtype) -> on x's
//   device (ops::moe_topk_softmax, moe_route_positions):
//     scores = softmax(logits) over the E experts;
//     topk[t, :] = the k largest logits of token t (ties: the lower expert first), in descending order;
//     probs[t, :] = softmax over those k logits — or, with moe_router_pre_softmax, scores[t, topk[t, :]];
//     (moe_router_score_function sigmoid: s = sigmoid(logits), probs = s[topk] / their sum when k > 1, and scores =
//     s / its sum over the E experts for the load-balancing loss; moe_router_num_groups / group_topk: topk only
//     among the experts of each token's best groups — ops.inc moe_topk_softmax);
//     weights = probs x moe_router_topk_scaling_factor (when set): the combine weights;
//     (moe_router_enable_expert_bias: the experts chosen by s + expert_bias, the probabilities from s; the bias is
//     updated from the step's route counts by update_expert_bias — the trainer's job after each step);
//     idx = each route's expert-major row; tokens_per_expert[e] = how many of the n*k routes chose e (read to the
//     host, unless padded to capacity). With moe_expert_capacity_factor c > 0 (Megatron's
//     topk_softmax_with_capacity): capacity = ceil(n * k / E * c) of this rank's n tokens; each expert keeps at
//     most that many routes (drop policy "probs": the highest probabilities, "position": the first tokens;
//     ops::moe_capacity_positions), a dropped route's idx is -1 and it weighs nothing in the combine (its
//     probability's gradient is 0).
//     rows_per_expert[e] = the expert's rows in the dispatch buffer: its routes, its kept routes, or (padding to
//     capacity) the capacity — the dispatcher's all-to-all sizes and the experts' row counts.
//   moe_router_load_balancing_type "sinkhorn" (Megatron's sinkhorn_load_balancing; no load-balancing loss): in a
//     training forward the experts are the top-k of Megatron's sinkhorn(logits) (ops::moe_sinkhorn, on this rank's
//     tokens; in evaluation the plain top-k), probs = sigmoid(logits)[topk] at top-1, softmax(logits)[topk] above
//     (the sigmoid / pre_softmax paths above); no capacity, scaling, groups or expert bias.
//   Losses of this microbatch's n tokens (added to the LM loss; their gradients ride the router's backward):
//     aux_loss = moe_aux_loss_coeff * E / (N * N * k) * sum_e (sum_t scores[t, e]) * T[e]
//                (Megatron's switch_load_balancing_loss_func; "aux_loss" balancing), or with "seq_aux_loss"
//                (DeepSeek's sequence-wise loss, Megatron's sequence_load_balancing_loss_func) over the B sequences of
//                S tokens (n = s*b tokens in [s, b] order: token t is in sequence t % B):
//              = moe_aux_loss_coeff * E / (B * S * S * k) * sum_b sum_e (sum_{t in b} scores[t, e]) * C[b, e]
//                with C[b, e] the routes of sequence b that expert e KEPT (Megatron's routing map after the capacity
//                drop; with padding to capacity Megatron's map also marks the padding tokens, which would make C
//                depend on which unrouted tokens fill the pad — we count the routes)
//     z_loss   = moe_z_loss_coeff * sum_t logsumexp(logits[t])^2 / N   (z_loss_func; when the coefficient > 0; on
//                the logits with either score function, as Megatron's apply_z_loss)
//   where the sums over t run over this rank's tokens, and N / T[e] / C[b, e] are the token count / the routes per
//   expert (before any capacity drop, as Megatron's) / the kept routes per sequence of the whole sequences: when the
//   sequence is split over ranks (sequence parallelism over TP, context parallelism over CP) the counts are
//   all-reduced over those groups on the device (Megatron's tp_cp reduction; N = n x the split, every rank holding
//   as many tokens), so each rank's losses are its share and their sum over the group — and every gradient — equal
//   the unsplit run's. (A capacity, though, applies to each rank's own tokens, as Megatron's.)
//   Training noise (TransformerConfig): moe_input_jitter_eps: the logits GEMM reads x * U[1 - eps, 1 + eps) per
//     element (ops::random_scale), and dx its result times the same noise; moe_router_force_load_balancing: the logits
//     are standard-normal random numbers (ops::random_normal; no GEMM), d logits reaching the GEMM's backward as if
//     they were its output (Megatron's RandomSTE). Both draw from the RNG stream hidden dropout uses (the
//     model-parallel one under sequence parallelism): the jitter n*h, then the logits 2*n*E numbers.
// backward(dprobs [n, k], loss_grad_scale): d logits = the softmax Jacobians of probs (top-k or pre-softmax)
// applied to dprobs, + loss_grad_scale * d(aux_loss + z_loss) / d logits (Megatron's MoEAuxLossAutoScaler:
// the losses' gradient is scaled like the main loss's, 1 / num_microbatches); then dx = dlogits W_r and
// W_r's grad ACCUMULATES (+= dlogits^T x) into main_grad. The routing decision is not differentiated.
// The statistics (T or C, ops::moe_route_counts), the losses' values (for the log line), the expert load (routes and
// kept routes per expert, router entropy: LossTracker::add_load) and the expert bias's route counts stay on the device.
// The one host read per layer is the [E] route counts that size the dispatch buffer — none when it is padded to
// capacity (every expert's block is `capacity` rows): then the layer runs without a synchronization, and a CUDA graph
// can capture it — nor, dropless, after set_device_counts(true) (the grouped-GEMM experts at EP 1 and expert-TP 1
// size their work from RouterCtx::counts on the device; the host vectors stay empty).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "mcpp/core/parameter.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/tensor_parallel/random.h"
#include "mcpp/tensor_parallel/tp_context.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp::moe {

constexpr int64_t kMaxTopk = 64;  // moe_router_topk's upper bound (TransformerConfig::validate)

// This rank's router losses summed over MoE layer calls (microbatches x steps of a log window) per layer, each
// divided by its coefficient as Megatron's tracker logs them (load_balancing = aux_loss / moe_aux_loss_coeff,
// z = z_loss / moe_z_loss_coeff), and the calls: float32 [num_layers, 3] on the model's device, added to by the
// routers (inside a captured step too); the trainer reads them with take() and averages over the calls of every
// rank (the log line: over the layers too; --moe-per-layer-logging: per layer).
struct LossTracker {
  struct Sums {
    double load_balancing = 0.0, z = 0.0, calls = 0.0;
  };
  explicit LossTracker(int64_t num_layers = 1) : layers_(num_layers) {}
  // v float32 [3] on one device (the first add allocates the sums there) for global layer `layer` in [0, num_layers)
  void add(const Tensor& v, int64_t layer = 0);
  // The sums per layer ([num_layers]; all zero without an add; a host read), then zeroed in place: the tensor stays
  // (graphs add into it).
  std::vector<Sums> take();
  int64_t num_layers() const { return layers_; }
  // Expert load (the trainer's MoE load report), summed the same way: v float32 [2E + 2] = the routes per expert
  // (before any capacity drop), the kept routes per expert, the sum over tokens of the entropy (nats) of
  // softmax(logits), the tokens. take_load(): [num_layers][2E + 2] (empty rows without an add), then zeroed.
  void add_load(const Tensor& v, int64_t layer = 0);
  std::vector<std::vector<double>> take_load();

 private:
  int64_t layers_;
  Tensor sums_;
  Tensor load_;  // [num_layers, 2E + 2]
};

struct RouterCtx {
  Tensor x;        // [n, h] the input
  Tensor jittered;  // [n, h] x times the jitter noise (the GEMM's input, for the weight grad); undefined: no jitter
  PhiloxKey jitter_key;
  int64_t n = 0;
  int64_t batch = 1;  // B: the sequences of the n tokens
  Tensor topk;     // [n, k] int32: chosen experts            (all on x's device)
  Tensor probs;    // [n, k] fp32: their probabilities
  Tensor weights;  // [n, k] fp32: the combine weights = probs x moe_router_topk_scaling_factor (probs when unset)
  Tensor scores;   // [n, E] fp32: softmax over all experts
  Tensor lse;      // [n] fp32: logsumexp of each token's logits
  Tensor idx;      // [n, k] int32: each route's row in the expert-major order (ops::moe_route_positions)
  Tensor aux_counts;  // fp32 [1, E] T (aux_loss) or [B, E] C (seq_aux_loss), over the split; undefined: loss off
  Tensor z_scores, z_lse;  // fp32 [n, E] softmax(logits), [n] logsumexp: the z-loss's, with sigmoid scores only
  std::vector<int64_t> tokens_per_expert;  // [E] this rank's routes per expert (host; before any drop) — not read
                                           // (empty) when the buffer is padded to capacity
  std::vector<int64_t> rows_per_expert;    // [E] the dispatch buffer's rows per expert (host; empty with device
                                           // counts)
  Tensor counts;  // dropless with device counts: int64 [E] on x's device, the routes (= the buffer's rows) per
                  // expert (GroupedMLP's, until its backward); undefined otherwise
  int64_t capacity = 0;                    // routes an expert keeps (0: dropless)
};

class TopKRouter {
 public:
  // tp: the sequence's split (tp.group with sequence parallelism, tp.cp): the load-balancing statistics' groups;
  // with SP the router weight is a sequence-parallel parameter (its grad all-reduced over TP).
  TopKRouter(ParameterRegistry& params, const std::string& prefix, const TransformerConfig& config,
             const tensor_parallel::TPContext& tp);
  // x [n, h]: the tokens of `batch` sequences in [s, b] order (n % batch == 0). losses (non-null: a training
  // forward, not evaluation, not a recompute): this call's losses are added to it, and with the expert bias on the
  // routes each expert kept to the step's counts (take_route_counts). training (false: evaluation): sinkhorn
  // routing, and the load-balancing statistics (none in evaluation: no backward follows), the jitter and random
  // logits (training noise, above; drawn from rng, which they need).
  void forward(RouterCtx& ctx, const Tensor& x, int64_t batch, LossTracker* losses = nullptr, bool training = true,
               tensor_parallel::RngTracker* rng = nullptr) const;
  // dprobs [n, k] fp32 (x's device): the gradient of the combine weights (scaled in place by the scaling factor).
  // Returns dx [n, h] (x's device, dtype).
  Tensor backward(RouterCtx& ctx, Tensor& dprobs, float loss_grad_scale) const;
  Parameter* weight() const { return weight_; }
  // The expert bias (moe_router_enable_expert_bias; undefined when off): float32 [E] on the router's device, a
  // checkpointed buffer under expert_bias_key() ("<prefix>.expert_bias").
  bool has_expert_bias() const { return expert_bias_.defined(); }  // on the CPU until the first forward
  // Dropless: leave the buffer's per-expert rows on the device (RouterCtx::counts), no host read (moe_layer.h).
  void set_device_counts(bool on) { device_counts_ = on; }
  Tensor& expert_bias() { return expert_bias_; }
  const std::string& expert_bias_key() const { return bias_key_; }
  // The routes each expert kept in this step's training forwards (this rank's; a host read), then zeroed.
  std::vector<int64_t> take_route_counts();
  // Megatron's get_updated_expert_bias: b += rate * sign(mean(counts) - counts), counts [E] summed over the ranks
  // that hold this router.
  void update_expert_bias(const int64_t* counts, float rate);
  int64_t num_experts() const { return experts_; }
  int64_t topk() const { return k_; }
  // The global layer index its losses are recorded under (Megatron's Router.set_layer_number; 0 until set).
  void set_layer_number(int64_t layer) { layer_ = layer; }

 private:
  ops::MoeTopkOptions topk_options(float z_coef) const;  // the routing ops' options (z_coef: the backward's)
  // the load-balancing loss's factor before its sum: coeff E / (N^2 k), or coeff E / (B S^2 k) (S = N / B)
  double aux_loss_scale(int64_t n, int64_t batch) const;
  // This call's expert load (LossTracker::add_load's [2E + 2]) from the routes, the kept routes and the logits.
  Tensor expert_load(const RouterCtx& ctx, const Tensor& logits, bool capped) const;
  DType logit_dtype(const Tensor& x) const;  // the logits' dtype: float32 with moe_router_dtype fp32, else x's
  static Tensor upcast(const Tensor& t);     // a float32 copy (ops::cast)
  const Tensor& ones(int64_t n, Device dev) const;  // >= n float32 ones on dev (kept: no host copy in a capture)

  static constexpr float kSinkhornTol = 1e-4f;  // Megatron's sinkhorn(cost, tol=0.0001)
  int64_t experts_, k_;
  int64_t layer_ = 0;
  bool sinkhorn_;  // moe_router_load_balancing_type sinkhorn
  bool pre_softmax_, sigmoid_;
  bool fp32_logits_;  // moe_router_dtype fp32
  int64_t num_groups_, group_topk_;  // group-limited routing (0: off)
  bool aux_loss_on_, seq_aux_loss_;  // moe_router_load_balancing_type aux_loss / seq_aux_loss
  double capacity_factor_;  // 0: dropless
  float scaling_;           // moe_router_topk_scaling_factor (0: none)
  bool drop_by_probs_, pad_to_capacity_;
  bool device_counts_ = false;
  float aux_coeff_, z_coeff_;
  float jitter_eps_;  // moe_input_jitter_eps (0: off)
  bool force_balance_;  // moe_router_force_load_balancing
  comm::CommPtr sp_group_, cp_group_;  // the sequence's split: TP under sequence parallelism, CP (null: none)
  int64_t split_ = 1;                  // the ranks that split a sequence (their group sizes' product)
  Parameter* weight_ = nullptr;  // [E, h]
  mutable Tensor expert_bias_;   // [E] float32 (moe_router_enable_expert_bias), else undefined; moved to x's device
  std::string bias_key_;
  mutable Tensor route_counts_;  // [1, E] float32 this step's kept routes (expert bias on), on x's device
  mutable Tensor ones_;          // float32 ones on x's device (the column sums' and the call count's)
};

// Megatron's _update_router_expert_bias (finalize_model_grads): the routers' step counts summed over `groups` (the
// ranks holding the same routers: TP, CP, DP; host all-reduces), then each bias updated (update_expert_bias).
// Collective over every member of each group; routers without a bias are skipped.
void update_expert_biases(const std::vector<TopKRouter*>& routers, const std::vector<comm::CommPtr>& groups,
                          float rate);

}  // namespace mcpp::moe
