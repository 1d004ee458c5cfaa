// Trainer <-> checkpoint glue (Megatron's training/checkpointing.py): what a training checkpoint holds
// and how it is restored. Collective over the ParallelContext.
//   tensors: every model parameter as its LOGICAL tensor (TP shards assembled by an all-reduce of the
//            placed shards over TP; written once, by global rank 0); with the optimizer, fp32 Adam state
//            "optimizer.exp_avg.<key>" / "optimizer.exp_avg_sq.<key>" assembled the same way (with the
//            distributed optimizer, first over DP from the shard pieces each rank owns). Loading
//            reads the logical tensor and keeps this rank's shard, so the TP layout may change between
//            save and load. (The sharded, reshardable format of the checkpointing issue replaces this.)
//   meta:    config (Config::to_json), fingerprint + math_fields, iteration, consumed samples,
//            optimizer step, LR scheduler state, RNG state (dropout stream), data cursor.
// Loading checks the math fingerprint first: a checkpoint of a different model is refused with the
// differing fields named (override_config_check turns that into a warning).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "mcpp/tensor_parallel/random.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/parallel_state/parallel_context.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp {

class Adam;
class DistributedOptimizer;

// The optimizer whose state a checkpoint carries: plain Adam (state per parameter) or the distributed
// optimizer (state per shard piece; saved logically, so it reloads under another DP size or without it).
struct OptimizerRef {
  Adam* adam = nullptr;
  DistributedOptimizer* distributed = nullptr;
  bool empty() const { return !adam && !distributed; }
};

struct TrainerState {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
  int64_t consumed_valid_samples = 0;
  tensor_parallel::RngTracker rng;  // dropout streams (default + model-parallel); offsets checkpointed
  nlohmann::json scheduler = nlohmann::json::object();
};

struct LoadOptions {
  bool load_optimizer = true;   // --no-load-optim turns off
  bool load_rng = true;         // --no-load-rng turns off
  bool finetune = false;        // --finetune: weights only, iteration and counters restart at 0
  bool override_config_check = false;
};

// Saves iteration `state.iteration` under save_dir; returns the committed directory.
std::string save_training_checkpoint(const std::string& save_dir, const Config& config, GPTModel& model,
                                     OptimizerRef optimizer, const TrainerState& state,
                                     const parallel_state::ParallelContext& pc);

// Loads the latest (or given) checkpoint under load_dir into model (+ optimizer, state). Returns false when
// load_dir has no checkpoint yet (Megatron starts from scratch then); throws mcpp::Error on a bad one.
bool load_training_checkpoint(const std::string& load_dir, const Config& config, GPTModel& model,
                              OptimizerRef optimizer, TrainerState& state, const LoadOptions& opt);

// Inference: the config stored in the checkpoint and a model holding its weights.
struct LoadedModel {
  Config config;
  std::unique_ptr<GPTModel> model;
  int64_t iteration = 0;
};
LoadedModel load_model_for_inference(const std::string& load_dir);

}  // namespace mcpp
