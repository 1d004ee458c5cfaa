// ParallelConfig: how the model is split over ranks (Megatron's --tensor-model-parallel-size, ... ; the parallel
// section of the config JSON / TOML). Fields declared once in fields() (core/config_fields.h); validate() checks
// its own fields (one-line mcpp::Error naming the field); the rules across configs are training/config.h's.
// The data-parallel reduction's fields (buckets, overlap) are distributed/ddp_config.h's, also in the "parallel"
// section of the JSON.
#pragma once
#include <cstdint>
#include <string>

#include "mcpp/core/config_fields.h"

namespace mcpp {

struct ParallelConfig {
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  int64_t context_parallel_size = 1;
  // Megatron's --cp-comm-type: how the attention sees the whole sequence under context parallelism. "a2a"
  // (DeepSpeed-Ulysses all-to-all: sequence traded for query groups around the core attention,
  // tensor_parallel/mappings.h; each rank holds a contiguous s / cp chunk) or "p2p" (ring attention,
  // transformer/ring_attention.h: key / value blocks passed around the CP ranks, each rank holding the causally
  // load-balanced chunks r and 2cp-1-r of 2cp, transformer/context_parallel.h). "all_gather" / "a2a+p2p" are refused.
  std::string cp_comm_type = "a2a";
  int64_t num_layers_per_virtual_pipeline_stage = 0;  // 0 -> no interleaving
  bool sequence_parallel = false;         // Config::finalize turns it off at tp == 1, as Megatron does
  // Megatron's --tp-comm-overlap (sequence parallel only): each SP all-gather feeding a GEMM runs as a ring
  // over the TP group, the GEMM of each arrived chunk overlapping the next chunk's transfer
  // (tensor_parallel/layers.h). Config::finalize turns it off with sequence_parallel at tp == 1.
  bool tp_comm_overlap = false;
  bool use_distributed_optimizer = false;
  int64_t expert_model_parallel_size = 1;
  int64_t expert_tensor_parallel_size = 0;  // 0 -> tensor_model_parallel_size (Megatron's default)
  std::string rank_order = "tp-cp-ep-dp-pp";  // Megatron's order string (RankGenerator)
  std::string pipeline_model_parallel_layout;  // --pipeline-model-parallel-layout, e.g. "E|t*3|t*3|t*2,L"
  int64_t decoder_first_pipeline_num_layers = -1;  // -1 = unset: uneven split (pipeline_parallel/layout.h)
  int64_t decoder_last_pipeline_num_layers = -1;
  // Megatron-Core's account_for_embedding/loss_in_pipeline_split: the embedding / the loss counts as one
  // layer when the layers are split over the pipeline stages (pipeline_parallel/layout.h).
  bool account_for_embedding_in_pipeline_split = false;
  bool account_for_loss_in_pipeline_split = false;
  // --variable-seq-lengths: microbatches may differ in sequence length; pipeline stages exchange the
  // activation shape before each P2P transfer (Megatron's ModelParallelConfig.variable_seq_lengths).
  bool variable_seq_lengths = false;
  // Communicator debugging (comm/): the watchdog timeout and the per-collective fingerprint check.
  float distributed_timeout_minutes = 10.0f;
  bool check_collectives = false;
  // --flight-recorder-checksums: the flight recorder also keeps a checksum of each call's payload and of the result
  // all members must share (comm/flight_recorder.h); `mcpp debug hang` names the first result that differs.
  bool flight_recorder_checksums = false;
  int64_t data_parallel_size = 0;  // derived by Config::apply_world_size; 0 until then

  int64_t expert_tp() const {  // the expert-TP size in use
    return expert_tensor_parallel_size == 0 ? tensor_model_parallel_size : expert_tensor_parallel_size;
  }
  bool cp_ring() const { return cp_comm_type == "p2p"; }  // the ring form (in use when context_parallel_size > 1)
  // Whether a custom layer placement is given (then pipeline_parallel/layout.h checks the counts).
  bool custom_pipeline_layout() const {
    return !pipeline_model_parallel_layout.empty() || decoder_first_pipeline_num_layers >= 0 ||
           decoder_last_pipeline_num_layers >= 0 || account_for_embedding_in_pipeline_split ||
           account_for_loss_in_pipeline_split;
  }
  static const config::FieldTable<ParallelConfig>& fields();
  void validate() const;
};

}  // namespace mcpp
