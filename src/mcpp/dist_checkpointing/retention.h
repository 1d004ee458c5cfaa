// Checkpoint retention (--keep-last-n-checkpoints) and clean-up of crashed saves. Local (no
// communication): the trainer calls these on global rank 0 only.
//
// Contract:
//   remove_old_checkpoints(save_dir, keep): deletes committed iter_NNNNNNN directories (those
//     list_iterations reports) beyond the newest `keep` (keep >= 1), never the one the tracker names.
//     Staging (*.tmp-*) and superseded directories are never touched, so an in-flight save is safe.
//     Returns the deleted directories (ascending iteration).
//   remove_stale_staging(save_dir): deletes what a crashed save leaves behind — iter_N.tmp-<uuid>
//     directories and latest_checkpointed_iteration.txt.tmp-<uuid> files. Call it only when no save
//     of this save_dir is in flight (at startup). Returns the removed paths. A missing save_dir gives {}.
// Failures to delete are an mcpp::Error naming the path.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mcpp::dist_checkpointing {

std::vector<std::string> remove_old_checkpoints(const std::string& save_dir, int64_t keep);
std::vector<std::string> remove_stale_staging(const std::string& save_dir);

}  // namespace mcpp::dist_checkpointing
