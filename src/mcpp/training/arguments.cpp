// Training arguments: TOML recipe -> Config, then Megatron-named CLI11 flags written straight into the
// same Config (CLI11 writes a bound variable only when its flag is given, so flags override the file).
#include "mcpp/training/arguments.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <toml++/toml.h>
#include <utility>

#include "mcpp/core/error.h"
#include "mcpp/core/regular_file.h"
#include "mcpp/core/toml_limits.h"
#include "mcpp/dist_checkpointing/checkpoint.h"

namespace mcpp {

namespace {
// TOML value -> JSON value (tables, arrays, strings, integers, floats, booleans); dates are refused.
nlohmann::json toml_to_json(const toml::node& node, const std::string& path, const std::string& key) {
  if (const auto* t = node.as_table()) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [k, v] : *t) j[std::string(k.str())] = toml_to_json(v, path, std::string(k.str()));
    return j;
  }
  if (const auto* a = node.as_array()) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& v : *a) j.push_back(toml_to_json(v, path, key));
    return j;
  }
  if (const auto* s = node.as_string()) return s->get();
  if (const auto* i = node.as_integer()) return i->get();
  if (const auto* f = node.as_floating_point()) return f->get();
  if (const auto* b = node.as_boolean()) return b->get();
  fail("{}: {}: unsupported TOML value type (dates/times)", path, key);
}
}  // namespace

std::set<std::string> load_toml_config(const std::string& path, Config& cfg) {
  toml::table tbl;
  // A regular file (a FIFO or directory is refused by name), its dotted keys bounded before toml++ nests them.
  const std::string text = read_regular_file(path, "--config file", kMaxTomlBytes);
  check_toml_text(text, path);
  try {
    tbl = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    fail("{}:{}:{}: {}", path, src.begin.line, src.begin.column, e.description());
  }
  nlohmann::json j = toml_to_json(tbl, path, "");
  // from_json starts from defaults; merge: overlay the file's keys onto the current cfg's JSON.
  nlohmann::json base = cfg.to_json();
  for (const auto& [section, fields] : j.items()) {
    if (!fields.is_object() || !base.contains(section)) {
      base[section] = fields;  // from_json reports the unknown section / non-table
      continue;
    }
    for (const auto& [key, value] : fields.items()) base[section][key] = value;
  }
  try {
    cfg = Config::from_json(base);
  } catch (const Error& e) {
    fail("{}: {}", path, e.what());
  }
  std::set<std::string> training_keys;
  if (j.contains("training") && j["training"].is_object())
    for (const auto& [key, value] : j["training"].items()) training_keys.insert(key);
  return training_keys;
}

std::string find_config_flag(const std::vector<std::string>& args) {
  std::string found;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--config" && i + 1 < args.size()) found = args[i + 1];
    else if (args[i].rfind("--config=", 0) == 0) found = args[i].substr(9);
  }
  return found;
}

void add_train_flags(CLI::App& app, Config& cfg, std::string& config_file) {
  TransformerConfig& m = cfg.model;
  ParallelConfig& p = cfg.parallel;
  TrainingConfig& t = cfg.training;
  OptimizerConfig& o = cfg.optimizer;
  DataConfig& d = cfg.data;
  app.add_option("--config", config_file, "TOML recipe; flags given on the command line override it");
  // ---- model
  app.add_option("--num-layers", m.num_layers);
  app.add_option("--hidden-size", m.hidden_size);
  app.add_option("--num-attention-heads", m.num_attention_heads);
  app.add_flag("--group-query-attention", m.group_query_attention, "grouped-query attention (default 1 group)");
  app.add_option("--num-query-groups", m.num_query_groups);
  app.add_option("--ffn-hidden-size", m.ffn_hidden_size);
  app.add_option("--kv-channels", m.kv_channels);
  app.add_option("--seq-length", m.seq_length);
  app.add_option("--max-position-embeddings", m.max_position_embeddings);
  app.add_option_function<std::string>(
      "--normalization", [&m](const std::string& s) { m.normalization = parse_normalization(s, "normalization"); },
      "LayerNorm|RMSNorm");
  app.add_option("--norm-epsilon", m.norm_epsilon);
  app.add_flag("--swiglu", m.swiglu);
  app.add_option_function<std::string>(
      "--position-embedding-type",
      [&m](const std::string& s) { m.position_embedding_type = parse_position_embedding(s, "position_embedding_type"); },
      "learned_absolute|rope|none");
  app.add_option("--rotary-base", m.rotary_base);
  app.add_option("--rotary-percent", m.rotary_percent);
  app.add_flag("--use-rope-scaling", m.use_rope_scaling, "Llama 3.x's RoPE frequency scaling (HF rope_type llama3)");
  app.add_option("--rope-scaling-factor", m.rope_scaling_factor, "the RoPE scaling factor (--use-rope-scaling)");
  app.add_option("--rotary-seq-len-interpolation-factor", m.rotary_seq_len_interpolation_factor,
                 "linear position interpolation: RoPE positions divided by this (HF rope_type linear)");
  app.add_flag("--untie-embeddings-and-output-weights", m.untie_embeddings_and_output_weights);
  app.add_flag_callback("--disable-bias-linear", [&m] { m.add_bias_linear = false; });
  app.add_flag("--add-qkv-bias", m.add_qkv_bias);
  app.add_flag("--qk-layernorm", m.qk_layernorm,
               "normalize each head's query and key (before RoPE); with MLA its q / kv latents");
  app.add_flag("--multi-latent-attention", m.multi_latent_attention, "multi-latent attention (DeepSeek-V2/V3's MLA)");
  app.add_option("--q-lora-rank", m.q_lora_rank, "MLA: the query latent's width (0 = no query compression)");
  app.add_option("--kv-lora-rank", m.kv_lora_rank, "MLA: the key / value latent's width");
  app.add_option("--qk-head-dim", m.qk_head_dim, "MLA: query / key channels per head without positions");
  app.add_option("--qk-pos-emb-head-dim", m.qk_pos_emb_head_dim, "MLA: query / key rotary channels per head");
  app.add_option("--v-head-dim", m.v_head_dim, "MLA: value channels per head");
  app.add_option("--rope-type", m.rope_type, "MLA's RoPE: rope|yarn (default yarn)");
  app.add_option("--rotary-scaling-factor", m.rotary_scaling_factor, "MLA: YaRN's scaling factor (and softmax mscale)");
  app.add_option("--mscale", m.mscale, "MLA: YaRN's mscale");
  app.add_option("--mscale-all-dim", m.mscale_all_dim, "MLA: YaRN's mscale_all_dim");
  app.add_option("--beta-fast", m.beta_fast, "MLA: YaRN's beta_fast");
  app.add_option("--beta-slow", m.beta_slow, "MLA: YaRN's beta_slow");
  app.add_option("--original-max-position-embeddings", m.original_max_position_embeddings,
                 "MLA: YaRN's original context length");
  app.add_option("--hidden-dropout", m.hidden_dropout);
  app.add_option("--attention-dropout", m.attention_dropout);
  app.add_option("--init-method-std", m.init_method_std);
  app.add_option("--make-vocab-size-divisible-by", m.make_vocab_size_divisible_by);
  app.add_option("--vocab-size", m.vocab_size, "vocabulary size (NullTokenizer)");
  app.add_option("--attention-impl", m.attention_impl, "flash|unfused");
  app.add_flag("--deterministic-mode", m.deterministic_mode,
               "bit-identical GPU runs (cuDNN's deterministic attention backward, GEMM autotuning off, ordered "
               "embedding backward)");
  app.add_flag("--apply-query-key-layer-scaling", m.apply_query_key_layer_scaling);
  app.add_option("--recompute-granularity", m.recompute_granularity, "full|selective");
  app.add_option("--recompute-method", m.recompute_method, "uniform|block");
  app.add_option("--recompute-num-layers", m.recompute_num_layers);
  app.add_option("--recompute-modules", m.recompute_modules,
                 "core_attn|mlp|moe|moe_act|shared_experts|layernorm|mla_up_proj ... (selective)");
  app.add_flag("--calculate-per-token-loss", m.calculate_per_token_loss);
  app.add_option("--mtp-num-layers", m.mtp_num_layers,
                 "multi-token prediction: depths on the last pipeline stage, each predicting one more token (0 = off)");
  app.add_option("--mtp-loss-scaling-factor", m.mtp_loss_scaling_factor,
                 "weight of the MTP losses (each depth's: this / --mtp-num-layers)");
  app.add_option("--num-experts", m.num_moe_experts, "mixture of experts: experts per MoE layer (0 = dense)");
  app.add_option("--moe-router-topk", m.moe_router_topk);
  app.add_option("--moe-ffn-hidden-size", m.moe_ffn_hidden_size);
  app.add_flag("--moe-router-pre-softmax", m.moe_router_pre_softmax);
  app.add_option("--moe-router-load-balancing-type", m.moe_router_load_balancing_type,
                 "aux_loss|seq_aux_loss|sinkhorn|none");
  app.add_option("--moe-aux-loss-coeff", m.moe_aux_loss_coeff);
  app.add_option("--moe-z-loss-coeff", m.moe_z_loss_coeff);
  app.add_option("--moe-token-dispatcher-type", m.moe_token_dispatcher_type, "alltoall");
  app.add_option("--moe-router-topk-scaling-factor", m.moe_router_topk_scaling_factor,
                 "multiply the top-k combine weights by this factor (0 = none)");
  app.add_option("--moe-layer-freq", m.moe_layer_freq,
                 "MoE layers: every N-th layer, or a per-layer 0/1 list expression such as \"([1]*3+[0])*2\"");
  app.add_option("--moe-shared-expert-intermediate-size", m.moe_shared_expert_intermediate_size,
                 "width of a shared expert (a dense MLP on every token) in each MoE layer (0 = none)");
  app.add_flag("--moe-shared-expert-gate", m.moe_shared_expert_gate,
               "scale the shared expert's output by a per-token sigmoid gate");
  app.add_option("--moe-input-jitter-eps", m.moe_input_jitter_eps,
                 "multiply the router's input by uniform noise in [1 - eps, 1 + eps) when training (0 = off)");
  app.add_flag("--moe-router-force-load-balancing", m.moe_router_force_load_balancing,
               "route training tokens by random logits (balanced experts, for benchmarks)");
  app.add_option("--moe-expert-capacity-factor", m.moe_expert_capacity_factor,
                 "cap each expert at ceil(tokens * topk / experts * factor) routes, dropping the rest (0 = dropless)");
  app.add_option("--moe-token-drop-policy", m.moe_token_drop_policy, "probs|position");
  app.add_flag("--moe-pad-expert-input-to-capacity", m.moe_pad_expert_input_to_capacity);
  app.add_option("--moe-router-score-function", m.moe_router_score_function, "softmax|sigmoid");
  app.add_option("--moe-router-dtype", m.moe_router_dtype, "fp32 (the router's logits in float32)");
  app.add_flag("--moe-per-layer-logging", m.moe_per_layer_logging);
  app.add_option("--moe-router-num-groups", m.moe_router_num_groups,
                 "group-limited routing: the experts in this many groups (0 = off)");
  app.add_option("--moe-router-group-topk", m.moe_router_group_topk,
                 "group-limited routing: each token's experts come from this many groups");
  app.add_flag("--moe-router-enable-expert-bias", m.moe_router_enable_expert_bias,
               "aux-loss-free load balancing: a per-expert routing bias updated after every step (sigmoid router)");
  app.add_option("--moe-router-bias-update-rate", m.moe_router_bias_update_rate);
  // ---- parallel
  app.add_option("--tensor-model-parallel-size", p.tensor_model_parallel_size);
  app.add_option("--pipeline-model-parallel-size", p.pipeline_model_parallel_size);
  app.add_option("--context-parallel-size", p.context_parallel_size);
  app.add_option("--cp-comm-type", p.cp_comm_type);
  app.add_option("--num-layers-per-virtual-pipeline-stage", p.num_layers_per_virtual_pipeline_stage);
  app.add_flag("--sequence-parallel", p.sequence_parallel);
  app.add_flag("--tp-comm-overlap", p.tp_comm_overlap,
               "SP all-gathers as a ring over TP, each chunk's GEMM overlapping the next transfer");
  app.add_flag("--use-distributed-optimizer", p.use_distributed_optimizer);
  app.add_option("--expert-model-parallel-size", p.expert_model_parallel_size);
  app.add_option("--expert-tensor-parallel-size", p.expert_tensor_parallel_size);
  app.add_option("--rank-order", p.rank_order, "RankGenerator order string (default tp-cp-ep-dp-pp)");
  app.add_option("--pipeline-model-parallel-layout", p.pipeline_model_parallel_layout);
  app.add_option("--decoder-first-pipeline-num-layers", p.decoder_first_pipeline_num_layers);
  app.add_option("--decoder-last-pipeline-num-layers", p.decoder_last_pipeline_num_layers);
  app.add_flag("--account-for-embedding-in-pipeline-split", p.account_for_embedding_in_pipeline_split,
               "count the embedding as a layer when splitting layers over pipeline stages");
  app.add_flag("--account-for-loss-in-pipeline-split", p.account_for_loss_in_pipeline_split,
               "count the loss (output layer) as a layer when splitting layers over pipeline stages");
  app.add_flag("--variable-seq-lengths", p.variable_seq_lengths, "exchange activation shapes between stages");
  app.add_option("--ddp-bucket-size", p.ddp_bucket_size, "elements per gradient bucket");
  app.add_flag("--overlap-grad-reduce", p.overlap_grad_reduce);
  app.add_flag("--overlap-param-gather", p.overlap_param_gather);
  app.add_flag_callback("--no-overwrite-main-grad", [&p] { p.overwrite_main_grad = false; },
                        "zero the grad buffer at each step's start instead of each parameter's first gradient "
                        "write overwriting its main grad (same values; for A/B runs)");
  app.add_option("--distributed-timeout-minutes", p.distributed_timeout_minutes);
  app.add_flag("--check-collectives", p.check_collectives, "compare a fingerprint of every collective across ranks");
  // ---- training
  app.add_option("--micro-batch-size", t.micro_batch_size);
  app.add_option("--global-batch-size", t.global_batch_size);
  app.add_option("--train-iters", t.train_iters);
  app.add_option("--rampup-batch-size", t.rampup_batch_size,
                 "START INCREMENT SAMPLES: grow the global batch from START by INCREMENT over SAMPLES (with "
                 "--train-samples)")
      ->expected(3);
  app.add_option("--train-samples", t.train_samples,
                 "sample-based training: train_samples / global_batch_size iterations (exclusive with --train-iters)");
  app.add_option("--seed", t.seed);
  app.add_option("--log-interval", t.log_interval);
  app.add_option("--eval-interval", t.eval_interval);
  app.add_option("--eval-iters", t.eval_iters);
  app.add_option("--save-interval", t.save_interval);
  app.add_option("--save", t.save);
  app.add_option("--load", t.load);
  app.add_flag("--no-load-optim", t.no_load_optim);
  app.add_flag("--no-load-rng", t.no_load_rng);
  app.add_flag("--finetune", t.finetune);
  app.add_flag("--use-checkpoint-args", t.use_checkpoint_args,
               "take the model's architecture (layers, sizes, heads, norms, positions, biases, experts and routing) "
               "from the checkpoint in --load");
  app.add_flag("--override-config-check", t.override_config_check);
  app.add_flag("--no-verify-checksums", t.no_verify_checksums);
  app.add_option("--metrics-path", t.metrics_path, "JSONL metrics file");
  app.add_option("--timeline", t.timeline, "write a Chrome/Perfetto trace of the pipeline schedule (all ranks) to PATH");
  app.add_option("--exit-interval", t.exit_interval);
  app.add_flag("--skip-train", t.skip_train,
               "no training: evaluate the loaded model on the validation and test sets (Megatron's), no save");
  app.add_flag("--async-save", t.async_save, "write checkpoints from a background thread");
  app.add_option("--keep-last-n-checkpoints", t.keep_last_n_checkpoints, "0 keeps all");
  app.add_flag("--bf16", t.bf16);
  app.add_option("--device", t.device, "auto|cpu|cuda (auto: cuda when a GPU is visible)");
  app.add_flag("--fp16", t.fp16);
  app.add_flag("--enable-cuda-graph", t.enable_cuda_graph,
               "capture the training step's forward/backward in a CUDA graph after the warm-up steps");
  app.add_option("--cuda-graph-scope", t.cuda_graph_scope, "full_iteration (the implemented scope)");
  app.add_option("--cuda-graph-warmup-steps", t.cuda_graph_warmup_steps, "eager steps before the capture");
  // ---- observability (docs/OBSERVABILITY.md)
  app.add_flag_callback("--no-per-rank-metrics", [&t] { t.per_rank_metrics = false; },
                        "only the last rank writes metrics (default: every rank its <metrics stem>.rank_<r>.jsonl)");
  app.add_option("--timing-log-level", t.timing_log_level, "Megatron's timers: 0 none, 1 step phases, 2 + schedule");
  app.add_option("--timing-log-option", t.timing_log_option, "timers over ranks: max|minmax|all");
  app.add_option("--peak-tflops", t.peak_tflops, "peak TFLOP/s per GPU (rank) for MFU (default: a known GPU's bf16)");
  app.add_flag("--log-straggler", t.log_straggler, "per log interval: slowest / fastest rank's step and phase times");
  app.add_option("--straggler-threshold", t.straggler_threshold, "with --log-straggler: name ranks this % slower");
  app.add_option("--tensorboard-dir", t.tensorboard_dir, "write TensorBoard event files here (last rank)");
  app.add_option("--tensorboard-log-interval", t.tensorboard_log_interval);
  app.add_flag("--log-timers-to-tensorboard", t.log_timers_to_tensorboard);
  app.add_flag("--log-memory-to-tensorboard", t.log_memory_to_tensorboard);
  app.add_flag("--log-validation-ppl-to-tensorboard", t.log_validation_ppl_to_tensorboard);
  app.add_option("--trace-modules", t.trace_modules, "print iteration N's module tree (shapes, dtypes, ops)");
  // ---- optimizer
  app.add_option("--optimizer", o.optimizer, "adam");
  app.add_option("--lr", o.lr);
  app.add_option("--min-lr", o.min_lr);
  app.add_option("--lr-warmup-init", o.lr_warmup_init);
  app.add_option("--lr-warmup-iters", o.lr_warmup_iters);
  app.add_option("--lr-warmup-fraction", o.lr_warmup_fraction);
  app.add_option("--lr-decay-iters", o.lr_decay_iters);
  app.add_option_function<std::string>(
      "--lr-decay-style", [&o](const std::string& s) { o.lr_decay_style = parse_lr_decay_style(s, "lr_decay_style"); },
      "constant|linear|cosine|inverse-square-root|WSD");
  app.add_option("--lr-wsd-decay-iters", o.lr_wsd_decay_iters);
  app.add_option("--lr-wsd-decay-style", o.lr_wsd_decay_style, "exponential|linear|cosine|minus_sqrt");
  app.add_option("--lr-warmup-samples", o.lr_warmup_samples, "with --train-samples");
  app.add_option("--lr-decay-samples", o.lr_decay_samples, "with --train-samples (default: train_samples)");
  app.add_option("--lr-wsd-decay-samples", o.lr_wsd_decay_samples, "with --train-samples");
  app.add_option("--weight-decay", o.weight_decay);
  app.add_option("--adam-beta1", o.adam_beta1);
  app.add_option("--adam-beta2", o.adam_beta2);
  app.add_option("--adam-eps", o.adam_eps);
  app.add_option("--clip-grad", o.clip_grad);
  // ---- data
  app.add_option("--data-path", d.data_path, "a dataset prefix, or a blend: WEIGHT PREFIX WEIGHT PREFIX ...")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  for (auto [flag, path] : {std::pair{"--train-data-path", &d.train_data_path},
                             std::pair{"--valid-data-path", &d.valid_data_path},
                             std::pair{"--test-data-path", &d.test_data_path}})
    app.add_option(flag, *path,
                   "this split's prefix or blend (instead of --data-path and --split; the test split is evaluated "
                   "once at the end of training)")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--split", d.split);
  app.add_flag("--eod-mask-loss", d.eod_mask_loss);
  app.add_option("--tokenizer-type", d.tokenizer_type,
                 "GPT2BPETokenizer|HuggingFaceTokenizer|SentencePieceTokenizer|NullTokenizer");
  app.add_option("--tokenizer-model", d.tokenizer_model,
                 "HuggingFaceTokenizer: directory with tokenizer.json; SentencePieceTokenizer: tokenizer.model");
  app.add_option("--vocab-file", d.vocab_file);
  app.add_option("--merge-file", d.merge_file);
}

namespace {
// Megatron's --use-checkpoint-args: the architecture fields (those of Config::math_fields, in TransformerConfig's
// terms) from the config stored in the latest checkpoint under --load, over what the flags and the config file
// said; the vocabulary stays the tokenizer's (a mismatch is the load's named fingerprint error). No checkpoint there
// yet: the given arguments stand (as Megatron's).
void use_checkpoint_args(Config& cfg) {
  const std::string& dir = cfg.training.load;
  if (dir.empty()) fail("--use-checkpoint-args needs --load (the checkpoint whose model arguments to use)");
  if (dist_checkpointing::latest_iteration(dir) < 0 && dist_checkpointing::list_iterations(dir).empty()) return;
  const dist_checkpointing::CheckpointReader reader(dir);
  if (!reader.meta().contains("config"))
    fail("--use-checkpoint-args: checkpoint '{}' stores no config (manifest meta.config)", reader.dir());
  const TransformerConfig k = Config::from_json(reader.meta()["config"]).model;
  TransformerConfig& m = cfg.model;
  m.num_layers = k.num_layers;
  m.hidden_size = k.hidden_size;
  m.num_attention_heads = k.num_attention_heads;
  m.group_query_attention = k.group_query_attention;
  m.num_query_groups = k.num_query_groups;
  m.ffn_hidden_size = k.ffn_hidden_size;
  m.kv_channels = k.kv_channels;
  m.max_position_embeddings = k.max_position_embeddings;
  m.normalization = k.normalization;
  m.norm_epsilon = k.norm_epsilon;
  m.swiglu = k.swiglu;
  m.position_embedding_type = k.position_embedding_type;
  m.rotary_base = k.rotary_base;
  m.rotary_percent = k.rotary_percent;
  m.use_rope_scaling = k.use_rope_scaling;
  m.rope_scaling_factor = k.rope_scaling_factor;
  m.rotary_seq_len_interpolation_factor = k.rotary_seq_len_interpolation_factor;
  m.untie_embeddings_and_output_weights = k.untie_embeddings_and_output_weights;
  m.add_bias_linear = k.add_bias_linear;
  m.add_qkv_bias = k.add_qkv_bias;
  m.qk_layernorm = k.qk_layernorm;
  m.multi_latent_attention = k.multi_latent_attention;
  m.q_lora_rank = k.q_lora_rank;
  m.kv_lora_rank = k.kv_lora_rank;
  m.qk_head_dim = k.qk_head_dim;
  m.qk_pos_emb_head_dim = k.qk_pos_emb_head_dim;
  m.v_head_dim = k.v_head_dim;
  m.rope_type = k.rope_type;
  m.rotary_scaling_factor = k.rotary_scaling_factor;
  m.mscale = k.mscale;
  m.mscale_all_dim = k.mscale_all_dim;
  m.beta_fast = k.beta_fast;
  m.beta_slow = k.beta_slow;
  m.original_max_position_embeddings = k.original_max_position_embeddings;
  m.mtp_num_layers = k.mtp_num_layers;  // the depths' parameters are the checkpoint's (their loss weight is not)
  m.make_vocab_size_divisible_by = k.make_vocab_size_divisible_by;
  m.num_moe_experts = k.num_moe_experts;
  m.moe_router_topk = k.moe_router_topk;
  m.moe_ffn_hidden_size = k.moe_ffn_hidden_size;
  m.moe_router_pre_softmax = k.moe_router_pre_softmax;
  m.moe_layer_freq = k.moe_layer_freq;
  m.moe_shared_expert_intermediate_size = k.moe_shared_expert_intermediate_size;
  m.moe_shared_expert_gate = k.moe_shared_expert_gate;
  m.moe_router_score_function = k.moe_router_score_function;
  m.moe_router_topk_scaling_factor = k.moe_router_topk_scaling_factor;
  m.moe_router_enable_expert_bias = k.moe_router_enable_expert_bias;
  m.moe_router_num_groups = k.moe_router_num_groups;
  m.moe_router_group_topk = k.moe_router_group_topk;
  m.moe_expert_capacity_factor = k.moe_expert_capacity_factor;
  m.moe_token_drop_policy = k.moe_token_drop_policy;
  m.moe_pad_expert_input_to_capacity = k.moe_pad_expert_input_to_capacity;
  if (k.moe_router_load_balancing_type == "sinkhorn") m.moe_router_load_balancing_type = "sinkhorn";
}
}  // namespace

Config parse_train_args(const std::vector<std::string>& args) {
  Config cfg;
  std::string config_file = find_config_flag(args);
  std::set<std::string> file_training;
  if (!config_file.empty()) file_training = load_toml_config(config_file, cfg);
  CLI::App app{"mcpp train"};
  app.allow_extras(false);
  // A flag given twice takes its last value, as Megatron-LM's argparse does (scripts append overrides).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  add_train_flags(app, cfg, config_file);
  std::vector<std::string> rev(args.rbegin(), args.rend());  // CLI11 parses a reversed vector
  try {
    app.parse(rev);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());  // `mcpp train --help`: the caller's catch of CLI::Success exits 0
    throw;
  }
  // A file value of lr_warmup_iters must not block a --lr-warmup-fraction on the command line (and
  // vice versa): the flag that is given wins (Megatron accepts only one of the two).
  if (app.count("--lr-warmup-fraction") && !app.count("--lr-warmup-iters")) cfg.optimizer.lr_warmup_iters = 0;
  if (app.count("--lr-warmup-iters") && !app.count("--lr-warmup-fraction")) cfg.optimizer.lr_warmup_fraction = 0;
  // Iteration- or sample-based training (Megatron accepts one): a flag overrides the file's other key; both flags, or
  // both keys in the file, are an error. Sample-based, train_iters is derived (Config::apply_world_size).
  const bool iters_flag = app.count("--train-iters") > 0, samples_flag = app.count("--train-samples") > 0;
  if (iters_flag && samples_flag)
    fail("--train-iters and --train-samples are both given; give one (iteration- or sample-based training)");
  if (iters_flag) cfg.training.train_samples = 0;
  if (cfg.training.train_samples > 0) {
    if (!samples_flag && file_training.count("train_iters"))
      fail("{}: train_iters and train_samples are both set; give one (iteration- or sample-based training)",
           config_file);
    cfg.training.train_iters = 0;
  }
  if (cfg.training.use_checkpoint_args) use_checkpoint_args(cfg);
  cfg.finalize();
  cfg.validate();
  return cfg;
}

std::string format_args(const Config& cfg) {
  std::vector<std::pair<std::string, std::string>> rows;
  nlohmann::json j = cfg.to_json();
  for (const auto& [section, fields] : j.items()) {
    for (const auto& [key, value] : fields.items()) {
      std::string text;
      if (value.is_string()) text = value.get<std::string>();
      else if (value.is_boolean()) text = value.get<bool>() ? "True" : "False";
      else text = value.dump();
      rows.emplace_back(key, text);
    }
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    std::string la = a.first, lb = b.first;
    std::transform(la.begin(), la.end(), la.begin(), ::tolower);
    std::transform(lb.begin(), lb.end(), lb.begin(), ::tolower);
    return la < lb;
  });
  std::string out = "------------------------ arguments ------------------------\n";
  for (const auto& [name, text] : rows) {
    size_t ndots = name.size() < 48 ? 48 - name.size() : 1;
    out += fmt::format("  {} {} {}\n", name, std::string(ndots, '.'), text);
  }
  out += "-------------------- end of arguments ---------------------\n";
  return out;
}

}  // namespace mcpp
