// RankGenerator / ParallelLayout vs (1) the closed-form default layout
// rank = tp_r + tp*(cp_r + cp*(dp_r + dp*pp_r)), (2) the worked examples in Megatron-Core's docstrings,
// (3) tests/oracle/parallel_state/megatron_ranks.py (a transcription of Megatron's
// generate_masked_orthogonal_rank_groups cross-checked there against numpy axis algebra), run with
// /usr/bin/python3 for configurations with non-default orders, cp > 1 and ep > 1.
#include "mcpp/parallel_state/rank_generator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "core/core_test_util.h"
#include "mcpp/core/error.h"
#include "mcpp/parallel_state/parallel_context.h"
#include "tests/oracle/oracle_python.h"

namespace mcpp::parallel_state {
namespace {

using mcpp::testing::error_of;

TEST(RankGenerator, MaskedOrthogonalGroupsDocstringExample) {
  // Megatron's docstring: parallel_size [tp, dp, pp] = [2, 3, 4], mask = dp only.
  RankGroups g = generate_masked_orthogonal_rank_groups(24, {2, 3, 4}, {false, true, false});
  ASSERT_EQ(g.size(), 8u);
  EXPECT_EQ(g[0], (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(g[1], (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(g[7], (std::vector<int>{19, 21, 23}));
}

TEST(RankGenerator, InitializeModelParallelDocstringExample) {
  // initialize_model_parallel's docstring: 16 GPUs, tp 2, pp 4 (dp 2), order tp-dp-pp.
  RankGenerator gen({.tp = 2, .ep = 1, .dp = 2, .pp = 4, .cp = 1, .order = "tp-dp-pp"});
  EXPECT_EQ(gen.get_ranks("dp"), (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(gen.get_ranks("tp"), (RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(gen.get_ranks("pp"), (RankGroups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(gen.order(), "tp-dp-pp-ep-cp");  // omitted size-1 dims appended, as Megatron does
  // The generate_masked_orthogonal_rank_groups docstring: 8 GPUs, order tp-pp-dp, sizes 2-2-2.
  RankGenerator tpd({.tp = 2, .ep = 1, .dp = 2, .pp = 2, .cp = 1, .order = "tp-pp-dp"});
  EXPECT_EQ(tpd.get_ranks("dp"), (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(RankGenerator, RankOffsetShiftsEveryRank) {
  RankGenerator gen({.tp = 2, .ep = 1, .dp = 2, .pp = 1, .cp = 1, .order = "tp-dp", .rank_offset = 8});
  EXPECT_EQ(gen.get_ranks("dp"), (RankGroups{{8, 10}, {9, 11}}));
  EXPECT_EQ(gen.coordinate(11, "dp"), 1);
  EXPECT_NE(error_of([&] { gen.coordinate(3, "tp"); }), "");
}

TEST(RankGenerator, DefaultLayoutEqualsClosedForm) {
  struct Case { int world, tp, pp, cp; };
  for (Case c : {Case{8, 2, 2, 1}, Case{16, 2, 2, 2}, Case{24, 2, 3, 2}, Case{12, 1, 3, 1}, Case{8, 8, 1, 1},
                 Case{32, 2, 2, 2}, Case{6, 1, 1, 3}}) {
    ParallelOptions opt;
    opt.tensor_model_parallel_size = c.tp;
    opt.pipeline_model_parallel_size = c.pp;
    opt.context_parallel_size = c.cp;
    ParallelLayout L = ParallelLayout::make(c.world, opt);
    const int dp = c.world / (c.tp * c.pp * c.cp);
    ASSERT_EQ(L.dp(), dp);
    auto rank_of = [&](int t, int cc, int d, int p) { return t + c.tp * (cc + c.cp * (d + dp * p)); };
    for (int p = 0; p < c.pp; ++p)
      for (int d = 0; d < dp; ++d)
        for (int cc = 0; cc < c.cp; ++cc)
          for (int t = 0; t < c.tp; ++t) {
            const int r = rank_of(t, cc, d, p);
            SCOPED_TRACE(::testing::Message() << "world " << c.world << " tp " << c.tp << " pp " << c.pp << " cp "
                                            << c.cp << " rank " << r);
            RankCoordinates k = L.coordinates(r);
            EXPECT_EQ(k.tp, t);
            EXPECT_EQ(k.cp, cc);
            EXPECT_EQ(k.dp, d);
            EXPECT_EQ(k.pp, p);
            // The rank's group of each kind holds exactly the ranks varying the kind's coordinates, in
            // order (first dimension fastest).
            auto expect_group = [&](GroupKind kind, std::vector<int> want) {
              const RankGroups gs = L.groups(kind);
              const int i = L.group_index(kind, r);
              ASSERT_GE(i, 0) << group_kind_name(kind);
              EXPECT_EQ(gs[static_cast<size_t>(i)], want) << group_kind_name(kind);
            };
            std::vector<int> tpg, ppg, dpg, cpg, dpcp, mp, tpcp;
            for (int x = 0; x < c.tp; ++x) tpg.push_back(rank_of(x, cc, d, p));
            for (int x = 0; x < c.pp; ++x) ppg.push_back(rank_of(t, cc, d, x));
            for (int x = 0; x < dp; ++x) dpg.push_back(rank_of(t, cc, x, p));
            for (int x = 0; x < c.cp; ++x) cpg.push_back(rank_of(t, x, d, p));
            for (int x = 0; x < dp; ++x)
              for (int y = 0; y < c.cp; ++y) dpcp.push_back(rank_of(t, y, x, p));
            for (int x = 0; x < c.pp; ++x)
              for (int y = 0; y < c.tp; ++y) mp.push_back(rank_of(y, cc, d, x));
            for (int x = 0; x < c.cp; ++x)
              for (int y = 0; y < c.tp; ++y) tpcp.push_back(rank_of(y, x, d, p));
            expect_group(GroupKind::Tp, tpg);
            expect_group(GroupKind::Pp, ppg);
            expect_group(GroupKind::Dp, dpg);
            expect_group(GroupKind::Cp, cpg);
            expect_group(GroupKind::DpCp, dpcp);
            expect_group(GroupKind::Mp, mp);
            expect_group(GroupKind::TpCp, tpcp);
            std::vector<int> embd = c.pp == 1 ? std::vector<int>{r} : std::vector<int>{ppg.front(), ppg.back()};
            if (p == 0 || p == c.pp - 1) expect_group(GroupKind::Embedding, embd);
            else EXPECT_EQ(L.group_index(GroupKind::Embedding, r), -1);
            if (p == 0) expect_group(GroupKind::PositionEmbedding, {r});
            else EXPECT_EQ(L.group_index(GroupKind::PositionEmbedding, r), -1);
          }
  }
}

nlohmann::json run_oracle(const std::string& args) {
  const std::string cmd = mcpp::test::oracle_python() + MCPP_SOURCE_DIR +
                          "/tests/oracle/parallel_state/megatron_ranks.py " + args;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) throw Error("cannot run " + cmd);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  if (rc != 0) throw Error("oracle failed (" + std::to_string(rc) + "): " + cmd);
  return nlohmann::json::parse(out);
}

TEST(RankGenerator, MatchesMegatronOracle) {
  struct Case { int world, tp, pp, cp, ep, etp; const char* order; };
  const Case cases[] = {
      {8, 2, 2, 1, 1, 0, "tp-cp-ep-dp-pp"}, {16, 2, 2, 2, 1, 0, "tp-cp-ep-dp-pp"},
      {16, 2, 2, 1, 2, 0, "tp-cp-ep-dp-pp"}, {16, 1, 2, 2, 4, 0, "tp-cp-ep-dp-pp"},
      {32, 2, 2, 2, 4, 1, "tp-cp-ep-dp-pp"}, {8, 2, 2, 1, 1, 0, "tp-pp-dp"},
      {24, 2, 3, 1, 1, 0, "tp-dp-pp"},       {16, 2, 2, 2, 2, 0, "tp-cp-ep-pp-dp"},
      {12, 3, 1, 2, 2, 0, "cp-tp-dp-ep-pp"}, {8, 1, 8, 1, 1, 0, "tp-cp-ep-dp-pp"},
      {16, 4, 2, 1, 2, 2, "tp-ep-dp-pp"},    {8, 1, 1, 1, 8, 0, "tp-cp-ep-dp-pp"},
  };
  for (const Case& c : cases) {
    const std::string args = "--world " + std::to_string(c.world) + " --tp " + std::to_string(c.tp) + " --pp " +
                             std::to_string(c.pp) + " --cp " + std::to_string(c.cp) + " --ep " + std::to_string(c.ep) +
                             " --etp " + std::to_string(c.etp) + " --order " + c.order;
    SCOPED_TRACE(args);
    const nlohmann::json want = run_oracle(args);
    ParallelOptions opt;
    opt.tensor_model_parallel_size = c.tp;
    opt.pipeline_model_parallel_size = c.pp;
    opt.context_parallel_size = c.cp;
    opt.expert_model_parallel_size = c.ep;
    opt.expert_tensor_parallel_size = c.etp;
    opt.order = c.order;
    ParallelLayout L = ParallelLayout::make(c.world, opt);
    EXPECT_EQ(L.dp(), want["dp"].get<int>());
    EXPECT_EQ(L.expert_dp(), want["expert_dp"].get<int>());
    EXPECT_EQ(L.order(), want["order"].get<std::string>());
    EXPECT_EQ(L.expert().order(), want["expert_order"].get<std::string>());
    for (GroupKind k : all_group_kinds())
      EXPECT_EQ(L.groups(k), want["groups"][group_kind_name(k)].get<RankGroups>()) << group_kind_name(k);
    EXPECT_EQ(L.decoder().get_ranks("tp-dp-cp"), want["groups"]["dec:tp-dp-cp"].get<RankGroups>());
    EXPECT_EQ(L.decoder().get_ranks("tp-dp"), want["groups"]["dec:tp-dp"].get<RankGroups>());
    EXPECT_EQ(L.expert().get_ranks("tp-ep-pp"), want["groups"]["exp:tp-ep-pp"].get<RankGroups>());
    EXPECT_EQ(L.expert().get_ranks("dp-pp"), want["groups"]["exp:dp-pp"].get<RankGroups>());
    // Coordinates agree with membership: a rank's coordinate is its position in that single-dim group.
    for (int r = 0; r < c.world; ++r) {
      RankCoordinates k = L.coordinates(r);
      auto pos = [&](GroupKind kind) {
        const auto g = L.groups(kind)[static_cast<size_t>(L.group_index(kind, r))];
        return static_cast<int>(std::find(g.begin(), g.end(), r) - g.begin());
      };
      EXPECT_EQ(k.tp, pos(GroupKind::Tp));
      EXPECT_EQ(k.pp, pos(GroupKind::Pp));
      EXPECT_EQ(k.dp, pos(GroupKind::Dp));
      EXPECT_EQ(k.cp, pos(GroupKind::Cp));
      EXPECT_EQ(k.ep, pos(GroupKind::Ep));
      EXPECT_EQ(k.expert_tp, pos(GroupKind::ExpertTp));
      EXPECT_EQ(k.expert_dp, pos(GroupKind::ExpertDp));
    }
  }
}

TEST(RankGenerator, OrderErrorsNameTheOrder) {
  auto make = [](std::string order, int ep) {
    return error_of([&] { RankGenerator({.tp = 2, .ep = ep, .dp = 2, .pp = 1, .cp = 1, .order = order}); });
  };
  EXPECT_NE(make("tp-xx-dp", 1).find("unknown dimension 'xx'"), std::string::npos) << make("tp-xx-dp", 1);
  EXPECT_NE(make("tp-dp-tp", 1).find("appears twice"), std::string::npos) << make("tp-dp-tp", 1);
  EXPECT_NE(make("tp-pp", 1).find("does not name dp"), std::string::npos) << make("tp-pp", 1);
  EXPECT_NE(make("tp--dp", 1).find("unknown dimension ''"), std::string::npos) << make("tp--dp", 1);
  EXPECT_EQ(make("TP-DP", 1), "");  // case-insensitive, as Megatron lowers it
  const std::string both = error_of([] { RankGenerator({.tp = 1, .ep = 2, .dp = 1, .pp = 1, .cp = 2}); });
  EXPECT_NE(both.find("ep (2) and cp (2)"), std::string::npos) << both;
  RankGenerator gen({.tp = 2, .ep = 1, .dp = 2, .pp = 1, .cp = 1});
  EXPECT_NE(error_of([&] { gen.get_ranks("tp-xp"); }).find("'xp'"), std::string::npos);
}

}  // namespace
}  // namespace mcpp::parallel_state
