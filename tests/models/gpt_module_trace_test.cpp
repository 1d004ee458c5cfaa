// The module trace (core/module_trace.h, --trace-modules) of a 2-layer GPT's forward and backward: the tree of
// modules Megatron names (GPTModel > embedding, decoder > layers > self_attention > linear_qkv / core_attention /
// linear_proj, mlp > linear_fc1 / linear_fc2, output_layer, loss; the backward in reverse), each with the shapes the
// config implies and the kernel-interface ops it launched; recording is off outside a ModuleTraceRecording.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <string>
#include <vector>

#include "mcpp/core/module_trace.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "models/gpt_test_util.h"

namespace mcpp {
namespace {

std::vector<std::string> child_names(const ModuleNode& n) {
  std::vector<std::string> out;
  for (const auto& c : n.children) out.push_back(c->name);
  return out;
}

const ModuleNode& child(const ModuleNode& n, const std::string& name) {
  for (const auto& c : n.children)
    if (c->name == name) return *c;
  ADD_FAILURE() << "no child '" << name << "' under '" << n.name << "'";
  static const ModuleNode none;
  return none;
}

bool has_op(const ModuleNode& n, const std::string& op) {
  for (const auto& [name, calls] : n.ops)
    if (name == op && calls > 0) return true;
  return false;
}

std::string f32(std::initializer_list<int64_t> shape) { return fmt::format("float32[{}]", fmt::join(shape, ", ")); }

TEST(ModuleTrace, TwoLayerGptForwardAndBackward) {
  const TransformerConfig c = testing::tiny_config("gpt2");  // 2 layers, h 32, 4 heads of 8, ffn 128, V 128
  ASSERT_EQ(c.num_layers, 2);
  ModelChunk model(c, 1234, testing::single_tp());
  const int64_t s = 12, b = 3, h = c.hidden_size, heads = c.num_attention_heads, d = c.kv_channels;
  testing::Batch batch = testing::fixed_batch(s, b, c.vocab_size);
  GPTModelCtx ctx;
  ModuleTraceRecording::Trees trees;
  {
    ModuleTraceRecording rec;
    model.forward_loss(ctx, batch.tokens, batch.labels, batch.loss_mask, {.training = false});
    model.backward(ctx, 1.0f);
    trees = rec.take();
  }
  ASSERT_TRUE(trees.forward && trees.backward);
  const ModuleNode& fwd = *trees.forward;
  EXPECT_EQ(fwd.name, "GPTModel");
  EXPECT_FALSE(fwd.backward);
  EXPECT_EQ(fwd.inputs, std::vector<std::string>{fmt::format("int32[{}, {}]", s, b)});
  EXPECT_EQ(fwd.outputs, std::vector<std::string>{f32({s, b, c.padded_vocab_size})});  // the logits
  EXPECT_EQ(child_names(fwd), (std::vector<std::string>{"embedding", "decoder", "output_layer", "loss"}));
  const ModuleNode& emb = child(fwd, "embedding");
  EXPECT_EQ(emb.outputs, std::vector<std::string>{f32({s, b, h})});
  EXPECT_TRUE(has_op(emb, "embedding_fwd"));
  const ModuleNode& dec = child(fwd, "decoder");
  EXPECT_EQ(child_names(dec), (std::vector<std::string>{"decoder.layers.0", "decoder.layers.1"}));
  for (int l = 0; l < 2; ++l) {
    const std::string p = fmt::format("decoder.layers.{}", l);
    const ModuleNode& layer = child(dec, p);
    EXPECT_EQ(layer.inputs, std::vector<std::string>{f32({s, b, h})});
    EXPECT_EQ(child_names(layer), (std::vector<std::string>{"self_attention", "mlp"}));
    const ModuleNode& attn = child(layer, "self_attention");
    EXPECT_EQ(child_names(attn), (std::vector<std::string>{p + ".self_attention.linear_qkv", "core_attention",
                                                           p + ".self_attention.linear_proj"}));
    const ModuleNode& qkv = child(attn, p + ".self_attention.linear_qkv");
    EXPECT_EQ(qkv.outputs, std::vector<std::string>{f32({s, b, 3 * heads * d})});  // MHA: q, k, v of every head
    EXPECT_TRUE(has_op(qkv, "linear_fwd"));
    EXPECT_EQ(child(attn, "core_attention").outputs, std::vector<std::string>{f32({s, b, heads, d})});
    EXPECT_EQ(child(attn, p + ".self_attention.linear_proj").outputs, std::vector<std::string>{f32({s, b, h})});
    const ModuleNode& mlp = child(layer, "mlp");
    EXPECT_EQ(child_names(mlp), (std::vector<std::string>{p + ".mlp.linear_fc1", p + ".mlp.linear_fc2"}));
    const ModuleNode& fc1 = child(mlp, p + ".mlp.linear_fc1");
    EXPECT_EQ(fc1.outputs, std::vector<std::string>{f32({s, b, c.ffn_hidden_size})});
    EXPECT_TRUE(has_op(fc1, "linear_gelu_fwd"));  // GPT-2's fused bias + GELU
    EXPECT_EQ(child(mlp, p + ".mlp.linear_fc2").outputs, std::vector<std::string>{f32({s, b, h})});
  }
  EXPECT_EQ(child(fwd, "output_layer").outputs, std::vector<std::string>{f32({s, b, c.padded_vocab_size})});

  const ModuleNode& bwd = *trees.backward;  // the reverse order
  EXPECT_EQ(bwd.name, "GPTModel");
  EXPECT_TRUE(bwd.backward);
  EXPECT_EQ(child_names(bwd), (std::vector<std::string>{"loss", "output_layer", "decoder", "embedding"}));
  EXPECT_EQ(child(bwd, "loss").outputs, std::vector<std::string>{f32({s * b, c.padded_vocab_size})});  // dlogits
  const ModuleNode& dec_b = child(bwd, "decoder");
  EXPECT_EQ(child_names(dec_b), (std::vector<std::string>{"decoder.layers.1", "decoder.layers.0"}));
  const ModuleNode& layer_b = child(dec_b, "decoder.layers.1");
  EXPECT_TRUE(layer_b.backward);
  EXPECT_EQ(child_names(layer_b), (std::vector<std::string>{"mlp", "self_attention"}));
  EXPECT_EQ(child_names(child(layer_b, "self_attention")),
            (std::vector<std::string>{"decoder.layers.1.self_attention.linear_proj", "core_attention",
                                      "decoder.layers.1.self_attention.linear_qkv"}));
  EXPECT_TRUE(has_op(child(bwd, "embedding"), "embedding_bwd"));

  const std::string text = format_module_tree(fwd);
  EXPECT_NE(text.find("  decoder"), std::string::npos) << text;
  // Not recording: scopes add nothing.
  EXPECT_FALSE(module_trace_recording());
  model.forward_loss(ctx, batch.tokens, batch.labels, batch.loss_mask, {.training = false});
  ModuleTraceRecording again;
  EXPECT_FALSE(again.take().forward);
}

}  // namespace
}  // namespace mcpp
