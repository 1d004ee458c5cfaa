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
//      + fsync); its outcome is broadcast, so a failed commit throws on every rank.
//   `meta` is taken from rank 0. Fault points (fault_injection.h) sit between all the steps.
// Returns the committed directory on every rank.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mcpp/comm/communicator.h"
#include "mcpp/dist_checkpointing/sharded_tensor.h"

namespace mcpp::dist_checkpointing {

std::string save_sharded_checkpoint(const std::string& save_dir, int64_t iteration, const nlohmann::json& meta,
                                    const std::vector<ShardedTensor>& shards, comm::Communicator& world);

// Small collective helpers (bytes carried in an I32 tensor): every rank gets every rank's string / root's.
std::vector<std::string> all_gather_strings(comm::Communicator& comm, const std::string& mine);
std::string broadcast_string(comm::Communicator& comm, const std::string& s, int root);

}  // namespace mcpp::dist_checkpointing
