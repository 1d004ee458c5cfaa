// mcpp debug hang's analysis (tools/hang_analysis.h) on synthetic dumps: the first result-checksum mismatch
// (--flight-recorder-checksums) and the host stacks (SIGUSR1 / watchdog dumps), demangled.
#include "mcpp/tools/hang_analysis.h"

#include <gtest/gtest.h>

namespace mcpp::tools {
namespace {

nlohmann::json entry(int64_t seq, const std::string& result, int64_t t, const std::string& state = "done") {
  return {{"id", seq},         {"group", "dp"},       {"group_ranks", {0, 1, 2}}, {"seq", seq},
          {"p2p_seq", 0},      {"op", "all_reduce"},  {"reduce_op", "sum"},       {"dtype", "float32"},
          {"count", 4},        {"peers", nlohmann::json::array()}, {"state", state},
          {"start_wall_us", t}, {"iteration", seq},   {"microbatch", -1},         {"pp_stage", 0},
          {"vp_chunk", -1},    {"payload_checksum", "00"}, {"result_checksum", result}};
}

nlohmann::json dump(int rank, std::vector<nlohmann::json> entries, nlohmann::json stacks = nlohmann::json()) {
  nlohmann::json d{{"version", 1}, {"rank", rank}, {"world_size", 3}, {"entries", entries}};
  if (!stacks.is_null()) d["host_stacks"] = stacks;
  return d;
}

TEST(HangAnalysis, FirstResultMismatchNamesTheMinority) {
  // seq 1 agrees; seq 2 and 3 differ on rank 2 (seq 2 first).
  std::vector<nlohmann::json> dumps;
  for (int r = 0; r < 3; ++r)
    dumps.push_back(dump(r, {entry(1, "aa", 10), entry(2, r == 2 ? "bd" : "bc", 20), entry(3, r == 2 ? "x" : "y", 30)}));
  const HangReport rep = analyze_hang(dumps);
  const auto& mm = rep.json.at("result_mismatch");
  EXPECT_EQ(mm.at("seq"), 2);
  EXPECT_EQ(mm.at("differing_ranks"), nlohmann::json({2}));
  EXPECT_NE(rep.text.find("ranks [2] differ"), std::string::npos) << rep.text;
}

TEST(HangAnalysis, AgreeingResultsAreSaid) {
  std::vector<nlohmann::json> dumps;
  for (int r = 0; r < 3; ++r) dumps.push_back(dump(r, {entry(1, "aa", 10), entry(2, "", 20, "started")}));
  const HangReport rep = analyze_hang(dumps);
  EXPECT_TRUE(rep.json.at("result_mismatch").is_null());
  EXPECT_NE(rep.text.find("agrees across its group"), std::string::npos) << rep.text;
}

TEST(HangAnalysis, HostStacksAreDemangledWithoutTheCaptureFrames) {
  const nlohmann::json stack = {{{"thread", "main"},
                                 {"captured", true},
                                 {"capture_frames", 2},
                                 {"frames",
                                  {"/b/mcpp(+0x10) [0x1]", "/lib/libc.so.6(+0x20) [0x2]",
                                   "/b/mcpp(_ZN4mcpp13FaultInjector10begin_stepElbRNS_4comm12CommunicatorE+0x1a3) [0x3]",
                                   "/b/mcpp(main+0x5) [0x4]"}}}};
  std::vector<nlohmann::json> dumps;
  for (int r = 0; r < 3; ++r) dumps.push_back(dump(r, {entry(1, "aa", 10)}, r == 1 ? stack : nlohmann::json()));
  const HangReport rep = analyze_hang(dumps);
  const auto frames = rep.json.at("host_stacks").at("1").get<std::vector<std::string>>();
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0], "mcpp::FaultInjector::begin_step(long, bool, mcpp::comm::Communicator&) +0x1a3 (mcpp)");
  EXPECT_EQ(frames[1], "main +0x5 (mcpp)");
  EXPECT_NE(rep.text.find("#0 mcpp::FaultInjector::begin_step"), std::string::npos) << rep.text;
}

}  // namespace
}  // namespace mcpp::tools
