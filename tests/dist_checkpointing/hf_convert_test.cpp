// HF conversion: Megatron's grouped QKV row order against a hand-written example, export -> import
// round trip bit-identical for GPT-2 (MHA, LayerNorm, biases, tied) and Llama (GQA, RMSNorm, SwiGLU,
// tied and untied), Mixtral (Llama + 4 experts top-2 in every layer) and Qwen2-MoE (a MoE layer with a gated shared
// expert and a dense layer; q/k/v biases; both top-k normalizations), Qwen2 (dense, q/k/v biases), Qwen3 (q/k norms,
// head_dim != hidden / heads) and Qwen3-MoE (q/k norms, a MoE layer and a dense one), the exported GPT-2 Conv1D
// transposes checked element-wise, and configs the target format cannot express rejected with the field named.
#include "mcpp/dist_checkpointing/hf_convert.h"

#include <gtest/gtest.h>

#include "dist_checkpointing/hf_test_util.h"
#include "mcpp/core/error.h"
#include "mcpp/dist_checkpointing/hf_tensor_ops.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::dist_checkpointing {
namespace {
using namespace testing;

ModelDims gpt2_dims() {
  ModelDims d;
  d.num_layers = 2, d.hidden = 16, d.heads = d.groups = 4, d.head_dim = 4, d.ffn = 64;
  d.vocab = 100, d.padded_vocab = 128, d.max_pos = 32;
  return d;  // defaults: LayerNorm, learned_absolute, GELU, biases, tied
}

ModelDims llama_dims(bool untied) {
  ModelDims d;
  d.num_layers = 2, d.hidden = 16, d.heads = 4, d.groups = 2, d.head_dim = 4, d.ffn = 40;
  d.vocab = 130, d.padded_vocab = 256, d.max_pos = 64;
  d.normalization = "RMSNorm", d.position_embedding = "rope", d.swiglu = true;
  d.bias_linear = false, d.qkv_bias = false, d.untied = untied, d.norm_eps = 1e-6, d.rotary_base = 500000.0;
  return d;
}

ModelDims mixtral_dims() {
  ModelDims d = llama_dims(true);
  d.experts = 4, d.topk = 2, d.moe_ffn = d.ffn = 24;  // imported: the dense ffn is the experts' width
  return d;
}

ModelDims qwen2_moe_dims(bool pre_softmax) {  // layer 0 MoE (4 experts top-2 + a gated shared expert), layer 1 dense
  ModelDims d = llama_dims(true);
  d.qkv_bias = true;
  d.experts = 4, d.topk = 2, d.moe_ffn = 12, d.moe_layers = {true, false};
  d.moe_pre_softmax = pre_softmax, d.shared_ffn = 20, d.shared_gate = true;
  return d;
}

ModelDims qwen3_dims(bool moe) {  // head_dim 8 with hidden 16 / 4 heads: Qwen3's free head_dim
  ModelDims d = llama_dims(true);
  d.head_dim = 8, d.qk_norm = true;
  if (moe) d.experts = 4, d.topk = 2, d.moe_ffn = 12, d.moe_layers = {false, true}, d.moe_pre_softmax = false;
  return d;
}

// Random model with the exact key set; vocab padding rows are zero (export drops them, import pads them with zeros,
// so only then is the round trip the identity).
CheckpointContents random_model(const ModelDims& d) {
  return random_checkpoint(config_from_model_dims(d), model_param_shapes(d), d.vocab, 40, 7);
}

// An exported tensor by name (a test failure when missing).
Tensor exported(const SafetensorsHeader& h, const std::string& name) {
  for (const auto& e : h.entries)
    if (e.name == name) return read_safetensors_tensor(h, e);
  ADD_FAILURE() << "no " << name;
  return Tensor::zeros({1});
}

void expect_round_trip(const ModelDims& d, HfFormat format) {
  TempDir dir;
  CheckpointContents c = random_model(d);
  save_checkpoint(dir / "ckpt", c);
  export_hf(CheckpointReader(dir / "ckpt"), format, dir / "hf");
  SafetensorsHeader h = read_safetensors_header(dir / "hf/model.safetensors");
  EXPECT_EQ(h.metadata.at("format"), "pt");
  for (const auto& e : h.entries) EXPECT_EQ(e.dtype_str, "F32") << e.name;
  CheckpointContents back = import_hf(dir / "hf", format);
  EXPECT_EQ(back.iteration, 0);
  ModelDims bd = model_dims_from_config(back.meta["config"], "imported");
  EXPECT_EQ(config_from_model_dims(bd), config_from_model_dims(d));
  ASSERT_EQ(back.tensors.size(), c.tensors.size());
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    EXPECT_EQ(back.tensors[i].key, c.tensors[i].key);
    EXPECT_TRUE(bit_equal(back.tensors[i].tensor, c.tensors[i].tensor)) << c.tensors[i].key;
  }
  // and through the CLI path: save the import, read it back
  save_checkpoint(dir / "ckpt2", back);
  CheckpointReader r2(dir / "ckpt2");
  for (const auto& nt : c.tensors) EXPECT_TRUE(bit_equal(r2.read(nt.key), nt.tensor)) << nt.key;
}

TEST(HfConvert, GroupedQkvRowOrderMatchesMegatron) {
  // nq = 4, ng = 2, d = 1: per group [q heads of the group][k][v].
  Tensor q = Tensor::empty({4}), k = Tensor::empty({2}), v = Tensor::empty({2});
  for (int i = 0; i < 4; ++i) q.data<float>()[i] = 10.f + i;
  for (int i = 0; i < 2; ++i) k.data<float>()[i] = 20.f + i, v.data<float>()[i] = 30.f + i;
  Tensor qkv = hf_detail::merge_qkv(q, k, v, 4, 2, 1);
  const float want[] = {10, 11, 20, 30, 12, 13, 21, 31};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(qkv.data<float>()[i], want[i]) << i;
  auto [q2, k2, v2] = hf_detail::split_qkv(qkv, 4, 2, 1);
  EXPECT_TRUE(bit_equal(q2, q) && bit_equal(k2, k) && bit_equal(v2, v));
}

TEST(HfConvert, Gpt2ExportImportRoundTripIsBitIdentical) { expect_round_trip(gpt2_dims(), HfFormat::Gpt2); }
TEST(HfConvert, LlamaTiedRoundTripIsBitIdentical) { expect_round_trip(llama_dims(false), HfFormat::Llama); }
TEST(HfConvert, LlamaUntiedRoundTripIsBitIdentical) { expect_round_trip(llama_dims(true), HfFormat::Llama); }
TEST(HfConvert, MixtralRoundTripIsBitIdentical) { expect_round_trip(mixtral_dims(), HfFormat::Mixtral); }
TEST(HfConvert, Qwen2MoeRoundTripIsBitIdentical) {
  expect_round_trip(qwen2_moe_dims(true), HfFormat::Qwen2Moe);   // norm_topk_prob false
  expect_round_trip(qwen2_moe_dims(false), HfFormat::Qwen2Moe);  // norm_topk_prob true
}

TEST(HfConvert, Qwen3RoundTripIsBitIdentical) {
  expect_round_trip(qwen3_dims(false), HfFormat::Qwen3);
  ModelDims tied = qwen3_dims(false);  // the small Qwen3 models tie the embeddings
  tied.untied = false;
  expect_round_trip(tied, HfFormat::Qwen3);
  expect_round_trip(qwen3_dims(true), HfFormat::Qwen3Moe);  // norm_topk_prob true
  ModelDims pre = qwen3_dims(true);
  pre.moe_pre_softmax = true;  // norm_topk_prob false
  expect_round_trip(pre, HfFormat::Qwen3Moe);
}

// Qwen2 / Qwen2.5 (dense, q/k/v biases): the round trip, the biases split from linear_qkv's, the config; a model
// without q/k/v biases exports zeros; a MoE model and a head_dim off hidden / heads are named.
TEST(HfConvert, Qwen2DenseRoundTripLayoutAndRejections) {
  ModelDims d = llama_dims(true);
  d.qkv_bias = true;
  expect_round_trip(d, HfFormat::Qwen2);
  d.untied = false;
  expect_round_trip(d, HfFormat::Qwen2);
  TempDir dir;
  save_checkpoint(dir / "ck", random_model(d));
  export_hf(CheckpointReader(dir / "ck"), HfFormat::Qwen2, dir / "hf");
  CheckpointReader r(dir / "ck");
  SafetensorsHeader h = read_safetensors_header(dir / "hf/model.safetensors");
  auto [qb, kb, vb] = hf_detail::split_qkv(r.read("decoder.layers.1.self_attention.linear_qkv.bias"), 4, 2, 4);
  EXPECT_TRUE(bit_equal(exported(h, "model.layers.1.self_attn.q_proj.bias"), qb));
  EXPECT_TRUE(bit_equal(exported(h, "model.layers.1.self_attn.v_proj.bias"), vb));
  const auto cfg = nlohmann::json::parse(read_text(dir / "hf/config.json"));
  EXPECT_EQ(cfg["model_type"], "qwen2");
  EXPECT_EQ(cfg["architectures"], nlohmann::json::array({"Qwen2ForCausalLM"}));
  EXPECT_FALSE(cfg.contains("head_dim"));
  EXPECT_EQ(cfg["use_sliding_window"], false);
  ModelDims nb = d;
  nb.qkv_bias = false;
  save_checkpoint(dir / "nb", random_model(nb));
  export_hf(CheckpointReader(dir / "nb"), HfFormat::Qwen2, dir / "hf_nb");
  for (const auto& t : import_hf(dir / "hf_nb", HfFormat::Qwen2).tensors)
    if (t.key.find("linear_qkv.bias") != std::string::npos) {
      EXPECT_EQ(ops::sum_of_squares(t.tensor), 0.0) << t.key;
    }
  save_checkpoint(dir / "moe", random_model(mixtral_dims()));
  expect_error([&] { export_hf(CheckpointReader(dir / "moe"), HfFormat::Qwen2, dir / "o"); },
               {"hf-qwen2", "model.num_moe_experts", "Qwen2ForCausalLM"});
  ModelDims wide = d;
  wide.head_dim = 8;
  save_checkpoint(dir / "wide", random_model(wide));
  expect_error([&] { export_hf(CheckpointReader(dir / "wide"), HfFormat::Qwen2, dir / "o"); },
               {"hf-qwen2", "model.kv_channels"});
  expect_error([&] { import_hf(dir / "hf", HfFormat::Qwen3); }, {"model_type", "qwen3"});
}

// The exported Qwen3 / Qwen3-MoE layouts: q_norm / k_norm from the q/k layernorms, head_dim written, the experts as
// Qwen2-MoE's without a shared expert; what the formats cannot express is named (q/k norms missing, or present for
// the formats without them; q/k/v biases; a shared expert; a MoE model as hf-qwen3, a dense one as hf-qwen3-moe;
// attention_bias and sliding windows on import).
TEST(HfConvert, Qwen3ExportLayoutAndRejections) {
  TempDir dir;
  for (const bool moe : {false, true}) {
    const ModelDims d = qwen3_dims(moe);
    const std::string ck = moe ? "ck_moe" : "ck", out = moe ? "hf_moe" : "hf";
    save_checkpoint(dir / ck, random_model(d));
    export_hf(CheckpointReader(dir / ck), moe ? HfFormat::Qwen3Moe : HfFormat::Qwen3, dir / out);
    CheckpointReader r(dir / ck);
    SafetensorsHeader h = read_safetensors_header(dir / (out + "/model.safetensors"));
    auto hf = [&](const std::string& name) { return exported(h, name); };
    EXPECT_TRUE(bit_equal(hf("model.layers.1.self_attn.q_norm.weight"),
                          r.read("decoder.layers.1.self_attention.q_layernorm.weight")));
    EXPECT_TRUE(bit_equal(hf("model.layers.0.self_attn.k_norm.weight"),
                          r.read("decoder.layers.0.self_attention.k_layernorm.weight")));
    EXPECT_EQ(hf("model.layers.0.self_attn.q_proj.weight").shape(), (Shape{32, 16}));  // 4 heads x 8
    const auto cfg = nlohmann::json::parse(read_text(dir / (out + "/config.json")));
    EXPECT_EQ(cfg["model_type"], moe ? "qwen3_moe" : "qwen3");
    EXPECT_EQ(cfg["head_dim"], 8);
    EXPECT_EQ(cfg["attention_bias"], false);
    EXPECT_FALSE(cfg.contains("shared_expert_intermediate_size"));
    if (!moe) continue;
    const Tensor fc1 = r.read("decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight");  // [24, 16]
    EXPECT_TRUE(bit_equal(hf("model.layers.1.mlp.experts.3.gate_proj.weight"), hf_detail::slice_rows(fc1, 0, 12)));
    EXPECT_TRUE(bit_equal(hf("model.layers.0.mlp.up_proj.weight"),
                          hf_detail::slice_rows(r.read("decoder.layers.0.mlp.linear_fc1.weight"), 40, 40)));
    EXPECT_EQ(cfg["mlp_only_layers"], nlohmann::json::array({0}));
    EXPECT_EQ(cfg["norm_topk_prob"], true);
    EXPECT_EQ(cfg["moe_intermediate_size"], 12);
  }
  int bad_index = 0;
  auto rejected = [&](const ModelDims& d, HfFormat f, std::initializer_list<std::string> words) {
    const std::string name = fmt::format("bad{}", bad_index++);
    save_checkpoint(dir / name, random_model(d));
    expect_error([&] { export_hf(CheckpointReader(dir / name), f, dir / "o"); }, words);
  };
  rejected(llama_dims(true), HfFormat::Qwen3, {"hf-qwen3", "model.qk_layernorm", "q_norm"});
  rejected(qwen3_dims(false), HfFormat::Llama, {"hf-llama", "model.qk_layernorm", "hf-qwen3"});
  rejected(qwen3_dims(true), HfFormat::Qwen3, {"hf-qwen3", "model.num_moe_experts", "Qwen3ForCausalLM"});
  rejected(qwen3_dims(false), HfFormat::Qwen3Moe, {"hf-qwen3-moe", "model.num_moe_experts"});
  ModelDims biased = qwen3_dims(false);
  biased.qkv_bias = true;
  rejected(biased, HfFormat::Qwen3, {"hf-qwen3", "model.add_qkv_bias"});
  ModelDims shared = qwen3_dims(true);
  shared.shared_ffn = 8;
  rejected(shared, HfFormat::Qwen3Moe, {"hf-qwen3-moe", "model.moe_shared_expert_intermediate_size"});
  ModelDims gpt2_qk = gpt2_dims();
  gpt2_qk.qk_norm = true;
  rejected(gpt2_qk, HfFormat::Gpt2, {"hf-gpt2", "model.qk_layernorm"});
  auto j = nlohmann::json::parse(read_text(dir / "hf/config.json"));
  for (const auto& [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"attention_bias", true},
           {"use_sliding_window", true},
           {"layer_types", {"full_attention", "sliding_attention"}}}) {
    auto bad = j;
    bad[field] = value;
    write_text(dir / "hf/config.json", bad.dump());
    expect_error([&] { import_hf(dir / "hf", HfFormat::Qwen3); }, {std::string(field)});
  }
  write_text(dir / "hf/config.json", j.dump());
  expect_error([&] { import_hf(dir / "hf", HfFormat::Qwen3Moe); }, {"model_type", "qwen3_moe"});
  // transformers 5 writes Qwen3-MoE's expert count as num_local_experts; both names, or two different counts
  auto jm = nlohmann::json::parse(read_text(dir / "hf_moe/config.json"));
  jm["num_local_experts"] = jm["num_experts"];
  jm.erase("num_experts");
  write_text(dir / "hf_moe/config.json", jm.dump());
  EXPECT_EQ(import_hf(dir / "hf_moe", HfFormat::Qwen3Moe).tensors.size(), model_param_shapes(qwen3_dims(true)).size());
  jm["num_experts"] = 8;
  write_text(dir / "hf_moe/config.json", jm.dump());
  expect_error([&] { import_hf(dir / "hf_moe", HfFormat::Qwen3Moe); }, {"num_experts", "num_local_experts", "differ"});
  expect_error([&] { import_hf(dir / "hf", HfFormat::Llama); }, {"model_type", "llama"});
}

// The exported Qwen2-MoE layout: q/k/v biases split from linear_qkv's, the MoE layer's gate / experts / gated shared
// expert, the dense layer's MLP, and the config's layer pattern and top-k normalization; a model without q/k/v
// biases exports zero biases; a shared expert without its gate (or none) is named.
TEST(HfConvert, Qwen2MoeExportLayout) {
  TempDir dir;
  const ModelDims d = qwen2_moe_dims(true);
  save_checkpoint(dir / "ck", random_model(d));
  export_hf(CheckpointReader(dir / "ck"), HfFormat::Qwen2Moe, dir / "hf");
  CheckpointReader r(dir / "ck");
  SafetensorsHeader h = read_safetensors_header(dir / "hf/model.safetensors");
  auto hf = [&](const std::string& name) { return exported(h, name); };
  auto [qb, kb, vb] = hf_detail::split_qkv(r.read("decoder.layers.0.self_attention.linear_qkv.bias"), 4, 2, 4);
  EXPECT_TRUE(bit_equal(hf("model.layers.0.self_attn.k_proj.bias"), kb));
  EXPECT_TRUE(bit_equal(hf("model.layers.0.mlp.gate.weight"), r.read("decoder.layers.0.mlp.router.weight")));
  const Tensor fc1 = r.read("decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight");  // [24, 16]
  EXPECT_TRUE(bit_equal(hf("model.layers.0.mlp.experts.2.up_proj.weight"), hf_detail::slice_rows(fc1, 12, 12)));
  EXPECT_TRUE(bit_equal(hf("model.layers.0.mlp.shared_expert_gate.weight"),
                        r.read("decoder.layers.0.mlp.shared_experts.gate_weight")));
  EXPECT_TRUE(bit_equal(hf("model.layers.0.mlp.shared_expert.down_proj.weight"),
                        r.read("decoder.layers.0.mlp.shared_experts.linear_fc2.weight")));
  EXPECT_TRUE(bit_equal(hf("model.layers.1.mlp.down_proj.weight"), r.read("decoder.layers.1.mlp.linear_fc2.weight")));
  const auto cfg = nlohmann::json::parse(read_text(dir / "hf/config.json"));
  EXPECT_EQ(cfg["model_type"], "qwen2_moe");
  EXPECT_EQ(cfg["mlp_only_layers"], nlohmann::json::array({1}));
  EXPECT_EQ(cfg["norm_topk_prob"], false);
  EXPECT_EQ(cfg["intermediate_size"], 40);
  EXPECT_EQ(cfg["moe_intermediate_size"], 12);
  EXPECT_EQ(cfg["shared_expert_intermediate_size"], 20);
  ModelDims no_bias = d;  // zero q/k/v biases: the same function
  no_bias.qkv_bias = false;
  save_checkpoint(dir / "nb", random_model(no_bias));
  export_hf(CheckpointReader(dir / "nb"), HfFormat::Qwen2Moe, dir / "hf_nb");
  const CheckpointContents back = import_hf(dir / "hf_nb", HfFormat::Qwen2Moe);
  for (const auto& t : back.tensors)
    if (t.key.find("linear_qkv.bias") != std::string::npos) {
      EXPECT_EQ(ops::sum_of_squares(t.tensor), 0.0) << t.key;
    }
  for (const bool has_shared : {true, false}) {  // a shared expert without its gate, or none at all
    ModelDims bad = d;
    bad.shared_gate = false;
    if (!has_shared) bad.shared_ffn = 0;
    const std::string name = has_shared ? "ungated" : "none";
    save_checkpoint(dir / name, random_model(bad));
    expect_error([&] { export_hf(CheckpointReader(dir / name), HfFormat::Qwen2Moe, dir / "o"); },
                 {"hf-qwen2-moe", "model.moe_shared_expert_gate", "a gated shared expert"});
  }
}

// transformers 5's own MoE layout (checkpoints saved natively in 5): the router at mlp.gate and the experts fused into
// mlp.experts.gate_up_proj [E, 2F, h] / down_proj [E, h, F]. Built here from our export (the per-expert tensors
// stacked), it imports to the same checkpoint for Mixtral (block_sparse_moe renamed mlp), Qwen2-MoE (beside its shared
// expert) and Qwen3-MoE; a fused tensor of the wrong shape is named.
TEST(HfConvert, ImportsTransformers5FusedExperts) {
  for (const HfFormat f : {HfFormat::Mixtral, HfFormat::Qwen2Moe, HfFormat::Qwen3Moe}) {
    SCOPED_TRACE(hf_format_name(f));
    const ModelDims d = f == HfFormat::Mixtral ? mixtral_dims() : f == HfFormat::Qwen2Moe ? qwen2_moe_dims(false)
                                                                                          : qwen3_dims(true);
    TempDir dir;
    const CheckpointContents c = random_model(d);
    save_checkpoint(dir / "ck", c);
    export_hf(CheckpointReader(dir / "ck"), f, dir / "hf");
    const SafetensorsHeader h = read_safetensors_header(dir / "hf/model.safetensors");
    CheckpointReader r(dir / "ck");
    std::vector<SafetensorsItem> items;
    for (const auto& e : h.entries) {  // everything but the per-expert tensors and the MoE layers' routers
      const bool expert = e.name.find(".experts.") != std::string::npos;
      const bool router = e.name.ends_with("block_sparse_moe.gate.weight") || e.name.ends_with("mlp.gate.weight");
      if (!expert && !router) items.push_back({e.name, read_safetensors_tensor(h, e)});
    }
    for (int64_t i = 0; i < d.num_layers; ++i) {
      if (!d.is_moe_layer(i)) continue;
      const std::string L = fmt::format("decoder.layers.{}.mlp.", i), H = fmt::format("model.layers.{}.mlp.", i);
      std::vector<Tensor> fc1, fc2;
      for (int64_t e = 0; e < d.experts; ++e) {
        fc1.push_back(r.read(fmt::format("{}experts.local_experts.{}.linear_fc1.weight", L, e)));
        fc2.push_back(r.read(fmt::format("{}experts.local_experts.{}.linear_fc2.weight", L, e)));
      }
      items.push_back({H + "gate.weight", r.read(L + "router.weight")});
      items.push_back({H + "experts.gate_up_proj", hf_detail::cat_rows(fc1).view({d.experts, 2 * d.moe_ffn, 16})});
      items.push_back({H + "experts.down_proj", hf_detail::cat_rows(fc2).view({d.experts, 16, d.moe_ffn})});
    }
    std::filesystem::create_directories(dir / "fused");
    write_safetensors(dir / "fused/model.safetensors", items, {{"format", "pt"}}, false);
    write_text(dir / "fused/config.json", read_text(dir / "hf/config.json"));
    const CheckpointContents back = import_hf(dir / "fused", f);
    ASSERT_EQ(back.tensors.size(), c.tensors.size());
    for (size_t i = 0; i < c.tensors.size(); ++i) {
      EXPECT_EQ(back.tensors[i].key, c.tensors[i].key);
      EXPECT_TRUE(bit_equal(back.tensors[i].tensor, c.tensors[i].tensor)) << c.tensors[i].key;
    }
    for (auto& it : items)  // a down_proj of the wrong width
      if (it.name.ends_with("experts.down_proj")) it.tensor = Tensor::zeros({d.experts, 16, d.moe_ffn + 1});
    write_safetensors(dir / "fused/model.safetensors", items, {{"format", "pt"}}, false);
    expect_error([&] { import_hf(dir / "fused", f); }, {"experts.down_proj", "shape"});
  }
}

// The exported Mixtral layout element-wise: the router as block_sparse_moe.gate, each expert's fc1 rows split into
// w1 (gate) and w3 (up), fc2 as w2; the config names the experts and their width.
TEST(HfConvert, MixtralExportLayout) {
  TempDir dir;
  const ModelDims d = mixtral_dims();
  CheckpointContents c = random_model(d);
  save_checkpoint(dir / "ck", c);
  export_hf(CheckpointReader(dir / "ck"), HfFormat::Mixtral, dir / "hf");
  CheckpointReader r(dir / "ck");
  SafetensorsHeader h = read_safetensors_header(dir / "hf/model.safetensors");
  auto hf = [&](const std::string& name) { return exported(h, name); };
  const std::string H = "model.layers.1.block_sparse_moe.", L = "decoder.layers.1.mlp.";
  EXPECT_TRUE(bit_equal(hf(H + "gate.weight"), r.read(L + "router.weight")));
  const Tensor fc1 = r.read(L + "experts.local_experts.3.linear_fc1.weight");  // [48, 16]
  EXPECT_TRUE(bit_equal(hf(H + "experts.3.w1.weight"), hf_detail::slice_rows(fc1, 0, 24)));
  EXPECT_TRUE(bit_equal(hf(H + "experts.3.w3.weight"), hf_detail::slice_rows(fc1, 24, 24)));
  EXPECT_TRUE(bit_equal(hf(H + "experts.3.w2.weight"), r.read(L + "experts.local_experts.3.linear_fc2.weight")));
  const auto cfg = nlohmann::json::parse(read_text(dir / "hf/config.json"));
  EXPECT_EQ(cfg["model_type"], "mixtral");
  EXPECT_EQ(cfg["num_local_experts"], 4);
  EXPECT_EQ(cfg["num_experts_per_tok"], 2);
  EXPECT_EQ(cfg["intermediate_size"], 24);
  EXPECT_TRUE(cfg["sliding_window"].is_null());
}

// What MixtralForCausalLM cannot express is named: a dense model, routing beyond Mixtral's; a MoE model as hf-llama;
// a sliding window on import.
TEST(HfConvert, MixtralRejectsWhatItCannotExpress) {
  TempDir dir;
  save_checkpoint(dir / "dense", random_model(llama_dims(true)));
  expect_error([&] { export_hf(CheckpointReader(dir / "dense"), HfFormat::Mixtral, dir / "o"); },
               {"hf-mixtral", "model.num_moe_experts"});
  save_checkpoint(dir / "moe", random_model(mixtral_dims()));
  expect_error([&] { export_hf(CheckpointReader(dir / "moe"), HfFormat::Llama, dir / "o"); },
               {"hf-llama", "model.num_moe_experts", "hf-mixtral"});
  for (const auto& [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"moe_router_pre_softmax", true}, {"moe_shared_expert_intermediate_size", 8},
           {"moe_expert_capacity_factor", 1.0}, {"moe_layer_freq", "[1,0]"}, {"moe_router_score_function", "sigmoid"},
           {"moe_router_topk_scaling_factor", 2.5}, {"moe_router_enable_expert_bias", true}}) {
    CheckpointContents c = random_model(mixtral_dims());
    c.meta["config"]["model"][field] = value;
    const std::string name = "moe_" + field;
    save_checkpoint(dir / name, c);
    expect_error([&] { export_hf(CheckpointReader(dir / name), HfFormat::Mixtral, dir / "o"); },
                 {"hf-mixtral", "model." + field});
  }
  export_hf(CheckpointReader(dir / "moe"), HfFormat::Mixtral, dir / "hf");
  auto j = nlohmann::json::parse(read_text(dir / "hf/config.json"));
  j["sliding_window"] = 16;  // below max_position_embeddings 64
  write_text(dir / "hf/config.json", j.dump());
  expect_error([&] { import_hf(dir / "hf", HfFormat::Mixtral); }, {"sliding_window", "16"});
  j["sliding_window"] = 64;  // covers every position: full causal attention
  j["num_experts_per_tok"] = 5;
  write_text(dir / "hf/config.json", j.dump());
  expect_error([&] { import_hf(dir / "hf", HfFormat::Mixtral); }, {"num_experts_per_tok", "num_local_experts"});
  j["num_experts_per_tok"] = 2;
  write_text(dir / "hf/config.json", j.dump());
  EXPECT_EQ(import_hf(dir / "hf", HfFormat::Mixtral).tensors.size(), model_param_shapes(mixtral_dims()).size());
  expect_error([&] { import_hf(dir / "hf", HfFormat::Llama); }, {"model_type", "llama"});
}

TEST(HfConvert, Gpt2ExportLayoutElementwise) {
  TempDir dir;
  ModelDims d = gpt2_dims();
  CheckpointContents c = random_model(d);
  save_checkpoint(dir / "ckpt", c);
  export_hf(CheckpointReader(dir / "ckpt"), HfFormat::Gpt2, dir / "hf");
  SafetensorsHeader h = read_safetensors_header(dir / "hf/model.safetensors");
  auto hf = [&](const std::string& n) { return read_safetensors_tensor(h, *h.find(n)); };
  auto ours = [&](const std::string& k) {
    for (const auto& nt : c.tensors)
      if (nt.key == k) return nt.tensor;
    throw Error("no " + k);
  };
  const int64_t H = d.hidden, D = d.head_dim;
  // c_attn.weight[i, part*h + head*d + j] = qkv[head*3d + part*d + j, i] (MHA: one head per group)
  Tensor cattn = hf("transformer.h.1.attn.c_attn.weight"), qkv = ours("decoder.layers.1.self_attention.linear_qkv.weight");
  ASSERT_EQ(cattn.shape(), (Shape{H, 3 * H}));
  for (int64_t i = 0; i < H; ++i)
    for (int64_t part = 0; part < 3; ++part)
      for (int64_t head = 0; head < d.heads; ++head)
        for (int64_t j = 0; j < D; ++j)
          ASSERT_EQ(cattn.data<float>()[i * 3 * H + part * H + head * D + j],
                    qkv.data<float>()[(head * 3 * D + part * D + j) * H + i]);
  Tensor fc = hf("transformer.h.0.mlp.c_fc.weight"), fc1 = ours("decoder.layers.0.mlp.linear_fc1.weight");
  ASSERT_EQ(fc.shape(), (Shape{H, d.ffn}));
  for (int64_t i = 0; i < H; ++i)
    for (int64_t o = 0; o < d.ffn; ++o) ASSERT_EQ(fc.data<float>()[i * d.ffn + o], fc1.data<float>()[o * H + i]);
  EXPECT_EQ(hf("transformer.wte.weight").shape(), (Shape{d.vocab, H}));
  EXPECT_EQ(h.find("lm_head.weight"), nullptr) << "tied: HF ties lm_head to wte";
  auto cfg = nlohmann::json::parse(read_text(dir / "hf/config.json"));
  EXPECT_EQ(cfg["n_inner"], d.ffn);
  EXPECT_EQ(cfg["activation_function"], "gelu_new") << "mcpp's GELU is the tanh form";
  EXPECT_TRUE(cfg["eos_token_id"].is_null()) << "vocab 100 has no GPT-2 end-of-document token";
}

TEST(HfConvert, ExportRejectsConfigsTheFormatCannotExpress) {
  TempDir dir;
  save_checkpoint(dir / "llama", random_model(llama_dims(false)));
  expect_error([&] { export_hf(CheckpointReader(dir / "llama"), HfFormat::Gpt2, dir / "o"); },
               {"hf-gpt2", "model.normalization", "RMSNorm"});
  save_checkpoint(dir / "gpt2", random_model(gpt2_dims()));
  expect_error([&] { export_hf(CheckpointReader(dir / "gpt2"), HfFormat::Llama, dir / "o"); },
               {"hf-llama", "model.normalization", "LayerNorm"});
  ModelDims gqa = gpt2_dims();
  gqa.groups = 2;
  save_checkpoint(dir / "gqa", random_model(gqa));
  expect_error([&] { export_hf(CheckpointReader(dir / "gqa"), HfFormat::Gpt2, dir / "o"); },
               {"model.num_query_groups"});
  CheckpointContents no_cfg;
  save_checkpoint(dir / "nocfg", no_cfg);
  expect_error([&] { export_hf(CheckpointReader(dir / "nocfg"), HfFormat::Gpt2, dir / "o"); }, {"config"});
  expect_error([&] { parse_hf_format("hf-bert"); }, {"--format", "hf-bert"});
  for (HfFormat f : {HfFormat::Gpt2, HfFormat::Llama, HfFormat::Mixtral, HfFormat::Qwen2Moe, HfFormat::Qwen3,
                     HfFormat::Qwen3Moe, HfFormat::Qwen2})
    EXPECT_EQ(parse_hf_format(hf_format_name(f)), f) << hf_format_name(f);
  EXPECT_EQ(std::string(hf_format_name(HfFormat::Qwen2Moe)), "hf-qwen2-moe");
}

TEST(HfConvert, ExportChecksTensorShapesAgainstConfig) {
  TempDir dir;
  ModelDims d = gpt2_dims();
  CheckpointContents c = random_model(d);
  d.ffn = 32;  // config now disagrees with the fc1/fc2 tensors
  c.meta["config"] = config_from_model_dims(d);
  save_checkpoint(dir / "ck", c);
  expect_error([&] { export_hf(CheckpointReader(dir / "ck"), HfFormat::Gpt2, dir / "o"); },
               {"decoder.layers.0.mlp.linear_fc1.weight", "(64, 16)", "(32, 16)"});
}

// RoPE's base as transformers 4 (rope_theta) or 5 (rope_parameters) writes it; other RoPE types and two different
// bases are named errors.
TEST(HfConvert, LlamaRopeBaseFromEitherTransformersConfig) {
  TempDir dir;
  save_checkpoint(dir / "ck", random_model(llama_dims(true)));  // rotary_base 500000
  export_hf(CheckpointReader(dir / "ck"), HfFormat::Llama, dir / "hf");
  auto j = nlohmann::json::parse(read_text(dir / "hf/config.json"));
  EXPECT_EQ(j["rope_theta"], 500000.0);
  EXPECT_EQ(j["rope_parameters"]["rope_theta"], 500000.0);
  auto base = [&] {
    return model_dims_from_config(import_hf(dir / "hf", HfFormat::Llama).meta["config"], "imported").rotary_base;
  };
  j.erase("rope_theta");  // transformers 5: rope_parameters only
  j["rope_parameters"]["rope_theta"] = 1e6;
  write_text(dir / "hf/config.json", j.dump());
  EXPECT_EQ(base(), 1e6);
  j.erase("rope_parameters");  // transformers 4: rope_theta only
  j["rope_theta"] = 250000.0;
  write_text(dir / "hf/config.json", j.dump());
  EXPECT_EQ(base(), 250000.0);
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  write_text(dir / "hf/config.json", j.dump());
  expect_error([&] { base(); }, {"rope_theta", "rope_parameters.rope_theta", "differ"});
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 250000.0}, {"factor", 4.0}};
  write_text(dir / "hf/config.json", j.dump());
  expect_error([&] { base(); }, {"rope_parameters.rope_type", "yarn"});
}

// Llama 3's RoPE scaling (use_rope_scaling): exported as rope_type "llama3" in both transformers configs, imported from
// either (transformers 4's older "type" spelling too); values other than Megatron's fixed ones, and the two configs
// disagreeing, are named errors.
TEST(HfConvert, LlamaRopeScalingBothWays) {
  TempDir dir;
  ModelDims d = llama_dims(true);
  d.rope_scaling_factor = 32.0;
  CheckpointContents c = random_model(d);
  c.meta["config"] = config_from_model_dims(d);
  EXPECT_EQ(c.meta["config"]["model"]["use_rope_scaling"], true);
  save_checkpoint(dir / "ck", c);
  export_hf(CheckpointReader(dir / "ck"), HfFormat::Llama, dir / "hf");
  auto j = nlohmann::json::parse(read_text(dir / "hf/config.json"));
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(j["rope_scaling"]["factor"], 32.0);
  EXPECT_EQ(j["rope_scaling"]["original_max_position_embeddings"], 8192);
  EXPECT_EQ(j["rope_parameters"]["rope_type"], "llama3");
  EXPECT_EQ(j["rope_parameters"]["rope_theta"], 500000.0);
  auto factor = [&] {
    const nlohmann::json m = import_hf(dir / "hf", HfFormat::Llama).meta["config"];
    EXPECT_EQ(m["model"]["use_rope_scaling"], model_dims_from_config(m, "imported").rope_scaling_factor > 0.0);
    return model_dims_from_config(m, "imported").rope_scaling_factor;
  };
  EXPECT_EQ(factor(), 32.0);
  j.erase("rope_parameters");  // transformers 4, its older spelling
  j["rope_scaling"] = {{"type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  write_text(dir / "hf/config.json", j.dump());
  EXPECT_EQ(factor(), 8.0);
  j["rope_scaling"]["high_freq_factor"] = 2.0;
  write_text(dir / "hf/config.json", j.dump());
  expect_error([&] { factor(); }, {"rope_scaling.high_freq_factor", "uses 4"});
  j["rope_scaling"]["high_freq_factor"] = 4.0;
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 16.0}, {"rope_theta", 500000.0}};
  write_text(dir / "hf/config.json", j.dump());
  expect_error([&] { factor(); }, {"rope_scaling", "rope_parameters", "different RoPE scalings"});
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 0.5}, {"rope_theta", 500000.0}};
  write_text(dir / "hf/config.json", j.dump());
  expect_error([&] { factor(); }, {"rope_parameters.factor", ">= 1"});
  // position interpolation (rope_type "linear"): rotary_seq_len_interpolation_factor both ways
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 500000.0}};
  write_text(dir / "hf/config.json", j.dump());
  EXPECT_EQ(factor(), 0.0);
  const nlohmann::json lin = import_hf(dir / "hf", HfFormat::Llama).meta["config"];
  EXPECT_EQ(lin["model"]["rotary_seq_len_interpolation_factor"], 4.0);
  ModelDims dl = llama_dims(true);
  dl.rope_interpolation_factor = 4.0;
  CheckpointContents cl = random_model(dl);
  cl.meta["config"] = config_from_model_dims(dl);
  save_checkpoint(dir / "ck_linear", cl);
  export_hf(CheckpointReader(dir / "ck_linear"), HfFormat::Llama, dir / "hf_linear");
  const auto jl = nlohmann::json::parse(read_text(dir / "hf_linear/config.json"));
  EXPECT_EQ(jl["rope_scaling"], (nlohmann::json{{"rope_type", "linear"}, {"factor", 4.0}}));
  EXPECT_EQ(jl["rope_parameters"]["rope_type"], "linear");
  dl.rope_scaling_factor = 8.0;  // both: one HF rope type only
  cl.meta["config"] = config_from_model_dims(dl);
  save_checkpoint(dir / "ck_both", cl);
  expect_error([&] { export_hf(CheckpointReader(dir / "ck_both"), HfFormat::Llama, dir / "hf_both"); },
               {"use_rope_scaling", "rotary_seq_len_interpolation_factor", "one RoPE type"});
}

TEST(HfConvert, ImportErrorsNameFieldAndTensor) {
  TempDir dir;
  save_checkpoint(dir / "ck", random_model(gpt2_dims()));
  export_hf(CheckpointReader(dir / "ck"), HfFormat::Gpt2, dir / "hf");
  expect_error([&] { import_hf(dir / "hf", HfFormat::Llama); }, {"config.json", "model_type", "llama"});
  std::string cfg = read_text(dir / "hf/config.json");
  auto j = nlohmann::json::parse(cfg);
  j["activation_function"] = "gelu";
  write_text(dir / "hf/config.json", j.dump());
  expect_error([&] { import_hf(dir / "hf", HfFormat::Gpt2); }, {"activation_function", "gelu"});
  j["activation_function"] = "gelu_new";
  j["n_inner"] = 48;
  write_text(dir / "hf/config.json", j.dump());
  expect_error([&] { import_hf(dir / "hf", HfFormat::Gpt2); }, {"transformer.h.0.mlp.c_fc.weight", "(16, 48)"});
  expect_error([&] { import_hf(dir / "nothing", HfFormat::Gpt2); }, {"config.json"});
}

}  // namespace
}  // namespace mcpp::dist_checkpointing
