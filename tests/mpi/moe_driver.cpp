// Expert parallelism under mpiexec (moe/token_dispatcher.h): the MoE layer with EP = world — each rank holds
// num_moe_experts / world experts and trades tokens by all-to-all — against every rank running the whole
// layer alone (EP 1, all experts) on its own tokens. Expected: the same output and input gradient per rank,
// the same router gradient (the router is replicated), and each expert's gradient on its EP rank equal to
// the sum over ranks of the single-rank gradients of that expert (the tokens of every rank reach it).
// Parameters are initialized from their keys (global expert index), so both sides start equal.
#include <gtest/gtest.h>

#include <string>

#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/moe/moe_layer.h"
#include "mcpp/parallel_state/parallel_context.h"
#include "tests/kernels/grad_check.h"
#include "tests/mpi/mpi_test_util.h"

namespace mcpp {
namespace {
using parallel_state::ParallelContext;

void check_ep_equivalence(const std::string& style, int64_t experts_per_rank, int64_t topk) {
  comm::CommPtr world = comm::world();
  const int ranks = world->size(), me = world->rank();
  ParallelContext pc = ParallelContext::create(world, {.expert_model_parallel_size = ranks});
  ASSERT_EQ(pc.ep_size(), ranks);
  TransformerConfig c = testing::equivalence_config(style);
  c.num_moe_experts = experts_per_rank * ranks;
  c.moe_router_topk = topk;
  c.moe_ffn_hidden_size = 16;
  c.moe_aux_loss_coeff = 0.01f;
  c.finalize();
  c.validate();
  ParamAndGradBuffer par_params, ref_params;
  moe::MoELayer par(par_params, par_params, "mlp", c, {.group = pc.tp(), .ep = pc.ep()});
  moe::MoELayer ref(ref_params, ref_params, "mlp", c, {.group = comm::make_local_world()});
  par_params.finalize(11);
  ref_params.finalize(11);
  EXPECT_EQ(par.dispatcher().num_local_experts(), experts_per_rank);

  // Rank-dependent tokens (more on some ranks: the all-to-all splits are uneven).
  const int64_t s = 5 + me, b = 2, h = c.hidden_size;
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
  for (const auto& p : ref_params.params()) {  // every expert parameter: the sum over ranks
    if (p->spec.key.find(".experts.") == std::string::npos) continue;
    Tensor sum = p->main_grad.clone();
    world->all_reduce(sum, comm::ReduceOp::Sum).wait();
    const Parameter* mine = par_params.find(p->spec.key);
    const int64_t e = std::stoll(p->spec.key.substr(p->spec.key.find("local_experts.") + 14));
    ASSERT_EQ(mine != nullptr, e / experts_per_rank == me) << p->spec.key;  // held by its EP rank only
    if (!mine) continue;
    EXPECT_LT(testing::rel_err(mine->main_grad, sum), 1e-5) << p->spec.key;
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

TEST(ExpertParallel, GeluExpertsOnePerRankTop1) { check_ep_equivalence("gpt2", 1, 1); }
TEST(ExpertParallel, GeluExpertsTwoPerRankTop2) { check_ep_equivalence("gpt2", 2, 2); }
TEST(ExpertParallel, SwigluExpertsTwoPerRankTop3) { check_ep_equivalence("llama", 2, 3); }

}  // namespace
}  // namespace mcpp

int main(int argc, char** argv) { return mcpp::testing::run_mpi_gtest(argc, argv); }
