// Retention and stale-staging clean-up; see retention.h.
#include "mcpp/dist_checkpointing/retention.h"

#include <algorithm>
#include <filesystem>
#include <regex>

#include "mcpp/core/error.h"
#include "mcpp/dist_checkpointing/checkpoint.h"

namespace fs = std::filesystem;

namespace mcpp::dist_checkpointing {

std::vector<std::string> remove_old_checkpoints(const std::string& save_dir, int64_t keep) {
  if (keep < 1) fail("keep_last_n_checkpoints: must be >= 1 to delete anything (got {})", keep);
  const std::vector<int64_t> its = list_iterations(save_dir);  // ascending, committed only
  const int64_t latest = latest_iteration(save_dir);
  std::vector<std::string> removed;
  const int64_t n = static_cast<int64_t>(its.size());
  for (int64_t i = 0; i + keep < n; ++i) {
    if (its[static_cast<size_t>(i)] == latest) continue;
    const std::string dir = (fs::path(save_dir) / iteration_dir_name(its[static_cast<size_t>(i)])).string();
    std::error_code ec;
    fs::remove_all(dir, ec);
    if (ec) fail("cannot delete old checkpoint {}: {}", dir, ec.message());
    removed.push_back(dir);
  }
  return removed;
}

std::vector<std::string> remove_stale_staging(const std::string& save_dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  if (!fs::is_directory(save_dir, ec)) return removed;
  static const std::regex kStaging("iter_[0-9]{7,}\\.tmp-[0-9a-f]+");
  static const std::regex kTrackerTmp("latest_checkpointed_iteration\\.txt\\.tmp-[0-9a-f]+");
  for (const auto& de : fs::directory_iterator(save_dir, ec)) {
    const std::string name = de.path().filename().string();
    if (std::regex_match(name, kStaging) || std::regex_match(name, kTrackerTmp)) removed.push_back(de.path().string());
  }
  if (ec) fail("cannot list {}: {}", save_dir, ec.message());
  std::sort(removed.begin(), removed.end());
  for (const std::string& p : removed) {
    fs::remove_all(p, ec);
    if (ec) fail("cannot delete stale staging path {}: {}", p, ec.message());
  }
  return removed;
}

}  // namespace mcpp::dist_checkpointing
