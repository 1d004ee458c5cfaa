// Trainer <-> checkpoint glue (Megatron's training/checkpointing.py): what a training checkpoint holds
// and how it is restored. Collective over the ParallelContext.
//   tensors: sharded (dist_checkpointing/sharded_save.h): every rank writes only what it owns, as
//            global-offset shards of the LOGICAL tensors — its TP shard of each parameter (one shard
//            per TP segment), with replicas (over DP, and over TP for replicated params) written once by
//            the owner xxh3(key) % dp (and (xxh3 >> 32) % tp); fp32 Adam state "optimizer.exp_avg.<key>"
//            / "optimizer.exp_avg_sq.<key>" the same way, or with the distributed optimizer each DP
//            rank's pieces (flat ranges of the TP-local tensor) as rectangles of the logical tensor.
//            Loading plans reads per target rect (CheckpointReader::read_region), so TP, DP and the
//            distributed optimizer on/off may all change between save and load.
//   meta:    config (Config::to_json), fingerprint + math_fields, iteration, consumed samples,
//            optimizer step, LR scheduler state, data cursor, the layout (meta.parallel), RNG state:
//            meta.rng = rank 0's dropout-stream offsets (the fallback) and meta.rng_per_rank = every
//            rank's tracker state keyed by its coordinates "tp<t>.pp<p>.dp<d>.cp<c>" (all-gathered over
//            the world at save). On load with the same layout (tp, pp, vp, dp, cp) each rank restores its
//            own entry; with another layout every rank takes meta.rng and the log says so.
//   chunks:  the model chunks of this rank (one per virtual pipeline stage; layer keys are global, so
//            save and load work chunk by chunk and any change of PP / virtual stages reshards).
// snapshot_training_checkpoint copies everything this rank writes into owned host tensors (the
// training pause of --async-save; a collective all-gather of the RNG states); save_training_checkpoint
// = snapshot + save_sharded_checkpoint.
// Loading checks the math fingerprint first: a checkpoint of a different model is refused with the
// differing fields named (override_config_check turns that into a warning).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mcpp/dist_checkpointing/checkpoint.h"
#include "mcpp/dist_checkpointing/sharded_tensor.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/tensor_parallel/random.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/parallel_state/parallel_context.h"
#include "mcpp/training/config.h"

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
  bool verify_checksums = true;  // --no-verify-checksums turns off
  uint64_t* bytes_read = nullptr;  // when set: bytes this rank read from data files (read amplification)
};

struct CheckpointSnapshot {
  int64_t iteration = 0;
  nlohmann::json meta;
  std::vector<dist_checkpointing::ShardedTensor> shards;  // owned copies
};

// Which ranks write replicated data (docs/CHECKPOINT_FORMAT.md, "Who writes what").
struct SaveOwnership {
  int dp = 1, dp_rank = 0, tp = 1, tp_rank = 0;
  int edp = 1, edp_rank = 0;  // expert-DP: the replicas of an expert's parameters (ParamSpec::expert)
  int etp = 1, etp_rank = 0;  // expert-TP: an expert's parameter not split over it is replicated there
};
SaveOwnership save_ownership(const parallel_state::ParallelContext& pc);

// This rank's shards of the model chunks and optimizer state (owned copies), by the ownership rule.
std::vector<dist_checkpointing::ShardedTensor> collect_checkpoint_shards(const std::vector<ModelChunk*>& chunks,
                                                                          OptimizerRef optimizer,
                                                                          const SaveOwnership& own);
// meta.optimizer for `optimizer` ({"step", "distributed"} or null).
nlohmann::json optimizer_meta(OptimizerRef optimizer);

CheckpointSnapshot snapshot_training_checkpoint(const Config& config, const std::vector<ModelChunk*>& chunks,
                                                OptimizerRef optimizer, const TrainerState& state,
                                                const parallel_state::ParallelContext& pc);

// Saves iteration `state.iteration` under save_dir; returns the committed directory.
std::string save_training_checkpoint(const std::string& save_dir, const Config& config,
                                     const std::vector<ModelChunk*>& chunks, OptimizerRef optimizer,
                                     const TrainerState& state, const parallel_state::ParallelContext& pc);

// Loads the latest (or given) checkpoint under load_dir into model (+ optimizer, state). Returns false when
// load_dir has no checkpoint yet (Megatron starts from scratch then); throws mcpp::Error on a bad one.
// `pc` (may be null: offline tools) selects this rank's RNG entry; without it RNG is left alone.
bool load_training_checkpoint(const std::string& load_dir, const Config& config, const std::vector<ModelChunk*>& chunks,
                              OptimizerRef optimizer, TrainerState& state, const LoadOptions& opt,
                              const parallel_state::ParallelContext* pc);

// Reads the model chunks and (plain Adam) optimizer moments from an open reader, any saved layout. A model whose
// fp32 masters the distributed optimizer holds (mixed precision) needs that optimizer: its master shard is
// filled from the same reads.
void read_model_chunks(const dist_checkpointing::CheckpointReader& reader, const std::vector<ModelChunk*>& chunks,
                       const DistributedOptimizer* optimizer = nullptr);
void read_adam_state(const dist_checkpointing::CheckpointReader& reader, const std::vector<ModelChunk*>& chunks,
                     Adam& adam);

// Inference: the config stored in the checkpoint and a model holding its weights (one rank, any saved layout), on
// `device` with `param_dtype` parameters (BF16: mixed precision, the CUDA backend).
struct LoadedModel {
  Config config;
  std::unique_ptr<ModelChunk> model;
  int64_t iteration = 0;
};
LoadedModel load_model_for_inference(const std::string& load_dir, Device device = Device::CPU,
                                     DType param_dtype = DType::F32);

// Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by x tp, so the same tokenizer gives
// another padded size at another TP (GPT-2's 50257: 50304 at TP1, 50432 at TP2). Called after the tokenizer set
// cfg.model.padded_vocab_size: when the latest checkpoint under cfg.training.load has the same vocab_size and
// another padded size that is a multiple of this run's make_vocab_size_divisible_by x tp, adopt it (logged);
// when it is not, fail naming the --make-vocab-size-divisible-by value that pads to it (if any). No checkpoint,
// no stored config, or another vocab_size: nothing changes (the fingerprint check names the difference) — except for
// an imported Hugging Face checkpoint whose vocabulary rows hold every id of the tokenizer (its vocab_size is the
// embedding's rows, e.g. Qwen3's 151,936 for 151,669 ids): then its vocab_size and padded size are adopted (logged).
// Returns true when the saved sizes were adopted.
bool adopt_checkpoint_vocab_padding(Config& cfg);

}  // namespace mcpp
