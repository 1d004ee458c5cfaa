// Pipeline schedules (src/mcpp/pipeline_parallel/schedules.h) checked three ways:
//   1. hand-derived sequences from Megatron's algorithm (1F1B pp=2 M=3 in full, pp=4 M=8 compute order
//      for every rank, interleaved pp=2 M=4 V=2 compute order for both ranks);
//   2. tests/oracle/pipeline/megatron_schedule.py — a Python transcription of Megatron's loops that
//      labels received tensors through Megatron's own list bookkeeping — for many (pp, M, V, group,
//      forward-only), every rank, every action including the P2P calls and the tensors they carry;
//   3. the simulator (simulator_test.cpp) for deadlock freedom, bubble and in-flight counts.
// Plus the validation errors (they must name num_microbatches / pipeline size / virtual stages).
#include "mcpp/pipeline_parallel/schedules.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>

#include "mcpp/core/error.h"
#include "tests/oracle/oracle_python.h"

namespace mcpp::pipeline_parallel {
namespace {

ScheduleOptions opts(int64_t pp, int64_t rank, int64_t M, int64_t V = 1, bool forward_only = false) {
  return ScheduleOptions{.pipeline_model_parallel_size = pp,
                         .pipeline_model_parallel_rank = rank,
                         .num_microbatches = M,
                         .virtual_pipeline_model_parallel_size = V,
                         .forward_only = forward_only};
}

// Only the Forward / Backward actions, e.g. "F0.0 F1.0 B0.0".
std::string compute_order(const Schedule& s) {
  Schedule c;
  for (const Action& a : s) {
    if (a.kind != ActionKind::Comm) c.push_back(a);
  }
  return to_string(c);
}

TEST(Schedules, OneFOneBFullSequencePp2M3) {
  // Rank 0: warmup 1, steady 2, cooldown 1. Rank 1 (last): warmup 0; its sends to next are no-ops.
  EXPECT_EQ(to_string(build_schedule(opts(2, 0, 3))),
            "F0.0 send_forward(sn=0.0) "
            "F1.0 send_forward_recv_backward(sn=1.0,rn=0.0) B0.0 "
            "F2.0 send_forward_recv_backward(sn=2.0,rn=1.0) B1.0 "
            "recv_backward(rn=2.0) B2.0");
  EXPECT_EQ(to_string(build_schedule(opts(2, 1, 3))),
            "recv_forward(rp=0.0) F0.0 B0.0 send_backward_recv_forward(sp=0.0,rp=1.0) "
            "F1.0 B1.0 send_backward_recv_forward(sp=1.0,rp=2.0) "
            "F2.0 B2.0 send_backward(sp=2.0)");
}

TEST(Schedules, OneFOneBComputeOrderPp4M8) {
  // warmup = pp - rank - 1; steady F(w+i) B(i); cooldown the last w backwards.
  EXPECT_EQ(compute_order(build_schedule(opts(4, 0, 8))),
            "F0.0 F1.0 F2.0 F3.0 B0.0 F4.0 B1.0 F5.0 B2.0 F6.0 B3.0 F7.0 B4.0 B5.0 B6.0 B7.0");
  EXPECT_EQ(compute_order(build_schedule(opts(4, 1, 8))),
            "F0.0 F1.0 F2.0 B0.0 F3.0 B1.0 F4.0 B2.0 F5.0 B3.0 F6.0 B4.0 F7.0 B5.0 B6.0 B7.0");
  EXPECT_EQ(compute_order(build_schedule(opts(4, 2, 8))),
            "F0.0 F1.0 B0.0 F2.0 B1.0 F3.0 B2.0 F4.0 B3.0 F5.0 B4.0 F6.0 B5.0 F7.0 B6.0 B7.0");
  EXPECT_EQ(compute_order(build_schedule(opts(4, 3, 8))),
            "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 B3.0 F4.0 B4.0 F5.0 B5.0 F6.0 B6.0 F7.0 B7.0");
  for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(num_warmup_microbatches(opts(4, r, 8)), 3 - r);
  EXPECT_EQ(num_warmup_microbatches(opts(4, 0, 2)), 2);  // capped by M
}

TEST(Schedules, InterleavedComputeOrderPp2M4V2) {
  // table (group = pp = 2): (0,0) (1,0) (0,1) (1,1) (2,0) (3,0) (2,1) (3,1); backward chunk = V-1-chunk.
  // warmup rank 0 = (2-0-1)*2 + (2-1)*2 = 4, rank 1 = 2.
  EXPECT_EQ(num_warmup_microbatches(opts(2, 0, 4, 2)), 4);
  EXPECT_EQ(num_warmup_microbatches(opts(2, 1, 4, 2)), 2);
  EXPECT_EQ(compute_order(build_schedule(opts(2, 0, 4, 2))),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(compute_order(build_schedule(opts(2, 1, 4, 2))),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  // The ring: rank 1's chunk-0 output goes to rank 0 chunk 1; rank 0 receives it as 0.1.
  const std::string r0 = to_string(build_schedule(opts(2, 0, 4, 2)));
  EXPECT_NE(r0.find("F1.0 send_forward_recv_forward(sn=1.0,rp=0.1)"), std::string::npos) << r0;
}

TEST(Schedules, InterleavedTableWithGroups) {
  // Megatron's docstring example: PP2, N=3 (group), M=5, VP2.
  std::string s;
  for (const TensorId& t : interleaved_schedule_table(5, 2, 3)) s += std::to_string(t.microbatch) + std::to_string(t.chunk) + " ";
  EXPECT_EQ(s, "00 10 20 01 11 21 30 40 31 41 ");
}

TEST(Schedules, NoPipeliningAndSelection) {
  EXPECT_EQ(to_string(build_schedule(opts(1, 0, 3))), "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0");
  EXPECT_EQ(to_string(build_schedule(opts(1, 0, 3, 1, true))), "F0.0 F1.0 F2.0");
  EXPECT_EQ(get_forward_backward_func(opts(1, 0, 4)), ScheduleKind::NoPipelining);
  EXPECT_EQ(get_forward_backward_func(opts(2, 0, 4)), ScheduleKind::WithoutInterleaving);
  EXPECT_EQ(get_forward_backward_func(opts(2, 0, 4, 2)), ScheduleKind::WithInterleaving);
}

TEST(Schedules, ForwardOnlyHasNoBackward) {
  for (int64_t V : {1, 2}) {
    for (int64_t r = 0; r < 4; ++r) {
      const Schedule s = build_schedule(opts(4, r, 8, V, true));
      int64_t f = 0;
      for (const Action& a : s) {
        EXPECT_NE(a.kind, ActionKind::Backward);
        EXPECT_FALSE(a.send_prev || a.recv_next) << to_string(a);
        f += a.kind == ActionKind::Forward;
      }
      EXPECT_EQ(f, 8 * V);
    }
  }
}

void expect_error(const ScheduleOptions& o, std::initializer_list<const char*> needles) {
  try {
    build_schedule(o);
    ADD_FAILURE() << "no error for pp=" << o.pipeline_model_parallel_size << " M=" << o.num_microbatches;
  } catch (const Error& e) {
    for (const char* n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(Schedules, InterleavingConstraintErrors) {
  // M % pp != 0 with the default group size: last group of 2 < pp = 4.
  expect_error(opts(4, 0, 6, 2), {"num_microbatches=6", "pipeline_model_parallel_size=4", "virtual stages=2"});
  // M < pp.
  expect_error(opts(4, 0, 2, 2), {"num_microbatches=2", "pipeline_model_parallel_size=4", "virtual stages=2"});
  // Group size outside [pp, M].
  ScheduleOptions g = opts(4, 0, 8, 2);
  g.microbatch_group_size_per_vp_stage = 3;
  expect_error(g, {"microbatch_group_size_per_vp_stage=3"});
  // A larger group makes M % pp != 0 legal when the remainder is >= pp: M=10, group 6, remainder 4.
  g.num_microbatches = 10;
  g.microbatch_group_size_per_vp_stage = 6;
  EXPECT_NO_THROW(build_schedule(g));
  expect_error(opts(4, 4, 8), {"pipeline_model_parallel_rank 4"});
  expect_error(opts(4, 0, 0), {"num_microbatches must be >= 1"});
  expect_error(opts(1, 0, 4, 2), {"need pipeline_model_parallel_size > 1"});
}

// ---- oracle -------------------------------------------------------------------------------------

struct OracleCase {
  int64_t pp, M, V, group;
  bool forward_only;
};

std::vector<std::string> run_oracle(const OracleCase& c, int* exit_code) {
  const std::string cmd = mcpp::test::oracle_python() + MCPP_SOURCE_DIR +
                          "/tests/oracle/pipeline/megatron_schedule.py " +
                          std::to_string(c.pp) + " " + std::to_string(c.M) + " " + std::to_string(c.V) + " " +
                          std::to_string(c.group) + " " + (c.forward_only ? "1" : "0");
  FILE* f = popen(cmd.c_str(), "r");
  EXPECT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  const int st = pclose(f);
  *exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::vector<std::string> lines;
  std::istringstream is(out);
  for (std::string line; std::getline(is, line);) lines.push_back(line);
  return lines;
}

TEST(Schedules, MatchesMegatronTranscription) {
  const OracleCase cases[] = {
      {2, 1, 1, 0, false}, {2, 3, 1, 0, false}, {4, 1, 1, 0, false}, {4, 2, 1, 0, false},
      {4, 8, 1, 0, false}, {3, 5, 1, 0, false}, {8, 16, 1, 0, false}, {4, 8, 1, 0, true},
      {4, 2, 1, 0, true},  {2, 4, 2, 0, false}, {2, 2, 2, 0, false}, {4, 8, 2, 0, false},
      {4, 4, 2, 0, false}, {4, 8, 3, 0, false}, {2, 2, 4, 0, false}, {3, 6, 2, 0, false},
      {4, 4, 4, 0, false}, {2, 5, 2, 3, false}, {4, 10, 2, 6, false}, {4, 12, 3, 6, false},
      {4, 8, 2, 0, true},  {2, 4, 2, 0, true},  {2, 5, 2, 3, true},
  };
  for (const OracleCase& c : cases) {
    int rc = 0;
    const auto lines = run_oracle(c, &rc);
    ASSERT_EQ(rc, 0) << "oracle failed for pp=" << c.pp << " M=" << c.M << " V=" << c.V;
    ASSERT_EQ(static_cast<int64_t>(lines.size()), c.pp);
    for (int64_t r = 0; r < c.pp; ++r) {
      ScheduleOptions o = opts(c.pp, r, c.M, c.V, c.forward_only);
      o.microbatch_group_size_per_vp_stage = c.group;
      EXPECT_EQ(std::to_string(r) + "\t" + to_string(build_schedule(o)), lines[static_cast<size_t>(r)])
          << "pp=" << c.pp << " M=" << c.M << " V=" << c.V << " group=" << c.group << " fwd_only=" << c.forward_only;
    }
  }
}

TEST(Schedules, OracleAgreesOnRejectedInterleavings) {
  // The constraint check is Megatron's: the transcription rejects the same configurations.
  const OracleCase bad[] = {{4, 6, 2, 0, false}, {4, 2, 2, 0, false}, {4, 10, 2, 4, false}};
  for (const OracleCase& c : bad) {
    int rc = 0;
    run_oracle(c, &rc);
    EXPECT_EQ(rc, 3) << "pp=" << c.pp << " M=" << c.M;
    ScheduleOptions o = opts(c.pp, 0, c.M, c.V);
    o.microbatch_group_size_per_vp_stage = c.group;
    EXPECT_THROW(build_schedule(o), Error);
  }
}

}  // namespace
}  // namespace mcpp::pipeline_parallel
