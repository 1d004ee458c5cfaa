// training/timeline: recorder events -> merged trace JSON -> file -> tools::read_trace round trip; the
// bubble report of a hand-made trace; the clock (host / device) named in both.
#include "mcpp/training/timeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/core/device_memory.h"
#include "mcpp/core/error.h"
#include "mcpp/tools/trace_summary.h"

namespace mcpp::timeline {
namespace {

using pipeline_parallel::Action;

TEST(Timeline, EventsTraceFileRoundTrip) {
  TimelineRecorder rec(1, 1);
  auto* t = rec.begin_step();
  const auto o = std::chrono::steady_clock::now();  // after construction: ts >= 0
  using us = std::chrono::microseconds;
  Action comm{pipeline_parallel::ActionKind::Comm, -1, -1, std::nullopt, std::nullopt,
              pipeline_parallel::TensorId{0, 0}, std::nullopt};
  t->push_back({comm, o + us(0), o + us(5)});
  t->push_back({Action::forward(0, 0), o + us(5), o + us(15)});
  rec.begin_step();
  t->push_back({Action::backward(0, 0), o + us(100), o + us(130)});
  const nlohmann::json evs = rec.events();
  ASSERT_EQ(evs.size(), 3u);
  EXPECT_EQ(evs[0]["name"], "recv_forward");
  EXPECT_EQ(evs[0]["cat"], "p2p");
  EXPECT_EQ(evs[0]["tid"], 1);
  EXPECT_EQ(evs[1]["name"], "F0.0");
  EXPECT_EQ(evs[1]["args"]["microbatch"], 0);
  EXPECT_EQ(evs[2]["name"], "B0.0");
  EXPECT_EQ(evs[2]["args"]["step"], 1);
  EXPECT_DOUBLE_EQ(evs[2]["dur"].get<double>(), 30.0);

  const nlohmann::json trace = make_trace({nlohmann::json::array(), evs}, {0, 1}, {2, 4, 1});
  const std::string path = testing::TempDir() + "/timeline_rt.json";
  std::ofstream(path) << trace.dump();
  const tools::Trace back = tools::read_trace(path);
  ASSERT_EQ(back.events.size(), 3u);
  EXPECT_EQ(back.events[1].name, "F0.0");
  EXPECT_EQ(back.events[1].pid, 1);
  EXPECT_EQ(back.events[2].step, 1);
  EXPECT_EQ(back.events[2].cat, tools::EventCat::Backward);
  EXPECT_DOUBLE_EQ(back.events[2].ts - back.events[1].ts, 95.0);
  EXPECT_EQ(back.other_data["num_microbatches"], 4);
}

TEST(Timeline, BubbleReportAveragesRanksOfAStage) {
  auto x = [](int pid, int stage, const char* cat, double ts, double dur) {
    return nlohmann::json{{"ph", "X"}, {"pid", pid}, {"tid", 0}, {"name", "e"}, {"cat", cat}, {"ts", ts},
                          {"dur", dur}, {"args", {{"step", 0}, {"stage", stage}}}};
  };
  // span [0, 100]; stage 0 ranks busy 50 and 70 -> bubbles 0.5, 0.3 -> 0.4; stage 1 busy 100 -> 0.
  nlohmann::json evs0{x(0, 0, "forward", 0, 50)}, evs1{x(1, 0, "backward", 0, 70)}, evs2{x(2, 1, "forward", 0, 100)};
  const nlohmann::json report = bubble_report(make_trace({evs0, evs1, evs2}, {0, 0, 1}, {2, 4, 1}));
  EXPECT_EQ(report["event"], "pipeline_bubble");
  EXPECT_DOUBLE_EQ(report["theoretical"].get<double>(), 0.2);
  ASSERT_EQ(report["stages"].size(), 2u);
  EXPECT_DOUBLE_EQ(report["stages"][0]["measured"].get<double>(), 0.4);
  EXPECT_EQ(report["stages"][0]["ranks"], 2);
  EXPECT_DOUBLE_EQ(report["stages"][1]["measured"].get<double>(), 0.0);
  EXPECT_NE(format_bubble_report(report).find("0.4000"), std::string::npos);
}

TEST(Timeline, TheClockIsNamedInTheTraceAndTheReport) {
  const nlohmann::json evs{{{"ph", "X"}, {"pid", 0}, {"tid", 0}, {"name", "F0.0"}, {"cat", "forward"}, {"ts", 0.0},
                            {"dur", 10.0}, {"args", {{"step", 0}, {"stage", 0}}}}};
  const nlohmann::json host = make_trace({evs}, {0}, {1, 1, 1});
  EXPECT_EQ(host["otherData"]["clock"], "host");
  EXPECT_EQ(bubble_report(host)["clock"], "host");
  const nlohmann::json device = make_trace({evs}, {0}, {1, 1, 1, "device"});
  const nlohmann::json report = bubble_report(device);
  EXPECT_EQ(report["clock"], "device");
  const std::string text = format_bubble_report(report);
  EXPECT_NE(text.find("(device time, 1 step(s);"), std::string::npos) << text;
  TimelineRecorder cpu(0, 0);
  EXPECT_EQ(cpu.device_clock(), nullptr);
  EXPECT_STREQ(cpu.clock_name(), "host");
}

// The collectives row: calls recorded between begin_step and end_step (here on a local world's flight
// recorder) become tid-2 "collective" events of that step, named "<op> <group>" with the group's seq;
// calls outside a step (between end_step and the next begin_step) are not in it; host time on CPU.
TEST(Timeline, CollectivesOfAStepAreItsOwn) {
  comm::CommPtr world = comm::make_local_world();
  TimelineRecorder rec(0, 0);
  rec.start(*world);
  Tensor t = Tensor::zeros({4});
  auto* timings = rec.begin_step();
  const auto o = std::chrono::steady_clock::now();
  timings->push_back({Action::forward(0, 0), o, o + std::chrono::microseconds(10)});
  world->all_reduce(t, comm::ReduceOp::Sum).wait();
  world->broadcast(t, 0).wait();
  rec.end_step();
  world->all_reduce(t, comm::ReduceOp::Sum).wait();  // e.g. evaluation: outside any training step
  rec.begin_step();
  world->all_reduce(t, comm::ReduceOp::Sum).wait();
  rec.end_step();
  std::vector<nlohmann::json> coll;
  for (const auto& e : rec.events())
    if (e["tid"] == 2) coll.push_back(e);
  ASSERT_EQ(coll.size(), 3u);
  EXPECT_EQ(coll[0]["name"], "all_reduce world");
  EXPECT_EQ(coll[0]["cat"], "collective");
  EXPECT_EQ(coll[0]["args"]["step"], 0);
  EXPECT_EQ(coll[0]["args"]["seq"], 2);  // start()'s barrier was the group's first
  EXPECT_EQ(coll[0]["args"]["count"], 4);
  EXPECT_EQ(coll[0]["args"]["reduce_op"], "sum");
  EXPECT_EQ(coll[1]["name"], "broadcast world");
  EXPECT_EQ(coll[2]["args"]["step"], 1);
  EXPECT_EQ(coll[2]["args"]["seq"], 5) << "the call between the steps (seq 4) is not in the trace";
  for (const auto& e : coll) EXPECT_GE(e["dur"].get<double>(), 0.0);
  EXPECT_GE(coll[0]["ts"].get<double>(), 0.0);
  EXPECT_LE(coll[0]["ts"].get<double>(), coll[1]["ts"].get<double>());
  EXPECT_EQ(rec.comm_dropped(), 0);
  const nlohmann::json trace = make_trace({rec.events()}, {0}, {1, 1, 1});
  bool named = false;
  for (const auto& e : trace["traceEvents"])
    named = named || (e["ph"] == "M" && e.value("tid", -1) == 2 && e["args"]["name"] == "collectives");
  EXPECT_TRUE(named);
  double longest = 0.0, sum = 0.0;
  for (const auto& e : coll) longest = std::max(longest, e["dur"].get<double>()), sum += e["dur"].get<double>();
  const double union_us = tools::summarize(tools::parse_trace(trace, "t")).ranks.at(0).collective_us;
  EXPECT_GE(union_us, longest);
  EXPECT_LE(union_us, sum + 1e-9);
}

// A step whose calls outnumber the (grown) flight-recorder ring: the overwritten ones are counted, not invented.
TEST(Timeline, CollectivesOverwrittenInTheRingAreCounted) {
  comm::CommPtr world = comm::make_local_world(/*recorder_capacity=*/2);
  TimelineRecorder rec(0, 0, /*device_time=*/false, /*comm_ring=*/4);
  rec.start(*world);
  EXPECT_EQ(world->recorder()->capacity(), 4u) << "start() grows the ring";
  Tensor t = Tensor::zeros({2});
  rec.begin_step();
  for (int i = 0; i < 10; ++i) world->all_reduce(t, comm::ReduceOp::Sum).wait();
  rec.end_step();
  int64_t coll = 0;
  for (const auto& e : rec.events()) coll += e["tid"] == 2 ? 1 : 0;
  EXPECT_EQ(coll, 4);
  EXPECT_EQ(rec.comm_dropped(), 6);
}

TEST(Timeline, DeviceTimeWithoutAGpuIsANamedError) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present (tests/cuda/device_clock_test.cpp covers it)";
  try {
    TimelineRecorder rec(0, 0, /*device_time=*/true);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mcpp::timeline
