// The HF converters against the real mcpp::Config (training/config.h): a finalized Config's
// to_json() is what the trainer stores in meta.config, so model_dims_from_config must read it, and
// the config an import writes must parse with Config::from_json and finalize/validate unchanged.
#include <gtest/gtest.h>

#include "dist_checkpointing/ckpt_test_util.h"
#include "mcpp/dist_checkpointing/hf_convert.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/training/config.h"
#include "mcpp/transformer/transformer_config.h"
#include "models/gpt_test_util.h"

namespace mcpp::dist_checkpointing {
namespace {

TEST(HfConfig, ReadsConfigToJsonOfFinalizedLlamaConfig) {
  Config c;
  c.model.num_layers = 3, c.model.hidden_size = 64, c.model.num_attention_heads = 4;
  c.model.group_query_attention = true, c.model.num_query_groups = 2;
  c.model.normalization = Normalization::RMSNorm, c.model.swiglu = true;
  c.model.position_embedding_type = PositionEmbedding::Rope, c.model.add_bias_linear = false;
  c.model.untie_embeddings_and_output_weights = true, c.model.norm_epsilon = 1e-6f;
  c.model.set_vocab_size(50257, 1);
  c.finalize();
  ModelDims d = model_dims_from_config(c.to_json(), "test");
  EXPECT_EQ(d.num_layers, 3);
  EXPECT_EQ(d.groups, 2);
  EXPECT_EQ(d.head_dim, 16);
  EXPECT_EQ(d.ffn, c.model.ffn_hidden_size);  // Megatron's swiglu default, filled by finalize
  EXPECT_EQ(d.padded_vocab, c.model.padded_vocab_size);
  EXPECT_EQ(d.vocab, 50257);
  EXPECT_EQ(d.normalization, "RMSNorm");
  EXPECT_EQ(d.position_embedding, "rope");
  EXPECT_TRUE(d.swiglu && d.untied && !d.bias_linear && !d.qkv_bias);
  EXPECT_FLOAT_EQ(static_cast<float>(d.norm_eps), 1e-6f);
  EXPECT_EQ(d.max_pos, c.model.max_position_embeddings);
}

TEST(HfConfig, ImportedConfigParsesAsConfigAndKeepsItsValues) {
  for (bool llama : {false, true}) {
    ModelDims d;
    d.num_layers = 2, d.hidden = 32, d.heads = 4, d.groups = llama ? 2 : 4, d.head_dim = 8;
    d.ffn = llama ? 88 : 128, d.vocab = 50257, d.padded_vocab = 50304, d.max_pos = 128;
    if (llama) {
      d.normalization = "RMSNorm", d.position_embedding = "rope", d.swiglu = true, d.bias_linear = false;
      d.untied = true, d.norm_eps = 1e-6, d.rotary_base = 500000.0;
    }
    nlohmann::json j = config_from_model_dims(d);
    Config c = Config::from_json(j);
    c.finalize();
    EXPECT_NO_THROW(c.model.validate()) << j.dump();
    EXPECT_EQ(c.model.ffn_hidden_size, d.ffn);
    EXPECT_EQ(c.model.num_query_groups, d.groups);
    EXPECT_EQ(c.model.padded_vocab_size, d.padded_vocab);
    EXPECT_EQ(c.model.qkv_bias(), !llama);
    EXPECT_EQ(config_from_model_dims(model_dims_from_config(c.to_json(), "round trip")), j) << llama;
  }
}

// model_param_shapes (the converters' key set) against the parameters a real GPTModel registers, in order: GPT-2 and
// Llama style, each with --qk-layernorm (LayerNorm q/k norms with biases; RMSNorm ones with a head dim != h / heads).
TEST(HfConfig, ParamShapesEqualTheModelsParameters) {
  for (const std::string style : {"gpt2", "llama"})
    for (const bool qk : {false, true}) {
      Config c;
      c.model = mcpp::testing::tiny_config(style);
      c.model.qk_layernorm = qk;
      if (style == "llama") c.model.kv_channels = 12;  // 4 heads x 12 != hidden 32
      c.finalize();
      ModelChunk model(c.model, 1, mcpp::testing::single_tp());
      const auto shapes = model_param_shapes(model_dims_from_config(c.to_json(), "test"));
      const auto& params = model.params().params();
      ASSERT_EQ(shapes.size(), params.size()) << style << " qk " << qk;
      for (size_t i = 0; i < shapes.size(); ++i) {
        EXPECT_EQ(shapes[i].first, params[i]->spec.key) << style << " qk " << qk;
        EXPECT_EQ(shapes[i].second, params[i]->data.shape()) << shapes[i].first;
      }
    }
}

}  // namespace
}  // namespace mcpp::dist_checkpointing
