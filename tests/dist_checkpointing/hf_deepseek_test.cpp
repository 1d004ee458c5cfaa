// DeepSeek-V2 / V3 HF conversion (hf_deepseek.h): our key set against a real GPTModel's parameters and expert-bias
// buffers (MLA with and without query compression, first-k-dense MoE, MTP); export -> import -> export bit-identical
// for a V3 model (query compression, YaRN, sigmoid group-limited routing with expert bias, 2 shared experts, untied,
// one MTP depth) and a V2 one (linear_q_proj, plain RoPE, pre-softmax group_limited_greedy routing, tied); the
// exported tensor names against the list spelled from transformers' DeepseekV3 modules, each once, every one consumed
// by the import; config.json both ways (a DeepSeek-V3-style config.json -> a Config that validates); transformers 5's
// fused experts; and the variants either side cannot express refused with one error line naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <set>

#include "core/core_test_util.h"
#include "dist_checkpointing/hf_test_util.h"
#include "mcpp/core/error.h"
#include "mcpp/dist_checkpointing/hf_deepseek.h"
#include "mcpp/dist_checkpointing/hf_tensor_ops.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/training/config.h"
#include "models/gpt_test_util.h"

namespace mcpp::dist_checkpointing {
namespace {
using namespace testing;
using mcpp::testing::error_of;

HfFormat fmt_of(bool v3) { return v3 ? HfFormat::DeepseekV3 : HfFormat::DeepseekV2; }

// Random tensors of the model's key set; the vocabulary's padding rows zero (export drops them, import pads zeros).
CheckpointContents random_model(const Config& c) {
  DeepseekDims d = deepseek_dims_from_config(c.to_json(), "test");
  return random_checkpoint(c.to_json(), deepseek_param_shapes(d), d.m.vocab, 30, 11);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// An HF directory of `items` and a copy of `config`.
void write_hf(const std::string& dir, const std::string& config, const std::vector<SafetensorsItem>& items) {
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(config, dir + "/config.json");
  write_safetensors(dir + "/model.safetensors", items, {{"format", "pt"}}, false);
}

TEST(HfDeepseek, ParamShapesEqualTheModelsParametersAndExpertBiases) {
  for (const bool v3 : {true, false}) {
    Config c = ds_config(v3);
    ModelChunk model(c.model, 1, mcpp::testing::single_tp());
    std::set<std::pair<std::string, Shape>> ours, theirs;
    for (ParamAndGradBuffer* b : model.buffers())
      for (const auto& p : b->params()) theirs.insert({p->spec.key, p->data.shape()});
    for (moe::TopKRouter* r : model.routers())
      if (r->has_expert_bias()) theirs.insert({r->expert_bias_key(), r->expert_bias().shape()});
    const auto shapes = deepseek_param_shapes(deepseek_dims_from_config(c.to_json(), "test"));
    for (const auto& s : shapes) ours.insert(s);
    EXPECT_EQ(ours.size(), shapes.size()) << "a key twice";
    EXPECT_EQ(ours, theirs) << "v3 " << v3;
    EXPECT_EQ(v3, theirs.count({"mtp.layers.0.transformer_layer.mlp.router.expert_bias", Shape{4}}) == 1);
  }
}

// import(export(ours)) == ours bit for bit, the imported config equal, and export(import(...)) byte-identical files.
TEST(HfDeepseek, ExportImportExportRoundTripIsBitIdentical) {
  for (const bool v3 : {true, false}) {
    TempDir dir;
    const Config c = ds_config(v3);
    CheckpointContents ours = random_model(c);
    save_checkpoint(dir / "ckpt", ours);
    export_hf(CheckpointReader(dir / "ckpt"), fmt_of(v3), dir / "hf");
    CheckpointContents back = import_hf(dir / "hf", fmt_of(v3));
    EXPECT_EQ(back.iteration, 0);
    EXPECT_EQ(config_from_deepseek_dims(deepseek_dims_from_config(back.meta["config"], "imported")),
              config_from_deepseek_dims(deepseek_dims_from_config(c.to_json(), "ours")));
    ASSERT_EQ(back.tensors.size(), ours.tensors.size());
    for (size_t i = 0; i < ours.tensors.size(); ++i) {
      EXPECT_EQ(back.tensors[i].key, ours.tensors[i].key);
      EXPECT_TRUE(bit_equal(back.tensors[i].tensor, ours.tensors[i].tensor)) << ours.tensors[i].key;
    }
    save_checkpoint(dir / "ckpt2", back);
    export_hf(CheckpointReader(dir / "ckpt2"), fmt_of(v3), dir / "hf2");
    EXPECT_EQ(slurp(dir / "hf/model.safetensors"), slurp(dir / "hf2/model.safetensors")) << "v3 " << v3;
    EXPECT_EQ(slurp(dir / "hf/config.json"), slurp(dir / "hf2/config.json")) << "v3 " << v3;
    // the imported config is a Config that validates and builds the same model
    Config imported = Config::from_json(back.meta["config"]);
    imported.finalize();
    EXPECT_NO_THROW(imported.model.validate());
    EXPECT_EQ(imported.model.moe_layer_pattern(), c.model.moe_layer_pattern());
    EXPECT_EQ(imported.model.moe_router_group_topk, c.model.moe_router_group_topk);
    EXPECT_EQ(imported.model.mla_yarn(), c.model.mla_yarn());
  }
}

// Every HF tensor of the V3 model, spelled from transformers' DeepseekV3 modules and DeepSeek's MTP layer: exported
// exactly once with its shape, and consumed by the import (one more tensor is refused by name).
TEST(HfDeepseek, ExportedNamesAreTransformersOnesEachOnce) {
  TempDir dir;
  save_checkpoint(dir / "ckpt", random_model(ds_config(true)));
  export_hf(CheckpointReader(dir / "ckpt"), HfFormat::DeepseekV3, dir / "hf");
  std::map<std::string, Shape> want = {{"model.embed_tokens.weight", {100, 32}}, {"model.norm.weight", {32}},
                                       {"lm_head.weight", {100, 32}}};
  for (int j = 0; j < 3; ++j) {  // layer 2: the MTP depth
    const std::string H = "model.layers." + std::to_string(j) + ".";
    want[H + "input_layernorm.weight"] = {32};
    want[H + "post_attention_layernorm.weight"] = {32};
    want[H + "self_attn.q_a_proj.weight"] = {16, 32};
    want[H + "self_attn.q_a_layernorm.weight"] = {16};
    want[H + "self_attn.q_b_proj.weight"] = {4 * (6 + 4), 16};
    want[H + "self_attn.kv_a_proj_with_mqa.weight"] = {12 + 4, 32};
    want[H + "self_attn.kv_a_layernorm.weight"] = {12};
    want[H + "self_attn.kv_b_proj.weight"] = {4 * (6 + 8), 12};
    want[H + "self_attn.o_proj.weight"] = {32, 4 * 8};
    if (j == 0) {
      for (const char* p : {"gate_proj", "up_proj"}) want[H + "mlp." + p + ".weight"] = {48, 32};
      want[H + "mlp.down_proj.weight"] = {32, 48};
      continue;
    }
    want[H + "mlp.gate.weight"] = {4, 32};
    want[H + "mlp.gate.e_score_correction_bias"] = {4};
    for (const std::string e : {"experts.0.", "experts.1.", "experts.2.", "experts.3.", "shared_experts."}) {
      const int64_t w = e == "shared_experts." ? 16 : 8;
      want[H + "mlp." + e + "gate_proj.weight"] = {w, 32};
      want[H + "mlp." + e + "up_proj.weight"] = {w, 32};
      want[H + "mlp." + e + "down_proj.weight"] = {32, w};
    }
  }
  for (const char* n : {"enorm.weight", "hnorm.weight", "shared_head.norm.weight"})
    want[std::string("model.layers.2.") + n] = {32};
  want["model.layers.2.eh_proj.weight"] = {32, 64};
  want["model.layers.2.embed_tokens.weight"] = {100, 32};
  want["model.layers.2.shared_head.head.weight"] = {100, 32};
  const SafetensorsHeader h = read_safetensors_header(dir / "hf/model.safetensors");
  std::map<std::string, Shape> got;
  for (const auto& e : h.entries) EXPECT_TRUE(got.insert({e.name, e.shape}).second) << "twice: " << e.name;
  EXPECT_EQ(got, want);
  auto tensor = [&](const std::string& n) {
    for (const auto& e : h.entries)
      if (e.name == n) return read_safetensors_tensor(h, e);
    return Tensor::zeros({1});
  };
  EXPECT_TRUE(bit_equal(tensor("model.layers.2.embed_tokens.weight"), tensor("model.embed_tokens.weight")));
  EXPECT_TRUE(bit_equal(tensor("model.layers.2.shared_head.head.weight"), tensor("lm_head.weight")));
  EXPECT_NO_THROW(import_hf(dir / "hf", HfFormat::DeepseekV3));  // every tensor consumed (check_all_used)
  // one more tensor: refused by name; a depth's embedding copy that differs: refused by name
  std::vector<SafetensorsItem> items;
  for (const auto& e : h.entries) items.push_back({e.name, read_safetensors_tensor(h, e)});
  items.push_back({"model.layers.1.mlp.gate.extra", Tensor::zeros({4})});
  write_hf(dir / "extra", dir / "hf/config.json", items);
  EXPECT_NE(error_of([&] { import_hf(dir / "extra", HfFormat::DeepseekV3); }).find("'model.layers.1.mlp.gate.extra'"),
            std::string::npos);
  items.pop_back();
  for (auto& it : items)
    if (it.name == "model.layers.2.embed_tokens.weight") it.tensor.data<float>()[5] += 1.0f;
  write_hf(dir / "copy", dir / "hf/config.json", items);
  EXPECT_NE(error_of([&] { import_hf(dir / "copy", HfFormat::DeepseekV3); }).find("model.layers.2.embed_tokens.weight"),
            std::string::npos);
}

TEST(HfDeepseek, ExportedConfigJson) {
  const DeepseekDims v3 = deepseek_dims_from_config(ds_config(true).to_json(), "test");
  const nlohmann::json a = deepseek_hf_config(v3, HfFormat::DeepseekV3);
  EXPECT_EQ(a["architectures"][0], "DeepseekV3ForCausalLM");
  EXPECT_EQ(a["model_type"], "deepseek_v3");
  EXPECT_EQ(a["q_lora_rank"], 16);
  EXPECT_EQ(a["kv_lora_rank"], 12);
  EXPECT_EQ(a["qk_nope_head_dim"], 6);
  EXPECT_EQ(a["qk_rope_head_dim"], 4);
  EXPECT_EQ(a["v_head_dim"], 8);
  EXPECT_EQ(a["num_key_value_heads"], 4);
  EXPECT_EQ(a["first_k_dense_replace"], 1);
  EXPECT_EQ(a["n_routed_experts"], 4);
  EXPECT_EQ(a["n_shared_experts"], 2);  // 16 = 2 x moe_intermediate_size 8
  EXPECT_EQ(a["moe_intermediate_size"], 8);
  EXPECT_EQ(a["intermediate_size"], 48);
  EXPECT_EQ(a["n_group"], 2);
  EXPECT_EQ(a["topk_group"], 1);
  EXPECT_EQ(a["norm_topk_prob"], true);
  EXPECT_EQ(a["routed_scaling_factor"], 2.5);
  EXPECT_EQ(a["num_nextn_predict_layers"], 1);
  EXPECT_EQ(a["rope_interleave"], true);
  EXPECT_EQ(a["tie_word_embeddings"], false);
  EXPECT_EQ(a["rope_scaling"]["type"], "yarn");
  EXPECT_EQ(a["rope_scaling"]["factor"], 4.0);
  EXPECT_EQ(a["rope_scaling"]["original_max_position_embeddings"], 8);
  EXPECT_EQ(a["rope_parameters"]["rope_type"], "yarn");
  EXPECT_EQ(a["max_position_embeddings"], 32);  // transformers' YaRN factor: 32 / 8
  const DeepseekDims v2 = deepseek_dims_from_config(ds_config(false).to_json(), "test");
  const nlohmann::json b = deepseek_hf_config(v2, HfFormat::DeepseekV2);
  EXPECT_EQ(b["model_type"], "deepseek_v2");
  EXPECT_TRUE(b["q_lora_rank"].is_null());
  EXPECT_EQ(b["topk_method"], "group_limited_greedy");
  EXPECT_EQ(b["n_group"], 4);
  EXPECT_EQ(b["topk_group"], 2);
  EXPECT_EQ(b["norm_topk_prob"], false);
  EXPECT_EQ(b["routed_scaling_factor"], 1.5);
  EXPECT_EQ(b["tie_word_embeddings"], true);
  EXPECT_TRUE(b["rope_scaling"].is_null());
  EXPECT_EQ(b["rope_parameters"]["rope_type"], "default");
}

// A DeepSeek-V3 config.json as released (its fields, at toy sizes) -> our Config.
nlohmann::json released_v3_config() {
  return {{"architectures", {"DeepseekV3ForCausalLM"}}, {"model_type", "deepseek_v3"}, {"vocab_size", 1000},
          {"hidden_size", 64}, {"intermediate_size", 96}, {"moe_intermediate_size", 16}, {"num_hidden_layers", 4},
          {"num_nextn_predict_layers", 1}, {"num_attention_heads", 4}, {"num_key_value_heads", 4},
          {"n_shared_experts", 1}, {"n_routed_experts", 16}, {"routed_scaling_factor", 2.5}, {"kv_lora_rank", 32},
          {"q_lora_rank", 48}, {"qk_rope_head_dim", 8}, {"v_head_dim", 16}, {"qk_nope_head_dim", 16},
          {"topk_method", "noaux_tc"}, {"n_group", 8}, {"topk_group", 4}, {"num_experts_per_tok", 8},
          {"moe_layer_freq", 1}, {"first_k_dense_replace", 3}, {"norm_topk_prob", true}, {"scoring_func", "sigmoid"},
          {"hidden_act", "silu"}, {"max_position_embeddings", 1280}, {"rms_norm_eps", 1e-6},
          {"tie_word_embeddings", false}, {"rope_theta", 10000},
          {"rope_scaling", {{"beta_fast", 32}, {"beta_slow", 1}, {"factor", 40}, {"mscale", 1.0},
                            {"mscale_all_dim", 1.0}, {"original_max_position_embeddings", 32}, {"type", "yarn"}}},
          {"attention_bias", false}, {"attention_dropout", 0.0}};
}

TEST(HfDeepseek, ReleasedConfigJsonImportsAsAValidConfig) {
  const DeepseekDims d = deepseek_dims_from_hf(released_v3_config(), "config.json", HfFormat::DeepseekV3, true);
  Config c = Config::from_json(config_from_deepseek_dims(d));
  c.finalize();
  EXPECT_NO_THROW(c.model.validate());
  const TransformerConfig& m = c.model;
  EXPECT_TRUE(m.multi_latent_attention && m.qk_layernorm && m.mla_yarn());
  EXPECT_EQ(m.q_lora_rank, 48);
  EXPECT_EQ(m.kv_lora_rank, 32);
  EXPECT_EQ(m.qk_head_dim, 16);
  EXPECT_EQ(m.qk_pos_emb_head_dim, 8);
  EXPECT_EQ(m.v_head_dim, 16);
  EXPECT_FLOAT_EQ(m.rotary_scaling_factor, 40.0f);
  EXPECT_EQ(m.original_max_position_embeddings, 32);
  EXPECT_EQ(m.moe_layer_pattern(), (std::vector<bool>{false, false, false, true}));
  EXPECT_EQ(m.num_moe_experts, 16);
  EXPECT_EQ(m.moe_router_topk, 8);
  EXPECT_EQ(m.moe_ffn_hidden_size, 16);
  EXPECT_EQ(m.moe_shared_expert_intermediate_size, 16);
  EXPECT_EQ(m.moe_router_score_function, "sigmoid");
  EXPECT_TRUE(m.moe_router_enable_expert_bias);
  EXPECT_FALSE(m.moe_router_pre_softmax);
  EXPECT_EQ(m.moe_router_num_groups, 8);
  EXPECT_EQ(m.moe_router_group_topk, 4);  // top-8 / 4 groups = DeepSeek's top-2 per group
  EXPECT_FLOAT_EQ(m.moe_router_topk_scaling_factor, 2.5f);
  EXPECT_EQ(m.mtp_num_layers, 1);
  EXPECT_EQ(m.padded_vocab_size, 1024);
  EXPECT_TRUE(m.untie_embeddings_and_output_weights);
  // the MTP depth's tensors absent (transformers' save_pretrained drops them): no depth
  EXPECT_EQ(deepseek_dims_from_hf(released_v3_config(), "config.json", HfFormat::DeepseekV3, false).mtp, 0);
}

// What our checkpoints or HF's configs hold that the other side cannot express: one error line naming the field.
TEST(HfDeepseek, RefusesWhatTheOtherSideCannotExpress) {
  auto import_err = [](const std::function<void(nlohmann::json&)>& edit, HfFormat f = HfFormat::DeepseekV3) {
    nlohmann::json c = released_v3_config();
    if (f == HfFormat::DeepseekV2) c["model_type"] = "deepseek_v2", c["topk_method"] = "greedy",
                                   c["scoring_func"] = "softmax", c["norm_topk_prob"] = false, c["rope_scaling"] = nullptr;
    edit(c);
    return error_of([&] { deepseek_dims_from_hf(c, "config.json", f, true); });
  };
  const std::vector<std::pair<std::string, std::string>> imports = {
      {import_err([](auto& c) { c["rope_interleave"] = false; }), "'rope_interleave'"},
      {import_err([](auto& c) { c["topk_group"] = 2; }), "'topk_group'"},  // top-8 / 2 groups != top-2
      {import_err([](auto& c) { c["norm_topk_prob"] = false; }), "'norm_topk_prob'"},
      {import_err([](auto& c) { c["rms_norm_eps"] = 1e-5; }), "'rms_norm_eps'"},
      {import_err([](auto& c) { c["num_key_value_heads"] = 2; }), "'num_key_value_heads'"},
      {import_err([](auto& c) { c["attention_bias"] = true; }), "'attention_bias'"},
      {import_err([](auto& c) { c["first_k_dense_replace"] = 4; }), "'first_k_dense_replace'"},
      {import_err([](auto& c) { c["moe_layer_freq"] = 2; }), "'moe_layer_freq'"},
      {import_err([](auto& c) { c["max_position_embeddings"] = 4096; }), "'max_position_embeddings'"},
      {import_err([](auto& c) { c["rope_scaling"]["type"] = "dynamic"; }), "'rope_scaling'"},
      {import_err([](auto& c) { c["rope_scaling"]["mscale_all_dim"] = 0.0; c["rope_scaling"]["mscale"] = 0.7; }),
       "'rope_scaling'"},
      {import_err([](auto& c) { c["model_type"] = "llama"; }), "'model_type'"},
      {import_err([](auto& c) { c["norm_topk_prob"] = true; }, HfFormat::DeepseekV2), "'norm_topk_prob'"},
      {import_err([](auto& c) { c["topk_method"] = "group_limited_greedy"; }, HfFormat::DeepseekV2), "'topk_group'"},
      {import_err([](auto& c) { c["topk_method"] = "noaux_tc"; }, HfFormat::DeepseekV2), "'topk_method'"},
      {import_err([](auto& c) { c["q_lora_rank"] = "x"; }), "'q_lora_rank'"},
      {import_err([](auto& c) { c["quantization_config"] = {{"quant_method", "fp8"}}; }), "'quantization_config'"},
  };
  for (const auto& [msg, field] : imports) {
    EXPECT_NE(msg.find(field), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  auto export_err = [](bool v3, HfFormat f, const std::function<void(TransformerConfig&)>& edit) {
    Config c = ds_config(v3);
    edit(c.model);
    return error_of([&] { deepseek_hf_config(deepseek_dims_from_config(c.to_json(), "ckpt"), f); });
  };
  const auto V3 = HfFormat::DeepseekV3, V2 = HfFormat::DeepseekV2;
  const std::vector<std::pair<std::string, std::string>> exports = {
      {export_err(false, V3, [](auto&) {}), "model.moe_router_score_function"},  // softmax to V3
      {export_err(true, V2, [](auto& m) { m.mscale_all_dim = 0.0f; }), "model.moe_router_score_function"},
      {export_err(true, V3, [](auto& m) { m.moe_router_group_topk = 2, m.moe_router_num_groups = 4; }),
       "model.moe_router_group_topk"},
      {export_err(true, V3, [](auto& m) { m.moe_layer_freq = "[1,0]"; }), "model.moe_layer_freq"},
      {export_err(true, V3, [](auto& m) { m.moe_shared_expert_intermediate_size = 12; }),
       "model.moe_shared_expert_intermediate_size"},
      {export_err(true, V3, [](auto& m) { m.moe_shared_expert_gate = true; }), "model.moe_shared_expert_gate"},
      {export_err(true, V3, [](auto& m) { m.norm_epsilon = 1e-5f; }), "model.norm_epsilon"},
      {export_err(true, V3, [](auto& m) { m.rotary_scaling_factor = 4.1f; }), "model.rotary_scaling_factor"},
      {export_err(true, V3, [](auto& m) { m.mscale_all_dim = 0.0f, m.mscale = 0.7f; }), "model.mscale"},
      {export_err(false, V2, [](auto& m) { m.moe_router_pre_softmax = false; }), "model.moe_router_pre_softmax"},
      {export_err(false, V2, [](auto& m) { m.mtp_num_layers = 1; }), "model.mtp_num_layers"},
      {export_err(false, V2, [](auto& m) { m.moe_router_group_topk = 1; }), "model.moe_router_group_topk"},
      {export_err(false, V2, [](auto& m) { m.rotary_scaling_factor = 2.0f, m.mscale_all_dim = 1.0f; }),
       "model.mscale_all_dim"},
      {export_err(true, V3, [](auto& m) { m.multi_latent_attention = false; }), "model.multi_latent_attention"},
  };
  for (const auto& [msg, field] : exports) {
    EXPECT_NE(msg.find(field), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

// transformers 5 saves its in-memory layout: each MoE layer's experts fused (gate_up_proj [E, 2F, h], rows [gate; up],
// down_proj [E, h, F]); the import reads them as the per-expert tensors.
TEST(HfDeepseek, ImportsTransformers5FusedExperts) {
  TempDir dir;
  save_checkpoint(dir / "ckpt", random_model(ds_config(true)));
  export_hf(CheckpointReader(dir / "ckpt"), HfFormat::DeepseekV3, dir / "hf");
  const CheckpointContents want = import_hf(dir / "hf", HfFormat::DeepseekV3);
  const SafetensorsHeader h = read_safetensors_header(dir / "hf/model.safetensors");
  std::map<std::string, Tensor> all;
  for (const auto& e : h.entries) all[e.name] = read_safetensors_tensor(h, e);
  std::vector<SafetensorsItem> items;
  for (const int j : {1, 2}) {
    const std::string H = "model.layers." + std::to_string(j) + ".mlp.experts.";
    std::vector<Tensor> gate_up, down;
    for (int e = 0; e < 4; ++e) {
      const std::string X = H + std::to_string(e) + ".";
      gate_up.push_back(hf_detail::cat_rows({all.at(X + "gate_proj.weight"), all.at(X + "up_proj.weight")}));
      down.push_back(all.at(X + "down_proj.weight"));
      for (const char* p : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}) all.erase(X + p);
    }
    items.push_back({H + "gate_up_proj", hf_detail::cat_rows(gate_up).view({4, 16, 32})});
    items.push_back({H + "down_proj", hf_detail::cat_rows(down).view({4, 32, 8})});
  }
  for (auto& [n, t] : all) items.push_back({n, t});
  write_hf(dir / "fused", dir / "hf/config.json", items);
  const CheckpointContents got = import_hf(dir / "fused", HfFormat::DeepseekV3);
  ASSERT_EQ(got.tensors.size(), want.tensors.size());
  for (size_t i = 0; i < got.tensors.size(); ++i)
    EXPECT_TRUE(bit_equal(got.tensors[i].tensor, want.tensors[i].tensor)) << want.tensors[i].key;
}

}  // namespace
}  // namespace mcpp::dist_checkpointing
