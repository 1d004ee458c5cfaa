// Sharded, multi-rank checkpoint save with an atomic commit (docs/CHECKPOINT_FORMAT.md, "Sharded save").
//
// Contract: collective over `world` (every rank calls it with the same save_dir and iteration).
//   Each rank passes only the shards it owns (ShardedTensor: key, global shape, rect, bytes); which
//   rank owns what is the caller's rule (training/checkpointing.cpp). Protocol:
//   1. rank 0 refuses an existing iter_N, creates iter_N.tmp-<uuid>/ and broadcasts the uuid (or its error);
//   2. every rank writes model.rank_<r>.safetensors (keys not starting with "optimizer.") and
//      optimizer.rank_<r>.safetensors (only the kinds it has shards of), fsyncs each and the directory;
//   3. vote: every rank's error string (empty = success) is all-gathered; any failure -> rank 0 removes
//      the staging directory and every rank throws an mcpp::Error naming the failed ranks and reasons;
//   4. every rank's manifest entries are gathered; rank 0 checks the merged layout (every key covered
//      exactly once), writes manifest.json (tmp + fsync + rename), fsyncs, renames the directory to
//      iter_N, fsyncs the parent, and replaces latest_checkpointed_iteration.txt (tmp + fsync + rename
//      + fsync), then deletes the orphaned iter_N it moved aside in step 1 (if any); its outcome is broadcast, so a
//      failed commit throws on every rank.
//   `meta` is taken from rank 0. Fault points (fault_injection.h) sit between all the steps.
// Returns the committed directory on every rank.
//
// The same protocol in phases, for the async save (async_save.h) and the offline converter:
//   begin_sharded_save   step 1 (collective: broadcast); returns the staging directory;
//   write_rank_files     step 2 for one rank (local: files + fsyncs, no communication; any thread);
//   finish_sharded_save  steps 3-4 (collective: vote, gather, rank 0 commits, broadcast);
//   commit_checkpoint    rank 0's part of step 4 alone (local), given every rank's entries.
// save_sharded_checkpoint = begin + write + finish, so a sync and an async save write the same bytes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mcpp/comm/communicator.h"
#include "mcpp/dist_checkpointing/sharded_tensor.h"

namespace mcpp::dist_checkpointing {

struct RankWriteResult {
  nlohmann::json entries = nlohmann::json::array();  // this rank's manifest entries
  std::string error;                                  // empty: written and fsynced
};

std::string begin_sharded_save(const std::string& save_dir, int64_t iteration, comm::Communicator& world);

// Writes `shards` into tmp_dir as rank `rank` of `world_size` (file names: sharded_save.h step 2);
// returns their manifest entries. Throws mcpp::Error.
nlohmann::json write_rank_files(const std::string& tmp_dir, int64_t iteration, int rank, int world_size,
                                const std::vector<ShardedTensor>& shards);
// The same, with the error (any exception) returned instead of thrown.
RankWriteResult write_rank_files_noexcept(const std::string& tmp_dir, int64_t iteration, int rank, int world_size,
                                          const std::vector<ShardedTensor>& shards) noexcept;

std::string finish_sharded_save(const std::string& save_dir, const std::string& tmp_dir, int64_t iteration,
                                const nlohmann::json& meta, const RankWriteResult& mine, comm::Communicator& world);

// Merges rank_entries (each a JSON array of entries), checks the layout, writes the manifest, renames
// tmp_dir to final_dir and updates the tracker. Throws mcpp::Error (tmp_dir is left for the caller).
void commit_checkpoint(const std::string& save_dir, const std::string& tmp_dir, const std::string& final_dir,
                       int64_t iteration, const nlohmann::json& meta, const std::vector<std::string>& rank_entries);

std::string save_sharded_checkpoint(const std::string& save_dir, int64_t iteration, const nlohmann::json& meta,
                                    const std::vector<ShardedTensor>& shards, comm::Communicator& world);

// Small collective helpers (bytes carried in an I32 tensor): every rank gets every rank's string / root's.
std::vector<std::string> all_gather_strings(comm::Communicator& comm, const std::string& mine);
std::string broadcast_string(comm::Communicator& comm, const std::string& s, int root);

}  // namespace mcpp::dist_checkpointing
