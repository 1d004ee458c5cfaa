// Pipeline simulator (src/mcpp/pipeline_parallel/simulator.h): every schedule Megatron's algorithm
// produces runs to completion under rendezvous P2P semantics (no deadlock, every send paired with the
// right recv); with unit costs F = 1, B = 2 per stage:
//   1F1B:        makespan (M + pp - 1) * 3, bubble (pp-1)/(M+pp-1) on every stage,
//                activations in flight min(pp - rank, M);
//   interleaved: F = 1, B = 2 per chunk (a microbatch costs V and 2V per stage), makespan
//                (V*M + pp - 1) * 3 and bubble (pp-1)/(V*M+pp-1) when M is a multiple of pp,
//                activations in flight min(warmup + 1, M*V) chunk-microbatches, warmup =
//                (pp-rank-1)*2 + (V-1)*pp.
// Negative cases: a deadlocking pair, a mismatched tensor, a count mismatch and a compute-before-recv
// each produce an mcpp::Error with the problem named.
#include "mcpp/pipeline_parallel/simulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "mcpp/core/error.h"

namespace mcpp::pipeline_parallel {
namespace {

ScheduleOptions opts(int64_t pp, int64_t M, int64_t V = 1, bool forward_only = false) {
  return ScheduleOptions{.pipeline_model_parallel_size = pp,
                         .num_microbatches = M,
                         .virtual_pipeline_model_parallel_size = V,
                         .forward_only = forward_only};
}

TEST(PipelineSimulator, OneFOneBBubbleAndInFlight) {
  for (int64_t pp : {2, 3, 4, 8}) {
    for (int64_t M : {1, 2, 4, 5, 8, 16}) {
      const SimResult r = simulate(build_all_schedules(opts(pp, M)), {});
      // Integer-valued times: exact comparisons are safe.
      EXPECT_EQ(r.makespan, static_cast<double>((M + pp - 1) * 3)) << "pp=" << pp << " M=" << M;
      for (int64_t s = 0; s < pp; ++s) {
        const StageStats& st = r.stages[static_cast<size_t>(s)];
        EXPECT_EQ(st.busy, static_cast<double>(3 * M));
        EXPECT_NEAR(st.bubble_fraction, theoretical_bubble_fraction(pp, M, 1), 1e-12) << "pp=" << pp << " M=" << M;
        EXPECT_EQ(st.max_in_flight, std::min(pp - s, M)) << "pp=" << pp << " M=" << M << " stage " << s;
      }
    }
  }
}

TEST(PipelineSimulator, InterleavedBubbleAndInFlight) {
  for (int64_t pp : {2, 4}) {
    for (int64_t V : {2, 3, 4}) {
      for (int64_t M : {pp, 2 * pp, 4 * pp}) {
        const SimResult r = simulate(build_all_schedules(opts(pp, M, V)), {});
        EXPECT_EQ(r.makespan, static_cast<double>((V * M + pp - 1) * 3)) << "pp=" << pp << " M=" << M << " V=" << V;
        for (int64_t s = 0; s < pp; ++s) {
          const StageStats& st = r.stages[static_cast<size_t>(s)];
          EXPECT_NEAR(st.bubble_fraction, theoretical_bubble_fraction(pp, M, V), 1e-12)
              << "pp=" << pp << " M=" << M << " V=" << V;
          const int64_t warmup = (pp - s - 1) * 2 + (V - 1) * pp;
          EXPECT_EQ(st.max_in_flight, std::min(warmup + 1, M * V)) << "pp=" << pp << " M=" << M << " V=" << V;
        }
      }
    }
  }
}

TEST(PipelineSimulator, InFlightFormulaMatchesSimulation) {
  struct C {
    int64_t pp, M, V, group;
  };
  const C cases[] = {{1, 4, 1, 0}, {2, 1, 1, 0}, {4, 3, 1, 0}, {4, 8, 1, 0}, {2, 4, 2, 0}, {4, 8, 2, 0},
                     {4, 4, 4, 0}, {2, 5, 2, 3}, {4, 10, 2, 6}, {4, 12, 3, 6}, {3, 9, 3, 0}};
  for (const C& c : cases) {
    for (bool fwd_only : {false, true}) {
      ScheduleOptions o = opts(c.pp, c.M, c.V, fwd_only);
      o.microbatch_group_size_per_vp_stage = c.group;
      const SimResult r = simulate(build_all_schedules(o), {});
      for (int64_t s = 0; s < c.pp; ++s) {
        o.pipeline_model_parallel_rank = s;
        EXPECT_EQ(r.stages[static_cast<size_t>(s)].max_in_flight, max_activations_in_flight(o))
            << "pp=" << c.pp << " M=" << c.M << " V=" << c.V << " group=" << c.group << " rank " << s
            << " fwd_only=" << fwd_only;
      }
    }
  }
}

TEST(PipelineSimulator, EventsPp2M1) {
  // Rank 0: F0 [0,1), send_forward [1,1] (rank 1's recv is already posted), recv_backward blocked from 1
  // until rank 1 posts its send_backward at 1 + 1 + 2 = 4, B0 [4,6).
  const std::vector<Schedule> s = build_all_schedules(opts(2, 1));
  ASSERT_EQ(to_string(s[0]), "F0.0 send_forward(sn=0.0) recv_backward(rn=0.0) B0.0");
  const SimResult r = simulate(s, {});
  const auto& ev = r.stages[0].events;
  ASSERT_EQ(ev.size(), 4u);
  const double want[4][2] = {{0, 1}, {1, 1}, {1, 4}, {4, 6}};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(ev[i].action, i);
    EXPECT_EQ(ev[i].start, want[i][0]) << i;
    EXPECT_EQ(ev[i].end, want[i][1]) << i;
  }
  EXPECT_EQ(r.stages[1].finish, 4.0);  // rank 1: recv [0,1], F [1,2), B [2,4), send_backward [4,4]
  EXPECT_EQ(r.makespan, 6.0);
}

TEST(PipelineSimulator, InterleavingBeatsOneFOneB) {
  // Same model cost per microbatch: 1F1B with F=V, B=2V per stage vs interleaved with 1, 2 per chunk.
  const SimResult plain = simulate(build_all_schedules(opts(4, 8)), SimCosts{.forward = 4, .backward = 8});
  const SimResult inter = simulate(build_all_schedules(opts(4, 8, 4)), {});
  EXPECT_LT(inter.makespan, plain.makespan);
  EXPECT_LT(inter.stages[0].bubble_fraction, plain.stages[0].bubble_fraction);
}

TEST(PipelineSimulator, GroupedAndForwardOnlySchedulesComplete) {
  ScheduleOptions g = opts(4, 10, 2);
  g.microbatch_group_size_per_vp_stage = 6;
  EXPECT_NO_THROW(simulate(build_all_schedules(g), {}));
  g = opts(2, 5, 3);
  g.microbatch_group_size_per_vp_stage = 3;
  EXPECT_NO_THROW(simulate(build_all_schedules(g), {}));
  for (int64_t V : {1, 2}) {
    const SimResult r = simulate(build_all_schedules(opts(4, 8, V, true)), {});
    for (const StageStats& st : r.stages) {
      EXPECT_EQ(st.busy, static_cast<double>(8 * V));
      EXPECT_EQ(st.max_in_flight, 0);  // nothing kept for a backward
    }
  }
  EXPECT_NO_THROW(simulate(build_all_schedules(opts(1, 4)), {}));
}

Action comm(std::optional<TensorId> sn, std::optional<TensorId> sp, std::optional<TensorId> rp,
            std::optional<TensorId> rn) {
  Action a;
  a.kind = ActionKind::Comm;
  a.send_next = sn;
  a.send_prev = sp;
  a.recv_prev = rp;
  a.recv_next = rn;
  return a;
}

void expect_sim_error(const std::vector<Schedule>& s, const char* needle) {
  try {
    simulate(s, {});
    ADD_FAILURE() << "no error, wanted: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(PipelineSimulator, DetectsDeadlock) {
  const TensorId t{0, 0};
  // Rank 0 waits for the grad before sending the activation rank 1 needs to produce it.
  std::vector<Schedule> s = {
      {Action::forward(0, 0), comm({}, {}, {}, t), comm(t, {}, {}, {}), Action::backward(0, 0)},
      {comm({}, {}, t, {}), Action::forward(0, 0), Action::backward(0, 0), comm({}, t, {}, {})},
  };
  expect_sim_error(s, "deadlock");
  // The same ops in Megatron's order complete.
  s[0] = {Action::forward(0, 0), comm(t, {}, {}, {}), comm({}, {}, {}, t), Action::backward(0, 0)};
  EXPECT_NO_THROW(simulate(s, {}));
}

TEST(PipelineSimulator, DetectsMismatches) {
  const TensorId a{0, 0}, b{1, 0};
  // Sent 0 then 1; the receiver expects 1 first.
  std::vector<Schedule> s = {
      {Action::forward(0, 0), comm(a, {}, {}, {}), Action::forward(1, 0), comm(b, {}, {}, {})},
      {comm({}, {}, b, {}), comm({}, {}, a, {}), Action::forward(1, 0), Action::forward(0, 0)},
  };
  expect_sim_error(s, "expects 1.0");
  // One send, no recv.
  s[1] = {};
  expect_sim_error(s, "but rank 1 receives 0");
  // Forward before its input arrived.
  s = {{Action::forward(0, 0), comm(a, {}, {}, {})}, {Action::forward(0, 0), comm({}, {}, a, {})}};
  expect_sim_error(s, "before receiving its input");
}

}  // namespace
}  // namespace mcpp::pipeline_parallel
