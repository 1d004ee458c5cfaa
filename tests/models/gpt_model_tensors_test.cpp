// gpt_model_tensors (the model's own tensor list, without storage) against the tensors a real ModelChunk allocates —
// its dense and expert buffers' parameters and its routers' expert-bias buffers — for GPT-2 and Llama style models, a
// MoE model (expert bias, gated shared expert, a dense layer) and an MLA model with MoE and an MTP depth: the same
// keys with the same shapes, each once, the dense parameters in the buffer's order and each expert bias right after
// its router's weight; a config of an absurd context length costs only its list (no RoPE tables are built).
#include "mcpp/models/gpt/gpt_model_tensors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "mcpp/distributed/model_chunk.h"
#include "models/gpt_test_util.h"

namespace mcpp {
namespace {

std::vector<TransformerConfig> configs() {
  std::vector<TransformerConfig> out = {testing::tiny_config("gpt2"), testing::tiny_config("llama")};
  out[1].qk_layernorm = true;
  TransformerConfig moe = testing::tiny_config("llama");
  moe.num_moe_experts = 4, moe.moe_router_topk = 2, moe.moe_ffn_hidden_size = 16, moe.moe_layer_freq = "[1,0]";
  moe.moe_router_score_function = "sigmoid", moe.moe_router_enable_expert_bias = true;
  moe.moe_shared_expert_intermediate_size = 24, moe.moe_shared_expert_gate = true;
  out.push_back(moe);
  TransformerConfig mla = testing::mla_tiny_config("llama");
  mla.num_moe_experts = 4, mla.moe_router_topk = 2, mla.moe_ffn_hidden_size = 8, mla.moe_layer_freq = "[0,1]";
  mla.moe_router_score_function = "sigmoid", mla.moe_router_enable_expert_bias = true, mla.mtp_num_layers = 1;
  out.push_back(mla);
  for (auto& c : out) c.finalize();
  return out;
}

TEST(GptModelTensors, EqualTheTensorsOfTheAllocatedModel) {
  for (const TransformerConfig& c : configs()) {
    const auto list = gpt_model_tensors(c);
    ModelChunk model(c, 1, testing::single_tp());
    std::map<std::string, Shape> want;
    std::vector<std::string> dense;  // the dense buffer's keys, in its order
    for (ParamAndGradBuffer* b : model.buffers())
      for (const auto& p : b->params()) {
        want[p->spec.key] = p->data.shape();
        if (b == &model.params()) dense.push_back(p->spec.key);
      }
    for (moe::TopKRouter* r : model.routers())
      if (r->has_expert_bias()) want[r->expert_bias_key()] = r->expert_bias().shape();
    std::map<std::string, Shape> got;
    std::vector<std::string> got_dense;
    for (size_t i = 0; i < list.size(); ++i) {
      const auto& [key, shape] = list[i];
      EXPECT_TRUE(got.emplace(key, shape).second) << key << " twice";
      if (key.ends_with(".expert_bias")) {  // right after its router's weight
        ASSERT_GT(i, 0u);
        EXPECT_EQ(list[i - 1].first, key.substr(0, key.size() - 11) + "weight");
      }
      if (std::find(dense.begin(), dense.end(), key) != dense.end()) got_dense.push_back(key);
    }
    EXPECT_EQ(got, want) << c.num_moe_experts << " experts, mla " << c.multi_latent_attention;
    EXPECT_EQ(got_dense, dense);
  }
}

TEST(GptModelTensors, ALongContextCostsOnlyItsList) {
  TransformerConfig c = testing::tiny_config("llama");  // RoPE: tables of max(seq, max_pos) rows if the model built them
  const auto short_list = gpt_model_tensors(c);
  c.seq_length = c.max_position_embeddings = int64_t{1} << 40;  // 2^40 x 4 floats x 2: no machine holds the tables
  EXPECT_EQ(gpt_model_tensors(c), short_list);
}

}  // namespace
}  // namespace mcpp
