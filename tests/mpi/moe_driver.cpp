// Expert parallelism under mpiexec (transformer/moe/token_dispatcher.h): the MoE layer with EP (and expert TP) over the world —
// each rank holds num_moe_experts / ep experts, under expert TP a 1 / etp shard of each, and trades tokens by
// all-to-all over EP, all-gather / reduce-scatter over expert TP — against every rank running the whole layer
// alone (EP 1, all experts) on its own tokens. Expected: the same output and input gradient per rank, the same
// router gradient (the router is replicated), and each expert's gradient (its shard's, under expert TP) on its EP
// rank equal to the sum over the EP x expert-TP group of the single-rank gradients of that expert (the tokens of
// every rank of the group reach it). Parameters are initialized from their keys (global expert index; a shard from
// the logical tensor), so both sides start equal.
#include <gtest/gtest.h>

#include <string>

#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/distributed/param_and_grad_buffer.h"
#include "mcpp/transformer/moe/moe_layer.h"
#include "mcpp/parallel_state/parallel_context.h"
#include "tests/kernels/grad_check.h"
#include "tests/mpi/mpi_test_util.h"

namespace mcpp {
namespace {
using parallel_state::ParallelContext;

// ep = 0: the world; etp: the expert-TP size (the world's remaining factor is expert-DP).
void check_ep_equivalence(const std::string& style, int64_t experts_per_rank, int64_t topk, int ep = 0, int etp = 1,
                          double capacity = 0.0) {
  comm::CommPtr world = comm::world();
  const int ranks = world->size(), me = world->rank();
  if (ep == 0) ep = ranks;
  if (ranks % (ep * etp) != 0) GTEST_SKIP() << "ep " << ep << " x expert tp " << etp << " at " << ranks << " ranks";
  ParallelContext pc = ParallelContext::create(world, {.expert_model_parallel_size = ep,
                                                       .expert_tensor_parallel_size = etp});
  ASSERT_EQ(pc.ep_size(), ep);
  ASSERT_EQ(pc.expert_tp_size(), etp);
  TransformerConfig c = testing::equivalence_config(style);
  c.num_moe_experts = experts_per_rank * ep;
  if (capacity > 0) {  // padded to capacity: every rank's blocks equal, the uniform plan
    c.moe_expert_capacity_factor = capacity;
    c.moe_pad_expert_input_to_capacity = true;
  }
  c.moe_router_topk = topk;
  c.moe_ffn_hidden_size = 16;
  c.moe_aux_loss_coeff = 0.01f;
  c.finalize();
  c.validate();
  ParamAndGradBuffer par_params, ref_params;
  moe::MoELayer par(par_params, par_params, "mlp", c,
                    {.group = pc.tp(), .ep = ep > 1 ? pc.ep() : nullptr, .etp = etp > 1 ? pc.expert_tp() : nullptr});
  moe::MoELayer ref(ref_params, ref_params, "mlp", c, {.group = comm::make_local_world()});
  par_params.finalize(11);
  ref_params.finalize(11);
  // Biases (zero-initialized) get nonzero values, the same logical ones on both sides: an expert's fc2 bias must
  // enter its output once whatever the expert TP.
  for (const auto& p : ref_params.params()) {
    if (p->spec.key.find(".bias") == std::string::npos) continue;
    float* v = p->data.data<float>();
    for (int64_t i = 0; i < p->data.numel(); ++i) v[i] = 0.1f * static_cast<float>((i * 7 + 3) % 11) - 0.5f;
    Parameter* mine = par_params.find(p->spec.key);
    if (!mine) continue;
    if (mine->spec.shard.partitioned()) copy_shard_from_global(mine->data, p->data, mine->spec.shard);
    else mine->data.copy_from(p->data);
  }
  EXPECT_EQ(par.dispatcher().num_local_experts(), experts_per_rank);

  // Rank-dependent tokens (more on some ranks: the all-to-all splits are uneven); padded to capacity every rank
  // has as many (as in training: the capacity, from the local token count, is then the same everywhere).
  const int64_t s = capacity > 0 ? 6 : 5 + me, b = 2, h = c.hidden_size;
  Tensor x = testing::random_tensor({s, b, h}, 100 + static_cast<uint64_t>(me), nullptr, -2.0, 2.0);
  Tensor dy = testing::random_tensor({s, b, h}, 200 + static_cast<uint64_t>(me));
  moe::MoELayerCtx pctx, rctx;
  Tensor py = par.forward(pctx, x, nullptr), ry = ref.forward(rctx, x, nullptr);
  EXPECT_LT(testing::rel_err(py, ry), 1e-5);
  Tensor pdx = par.backward(pctx, dy, 0.5f), rdx = ref.backward(rctx, dy, 0.5f);
  EXPECT_LT(testing::rel_err(pdx, rdx), 1e-5);

  const Parameter* pr = par_params.find("mlp.router.weight");
  const Parameter* rr = ref_params.find("mlp.router.weight");
  ASSERT_TRUE(pr && rr);
  EXPECT_LT(testing::rel_err(pr->main_grad, rr->main_grad), 1e-5);
  int checked = 0;
  for (const auto& p : ref_params.params()) {  // every expert parameter: the sum over the EP x expert-TP group
    if (p->spec.key.find(".experts.") == std::string::npos) continue;
    Tensor sum = p->main_grad.clone();
    pc.tp_ep()->all_reduce(sum, comm::ReduceOp::Sum).wait();
    const Parameter* mine = par_params.find(p->spec.key);
    const int64_t e = std::stoll(p->spec.key.substr(p->spec.key.find("local_experts.") + 14));
    ASSERT_EQ(mine != nullptr, e / experts_per_rank == pc.ep_rank()) << p->spec.key;  // held by its EP rank only
    if (!mine) continue;
    ASSERT_EQ(mine->spec.shard.partitioned(), etp > 1 && p->spec.key.find(".linear_fc2.bias") == std::string::npos)
        << p->spec.key;
    Tensor want = sum;  // this rank's expert-TP shard of the sum
    if (mine->spec.shard.partitioned()) {
      want = Tensor::empty(mine->main_grad.shape());
      copy_shard_from_global(want, sum, mine->spec.shard);
    }
    EXPECT_LT(testing::rel_err(mine->main_grad, want), 1e-5) << p->spec.key;
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

TEST(ExpertParallel, GeluExpertsOnePerRankTop1) { check_ep_equivalence("gpt2", 1, 1); }
TEST(ExpertParallel, GeluExpertsTwoPerRankTop2) { check_ep_equivalence("gpt2", 2, 2); }
TEST(ExpertParallel, SwigluExpertsTwoPerRankTop3) { check_ep_equivalence("llama", 2, 3); }
// Expert tensor parallelism: the experts' FFN split over expert TP = 2 (EP 1, and EP 2 at 4 ranks), GELU with
// biases (fc2's bias added once, on expert-TP rank 0) and SwiGLU (fc1's [gate | up] split per half); padded to
// capacity (the uniform plan: no count exchange).
TEST(ExpertTensorParallel, GeluExpertsTp2Top2) { check_ep_equivalence("gpt2", 4, 2, 1, 2); }
TEST(ExpertTensorParallel, SwigluExpertsTp2Top3) { check_ep_equivalence("llama", 3, 3, 1, 2); }
TEST(ExpertTensorParallel, GeluExpertsEp2xTp2Top2) { check_ep_equivalence("gpt2", 2, 2, 2, 2); }
TEST(ExpertTensorParallel, SwigluExpertsEp2xTp2Top1) { check_ep_equivalence("llama", 1, 1, 2, 2); }
TEST(ExpertTensorParallel, PaddedExpertsEp2xTp2) { check_ep_equivalence("gpt2", 2, 2, 2, 2, 1.0); }
TEST(ExpertTensorParallel, PaddedExpertsTp2) { check_ep_equivalence("llama", 2, 2, 1, 2, 0.5); }

}  // namespace
}  // namespace mcpp

int main(int argc, char** argv) { return mcpp::testing::run_mpi_gtest(argc, argv); }
