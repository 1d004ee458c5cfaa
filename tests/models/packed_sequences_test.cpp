// Packed sequences through GPTModel (ForwardOptions::packed_seq_params; Megatron's --reset-position-ids +
// --reset-attention-mask, the SFT batches): a [s, b] batch holding several documents per sample gives the logits
// and the parameter gradients of running each document as a sample of its own ([len, 1] forwards, their
// gradients summed; per-token loss so the sums compare directly). GPT-2 style (learned positions, the fused-qkv
// flash path), unfused attention, Llama style (RoPE on per-token tables, GQA), --qk-layernorm, multi-latent
// attention (YaRN), and selective recompute of the core attention (the replay carries the documents).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "models/gpt_test_util.h"

namespace mcpp {
namespace {

struct Case {
  std::string style, impl;
  bool qk_layernorm = false, recompute = false;
};

TransformerConfig config_of(const Case& k) {
  TransformerConfig c = k.style == "mla" ? testing::mla_tiny_config("llama") : testing::tiny_config(k.style);
  c.attention_impl = k.impl;
  if (k.qk_layernorm) c.qk_layernorm = true;
  if (k.recompute) c.recompute_granularity = "selective";
  c.calculate_per_token_loss = true;  // backward of sum(loss * mask): the documents' gradients add up
  return c;
}

std::map<std::string, Tensor> grads_of(ModelChunk& m) {
  std::map<std::string, Tensor> g;
  for (const auto& p : m.params().params()) g[p->spec.key] = p->main_grad.clone();
  return g;
}

void run_case(const Case& k) {
  SCOPED_TRACE(k.style + "/" + k.impl + (k.qk_layernorm ? "/qk_layernorm" : "") + (k.recompute ? "/recompute" : ""));
  const TransformerConfig c = config_of(k);
  const int64_t s = 12, b = 2, vp = c.padded_vocab_size;
  const std::vector<std::vector<int32_t>> cu = {{0, 5, 12}, {0, 3, 4, 12}};  // (a one-token document)
  const testing::Batch batch = testing::fixed_batch(s, b, c.vocab_size);
  const PackedSeqParams packed =
      packed_seq_params_from_cu_seqlens(cu, s, {.reset_position_ids = true, .reset_attention_mask = true});

  ModelChunk whole(c, 1234, testing::single_tp());
  GPTModelCtx ctx;
  const LossResult r = whole.forward_loss(ctx, batch.tokens, batch.labels, batch.loss_mask,
                                          {.training = false, .packed_seq_params = &packed});
  const Tensor logits = ctx.logits.clone();  // [s*b, Vp]
  whole.backward(ctx, 1.0f);

  ModelChunk docs(c, 1234, testing::single_tp());
  double loss_sum = 0;
  double max_logit_diff = 0;
  for (int64_t ib = 0; ib < b; ++ib)
    for (size_t j = 0; j + 1 < cu[ib].size(); ++j) {
      const int64_t first = cu[ib][j], len = cu[ib][j + 1] - first;
      testing::Batch one{Tensor::empty({len, 1}, DType::I32), Tensor::empty({len, 1}, DType::I32),
                         Tensor::empty({len, 1})};
      for (int64_t i = 0; i < len; ++i) {
        const int64_t row = (first + i) * b + ib;
        one.tokens.data<int32_t>()[i] = batch.tokens.data<int32_t>()[row];
        one.labels.data<int32_t>()[i] = batch.labels.data<int32_t>()[row];
        one.loss_mask.data<float>()[i] = batch.loss_mask.data<float>()[row];
      }
      GPTModelCtx c1;
      loss_sum += docs.forward_loss(c1, one.tokens, one.labels, one.loss_mask, {.training = false}).loss_sum;
      for (int64_t i = 0; i < len; ++i)
        for (int64_t v = 0; v < vp; ++v)
          max_logit_diff = std::max(max_logit_diff, double(std::abs(c1.logits.data<float>()[i * vp + v] -
                                                                    logits.data<float>()[((first + i) * b + ib) * vp + v])));
      docs.backward(c1, 1.0f);
    }
  // fp32: the same sums in another grouping (GEMMs over b * s rows vs len rows, attention tiles) — rounding only.
  EXPECT_LT(max_logit_diff, 2e-5);
  EXPECT_NEAR(r.loss_sum, loss_sum, 1e-4 * std::abs(loss_sum));
  const auto ga = grads_of(whole), gb = grads_of(docs);
  for (const auto& [key, g] : ga) {
    const Tensor& h = gb.at(key);
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < g.numel(); ++i) {
      diff = std::max(diff, double(std::abs(g.data<float>()[i] - h.data<float>()[i])));
      scale = std::max(scale, double(std::abs(h.data<float>()[i])));
    }
    // fp32 sums of a few hundred terms regrouped: relative to the gradient's largest entry.
    EXPECT_LE(diff, 1e-5 * std::max(scale, 1.0)) << key;
  }
}

TEST(PackedSequences, Gpt2StyleFlashEqualsDocumentsAlone) { run_case({"gpt2", "flash"}); }
TEST(PackedSequences, Gpt2StyleUnfusedEqualsDocumentsAlone) { run_case({"gpt2", "unfused"}); }
TEST(PackedSequences, LlamaStyleFlashEqualsDocumentsAlone) { run_case({"llama", "flash"}); }
TEST(PackedSequences, LlamaStyleQkLayernormEqualsDocumentsAlone) { run_case({"llama", "flash", true}); }
TEST(PackedSequences, LlamaStyleSelectiveRecomputeEqualsDocumentsAlone) { run_case({"llama", "flash", false, true}); }
TEST(PackedSequences, MlaEqualsDocumentsAlone) { run_case({"mla", "flash"}); }

// Without the resets the packed batch is one document per sample: the documents' positions continue, so the logits
// differ from the documents alone (the test above can fail).
TEST(PackedSequences, WithoutResetsDocumentsSeeEachOther) {
  const TransformerConfig c = config_of({"llama", "flash"});
  const int64_t s = 12, b = 1;
  const testing::Batch batch = testing::fixed_batch(s, b, c.vocab_size);
  const PackedSeqParams masked_only = packed_seq_params_from_cu_seqlens({{0, 5, 12}}, s, {.reset_attention_mask = true});
  ModelChunk m(c, 1234, testing::single_tp());
  GPTModelCtx a, p;
  m.forward_loss(a, batch.tokens, batch.labels, batch.loss_mask, {.training = false});
  m.forward_loss(p, batch.tokens, batch.labels, batch.loss_mask, {.training = false, .packed_seq_params = &masked_only});
  const int64_t vp = c.padded_vocab_size;
  double first_doc = 0, second_doc = 0;  // rows 0..4 see the same keys either way; rows 5.. lose the first document
  for (int64_t i = 0; i < s * vp; ++i) {
    const double d = std::abs(a.logits.data<float>()[i] - p.logits.data<float>()[i]);
    (i / vp < 5 ? first_doc : second_doc) = std::max(i / vp < 5 ? first_doc : second_doc, d);
  }
  EXPECT_EQ(first_doc, 0.0);
  EXPECT_GT(second_doc, 1e-3);
}

}  // namespace
}  // namespace mcpp
