// parse_train_args: TOML recipe < flags precedence, Megatron flag names, errors (CLI11 ParseError for
// unknown flags, mcpp::Error naming the field/file otherwise), the shipped configs/*.toml parse, and
// the Megatron-style argument listing.
#include <CLI/CLI.hpp>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/core_test_util.h"
#include "mcpp/core/error.h"
#include "mcpp/datasets/blended_dataset.h"
#include "mcpp/dist_checkpointing/checkpoint.h"
#include "mcpp/training/arguments.h"

namespace mcpp {
namespace {

namespace fs = std::filesystem;

std::string write_toml(const std::string& name, const std::string& text) {
  fs::path dir = fs::temp_directory_path() / ("mcpp_arguments_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::path p = dir / name;
  std::ofstream(p) << text;
  return p.string();
}

// The mcpp::Error message of parse_train_args(args), or "" when it succeeds.
std::string error_of(const std::vector<std::string>& args) {
  return mcpp::testing::error_of([&] { parse_train_args(args); });
}

void expect_error_names(const std::vector<std::string>& args, const std::string& field) {
  std::string msg = error_of(args);
  ASSERT_FALSE(msg.empty()) << "no error; expected one naming " << field;
  EXPECT_NE(msg.find(field), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
}

TEST(Arguments, DefaultsWithoutFlags) {
  Config c = parse_train_args({});
  EXPECT_EQ(c.model.num_layers, Config{}.model.num_layers);
  EXPECT_EQ(c.model.ffn_hidden_size, 4 * c.model.hidden_size);  // finalized
  EXPECT_EQ(c.optimizer.lr_decay_iters, c.training.train_iters);
  EXPECT_TRUE(c.ddp.overwrite_main_grad);  // first gradient writes overwrite the main grads
}

TEST(Arguments, NoOverwriteMainGradZeroesTheBufferInstead) {
  EXPECT_FALSE(parse_train_args({"--no-overwrite-main-grad"}).ddp.overwrite_main_grad);
  const nlohmann::json j = parse_train_args({"--no-overwrite-main-grad"}).to_json();
  EXPECT_FALSE(Config::from_json(j).ddp.overwrite_main_grad);  // round trip (checkpoints' config)
}

TEST(Arguments, MegatronFlags) {
  Config c = parse_train_args({"--num-layers", "6", "--hidden-size", "96", "--num-attention-heads", "6",
                               "--group-query-attention", "--num-query-groups", "3", "--seq-length", "32",
                               "--max-position-embeddings", "64", "--normalization", "RMSNorm", "--norm-epsilon",
                               "1e-6", "--swiglu", "--position-embedding-type", "rope", "--rotary-base", "500000",
                               "--rotary-percent", "0.5", "--untie-embeddings-and-output-weights",
                               "--disable-bias-linear", "--add-qkv-bias", "--qk-layernorm", "--hidden-dropout", "0",
                               "--attention-dropout", "0.05", "--init-method-std", "0.01",
                               "--make-vocab-size-divisible-by", "64", "--attention-impl", "unfused",
                               "--deterministic-mode", "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "3e-4", "--min-lr",
                               "3e-5", "--lr-warmup-iters", "10", "--lr-decay-iters", "90", "--lr-decay-style",
                               "cosine", "--train-iters", "100", "--weight-decay", "0.1", "--adam-beta1", "0.8",
                               "--adam-beta2", "0.95", "--adam-eps", "1e-5", "--clip-grad", "0.5", "--seed", "7",
                               "--data-path", "0.3", "a_text_document", "0.7", "b_text_document", "--split", "98,2,0",
                               "--save", "ck", "--load", "ck0", "--save-interval", "50", "--eval-interval", "25",
                               "--eval-iters", "3", "--log-interval", "5", "--exit-interval", "60",
                               "--no-load-optim", "--no-load-rng", "--finetune", "--tokenizer-type",
                               "GPT2BPETokenizer", "--vocab-file", "v.json", "--merge-file", "m.txt",
                               "--metrics-path", "m.jsonl", "--bf16"});
  EXPECT_EQ(c.model.num_layers, 6);
  EXPECT_EQ(c.model.hidden_size, 96);
  EXPECT_TRUE(c.model.group_query_attention);
  EXPECT_EQ(c.model.num_query_groups, 3);
  EXPECT_EQ(c.model.max_position_embeddings, 64);
  EXPECT_EQ(c.model.normalization, Normalization::RMSNorm);
  EXPECT_EQ(c.model.norm_epsilon, 1e-6f);
  EXPECT_TRUE(c.model.swiglu);
  EXPECT_EQ(c.model.ffn_hidden_size, 256);  // int(256 / 64) * 64
  EXPECT_EQ(c.model.position_embedding_type, PositionEmbedding::Rope);
  EXPECT_EQ(c.model.rotary_base, 500000.0f);
  EXPECT_EQ(c.model.rotary_percent, 0.5f);
  EXPECT_TRUE(c.model.untie_embeddings_and_output_weights);
  EXPECT_FALSE(c.model.add_bias_linear);
  EXPECT_TRUE(c.model.add_qkv_bias);
  EXPECT_TRUE(c.model.qk_layernorm);
  EXPECT_TRUE(Config::from_json(c.to_json()).model.qk_layernorm);  // round trip (checkpoints' config)
  EXPECT_EQ(c.math_fields().value("qk_layernorm", false), true);    // part of the checkpoint's fingerprint
  EXPECT_FALSE(parse_train_args({}).math_fields().contains("qk_layernorm"));  // off: older fingerprints unchanged
  EXPECT_EQ(c.model.hidden_dropout, 0.0f);
  EXPECT_EQ(c.model.attention_dropout, 0.05f);
  EXPECT_EQ(c.model.init_method_std, 0.01f);
  EXPECT_EQ(c.model.make_vocab_size_divisible_by, 64);
  EXPECT_EQ(c.model.attention_impl, "unfused");
  EXPECT_TRUE(c.model.deterministic_mode);
  EXPECT_EQ(c.training.micro_batch_size, 2);
  EXPECT_EQ(c.training.global_batch_size, 8);
  EXPECT_EQ(c.optimizer.lr, 3e-4f);
  EXPECT_EQ(c.optimizer.min_lr, 3e-5f);
  EXPECT_EQ(c.optimizer.lr_warmup_iters, 10);
  EXPECT_EQ(c.optimizer.lr_decay_iters, 90);
  EXPECT_EQ(c.optimizer.lr_decay_style, LrDecayStyle::Cosine);
  EXPECT_EQ(c.training.train_iters, 100);
  EXPECT_EQ(c.optimizer.weight_decay, 0.1f);
  EXPECT_EQ(c.optimizer.adam_beta1, 0.8f);
  EXPECT_EQ(c.optimizer.adam_beta2, 0.95f);
  EXPECT_EQ(c.optimizer.adam_eps, 1e-5f);
  EXPECT_EQ(c.optimizer.clip_grad, 0.5f);
  EXPECT_EQ(c.training.seed, 7);
  EXPECT_EQ(c.data.data_path, (std::vector<std::string>{"0.3", "a_text_document", "0.7", "b_text_document"}));
  EXPECT_EQ(c.data.split, "98,2,0");
  EXPECT_EQ(c.training.save, "ck");
  EXPECT_EQ(c.training.load, "ck0");
  EXPECT_EQ(c.training.save_interval, 50);
  EXPECT_EQ(c.training.eval_interval, 25);
  EXPECT_EQ(c.training.eval_iters, 3);
  EXPECT_EQ(c.training.log_interval, 5);
  EXPECT_EQ(c.training.exit_interval, 60);
  EXPECT_TRUE(c.training.no_load_optim);
  EXPECT_TRUE(c.training.no_load_rng);
  EXPECT_TRUE(c.training.finetune);
  EXPECT_EQ(c.data.vocab_file, "v.json");
  EXPECT_EQ(c.data.merge_file, "m.txt");
  EXPECT_EQ(c.training.metrics_path, "m.jsonl");
  EXPECT_TRUE(c.training.bf16);
}

TEST(Arguments, FlagsOverrideToml) {
  std::string path = write_toml("recipe.toml", R"(
[model]
num_layers = 4
hidden_size = 128
normalization = "RMSNorm"
[training]
micro_batch_size = 8
train_iters = 300
[optimizer]
lr = 1e-3
lr_decay_style = "cosine"
lr_warmup_iters = 20
[data]
data_path = ["from_file"]
)");
  // file only
  Config f = parse_train_args({"--config", path});
  EXPECT_EQ(f.model.num_layers, 4);
  EXPECT_EQ(f.model.hidden_size, 128);
  EXPECT_EQ(f.model.normalization, Normalization::RMSNorm);
  EXPECT_EQ(f.training.micro_batch_size, 8);
  EXPECT_EQ(f.optimizer.lr, 1e-3f);
  EXPECT_EQ(f.optimizer.lr_decay_style, LrDecayStyle::Cosine);
  EXPECT_EQ(f.data.data_path, std::vector<std::string>{"from_file"});
  EXPECT_EQ(f.model.num_attention_heads, Config{}.model.num_attention_heads);  // untouched default
  // flags win over the file, wherever --config sits on the line; untouched file values stay
  for (bool config_first : {true, false}) {
    std::vector<std::string> args = {"--num-layers", "2", "--lr", "5e-4", "--normalization", "LayerNorm",
                                     "--data-path", "from_flag", "--lr-warmup-fraction", "0.1"};
    if (config_first) args.insert(args.begin(), {"--config", path});
    else args.push_back("--config=" + path);
    Config c = parse_train_args(args);
    EXPECT_EQ(c.model.num_layers, 2);
    EXPECT_EQ(c.model.hidden_size, 128);
    EXPECT_EQ(c.optimizer.lr, 5e-4f);
    EXPECT_EQ(c.model.normalization, Normalization::LayerNorm);
    EXPECT_EQ(c.training.micro_batch_size, 8);
    EXPECT_EQ(c.data.data_path, std::vector<std::string>{"from_flag"});
    // --lr-warmup-fraction on the line replaces the file's lr_warmup_iters (Megatron takes one of them)
    EXPECT_EQ(c.optimizer.lr_warmup_iters, 0);
    EXPECT_DOUBLE_EQ(c.optimizer.lengths(false, 1).warmup, 0.1f * 300.0);
  }
}

TEST(Arguments, UnknownFlagIsCliParseError) {
  EXPECT_THROW(parse_train_args({"--no-such-flag"}), CLI::ParseError);
  EXPECT_THROW(parse_train_args({"--num-layers", "two"}), CLI::ParseError);
  EXPECT_THROW(parse_train_args({"--num-layers"}), CLI::ParseError);
  EXPECT_THROW(parse_train_args({"stray"}), CLI::ParseError);
  // --help prints the flags and throws CLI::Success (main exits 0)
  ::testing::internal::CaptureStdout();
  EXPECT_THROW(parse_train_args({"--help"}), CLI::Success);
  std::string help = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(help.find("--num-attention-heads"), std::string::npos) << help;
}

TEST(Arguments, InvalidValuesNameTheField) {
  expect_error_names({"--normalization", "BatchNorm"}, "normalization");
  expect_error_names({"--position-embedding-type", "alibi"}, "position_embedding_type");
  expect_error_names({"--lr-decay-style", "step"}, "lr_decay_style");
  expect_error_names({"--hidden-size", "66", "--num-attention-heads", "4"}, "hidden_size");
  expect_error_names({"--num-attention-heads", "4", "--num-query-groups", "3"}, "num_query_groups");
  expect_error_names({"--seq-length", "128", "--max-position-embeddings", "64"}, "max_position_embeddings");
  expect_error_names({"--micro-batch-size", "4", "--global-batch-size", "6"}, "global_batch_size");
  expect_error_names({"--lr", "1e-4", "--min-lr", "1e-3"}, "min_lr");
  expect_error_names({"--train-iters", "10", "--lr-warmup-iters", "10"}, "lr_warmup_iters");
  expect_error_names({"--hidden-dropout", "1.5"}, "hidden_dropout");
  expect_error_names({"--num-layers", "-2"}, "num_layers");
  expect_error_names({"--split", "9,1,"}, "split");
  expect_error_names({"--rotary-percent", "0"}, "rotary_percent");
  expect_error_names({"--bf16", "--fp16"}, "fp16");
  expect_error_names({"--lr-decay-style", "WSD"}, "lr_wsd_decay_iters");
  // with rope, an odd rotary dim: h=72, heads=4 -> kv 18; 18 * 0.5 = 9
  expect_error_names({"--position-embedding-type", "rope", "--hidden-size", "72", "--rotary-percent", "0.5"},
                     "rotary_percent");
  // with none/rope positions seq_length may exceed max_position_embeddings
  EXPECT_EQ(error_of({"--position-embedding-type", "rope", "--seq-length", "128", "--max-position-embeddings", "64"}),
            "");
}

TEST(Arguments, TomlErrorsNameFileAndKey) {
  std::string typo = write_toml("typo.toml", "[model]\nhiden_size = 64\n");
  std::string msg = error_of({"--config", typo});
  EXPECT_NE(msg.find("typo.toml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.hiden_size"), std::string::npos) << msg;
  std::string wrong = write_toml("wrong.toml", "[training]\nmicro_batch_size = \"8\"\n");
  msg = error_of({"--config", wrong});
  EXPECT_NE(msg.find("training.micro_batch_size"), std::string::npos) << msg;
  std::string syntax = write_toml("syntax.toml", "[model]\nnum_layers = = 3\n");
  msg = error_of({"--config", syntax});
  EXPECT_NE(msg.find("syntax.toml:2"), std::string::npos) << msg;
  msg = error_of({"--config", "/nonexistent/recipe.toml"});
  EXPECT_NE(msg.find("/nonexistent/recipe.toml"), std::string::npos) << msg;
  std::string section = write_toml("section.toml", "[optimiser]\nlr = 1.0\n");
  msg = error_of({"--config", section});
  EXPECT_NE(msg.find("optimiser"), std::string::npos) << msg;
}

// --use-checkpoint-args copies the architecture field by field (arguments.cpp): every field of the math fingerprint
// (Config::math_fields, but the vocabulary: the tokenizer's) must come back from the checkpoint over the defaults.
// Four stored models between them set each fingerprint field away from its default — a field the copy forgets
// fails here.
TEST(Arguments, UseCheckpointArgsRestoresEveryArchitectureField) {
  auto arch = [](const Config& c) {
    nlohmann::json j = c.math_fields();
    j.erase("vocab_size"), j.erase("padded_vocab_size");
    return j;
  };
  std::vector<Config> models(4);
  {  // GPT-2 style: learned positions, LayerNorm, GELU, biases, a head dim other than h / heads
    TransformerConfig& m = models[0].model;
    m.num_layers = 3, m.hidden_size = 48, m.num_attention_heads = 6, m.kv_channels = 12, m.ffn_hidden_size = 100;
    m.max_position_embeddings = 96, m.norm_epsilon = 1e-6f, m.make_vocab_size_divisible_by = 64;
  }
  {  // Llama style with q/k norms, q/k/v biases and MoE: sigmoid, group-limited, expert bias, capacity, shared + gate
    TransformerConfig& m = models[1].model;
    m.num_layers = 3, m.hidden_size = 64, m.num_attention_heads = 4, m.group_query_attention = true;
    m.num_query_groups = 2, m.normalization = Normalization::RMSNorm, m.swiglu = true;
    m.position_embedding_type = PositionEmbedding::Rope, m.rotary_base = 500000.0f, m.rotary_percent = 0.5f;
    m.untie_embeddings_and_output_weights = true, m.add_bias_linear = false, m.add_qkv_bias = true;
    m.qk_layernorm = true, m.num_moe_experts = 4, m.moe_router_topk = 2, m.moe_ffn_hidden_size = 40;
    m.moe_layer_freq = "[1,0,1]", m.moe_shared_expert_intermediate_size = 32, m.moe_shared_expert_gate = true;
    m.moe_router_score_function = "sigmoid", m.moe_router_topk_scaling_factor = 2.5f;
    m.moe_router_enable_expert_bias = true, m.moe_router_num_groups = 2, m.moe_router_group_topk = 1;
    m.moe_expert_capacity_factor = 1.5, m.moe_token_drop_policy = "position";
    m.moe_pad_expert_input_to_capacity = true, m.moe_aux_loss_coeff = 0.0f;
  }
  {  // sinkhorn routing
    TransformerConfig& m = models[2].model;
    m.num_moe_experts = 8, m.moe_router_topk = 1;
    m.moe_router_load_balancing_type = "sinkhorn", m.moe_aux_loss_coeff = 0.0f;
  }
  {  // pre-softmax top-k
    TransformerConfig& m = models[3].model;
    m.num_moe_experts = 4, m.moe_router_topk = 2, m.moe_router_pre_softmax = true;
  }
  for (size_t i = 0; i < models.size(); ++i) {
    Config& saved = models[i];
    saved.finalize();
    try {
      saved.validate();
    } catch (const Error& e) {
      FAIL() << i << ": " << e.what();
    }
    const fs::path dir = fs::temp_directory_path() / ("mcpp_use_ckpt_args_" + std::to_string(::getpid()) + "_" +
                                                      std::to_string(i));
    fs::remove_all(dir);
    dist_checkpointing::CheckpointContents contents;
    contents.iteration = 0;
    contents.meta = {{"config", saved.to_json()}};
    dist_checkpointing::save_checkpoint(dir.string(), contents);
    const Config plain = parse_train_args({"--load", dir.string()});
    EXPECT_NE(arch(plain), arch(saved)) << i << ": the stored model must differ from the defaults";
    const Config used = parse_train_args({"--load", dir.string(), "--use-checkpoint-args", "--hidden-size", "8"});
    EXPECT_EQ(arch(used), arch(saved)) << i;
    fs::remove_all(dir);
  }
}

TEST(Arguments, ShippedRecipesParse) {
  const std::string root = MCPP_SOURCE_DIR;
  Config demo = parse_train_args({"--config", root + "/configs/demo.toml"});
  EXPECT_EQ(demo.model.num_layers, 4);
  EXPECT_EQ(demo.model.hidden_size, 128);
  EXPECT_EQ(demo.model.num_attention_heads, 4);
  EXPECT_EQ(demo.model.seq_length, 128);
  EXPECT_EQ(demo.training.micro_batch_size, 8);
  EXPECT_EQ(demo.optimizer.lr_decay_style, LrDecayStyle::Cosine);
  EXPECT_GT(demo.optimizer.lr_warmup_iters, 0);
  EXPECT_NO_THROW(demo.validate_for_training());
  Config gpt2 = parse_train_args({"--config", root + "/configs/gpt2-tiny.toml"});
  EXPECT_EQ(gpt2.model.normalization, Normalization::LayerNorm);
  EXPECT_FALSE(gpt2.model.untie_embeddings_and_output_weights);
  Config llama = parse_train_args({"--config", root + "/configs/llama-tiny.toml"});
  EXPECT_EQ(llama.model.normalization, Normalization::RMSNorm);
  EXPECT_EQ(llama.model.position_embedding_type, PositionEmbedding::Rope);
  EXPECT_TRUE(llama.model.swiglu);
  EXPECT_EQ(llama.model.ffn_hidden_size, 128);
  EXPECT_EQ(llama.model.num_query_groups, 2);
  EXPECT_FALSE(llama.model.add_bias_linear);
  EXPECT_NE(llama.fingerprint(), gpt2.fingerprint());
  Config qwen3 = parse_train_args({"--config", root + "/configs/qwen3-tiny.toml"});
  EXPECT_TRUE(qwen3.model.qk_layernorm);
  EXPECT_EQ(qwen3.model.kv_channels, 32);
  EXPECT_FALSE(qwen3.model.untie_embeddings_and_output_weights);
  EXPECT_NE(qwen3.fingerprint(), llama.fingerprint());
  Config ds3 = parse_train_args({"--config", root + "/configs/deepseek-v3-tiny.toml"});
  EXPECT_TRUE(ds3.model.multi_latent_attention);
  EXPECT_EQ(ds3.model.q_lora_rank, 48);
  EXPECT_TRUE(ds3.model.mla_yarn());
  EXPECT_EQ(ds3.model.moe_layer_pattern(), (std::vector<bool>{false, true, true, true}));  // a dense first layer
  EXPECT_EQ(ds3.model.moe_router_score_function, "sigmoid");
  EXPECT_TRUE(ds3.model.moe_router_enable_expert_bias);
  EXPECT_EQ(ds3.model.mtp_num_layers, 1);
  EXPECT_NO_THROW(ds3.validate());
  EXPECT_NE(ds3.fingerprint(), llama.fingerprint());
}

TEST(Arguments, MegatronStyleListing) {
  Config c = parse_train_args({"--hidden-size", "128", "--swiglu", "--num-attention-heads", "4"});
  std::string s = format_args(c);
  EXPECT_EQ(s.rfind("------------------------ arguments ------------------------\n", 0), 0u) << s;
  // Megatron pads each name with dots to 48 columns: '.' * (48 - len(name))
  EXPECT_NE(s.find("  hidden_size " + std::string(48 - 11, '.') + " 128\n"), std::string::npos) << s;
  EXPECT_NE(s.find("  swiglu " + std::string(48 - 6, '.') + " True\n"), std::string::npos) << s;
  EXPECT_NE(s.find("  normalization " + std::string(48 - 13, '.') + " LayerNorm\n"), std::string::npos) << s;
  EXPECT_NE(s.find("-------------------- end of arguments ---------------------\n"), std::string::npos);
  // sorted by name
  EXPECT_LT(s.find("  adam_beta1 "), s.find("  hidden_size "));
  EXPECT_LT(s.find("  hidden_size "), s.find("  weight_decay "));
}

// Sample-based training (Megatron's --train-samples and --lr-*-samples): train_iters derived from the global batch,
// the schedule in samples; Megatron's exclusivity rules as errors naming the fields; a flag overrides the recipe's
// other key, both keys in one recipe are an error; the fields round-trip through the config JSON.
TEST(Arguments, MultiTokenPrediction) {
  Config c = parse_train_args({"--position-embedding-type", "rope", "--mtp-num-layers", "2",
                               "--mtp-loss-scaling-factor", "0.25"});
  EXPECT_EQ(c.model.mtp_num_layers, 2);
  EXPECT_FLOAT_EQ(c.model.mtp_loss_scaling_factor, 0.25f);
  c.validate();
  EXPECT_EQ(Config::from_json(c.to_json()).to_json(), c.to_json());
  EXPECT_EQ(Config::from_json(c.to_json()).model.mtp_num_layers, 2);
  EXPECT_EQ(parse_train_args({}).model.mtp_num_layers, 0);                     // off by default (Megatron's None)
  EXPECT_FLOAT_EQ(parse_train_args({}).model.mtp_loss_scaling_factor, 0.1f);  // Megatron's default
  expect_error_names({"--mtp-num-layers", "1"}, "learned_absolute");  // the default positions: Megatron's rule
  expect_error_names({"--position-embedding-type", "rope", "--mtp-num-layers", "-1"}, "mtp_num_layers");
  expect_error_names({"--position-embedding-type", "none", "--mtp-num-layers", "1", "--mtp-loss-scaling-factor",
                      "-0.5"},
                     "mtp_loss_scaling_factor");
}

// Multi-latent attention's flags (Megatron's names and defaults: kv_lora_rank 32, qk / pe / v head dims 128 / 64 /
// 128, no query compression, YaRN by default), in the config's JSON and the checkpoint fingerprint; what does not
// apply to MLA is refused by name.
TEST(Arguments, MultiLatentAttention) {
  const std::vector<std::string> base{"--position-embedding-type", "rope", "--multi-latent-attention"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), base.begin(), base.end());
    return more;
  };
  Config d = parse_train_args(base);
  EXPECT_TRUE(d.model.multi_latent_attention);
  EXPECT_EQ(d.model.q_lora_rank, 0);
  EXPECT_EQ(d.model.kv_lora_rank, 32);
  EXPECT_EQ(d.model.qk_head_dim, 128);
  EXPECT_EQ(d.model.qk_pos_emb_head_dim, 64);
  EXPECT_EQ(d.model.v_head_dim, 128);
  EXPECT_TRUE(d.model.mla_yarn());  // Megatron: MLA takes YaRN by default
  d.validate();
  Config c = parse_train_args(with({"--q-lora-rank", "1536", "--kv-lora-rank", "512", "--qk-head-dim", "96",
                                    "--qk-pos-emb-head-dim", "32", "--v-head-dim", "64", "--rope-type", "rope",
                                    "--rotary-scaling-factor", "40", "--mscale", "0.707", "--mscale-all-dim", "0.5",
                                    "--beta-fast", "16", "--beta-slow", "2", "--original-max-position-embeddings",
                                    "8192"}));
  EXPECT_EQ(c.model.q_lora_rank, 1536);
  EXPECT_EQ(c.model.kv_lora_rank, 512);
  EXPECT_EQ(c.model.qk_head_dim, 96);
  EXPECT_EQ(c.model.qk_pos_emb_head_dim, 32);
  EXPECT_EQ(c.model.v_head_dim, 64);
  EXPECT_FALSE(c.model.mla_yarn());
  EXPECT_FLOAT_EQ(c.model.rotary_scaling_factor, 40.0f);
  EXPECT_FLOAT_EQ(c.model.mscale, 0.707f);
  EXPECT_FLOAT_EQ(c.model.mscale_all_dim, 0.5f);
  EXPECT_FLOAT_EQ(c.model.beta_fast, 16.0f);
  EXPECT_FLOAT_EQ(c.model.beta_slow, 2.0f);
  EXPECT_EQ(c.model.original_max_position_embeddings, 8192);
  c.validate();
  EXPECT_EQ(Config::from_json(c.to_json()).to_json(), c.to_json());
  // the fingerprint: MLA and its dims are another model; YaRN's fields only with YaRN; absent without MLA
  EXPECT_EQ(c.math_fields()["multi_latent_attention"], true);
  EXPECT_EQ(c.math_fields()["q_lora_rank"], 1536);
  EXPECT_EQ(c.math_fields()["rope_type"], "rope");
  EXPECT_FALSE(c.math_fields().contains("beta_fast"));
  EXPECT_TRUE(d.math_fields().contains("beta_fast"));
  EXPECT_NE(c.fingerprint(), parse_train_args(with({"--q-lora-rank", "1536", "--kv-lora-rank", "512",
                                                    "--qk-head-dim", "96", "--qk-pos-emb-head-dim", "32",
                                                    "--v-head-dim", "48", "--rope-type", "rope",
                                                    "--rotary-scaling-factor", "40", "--mscale-all-dim", "0.5"}))
                                 .fingerprint());
  EXPECT_FALSE(parse_train_args({"--position-embedding-type", "rope"}).math_fields().contains("multi_latent_attention"));
  expect_error_names({"--multi-latent-attention"}, "position-embedding-type rope");  // learned positions (default)
  expect_error_names(with({"--qk-pos-emb-head-dim", "7"}), "qk_pos_emb_head_dim");
  expect_error_names(with({"--kv-lora-rank", "0"}), "kv_lora_rank");
  expect_error_names(with({"--q-lora-rank", "-1"}), "q_lora_rank");
  expect_error_names(with({"--group-query-attention", "--num-query-groups", "2"}), "num_query_groups");
  expect_error_names(with({"--add-qkv-bias"}), "add-qkv-bias");
  expect_error_names(with({"--rotary-percent", "0.5"}), "rotary_percent");
  expect_error_names(with({"--use-rope-scaling"}), "use-rope-scaling");
  expect_error_names(with({"--rope-type", "ntk"}), "rope_type");
  expect_error_names(with({"--rotary-scaling-factor", "0"}), "rotary_scaling_factor");
  expect_error_names(with({"--beta-slow", "-1"}), "beta_fast / beta_slow");
  expect_error_names({"--position-embedding-type", "rope", "--rope-type", "yarn"}, "multi-latent attention");
  parse_train_args(with({"--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj", "core_attn"}))
      .validate();  // Megatron's MLA recompute module
  expect_error_names({"--position-embedding-type", "rope", "--recompute-granularity", "selective",
                      "--recompute-modules", "mla_up_proj"},
                     "no multi-latent attention");
}

TEST(Arguments, RopeScaling) {
  Config c = parse_train_args({"--position-embedding-type", "rope", "--use-rope-scaling", "--rope-scaling-factor", "32"});
  EXPECT_TRUE(c.model.use_rope_scaling);
  EXPECT_FLOAT_EQ(c.model.rope_scaling_factor, 32.0f);
  c.validate();
  EXPECT_EQ(Config::from_json(c.to_json()).to_json(), c.to_json());
  EXPECT_EQ(c.math_fields()["rope_scaling_factor"], 32.0);  // a checkpoint of another scaling is another model
  EXPECT_FALSE(parse_train_args({"--position-embedding-type", "rope"}).math_fields().contains("rope_scaling_factor"));
  EXPECT_FLOAT_EQ(parse_train_args({}).model.rope_scaling_factor, 8.0f);  // Megatron's default
  expect_error_names({"--use-rope-scaling"}, "use_rope_scaling");  // learned positions (the default)
  expect_error_names({"--position-embedding-type", "rope", "--use-rope-scaling", "--rope-scaling-factor", "0.5"},
                     "rope_scaling_factor");
  // linear position interpolation (Megatron's --rotary-seq-len-interpolation-factor)
  Config lin = parse_train_args({"--position-embedding-type", "rope", "--rotary-seq-len-interpolation-factor", "4"});
  EXPECT_FLOAT_EQ(lin.model.rotary_seq_len_interpolation_factor, 4.0f);
  lin.validate();
  EXPECT_EQ(lin.math_fields()["rotary_seq_len_interpolation_factor"], 4.0);
  EXPECT_EQ(Config::from_json(lin.to_json()).to_json(), lin.to_json());
  expect_error_names({"--rotary-seq-len-interpolation-factor", "2"}, "rotary_seq_len_interpolation_factor");
  expect_error_names({"--position-embedding-type", "rope", "--rotary-seq-len-interpolation-factor", "-1"},
                     "rotary_seq_len_interpolation_factor");
}

TEST(Arguments, SampleBasedTraining) {
  Config c = parse_train_args({"--train-samples", "1003", "--global-batch-size", "8", "--micro-batch-size", "2",
                               "--lr-warmup-samples", "30", "--lr-decay-style", "WSD", "--lr-wsd-decay-samples",
                               "200"});
  EXPECT_EQ(c.training.train_samples, 1003);
  EXPECT_EQ(c.training.train_iters, 0);           // derived once the global batch is known
  EXPECT_EQ(c.optimizer.lr_decay_samples, 1003);  // default: train_samples
  EXPECT_EQ(c.optimizer.lr_decay_iters, 0);
  c.apply_world_size(2);
  EXPECT_EQ(c.training.train_iters, 125);  // 1003 / 8: Megatron's update_train_iters
  c.validate();                            // the derived train_iters is consistent
  EXPECT_EQ(Config::from_json(c.to_json()).to_json(), c.to_json());
  Config too_few = parse_train_args({"--train-samples", "7", "--global-batch-size", "8", "--micro-batch-size", "2"});
  try {
    too_few.apply_world_size(1);
    FAIL() << "expected mcpp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train_samples (7) is smaller than global_batch_size (8)"),
              std::string::npos) << e.what();
  }
  expect_error_names({"--train-iters", "10", "--train-samples", "80"}, "--train-samples");
  expect_error_names({"--train-samples", "80", "--lr-decay-iters", "5"}, "lr_decay_iters");
  expect_error_names({"--train-samples", "80", "--lr-warmup-iters", "2"}, "lr_warmup_iters");
  expect_error_names({"--train-samples", "80", "--lr-warmup-samples", "80"}, "lr_warmup_samples");
  expect_error_names({"--train-samples", "80", "--lr-warmup-samples", "8", "--lr-warmup-fraction", "0.1"},
                     "lr_warmup_samples");
  expect_error_names({"--train-samples", "80", "--lr-decay-style", "WSD"}, "lr_wsd_decay_samples");
  expect_error_names({"--train-iters", "10", "--lr-decay-samples", "80"}, "lr_decay_samples");
  expect_error_names({"--lr-warmup-samples", "8"}, "lr_warmup_samples");  // iteration-based (the default)
  expect_error_names({"--train-samples", "-8"}, "train_samples");
  // recipes: both keys -> error naming the file; a flag overrides the file's other key
  const std::string both = write_toml("both.toml", "[training]\ntrain_iters = 10\ntrain_samples = 80\n");
  expect_error_names({"--config", both}, "both.toml: train_iters and train_samples");
  const std::string iters = write_toml("iters.toml", "[training]\ntrain_iters = 10\n");
  Config to_samples = parse_train_args({"--config", iters, "--train-samples", "64"});
  EXPECT_EQ(to_samples.training.train_samples, 64);
  EXPECT_EQ(to_samples.training.train_iters, 0);
  const std::string samples = write_toml("samples.toml", "[training]\ntrain_samples = 80\n");
  Config to_iters = parse_train_args({"--config", samples, "--train-iters", "6"});
  EXPECT_EQ(to_iters.training.train_samples, 0);
  EXPECT_EQ(to_iters.training.train_iters, 6);
  EXPECT_EQ(to_iters.optimizer.lr_decay_iters, 6);
  EXPECT_EQ(parse_train_args({"--config", samples}).training.train_samples, 80);
}

// --rampup-batch-size START INCREMENT SAMPLES (Megatron's RampupBatchsizeNumMicroBatchesCalculator and
// update_train_iters): the batch of each step from the samples consumed before it, the iteration count, and the
// calculator's asserts as named errors.
TEST(Arguments, RampupBatchSize) {
  Config c = parse_train_args({"--train-samples", "30", "--global-batch-size", "6", "--micro-batch-size", "1",
                               "--rampup-batch-size", "2", "2", "8"});
  EXPECT_EQ(c.training.rampup_batch_size, (std::vector<int64_t>{2, 2, 8}));
  c.apply_world_size(2);
  // 8 samples / 2 increments = 4 samples per increment: 0 -> 2, 2 -> 2, 4 -> 4, 8 -> 6 (consumed == 8 still ramps),
  // then 6; iterations: 0, 2, 4, 8 while consumed <= 8 (4), then (30 - 14) / 6 = 2 whole batches
  const std::vector<std::pair<int64_t, int64_t>> at = {{0, 2}, {2, 2}, {3, 2}, {4, 4}, {7, 4}, {8, 6}, {9, 6},
                                                       {14, 6}, {1000, 6}};
  for (const auto& [consumed, batch] : at) EXPECT_EQ(c.global_batch_size_at(consumed), batch) << consumed;
  EXPECT_EQ(c.num_microbatches_at(4), 2);  // 4 / (1 * dp 2)
  EXPECT_EQ(c.num_microbatches_at(20), 3);
  EXPECT_EQ(c.training.train_iters, 6);
  c.validate();
  EXPECT_EQ(Config::from_json(c.to_json()).training.rampup_batch_size, c.training.rampup_batch_size);

  auto apply_error = [](std::vector<std::string> args, int64_t world, const std::string& needle) {
    Config k = parse_train_args(args);
    try {
      k.apply_world_size(world);
      ADD_FAILURE() << "expected an error naming " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const std::vector<std::string> base = {"--train-samples", "30", "--global-batch-size", "6", "--micro-batch-size",
                                         "1", "--rampup-batch-size"};
  auto with = [&](std::vector<std::string> ramp) {
    std::vector<std::string> a = base;
    a.insert(a.end(), ramp.begin(), ramp.end());
    return a;
  };
  apply_error(with({"6", "2", "8"}), 1, "start (6) must be smaller than global_batch_size (6)");
  apply_error(with({"2", "3", "8"}), 1, "must be a multiple of the increment (3)");
  apply_error(with({"1", "1", "8"}), 2, "multiples of micro_batch_size * data_parallel_size (1 * 2)");
  std::vector<std::string> graph = with({"2", "2", "8"});
  graph.insert(graph.end(), {"--enable-cuda-graph", "--device", "cuda"});
  apply_error(graph, 1, "--enable-cuda-graph");
  expect_error_names({"--rampup-batch-size", "2", "2", "8"}, "--train-samples");
  expect_error_names(with({"2", "0", "8"}), "rampup_batch_size");
  expect_error_names(with({"2", "2", "0"}), "rampup_batch_size");
  EXPECT_THROW(parse_train_args(with({"2", "2"})), std::exception);  // three values
}

// Megatron's per-split data paths: each a prefix or blend of its own, exclusive with --data-path, errors naming the
// field; training needs --data-path or --train-data-path.
TEST(Arguments, PerSplitDataPaths) {
  Config c = parse_train_args({"--train-data-path", "0.5", "a", "0.5", "b", "--valid-data-path", "v"});
  EXPECT_EQ(c.data.train_data_path, (std::vector<std::string>{"0.5", "a", "0.5", "b"}));
  EXPECT_EQ(c.data.valid_data_path, std::vector<std::string>{"v"});
  EXPECT_TRUE(c.data.data_path.empty());
  c.validate_for_training();
  EXPECT_EQ(Config::from_json(c.to_json()).data.train_data_path, c.data.train_data_path);
  expect_error_names({"--data-path", "d", "--valid-data-path", "v"}, "data_path and train_data_path");
  expect_error_names({"--valid-data-path", "0.5", "v", "w", "w"}, "valid_data_path: '0.5 v w w' mixes");
  expect_error_names({"--test-data-path", "a", "0.5", "b"}, "test_data_path: 'a 0.5 b' mixes");
  EXPECT_TRUE(parse_data_blend(parse_train_args({"--test-data-path", "a", "b"}).data.test_data_path).by_size);
  Config no_train = parse_train_args({"--valid-data-path", "v"});
  try {
    no_train.validate_for_training();
    FAIL() << "expected mcpp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--train-data-path"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mcpp
