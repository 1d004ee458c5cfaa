// Config: every package's config together — what `mcpp train` parses, validates, stores in checkpoints and prints
// (DESIGN.md decision 6). Each part is its package's struct with its own field table and validate():
//   model     TransformerConfig              transformer/transformer_config.h
//   parallel  ParallelConfig                 parallel_state/parallel_config.h
//   ddp       DistributedDataParallelConfig  distributed/ddp_config.h   (its keys live in the "parallel" section)
//   training  TrainingConfig                 training/training_config.h
//   optimizer OptimizerConfig                optimizer/optimizer_config.h
//   data      DataConfig                     datasets/data_config.h
// Config adds the rules across them (validate), the facts that need the world (apply_world_size; the microbatch
// calculator, num_microbatches_calculator.cpp), and everything generated from the tables over all of them: the
// JSON (config_json.cpp), the checkpoint's math fingerprint and --use-checkpoint-args. The CLI flags are generated
// from the same tables in arguments.cpp.
//
// Life cycle: defaults -> TOML / flags (or from_json) -> finalize() fills the 0-defaults -> validate().
// finalize() is idempotent, so a finalized config survives to_json -> from_json -> finalize unchanged.
// Facts that need the world (data-parallel size, global batch default) come later through apply_world_size();
// the padded vocabulary through TransformerConfig::set_vocab_size().
//
// JSON layout (also the TOML layout, see arguments.h): {"model": {...}, "parallel": {...},
// "training": {...}, "optimizer": {...}, "data": {...}} with the field names of the tables; enums are written
// as Megatron's strings ("LayerNorm", "rope", "cosine", "WSD", ...).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mcpp/datasets/data_config.h"
#include "mcpp/distributed/ddp_config.h"
#include "mcpp/optimizer/optimizer_config.h"
#include "mcpp/parallel_state/parallel_config.h"
#include "mcpp/parallel_state/parallel_context.h"
#include "mcpp/training/training_config.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp {

namespace tools {
struct PlanConfig;
}

struct Config {
  TransformerConfig model;
  ParallelConfig parallel;
  DistributedDataParallelConfig ddp;
  TrainingConfig training;
  OptimizerConfig optimizer;
  DataConfig data;

  void finalize();        // model.finalize + lr_decay_iters / _samples default + sequence_parallel at tp == 1
  void validate() const;  // each struct's validate + the rules across them
  // What only training needs (a data path); separate so forward/generate can use a model-only config.
  void validate_for_training() const;
  // Sets parallel.data_parallel_size = world / (tp * pp * cp), fills the global batch default and
  // checks global_batch_size % (micro_batch_size * dp) == 0; sample-based, sets train_iters = train_samples /
  // global_batch_size (Megatron's update_train_iters). Throws naming the field.
  void apply_world_size(int64_t world_size);
  // The LR schedule's lengths in the training's unit (Megatron's iteration- / sample-based rules); part of validate.
  void validate_lr_schedule() const;
  // The microbatch calculator (Megatron's num_microbatches_calculator; num_microbatches_calculator.cpp):
  int64_t num_microbatches() const;  // global / (micro * dp); needs apply_world_size
  // The global batch of the step that starts after `consumed` training samples: global_batch_size, or during a
  // --rampup-batch-size ramp Megatron's start + floor(consumed / (samples / increments)) * increment (up to and
  // including consumed == samples); and its microbatches per DP rank.
  int64_t global_batch_size_at(int64_t consumed) const;
  int64_t num_microbatches_at(int64_t consumed) const;

  // JSON of everything (stored in checkpoints, printed by --print-config). from_json starts from the
  // defaults, takes every key present, and rejects unknown keys and wrong types naming "section.key".
  nlohmann::json to_json() const;
  static Config from_json(const nlohmann::json& j);
  // The fields that change the model's math (the field tables' fingerprint rules: architecture, vocab, norms;
  // init, dropout, attention implementation, seq_length and everything outside the model are excluded: they do
  // not change the function a checkpoint computes). Used to refuse loading into a different model.
  nlohmann::json math_fields() const;
  std::string fingerprint() const;  // xxh3-64 hex (16 digits) of math_fields().dump()
  // Megatron's --use-checkpoint-args: the model fields marked checkpoint_arg (the architecture) from a checkpoint's
  // stored model config, over what the flags and the config file said.
  void use_checkpoint_model_args(const TransformerConfig& saved);

  // What the memory planner reads (tools/memory_planner.h): model, parallel, micro and global batch, dtype.
  operator tools::PlanConfig() const;  // NOLINT(google-explicit-constructor): plan_memory(cfg) reads as it did
};

// Calls f(table, part) for every part of c (Config or const Config), in the JSON's section order: the one place
// that lists the field tables.
template <class C, class F>
void for_each_field_table(C& c, F&& f) {
  f(TransformerConfig::fields(), c.model);
  f(ParallelConfig::fields(), c.parallel);
  f(DistributedDataParallelConfig::fields(), c.ddp);
  f(TrainingConfig::fields(), c.training);
  f(OptimizerConfig::fields(), c.optimizer);
  f(DataConfig::fields(), c.data);
}

// Fields whose values differ between two math_fields() objects, e.g. {"hidden_size: 64 vs 128"};
// a field present on one side only reads "name: <absent> vs 4".
std::vector<std::string> diff_math_fields(const nlohmann::json& a, const nlohmann::json& b);

// Every launch-layout rule with clear errors naming the field: the grid rules of ParallelLayout::make,
// opt agrees with cfg.parallel, num_attention_heads / num_query_groups / ffn_hidden_size % tp,
// num_layers % pp (unless opt.pipeline_model_parallel_layout is set), sequence_parallel needs tp > 1
// and seq_length % (tp*cp) == 0, padded_vocab_size % tp (when set; TransformerConfig::set_vocab_size pads).
void validate_parallel_layout(int64_t world_size, const Config& cfg, const parallel_state::ParallelOptions& opt);
void validate_parallel_layout(int64_t world_size, const Config& cfg);  // opt = parallel_options(cfg.parallel)

}  // namespace mcpp
