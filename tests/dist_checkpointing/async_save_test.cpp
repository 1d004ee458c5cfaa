// Async save and retention (async_save.h, retention.h) on a 1-rank world: an async save writes the
// same bytes as a sync save of the same snapshot (every file, manifest included), at most one save is
// in flight, a failed background write (MCPP_FAULT_FAIL_AT) surfaces at finalize as an mcpp::Error
// naming the iteration and directory and leaves latest on the previous checkpoint, and
// remove_old_checkpoints / remove_stale_staging delete exactly what they promise.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/dist_checkpointing/async_save.h"
#include "mcpp/dist_checkpointing/checkpoint.h"
#include "mcpp/dist_checkpointing/retention.h"
#include "mcpp/dist_checkpointing/sharded_save.h"
#include "tests/dist_checkpointing/ckpt_test_util.h"

namespace mcpp::dist_checkpointing {
namespace {

namespace fs = std::filesystem;
using testing::random_tensor;
using testing::read_text;
using testing::TempDir;
const nlohmann::json kMeta = nlohmann::json::object();

std::vector<ShardedTensor> some_shards(uint32_t seed) {
  Tensor w = random_tensor({6, 4}, DType::F32, seed), b = random_tensor({4}, DType::BF16, seed + 1);
  Tensor m = random_tensor({6, 4}, DType::F32, seed + 2);
  return {{"w", {6, 4}, {{0, 0}, {6, 4}}, w},
          {"b", {4}, {{0}, {4}}, b},
          {"optimizer.exp_avg.w", {6, 4}, {{0, 0}, {3, 4}}, extract_rect(m, {{0, 0}, {3, 4}})},
          {"optimizer.exp_avg.w", {6, 4}, {{3, 0}, {3, 4}}, extract_rect(m, {{3, 0}, {3, 4}})}};
}

std::vector<std::string> files_of(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& de : fs::directory_iterator(dir)) out.push_back(de.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(AsyncSave, ByteIdenticalToSyncSave) {
  TempDir a, b;
  auto world = comm::make_local_world();
  const nlohmann::json meta = {{"note", "same meta"}, {"rng", {{"default_offset", 7}}}};
  const std::string sync_dir = save_sharded_checkpoint(a.path(), 5, meta, some_shards(1), *world);
  AsyncCheckpointSaver saver(world);
  saver.start(b.path(), 5, meta, some_shards(1));
  EXPECT_TRUE(saver.in_flight());
  std::optional<std::string> async_dir;
  while (!(async_dir = saver.maybe_finalize(/*blocking=*/false))) {
  }
  EXPECT_FALSE(saver.in_flight());
  ASSERT_EQ(files_of(sync_dir), files_of(*async_dir));
  for (const std::string& f : files_of(sync_dir))
    EXPECT_EQ(read_text(sync_dir + "/" + f), read_text(*async_dir + "/" + f)) << f;
  EXPECT_EQ(read_text(a / kTrackerFile), read_text(b / kTrackerFile));
}

TEST(AsyncSave, AtMostOneInFlightAndFinalizeAtExit) {
  TempDir tmp;
  auto world = comm::make_local_world();
  AsyncCheckpointSaver saver(world);
  saver.start(tmp.path(), 1, kMeta, some_shards(2));
  saver.start(tmp.path(), 2, kMeta, some_shards(3));  // finalizes iteration 1 first
  EXPECT_EQ(latest_iteration(tmp.path()), 1);
  EXPECT_EQ(saver.in_flight_iteration(), 2);
  EXPECT_EQ(saver.maybe_finalize(/*blocking=*/true).value(), (fs::path(tmp.path()) / "iter_0000002").string());
  EXPECT_EQ(latest_iteration(tmp.path()), 2);
  EXPECT_EQ(list_iterations(tmp.path()), (std::vector<int64_t>{1, 2}));
  EXPECT_FALSE(saver.maybe_finalize(/*blocking=*/true).has_value());  // nothing in flight
}

TEST(AsyncSave, FailedBackgroundWriteSurfacesAtFinalize) {
  TempDir tmp;
  auto world = comm::make_local_world();
  AsyncCheckpointSaver saver(world);
  saver.start(tmp.path(), 1, kMeta, some_shards(4));
  saver.maybe_finalize(/*blocking=*/true);
  ::setenv("MCPP_FAULT_FAIL_AT", "after_fsync_model", 1);
  saver.start(tmp.path(), 2, kMeta, some_shards(5));
  testing::expect_error([&] { while (!saver.maybe_finalize(/*blocking=*/false)) {} },
                        {"iteration 2", tmp.path(), "injected failure at after_fsync_model",
                         "previous checkpoint stays latest"});
  ::unsetenv("MCPP_FAULT_FAIL_AT");  // only after the writer is done (getenv vs setenv across threads)
  EXPECT_FALSE(saver.in_flight());
  EXPECT_EQ(latest_iteration(tmp.path()), 1);
  EXPECT_EQ(list_iterations(tmp.path()), (std::vector<int64_t>{1}));
  for (const std::string& f : files_of(tmp.path())) EXPECT_EQ(f.find(".tmp-"), std::string::npos) << f;
  // The saver is usable again.
  saver.start(tmp.path(), 3, kMeta, some_shards(6));
  saver.maybe_finalize(/*blocking=*/true);
  EXPECT_EQ(latest_iteration(tmp.path()), 3);
}

TEST(Retention, KeepsNewestNAndLatestNeverTouchesStaging) {
  TempDir tmp;
  auto world = comm::make_local_world();
  for (int64_t it : {1, 2, 3, 4}) save_sharded_checkpoint(tmp.path(), it, kMeta, some_shards(7), *world);
  fs::create_directory(tmp / "iter_0000005.tmp-0123abcd");  // an in-flight save
  auto removed = remove_old_checkpoints(tmp.path(), 2);
  EXPECT_EQ(removed, (std::vector<std::string>{(fs::path(tmp.path()) / "iter_0000001").string(),
                                                (fs::path(tmp.path()) / "iter_0000002").string()}));
  EXPECT_EQ(list_iterations(tmp.path()), (std::vector<int64_t>{3, 4}));
  EXPECT_TRUE(fs::exists(tmp / "iter_0000005.tmp-0123abcd"));
  // The tracker's checkpoint survives even when it is not among the newest N.
  testing::write_text(tmp / kTrackerFile, "3\n");
  EXPECT_TRUE(remove_old_checkpoints(tmp.path(), 1).empty());
  EXPECT_EQ(list_iterations(tmp.path()), (std::vector<int64_t>{3, 4}));
  EXPECT_THROW(remove_old_checkpoints(tmp.path(), 0), Error);
}

TEST(Retention, StaleStagingRemovedCommittedKept) {
  TempDir tmp;
  auto world = comm::make_local_world();
  save_sharded_checkpoint(tmp.path(), 1, kMeta, some_shards(8), *world);
  fs::create_directory(tmp / "iter_0000002.tmp-deadbeef00000001");
  testing::write_text(tmp / "iter_0000002.tmp-deadbeef00000001/model.safetensors", "partial");
  testing::write_text(tmp / "latest_checkpointed_iteration.txt.tmp-0badc0de", "2\n");
  fs::create_directory(tmp / "unrelated.tmp-1234");  // not ours: kept
  auto removed = remove_stale_staging(tmp.path());
  EXPECT_EQ(removed.size(), 2u);
  EXPECT_EQ(files_of(tmp.path()),
            (std::vector<std::string>{"iter_0000001", std::string(kTrackerFile), "unrelated.tmp-1234"}));
  EXPECT_EQ(latest_iteration(tmp.path()), 1);
  EXPECT_TRUE(remove_stale_staging(tmp / "missing").empty());
}

}  // namespace
}  // namespace mcpp::dist_checkpointing
