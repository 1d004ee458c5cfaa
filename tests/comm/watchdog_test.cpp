// Watchdog in one process (LocalCommunicator world): timeout -> dump + one named error + abort callback;
// abort marker from "another rank" -> dump + callback; dump comparison names the ranks that never
// entered; the env override of the timeout. The multi-rank MPI_Abort path is tests/comm/watchdog_check.py.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/comm/watchdog.h"
#include "mcpp/core/error.h"

namespace mcpp::comm {
namespace {

namespace fs = std::filesystem;

struct AbortSpy {
  std::mutex mu;
  int calls = 0, code = 0;
  std::string message;
  std::function<void(int, const std::string&)> fn() {
    return [this](int c, const std::string& m) {
      std::lock_guard<std::mutex> lock(mu);
      ++calls;
      code = c;
      message = m;
    };
  }
  bool wait_called(double seconds) {
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (calls) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
};

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("mcpp_watchdog_" + name);
  fs::remove_all(d);
  return d;
}

TEST(Watchdog, TimeoutDumpsNamesTheCollectiveAndAborts) {
  CommPtr w = make_local_world();
  AbortSpy spy;
  fs::path dir = fresh_dir("timeout");
  Watchdog dog(w, {.timeout_seconds = 0.3, .dump_dir = dir.string(), .poll_seconds = 0.02, .grace_seconds = 0.5,
                   .on_abort = spy.fn()});
  Tensor t = Tensor::zeros({4});
  w->all_reduce(t, ReduceOp::Sum).wait();  // completes: never reported
  RecordEntry stuck;  // a collective that never completes (what a hung backend leaves behind)
  stuck.group = "world";
  stuck.group_ranks = {0};
  stuck.seq = 3;
  stuck.op = "all_gather";
  stuck.dtype = "float32";
  stuck.count = 12;
  w->recorder()->mark_started(w->recorder()->record(stuck));
  ASSERT_TRUE(spy.wait_called(5.0)) << "watchdog did not fire";
  EXPECT_EQ(spy.code, 3);
  EXPECT_NE(spy.message.find("distributed timeout: all_gather (group 'world' ranks [0], seq 3, float32, 12 elements) "
                             "did not complete within 0.3 s on rank 0; every member entered it"),
            std::string::npos)
      << spy.message;
  EXPECT_TRUE(dog.fired());
  std::ifstream f(dir / "flight_recorder" / "rank_0.json");
  ASSERT_TRUE(f) << "no dump";
  auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["entries"].back()["op"], "all_gather");
  EXPECT_EQ(j["entries"].back()["state"], "started");
  EXPECT_TRUE(fs::exists(dog.marker_path())) << "leader leaves the abort marker for the other ranks";
}

TEST(Watchdog, AbortMarkerMakesAnIdleRankDumpAndAbort) {
  CommPtr w = make_local_world();
  AbortSpy spy;
  fs::path dir = fresh_dir("marker");
  Watchdog dog(w, {.timeout_seconds = 60, .dump_dir = dir.string(), .poll_seconds = 0.02, .grace_seconds = 0.2,
                   .follower_extra_seconds = 0.2, .on_abort = spy.fn()});
  std::ofstream(dog.marker_path()) << "{\"leader\": 5}\n";  // another rank timed out
  ASSERT_TRUE(spy.wait_called(5.0));
  EXPECT_TRUE(fs::exists(dog.dump_path()));
  EXPECT_NE(spy.message.find("aborting after another rank's timeout"), std::string::npos) << spy.message;
}

TEST(Watchdog, StaleMarkerOfAnEarlierRunIsIgnored) {
  CommPtr w = make_local_world();
  AbortSpy spy;
  fs::path dir = fresh_dir("stale");
  fs::create_directories(dir / "flight_recorder");
  std::ofstream(dir / "flight_recorder" / "abort_1234") << "old\n";
  {
    Watchdog dog(w, {.timeout_seconds = 60, .dump_dir = dir.string(), .poll_seconds = 0.02, .on_abort = spy.fn()});
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(spy.calls, 0);
}

nlohmann::json dump_with(const std::vector<std::tuple<uint64_t, std::string, std::string>>& seq_op_state) {
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& [seq, op, state] : seq_op_state) {
    RecordEntry e;
    e.group = "tp";
    e.group_ranks = {4, 5, 6, 7};
    e.seq = seq;
    e.op = op;
    e.state = state == "done" ? EntryState::Done : EntryState::Started;
    entries.push_back(entry_to_json(e));
  }
  return nlohmann::json{{"entries", entries}};
}

TEST(Watchdog, AnalyzeDumpsFindsRanksThatNeverEntered) {
  RecordEntry stuck;
  stuck.group = "tp";
  stuck.group_ranks = {4, 5, 6, 7};
  stuck.seq = 3;
  stuck.op = "all_reduce";
  std::map<int, nlohmann::json> dumps;
  dumps[4] = dump_with({{1, "all_reduce", "done"}, {2, "all_gather", "done"}, {3, "all_reduce", "started"}});
  dumps[5] = dump_with({{1, "all_reduce", "done"}, {2, "all_gather", "done"}});  // never entered seq 3
  dumps[6] = dump_with({{1, "all_reduce", "done"}, {2, "all_gather", "done"}, {3, "reduce_scatter", "started"}});
  // rank 7: no dump
  StuckReport r = analyze_dumps(stuck, dumps);
  EXPECT_EQ(r.never_entered, std::vector<int>{5});
  EXPECT_EQ(r.missing_dumps, std::vector<int>{7});
  EXPECT_EQ(r.other_ops, std::vector<std::string>{"rank 6 issued reduce_scatter"});
  EXPECT_EQ(r.describe_stuck, "all_reduce (group 'tp' ranks [4,5,6,7], seq 3)");
}

TEST(Watchdog, TimeoutFlagAndEnvOverride) {
  ::unsetenv("MCPP_DISTRIBUTED_TIMEOUT_SECONDS");
  EXPECT_EQ(distributed_timeout_seconds(10), 600.0);
  EXPECT_THROW(distributed_timeout_seconds(0), Error);
  ::setenv("MCPP_DISTRIBUTED_TIMEOUT_SECONDS", "2.5", 1);
  EXPECT_EQ(distributed_timeout_seconds(10), 2.5);
  ::setenv("MCPP_DISTRIBUTED_TIMEOUT_SECONDS", "soon", 1);
  try {
    distributed_timeout_seconds(10);
    ADD_FAILURE() << "malformed override must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MCPP_DISTRIBUTED_TIMEOUT_SECONDS='soon'"), std::string::npos);
  }
  ::unsetenv("MCPP_DISTRIBUTED_TIMEOUT_SECONDS");
  CommPtr w = make_local_world();
  EXPECT_THROW(Watchdog(w, {.dump_dir = "/tmp"}), Error) << "on_abort is required";
}

}  // namespace
}  // namespace mcpp::comm
