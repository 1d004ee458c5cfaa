// Asynchronous sharded save (--async-save; Megatron's async_utils / "async finalize" scheme).
//
// Contract: every method is collective over `world` and must be called by every rank at the same
// point of the program (the trainer calls them at step boundaries).
//   start(save_dir, iteration, meta, shards): the caller has already copied every tensor this rank
//     writes into `shards` (owned host tensors: the snapshot, i.e. the training pause). start first
//     finalizes a save still in flight (blocking: at most one in flight), then runs step 1 of the
//     commit protocol (sharded_save.h; a broadcast) on the calling thread and hands step 2 (write +
//     fsync of this rank's files, no communication) to a background thread.
//   (All collectives go through world->host(): host tensors, also under NCCL.)
//   maybe_finalize(blocking): steps 3-4 (vote, gather, rank 0 commits, broadcast) on the CALLING
//     thread, so no two threads ever use `world` at once. Non-blocking: first an all-reduce (min) of
//     "my write finished" over `world` (one int per call while a save is in flight); only when every
//     rank has finished do they vote and commit. Blocking: waits for this rank's writer first.
//     Returns the committed directory when a save was finalized by this call, nullopt otherwise.
//     A failed write or commit throws the mcpp::Error of finish_sharded_save on every rank, naming the
//     iteration and save directory; the previous checkpoint stays latest and nothing is in flight after.
//   The destructor waits for a running writer (so its buffers outlive it) but does not vote or commit:
//   the staging directory of an unfinalized save stays behind as iter_N.tmp-* (never loaded; removed
//   by remove_stale_staging at the next start).
// The bytes written are exactly those of save_sharded_checkpoint with the same arguments.
#pragma once
#include <chrono>
#include <cstdint>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mcpp/comm/communicator.h"
#include "mcpp/dist_checkpointing/sharded_save.h"
#include "mcpp/dist_checkpointing/sharded_tensor.h"

namespace mcpp::dist_checkpointing {

class AsyncCheckpointSaver {
 public:
  explicit AsyncCheckpointSaver(comm::CommPtr world);
  ~AsyncCheckpointSaver();
  AsyncCheckpointSaver(const AsyncCheckpointSaver&) = delete;
  AsyncCheckpointSaver& operator=(const AsyncCheckpointSaver&) = delete;

  void start(const std::string& save_dir, int64_t iteration, nlohmann::json meta, std::vector<ShardedTensor> shards);
  std::optional<std::string> maybe_finalize(bool blocking);

  bool in_flight() const { return pending_.has_value(); }
  int64_t in_flight_iteration() const { return pending_ ? pending_->iteration : -1; }
  // Seconds from start() to the end of the last finalized save (write + vote + commit).
  double last_save_seconds() const { return last_save_seconds_; }

 private:
  struct Pending {
    std::string save_dir, tmp_dir;
    int64_t iteration = 0;
    nlohmann::json meta;
    std::vector<ShardedTensor> shards;  // owned by the writer until it finishes
    std::future<RankWriteResult> writer;
    std::chrono::steady_clock::time_point started;
  };
  comm::CommPtr world_;
  std::optional<Pending> pending_;
  double last_save_seconds_ = 0;
};

}  // namespace mcpp::dist_checkpointing
