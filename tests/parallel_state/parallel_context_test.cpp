// ParallelContext::create without MPI: a fake communicator that records every new_group call plays each
// rank of the world in turn (group creation needs no data exchange). Checks: every rank issues the
// same new_group sequence (so collective creation lines up), each kept group has the rank's members in
// ParallelLayout's order, coordinates equal the closed form, embedding groups are null off the first /
// last stage, pipeline neighbours. single() over the LocalCommunicator. Validation errors name the field.
// The real multi-process run is parallel_context_mpi_test.cpp (mpiexec -np 8).
#include "mcpp/parallel_state/parallel_context.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "core/core_test_util.h"
#include "mcpp/comm/flight_recorder.h"
#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/core/error.h"
#include "mcpp/training/config.h"

namespace mcpp::parallel_state {
namespace {

using comm::Communicator;
using comm::Work;

struct CreationLog {
  std::vector<std::pair<std::string, std::vector<int>>> calls;
};

// Only new_group is meaningful; any communication is a test failure (create must not communicate).
class FakeComm : public Communicator {
 public:
  FakeComm(std::string name, std::vector<int> ranks, int rank, std::shared_ptr<comm::FlightRecorder> rec,
           CreationLog* log)
      : Communicator(std::move(name), std::move(ranks), rank, std::move(rec)), log_(log) {}
  std::shared_ptr<Communicator> new_group(const std::string& name, const std::vector<int>& ranks) override {
    log_->calls.emplace_back(name, ranks);
    auto it = std::find(ranks.begin(), ranks.end(), global_rank());
    if (it == ranks.end()) return nullptr;
    return std::make_shared<FakeComm>(name, ranks, static_cast<int>(it - ranks.begin()), recorder_ptr(), log_);
  }

 protected:
  Work do_all_reduce(Tensor&, comm::ReduceOp) override { fail("fake: all_reduce"); }
  Work do_all_gather(Tensor&, const Tensor&) override { fail("fake: all_gather"); }
  Work do_reduce_scatter(Tensor&, const Tensor&, comm::ReduceOp) override { fail("fake: reduce_scatter"); }
  Work do_broadcast(Tensor&, int) override { fail("fake: broadcast"); }
  Work do_all_to_all(Tensor&, const Tensor&, const std::vector<int64_t>&, const std::vector<int64_t>&) override {
    fail("fake: all_to_all");
  }
  Work do_batch_p2p(const std::vector<comm::P2POp>&) override { fail("fake: batch_p2p"); }
  Work do_barrier() override { fail("fake: barrier"); }
  void exchange_fingerprints(const int64_t*, int64_t*, int) override { fail("fake: fingerprints"); }

 private:
  CreationLog* log_;
};

ParallelOptions options(int tp, int pp, int cp, int ep = 1, std::string order = "tp-cp-ep-dp-pp") {
  ParallelOptions o;
  o.tensor_model_parallel_size = tp;
  o.pipeline_model_parallel_size = pp;
  o.context_parallel_size = cp;
  o.expert_model_parallel_size = ep;
  o.order = std::move(order);
  return o;
}

TEST(ParallelContext, CreateOnEveryRankOfAFakeWorld) {
  struct Case { int world, tp, pp, cp, ep; };
  for (Case c : {Case{8, 2, 2, 1, 1}, Case{8, 2, 2, 2, 1}, Case{8, 1, 4, 1, 2}, Case{8, 1, 1, 1, 1},
                 Case{16, 2, 2, 1, 4}, Case{6, 1, 3, 1, 1}}) {
    SCOPED_TRACE(::testing::Message() << "world " << c.world << " tp " << c.tp << " pp " << c.pp << " cp " << c.cp
                                    << " ep " << c.ep);
    const ParallelOptions opt = options(c.tp, c.pp, c.cp, c.ep);
    const ParallelLayout L = ParallelLayout::make(c.world, opt);
    std::vector<int> all(static_cast<size_t>(c.world));
    for (int r = 0; r < c.world; ++r) all[static_cast<size_t>(r)] = r;
    std::vector<CreationLog> logs(static_cast<size_t>(c.world));
    const int dp = c.world / (c.tp * c.pp * c.cp);
    for (int r = 0; r < c.world; ++r) {
      auto rec = std::make_shared<comm::FlightRecorder>(r, c.world, 16);
      auto world = std::make_shared<FakeComm>("world", all, r, rec, &logs[static_cast<size_t>(r)]);
      const ParallelContext ctx = ParallelContext::create(world, opt);
      EXPECT_EQ(ctx.rank(), r);
      EXPECT_EQ(ctx.world_size(), c.world);
      EXPECT_EQ(ctx.dp_size(), dp);
      // rank = tp_r + tp*(cp_r + cp*(dp_r + dp*pp_r))
      EXPECT_EQ(ctx.tp_rank() + c.tp * (ctx.cp_rank() + c.cp * (ctx.dp_rank() + dp * ctx.pp_rank())), r);
      for (GroupKind k : all_group_kinds()) {
        const int i = L.group_index(k, r);
        const comm::CommPtr& g = ctx.group(k);
        if (i < 0) {
          EXPECT_EQ(g, nullptr) << group_kind_name(k);
          continue;
        }
        ASSERT_NE(g, nullptr) << group_kind_name(k);
        EXPECT_EQ(g->name(), group_kind_name(k));
        EXPECT_EQ(g->global_ranks(), L.groups(k)[static_cast<size_t>(i)]) << group_kind_name(k);
        EXPECT_EQ(g->global_rank(), r);
      }
      EXPECT_EQ(ctx.tp()->rank(), ctx.tp_rank());
      EXPECT_EQ(ctx.pp()->rank(), ctx.pp_rank());
      EXPECT_EQ(ctx.dp()->rank(), ctx.dp_rank());
      EXPECT_EQ(ctx.cp()->rank(), ctx.cp_rank());
      EXPECT_EQ(ctx.ep()->rank(), ctx.ep_rank());
      EXPECT_EQ(ctx.expert_tp()->rank(), ctx.expert_tp_rank());
      EXPECT_EQ(ctx.expert_dp()->rank(), ctx.expert_dp_rank());
      EXPECT_EQ(ctx.dp_cp()->size(), dp * c.cp);
      EXPECT_EQ(ctx.mp()->size(), c.tp * c.pp);
      EXPECT_EQ(ctx.tp_ep()->size(), ctx.expert_tp_size() * c.ep);
      EXPECT_EQ(ctx.expert_dp_size(), c.world / (c.tp * c.ep * c.pp));
      EXPECT_EQ(ctx.is_pipeline_first_stage(), ctx.pp_rank() == 0);
      EXPECT_EQ(ctx.is_pipeline_last_stage(), ctx.pp_rank() == c.pp - 1);
      EXPECT_EQ(ctx.is_in_embedding_group(), ctx.is_pipeline_first_stage() || ctx.is_pipeline_last_stage());
      EXPECT_EQ(ctx.position_embedding() != nullptr, ctx.is_pipeline_first_stage());
      const int stride = c.tp * c.cp * dp;  // default order: pp is the slowest dimension
      EXPECT_EQ(ctx.pipeline_next_rank(), ctx.pp_rank() == c.pp - 1 ? r - (c.pp - 1) * stride : r + stride);
      EXPECT_EQ(ctx.pipeline_prev_rank(), ctx.pp_rank() == 0 ? r + (c.pp - 1) * stride : r - stride);
    }
    // Every rank issued the same new_group sequence: all groups of all kinds, canonical order.
    const auto& first = logs[0].calls;
    EXPECT_EQ(first.size(), L.creation_sequence().size());
    for (int r = 1; r < c.world; ++r) EXPECT_EQ(logs[static_cast<size_t>(r)].calls, first) << "rank " << r;
  }
}

TEST(ParallelContext, SingleProcess) {
  const ParallelContext ctx = ParallelContext::single(comm::make_local_world());
  EXPECT_EQ(ctx.world_size(), 1);
  for (GroupKind k : all_group_kinds()) {
    ASSERT_NE(ctx.group(k), nullptr) << group_kind_name(k);
    EXPECT_EQ(ctx.group(k)->size(), 1);
    EXPECT_EQ(ctx.group(k)->name(), group_kind_name(k));
  }
  EXPECT_TRUE(ctx.is_pipeline_first_stage());
  EXPECT_TRUE(ctx.is_pipeline_last_stage());
  EXPECT_EQ(ctx.pipeline_next_rank(), 0);
}

using mcpp::testing::error_of;

#define EXPECT_ERROR_NAMES(expr, field)                                   \
  do {                                                                    \
    const std::string msg_ = error_of([&] { expr; });                     \
    EXPECT_NE(msg_.find(field), std::string::npos) << "got: " << msg_;    \
  } while (0)

TEST(ParallelLayout, GridErrorsNameTheField) {
  EXPECT_ERROR_NAMES(ParallelLayout::make(6, options(4, 1, 1)), "tensor_model_parallel_size * pipeline_model");
  EXPECT_ERROR_NAMES(ParallelLayout::make(8, options(2, 3, 1)), "world size (8) must be divisible");
  EXPECT_ERROR_NAMES(ParallelLayout::make(8, options(0, 1, 1)), "tensor_model_parallel_size must be >= 1");
  EXPECT_ERROR_NAMES(ParallelLayout::make(8, options(1, 1, 1, -1)), "expert_model_parallel_size must be >= 1");
  EXPECT_ERROR_NAMES(ParallelLayout::make(0, options(1, 1, 1)), "world size must be >= 1");
  // Expert grid: world % (expert_tp * ep * pp); dp 4 with ep 3 does not divide.
  EXPECT_ERROR_NAMES(ParallelLayout::make(8, options(2, 1, 1, 3)), "expert_model_parallel_size");
  // ep > 1 needs ep in the order; order typos.
  EXPECT_ERROR_NAMES(ParallelLayout::make(8, options(2, 1, 1, 2, "tp-dp-pp")), "does not name ep");
  EXPECT_ERROR_NAMES(ParallelLayout::make(8, options(2, 1, 1, 1, "tp-dq-pp")), "unknown dimension 'dq'");
  // Not pp-last: the dense and expert data-parallel sizes must agree (Megatron's assertion).
  EXPECT_ERROR_NAMES(ParallelLayout::make(16, options(2, 2, 1, 2, "tp-pp-ep-dp")), "does not end with pp");
  EXPECT_EQ(error_of([] { ParallelLayout::make(16, options(2, 2, 2, 2)); }), "");
  EXPECT_EQ(error_of([] { ParallelLayout::make(8, options(2, 2, 1, 1, "tp-pp-dp")); }), "");
}

Config valid_config(int tp, int pp, int cp) {
  Config cfg;
  cfg.model.num_layers = 4;
  cfg.model.num_attention_heads = 8;
  cfg.model.hidden_size = 64;
  cfg.model.seq_length = 64;
  cfg.parallel.tensor_model_parallel_size = tp;
  cfg.parallel.pipeline_model_parallel_size = pp;
  cfg.parallel.context_parallel_size = cp;
  cfg.finalize();
  return cfg;
}

TEST(ParallelLayout, ModelRulesNameTheField) {
  EXPECT_EQ(error_of([] { validate_parallel_layout(8, valid_config(2, 2, 2)); }), "");
  Config c = valid_config(2, 2, 1);
  c.model.num_attention_heads = 6;
  c.model.num_query_groups = 6;
  EXPECT_EQ(error_of([&] { validate_parallel_layout(8, c); }), "");
  Config heads = valid_config(4, 1, 1);
  heads.model.num_attention_heads = 6;
  heads.model.num_query_groups = 2;
  EXPECT_ERROR_NAMES(validate_parallel_layout(8, heads), "num_attention_heads (6)");
  Config groups = valid_config(4, 1, 1);
  groups.model.num_query_groups = 2;
  EXPECT_ERROR_NAMES(validate_parallel_layout(8, groups), "num_query_groups (2)");
  Config ffn = valid_config(4, 1, 1);
  ffn.model.ffn_hidden_size = 90;
  EXPECT_ERROR_NAMES(validate_parallel_layout(8, ffn), "ffn_hidden_size (90)");
  Config layers = valid_config(1, 3, 1);
  EXPECT_ERROR_NAMES(validate_parallel_layout(3, layers), "num_layers (4)");
  ParallelOptions with_layout = parallel_options(layers.parallel);
  with_layout.pipeline_model_parallel_layout = "Et|tt|tL";  // the layout code owns this rule then
  EXPECT_EQ(error_of([&] { validate_parallel_layout(3, layers, with_layout); }), "");
  Config sp1 = valid_config(1, 1, 1);
  sp1.parallel.sequence_parallel = true;
  EXPECT_ERROR_NAMES(validate_parallel_layout(1, sp1), "sequence_parallel needs tensor_model_parallel_size > 1");
  Config sp = valid_config(4, 1, 1);
  sp.parallel.sequence_parallel = true;
  sp.model.seq_length = 66;
  EXPECT_ERROR_NAMES(validate_parallel_layout(4, sp), "seq_length (66)");
  Config vocab = valid_config(4, 1, 1);
  vocab.model.padded_vocab_size = 130;
  EXPECT_ERROR_NAMES(validate_parallel_layout(4, vocab), "padded_vocab_size (130)");
  vocab.model.set_vocab_size(130, 4);  // padding to 128 * 4 fixes it
  EXPECT_EQ(error_of([&] { validate_parallel_layout(4, vocab); }), "");
  EXPECT_ERROR_NAMES(validate_parallel_layout(6, valid_config(4, 1, 1)), "world size (6)");
  ParallelOptions mismatch = parallel_options(valid_config(2, 1, 1).parallel);
  mismatch.tensor_model_parallel_size = 4;
  EXPECT_ERROR_NAMES(validate_parallel_layout(8, valid_config(2, 1, 1), mismatch), "tensor_model_parallel_size 2");
}

}  // namespace
}  // namespace mcpp::parallel_state
