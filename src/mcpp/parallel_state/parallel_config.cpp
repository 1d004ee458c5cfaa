// ParallelConfig's field table and validate(); contract in parallel_config.h.
#include "mcpp/parallel_state/parallel_config.h"

#include "mcpp/core/error.h"

namespace mcpp {

namespace {
using Self = ParallelConfig;
using config::Range;
using config::require_non_negative;
using config::require_positive;
}  // namespace

// Nothing here changes the function a checkpoint computes (the fingerprint): the table's default is Never.
const config::FieldTable<ParallelConfig>& ParallelConfig::fields() {
  static const config::FieldTable<Self> table{
      "parallel", config::Fingerprint::Never,
      {
          MCPP_FIELD(tensor_model_parallel_size).flag("--tensor-model-parallel-size"),
          MCPP_FIELD(pipeline_model_parallel_size).flag("--pipeline-model-parallel-size"),
          MCPP_FIELD(context_parallel_size).flag("--context-parallel-size"),
          MCPP_FIELD(cp_comm_type).flag("--cp-comm-type"),
          MCPP_FIELD(num_layers_per_virtual_pipeline_stage).flag("--num-layers-per-virtual-pipeline-stage"),
          MCPP_FIELD(sequence_parallel).store_true("--sequence-parallel"),
          MCPP_FIELD(tp_comm_overlap)
              .store_true("--tp-comm-overlap",
                          "SP all-gathers as a ring over TP, each chunk's GEMM overlapping the next transfer"),
          MCPP_FIELD(use_distributed_optimizer).store_true("--use-distributed-optimizer"),
          MCPP_FIELD(expert_model_parallel_size).flag("--expert-model-parallel-size"),
          MCPP_FIELD(expert_tensor_parallel_size).flag("--expert-tensor-parallel-size"),
          MCPP_FIELD(rank_order).flag("--rank-order", "RankGenerator order string (default tp-cp-ep-dp-pp)"),
          MCPP_FIELD(pipeline_model_parallel_layout).flag("--pipeline-model-parallel-layout"),
          MCPP_FIELD(decoder_first_pipeline_num_layers).flag("--decoder-first-pipeline-num-layers"),
          MCPP_FIELD(decoder_last_pipeline_num_layers).flag("--decoder-last-pipeline-num-layers"),
          MCPP_FIELD(account_for_embedding_in_pipeline_split)
              .store_true("--account-for-embedding-in-pipeline-split",
                          "count the embedding as a layer when splitting layers over pipeline stages"),
          MCPP_FIELD(account_for_loss_in_pipeline_split)
              .store_true("--account-for-loss-in-pipeline-split",
                          "count the loss (output layer) as a layer when splitting layers over pipeline stages"),
          MCPP_FIELD(variable_seq_lengths)
              .store_true("--variable-seq-lengths", "exchange activation shapes between stages"),
          MCPP_FIELD(distributed_timeout_minutes).flag("--distributed-timeout-minutes").range(Range::positive()),
          MCPP_FIELD(check_collectives)
              .store_true("--check-collectives", "compare a fingerprint of every collective across ranks"),
          MCPP_FIELD(flight_recorder_checksums)
              .store_true("--flight-recorder-checksums",
                          "record a checksum of each call's payload and shared result in the flight recorder "
                          "(mcpp debug hang names the first result that differs across ranks; syncs on CUDA)"),
          MCPP_FIELD(data_parallel_size)
              .no_flag("derived: world size / (tp * pp * cp), set by Config::apply_world_size"),
      }};
  return table;
}

void ParallelConfig::validate() const {
  config::check_fields(fields(), *this);
  require_positive(tensor_model_parallel_size, "tensor_model_parallel_size");
  require_positive(pipeline_model_parallel_size, "pipeline_model_parallel_size");
  require_positive(context_parallel_size, "context_parallel_size");
  if (cp_comm_type != "a2a" && cp_comm_type != "p2p")
    fail("cp_comm_type '{}': 'a2a' (all-to-all, DeepSpeed-Ulysses) and 'p2p' (ring attention) are implemented; "
         "Megatron's 'all_gather' / 'a2a+p2p' forms are not", cp_comm_type);
  require_non_negative(num_layers_per_virtual_pipeline_stage, "num_layers_per_virtual_pipeline_stage");
  require_non_negative(data_parallel_size, "data_parallel_size");
  require_positive(expert_model_parallel_size, "expert_model_parallel_size");
  require_non_negative(expert_tensor_parallel_size, "expert_tensor_parallel_size");
  if (num_layers_per_virtual_pipeline_stage > 0 && pipeline_model_parallel_size <= 2)
    fail("num_layers_per_virtual_pipeline_stage needs pipeline_model_parallel_size > 2 (Megatron), got {}",
         pipeline_model_parallel_size);
}

}  // namespace mcpp
