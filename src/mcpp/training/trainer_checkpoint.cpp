// Trainer checkpoints (trainer.h): save() at save_interval and at the end — collective and sharded (every rank
// writes its shards of every model chunk, training/checkpointing.h); with --async-save the step pauses only for the
// snapshot, the write runs in the background and the vote + commit happen at a later step boundary
// (finalize_async_save) or at the end; --keep-last-n-checkpoints prunes after each commit (rank 0). The last rank
// prints Megatron's save lines and writes the save events to the metrics. (The load is the constructor's.)
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <optional>

#include "mcpp/dist_checkpointing/async_save.h"
#include "mcpp/dist_checkpointing/retention.h"
#include "mcpp/dist_checkpointing/sharded_save.h"
#include "mcpp/optimizer/distributed_optimizer.h"
#include "mcpp/optimizer/lr_scheduler.h"
#include "mcpp/training/trainer.h"

namespace mcpp {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

void Trainer::save(int64_t iteration) {
  state_.iteration = iteration;
  state_.scheduler = scheduler_->state_dict();
  if (dist_optimizer_) dist_optimizer_->wait_param_gather();
  const auto& t = config_.training;
  finalize_async_save(/*blocking=*/true);  // at most one save in flight
  // The pause: training is stopped from here until the snapshot is taken (sync: until committed).
  auto t0 = Clock::now();
  CheckpointSnapshot snap = snapshot_training_checkpoint(config_, chunk_ptrs(), optimizer_ref(), state_, pc_);
  std::string dir;
  if (async_saver_) {
    async_saver_->start(t.save, snap.iteration, std::move(snap.meta), std::move(snap.shards));
  } else {
    dir = dist_checkpointing::save_sharded_checkpoint(t.save, snap.iteration, snap.meta, snap.shards, pc_.world()->host());
  }
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (is_logging_rank()) {
    if (async_saver_) {
      fmt::print(" started async save of checkpoint at iteration {:>7} | save-checkpoint pause (ms): {:.1f}\n",
                 iteration, ms);
      metrics_.write({{"event", "save_start"}, {"iteration", iteration}, {"async", true}, {"pause_ms", ms}});
    } else {
      fmt::print(" saved checkpoint at iteration {:>7} to {} in {:.1f} ms | save-checkpoint pause (ms): {:.1f}\n",
                 iteration, dir, ms, ms);
      metrics_.write({{"event", "save"}, {"iteration", iteration}, {"dir", dir}, {"ms", ms}, {"pause_ms", ms},
                      {"async", false}});
    }
  }
  if (!async_saver_) after_commit(dir, iteration);
}

void Trainer::finalize_async_save(bool blocking) {
  if (!async_saver_ || !async_saver_->in_flight()) return;
  const int64_t iteration = async_saver_->in_flight_iteration();
  const std::optional<std::string> dir = async_saver_->maybe_finalize(blocking);
  if (!dir) return;
  const double ms = 1000.0 * async_saver_->last_save_seconds();
  if (is_logging_rank()) {
    fmt::print(" saved checkpoint at iteration {:>7} to {} (async: committed {:.1f} ms after the snapshot)\n",
               iteration, *dir, ms);
    metrics_.write({{"event", "save"}, {"iteration", iteration}, {"dir", *dir}, {"ms", ms}, {"async", true}});
  }
  after_commit(*dir, iteration);
}

void Trainer::after_commit(const std::string& dir, int64_t iteration) {
  last_checkpoint_dir_ = dir;  // --rerun-on-cpu re-runs iteration + 1 from it
  last_checkpoint_iteration_ = iteration;
  if (faults_) faults_->after_save(iteration, dir);  // --inject-fault bad-shard@ITER
  const int64_t keep = config_.training.keep_last_n_checkpoints;
  if (keep <= 0 || pc_.rank() != 0) return;
  for (const std::string& old : dist_checkpointing::remove_old_checkpoints(config_.training.save, keep))
    spdlog::info("--keep-last-n-checkpoints {}: deleted {} (after committing {} at iteration {})", keep, old, dir,
                 iteration);
}

}  // namespace mcpp
