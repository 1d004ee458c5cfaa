// Shared pieces of the multi-rank gtest drivers (tests/mpi/*_driver.cpp), each its own executable under
// mpiexec: the MPI-aware gtest main, and the comparisons against the single-rank reference model.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mcpp/comm/mpi/mpi_communicator.h"
#include "mcpp/distributed/param_and_grad_buffer.h"
#include "mcpp/optimizer/adam.h"
#include "mcpp/transformer/transformer_config.h"
#include "tests/models/gpt_test_util.h"

namespace mcpp::testing {

// max |a - b| / max |ref| (ref = b unless given): the normwise relative error used by the equivalence tests.
inline double rel_err(const Tensor& a, const Tensor& b, const Tensor& ref) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < a.numel(); ++i) diff = std::max(diff, double(std::abs(a.data<float>()[i] - b.data<float>()[i])));
  for (int64_t i = 0; i < ref.numel(); ++i) scale = std::max(scale, double(std::abs(ref.data<float>()[i])));
  return scale > 0 ? diff / scale : diff;
}
inline double rel_err(const Tensor& a, const Tensor& b) { return rel_err(a, b, b); }

// The buffer's parameters as Adam's (fp32: the parameter is its own master copy).
inline std::vector<AdamParam> adam_params(const ParamAndGradBuffer& buffer) {
  std::vector<AdamParam> out;
  for (const auto& p : buffer.params())
    out.push_back({.name = p->spec.key, .param = p->data, .main_grad = p->main_grad,
                   .no_weight_decay = p->spec.no_weight_decay});
  return out;
}

// This rank's shard (TensorShard) of a logical reference tensor; the tensor itself when replicated.
inline Tensor shard_of(const Parameter& local, const Tensor& global) {
  if (!local.spec.shard.partitioned()) return global;
  Tensor out = Tensor::empty(local.spec.shape);
  copy_shard_from_global(out, global, local.spec.shard);
  return out;
}

// The tiny GPT of the equivalence drivers: "gpt2" (LayerNorm, learned positions, GELU, biases, tied, MHA)
// or "llama" (RMSNorm, RoPE, SwiGLU, GQA 8:4, no biases, untied); 8 heads and 4 groups divide tp <= 4.
inline TransformerConfig equivalence_config(const std::string& style, int64_t num_layers = 2) {
  TransformerConfig c;
  c.num_layers = num_layers;
  c.hidden_size = 32;
  c.num_attention_heads = 8;
  c.kv_channels = 4;
  c.seq_length = 8;
  c.max_position_embeddings = 16;
  c.vocab_size = 100;
  c.padded_vocab_size = 128;
  c.hidden_dropout = 0.0f;
  c.attention_dropout = 0.0f;
  if (style == "gpt2") {
    c.num_query_groups = 8;
    c.ffn_hidden_size = 64;
  } else if (style == "mla" || style == "mla_noq") {
    // Multi-latent attention on the Llama style (MHA; widths divisible by TP 2 and 4). "mla": query compression,
    // YaRN, values padded (dv 3 < dn + dr 6); "mla_noq": linear_q_proj, plain RoPE, queries / keys padded.
    c = equivalence_config("llama", num_layers);
    testing::enable_mla(c,
                        style == "mla"
                            ? testing::MlaDims{.q_lora_rank = 8, .kv_lora_rank = 6, .qk_head_dim = 4,
                                               .qk_pos_emb_head_dim = 2, .v_head_dim = 3, .rope_type = "yarn",
                                               .rotary_scaling_factor = 2.0f, .mscale_all_dim = 0.5f,
                                               .original_max_position_embeddings = 8}
                            : testing::MlaDims{.q_lora_rank = 0, .kv_lora_rank = 6, .qk_head_dim = 2,
                                               .qk_pos_emb_head_dim = 2, .v_head_dim = 6, .rope_type = "rope"},
                        /*with_norms=*/false);  // (the drivers set qk_layernorm per case)
  } else {
    c.num_query_groups = 4;
    c.ffn_hidden_size = 48;
    c.normalization = Normalization::RMSNorm;
    c.swiglu = true;
    c.position_embedding_type = PositionEmbedding::Rope;
    c.untie_embeddings_and_output_weights = true;
    c.add_bias_linear = false;
  }
  return c;
}

// gtest main under MPI: only rank 0 prints; every rank exits with the maximum exit code of all ranks.
inline int run_mpi_gtest(int argc, char** argv) {
  comm::init_mpi(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (comm::world()->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  Tensor t = Tensor::empty({1}, DType::I32);
  t.data<int32_t>()[0] = rc;
  comm::world()->all_reduce(t, comm::ReduceOp::Max).wait();
  rc = t.data<int32_t>()[0];
  comm::finalize_mpi();
  return rc;
}

}  // namespace mcpp::testing
