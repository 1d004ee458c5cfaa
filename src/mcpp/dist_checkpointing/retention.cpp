// Retention, the save-directory lock and leftover clean-up; see retention.h.
#include "mcpp/dist_checkpointing/retention.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <regex>

#include "mcpp/core/error.h"
#include "mcpp/dist_checkpointing/checkpoint.h"
#include "mcpp/dist_checkpointing/durable_file.h"
#include "mcpp/dist_checkpointing/fault_injection.h"

namespace fs = std::filesystem;

namespace mcpp::dist_checkpointing {

SaveDirLock SaveDirLock::acquire(const std::string& save_dir) {
  std::error_code ec;
  fs::create_directories(save_dir, ec);
  if (ec) fail("cannot create save directory {}: {}", save_dir, ec.message());
  const std::string path = (fs::path(save_dir) / kSaveDirLockFile).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0) fail("cannot open the save directory lock {}: {}", path, std::strerror(errno));
  SaveDirLock lock;
  lock.fd_ = fd;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[256] = {};
    const ssize_t n = ::pread(fd, holder, sizeof(holder) - 1, 0);
    std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : std::string("unknown");
    while (!who.empty() && std::isspace(static_cast<unsigned char>(who.back()))) who.pop_back();
    if (err == EWOULDBLOCK)
      fail("save directory {} is in use by a live job ({} holds {}); one job at a time may save there", save_dir,
           who, path);
    if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS) return SaveDirLock();  // no locks on this filesystem
    fail("cannot lock {}: {}", path, std::strerror(err));
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string text = fmt::format("pid {} host {}\n", ::getpid(), host);
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
    fail("cannot write the save directory lock {}: {}", path, std::strerror(errno));
  return lock;
}

SaveDirLock& SaveDirLock::operator=(SaveDirLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

SaveDirLock::~SaveDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the descriptor drops the flock
}

namespace {

// Deletes a set-aside directory file by file (the kill test's retention_mid_delete point after the first).
void delete_set_aside(const std::string& dir) {
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& de : fs::directory_iterator(dir, ec)) files.push_back(de.path());
  std::sort(files.begin(), files.end());
  for (size_t i = 0; i < files.size(); ++i) {
    fs::remove_all(files[i], ec);
    if (ec) fail("cannot delete {}: {}", files[i].string(), ec.message());
    if (i == 0) fault_point("retention_mid_delete");
  }
  fs::remove(dir, ec);
  if (ec) fail("cannot delete old checkpoint {}: {}", dir, ec.message());
}

// An iter_N directory without a manifest that holds only files a checkpoint of ours writes: what a deletion
// killed half way left (older builds deleted in place).
bool is_our_half_deleted_checkpoint(const fs::path& dir) {
  static const std::regex kOurs(
      "(model|optimizer)(\\.rank_[0-9]+)?\\.safetensors|manifest\\.json\\.tmp-[0-9a-f]+");
  std::error_code ec;
  if (fs::exists(dir / kManifestFile, ec)) return false;
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    if (!de.is_regular_file(ec) || !std::regex_match(de.path().filename().string(), kOurs)) return false;
  }
  return !ec;
}

}  // namespace

std::vector<std::string> remove_old_checkpoints(const std::string& save_dir, int64_t keep) {
  if (keep < 1) fail("keep_last_n_checkpoints: must be >= 1 to delete anything (got {})", keep);
  const std::vector<int64_t> its = list_iterations(save_dir);  // ascending, committed only
  const int64_t latest = latest_iteration(save_dir);
  std::vector<std::string> removed;
  const int64_t n = static_cast<int64_t>(its.size());
  for (int64_t i = 0; i + keep < n; ++i) {
    if (its[static_cast<size_t>(i)] == latest) continue;
    const std::string dir = (fs::path(save_dir) / iteration_dir_name(its[static_cast<size_t>(i)])).string();
    const std::string aside = dir + ".deleting-" + random_token();
    // 1. Out of the readers' sight in one rename, durable before any byte is deleted.
    if (::rename(dir.c_str(), aside.c_str()) != 0)
      fail("cannot move old checkpoint {} aside to {}: {}", dir, aside, std::strerror(errno));
    fsync_path(save_dir, /*directory=*/true);
    fault_point("retention_after_rename");
    // 2. Delete the set-aside directory; a kill here leaves only an iter_N.deleting-* (removed at the next start).
    delete_set_aside(aside);
    fault_point("retention_after_delete");
    removed.push_back(dir);
  }
  return removed;
}

std::vector<std::string> remove_stale_staging(const std::string& save_dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  if (!fs::is_directory(save_dir, ec)) return removed;
  static const std::regex kLeftover("iter_[0-9]{7,}\\.(tmp|superseded|deleting)-[0-9a-f]+");
  static const std::regex kTrackerTmp("latest_checkpointed_iteration\\.txt\\.tmp-[0-9a-f]+");
  static const std::regex kIterDir("iter_[0-9]{7,}");
  for (const auto& de : fs::directory_iterator(save_dir, ec)) {
    const std::string name = de.path().filename().string();
    if (std::regex_match(name, kLeftover) || std::regex_match(name, kTrackerTmp) ||
        (std::regex_match(name, kIterDir) && de.is_directory(ec) && is_our_half_deleted_checkpoint(de.path())))
      removed.push_back(de.path().string());
  }
  if (ec) fail("cannot list {}: {}", save_dir, ec.message());
  std::sort(removed.begin(), removed.end());
  for (const std::string& p : removed) {
    fs::remove_all(p, ec);
    if (ec) fail("cannot delete stale path {}: {}", p, ec.message());
  }
  if (!removed.empty()) fsync_path(save_dir, /*directory=*/true);
  return removed;
}

std::vector<std::string> clean_save_dir(const std::string& save_dir) {
  std::error_code ec;
  if (!fs::is_directory(save_dir, ec)) fail("ckpt clean: {} is not a directory", save_dir);
  const SaveDirLock lock = SaveDirLock::acquire(save_dir);  // refuses a directory a live job owns
  if (!lock.held())
    fail("ckpt clean: the filesystem of {} has no file locks, so a live job's ownership cannot be checked; "
         "nothing removed", save_dir);
  return remove_stale_staging(save_dir);
}

}  // namespace mcpp::dist_checkpointing
