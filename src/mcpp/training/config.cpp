// Config: finalize, the validation rules across the packages' configs, --use-checkpoint-args and the planner's
// view; contract in config.h. JSON and fingerprint: config_json.cpp; the microbatch calculator:
// num_microbatches_calculator.cpp.
#include "mcpp/training/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <span>
#include <string>
#include <vector>
#include <utility>

#include "mcpp/core/device_memory.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/tools/memory_planner.h"

namespace mcpp {

namespace {
// --fp8-recipe blockwise scales 1x128 tiles along every GEMM's reduction dim and 128x128 weight blocks (ops.h
// Fp8Block): each dim of each FP8 linear's three GEMMs (the tokens of this rank's microbatch, and per TP rank the
// linears' in and out sizes; multi-latent attention's and the routed experts' linears are not FP8) must be a multiple
// of 128.
void check_fp8_blockwise_dims(const TransformerConfig& m, int64_t tp, int64_t cp, int64_t micro_batch_size) {
  std::vector<std::pair<std::string, int64_t>> dims = {
      {"seq_length * micro_batch_size / context_parallel_size (the tokens of a GEMM)",
       m.seq_length * micro_batch_size / cp},
      {"hidden_size", m.hidden_size}};
  if (!m.multi_latent_attention) {
    dims.push_back({"(num_attention_heads + 2 * num_query_groups) * kv_channels / tp (linear_qkv's output)",
                    (m.num_attention_heads + 2 * m.num_query_groups) * m.kv_channels / tp});
    dims.push_back({"num_attention_heads * kv_channels / tp (linear_proj's input)",
                    m.num_attention_heads * m.kv_channels / tp});
  }
  const std::vector<bool> moe = m.moe_layer_pattern();
  if (m.num_moe_experts == 0 || std::find(moe.begin(), moe.end(), false) != moe.end())
    dims.push_back({"ffn_hidden_size / tp", m.ffn_hidden_size / tp});
  if (m.num_moe_experts > 0 && m.moe_shared_expert_intermediate_size > 0)
    dims.push_back({"moe_shared_expert_intermediate_size / tp", m.moe_shared_expert_intermediate_size / tp});
  for (const auto& [name, v] : dims)
    if (v % ops::kFp8BlockLen != 0)
      fail("fp8_recipe: blockwise FP8 scales 1x128 tiles and 128x128 blocks: {} must be a multiple of 128; got {}",
           name, v);
}
}  // namespace

void Config::finalize() {
  model.finalize();
  if (training.train_samples > 0) {
    if (optimizer.lr_decay_samples == 0) optimizer.lr_decay_samples = training.train_samples;
  } else if (optimizer.lr_decay_iters == 0) {
    optimizer.lr_decay_iters = training.train_iters;
  }
  if (parallel.tensor_model_parallel_size == 1) parallel.sequence_parallel = parallel.tp_comm_overlap = false;
}

void Config::validate() const {
  model.validate();
  parallel.validate();
  ddp.validate();
  training.validate();
  optimizer.validate();
  data.validate();
  validate_lr_schedule();
  if (ddp.overlap_param_gather && !parallel.use_distributed_optimizer)
    fail("overlap_param_gather needs use_distributed_optimizer (Megatron)");
  if (ddp.fp8_param_gather) {  // Megatron: FP8 weights, all-gathered in FP8 by the distributed optimizer
    if (!model.fp8()) fail("fp8_param_gather needs FP8 training (--fp8-format e4m3|hybrid)");
    if (!parallel.use_distributed_optimizer)
      fail("fp8_param_gather needs use_distributed_optimizer (Megatron: the FP8 weights are all-gathered by it)");
    fail("fp8_param_gather is not implemented: the weights are kept and all-gathered in the model's dtype and cast "
         "to FP8 per GEMM (drop --fp8-param-gather; docs/FP8.md)");
  }
  const int64_t tp = parallel.tensor_model_parallel_size, pp = parallel.pipeline_model_parallel_size;
  const int64_t cp = parallel.context_parallel_size;
  if (model.num_attention_heads % tp != 0)
    fail("num_attention_heads ({}) must be divisible by tensor_model_parallel_size ({})", model.num_attention_heads, tp);
  if (model.num_query_groups % tp != 0)
    fail("num_query_groups ({}) must be divisible by tensor_model_parallel_size ({})", model.num_query_groups, tp);
  if (model.multi_latent_attention) {  // the down projections are column parallel, then gathered (Megatron's spec)
    if (model.q_lora_rank % tp != 0)
      fail("q_lora_rank ({}) must be divisible by tensor_model_parallel_size ({}): linear_q_down_proj is column "
           "parallel", model.q_lora_rank, tp);
    if ((model.kv_lora_rank + model.qk_pos_emb_head_dim) % tp != 0)
      fail("kv_lora_rank + qk_pos_emb_head_dim ({}) must be divisible by tensor_model_parallel_size ({}): "
           "linear_kv_down_proj is column parallel", model.kv_lora_rank + model.qk_pos_emb_head_dim, tp);
  }
  if (model.ffn_hidden_size % tp != 0)
    fail("ffn_hidden_size ({}) must be divisible by tensor_model_parallel_size ({})", model.ffn_hidden_size, tp);
  if (!parallel.custom_pipeline_layout() && model.num_layers % pp != 0)
    fail("num_layers ({}) must be divisible by pipeline_model_parallel_size ({})", model.num_layers, pp);
  if (!parallel.custom_pipeline_layout() && parallel.num_layers_per_virtual_pipeline_stage > 0 &&
      (model.num_layers / pp) % parallel.num_layers_per_virtual_pipeline_stage != 0)
    fail("num_layers_per_virtual_pipeline_stage ({}) must divide num_layers / pipeline_model_parallel_size ({})",
         parallel.num_layers_per_virtual_pipeline_stage, model.num_layers / pp);
  if (cp > 1 && model.seq_length % (2 * cp) != 0)
    fail("seq_length ({}) must be divisible by 2 * context_parallel_size ({})", model.seq_length, 2 * cp);
  const bool ring = cp > 1 && parallel.cp_ring();
  if (cp > 1 && !ring && model.num_query_groups % (tp * cp) != 0)  // all-to-all: each rank takes whole groups
    fail("num_query_groups ({}) must be divisible by tensor_model_parallel_size * context_parallel_size ({}) with "
         "context parallelism (all-to-all: each rank attends over whole query groups; --cp-comm-type p2p has no "
         "such rule)", model.num_query_groups, tp * cp);
  if (ring && model.attention_impl != "flash")
    fail("cp_comm_type p2p: the ring attention merges blockwise (flash) results; --attention-impl {} is not "
         "supported with it (use flash, or --cp-comm-type a2a)", model.attention_impl);
  if (parallel.tp_comm_overlap && !parallel.sequence_parallel)
    fail("tp_comm_overlap: the tensor-parallel communication overlap needs --sequence-parallel (Megatron)");
  if (model.fp8()) {  // (tensor_parallel/fp8_state.h)
    if (model.fp8_recipe == "blockwise") check_fp8_blockwise_dims(model, tp, cp, training.micro_batch_size);
    if (parallel.tp_comm_overlap)
      fail("fp8_format: FP8 linears with --tp-comm-overlap are not implemented (drop one of them)");
    if (training.device != "cpu" && !training.bf16)
      fail("fp8_format: FP8 training on the GPU (--device {}) needs --bf16 (Megatron's rule; on --device cpu the casts "
           "are emulated in fp32)", training.device);
    const int64_t tokens = model.seq_length * training.micro_batch_size / cp;
    if (training.device != "cpu" && (model.hidden_size % 16 != 0 || model.ffn_hidden_size % (16 * tp) != 0 ||
                                     model.kv_channels * model.num_attention_heads % (16 * tp) != 0 ||
                                     tokens % 16 != 0))
      fail("fp8_format: cuBLASLt's FP8 GEMMs need hidden_size, ffn_hidden_size / tp, num_attention_heads * kv_channels "
           "/ tp and seq_length * micro_batch_size / cp multiples of 16; got {}, {}, {}, {}", model.hidden_size,
           model.ffn_hidden_size / tp, model.kv_channels * model.num_attention_heads / tp, tokens);
  }
  if (parallel.sequence_parallel && model.seq_length % (tp * cp) != 0)
    fail("seq_length ({}) must be divisible by tensor_model_parallel_size * context_parallel_size ({}) with "
         "sequence_parallel", model.seq_length, tp * cp);
  if (model.num_moe_experts > 0) {  // what the MoE layers run with so far (transformer/moe/moe_layer.h)
    if (tp > 1 && !parallel.sequence_parallel)
      fail("num_moe_experts: MoE layers with tensor_model_parallel_size {} need --sequence-parallel (Megatron's "
           "rule: each TP rank routes its own tokens)", tp);
    const int64_t etp = parallel.expert_tp();
    if (model.moe_ffn_hidden_size % etp != 0)
      fail("moe_ffn_hidden_size ({}) must be divisible by expert_tensor_parallel_size ({}; the default is "
           "tensor_model_parallel_size): each expert's FFN is split over it", model.moe_ffn_hidden_size, etp);
    if (training.enable_cuda_graph && etp > 1)
      fail("enable_cuda_graph: not implemented with expert_tensor_parallel_size {} (the default is "
           "tensor_model_parallel_size); pass --expert-tensor-parallel-size 1", etp);
    const int64_t ep = parallel.expert_model_parallel_size;
    if (model.num_moe_experts % ep != 0)
      fail("num_moe_experts ({}) must be divisible by expert_model_parallel_size ({})", model.num_moe_experts, ep);
    if (model.moe_shared_expert_intermediate_size % tp != 0)
      fail("moe_shared_expert_intermediate_size ({}) must be divisible by tensor_model_parallel_size ({}): the "
           "shared expert is tensor parallel", model.moe_shared_expert_intermediate_size, tp);
    const bool padded = model.moe_expert_capacity_factor > 0.0 && model.moe_pad_expert_input_to_capacity;
    if (model.moe_grouped_gemm && model.num_moe_experts / ep > ops::kMaxGemmGroups)
      fail("moe_grouped_gemm: {} local experts (num_moe_experts {} / expert_model_parallel_size {}); a grouped GEMM "
           "takes at most {}", model.num_moe_experts / ep, model.num_moe_experts, ep, ops::kMaxGemmGroups);
    // dropless with grouped GEMMs at EP 1 (expert-TP 1: above): the experts read the router's counts on the device
    const bool device_counts = model.moe_grouped_gemm && model.moe_expert_capacity_factor <= 0.0 && ep == 1;
    if (training.enable_cuda_graph && !padded && !device_counts)
      fail("enable_cuda_graph: a dropless MoE layer reads its experts' token counts on the host every layer (they "
           "size the dispatch buffer), which a captured step cannot do; set --moe-expert-capacity-factor and "
           "--moe-pad-expert-input-to-capacity (fixed buffers, as Megatron's CUDA graphs need), or run dropless with "
           "--moe-grouped-gemm at expert_model_parallel_size 1 (the counts stay on the device)");
  }
  if (data.packed_sequences()) {  // (transformer/packed_seq_params.h)
    const char* what = data.sft ? "sft" : data.reset_attention_mask ? "reset_attention_mask" : "reset_position_ids";
    if (cp > 1)
      fail("{}: packed sequences' document boundaries are not implemented with context_parallel_size {}", what, cp);
    if (training.enable_cuda_graph)
      fail("enable_cuda_graph: packed sequences ({}) change the document boundaries every batch, which a captured "
           "step does not read; drop one of them", what);
    if (model.mtp_num_layers > 0)
      fail("mtp_num_layers: multi-token prediction with packed sequences ({}) is not implemented (its rolled tokens "
           "would cross documents)", what);
  }
  if (data.tokenizer_type == "NullTokenizer" && model.vocab_size <= 0)
    fail("vocab_size must be given (--vocab-size) with tokenizer_type NullTokenizer");
  if (training.enable_cuda_graph) {  // what the captured step cannot contain (yet)
    if (parallel.expert_model_parallel_size > 1)
      fail("enable_cuda_graph: implemented for data, tensor (+ sequence), pipeline (1F1B, interleaved) and context "
           "parallelism, not expert_model_parallel_size {}", parallel.expert_model_parallel_size);
    if (parallel.variable_seq_lengths)
      fail("enable_cuda_graph: --variable-seq-lengths exchanges every P2P tensor's shape through the host (and a "
           "graph replays fixed shapes); drop one of them");
    if (parallel.flight_recorder_checksums)
      fail("flight_recorder_checksums: a checksum copies each call's tensors to the host, which a captured step "
           "cannot; drop --enable-cuda-graph for the debugging run");
  }
}

void Config::validate_for_training() const {
  validate();
  if (data.data_path.empty() && data.train_data_path.empty())
    fail("data_path: training needs --data-path (or --train-data-path)");
}

void Config::validate_lr_schedule() const {
  const OptimizerConfig& o = optimizer;
  const bool samples = training.train_samples > 0;
  // Megatron's rule: the schedule's lengths in the training's unit only
  using Field = std::pair<const char*, int64_t>;
  const Field iters[] = {{"lr_warmup_iters", o.lr_warmup_iters}, {"lr_decay_iters", o.lr_decay_iters},
                         {"lr_wsd_decay_iters", o.lr_wsd_decay_iters}};
  const Field by_samples[] = {{"lr_warmup_samples", o.lr_warmup_samples}, {"lr_decay_samples", o.lr_decay_samples},
                              {"lr_wsd_decay_samples", o.lr_wsd_decay_samples}};
  for (const auto& [name, value] : samples ? std::span<const Field>(iters) : std::span<const Field>(by_samples))
    if (value != 0)
      fail("{} ({}) is set with {}-based training; give the schedule in {} (--lr-*-{})", name, value,
           samples ? "sample" : "iteration", samples ? "samples" : "iterations", samples ? "samples" : "iters");
  const char* unit = samples ? "samples" : "iters";
  const int64_t decay = samples ? o.lr_decay_samples : o.lr_decay_iters;
  if (decay <= 0) fail("lr_decay_{} must be positive, got {}", unit, decay);
  const OptimizerConfig::Lengths len = o.lengths(samples, 1);  // in the training's unit (iterations or samples)
  if (len.warmup >= len.decay)
    fail("lr_warmup_{} ({}) must be smaller than lr_decay_{} ({})", unit, len.warmup, unit, decay);
  if (o.lr_decay_style == LrDecayStyle::WSD && (len.wsd <= 0.0 || len.wsd > len.decay))
    fail("lr_wsd_decay_{} ({}) must be in [1, lr_decay_{} = {}] with lr_decay_style WSD", unit, len.wsd, unit, decay);
}

void Config::use_checkpoint_model_args(const TransformerConfig& saved) {
  config::copy_checkpoint_args(TransformerConfig::fields(), model, saved);
}

Config::operator tools::PlanConfig() const {
  return tools::PlanConfig{.model = model,
                           .parallel = parallel,
                           .micro_batch_size = training.micro_batch_size,
                           .global_batch_size = training.global_batch_size,
                           .bf16 = training.bf16,
                           .device = training.device == "cuda" || (training.device == "auto" && cuda_available())
                                         ? Device::CUDA
                                         : Device::CPU};
}

void validate_parallel_layout(int64_t world_size, const Config& cfg, const parallel_state::ParallelOptions& opt) {
  const ParallelConfig& pc = cfg.parallel;
  if (opt.tensor_model_parallel_size != pc.tensor_model_parallel_size ||
      opt.pipeline_model_parallel_size != pc.pipeline_model_parallel_size ||
      opt.context_parallel_size != pc.context_parallel_size)
    fail("parallel options (tp {}, pp {}, cp {}) disagree with the config's tensor_model_parallel_size {}, "
         "pipeline_model_parallel_size {}, context_parallel_size {}", opt.tensor_model_parallel_size,
         opt.pipeline_model_parallel_size, opt.context_parallel_size, pc.tensor_model_parallel_size,
         pc.pipeline_model_parallel_size, pc.context_parallel_size);
  const parallel_state::ParallelLayout layout = parallel_state::ParallelLayout::make(world_size, opt);
  const int64_t tp = layout.tp(), pp = layout.pp(), cp = layout.cp();
  const TransformerConfig& m = cfg.model;
  const int64_t query_groups = m.num_query_groups > 0 ? m.num_query_groups : m.num_attention_heads;
  if (m.num_attention_heads % tp != 0)
    fail("num_attention_heads ({}) must be divisible by tensor_model_parallel_size ({})", m.num_attention_heads, tp);
  if (query_groups % tp != 0)
    fail("num_query_groups ({}) must be divisible by tensor_model_parallel_size ({})", query_groups, tp);
  if (m.ffn_hidden_size > 0 && m.ffn_hidden_size % tp != 0)
    fail("ffn_hidden_size ({}) must be divisible by tensor_model_parallel_size ({})", m.ffn_hidden_size, tp);
  if (opt.pipeline_model_parallel_layout.empty() && !cfg.parallel.custom_pipeline_layout() && m.num_layers % pp != 0)
    fail("num_layers ({}) must be divisible by pipeline_model_parallel_size ({})", m.num_layers, pp);
  if (pc.sequence_parallel && tp == 1)
    fail("sequence_parallel needs tensor_model_parallel_size > 1 (Config::finalize turns it off at tp == 1)");
  if (pc.sequence_parallel && m.seq_length % (tp * cp) != 0)
    fail("seq_length ({}) must be divisible by tensor_model_parallel_size * context_parallel_size ({}) with "
         "sequence_parallel", m.seq_length, tp * cp);
  if (m.padded_vocab_size > 0 && m.padded_vocab_size % tp != 0)
    fail("padded_vocab_size ({}) must be divisible by tensor_model_parallel_size ({}); TransformerConfig::"
         "set_vocab_size pads it", m.padded_vocab_size, tp);
}

void validate_parallel_layout(int64_t world_size, const Config& cfg) {
  validate_parallel_layout(world_size, cfg, parallel_state::parallel_options(cfg.parallel));
}

}  // namespace mcpp
