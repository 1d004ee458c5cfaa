// Async save and retention (async_save.h, retention.h) on a 1-rank world: an async save writes the
// same bytes as a sync save of the same snapshot (every file, manifest included), at most one save is
// in flight, a failed background write (MCPP_FAULT_FAIL_AT) surfaces at finalize as an mcpp::Error
// naming the iteration and directory and leaves latest on the previous checkpoint, and
// remove_old_checkpoints / remove_stale_staging delete exactly what they promise: a deletion renames the
// checkpoint aside first (a failure or kill at any of its points leaves no half-deleted iter_N visible), the
// clean-up removes what dead jobs left (staging, superseded, set-aside, half-deleted) and nothing else, and the
// save-directory lock keeps `ckpt clean` off a directory a live job holds (released when that job is SIGKILLed).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

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

// The retention's fault points, as MCPP_FAULT_FAIL_AT (an injected error where the kill test SIGKILLs): whatever
// point a deletion stops at, readers see the committed checkpoints or nothing, never a half-deleted iter_N.
TEST(Retention, DeletionIsAtomicFromTheReadersView) {
  for (const char* point : {"retention_after_rename", "retention_mid_delete"}) {
    TempDir tmp;
    auto world = comm::make_local_world();
    for (int64_t it : {1, 2, 3}) save_sharded_checkpoint(tmp.path(), it, kMeta, some_shards(11), *world);
    ::setenv("MCPP_FAULT_FAIL_AT", point, 1);
    EXPECT_THROW(remove_old_checkpoints(tmp.path(), 2), Error) << point;
    ::unsetenv("MCPP_FAULT_FAIL_AT");
    EXPECT_EQ(list_iterations(tmp.path()), (std::vector<int64_t>{2, 3})) << point;
    EXPECT_FALSE(fs::exists(tmp / "iter_0000001")) << point;
    const std::vector<std::string> names = files_of(tmp.path());
    ASSERT_EQ(names.size(), 4u) << point;  // iter_0000001.deleting-*, iter_0000002, iter_0000003, the tracker
    EXPECT_EQ(names[0].rfind("iter_0000001.deleting-", 0), 0u) << names[0];
    EXPECT_THROW(CheckpointReader r(tmp / names[0]), Error) << point;  // never loaded
    // The next start removes it.
    EXPECT_EQ(remove_stale_staging(tmp.path()), (std::vector<std::string>{tmp / names[0]})) << point;
    EXPECT_EQ(files_of(tmp.path()),
              (std::vector<std::string>{"iter_0000002", "iter_0000003", std::string(kTrackerFile)}));
  }
}

TEST(Retention, LeftoversOfDeadJobsAreRemovedForeignDirectoriesKept) {
  TempDir tmp;
  auto world = comm::make_local_world();
  save_sharded_checkpoint(tmp.path(), 1, kMeta, some_shards(12), *world);
  for (const char* d : {"iter_0000002.superseded-0123456789abcdef", "iter_0000003.deleting-00000000deadbeef",
                        "iter_0000004", "iter_0000005", "iter_0000006"})
    fs::create_directory(tmp / d);
  testing::write_text(tmp / "iter_0000004/model.rank_00001.safetensors", "half deleted");  // ours, no manifest
  testing::write_text(tmp / "iter_0000005/common.pt", "another tool's checkpoint");          // not ours: kept
  // iter_0000006: empty, no manifest (a deletion that got to the last file)
  const auto removed = remove_stale_staging(tmp.path());
  EXPECT_EQ(removed.size(), 4u);
  EXPECT_EQ(files_of(tmp.path()), (std::vector<std::string>{"iter_0000001", "iter_0000005", std::string(kTrackerFile)}));
}

TEST(Retention, SaveDirLockKeepsCleanOffALiveJobsDirectory) {
  TempDir tmp;
  fs::create_directory(tmp / "iter_0000002.tmp-0123456789abcdef");  // a live job's staging directory
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t job = ::fork();
  ASSERT_GE(job, 0);
  if (job == 0) {  // the "live job": holds the lock until killed
    try {
      const SaveDirLock lock = SaveDirLock::acquire(tmp.path());
      (void)!::write(ready[1], "x", 1);
      while (true) ::pause();
    } catch (...) {
      std::_Exit(3);
    }
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  testing::expect_error([&] { clean_save_dir(tmp.path()); },
                        {tmp.path(), "in use by a live job", fmt::format("pid {}", job)});
  testing::expect_error([&] { SaveDirLock::acquire(tmp.path()); }, {"in use by a live job"});
  EXPECT_TRUE(fs::exists(tmp / "iter_0000002.tmp-0123456789abcdef"));  // untouched
  ::kill(job, SIGKILL);  // the job dies: the kernel drops its lock
  int status = 0;
  ::waitpid(job, &status, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  EXPECT_EQ(clean_save_dir(tmp.path()), (std::vector<std::string>{tmp / "iter_0000002.tmp-0123456789abcdef"}));
  {
    const SaveDirLock mine = SaveDirLock::acquire(tmp.path());
    EXPECT_TRUE(mine.held());
    EXPECT_THROW(clean_save_dir(tmp.path()), Error);  // another open of the lock file: refused even in-process
  }
  EXPECT_NO_THROW(clean_save_dir(tmp.path()));
}

}  // namespace
}  // namespace mcpp::dist_checkpointing
