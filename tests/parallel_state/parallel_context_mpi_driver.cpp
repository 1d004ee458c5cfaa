// ParallelContext over the real MPI backend, run under mpiexec (tests/parallel_state/tests.cmake,
// np 4 and 8). Not a *_test.cpp: it has its own main (MPI init) and is not part of mcpp_tests.
// For every layout that fits the world size: each group this rank holds has the members ParallelLayout
// lists; an all_gather of global ranks over every held group returns exactly that member list (the
// groups really communicate, in group order); an all_reduce of ones over tp / dp_cp / ep gives the
// group size; embedding groups exist only on the first / last stage. Bad layouts throw on every rank
// before any group is created (no hang).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "mcpp/comm/mpi/mpi_communicator.h"
#include "mcpp/core/error.h"
#include "mcpp/core/tensor.h"
#include "mcpp/parallel_state/parallel_context.h"

namespace mcpp::parallel_state {
namespace {

ParallelOptions options(int tp, int pp, int cp, int ep, const char* order = "tp-cp-ep-dp-pp") {
  ParallelOptions o;
  o.tensor_model_parallel_size = tp;
  o.pipeline_model_parallel_size = pp;
  o.context_parallel_size = cp;
  o.expert_model_parallel_size = ep;
  o.order = order;
  return o;
}

std::vector<int> gather_global_ranks(const comm::CommPtr& g) {
  Tensor in = Tensor::empty({1}, DType::I32);
  in.data<int32_t>()[0] = g->global_rank();
  Tensor out = Tensor::empty({g->size()}, DType::I32);
  g->all_gather(out, in).wait();
  return std::vector<int>(out.data<int32_t>(), out.data<int32_t>() + g->size());
}

float sum_of_ones(const comm::CommPtr& g) {
  Tensor t = Tensor::empty({1}, DType::F32);
  t.data<float>()[0] = 1.0f;
  g->all_reduce(t, comm::ReduceOp::Sum).wait();
  return t.data<float>()[0];
}

TEST(ParallelContextMpi, GroupsMatchLayoutAndCommunicate) {
  const comm::CommPtr world = comm::world();
  const int n = world->size();
  struct Case { int tp, pp, cp, ep; const char* order; };
  const Case cases[] = {{2, 2, 1, 1, "tp-cp-ep-dp-pp"}, {2, 2, 2, 1, "tp-cp-ep-dp-pp"}, {1, 4, 1, 2, "tp-cp-ep-dp-pp"},
                        {2, 1, 1, 4, "tp-cp-ep-dp-pp"}, {2, 2, 1, 1, "tp-pp-dp"},       {1, 8, 1, 1, "tp-cp-ep-dp-pp"},
                        {1, 1, 2, 2, "tp-cp-ep-dp-pp"}, {4, 1, 1, 1, "tp-cp-ep-dp-pp"}, {1, 1, 1, 1, "tp-cp-ep-dp-pp"}};
  int ran = 0;
  for (const Case& c : cases) {
    if (n % (c.tp * c.pp * c.cp) != 0 || n % (c.tp * c.ep * c.pp) != 0) continue;
    ++ran;
    SCOPED_TRACE(fmt::format("rank {} world {} tp {} pp {} cp {} ep {} order {}", world->rank(), n, c.tp, c.pp, c.cp,
                             c.ep, c.order));
    const ParallelOptions opt = options(c.tp, c.pp, c.cp, c.ep, c.order);
    const ParallelContext ctx = ParallelContext::create(world, opt);
    const ParallelLayout& L = ctx.layout();
    const int r = world->rank();
    ASSERT_EQ(ctx.rank(), r);
    for (GroupKind k : all_group_kinds()) {
      const int i = L.group_index(k, r);
      const comm::CommPtr& g = ctx.group(k);
      if (i < 0) {
        EXPECT_EQ(g, nullptr) << group_kind_name(k);
        continue;
      }
      ASSERT_NE(g, nullptr) << group_kind_name(k);
      const std::vector<int> want = L.groups(k)[static_cast<size_t>(i)];
      EXPECT_EQ(g->global_ranks(), want) << group_kind_name(k);
      EXPECT_EQ(gather_global_ranks(g), want) << group_kind_name(k);
    }
    EXPECT_EQ(sum_of_ones(ctx.tp()), static_cast<float>(c.tp));
    EXPECT_EQ(sum_of_ones(ctx.dp_cp()), static_cast<float>(ctx.dp_size() * c.cp));
    EXPECT_EQ(sum_of_ones(ctx.ep()), static_cast<float>(c.ep));
    EXPECT_EQ(ctx.is_in_embedding_group(), ctx.is_pipeline_first_stage() || ctx.is_pipeline_last_stage());
    if (std::string(c.order) == "tp-cp-ep-dp-pp") {
      EXPECT_EQ(ctx.tp_rank() + c.tp * (ctx.cp_rank() + c.cp * (ctx.dp_rank() + ctx.dp_size() * ctx.pp_rank())), r);
    }
    world->barrier().wait();
  }
  EXPECT_GE(ran, 3) << "too few layouts fit world size " << n;
}

TEST(ParallelContextMpi, BadLayoutFailsOnEveryRank) {
  const comm::CommPtr world = comm::world();
  const int n = world->size();
  std::string msg;
  try {
    ParallelContext::create(world, options(n + 1, 1, 1, 1));
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("tensor_model_parallel_size"), std::string::npos) << msg;
  msg.clear();
  try {
    ParallelContext::create(world, options(1, 1, 1, 3));  // np 4 / 8: 3 divides neither
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("expert_model_parallel_size"), std::string::npos) << msg;
  world->barrier().wait();  // every rank got here: nobody hangs in a half-created group
}

}  // namespace
}  // namespace mcpp::parallel_state

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  try {
    auto w = mcpp::comm::init_mpi(argc, argv);
    if (w->rank() != 0) {  // one report, from rank 0; failures elsewhere still set the exit code
      auto& listeners = testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
    }
    int rc = RUN_ALL_TESTS();
    if (rc != 0) fmt::print(stderr, "rank {}: gtest failures\n", w->rank());
    w.reset();
    mcpp::comm::finalize_mpi();
    return rc;
  } catch (const mcpp::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
}
