// Layer placement over pipeline ranks and virtual stages (Megatron-Core: transformer_block.py
// get_num_layers_to_build, transformer_layer.py get_layer_offset, pipeline_parallel_layer_layout.py).
//
// Output: for each (pp_rank, vp_stage) the global decoder-layer indices it builds, and whether it holds
// the embedding (pre_process) and the output layer + loss (post_process). Layers are numbered in model
// order, which visits stages vp-major: (vp 0: rank 0, 1, .., pp-1), (vp 1: rank 0, ..), ...
//
// Sources of the placement, in Megatron's precedence:
//   1. pipeline_model_parallel_layout (--pipeline-model-parallel-layout), Megatron's grammar:
//        stages separated by '|'; 'E' embedding, 'L' loss/output, 't' transformer layer, 'm' an MTP depth
//        (mtp_num_layers of them, all in the stage of 'L': the depths run where the loss is, as Megatron's
//        default placement; Megatron's MTP on an earlier stage is not implemented); 'x*n' repeats the
//        group (which may contain '|'); ',' is cosmetic and ignored. The k-th stage is
//        (vp = k / pp, rank = k % pp), so pp*V entries give V virtual stages. E must be the first and L
//        the last item of the model, each exactly once, and the number of 't' must equal num_layers.
//        Example "E|t*3|t*3|t*2,L" at pp=4: rank 0 {E}, rank 1 {0,1,2}, rank 2 {3,4,5}, rank 3 {6,7,L}.
//   2. decoder_first/last_pipeline_num_layers (--decoder-first-pipeline-num-layers / -last-): the first
//      (last) rank holds that many layers, the rest are split evenly over the other ranks.
//   3. account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split
//      (--account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split, Megatron-Core's
//      get_num_layers_to_build): the embedding (the loss) counts as one more layer; the num_layers + 1 (+ 1)
//      slots split evenly over pp * V stages, and the first stage (the last) builds one decoder layer
//      fewer. Not with 2. Example: 8 layers, pp = 3, the embedding counted: ranks build 2, 3, 3.
//   4. even split: num_layers / pp per rank.
// With V > 1 (num_layers_per_virtual_pipeline_stage or num_virtual_stages_per_pipeline_rank) each rank's
// count is split evenly over its V chunks. Every count that does not divide is an mcpp::Error naming the
// flag; a malformed layout string names the position (0-based, in the string as given) and the problem.
// Pure computation.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mcpp {
struct TransformerConfig;
struct ParallelConfig;
}  // namespace mcpp

namespace mcpp::pipeline_parallel {

struct LayoutOptions {
  int64_t num_layers = 1;
  int64_t pipeline_model_parallel_size = 1;
  int64_t num_layers_per_virtual_pipeline_stage = 0;  // 0 = unset
  int64_t num_virtual_stages_per_pipeline_rank = 0;   // 0 = unset (alternative to the above)
  int64_t decoder_first_pipeline_num_layers = -1;     // -1 = unset
  int64_t decoder_last_pipeline_num_layers = -1;      // -1 = unset
  bool account_for_embedding_in_pipeline_split = false;
  bool account_for_loss_in_pipeline_split = false;
  std::string pipeline_model_parallel_layout{};       // "" = unset
  int64_t mtp_num_layers = 0;  // a layout's 'm' items: exactly this many, in the stage that holds the loss 'L'
};

struct StageLayers {
  std::vector<int64_t> layers;  // global decoder-layer indices, ascending
  bool pre_process = false;     // holds the embedding
  bool post_process = false;    // holds the final norm / output layer / loss
};

struct PipelineLayout {
  int64_t pipeline_model_parallel_size = 1;
  int64_t virtual_pipeline_model_parallel_size = 1;
  std::vector<std::vector<StageLayers>> stages;  // [pp_rank][vp_stage]

  const StageLayers& at(int64_t pp_rank, int64_t vp_stage) const;
};

// Megatron's LayerType per item of a parsed layout string.
enum class LayoutItem { Embedding, Decoder, Loss, Mtp };

// Parses a layout string into its '|'-separated stages (no size checks). Errors name the position.
std::vector<std::vector<LayoutItem>> parse_pipeline_layout(const std::string& layout);

PipelineLayout make_pipeline_layout(const LayoutOptions& opt);

// The options the typed config holds: num_layers, pipeline_model_parallel_size,
// num_layers_per_virtual_pipeline_stage, pipeline_model_parallel_layout,
// decoder_first/last_pipeline_num_layers.
LayoutOptions layout_options(const TransformerConfig& model, const ParallelConfig& parallel);

// One line per (rank, vp): "rank 0 vp 0: E t0 t1" — for logs and error messages.
std::string to_string(const PipelineLayout& layout);

}  // namespace mcpp::pipeline_parallel
