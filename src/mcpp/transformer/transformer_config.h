// Typed configuration (DESIGN.md decision 6): small structs per concern, each with validate() that names
// the offending field (throws mcpp::Error, one line). Field names follow Megatron-LM's flags with
// '-' -> '_'. Parsing (TOML --config file, then Megatron-named CLI flags that override it) lives in
// training/arguments.h; the math fingerprint in Config::fingerprint().
//
// Life cycle: defaults -> TOML / flags (or from_json) -> finalize() fills the 0-defaults -> validate().
// finalize() is idempotent, so a finalized config survives to_json -> from_json -> finalize unchanged.
// Facts that need the world (data-parallel size, global batch default) come later through
// Config::apply_world_size(); the padded vocabulary through TransformerConfig::set_vocab_size().
//
// JSON layout (also the TOML layout, see arguments.h): {"model": {...}, "parallel": {...},
// "training": {...}, "optimizer": {...}, "data": {...}} with the field names below; enums are written
// as Megatron's strings ("LayerNorm", "rope", "cosine", "WSD", ...).
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace mcpp {

enum class Normalization { LayerNorm, RMSNorm };
enum class PositionEmbedding { LearnedAbsolute, Rope, None };
enum class LrDecayStyle { Constant, Linear, Cosine, InverseSquareRoot, WSD };

// Megatron's strings: "LayerNorm"|"RMSNorm"; "learned_absolute"|"rope"|"none";
// "constant"|"linear"|"cosine"|"inverse-square-root"|"WSD". Parsing throws mcpp::Error naming `field`.
std::string to_string(Normalization v);
std::string to_string(PositionEmbedding v);
std::string to_string(LrDecayStyle v);
Normalization parse_normalization(const std::string& s, std::string_view field);
PositionEmbedding parse_position_embedding(const std::string& s, std::string_view field);
LrDecayStyle parse_lr_decay_style(const std::string& s, std::string_view field);

struct TransformerConfig {
  int64_t num_layers = 2;
  int64_t hidden_size = 64;
  int64_t num_attention_heads = 4;
  bool group_query_attention = false;  // --group-query-attention; alone it means num_query_groups = 1
  int64_t num_query_groups = 0;   // 0 -> = num_attention_heads (MHA). Unlike Megatron, a value given
                                  // without --group-query-attention is honored, not silently ignored.
  int64_t ffn_hidden_size = 0;    // 0 -> 4*h (GELU) or, with swiglu, Megatron's int(8h/3 / 64) * 64
  int64_t kv_channels = 0;        // head dim; 0 -> h / heads
  int64_t seq_length = 64;
  int64_t max_position_embeddings = 0;  // 0 -> seq_length
  Normalization normalization = Normalization::LayerNorm;
  float norm_epsilon = 1e-5f;
  bool swiglu = false;
  PositionEmbedding position_embedding_type = PositionEmbedding::LearnedAbsolute;
  float rotary_base = 10000.0f;
  float rotary_percent = 1.0f;
  // Megatron's --use-rope-scaling / --rope-scaling-factor (Llama 3.1's frequency scaling, HF rope_type "llama3";
  // transformer/rope.h): the rotary frequencies of wavelength above 8192 divided by the factor, those below 2048
  // kept, the band between interpolated (low / high frequency factors 1 / 4, Megatron's fixed values).
  bool use_rope_scaling = false;
  float rope_scaling_factor = 8.0f;
  // Megatron's --rotary-seq-len-interpolation-factor (linear position interpolation, HF rope_type "linear"): positions
  // enter RoPE divided by it. 0 = off (Megatron's None).
  float rotary_seq_len_interpolation_factor = 0.0f;
  bool untie_embeddings_and_output_weights = false;
  bool add_bias_linear = true;  // --disable-bias-linear sets false
  bool add_qkv_bias = false;    // --add-qkv-bias (effective only when add_bias_linear is false)
  // --qk-layernorm (Megatron's qk_layernorm): the model's normalization over each head's hn channels of q and k
  // (weights [hn] shared by the heads: self_attention.q_layernorm / k_layernorm), after the linear_qkv split and
  // before RoPE — Qwen3's, Gemma3's q_norm / k_norm.
  bool qk_layernorm = false;
  // Multi-latent attention (Megatron's --multi-latent-attention, MLASelfAttention; DeepSeek-V2/V3's MLA;
  // transformer/multi_latent_attention.h): queries from linear_q_proj, or with q_lora_rank > 0 through a q_lora_rank
  // wide bottleneck (linear_q_down_proj, linear_q_up_proj); keys and values from a kv_lora_rank wide latent
  // (linear_kv_down_proj, linear_kv_up_proj) — with --qk-layernorm the latents are normalized (q_layernorm,
  // kv_layernorm: Megatron's local spec; no other q / k norms then) —, per head qk_head_dim channels without positions
  // plus qk_pos_emb_head_dim rotary channels (the key's shared by all heads), values v_head_dim wide. Its RoPE:
  // rope_type "rope" or "yarn" ("" = yarn, Megatron's MLA default) over the qk_pos_emb_head_dim channels in
  // Megatron's MLA channel order; YaRN's fields below (Megatron's --rotary-scaling-factor, --mscale,
  // --mscale-all-dim, MLATransformerConfig's beta_fast / beta_slow / original_max_position_embeddings). The
  // softmax scale is mscale(rotary_scaling_factor, mscale_all_dim)^2 / sqrt(qk_head_dim + qk_pos_emb_head_dim) for
  // either rope type, as Megatron. Needs --position-embedding-type rope; num_query_groups, kv_channels,
  // rotary_percent and the standard attention's RoPE options do not apply.
  bool multi_latent_attention = false;
  int64_t q_lora_rank = 0;  // 0 = no query compression (Megatron's None)
  int64_t kv_lora_rank = 32;
  int64_t qk_head_dim = 128;
  int64_t qk_pos_emb_head_dim = 64;
  int64_t v_head_dim = 128;
  std::string rope_type;  // "" | "rope" | "yarn" (multi-latent attention only)
  float rotary_scaling_factor = 1.0f;
  float mscale = 1.0f;
  float mscale_all_dim = 0.0f;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  int64_t original_max_position_embeddings = 4096;
  bool mla_yarn() const { return multi_latent_attention && rope_type != "rope"; }  // MLA with YaRN's tables
  float hidden_dropout = 0.1f;
  float attention_dropout = 0.1f;
  float init_method_std = 0.02f;
  int64_t padded_vocab_size = 0;  // set from the tokenizer and make_vocab_size_divisible_by
  int64_t vocab_size = 0;         // unpadded, from the tokenizer (or --vocab-size for NullTokenizer)
  int64_t make_vocab_size_divisible_by = 128;
  std::string attention_impl = "flash";  // ModuleSpec choice: "flash" | "unfused" (DotProductAttention)
  // Megatron's --deterministic-mode: bit-identical runs on the GPU too (training/process_settings.h). For
  // the CUDA flash attention: off = cuDNN's fastest backward (dQ accumulated with atomics), on = its
  // deterministic backward graph (or the mcpp kernels where cuDNN has no engine).
  bool deterministic_mode = false;
  bool apply_query_key_layer_scaling = false;
  // Activation recompute (Megatron's names; none of them changes the math):
  //   recompute_granularity "" (off) | "full" (whole layers, input kept) | "selective" (recompute_modules)
  //   recompute_method "" | "uniform" (groups of recompute_num_layers) | "block" (first
  //   recompute_num_layers layers of each pipeline stage / virtual chunk); full needs a method.
  //   recompute_modules (selective; Megatron's --recompute-modules): "core_attn" (the core attention: q, k, v
  //   kept), "mlp" (a dense layer's MLP: its input kept, fc1 / activation / fc2 re-run in backward), "moe" (a MoE
  //   layer: its input kept, the router, the dispatch with its all-to-alls, the experts and the shared expert
  //   re-run in backward; Megatron's moe_layer_recompute), "moe_act" (every routed expert's activation: fc1's output
  //   kept, the activation dropped after fc2 read it and re-run from it in backward), "shared_experts" (a MoE
  //   layer's shared expert: the layer's input kept, its MLP re-run in backward — under SP with its all-gather),
  //   "layernorm" (input_layernorm's and pre_mlp_layernorm's outputs: dropped where linear_qkv, the MLP or the MoE
  //   layer keep them — under SP their all-gathered copies —, re-run from the norms' kept inputs and statistics when
  //   the backward reaches the branch, re-gathered under SP; with "mlp" / "moe" the MLP's kept input goes too),
  //   "mla_up_proj" (multi-latent attention: the core attention's query / key / value dropped after its forward and
  //   rebuilt in backward from the up projections' kept inputs — their GEMMs and the RoPE re-run).
  std::string recompute_granularity;
  std::string recompute_method;
  int64_t recompute_num_layers = 0;  // full: layers per group (uniform) or per stage (block)
  std::vector<std::string> recompute_modules{"core_attn"};
  bool recomputes(const std::string& module) const {  // selective recompute of this module
    return recompute_granularity == "selective" &&
           std::find(recompute_modules.begin(), recompute_modules.end(), module) != recompute_modules.end();
  }
  // --calculate-per-token-loss: the loss is summed over tokens and divided once by the global number of
  // non-masked tokens (instead of a mean per microbatch averaged over microbatches).
  bool calculate_per_token_loss = false;
  // Multi-token prediction (Megatron's --mtp-num-layers / --mtp-loss-scaling-factor; DeepSeek-V3's MTP;
  // transformer/multi_token_prediction.h): mtp_num_layers > 0 depths on the last pipeline stage, each predicting one
  // more token ahead; their losses' weight mtp_loss_scaling_factor / mtp_num_layers each. 0 = off (Megatron's None).
  // RoPE or no position embeddings only (Megatron's rule).
  int64_t mtp_num_layers = 0;
  float mtp_loss_scaling_factor = 0.1f;
  // The last pipeline stage uses the word embeddings too — as the tied output layer, or for the MTP depths'
  // embeddings (Megatron's setup_embeddings_and_output_layer): it holds a shared copy when it is not the first
  // stage, and finalize_model_grads sums the copies over the embedding group.
  bool last_stage_uses_word_embeddings() const { return !untie_embeddings_and_output_weights || mtp_num_layers > 0; }
  // The MTP depths are recomputed in backward (full recompute, uniform method; with block they are not, as Megatron).
  bool recomputes_mtp_depths() const { return recompute_granularity == "full" && recompute_method == "uniform"; }
  // Mixture of experts (Megatron's --num-experts, --moe-*; transformer/moe/moe_layer.h): with num_moe_experts > 0 the MLP of
  // the layers moe_layer_freq selects is a MoE layer of that many experts (0 = dense). TopKRouter: router logits
  // [n, E] = x W_r^T; each token goes to moe_router_topk experts — the top k logits, probabilities = softmax over
  // those k (with moe_router_pre_softmax: softmax over all E, then the top k of it) — and its output is the
  // probability-weighted sum of their MLPs (moe_ffn_hidden_size wide, 0 -> ffn_hidden_size). Dropless unless
  // moe_expert_capacity_factor is set (below). Load balancing "aux_loss" (Switch Transformer's, scaled by
  // moe_aux_loss_coeff), "seq_aux_loss" (DeepSeek's per-sequence form, same coefficient) or "none";
  // moe_z_loss_coeff > 0 adds ST-MoE's router z-loss. Dispatcher "alltoall" (Megatron's default is "allgather":
  // same math, the one implemented here is the all-to-all).
  int64_t num_moe_experts = 0;
  int64_t moe_router_topk = 2;
  int64_t moe_ffn_hidden_size = 0;
  bool moe_router_pre_softmax = false;
  std::string moe_router_load_balancing_type = "aux_loss";
  float moe_aux_loss_coeff = 0.0f;
  float moe_z_loss_coeff = 0.0f;
  std::string moe_token_dispatcher_type = "alltoall";
  // Megatron's --moe-router-topk-scaling-factor: > 0 multiplies the combine weights (the top-k probabilities) by it
  // (DeepSeek-V2's routed scaling); 0 = none (Megatron's None).
  float moe_router_topk_scaling_factor = 0.0f;
  // Megatron's --moe-layer-freq: which layers are MoE layers (the others keep a dense MLP). An integer N: layer i
  // (0-based, global) when i % N == 0; or a Python list expression of one 0 / 1 per layer, e.g. "([1]*3+[0])*2"
  // or "[1,0,1,0]" (lists, '+', '*' by an integer, parentheses). moe_layer_pattern() expands it.
  std::string moe_layer_freq = "1";
  // Megatron's --moe-shared-expert-intermediate-size: > 0 adds a shared expert to every MoE layer, a dense MLP of
  // that width (tensor parallel like a dense MLP; "<layer>.mlp.shared_experts.linear_fc1/2") run on every token,
  // its output added to the routed experts' weighted sum.
  int64_t moe_shared_expert_intermediate_size = 0;
  // Megatron's --moe-shared-expert-gate (Qwen-MoE's gated shared expert): the shared expert's output scaled per token
  // by sigmoid(x . w) ("<layer>.mlp.shared_experts.gate_weight" [1, h], replicated over TP).
  bool moe_shared_expert_gate = false;
  // Megatron's --moe-input-jitter-eps (Switch Transformer's jitter): eps > 0 multiplies the router's input by noise
  // uniform in [1 - eps, 1 + eps) per element in a training forward (ops::random_scale, drawn from the RNG stream of
  // the hidden dropout: model-parallel under sequence parallelism), its gradient by the same noise; the experts see
  // the clean input. 0 = off (Megatron's None). Megatron jitters evaluation forwards too; evaluation here does not.
  float moe_input_jitter_eps = 0.0f;
  // Megatron's --moe-router-force-load-balancing (for benchmarks): a training forward routes by standard-normal
  // random logits (ops::random_normal, same RNG stream) instead of the router's — its GEMM is skipped — and the
  // routing's logit gradient passes straight to the router (Megatron's RandomSTE). Evaluation routes by the real
  // logits (Megatron randomizes those too).
  bool moe_router_force_load_balancing = false;
  // Megatron's token dropping: --moe-expert-capacity-factor c > 0 caps each expert at ceil(n * k / E * c) of a
  // microbatch's n local tokens' routes (0 = dropless, Megatron's None); --moe-token-drop-policy "probs" keeps the
  // routes of the highest probabilities, "position" the first in token order; a dropped route adds nothing to its
  // token's output. --moe-pad-expert-input-to-capacity: every expert processes exactly its capacity of rows (the
  // unused ones zero; the same math, static shapes).
  double moe_expert_capacity_factor = 0.0;
  std::string moe_token_drop_policy = "probs";
  bool moe_pad_expert_input_to_capacity = false;
  // Megatron's --moe-router-score-function: "softmax" (above) or "sigmoid" (DeepSeek-V3): scores s = sigmoid(logits),
  // the top k of s, probabilities = s over their sum when k > 1 (s itself when k = 1); the load-balancing loss
  // uses s normalized over all experts. No pre-softmax with it (the z-loss stays on the logits).
  std::string moe_router_score_function = "softmax";
  // Megatron's --moe-router-dtype: "fp32" computes the router's logits GEMM (and its backward) in float32 from the
  // bf16 input and weight upcast, instead of the model's dtype ("" = that); the routing math after it is fp32 anyway.
  // fp64 is Megatron's other choice, not implemented.
  std::string moe_router_dtype;
  // Megatron's --moe-per-layer-logging: each MoE layer's router losses too (the metrics' train records, "moe_layers":
  // per layer the losses over their coefficients, averaged over microbatches, iterations of the window and ranks).
  bool moe_per_layer_logging = false;
  // Megatron's --moe-router-num-groups / --moe-router-group-topk (group-limited routing, DeepSeek-V2/V3's
  // device-limited routing): the experts in num_groups groups of consecutive ones; each token picks the group_topk
  // groups whose k / group_topk largest scores sum highest, then its top k among their experts. 0 = off.
  int64_t moe_router_num_groups = 0;
  int64_t moe_router_group_topk = 0;
  // Megatron's --moe-router-enable-expert-bias (DeepSeek-V3's aux-loss-free load balancing; sigmoid only): a
  // per-expert bias b (each router's "expert_bias", a checkpointed buffer, not a parameter) added to the scores when
  // choosing experts (not to the probabilities); after every training step b += --moe-router-bias-update-rate *
  // sign(mean count - count of each expert), the counts of the step's routes summed over the ranks that hold the
  // router (TP x CP x DP).
  bool moe_router_enable_expert_bias = false;
  float moe_router_bias_update_rate = 1e-3f;

  // Derived (valid after finalize()).
  int64_t head_dim() const { return kv_channels; }
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }  // Megatron: add_qkv_bias | add_bias_linear
  int64_t rotary_dim() const;  // int(kv_channels * rotary_percent), Megatron's rotary_dim
  // moe_layer_freq expanded to num_layers flags (all false without experts); throws mcpp::Error naming a malformed
  // expression or a pattern whose length is not num_layers. is_moe_layer(i): global layer i's flag.
  std::vector<bool> moe_layer_pattern() const;
  bool is_moe_layer(int64_t layer) const;
  int64_t num_moe_layers() const;
  // vocab_size = n; padded_vocab_size = n rounded up to make_vocab_size_divisible_by * tp (Megatron's
  // _vocab_size_with_padding).
  void set_vocab_size(int64_t n, int64_t tensor_model_parallel_size);
  void finalize();   // fills 0-defaults; call after parsing, before validate()
  void validate() const;
};

struct ParallelConfig {
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  int64_t context_parallel_size = 1;
  // Megatron's --cp-comm-type: how the attention sees the whole sequence under context parallelism. "a2a"
  // (DeepSpeed-Ulysses all-to-all: sequence traded for query groups around the core attention,
  // tensor_parallel/mappings.h; each rank holds a contiguous s / cp chunk) or "p2p" (ring attention,
  // transformer/ring_attention.h: key / value blocks passed around the CP ranks, each rank holding the causally
  // load-balanced chunks r and 2cp-1-r of 2cp, transformer/context_parallel.h). "all_gather" / "a2a+p2p" are refused.
  std::string cp_comm_type = "a2a";
  bool cp_ring() const { return cp_comm_type == "p2p"; }  // the ring form (in use when context_parallel_size > 1)
  int64_t num_layers_per_virtual_pipeline_stage = 0;  // 0 -> no interleaving
  bool sequence_parallel = false;         // finalize() turns it off at tp == 1, as Megatron does
  // Megatron's --tp-comm-overlap (sequence parallel only): each SP all-gather feeding a GEMM runs as a ring
  // over the TP group, the GEMM of each arrived chunk overlapping the next chunk's transfer
  // (tensor_parallel/layers.h). finalize() turns it off with sequence_parallel at tp == 1.
  bool tp_comm_overlap = false;
  bool use_distributed_optimizer = false;
  int64_t expert_model_parallel_size = 1;
  int64_t expert_tensor_parallel_size = 0;  // 0 -> tensor_model_parallel_size (Megatron's default)
  int64_t expert_tp() const {  // the expert-TP size in use
    return expert_tensor_parallel_size == 0 ? tensor_model_parallel_size : expert_tensor_parallel_size;
  }
  std::string rank_order = "tp-cp-ep-dp-pp";  // Megatron's order string (RankGenerator)
  std::string pipeline_model_parallel_layout;  // --pipeline-model-parallel-layout, e.g. "E|t*3|t*3|t*2,L"
  int64_t decoder_first_pipeline_num_layers = -1;  // -1 = unset: uneven split (pipeline_parallel/layout.h)
  int64_t decoder_last_pipeline_num_layers = -1;
  // Megatron-Core's account_for_embedding/loss_in_pipeline_split: the embedding / the loss counts as one
  // layer when the layers are split over the pipeline stages (pipeline_parallel/layout.h).
  bool account_for_embedding_in_pipeline_split = false;
  bool account_for_loss_in_pipeline_split = false;
  // --variable-seq-lengths: microbatches may differ in sequence length; pipeline stages exchange the
  // activation shape before each P2P transfer (Megatron's ModelParallelConfig.variable_seq_lengths).
  bool variable_seq_lengths = false;
  // Whether a custom layer placement is given (then pipeline_parallel/layout.h checks the counts).
  bool custom_pipeline_layout() const {
    return !pipeline_model_parallel_layout.empty() || decoder_first_pipeline_num_layers >= 0 ||
           decoder_last_pipeline_num_layers >= 0 || account_for_embedding_in_pipeline_split ||
           account_for_loss_in_pipeline_split;
  }
  // Data parallel (distributed/data_parallel.h): bucket size in elements (Megatron's --ddp-bucket-size;
  // 0 -> max(40M, 1M * dp)), overlap of the grad reduction with backward, of the param all-gather with
  // the next forward (distributed optimizer).
  int64_t ddp_bucket_size = 0;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  // Each parameter's first gradient write of a step overwrites its main grad (a beta = 0 wgrad GEMM; TE's
  // overwrite_main_grad) instead of the step zeroing the whole grad buffer first; same values.
  // --no-overwrite-main-grad: zero the buffer (Megatron's zero_grad_buffer), for A/B runs and debugging.
  bool overwrite_main_grad = true;
  // Communicator debugging (comm/): the watchdog timeout and the per-collective fingerprint check.
  float distributed_timeout_minutes = 10.0f;
  bool check_collectives = false;
  int64_t data_parallel_size = 0;         // derived by Config::apply_world_size; 0 until then
  void validate() const;
};

struct TrainingConfig {
  int64_t micro_batch_size = 4;
  int64_t global_batch_size = 0;  // 0 -> micro_batch_size * dp (Config::apply_world_size)
  int64_t train_iters = 100;
  // Sample-based training (Megatron's --train-samples; exclusive with --train-iters): train_iters is then derived,
  // train_samples / global_batch_size after a ramp-up's batches (Config::apply_world_size overwrites it; the parsed
  // flags leave it 0 until then), and the LR schedule's lengths are OptimizerConfig's *_samples.
  int64_t train_samples = 0;
  // Megatron's --rampup-batch-size START INCREMENT SAMPLES (sample-based training only): the global batch starts at
  // START and grows by INCREMENT in equal steps over SAMPLES consumed samples, then stays global_batch_size
  // (Config::global_batch_size_at); empty: off.
  std::vector<int64_t> rampup_batch_size;
  int64_t seed = 1234;
  int64_t log_interval = 10;
  int64_t eval_interval = 1000;
  int64_t eval_iters = 10;
  int64_t save_interval = 0;  // 0 -> save at the end only (when --save is given)
  std::string save;
  std::string load;
  bool no_load_optim = false;
  bool no_load_rng = false;
  bool finetune = false;
  bool use_checkpoint_args = false;  // --use-checkpoint-args: the architecture from --load's checkpoint (arguments.cpp)
  bool override_config_check = false;  // load a checkpoint of a different model (warns)
  bool no_verify_checksums = false;    // --no-verify-checksums: skip xxh3 checks while loading
  std::string metrics_path;  // JSONL; default <save>/metrics.jsonl when save is set
  std::string timeline;      // Chrome/Perfetto trace of the pipeline schedule (all ranks); empty = off
  bool async_save = false;   // --async-save: snapshot at the step boundary, written by a background thread
  int64_t keep_last_n_checkpoints = 0;  // --keep-last-n-checkpoints: delete older committed ones; 0 = keep all
  int64_t exit_interval = 0;
  // Megatron's --skip-train: no training step (nor save); the end-of-training evaluations of the validation and test
  // sets run on the loaded model (from the checkpoint's consumed validation samples).
  bool skip_train = false;
  bool bf16 = false;  // --bf16: bf16 params/activations with fp32 main params and grads (CUDA only)
  // --device: where the model trains. "auto" = cuda when this build has CUDA and a GPU is visible, else
  // cpu; "cuda" without a GPU is an error.
  std::string device = "auto";
  bool fp16 = false;  // --fp16: accepted for Megatron parity; exclusive with bf16
  // --enable-cuda-graph: capture the training step's forward/backward (all microbatches, zero_grad and the
  // grad sync) in a CUDA graph after cuda_graph_warmup_steps eager steps, then replay it; the optimizer
  // step stays eager. Scope "full_iteration" (Megatron's name) is the one implemented.
  bool enable_cuda_graph = false;
  std::string cuda_graph_scope = "full_iteration";
  int64_t cuda_graph_warmup_steps = 3;
  void validate() const;
};

struct OptimizerConfig {
  std::string optimizer = "adam";
  float lr = 1e-4f;
  float min_lr = 0.0f;
  float lr_warmup_init = 0.0f;      // Megatron's init_lr: warmup ramps from here to lr
  int64_t lr_warmup_iters = 0;
  float lr_warmup_fraction = 0.0f;  // when > 0: warmup = fraction * lr_decay_iters (lr_warmup_iters must be 0)
  int64_t lr_decay_iters = 0;       // 0 -> train_iters (Config::finalize)
  LrDecayStyle lr_decay_style = LrDecayStyle::Linear;
  int64_t lr_wsd_decay_iters = 0;   // WSD: length of the final anneal (required with WSD)
  // The same lengths in samples, for sample-based training (TrainingConfig::train_samples; Megatron's
  // --lr-warmup-samples / --lr-decay-samples / --lr-wsd-decay-samples); lr_decay_samples 0 -> train_samples.
  int64_t lr_warmup_samples = 0;
  int64_t lr_decay_samples = 0;
  int64_t lr_wsd_decay_samples = 0;
  std::string lr_wsd_decay_style = "exponential";  // exponential | linear | cosine | minus_sqrt
  float weight_decay = 0.01f;
  float adam_beta1 = 0.9f;
  float adam_beta2 = 0.999f;
  float adam_eps = 1e-8f;
  float clip_grad = 1.0f;  // 0 disables
  // The schedule's lengths in Megatron's steps (samples): iteration-based, the *_iters times global_batch_size;
  // sample-based, the *_samples. Warmup may be fractional (lr_warmup_fraction * decay).
  struct Lengths {
    double warmup, decay, wsd;
  };
  Lengths lengths(bool sample_based, int64_t global_batch_size) const;
  void validate() const;
};

struct DataConfig {
  // a prefix, or Megatron's blend "weight prefix weight prefix ..." (datasets/blended_dataset.h)
  std::vector<std::string> data_path;
  // Megatron's per-split data (--train-data-path / --valid-data-path / --test-data-path; exclusive with data_path):
  // each split reads the whole of its own prefix or blend (--split does not apply); no valid path: no evaluation.
  // (the test split, of test_data_path or --split's third weight, is evaluated once at the end of training.)
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  std::string split = "969,30,1";
  std::string tokenizer_type = "GPT2BPETokenizer";  // GPT2BPETokenizer | NullTokenizer
  std::string vocab_file;
  std::string merge_file;
  bool eod_mask_loss = false;  // --eod-mask-loss: no loss where the input token is EOD
  // Megatron's parse of --split: ',' or '/' separated weights, padded to 3 with 0, normalized to sum 1.
  std::array<double, 3> split_fractions() const;
  void validate() const;
};

struct Config {
  TransformerConfig model;
  ParallelConfig parallel;
  TrainingConfig training;
  OptimizerConfig optimizer;
  DataConfig data;
  void finalize();        // model.finalize + lr_decay_iters / _samples default + sequence_parallel at tp == 1
  void validate() const;  // each struct's validate + cross-struct rules
  // What only training needs (a data path); separate so forward/generate can use a model-only config.
  void validate_for_training() const;
  // Sets parallel.data_parallel_size = world / (tp * pp * cp), fills the global batch default and
  // checks global_batch_size % (micro_batch_size * dp) == 0; sample-based, sets train_iters = train_samples /
  // global_batch_size (Megatron's update_train_iters). Throws naming the field.
  void apply_world_size(int64_t world_size);
  // The LR schedule's lengths in the training's unit (Megatron's iteration- / sample-based rules); part of validate.
  void validate_lr_schedule() const;
  int64_t num_microbatches() const;  // global / (micro * dp); needs apply_world_size
  // The global batch of the step that starts after `consumed` training samples: global_batch_size, or during a
  // --rampup-batch-size ramp Megatron's start + floor(consumed / (samples / increments)) * increment (up to and
  // including consumed == samples); and its microbatches per DP rank.
  int64_t global_batch_size_at(int64_t consumed) const;
  int64_t num_microbatches_at(int64_t consumed) const;

  // JSON of everything (stored in checkpoints, printed by --print-config). from_json starts from the
  // defaults, takes every key present, and rejects unknown keys and wrong types naming "section.key".
  nlohmann::json to_json() const;
  static Config from_json(const nlohmann::json& j);
  // The fields that change the model's math (architecture, vocab, norms; init, dropout, attention
  // implementation, seq_length and everything outside the model are excluded: they do not change the
  // function a checkpoint computes). Rotary fields only with rope, max_position_embeddings only with
  // learned positions. Used to refuse loading into a different model.
  nlohmann::json math_fields() const;
  std::string fingerprint() const;  // xxh3-64 hex (16 digits) of math_fields().dump()
};

// Fields whose values differ between two math_fields() objects, e.g. {"hidden_size: 64 vs 128"};
// a field present on one side only reads "name: <absent> vs 4".
std::vector<std::string> diff_math_fields(const nlohmann::json& a, const nlohmann::json& b);

}  // namespace mcpp
