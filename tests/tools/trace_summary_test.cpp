// tools/trace_summary: interval union / intersection and the bubble math on hand-made traces (exact
// numbers, all values exactly representable), JSON parsing errors name the file and event.
#include "mcpp/tools/trace_summary.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "mcpp/core/error.h"

namespace mcpp::tools {
namespace {

TEST(TraceSummary, UnionMergesOverlapsAndTouching) {
  auto u = interval_union({{5, 7}, {0, 2}, {1, 3}, {3, 4}, {10, 10}, {6, 9}});
  ASSERT_EQ(u, (std::vector<Span>{{0, 4}, {5, 9}}));
  EXPECT_EQ(total_length(u), 8.0);
  EXPECT_TRUE(interval_union({}).empty());
}

TEST(TraceSummary, IntersectionBySweep) {
  auto a = interval_union({{0, 4}, {6, 10}});
  auto b = interval_union({{3, 7}, {9, 12}, {20, 30}});
  EXPECT_EQ(intersection_length(a, b), 1.0 + 1.0 + 1.0);  // [3,4] [6,7] [9,10]
  EXPECT_EQ(intersection_length(a, {}), 0.0);
  // Summing durations would give 4 + 4 = 8 here; the union is 6.
  EXPECT_EQ(total_length(interval_union({{0, 4}, {2, 6}})), 6.0);
}

TEST(TraceSummary, TheoreticalBubble) {
  EXPECT_DOUBLE_EQ(theoretical_bubble(2, 4, 1), 1.0 / 5.0);
  EXPECT_DOUBLE_EQ(theoretical_bubble(4, 8, 2), 3.0 / 19.0);
  EXPECT_EQ(theoretical_bubble(1, 8, 1), 0.0);
  EXPECT_THROW(theoretical_bubble(0, 1, 1), Error);
}

nlohmann::json ev(int pid, const char* cat, double ts, double dur, int step) {
  return {{"ph", "X"}, {"pid", pid}, {"tid", 0}, {"name", cat}, {"cat", cat}, {"ts", ts}, {"dur", dur},
          {"args", {{"step", step}, {"stage", pid}}}};
}

TEST(TraceSummary, HandMadeTwoStageTrace) {
  // step 0 spans [0, 100] over both ranks, step 1 spans [200, 250]: span 150.
  nlohmann::json j{{"traceEvents",
                    {{{"ph", "M"}, {"name", "process_name"}, {"pid", 0}},
                     ev(0, "forward", 0, 20, 0), ev(0, "p2p", 10, 30, 0), ev(0, "backward", 60, 40, 0),
                     ev(1, "p2p", 0, 30, 0), ev(1, "forward", 30, 20, 0), ev(1, "backward", 50, 30, 0),
                     ev(0, "forward", 200, 10, 1), ev(0, "forward", 205, 10, 1), ev(1, "backward", 220, 30, 1)}},
                   {"otherData",
                    {{"pipeline_model_parallel_size", 2}, {"num_microbatches", 4},
                     {"virtual_pipeline_model_parallel_size", 1}}}};
  TraceSummary s = summarize(parse_trace(j, "t.json"));
  ASSERT_EQ(s.ranks.size(), 2u);
  const RankStats& r0 = s.ranks[0];
  EXPECT_EQ(r0.span_us, 150.0);
  EXPECT_EQ(r0.forward_us, 20.0 + 15.0);  // [200,210] ∪ [205,215]
  EXPECT_EQ(r0.backward_us, 40.0);
  EXPECT_EQ(r0.p2p_us, 30.0);
  EXPECT_EQ(r0.busy_us, 75.0);
  EXPECT_EQ(r0.overlap_us, 10.0);                  // [10,20]
  EXPECT_EQ(r0.idle_us, 150.0 - (40 + 40 + 15));   // union [0,40] [60,100] [200,215]
  EXPECT_DOUBLE_EQ(r0.bubble, 1.0 - 75.0 / 150.0);
  const RankStats& r1 = s.ranks[1];
  EXPECT_EQ(r1.busy_us, 50.0 + 30.0);
  EXPECT_EQ(r1.overlap_us, 0.0);
  EXPECT_EQ(r1.idle_us, 150.0 - 80.0 - 30.0);
  EXPECT_EQ(s.slowest_pid, 1);
  EXPECT_DOUBLE_EQ(s.theoretical, 0.2);
  const std::string table = format_summary(s);
  EXPECT_NE(table.find("slowest stage: 1"), std::string::npos) << table;
  EXPECT_NE(table.find("theoretical bubble: 0.2000"), std::string::npos) << table;
  EXPECT_NE(table.find("intervals: host time; 2 step(s) summarized\n"), std::string::npos) << table;

  // Leaving step 0 out as warm-up: only step 1's [200, 250] remains.
  const TraceSummary w = summarize(parse_trace(j, "t.json"), 1);
  EXPECT_EQ(w.steps, 1);
  EXPECT_EQ(w.skipped_steps, 1);
  EXPECT_EQ(w.ranks[0].span_us, 50.0);
  EXPECT_EQ(w.ranks[0].busy_us, 15.0);  // [200,210] ∪ [205,215]
  EXPECT_EQ(w.ranks[1].busy_us, 30.0);
  EXPECT_NE(format_summary(w).find("1 step(s) summarized (the first 1 skipped as warm-up)"), std::string::npos);
  try {
    summarize(parse_trace(j, "t.json"), 2);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("skipping 2 warm-up step(s) leaves nothing of the trace's 2"),
              std::string::npos) << e.what();
  }
}

// The collectives row (cat "collective", the timeline's tid 2): its own union and its overlap with compute;
// it never widens a step's window nor counts as idle / busy / p2p, so the bubble stays the schedule's.
TEST(TraceSummary, CollectivesAreMeasuredApartFromTheBubble) {
  nlohmann::json j{{"traceEvents",
                    {ev(0, "forward", 0, 40, 0), ev(0, "backward", 50, 50, 0),
                     ev(0, "collective", 70, 20, 0), ev(0, "collective", 80, 40, 0),  // [70,120]: past the step
                     ev(0, "collective", 300, 10, 1), ev(0, "forward", 200, 20, 1)}}};
  const TraceSummary with = summarize(parse_trace(j, "t.json"));
  j["traceEvents"].erase(4);
  j["traceEvents"].erase(3);
  j["traceEvents"].erase(2);
  const TraceSummary without = summarize(parse_trace(j, "t.json"));
  ASSERT_EQ(with.ranks.size(), 1u);
  const RankStats &a = with.ranks[0], &b = without.ranks[0];
  EXPECT_EQ(a.collective_us, 50.0 + 10.0);             // [70,120] ∪ [300,310]
  EXPECT_EQ(a.collective_overlap_us, 30.0);            // [70,100] of the backward
  EXPECT_EQ(a.span_us, 100.0 + 20.0);                  // windows [0,100] and [200,220], as without them
  EXPECT_EQ(a.span_us, b.span_us);
  EXPECT_EQ(a.idle_us, b.idle_us);
  EXPECT_EQ(a.bubble, b.bubble);
  EXPECT_EQ(a.p2p_us, 0.0);
  EXPECT_EQ(b.collective_us, 0.0);
  ASSERT_EQ(a.calls.size(), 1u);  // ev() names an event after its cat
  EXPECT_EQ(a.calls[0].count, 3);
  EXPECT_EQ(a.calls[0].us, a.collective_us);
  EXPECT_EQ(a.calls[0].overlap_us, 30.0);
  EXPECT_TRUE(b.calls.empty());
  const std::string table = format_summary(with);
  EXPECT_NE(table.find("coll_overlap"), std::string::npos) << table;
  // per step (2 steps): 1.5 calls, 0.030 ms, 0.015 ms overlapped
  EXPECT_NE(table.find("collectives per step:"), std::string::npos) << table;
  const size_t row = table.find("\n    0 collective ");
  ASSERT_NE(row, std::string::npos) << table;
  std::istringstream fields(table.substr(row + 1, table.find('\n', row + 1) - row - 1));
  std::string rank, name;
  double calls = 0, ms = 0, overlap_ms = 0;
  fields >> rank >> name >> calls >> ms >> overlap_ms;
  EXPECT_EQ(name, "collective");
  EXPECT_DOUBLE_EQ(calls, 1.5);
  EXPECT_DOUBLE_EQ(ms, 0.030);
  EXPECT_DOUBLE_EQ(overlap_ms, 0.015);
  EXPECT_EQ(format_summary(without).find("collectives per step"), std::string::npos);
  EXPECT_NE(table.find("0.060        0.030\n"), std::string::npos) << table;  // coll_ms, coll_overlap (ms)
}

TEST(TraceSummary, MalformedTracesNameFileAndEvent) {
  EXPECT_THROW(parse_trace(nlohmann::json::array(), "x.json"), Error);
  try {
    parse_trace({{"traceEvents", {{{"ph", "X"}, {"pid", 0}, {"ts", 1}, {"cat", "forward"}}}}}, "x.json");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x.json: traceEvents[0]: missing or non-numeric 'dur'"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_trace({{"traceEvents", {ev(0, "compute", 0, 1, 0)}}}, "x.json"), Error);
  EXPECT_THROW(read_trace("/nonexistent/trace.json"), Error);
  const std::string bad = testing::TempDir() + "/bad_trace.json";
  std::ofstream(bad) << "{\"traceEvents\": [";
  EXPECT_THROW(read_trace(bad), Error);
}

}  // namespace
}  // namespace mcpp::tools
