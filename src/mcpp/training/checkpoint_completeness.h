// Completeness of a checkpoint against its own stored config (`mcpp ckpt verify`; docs/CHECKPOINT_FORMAT.md,
// "Completeness").
//
// Contract: expected_checkpoint_tensors(config, with_optimizer) lists every tensor a training checkpoint of that
//   config holds — each parameter's fp32 master under its key (a tied output weight only once, as the
//   embedding), each router's expert bias, and with_optimizer "optimizer.exp_avg.<key>" and
//   "optimizer.exp_avg_sq.<key>" of every parameter — with its global (unsharded) shape. It builds the model one
//   layer at a time on the CPU (TP = 1, a local world) to read the parameter specs, so its memory is one layer
//   plus the embeddings, whatever the checkpoint's size.
// check_checkpoint_complete(reader) reads meta.config (absent: a checkpoint of bare tensors, nothing implied;
//   returns 0) and meta.optimizer (an object: optimizer state implied), and throws ONE mcpp::Error naming the
//   manifest and the first keys that are missing, have another global shape, or are not implied by the config.
//   Coverage of each present key by its shards is the manifest parser's check (manifest.h). Returns the number
//   of tensors checked.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "mcpp/core/tensor.h"
#include "mcpp/dist_checkpointing/checkpoint.h"
#include "mcpp/training/config.h"

namespace mcpp {

struct ExpectedTensor {
  std::string key;
  Shape global_shape;
};

std::vector<ExpectedTensor> expected_checkpoint_tensors(const Config& config, bool with_optimizer);
int64_t check_checkpoint_complete(const dist_checkpointing::CheckpointReader& reader);

}  // namespace mcpp
