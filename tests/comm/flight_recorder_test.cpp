// FlightRecorder: ring retention and ids, state transitions, JSON dump schema (flight_recorder.h).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "mcpp/comm/flight_recorder.h"
#include "mcpp/core/error.h"

namespace mcpp::comm {
namespace {

RecordEntry entry(uint64_t seq, const std::string& op = "all_reduce") {
  RecordEntry e;
  e.group = "dp";
  e.group_ranks = {1, 3};
  e.seq = seq;
  e.op = op;
  e.reduce_op = "sum";
  e.dtype = "float32";
  e.count = static_cast<int64_t>(seq) * 10;
  return e;
}

TEST(FlightRecorder, RingKeepsTheNewestEntries) {
  FlightRecorder rec(1, 4, 4);
  std::vector<uint64_t> ids;
  for (uint64_t s = 1; s <= 10; ++s) ids.push_back(rec.record(entry(s)));
  EXPECT_EQ(ids.front(), 0u);
  EXPECT_EQ(ids.back(), 9u);
  EXPECT_EQ(rec.total_recorded(), 10u);
  auto e = rec.entries();
  ASSERT_EQ(e.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(e[i].id, 6 + i) << "oldest first";
    EXPECT_EQ(e[i].seq, 7 + i);
  }
  rec.mark_done(2);  // overwritten: ignored, must not touch the entry now in that slot
  EXPECT_EQ(rec.pending().size(), 4u);
  EXPECT_THROW(FlightRecorder(0, 1, 0), Error);
}

// ensure_capacity grows the ring keeping every entry it holds (ids, states), never shrinks; later records
// fill the larger ring before overwriting; marks on kept entries still land.
TEST(FlightRecorder, GrowingTheRingKeepsItsEntries) {
  FlightRecorder rec(0, 1, 3);
  for (uint64_t s = 1; s <= 5; ++s) rec.record(entry(s));  // ids 0..4; the ring holds 2, 3, 4
  rec.mark_done(3);
  rec.ensure_capacity(2);  // smaller: no-op
  EXPECT_EQ(rec.capacity(), 3u);
  rec.ensure_capacity(8);
  EXPECT_EQ(rec.capacity(), 8u);
  auto e = rec.entries();
  ASSERT_EQ(e.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(e[i].id, 2 + i);
  EXPECT_EQ(e[1].state, EntryState::Done);
  rec.mark_done(4);
  for (uint64_t s = 6; s <= 10; ++s) rec.record(entry(s));  // ids 5..9: 8 kept (2..9), nothing lost yet
  e = rec.entries();
  ASSERT_EQ(e.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(e[i].id, 2 + i) << "oldest first";
  EXPECT_EQ(e[2].state, EntryState::Done);
  e = rec.entries(7);  // from an id on: 7, 8, 9
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e.front().id, 7u);
  EXPECT_EQ(rec.entries(0).size(), 8u) << "from before the oldest kept: all kept";
  EXPECT_TRUE(rec.entries(10).empty());
  rec.record(entry(11));  // id 10 overwrites id 2
  e = rec.entries();
  ASSERT_EQ(e.size(), 8u);
  EXPECT_EQ(e.front().id, 3u);
  EXPECT_EQ(e.back().id, 10u);
  rec.mark_done(2);  // overwritten: ignored
  EXPECT_EQ(rec.entries().front().state, EntryState::Done);  // id 3, marked before the growth
}

TEST(FlightRecorder, StatesAndTimestamps) {
  FlightRecorder rec(0, 2);
  uint64_t a = rec.record(entry(1)), b = rec.record(entry(2)), c = rec.record(entry(3));
  auto e = rec.entries();
  EXPECT_EQ(e[0].state, EntryState::Queued);
  EXPECT_GT(e[0].start_steady_ns, 0);
  EXPECT_GT(e[0].start_wall_us, 0);
  EXPECT_EQ(e[0].end_steady_ns, 0);
  rec.mark_started(a);
  rec.mark_started(b);
  rec.mark_done(a);
  rec.mark_failed(c);
  rec.mark_started(a);  // done stays done
  e = rec.entries();
  EXPECT_EQ(e[0].state, EntryState::Done);
  EXPECT_GE(e[0].end_steady_ns, e[0].start_steady_ns);
  EXPECT_EQ(e[1].state, EntryState::Started);
  EXPECT_EQ(e[2].state, EntryState::Failed);
  auto p = rec.pending();
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].id, b);
}

// set_context stamps the entries recorded after it (hang forensics: iteration, microbatch, stage, chunk).
TEST(FlightRecorder, EntriesCarryTheTrainingContext) {
  FlightRecorder rec(0, 2, 16);
  const uint64_t before = rec.record(entry(1));
  rec.set_context({.iteration = 7, .microbatch = 3, .pp_stage = 1, .vp_chunk = 0});
  const uint64_t after = rec.record(entry(2));
  const auto es = rec.entries();
  ASSERT_EQ(es.size(), 2u);
  EXPECT_EQ(es[0].id, before);
  EXPECT_EQ(es[0].context.iteration, -1);
  EXPECT_EQ(es[1].id, after);
  const nlohmann::json j = entry_to_json(es[1]);
  EXPECT_EQ(j["iteration"], 7);
  EXPECT_EQ(j["microbatch"], 3);
  EXPECT_EQ(j["pp_stage"], 1);
  EXPECT_EQ(j["vp_chunk"], 0);
}

TEST(FlightRecorder, DumpJsonFollowsTheSchema) {
  FlightRecorder rec(3, 8, 16);
  uint64_t id = rec.record(entry(1));
  rec.mark_started(id);
  auto path = std::filesystem::temp_directory_path() / "mcpp_fr_test_rank_3.json";
  rec.dump_to_file(path.string(), "unit test");
  std::ifstream f(path);
  auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["rank"], 3);
  EXPECT_EQ(j["world_size"], 8);
  EXPECT_EQ(j["capacity"], 16);
  EXPECT_EQ(j["total_recorded"], 1);
  EXPECT_EQ(j["reason"], "unit test");
  ASSERT_EQ(j["entries"].size(), 1u);
  const auto& e = j["entries"][0];
  EXPECT_EQ(e["group"], "dp");
  EXPECT_EQ(e["group_ranks"], (std::vector<int>{1, 3}));
  EXPECT_EQ(e["seq"], 1);
  EXPECT_EQ(e["op"], "all_reduce");
  EXPECT_EQ(e["dtype"], "float32");
  EXPECT_EQ(e["count"], 10);
  EXPECT_EQ(e["state"], "started");
  EXPECT_EQ(e["iteration"], -1) << "no training context set";
  EXPECT_EQ(e["payload_checksum"], "") << "checksums are off by default";
  EXPECT_EQ(e.size(), 21u) << e.dump();
  std::filesystem::remove(path);
  EXPECT_THROW(rec.dump_to_file("/nonexistent_dir_mcpp/x.json", "r"), Error);
}

}  // namespace
}  // namespace mcpp::comm
