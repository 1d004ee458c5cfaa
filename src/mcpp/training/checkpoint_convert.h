// Offline reshard (`mcpp ckpt convert`): rewrites a checkpoint as if a run at another layout had saved it.
//
// Contract: one process, no communication. For every target rank (tp t of T, pp p of P, dp 1) it builds
// that rank's model chunks (one per virtual stage: V chunks, layer keys global) with an offline TP group
// of size T (no collectives are ever posted on it), reads their tensors through the load planner
// (CheckpointReader::read_region: any saved layout), reads the plain Adam moments the same way (when the
// checkpoint has optimizer state; a distributed-optimizer checkpoint is converted to plain Adam state,
// which loads with or without --use-distributed-optimizer), and writes the shards that rank would own
// (training/checkpointing.h ownership rule with dp = 1) as model/optimizer.rank_<r>.safetensors,
// r = t + T * p. Rank 0's commit (sharded_save.h commit_checkpoint) then merges every rank's entries,
// checks exactly-once coverage, writes the manifest and the tracker under `output`.
// The manifest meta is the source's with: config.parallel = the target layout (tp, pp, virtual stages;
// custom layouts cleared, distributed optimizer off), meta.parallel = {world_size T*P, tp, pp, vp, dp 1,
// cp 1, distributed_optimizer false}, meta.optimizer.distributed dropped, meta.rng_per_rank dropped
// (a layout change restores meta.rng), and meta.converted_from = {dir, parallel}.
// Errors (mcpp::Error, naming the field or path): a layout the model does not divide (heads, query
// groups, ffn, padded vocab by T; layers by P*V), a missing checkpoint, an output iter_N that exists.
#pragma once
#include <cstdint>
#include <string>

namespace mcpp {

struct ConvertOptions {
  std::string input;       // save dir (tracker) or iter_N dir
  int64_t iteration = -1;  // with a save dir: which iteration (-1: the tracker's)
  int64_t tp = 1, pp = 1, vp = 1;
  std::string output;  // save dir to create / add to
};

struct ConvertResult {
  std::string dir;      // the committed iter_N under output
  int64_t ranks = 0;    // target ranks written (T * P)
  uint64_t bytes_read = 0, bytes_written = 0;
};

ConvertResult convert_checkpoint(const ConvertOptions& opt);

}  // namespace mcpp
