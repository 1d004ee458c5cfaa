// GPTModel (Megatron-Core models/gpt/gpt_model.py): embedding (pre_process) -> TransformerBlock ->
// output layer + loss (post_process), tensor parallel (TPContext; tp == 1 is the single-rank model).
//   tokens [s, b] int32 -> VocabParallelEmbedding (rows [V/tp], out-of-slice ids give 0, all-reduce over
//   TP) (+ learned positions, replicated) -> (SP: keep this rank's [s/tp] rows) -> dropout -> decoder
//   -> final norm -> output layer (ColumnParallel, weight = word embeddings when tied)
//   -> logits [s*b, Vp/tp] -> cross entropy per token in fp32 (vocab-parallel over TP: max / sum-exp /
//   target-logit combined by all-reduces) -> loss = sum(loss * mask) / sum(mask).
// backward(ctx, grad_scale) back-propagates grad_scale * loss — with config.calculate_per_token_loss
// grad_scale * sum(loss * mask) instead (Megatron: the trainer divides the summed gradients by the number
// of non-masked tokens over all microbatches and DP ranks); every parameter gradient ACCUMULATES into
// the contiguous main-grad buffer (tied embedding: both uses add into the one parameter). Grads of
// sequence-parallel params are partial until finalize_model_grads all-reduces them over TP.
// Context per microbatch: GPTModelCtx (caller owns; a schedule may hold several).
// Device and dtype: parameters live on the model's device; activations follow the parameters' dtype
// (the embedding output's), token/label/mask tensors may be given on the host or the device.
//
// Pipeline stages (GPTModelStage; Megatron's pre_process / post_process): a stage holds decoder layers
// [first_layer, first_layer + num_layers) (keys keep their global index), the embedding when pre_process,
// the final norm + output layer + loss when post_process. forward_step / backward_step move the hidden
// state [s(/tp), b, h] between stages. With tied embeddings, a last stage without the embedding registers
// its output weight under the same key "embedding.word_embeddings.weight" (identical initial values by the
// key-based init; shared_copy) and finalize_model_grads sums the two stages' gradients.
//
// Multi-token prediction (config.mtp_num_layers = D > 0; Megatron's --mtp-num-layers, on the last stage): a
// training forward with labels also runs D MultiTokenPredictionLayers after the decoder's final norm — depth k on
// the tokens, labels and loss mask rolled k positions left (the last k positions: token 0, mask 0), its
// embedding from the shared word embeddings (so the last stage holds a shared copy of them also when untied), its
// logits from the shared output layer. Each depth's loss (the masked mean over its rolled mask) back-propagates
// with grad_scale * mtp_loss_scaling_factor / D — Megatron's MTPLossAutoScaler with the main loss's backward
// scale; with calculate_per_token_loss its token sum times (main tokens / its tokens), as Megatron's
// process_mtp_loss. The reported loss stays the main one; the depths' means go to ForwardOptions::mtp_losses.
// Evaluation and inference forwards (no labels, or training false) skip the depths. Keys "mtp.layers.<k>.*".
//
// Generation with a KV cache (ForwardOptions::inference, transformer/inference_context.h; the whole model on one
// rank): the prefill is the plain forward over the padded prompts (the attention layers store their keys / values);
// a decode step takes tokens [1, b] at positions lengths[bb] — the learned position embeddings' and the RoPE tables'
// rows gathered at those positions — and its attention reads the layers' memory.
//
// Packed sequences (ForwardOptions::packed_seq_params, transformer/packed_seq_params.h; Megatron's
// --reset-position-ids / --reset-attention-mask and SFT): position_ids restart the learned positions and the rotary
// tables' rows per document (per-token tables [s*b, rot/2]), doc_start masks the core attention by documents — a
// packed batch equals its documents run one by one. Not with context parallelism or MTP depths (refused).
#pragma once
#include <memory>
#include <vector>

#include "mcpp/core/parameter.h"
#include "mcpp/models/gpt/gpt_layer_specs.h"
#include "mcpp/tensor_parallel/layers.h"
#include "mcpp/tensor_parallel/tp_context.h"
#include "mcpp/tensor_parallel/vocab_parallel.h"
#include "mcpp/transformer/multi_token_prediction.h"
#include "mcpp/transformer/transformer_config.h"
#include "mcpp/transformer/transformer_layer.h"

namespace mcpp {

class InferenceContext;

// One use of the output layer and its loss (the main head, or an MTP depth's).
struct LossHeadCtx {
  tensor_parallel::ParallelLinearCtx output;
  Tensor logits;          // [s*b, Vp/tp]
  Tensor labels;          // [s*b] int32
  Tensor loss_mask;       // [s*b] float32, on the model's device
  Tensor lse;             // [s*b] (global over the vocabulary)
  Tensor loss_stats;      // [2] float32 on the model's device: {sum(loss * mask), sum(mask)} (masked_loss_stats)
  // The backward's d(loss)/d(loss_i) = mask_i * coef with coef = grad_coef * grad_scale over grad_stats[1]
  // (ops::masked_loss_grad; per token: not divided).
  Tensor grad_stats;
  bool grad_per_token = false;
  float grad_coef = 1.0f;  // the main loss 1; an MTP depth's mtp_loss_scaling_factor / mtp_num_layers
  float logits_hold_grad_for = 0.0f;  // > 0: the loss forward already turned logits into d(loss)/d(logits)
                                      // for this grad_scale (ForwardOptions::loss_grad_scale)
};

// One MTP depth of a training forward (multi_token_prediction.h).
struct MtpDepthCtx : LossHeadCtx {
  Tensor tokens;  // [s, b] int32: the tokens rolled k positions left (the embedding's backward)
  PhiloxKey embedding_dropout_key;
  bool embedding_dropout = false;
  MultiTokenPredictionLayerCtx layer;
};

struct GPTModelCtx : LossHeadCtx {
  Tensor tokens;          // [s, b] int32
  Tensor input;           // [s(/tp), b, h] from the previous pipeline stage (not on the first)
  Tensor position_ids;    // [s*b] int32 (learned positions; the model's cached ids, or the packed batch's)
  PackedSeqParams packed; // packed sequences: the forward's ForwardOptions::packed_seq_params on the model's device
  PhiloxKey embedding_dropout_key;
  bool embedding_dropout = false;
  RopeTables rope;        // cos/sin rows for this sequence length (rope configs); per token when packed
  TransformerBlockCtx decoder;
  std::vector<MtpDepthCtx> mtp;  // a training forward with labels of a model with MTP depths (last stage)
};

struct GPTModelStage {
  bool pre_process = true;   // holds the embedding (first pipeline stage)
  bool post_process = true;  // holds the final norm, output layer and loss (last stage)
  int64_t first_layer = 0;
  int64_t num_layers = -1;   // -1: all config.num_layers
};

struct LossResult {
  double loss = 0;        // sum(loss * mask) / sum(mask)
  double loss_sum = 0;    // sum(loss * mask)
  double num_tokens = 0;  // sum(mask)
  // Reads a loss_stats tensor [2] (a device->host copy when it lives on the GPU).
  static LossResult from_stats(const Tensor& stats);
};

class GPTModel {
 public:
  // Registers this stage's parameters into `params` and the MoE experts' into `expert_params` (Megatron's
  // expert-parallel buffers: reduced over expert-DP); the caller allocates them before the first forward
  // (distributed/model_chunk.h's ModelChunk owns both and does). device: where the activations and the model's
  // own tables (rotary, position ids) live — the parameters' device.
  // spec: the layers' parts (gpt_layer_specs.h); without it get_gpt_model_spec(config).
  GPTModel(ParameterRegistry& params, ParameterRegistry& expert_params, const TransformerConfig& config,
           const GPTModelSpec& spec, const tensor_parallel::TPContext& tp, Device device = Device::CPU,
           const GPTModelStage& stage = {});
  GPTModel(ParameterRegistry& params, ParameterRegistry& expert_params, const TransformerConfig& config,
           const tensor_parallel::TPContext& tp, Device device = Device::CPU, const GPTModelStage& stage = {})
      : GPTModel(params, expert_params, config, get_gpt_model_spec(config), tp, device, stage) {}
  virtual ~GPTModel() = default;
  GPTModel(const GPTModel&) = delete;
  GPTModel& operator=(const GPTModel&) = delete;

  // One pipeline stage's forward: input = tokens [s, b] (pre_process) or the previous stage's hidden
  // [s(/tp), b, h]. Returns the hidden state for the next stage, or (post_process) computes the loss
  // statistics into ctx.loss_stats on the device and returns an undefined tensor; *loss, when non-null, is
  // filled from them (a device->host read: pass nullptr to keep the step free of host syncs, e.g. under
  // CUDA-graph capture). labels / loss_mask are used only by the last stage. Context parallelism (tp.cp):
  // tokens / labels / loss_mask are this CP rank's contiguous s/cp rows, and the loss statistics are the
  // whole sequence's (summed over the CP group).
  Tensor forward_step(GPTModelCtx& ctx, const Tensor& tokens, const Tensor& input, const Tensor& labels,
                      const Tensor& loss_mask, const ForwardOptions& opt, LossResult* loss);
  // Backward of forward_step: output_grad is the next stage's input gradient (ignored on the last stage,
  // which starts from grad_scale * loss). Returns the gradient of this stage's input hidden (undefined on
  // the first stage).
  Tensor backward_step(GPTModelCtx& ctx, float grad_scale, const Tensor& output_grad);

  // Logits [s*b, Vp/tp] (row = is*b + ib) for tokens [s, b]: this rank's vocabulary slice.
  Tensor forward_logits(GPTModelCtx& ctx, const Tensor& tokens, const ForwardOptions& opt);
  // Forward + loss; labels int32 [s, b], loss_mask float32 [s, b].
  LossResult forward_loss(GPTModelCtx& ctx, const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask,
                          const ForwardOptions& opt);
  // d(grad_scale * loss)/d(params), accumulated into main grads. Needs a forward_loss ctx.
  void backward(GPTModelCtx& ctx, float grad_scale);
  // The whole vocabulary's logits [s*b, Vp] (all-gathered over TP when tp > 1), for inference tools.
  Tensor gather_logits(const Tensor& local_logits) const;

  // The routers of this chunk's MoE layers (expert biases: the trainer's update, the checkpoint's buffers).
  // (with MTP depths on this stage their MoE layers' routers follow)
  std::vector<moe::TopKRouter*> routers() const;
  const TransformerConfig& config() const { return config_; }
  const tensor_parallel::TPContext& tp() const { return tp_; }
  const GPTModelStage& stage() const { return stage_; }
  Device device() const { return device_; }
  int64_t vocab_start() const { return vocab_start_; }

 private:
  RopeTables rope_for(int64_t s) const;
  RopeTables rope_at(const Tensor& positions) const;  // the tables' rows at positions int32 [n] -> [n, rot/2]
  // mcpp::Error unless a KV-cache forward of tokens [s, b] fits this model and the context (inference_context.h).
  void check_inference_step(const InferenceContext& ic, int64_t s, int64_t b) const;
  // ForwardOptions::packed_seq_params -> ctx.packed (checked, on the device), and opt pointed at it (or at none).
  void set_packed(GPTModelCtx& ctx, ForwardOptions& opt, int64_t s, int64_t b) const;
  Tensor embed(GPTModelCtx& ctx, const Tensor& tokens, const ForwardOptions& opt);
  void embed_backward(GPTModelCtx& ctx, const Tensor& dx);
  Tensor head_backward(GPTModelCtx& ctx, float grad_scale);  // loss -> d(final hidden)
  // -> ctx.loss_stats; grad_scale > 0 (tp = 1): also the logits' gradient, in place (fused cross entropy)
  // grad_coef and count_base: an MTP depth's (count_base = the main loss's statistics, for the per-token ratio).
  void compute_loss(LossHeadCtx& lh, const Tensor& labels, const Tensor& loss_mask, float grad_scale = 0.0f,
                    float grad_coef = 1.0f, const Tensor* count_base = nullptr);
  Tensor loss_backward(LossHeadCtx& lh, const tensor_parallel::ColumnParallelLinear& layer, float grad_scale,
                       int64_t s, int64_t b);  // -> d(its hidden) [s(/tp), b, h]
  // the word embedding of tokens [s, b] -> [s(/tp), b, h]: SP scatter and embedding dropout (drawn into *key)
  Tensor finish_embedding(const Tensor& x, const ForwardOptions& opt, bool& dropout, PhiloxKey& key);
  // dx [s(/tp), b, h] -> the word embeddings' gradient of tokens (no grad_ready); returns [s*b, h]
  Tensor word_embedding_backward(const Tensor& dx, const Tensor& tokens, bool dropout, const PhiloxKey& key);
  // t [s(/cp), b]: this CP rank's rows of a whole-sequence tensor, rolled one position left along the sequence (the
  // last row zero: Megatron's roll_tensor(shifts=-1), with context parallelism its CP form: the row that crosses
  // into a chunk comes from the rank that holds the next chunk).
  Tensor roll_left(const Tensor& t) const;
  void mtp_forward(GPTModelCtx& ctx, const Tensor& h0, const ForwardOptions& opt);
  Tensor mtp_backward(GPTModelCtx& ctx, float grad_scale);  // -> d h0
  void sum_over_cp(Tensor& stats) const;            // loss statistics summed over the context-parallel group
  float loss_grad_scale(float grad_scale) const;   // the loss gradient's coefficient (x cp, see the .cpp)
  // The end of a forward (backward) pass of this chunk: its FP8 linears' delayed-scaling updates, all at once.
  void flush_fp8(tensor_parallel::Fp8UpdateGroup::Pass p);

  TransformerConfig config_;
  tensor_parallel::TPContext tp_;
  GPTModelStage stage_;
  Device device_;
  int64_t vocab_local_ = 0, vocab_start_ = 0;
  std::shared_ptr<tensor_parallel::Fp8UpdateGroup> fp8_updates_;  // FP8 on: every FP8 linear of the chunk
  // Learned positions: the [s*b] ids (row i -> i / b) of the last shape, on the device (no upload per
  // forward: a CUDA-graph step must not copy from the host).
  Tensor position_ids_;
  int64_t position_ids_b_ = 0;
  std::unique_ptr<tensor_parallel::VocabParallelEmbedding> word_embedding_;  // first stage (+ last, tied)
  Parameter* word_embeddings_ = nullptr;      // [Vp/tp, h] (first stage; the last stage's tied copy too)
  Parameter* position_embeddings_ = nullptr;  // [max_pos, h] replicated
  std::unique_ptr<TransformerBlock> decoder_;
  std::unique_ptr<tensor_parallel::ColumnParallelLinear> output_layer_;
  std::vector<std::unique_ptr<MultiTokenPredictionLayer>> mtp_;  // post_process with mtp_num_layers
  std::unique_ptr<tensor_parallel::ColumnParallelLinear> mtp_output_layer_;  // the output weight, no grad_ready
  Tensor one_;  // float32 [1] = 1 on the device (the MTP loss records' microbatch count)
  RopeTables rope_;
  bool has_rope_ = false;
  RopeTables rope_cp_;  // --cp-comm-type p2p: the tables of this CP rank's rows (built once per length)
  int64_t rope_cp_s_ = 0;
};

}  // namespace mcpp
