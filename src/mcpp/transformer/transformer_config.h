// Typed configuration (DESIGN.md decision 6): small structs per concern, each with validate() that names
// the offending field (throws mcpp::Error). Field names follow Megatron-LM's flags with '-' -> '_'.
// Parsing (TOML --config file, then Megatron-named CLI flags that override it) lives in
// training/arguments.h; the math fingerprint in fingerprint().
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mcpp {

enum class Normalization { LayerNorm, RMSNorm };
enum class PositionEmbedding { LearnedAbsolute, Rope, None };
enum class LrDecayStyle { Constant, Linear, Cosine, InverseSquareRoot, WSD };

struct TransformerConfig {
  int64_t num_layers = 2;
  int64_t hidden_size = 64;
  int64_t num_attention_heads = 4;
  int64_t num_query_groups = 0;   // 0 -> = num_attention_heads (MHA)
  int64_t ffn_hidden_size = 0;    // 0 -> 4*h (GELU) or Megatron's swiglu default
  int64_t kv_channels = 0;        // head dim; 0 -> h / heads
  int64_t seq_length = 64;
  int64_t max_position_embeddings = 0;  // 0 -> seq_length
  Normalization normalization = Normalization::LayerNorm;
  float norm_epsilon = 1e-5f;
  bool swiglu = false;
  PositionEmbedding position_embedding_type = PositionEmbedding::LearnedAbsolute;
  float rotary_base = 10000.0f;
  float rotary_percent = 1.0f;
  bool untie_embeddings_and_output_weights = false;
  bool add_bias_linear = true;  // --disable-bias-linear sets false
  bool add_qkv_bias = false;    // --add-qkv-bias (effective only when add_bias_linear is false)
  float hidden_dropout = 0.1f;
  float attention_dropout = 0.1f;
  float init_method_std = 0.02f;
  int64_t padded_vocab_size = 0;  // set from the tokenizer and make_vocab_size_divisible_by
  int64_t vocab_size = 0;         // unpadded, from the tokenizer
  int64_t make_vocab_size_divisible_by = 128;
  std::string attention_impl = "flash";  // ModuleSpec choice: "flash" | "unfused" (DotProductAttention)
  bool apply_query_key_layer_scaling = false;

  // Derived (filled by finalize()).
  int64_t head_dim() const { return kv_channels; }
  void finalize();   // fills 0-defaults; call after parsing, before validate()
  void validate() const;
};

struct TrainingConfig {
  int64_t micro_batch_size = 4;
  int64_t global_batch_size = 0;  // 0 -> micro_batch_size * dp
  int64_t train_iters = 100;
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
  std::string metrics_path;  // JSONL; default <save>/metrics.jsonl when save is set
  int64_t exit_interval = 0;
  void validate() const;
};

struct OptimizerConfig {
  std::string optimizer = "adam";
  float lr = 1e-4f;
  float min_lr = 0.0f;
  int64_t lr_warmup_iters = 0;
  float lr_warmup_fraction = 0.0f;  // used when lr_warmup_iters == 0
  int64_t lr_decay_iters = 0;       // 0 -> train_iters
  LrDecayStyle lr_decay_style = LrDecayStyle::Linear;
  float weight_decay = 0.01f;
  float adam_beta1 = 0.9f;
  float adam_beta2 = 0.999f;
  float adam_eps = 1e-8f;
  float clip_grad = 1.0f;  // 0 disables
  void validate() const;
};

struct DataConfig {
  std::vector<std::string> data_path;  // prefixes (weights not yet supported: a single prefix)
  std::string split = "969,30,1";
  std::string tokenizer_type = "GPT2BPETokenizer";
  std::string vocab_file;
  std::string merge_file;
  void validate() const;
};

struct Config {
  TransformerConfig model;
  TrainingConfig training;
  OptimizerConfig optimizer;
  DataConfig data;
  void validate() const;  // each struct's validate + cross-struct rules

  // JSON of everything (stored in checkpoints, printed by --print-config)
  nlohmann::json to_json() const;
  static Config from_json(const nlohmann::json& j);
  // The fields that change the model's math (architecture, vocab, norms, init is excluded: it does
  // not change the function a checkpoint computes). Used to refuse loading into a different model.
  nlohmann::json math_fields() const;
  std::string fingerprint() const;  // xxh3-64 hex of math_fields().dump()
};

// Fields whose values differ between two math_fields() objects, e.g. {"hidden_size: 64 vs 128"}.
std::vector<std::string> diff_math_fields(const nlohmann::json& a, const nlohmann::json& b);

}  // namespace mcpp
