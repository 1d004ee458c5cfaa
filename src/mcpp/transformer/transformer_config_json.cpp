// Config's JSON (transformer_config.h): one field list per struct (visit_* below: to_json, from_json and the
// Megatron-style print all walk the same list), and the math fingerprint (xxh3-64 of math_fields()).
#include <fmt/format.h>
#include <xxhash.h>

#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mcpp/core/error.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp {

// ---------------------------------------------------------------- field lists
// visit(v, cfg) calls v("name", field) for every field of the struct, in declaration order.
namespace {
template <class M, class V> void visit_model(M& m, V&& v) {
  v("num_layers", m.num_layers);
  v("hidden_size", m.hidden_size);
  v("num_attention_heads", m.num_attention_heads);
  v("group_query_attention", m.group_query_attention);
  v("num_query_groups", m.num_query_groups);
  v("ffn_hidden_size", m.ffn_hidden_size);
  v("kv_channels", m.kv_channels);
  v("seq_length", m.seq_length);
  v("max_position_embeddings", m.max_position_embeddings);
  v("normalization", m.normalization);
  v("norm_epsilon", m.norm_epsilon);
  v("swiglu", m.swiglu);
  v("position_embedding_type", m.position_embedding_type);
  v("rotary_base", m.rotary_base);
  v("rotary_percent", m.rotary_percent);
  v("use_rope_scaling", m.use_rope_scaling);
  v("rope_scaling_factor", m.rope_scaling_factor);
  v("rotary_seq_len_interpolation_factor", m.rotary_seq_len_interpolation_factor);
  v("untie_embeddings_and_output_weights", m.untie_embeddings_and_output_weights);
  v("add_bias_linear", m.add_bias_linear);
  v("add_qkv_bias", m.add_qkv_bias);
  v("qk_layernorm", m.qk_layernorm);
  v("multi_latent_attention", m.multi_latent_attention);
  v("q_lora_rank", m.q_lora_rank);
  v("kv_lora_rank", m.kv_lora_rank);
  v("qk_head_dim", m.qk_head_dim);
  v("qk_pos_emb_head_dim", m.qk_pos_emb_head_dim);
  v("v_head_dim", m.v_head_dim);
  v("rope_type", m.rope_type);
  v("rotary_scaling_factor", m.rotary_scaling_factor);
  v("mscale", m.mscale);
  v("mscale_all_dim", m.mscale_all_dim);
  v("beta_fast", m.beta_fast);
  v("beta_slow", m.beta_slow);
  v("original_max_position_embeddings", m.original_max_position_embeddings);
  v("hidden_dropout", m.hidden_dropout);
  v("attention_dropout", m.attention_dropout);
  v("init_method_std", m.init_method_std);
  v("padded_vocab_size", m.padded_vocab_size);
  v("vocab_size", m.vocab_size);
  v("make_vocab_size_divisible_by", m.make_vocab_size_divisible_by);
  v("attention_impl", m.attention_impl);
  v("deterministic_mode", m.deterministic_mode);
  v("apply_query_key_layer_scaling", m.apply_query_key_layer_scaling);
  v("recompute_granularity", m.recompute_granularity);
  v("recompute_method", m.recompute_method);
  v("recompute_num_layers", m.recompute_num_layers);
  v("recompute_modules", m.recompute_modules);
  v("calculate_per_token_loss", m.calculate_per_token_loss);
  v("mtp_num_layers", m.mtp_num_layers);
  v("mtp_loss_scaling_factor", m.mtp_loss_scaling_factor);
  v("num_moe_experts", m.num_moe_experts);
  v("moe_router_topk", m.moe_router_topk);
  v("moe_ffn_hidden_size", m.moe_ffn_hidden_size);
  v("moe_router_pre_softmax", m.moe_router_pre_softmax);
  v("moe_router_load_balancing_type", m.moe_router_load_balancing_type);
  v("moe_aux_loss_coeff", m.moe_aux_loss_coeff);
  v("moe_z_loss_coeff", m.moe_z_loss_coeff);
  v("moe_token_dispatcher_type", m.moe_token_dispatcher_type);
  v("moe_router_topk_scaling_factor", m.moe_router_topk_scaling_factor);
  v("moe_layer_freq", m.moe_layer_freq);
  v("moe_shared_expert_intermediate_size", m.moe_shared_expert_intermediate_size);
  v("moe_expert_capacity_factor", m.moe_expert_capacity_factor);
  v("moe_token_drop_policy", m.moe_token_drop_policy);
  v("moe_router_score_function", m.moe_router_score_function);
  v("moe_router_dtype", m.moe_router_dtype);
  v("moe_per_layer_logging", m.moe_per_layer_logging);
  v("moe_shared_expert_gate", m.moe_shared_expert_gate);
  v("moe_input_jitter_eps", m.moe_input_jitter_eps);
  v("moe_router_force_load_balancing", m.moe_router_force_load_balancing);
  v("moe_router_num_groups", m.moe_router_num_groups);
  v("moe_router_group_topk", m.moe_router_group_topk);
  v("moe_router_enable_expert_bias", m.moe_router_enable_expert_bias);
  v("moe_router_bias_update_rate", m.moe_router_bias_update_rate);
  v("moe_pad_expert_input_to_capacity", m.moe_pad_expert_input_to_capacity);
}
template <class P, class V> void visit_parallel(P& p, V&& v) {
  v("tensor_model_parallel_size", p.tensor_model_parallel_size);
  v("pipeline_model_parallel_size", p.pipeline_model_parallel_size);
  v("context_parallel_size", p.context_parallel_size);
  v("cp_comm_type", p.cp_comm_type);
  v("num_layers_per_virtual_pipeline_stage", p.num_layers_per_virtual_pipeline_stage);
  v("sequence_parallel", p.sequence_parallel);
  v("tp_comm_overlap", p.tp_comm_overlap);
  v("use_distributed_optimizer", p.use_distributed_optimizer);
  v("expert_model_parallel_size", p.expert_model_parallel_size);
  v("expert_tensor_parallel_size", p.expert_tensor_parallel_size);
  v("rank_order", p.rank_order);
  v("pipeline_model_parallel_layout", p.pipeline_model_parallel_layout);
  v("decoder_first_pipeline_num_layers", p.decoder_first_pipeline_num_layers);
  v("decoder_last_pipeline_num_layers", p.decoder_last_pipeline_num_layers);
  v("account_for_embedding_in_pipeline_split", p.account_for_embedding_in_pipeline_split);
  v("account_for_loss_in_pipeline_split", p.account_for_loss_in_pipeline_split);
  v("variable_seq_lengths", p.variable_seq_lengths);
  v("ddp_bucket_size", p.ddp_bucket_size);
  v("overlap_grad_reduce", p.overlap_grad_reduce);
  v("overlap_param_gather", p.overlap_param_gather);
  v("overwrite_main_grad", p.overwrite_main_grad);
  v("distributed_timeout_minutes", p.distributed_timeout_minutes);
  v("check_collectives", p.check_collectives);
  v("data_parallel_size", p.data_parallel_size);
}
template <class T, class V> void visit_training(T& t, V&& v) {
  v("micro_batch_size", t.micro_batch_size);
  v("global_batch_size", t.global_batch_size);
  v("train_iters", t.train_iters);
  v("train_samples", t.train_samples);
  v("rampup_batch_size", t.rampup_batch_size);
  v("seed", t.seed);
  v("log_interval", t.log_interval);
  v("eval_interval", t.eval_interval);
  v("eval_iters", t.eval_iters);
  v("save_interval", t.save_interval);
  v("save", t.save);
  v("load", t.load);
  v("no_load_optim", t.no_load_optim);
  v("no_load_rng", t.no_load_rng);
  v("finetune", t.finetune);
  v("use_checkpoint_args", t.use_checkpoint_args);
  v("override_config_check", t.override_config_check);
  v("no_verify_checksums", t.no_verify_checksums);
  v("metrics_path", t.metrics_path);
  v("timeline", t.timeline);
  v("async_save", t.async_save);
  v("keep_last_n_checkpoints", t.keep_last_n_checkpoints);
  v("exit_interval", t.exit_interval);
  v("skip_train", t.skip_train);
  v("bf16", t.bf16);
  v("device", t.device);
  v("fp16", t.fp16);
  v("enable_cuda_graph", t.enable_cuda_graph);
  v("cuda_graph_scope", t.cuda_graph_scope);
  v("cuda_graph_warmup_steps", t.cuda_graph_warmup_steps);
  // observability (not math fields)
  v("per_rank_metrics", t.per_rank_metrics);
  v("timing_log_level", t.timing_log_level);
  v("timing_log_option", t.timing_log_option);
  v("peak_tflops", t.peak_tflops);
  v("log_straggler", t.log_straggler);
  v("straggler_threshold", t.straggler_threshold);
  v("tensorboard_dir", t.tensorboard_dir);
  v("tensorboard_log_interval", t.tensorboard_log_interval);
  v("log_timers_to_tensorboard", t.log_timers_to_tensorboard);
  v("log_memory_to_tensorboard", t.log_memory_to_tensorboard);
  v("log_validation_ppl_to_tensorboard", t.log_validation_ppl_to_tensorboard);
  v("trace_modules", t.trace_modules);
}
template <class O, class V> void visit_optimizer(O& o, V&& v) {
  v("optimizer", o.optimizer);
  v("lr", o.lr);
  v("min_lr", o.min_lr);
  v("lr_warmup_init", o.lr_warmup_init);
  v("lr_warmup_iters", o.lr_warmup_iters);
  v("lr_warmup_fraction", o.lr_warmup_fraction);
  v("lr_decay_iters", o.lr_decay_iters);
  v("lr_decay_style", o.lr_decay_style);
  v("lr_wsd_decay_iters", o.lr_wsd_decay_iters);
  v("lr_wsd_decay_style", o.lr_wsd_decay_style);
  v("lr_warmup_samples", o.lr_warmup_samples);
  v("lr_decay_samples", o.lr_decay_samples);
  v("lr_wsd_decay_samples", o.lr_wsd_decay_samples);
  v("weight_decay", o.weight_decay);
  v("adam_beta1", o.adam_beta1);
  v("adam_beta2", o.adam_beta2);
  v("adam_eps", o.adam_eps);
  v("clip_grad", o.clip_grad);
}
template <class D, class V> void visit_data(D& d, V&& v) {
  v("data_path", d.data_path);
  v("train_data_path", d.train_data_path);
  v("valid_data_path", d.valid_data_path);
  v("test_data_path", d.test_data_path);
  v("split", d.split);
  v("eod_mask_loss", d.eod_mask_loss);
  v("tokenizer_type", d.tokenizer_type);
  v("tokenizer_model", d.tokenizer_model);
  v("vocab_file", d.vocab_file);
  v("merge_file", d.merge_file);
}
template <class C, class V> void visit_sections(C& c, V&& v) {
  v("model", [&](auto&& f) { visit_model(c.model, f); });
  v("parallel", [&](auto&& f) { visit_parallel(c.parallel, f); });
  v("training", [&](auto&& f) { visit_training(c.training, f); });
  v("optimizer", [&](auto&& f) { visit_optimizer(c.optimizer, f); });
  v("data", [&](auto&& f) { visit_data(c.data, f); });
}

nlohmann::json json_value(Normalization x) { return to_string(x); }
nlohmann::json json_value(PositionEmbedding x) { return to_string(x); }
nlohmann::json json_value(LrDecayStyle x) { return to_string(x); }
// Floats go out as the double nearest their shortest decimal form (1e-05, not 9.99999974e-06): the JSON
// reads as written and still converts back to the identical float.
nlohmann::json json_value(float x) { return std::stod(fmt::format("{}", x)); }
template <class T> nlohmann::json json_value(const T& x) { return x; }

struct JsonReader {
  std::string section;
  const nlohmann::json& obj;
  std::string where(const char* name) const { return section + "." + name; }
  [[noreturn]] void bad_type(const char* name, const char* want, const nlohmann::json& got) const {
    fail("{}: expected {}, got {}", where(name), want, got.dump());
  }
  template <class T> void operator()(const char* name, T& field) const {
    auto it = obj.find(name);
    if (it == obj.end()) return;
    const nlohmann::json& x = *it;
    if constexpr (std::is_same_v<T, bool>) {
      if (!x.is_boolean()) bad_type(name, "true/false", x);
      field = x.get<bool>();
    } else if constexpr (std::is_same_v<T, int64_t>) {
      if (!x.is_number_integer()) bad_type(name, "an integer", x);
      field = x.get<int64_t>();
    } else if constexpr (std::is_same_v<T, float>) {
      if (!x.is_number()) bad_type(name, "a number", x);
      field = x.get<float>();
    } else if constexpr (std::is_same_v<T, double>) {
      if (!x.is_number()) bad_type(name, "a number", x);
      field = x.get<double>();
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!x.is_string()) bad_type(name, "a string", x);
      field = x.get<std::string>();
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      if (x.is_string()) {
        field = {x.get<std::string>()};
        return;
      }
      if (!x.is_array()) bad_type(name, "a list of strings", x);
      field.clear();
      for (const auto& e : x) {
        if (!e.is_string()) bad_type(name, "a list of strings", x);
        field.push_back(e.get<std::string>());
      }
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      if (!x.is_array()) bad_type(name, "a list of integers", x);
      field.clear();
      for (const auto& e : x) {
        if (!e.is_number_integer()) bad_type(name, "a list of integers", x);
        field.push_back(e.get<int64_t>());
      }
    } else {
      if (!x.is_string()) bad_type(name, "a string", x);
      if constexpr (std::is_same_v<T, Normalization>) field = parse_normalization(x.get<std::string>(), where(name));
      else if constexpr (std::is_same_v<T, PositionEmbedding>)
        field = parse_position_embedding(x.get<std::string>(), where(name));
      else field = parse_lr_decay_style(x.get<std::string>(), where(name));
    }
  }
};
}  // namespace

nlohmann::json Config::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  visit_sections(*this, [&](const char* section, auto&& walk) {
    nlohmann::json s = nlohmann::json::object();
    walk([&](const char* name, const auto& field) { s[name] = json_value(field); });
    j[section] = std::move(s);
  });
  return j;
}

Config Config::from_json(const nlohmann::json& j) {
  Config c;
  if (!j.is_object()) fail("config: expected a JSON object, got {}", j.type_name());
  std::set<std::string> sections;
  visit_sections(c, [&](const char* section, auto&& walk) {
    sections.insert(section);
    auto it = j.find(section);
    if (it == j.end()) return;
    if (!it->is_object()) fail("{}: expected a table of fields, got {}", section, it->dump());
    std::set<std::string> known;
    walk([&](const char* name, auto&) { known.insert(name); });
    for (const auto& [key, _] : it->items())
      if (!known.count(key)) fail("{}.{}: unknown field", section, key);
    walk(JsonReader{section, *it});
  });
  for (const auto& [key, _] : j.items())
    if (!sections.count(key)) fail("{}: unknown section (expected model|parallel|training|optimizer|data)", key);
  return c;
}

nlohmann::json Config::math_fields() const {
  const TransformerConfig& m = model;
  nlohmann::json j = {
      {"num_layers", m.num_layers},
      {"hidden_size", m.hidden_size},
      {"num_attention_heads", m.num_attention_heads},
      {"num_query_groups", m.num_query_groups},
      {"ffn_hidden_size", m.ffn_hidden_size},
      {"kv_channels", m.kv_channels},
      {"normalization", to_string(m.normalization)},
      {"norm_epsilon", json_value(m.norm_epsilon)},
      {"swiglu", m.swiglu},
      {"position_embedding_type", to_string(m.position_embedding_type)},
      {"untie_embeddings_and_output_weights", m.untie_embeddings_and_output_weights},
      {"add_bias_linear", m.add_bias_linear},
      {"qkv_bias", m.qkv_bias()},
      {"vocab_size", m.vocab_size},
      {"padded_vocab_size", m.padded_vocab_size},
  };
  if (m.num_moe_experts > 0) {  // the routing and the experts' width change the function
    j["num_moe_experts"] = m.num_moe_experts;
    j["moe_router_topk"] = m.moe_router_topk;
    j["moe_ffn_hidden_size"] = m.moe_ffn_hidden_size;
    j["moe_router_pre_softmax"] = m.moe_router_pre_softmax;
    const std::vector<bool> pattern = m.moe_layer_pattern();  // which layers route (the expanded form)
    if (std::find(pattern.begin(), pattern.end(), false) != pattern.end()) {
      std::string flags;
      for (bool b : pattern) flags += b ? '1' : '0';
      j["moe_layer_pattern"] = flags;
    }
    if (m.moe_shared_expert_intermediate_size > 0)
      j["moe_shared_expert_intermediate_size"] = m.moe_shared_expert_intermediate_size;
    if (m.moe_shared_expert_gate) j["moe_shared_expert_gate"] = true;
    if (m.moe_router_load_balancing_type == "sinkhorn") j["moe_router_load_balancing_type"] = "sinkhorn";
    if (m.moe_router_topk_scaling_factor > 0.0f)
      j["moe_router_topk_scaling_factor"] = json_value(m.moe_router_topk_scaling_factor);
    if (m.moe_router_score_function != "softmax") j["moe_router_score_function"] = m.moe_router_score_function;
    if (m.moe_router_enable_expert_bias) j["moe_router_enable_expert_bias"] = true;
    if (m.moe_router_num_groups > 0) {
      j["moe_router_num_groups"] = m.moe_router_num_groups;
      j["moe_router_group_topk"] = m.moe_router_group_topk;
    }
    if (m.moe_expert_capacity_factor > 0.0) {  // which routes are dropped (padding changes no value)
      j["moe_expert_capacity_factor"] = m.moe_expert_capacity_factor;
      j["moe_token_drop_policy"] = m.moe_token_drop_policy;
    }
  }
  if (m.position_embedding_type == PositionEmbedding::LearnedAbsolute)
    j["max_position_embeddings"] = m.max_position_embeddings;
  if (m.position_embedding_type == PositionEmbedding::Rope) {
    j["rotary_base"] = json_value(m.rotary_base);
    j["rotary_percent"] = json_value(m.rotary_percent);
    if (m.use_rope_scaling) j["rope_scaling_factor"] = json_value(m.rope_scaling_factor);  // absent when off
    if (m.rotary_seq_len_interpolation_factor > 0.0f)
      j["rotary_seq_len_interpolation_factor"] = json_value(m.rotary_seq_len_interpolation_factor);
  }
  if (m.multi_latent_attention) {  // absent when off: older checkpoints keep their fingerprint
    j["multi_latent_attention"] = true;
    j["q_lora_rank"] = m.q_lora_rank;
    j["kv_lora_rank"] = m.kv_lora_rank;
    j["qk_head_dim"] = m.qk_head_dim;
    j["qk_pos_emb_head_dim"] = m.qk_pos_emb_head_dim;
    j["v_head_dim"] = m.v_head_dim;
    j["rope_type"] = m.mla_yarn() ? "yarn" : "rope";
    j["rotary_scaling_factor"] = json_value(m.rotary_scaling_factor);  // the softmax scale with either type
    j["mscale_all_dim"] = json_value(m.mscale_all_dim);
    if (m.mla_yarn()) {
      j["mscale"] = json_value(m.mscale);
      j["beta_fast"] = json_value(m.beta_fast);
      j["beta_slow"] = json_value(m.beta_slow);
      j["original_max_position_embeddings"] = m.original_max_position_embeddings;
    }
  }
  if (m.qk_layernorm) j["qk_layernorm"] = true;  // absent when off: older checkpoints keep their fingerprint
  if (m.mtp_num_layers > 0) j["mtp_num_layers"] = m.mtp_num_layers;  // the depths' parameters (not their weight)
  return j;
}

std::string Config::fingerprint() const {
  std::string s = math_fields().dump();
  return fmt::format("{:016x}", static_cast<uint64_t>(XXH3_64bits(s.data(), s.size())));
}

std::vector<std::string> diff_math_fields(const nlohmann::json& a, const nlohmann::json& b) {
  std::set<std::string> keys;
  for (const auto& [k, _] : a.items()) keys.insert(k);
  for (const auto& [k, _] : b.items()) keys.insert(k);
  std::vector<std::string> out;
  for (const auto& k : keys) {
    bool in_a = a.contains(k), in_b = b.contains(k);
    if (in_a && in_b && a[k] == b[k]) continue;
    out.push_back(fmt::format("{}: {} vs {}", k, in_a ? a[k].dump() : "<absent>", in_b ? b[k].dump() : "<absent>"));
  }
  return out;
}

}  // namespace mcpp
