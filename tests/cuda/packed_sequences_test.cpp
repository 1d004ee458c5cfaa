// Packed sequences on CUDA (document masking, AttentionOptions::doc_start; per-token RoPE tables): against the CPU
// backend, itself checked equal to running each document alone (tests/kernels/attention_doc_mask_test.cpp,
// tests/models/packed_sequences_test.cpp).
//   1. flash_attention_{fwd,bwd} (split and fused-qkv forms) with doc_start, fp32 and bf16, head dims 64 (bf16:
//      would be cuDNN / tensor-core without documents — the dispatch sends document calls to the CUDA-core
//      kernels) and 40, s = 200 over several tiles, GQA.
//   2. The whole GPT (GPT-2 style: learned positions restarting per document, fused-qkv attention; Llama style:
//      RoPE on per-token tables, GQA) on a packed batch, fp32: loss, logits and every main grad vs the CPU model.
#include "cuda/cuda_test_util.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/transformer/packed_seq_params.h"
#include "models/gpt_test_util.h"

namespace mcpp::cuda_test {
namespace {

const std::vector<std::vector<int32_t>> kDocs200 = {{0, 70, 130, 200}, {0, 1, 150, 200}};

void check_attention(DType dt, int64_t d) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " d=" << d);
  const int64_t s = 200, b = 2, nq = 4, ng = 2;
  const Shape qs{s, b, nq, d}, ks{s, b, ng, d}, ls{b, nq, s};
  const Tensor doc = packed_seq_params_from_cu_seqlens(kDocs200, s, {.reset_attention_mask = true}).doc_start;
  ops::AttentionOptions cpu_opt{.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d)), .causal = true,
                                .doc_start = doc};
  ops::AttentionOptions opt = cpu_opt;
  opt.doc_start = doc.to(Device::CUDA);
  // The split form (document calls run the CUDA-core kernels).
  const FlashAttentionCase r = check_flash_attention(qs, ks, dt, opt, cpu_opt);

  // The fused-qkv form: qkv [s, b, ng * (nq/ng + 2) * d] built from q, k, v by qkv_merge.
  Tensor qkv = Tensor::empty({s, b, ng * (nq / ng + 2) * d});
  ops::cpu::qkv_merge(qkv, r.q, r.k, r.v, {});
  Tensor o2 = poisoned(qs, dt), lse2 = poisoned(ls, DType::F32);
  ops::flash_attention_fwd_qkv(o2, lse2, dev(qkv, dt), ng, opt);
  EXPECT_REL(host(o2), r.o_ref, tol(dt, 2e-5));
  Tensor dqkv = poisoned(qkv.shape(), dt), dqkv_ref = Tensor::empty(qkv.shape());
  ops::cpu::qkv_merge(dqkv_ref, r.dq_ref, r.dk_ref, r.dv_ref, {});
  ops::flash_attention_bwd_qkv(dqkv, dev(r.dout, dt), dev(qkv, dt), dev(r.o_in, dt), dev(r.lse_ref), ng, opt);
  EXPECT_REL(host(dqkv), dqkv_ref, tol(dt, 5e-5));
}

TEST(CudaPackedSequences, AttentionDocMaskMatchesCpu) {
  MCPP_REQUIRE_CUDA();
  for (DType dt : float_dtypes())
    for (int64_t d : {64, 40}) check_attention(dt, d);
}

struct PackedRun {
  double loss_sum = 0;
  Tensor logits;
  std::vector<Tensor> grads;
  std::vector<std::string> keys;
};

PackedRun run_packed(const TransformerConfig& c, Device device) {
  ModelChunk model(c, 1234, testing::single_tp(), device);
  const int64_t s = 48, b = 3;
  const testing::Batch batch = testing::fixed_batch(s, b, c.vocab_size);
  const PackedSeqParams packed = packed_seq_params_from_cu_seqlens(
      {{0, 20, 48}, {0, 1, 17, 40, 48}, {0, 48}}, s, {.reset_position_ids = true, .reset_attention_mask = true});
  GPTModelCtx ctx;
  PackedRun r;
  r.loss_sum = model.forward_loss(ctx, batch.tokens, batch.labels, batch.loss_mask,
                                  {.training = false, .packed_seq_params = &packed})
                   .loss_sum;
  r.logits = host(ctx.logits).clone();  // (before the backward, which may overwrite them)
  model.backward(ctx, 1.0f);
  for (const auto& p : model.params().params()) {
    r.grads.push_back(host(p->main_grad));
    r.keys.push_back(p->spec.key);
  }
  return r;
}

TEST(CudaPackedSequences, GptModelMatchesCpu) {
  MCPP_REQUIRE_CUDA();
  for (const std::string style : {"gpt2", "llama"}) {
    SCOPED_TRACE(style);
    TransformerConfig c = testing::tiny_gpu_config(style);
    c.calculate_per_token_loss = true;
    const PackedRun want = run_packed(c, Device::CPU), got = run_packed(c, Device::CUDA);
    // fp32 on both backends (cuBLASLt without TF32): rounding and summation order, as tests/cuda/gpt_model_test.cpp
    EXPECT_NEAR(got.loss_sum, want.loss_sum, 1e-5 * std::abs(want.loss_sum));
    EXPECT_REL(got.logits, want.logits, 1e-5);
    for (size_t i = 0; i < want.grads.size(); ++i) {
      SCOPED_TRACE(want.keys[i]);
      EXPECT_REL(got.grads[i], want.grads[i], 2e-4);
    }
  }
}

}  // namespace
}  // namespace mcpp::cuda_test
