// Config: finalize defaults (Megatron's formulas), validate naming the field, JSON round trip, math
// fingerprint (stable, moved by math fields only), diff_math_fields, split parsing, vocab padding.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>

#include "core/core_test_util.h"
#include "mcpp/core/error.h"
#include "mcpp/training/config.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp {
namespace {

Config finalized(std::function<void(Config&)> edit = {}) {
  Config c;
  if (edit) edit(c);
  c.finalize();
  return c;
}

// Expects validate() to throw an mcpp::Error whose message names `field`.
void expect_invalid(const std::function<void(Config&)>& edit, const std::string& field) {
  Config c = finalized(edit);
  try {
    c.validate();
    ADD_FAILURE() << "no error for invalid " << field;
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(field), std::string::npos) << "message does not name " << field << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: " << msg;
  }
}

TEST(TransformerConfig, FinalizeDefaults) {
  Config c = finalized([](Config& c) {
    c.model.hidden_size = 96;
    c.model.num_attention_heads = 6;
    c.model.seq_length = 32;
    c.training.train_iters = 77;
  });
  EXPECT_EQ(c.model.ffn_hidden_size, 4 * 96);
  EXPECT_EQ(c.model.kv_channels, 16);
  EXPECT_EQ(c.model.num_query_groups, 6);
  EXPECT_EQ(c.model.max_position_embeddings, 32);
  EXPECT_EQ(c.optimizer.lr_decay_iters, 77);
  EXPECT_NO_THROW(c.validate());
  // finalize is idempotent
  Config again = c;
  again.finalize();
  EXPECT_EQ(again.to_json(), c.to_json());
}

TEST(TransformerConfig, SwigluFfnDefaultIsMegatrons) {
  // Megatron: int((4 * h * 2 / 3) / 64) * 64 — rounded DOWN to a multiple of 64.
  auto ffn = [](int64_t h) {
    return finalized([h](Config& c) {
             c.model.hidden_size = h;
             c.model.swiglu = true;
           })
        .model.ffn_hidden_size;
  };
  EXPECT_EQ(ffn(4096), 10880);  // 10922.67 / 64 = 170.67 -> 170 * 64
  EXPECT_EQ(ffn(128), 320);     // 341.33 / 64 = 5.33 -> 5 * 64
  EXPECT_EQ(ffn(96), 256);      // 256 / 64 = 4 exactly
  EXPECT_EQ(ffn(32), 64);       // 85.33 / 64 = 1.33 -> 64
  expect_invalid([](Config& c) {  // int(42.67 / 64) * 64 = 0: needs an explicit ffn_hidden_size
    c.model.hidden_size = 16;
    c.model.swiglu = true;
  }, "ffn_hidden_size");
}

TEST(TransformerConfig, GroupQueryAttentionFlagAloneMeansOneGroup) {
  EXPECT_EQ(finalized([](Config& c) { c.model.group_query_attention = true; }).model.num_query_groups, 1);
  EXPECT_EQ(finalized([](Config& c) { c.model.num_query_groups = 2; }).model.num_query_groups, 2);
}

TEST(TransformerConfig, EachInvalidValueNamesItsField) {
  expect_invalid([](Config& c) { c.model.hidden_size = 65; }, "hidden_size");
  expect_invalid([](Config& c) { c.model.num_query_groups = 3; }, "num_query_groups");
  expect_invalid([](Config& c) {
    c.model.seq_length = 128;
    c.model.max_position_embeddings = 64;
  }, "max_position_embeddings");
  expect_invalid([](Config& c) { c.training.global_batch_size = 10; c.training.micro_batch_size = 4; },
                 "global_batch_size");
  expect_invalid([](Config& c) { c.optimizer.lr = 1e-4f; c.optimizer.min_lr = 1e-3f; }, "min_lr");
  expect_invalid([](Config& c) { c.optimizer.lr_warmup_iters = 200; c.optimizer.lr_decay_iters = 100; },
                 "lr_decay_iters");
  expect_invalid([](Config& c) { c.model.hidden_dropout = 1.0f; }, "hidden_dropout");
  expect_invalid([](Config& c) { c.model.attention_dropout = -0.1f; }, "attention_dropout");
  expect_invalid([](Config& c) { c.model.num_layers = -1; }, "num_layers");
  expect_invalid([](Config& c) { c.model.num_attention_heads = 0; }, "num_attention_heads");
  expect_invalid([](Config& c) { c.training.micro_batch_size = 0; }, "micro_batch_size");
  expect_invalid([](Config& c) { c.data.split = "90,x,1"; }, "split");
  expect_invalid([](Config& c) { c.data.split = "1,1,1,1"; }, "split");
  expect_invalid([](Config& c) { c.data.split = "0,0,0"; }, "split");
  expect_invalid([](Config& c) { c.model.rotary_percent = 0.0f; }, "rotary_percent");
  expect_invalid([](Config& c) { c.model.rotary_percent = 1.5f; }, "rotary_percent");
  expect_invalid([](Config& c) {  // kv_channels 18 * 0.5 = 9: odd rotary dim
    c.model.position_embedding_type = PositionEmbedding::Rope;
    c.model.hidden_size = 72;
    c.model.num_attention_heads = 4;
    c.model.rotary_percent = 0.5f;
  }, "rotary_percent");
  expect_invalid([](Config& c) { c.model.attention_impl = "fast"; }, "attention_impl");
  expect_invalid([](Config& c) { c.model.norm_epsilon = 0.0f; }, "norm_epsilon");
  expect_invalid([](Config& c) { c.optimizer.adam_beta2 = 1.0f; }, "adam_beta2");
  expect_invalid([](Config& c) { c.optimizer.clip_grad = -1.0f; }, "clip_grad");
  expect_invalid([](Config& c) { c.optimizer.lr_decay_style = LrDecayStyle::WSD; }, "lr_wsd_decay_iters");
  expect_invalid([](Config& c) { c.optimizer.lr_warmup_iters = 5; c.optimizer.lr_warmup_fraction = 0.1f; },
                 "lr_warmup_fraction");
  expect_invalid([](Config& c) { c.training.bf16 = true; c.training.fp16 = true; }, "fp16");
  expect_invalid([](Config& c) { c.parallel.tensor_model_parallel_size = 3; }, "tensor_model_parallel_size");
  expect_invalid([](Config& c) { c.parallel.pipeline_model_parallel_size = 3; }, "pipeline_model_parallel_size");
  expect_invalid([](Config& c) { c.data.tokenizer_type = "Foo"; }, "tokenizer_type");
  expect_invalid([](Config& c) { c.data.tokenizer_type = "NullTokenizer"; }, "vocab_size");
  expect_invalid([](Config& c) {  // Megatron: the TP communication overlap needs sequence parallelism
    c.parallel.tensor_model_parallel_size = 2;
    c.parallel.tp_comm_overlap = true;
  }, "tp_comm_overlap");
}

TEST(TransformerConfig, TpCommOverlapGoesOffWithSequenceParallelAtTp1) {
  Config one = finalized([](Config& c) {
    c.parallel.sequence_parallel = true;
    c.parallel.tp_comm_overlap = true;
  });
  EXPECT_FALSE(one.parallel.sequence_parallel);
  EXPECT_FALSE(one.parallel.tp_comm_overlap);
  EXPECT_NO_THROW(one.validate());
  Config two = finalized([](Config& c) {
    c.parallel.tensor_model_parallel_size = 2;
    c.parallel.sequence_parallel = true;
    c.parallel.tp_comm_overlap = true;
  });
  EXPECT_TRUE(two.parallel.tp_comm_overlap);
  EXPECT_NO_THROW(two.validate());
}

TEST(TransformerConfig, RecomputeRulesNameTheirFields) {
  expect_invalid([](Config& c) { c.model.recompute_granularity = "partial"; }, "recompute_granularity");
  expect_invalid([](Config& c) { c.model.recompute_granularity = "full"; }, "recompute_method");
  expect_invalid([](Config& c) { c.model.recompute_granularity = "full"; c.model.recompute_method = "uniform"; },
                 "recompute_num_layers");
  expect_invalid([](Config& c) { c.model.recompute_granularity = "full"; c.model.recompute_method = "stripe";
                   c.model.recompute_num_layers = 1; }, "recompute_method");
  expect_invalid([](Config& c) { c.model.recompute_granularity = "full"; c.model.recompute_method = "block";
                   c.model.recompute_num_layers = 99; }, "recompute_num_layers");
  expect_invalid([](Config& c) { c.model.recompute_granularity = "selective"; c.model.recompute_method = "block"; },
                 "recompute_method");
  expect_invalid([](Config& c) { c.model.recompute_num_layers = 1; }, "recompute_granularity");
  expect_invalid([](Config& c) { c.training.keep_last_n_checkpoints = -1; }, "keep_last_n_checkpoints");
  Config ok = finalized([](Config& c) { c.model.recompute_granularity = "full"; c.model.recompute_method = "block";
                          c.model.recompute_num_layers = 1; });
  EXPECT_NO_THROW(ok.validate());
  // Recompute changes memory, not math: the fingerprint stays.
  EXPECT_EQ(ok.fingerprint(), finalized().fingerprint());
}

TEST(TransformerConfig, KvChannelsLiftsDivisibility) {
  Config c = finalized([](Config& c) {
    c.model.hidden_size = 65;
    c.model.kv_channels = 16;
  });
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.model.head_dim(), 16);
}

TEST(TransformerConfig, TrainingNeedsDataPath) {
  Config c = finalized();
  EXPECT_NO_THROW(c.validate());
  try {
    c.validate_for_training();
    ADD_FAILURE() << "no error without data_path";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data_path"), std::string::npos) << e.what();
  }
  c.data.data_path = {"data/x_text_document"};
  EXPECT_NO_THROW(c.validate_for_training());
}

TEST(TransformerConfig, ApplyWorldSize) {
  Config c = finalized([](Config& c) {
    c.parallel.tensor_model_parallel_size = 2;
    c.training.micro_batch_size = 4;
  });
  c.apply_world_size(8);  // dp = 4
  EXPECT_EQ(c.parallel.data_parallel_size, 4);
  EXPECT_EQ(c.training.global_batch_size, 16);
  EXPECT_EQ(c.num_microbatches(), 1);
  Config d = finalized([](Config& c) { c.training.global_batch_size = 24; });
  d.apply_world_size(3);
  EXPECT_EQ(d.num_microbatches(), 2);
  Config bad = finalized([](Config& c) { c.training.global_batch_size = 12; });
  EXPECT_THROW(bad.apply_world_size(2), Error);  // 12 % (4 * 2) != 0
  Config bad_world = finalized([](Config& c) { c.parallel.tensor_model_parallel_size = 2; });
  EXPECT_THROW(bad_world.apply_world_size(3), Error);
}

TEST(TransformerConfig, SplitFractions) {
  auto f = finalized([](Config& c) { c.data.split = "969,30,1"; }).data.split_fractions();
  EXPECT_DOUBLE_EQ(f[0], 0.969);
  EXPECT_DOUBLE_EQ(f[1], 0.030);
  EXPECT_DOUBLE_EQ(f[2], 0.001);
  auto g = finalized([](Config& c) { c.data.split = "3/1"; }).data.split_fractions();
  EXPECT_DOUBLE_EQ(g[0], 0.75);
  EXPECT_DOUBLE_EQ(g[1], 0.25);
  EXPECT_DOUBLE_EQ(g[2], 0.0);
}

TEST(TransformerConfig, VocabPadding) {
  TransformerConfig m;
  m.set_vocab_size(50257, 1);
  EXPECT_EQ(m.padded_vocab_size, 50304);  // 393 * 128
  m.set_vocab_size(50257, 2);
  EXPECT_EQ(m.padded_vocab_size, 50432);  // 197 * 256
  EXPECT_EQ(m.vocab_size, 50257);
  EXPECT_THROW(m.set_vocab_size(0, 1), Error);
}

// --moe-layer-freq: Megatron's integer form (layer i when i % N == 0) and its Python list expressions.
TEST(TransformerConfig, MoeLayerFreqExpandsLikeMegatron) {
  auto pattern = [](int64_t layers, const std::string& freq) {
    Config c = finalized([&](Config& c) {
      c.model.num_layers = layers;
      c.model.num_moe_experts = 4;
      c.model.moe_layer_freq = freq;
    });
    c.validate();
    std::string flags;
    for (bool b : c.model.moe_layer_pattern()) flags += b ? '1' : '0';
    return flags;
  };
  EXPECT_EQ(pattern(4, "1"), "1111");
  EXPECT_EQ(pattern(5, "2"), "10101");
  EXPECT_EQ(pattern(7, "3"), "1001001");
  EXPECT_EQ(pattern(4, "[1,0,1,0]"), "1010");
  EXPECT_EQ(pattern(8, "([1]*3+[0]*1)*2"), "11101110");
  EXPECT_EQ(pattern(6, " [0] + 2*[1, 0] + [ 1 ] "), "010101");
  EXPECT_EQ(pattern(4, "[0]*3+[1]"), "0001");
  Config five = finalized([](Config& c) {
    c.model.num_layers = 5;
    c.model.num_moe_experts = 4;
    c.model.moe_layer_freq = "2";
  });
  EXPECT_TRUE(five.model.is_moe_layer(0));
  EXPECT_FALSE(five.model.is_moe_layer(3));
  EXPECT_TRUE(five.model.is_moe_layer(4));
  EXPECT_EQ(five.model.num_moe_layers(), 3);
  EXPECT_THROW(five.model.is_moe_layer(5), Error);
  const std::vector<bool> dense = finalized().model.moe_layer_pattern();  // no experts: no MoE layer
  EXPECT_EQ(std::count(dense.begin(), dense.end(), true), 0);
  for (const auto& [freq, what] : std::vector<std::pair<std::string, std::string>>{
           {"[1,0,1]", "has 3 entries"}, {"[1,0,2,0]", "entry 2"}, {"0", "positive integer"},
           {"[1,0]*2+", "expected '[' or '('"}, {"[1,0,1,0", "expected ',' or ']'"}, {"x", "moe_layer_freq"},
           {"([1]*2", "expected ')'"}, {"[0]*4", "selects no layer"}, {"4*", "expected '[' or '('"}}) {
    SCOPED_TRACE(freq);
    expect_invalid([&](Config& c) { c.model.num_layers = 4; c.model.num_moe_experts = 4; c.model.moe_layer_freq = freq; },
                   what);
  }
  expect_invalid([](Config& c) { c.model.moe_layer_freq = "2"; }, "needs --num-experts");
  expect_invalid([](Config& c) { c.model.moe_shared_expert_intermediate_size = 8; }, "needs --num-experts");
  expect_invalid([](Config& c) { c.model.num_moe_experts = 4; c.model.moe_shared_expert_intermediate_size = -1; },
                 "moe_shared_expert_intermediate_size");
  // Which layers route and the shared expert change the function; "2" and its list form are the same model.
  auto fp = [](const std::string& freq, int64_t shared) {
    return finalized([&](Config& c) {
             c.model.num_layers = 4;
             c.model.num_moe_experts = 4;
             c.model.moe_layer_freq = freq;
             c.model.moe_shared_expert_intermediate_size = shared;
           }).fingerprint();
  };
  EXPECT_EQ(fp("2", 0), fp("[1,0,1,0]", 0));
  EXPECT_NE(fp("2", 0), fp("1", 0));
  EXPECT_EQ(fp("1", 0), fp("[1]*4", 0));
  EXPECT_NE(fp("1", 0), fp("1", 16));
  // the routing's other math fields: the capacity and its drop policy, the scaling factor (padding is not math)
  auto moe_fp = [](const std::function<void(TransformerConfig&)>& edit) {
    return finalized([&](Config& c) {
             c.model.num_moe_experts = 4;
             edit(c.model);
           }).fingerprint();
  };
  const std::string dropless = moe_fp([](TransformerConfig&) {});
  const std::string capped = moe_fp([](TransformerConfig& m) { m.moe_expert_capacity_factor = 1.25; });
  EXPECT_NE(capped, dropless);
  EXPECT_NE(moe_fp([](TransformerConfig& m) {
              m.moe_expert_capacity_factor = 1.25;
              m.moe_token_drop_policy = "position";
            }),
            capped);
  EXPECT_EQ(moe_fp([](TransformerConfig& m) {
              m.moe_expert_capacity_factor = 1.25;
              m.moe_pad_expert_input_to_capacity = true;
            }),
            capped);
  EXPECT_NE(moe_fp([](TransformerConfig& m) { m.moe_router_topk_scaling_factor = 2.5f; }), dropless);
  expect_invalid([](Config& c) { c.model.num_moe_experts = 4; c.model.moe_router_topk_scaling_factor = -1.0f; },
                 "moe_router_topk_scaling_factor");
  // DeepSeek-V3's router: the score function and the group limit are math; bad combinations are named
  const std::string sigmoid = moe_fp([](TransformerConfig& m) { m.moe_router_score_function = "sigmoid"; });
  EXPECT_NE(sigmoid, dropless);
  EXPECT_NE(moe_fp([](TransformerConfig& m) {
              m.moe_router_score_function = "sigmoid";
              m.moe_router_num_groups = 2;
              m.moe_router_group_topk = 1;
            }),
            sigmoid);
  EXPECT_NE(moe_fp([](TransformerConfig& m) {
              m.moe_router_num_groups = 2;
              m.moe_router_group_topk = 1;
            }),
            moe_fp([](TransformerConfig& m) {
              m.moe_router_num_groups = 2;
              m.moe_router_group_topk = 2;
            }));
  auto moe = [](const std::function<void(TransformerConfig&)>& edit) {
    return [edit](Config& c) {
      c.model.num_moe_experts = 8;
      c.model.moe_router_topk = 2;
      edit(c.model);
    };
  };
  expect_invalid(moe([](TransformerConfig& m) { m.moe_router_score_function = "relu"; }), "softmax|sigmoid");
  expect_invalid(moe([](TransformerConfig& m) {
                   m.moe_router_score_function = "sigmoid";
                   m.moe_router_pre_softmax = true;
                 }),
                 "moe_router_pre_softmax");
  expect_invalid(moe([](TransformerConfig& m) { m.moe_router_load_balancing_type = "sinkhorn2"; }),
                 "aux_loss|seq_aux_loss|sinkhorn|none");
  expect_invalid(moe([](TransformerConfig& m) {  // Megatron's rule: sinkhorn has no load-balancing loss
                   m.moe_router_load_balancing_type = "sinkhorn";
                   m.moe_aux_loss_coeff = 0.01f;
                 }),
                 "--moe-aux-loss-coeff 0");
  expect_invalid(moe([](TransformerConfig& m) {  // what its routing would ignore is named
                   m.moe_router_load_balancing_type = "sinkhorn";
                   m.moe_router_score_function = "sigmoid";
                   m.moe_router_topk_scaling_factor = 2.0f;
                 }),
                 "drop --moe-router-topk-scaling-factor, --moe-router-score-function");
  // selective recompute modules (Megatron's --recompute-modules)
  expect_invalid([](Config& c) { c.model.recompute_modules = {"mlp"}; }, "recompute-granularity selective");
  expect_invalid([](Config& c) {
    c.model.recompute_granularity = "selective";
    c.model.recompute_modules = {"mla_up_proj"};
  }, "mla_up_proj: the model has no multi-latent attention");
  expect_invalid([](Config& c) {
    c.model.recompute_granularity = "selective";
    c.model.recompute_modules = {"norm"};
  }, "'norm' is not a module");
  expect_invalid([](Config& c) {
    c.model.recompute_granularity = "selective";
    c.model.recompute_modules = {"moe"};
  }, "no MoE layers");
  expect_invalid(moe([](TransformerConfig& m) { m.moe_router_dtype = "fp64"; }), "moe_router_dtype: 'fp64'");
  expect_invalid([](Config& c) { c.model.moe_router_dtype = "fp32"; }, "need --num-experts");
  expect_invalid(moe([](TransformerConfig& m) { m.moe_router_group_topk = 1; }), "go together");
  expect_invalid(moe([](TransformerConfig& m) {
                   m.moe_router_num_groups = 3;
                   m.moe_router_group_topk = 1;
                 }),
                 "divide num_moe_experts");
  expect_invalid(moe([](TransformerConfig& m) {
                   m.moe_router_num_groups = 8;
                   m.moe_router_group_topk = 1;
                   m.moe_router_topk = 2;
                 }),
                 "hold fewer than moe_router_topk");
  expect_invalid([](Config& c) { c.model.moe_router_score_function = "sigmoid"; }, "need --num-experts");
  // the expert bias: sigmoid only; it changes the routing (fingerprint), its update rate does not
  expect_invalid(moe([](TransformerConfig& m) { m.moe_router_enable_expert_bias = true; }), "needs moe_router_score");
  expect_invalid(moe([](TransformerConfig& m) {
                   m.moe_router_score_function = "sigmoid";
                   m.moe_router_bias_update_rate = -1.0f;
                 }),
                 "moe_router_bias_update_rate");
  auto biased = [&](float rate) {
    return moe_fp([rate](TransformerConfig& m) {
      m.moe_router_score_function = "sigmoid";
      m.moe_router_enable_expert_bias = true;
      m.moe_router_bias_update_rate = rate;
    });
  };
  EXPECT_NE(biased(1e-3f), sigmoid);
  EXPECT_EQ(biased(1e-3f), biased(1e-2f));
}

TEST(TransformerConfig, JsonRoundTripAllFields) {
  Config c = finalized([](Config& c) {
    c.model.num_layers = 7;
    c.model.normalization = Normalization::RMSNorm;
    c.model.position_embedding_type = PositionEmbedding::Rope;
    c.model.swiglu = true;
    c.model.norm_epsilon = 1e-6f;
    c.model.add_bias_linear = false;
    c.model.attention_impl = "unfused";
    c.parallel.tensor_model_parallel_size = 2;
    c.parallel.sequence_parallel = true;
    c.parallel.tp_comm_overlap = true;
    c.training.save = "ckpt/x";
    c.training.bf16 = true;
    c.optimizer.lr_decay_style = LrDecayStyle::InverseSquareRoot;
    c.optimizer.lr = 3e-4f;
    c.optimizer.adam_eps = 1e-8f;
    c.data.data_path = {"a", "b"};
    c.data.split = "98,2,0";
    c.model.num_moe_experts = 4;
    c.model.moe_layer_freq = "[1,0]*3+[1]";
    c.model.moe_shared_expert_intermediate_size = 32;
  });
  nlohmann::json j = c.to_json();
  EXPECT_EQ(j["model"]["moe_layer_freq"], "[1,0]*3+[1]");
  EXPECT_EQ(j["model"]["normalization"], "RMSNorm");
  EXPECT_EQ(j["model"]["position_embedding_type"], "rope");
  EXPECT_EQ(j["optimizer"]["lr_decay_style"], "inverse-square-root");
  EXPECT_EQ(j["model"]["norm_epsilon"].get<double>(), 1e-6);  // shortest decimal form, not 9.99999997e-07
  Config back = Config::from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(back.to_json(), j);
  EXPECT_EQ(back.optimizer.lr, 3e-4f);
  EXPECT_EQ(back.model.norm_epsilon, 1e-6f);
  EXPECT_EQ(back.data.data_path, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(back.fingerprint(), c.fingerprint());
}

TEST(TransformerConfig, FromJsonRejectsUnknownAndWrongTypes) {
  auto msg = [](const nlohmann::json& j) { return mcpp::testing::error_of([&] { Config::from_json(j); }); };
  EXPECT_NE(msg({{"model", {{"hiden_size", 3}}}}).find("model.hiden_size"), std::string::npos);
  EXPECT_NE(msg({{"modle", nlohmann::json::object()}}).find("modle"), std::string::npos);
  EXPECT_NE(msg({{"model", {{"hidden_size", 64.5}}}}).find("model.hidden_size"), std::string::npos);
  EXPECT_NE(msg({{"model", {{"swiglu", 1}}}}).find("model.swiglu"), std::string::npos);
  EXPECT_NE(msg({{"model", {{"normalization", "BatchNorm"}}}}).find("model.normalization"), std::string::npos);
  EXPECT_NE(msg({{"optimizer", {{"lr_decay_style", "step"}}}}).find("lr_decay_style"), std::string::npos);
  // missing keys keep their defaults
  EXPECT_EQ(Config::from_json({{"model", {{"num_layers", 9}}}}).model.hidden_size, Config{}.model.hidden_size);
}

TEST(TransformerConfig, FingerprintIsStableAndHex) {
  Config c = finalized();
  std::string fp = c.fingerprint();
  ASSERT_EQ(fp.size(), 16u);
  EXPECT_EQ(fp.find_first_not_of("0123456789abcdef"), std::string::npos);
  // Pinned: the default model's fingerprint. It changes only when math_fields() changes, which makes
  // every existing checkpoint unloadable — update deliberately. Checked independently with Python:
  // xxhash.xxh3_64_hexdigest(json.dumps(fields, sort_keys=True, separators=(',', ':'))).
  EXPECT_EQ(fp, "903ddb7970bb29ce");
  EXPECT_EQ(finalized().fingerprint(), fp);
}

TEST(TransformerConfig, FingerprintMovesWithMathFieldsOnly) {
  const std::string base = finalized().fingerprint();
  auto fp = [](std::function<void(Config&)> e) { return finalized(std::move(e)).fingerprint(); };
  // Math fields: each changes the fingerprint.
  std::vector<std::pair<std::string, std::function<void(Config&)>>> math = {
      {"num_layers", [](Config& c) { c.model.num_layers = 3; }},
      {"hidden_size", [](Config& c) { c.model.hidden_size = 128; }},
      {"num_attention_heads", [](Config& c) { c.model.num_attention_heads = 8; }},
      {"num_query_groups", [](Config& c) { c.model.num_query_groups = 2; }},
      {"ffn_hidden_size", [](Config& c) { c.model.ffn_hidden_size = 100; }},
      {"kv_channels", [](Config& c) { c.model.kv_channels = 32; }},
      {"normalization", [](Config& c) { c.model.normalization = Normalization::RMSNorm; }},
      {"norm_epsilon", [](Config& c) { c.model.norm_epsilon = 1e-6f; }},
      {"swiglu", [](Config& c) { c.model.swiglu = true; c.model.ffn_hidden_size = 256; }},
      {"position_embedding_type", [](Config& c) { c.model.position_embedding_type = PositionEmbedding::None; }},
      {"untie", [](Config& c) { c.model.untie_embeddings_and_output_weights = true; }},
      {"add_bias_linear", [](Config& c) { c.model.add_bias_linear = false; }},
      {"vocab", [](Config& c) { c.model.set_vocab_size(1000, 1); }},
      {"max_position_embeddings", [](Config& c) { c.model.max_position_embeddings = 128; }},
  };
  for (const auto& [name, edit] : math) EXPECT_NE(fp(edit), base) << name;
  // Not math: each leaves it unchanged.
  std::vector<std::pair<std::string, std::function<void(Config&)>>> other = {
      {"dropout", [](Config& c) { c.model.hidden_dropout = 0.0f; c.model.attention_dropout = 0.0f; }},
      {"init_method_std", [](Config& c) { c.model.init_method_std = 0.01f; }},
      {"attention_impl", [](Config& c) { c.model.attention_impl = "unfused"; }},
      {"seq_length (max positions fixed)", [](Config& c) { c.model.seq_length = 32; c.model.max_position_embeddings = 64; }},
      {"rotary fields with learned positions", [](Config& c) { c.model.rotary_base = 500000.0f; }},
      {"training", [](Config& c) { c.training.micro_batch_size = 2; c.training.train_iters = 5; }},
      {"optimizer", [](Config& c) { c.optimizer.lr = 1.0f; c.optimizer.weight_decay = 0.0f; }},
      {"parallel", [](Config& c) { c.parallel.tensor_model_parallel_size = 2; }},
      {"data", [](Config& c) { c.data.split = "1,0,0"; }},
  };
  for (const auto& [name, edit] : other) EXPECT_EQ(fp(edit), base) << name;
  // With rope, rotary fields count and max positions do not.
  auto rope = [](Config& c) { c.model.position_embedding_type = PositionEmbedding::Rope; };
  const std::string rope_base = fp(rope);
  EXPECT_NE(fp([&](Config& c) { rope(c); c.model.rotary_base = 500000.0f; }), rope_base);
  EXPECT_NE(fp([&](Config& c) { rope(c); c.model.rotary_percent = 0.5f; }), rope_base);
  EXPECT_EQ(fp([&](Config& c) { rope(c); c.model.max_position_embeddings = 4096; }), rope_base);
}

TEST(TransformerConfig, DiffMathFieldsNamesEachField) {
  Config a = finalized();
  Config b = finalized([](Config& c) {
    c.model.hidden_size = 128;
    c.model.num_layers = 3;
  });
  auto d = diff_math_fields(a.math_fields(), b.math_fields());
  ASSERT_EQ(d.size(), 4u);  // hidden_size, num_layers and the derived ffn_hidden_size, kv_channels
  EXPECT_NE(std::find(d.begin(), d.end(), "hidden_size: 64 vs 128"), d.end());
  EXPECT_NE(std::find(d.begin(), d.end(), "num_layers: 2 vs 3"), d.end());
  EXPECT_NE(std::find(d.begin(), d.end(), "ffn_hidden_size: 256 vs 512"), d.end());
  EXPECT_TRUE(diff_math_fields(a.math_fields(), a.math_fields()).empty());
  Config r = finalized([](Config& c) { c.model.position_embedding_type = PositionEmbedding::Rope; });
  auto dr = diff_math_fields(a.math_fields(), r.math_fields());
  EXPECT_NE(std::find(dr.begin(), dr.end(), "max_position_embeddings: 64 vs <absent>"), dr.end());
}

}  // namespace
}  // namespace mcpp
