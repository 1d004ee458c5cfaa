// Checkpoint retention (--keep-last-n-checkpoints), the save-directory lock, and clean-up of what dead jobs left
// (`mcpp ckpt clean`, and every training start). Local (no communication): the trainer calls these on global
// rank 0 only.
//
// Contract:
//   SaveDirLock::acquire(save_dir): creates save_dir and takes flock(LOCK_EX | LOCK_NB) on
//     <save_dir>/.mcpp_save.lock (its text: "pid <pid> host <host>" of the holder), held until the object dies;
//     the kernel drops it when the process dies, SIGKILL included, so a dead job never holds it. A lock held by
//     another live process is an mcpp::Error naming save_dir and the holder. A training job holds it for its
//     lifetime (rank 0): a save directory belongs to one live job at a time. On a filesystem without file locks
//     the returned lock is not held() (the caller warns).
//   remove_old_checkpoints(save_dir, keep): deletes committed iter_NNNNNNN directories (those list_iterations
//     reports) beyond the newest `keep` (keep >= 1), never the one the tracker names. Each is first renamed to
//     iter_N.deleting-<token> (a name no reader ever loads), the parent fsynced, and only then deleted, so a
//     kill at any point leaves either the committed checkpoint or an invisible leftover. Staging (*.tmp-*)
//     directories are never touched, so an in-flight save is safe. Returns the deleted directories (ascending).
//     Kill points (fault_injection.h): retention_after_rename, retention_mid_delete (one file of the set-aside
//     directory deleted), retention_after_delete.
//   remove_stale_staging(save_dir): deletes what dead jobs left — staging iter_N.tmp-<token> directories,
//     tracker temp files latest_checkpointed_iteration.txt.tmp-<token>, superseded iter_N.superseded-<token>
//     and set-aside iter_N.deleting-<token> directories, and committed-looking iter_N directories without a
//     manifest whose every file is one of ours (a deletion by an older build killed half way). Anything else
//     (another tool's iter_N) is left alone. Call it only while holding the save directory's lock (no save in
//     flight). Returns the removed paths (sorted). A missing save_dir gives {}.
//   clean_save_dir(save_dir): `mcpp ckpt clean`: takes the lock (refusing a directory a live job owns), then
//     remove_stale_staging.
// Failures to delete are an mcpp::Error naming the path.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mcpp::dist_checkpointing {

inline constexpr const char* kSaveDirLockFile = ".mcpp_save.lock";

class SaveDirLock {
 public:
  static SaveDirLock acquire(const std::string& save_dir);
  SaveDirLock() = default;
  SaveDirLock(SaveDirLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  SaveDirLock& operator=(SaveDirLock&& o) noexcept;
  SaveDirLock(const SaveDirLock&) = delete;
  SaveDirLock& operator=(const SaveDirLock&) = delete;
  ~SaveDirLock();
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

std::vector<std::string> remove_old_checkpoints(const std::string& save_dir, int64_t keep);
std::vector<std::string> remove_stale_staging(const std::string& save_dir);
std::vector<std::string> clean_save_dir(const std::string& save_dir);

}  // namespace mcpp::dist_checkpointing
