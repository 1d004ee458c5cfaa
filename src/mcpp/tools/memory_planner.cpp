#include "mcpp/tools/memory_planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "mcpp/core/error.h"
#include "mcpp/optimizer/distributed_optimizer.h"
#include "mcpp/pipeline_parallel/layout.h"
#include "mcpp/pipeline_parallel/schedules.h"
#include "mcpp/transformer/activation_dims.h"
#include "mcpp/transformer/multi_token_prediction.h"
#include "mcpp/transformer/transformer_layer.h"

namespace mcpp::tools {
namespace {

// The sizes the modules' saved_bytes formulas read (transformer/activation_dims.h).
ActivationDims activation_dims(const PlanConfig& cfg) {
  ActivationDims d =
      ActivationDims::of(cfg.model, cfg.parallel, cfg.micro_batch_size, cfg.bf16 ? DType::BF16 : DType::F32);
  d.device = cfg.device;
  return d;
}

}  // namespace

int64_t chunk_context_bytes(const PlanConfig& cfg, const std::vector<int64_t>& layers, bool pre_process,
                            bool post_process) {
  const ActivationDims d = activation_dims(cfg);
  const std::vector<bool> moe = cfg.model.moe_layer_pattern();
  const int64_t count = static_cast<int64_t>(layers.size());
  const int64_t hidden_local = d.n_local * d.h * d.e;  // one [s(/tp), b, h] residual-stream tensor
  int64_t bytes = d.n * 4;                             // the token ids [s, b] int32
  // The stage input: received (every non-first stage keeps it), or the embedding's output, kept where a layer
  // (or, with no layers, the final norm) reads it.
  if (!pre_process || count > 0 || post_process) bytes += hidden_local;
  // Layers in a full-recompute group keep nothing but the group's input (transformer_layer.h recompute_plan).
  std::vector<bool> dropped(static_cast<size_t>(count), false), group_start(static_cast<size_t>(count), false);
  for (const RecomputeGroup& g : recompute_plan(cfg.model, count)) {
    group_start[static_cast<size_t>(g.first)] = true;
    for (int64_t i = g.first; i < g.first + g.count; ++i) dropped[static_cast<size_t>(i)] = true;
  }
  for (int64_t i = 0; i < count; ++i) {
    if (dropped[static_cast<size_t>(i)]) {
      // the group's input; a group starting at layer 0 keeps the stage input, counted above
      if (group_start[static_cast<size_t>(i)] && i > 0) bytes += hidden_local;
      continue;
    }
    if (i > 0) bytes += hidden_local;  // this layer's input: the previous layer's fused residual sum
    const int64_t layer = layers[static_cast<size_t>(i)];
    ActivationDims dl = d;
    dl.fp8 = fp8_keeps_casts(cfg.model, layer);
    bytes += TransformerLayer::saved_bytes(cfg.model, dl, moe.at(static_cast<size_t>(layer)));
  }
  if (post_process) {
    if (count > 0) bytes += hidden_local;  // the final norm's input: the last layer's summed residual
    bytes += norm_stats_bytes(cfg.model, d);
    bytes += d.n * d.h * d.e;                                                  // the output layer's input
    bytes += d.n * (cfg.model.padded_vocab_size / cfg.parallel.tensor_model_parallel_size) * d.e;  // logits
    bytes += 3 * d.n * 4 + 8;  // labels, loss mask, lse; the loss statistics [2] fp32
    ActivationDims dm = d;  // the MTP depths' linears: the decoder's last layer's
    dm.fp8 = fp8_keeps_casts(cfg.model, cfg.model.num_layers - 1);
    bytes += cfg.model.mtp_num_layers * MultiTokenPredictionLayer::saved_bytes(cfg.model, dm);
  }
  return bytes;
}

int64_t chunk_params(const PlanConfig& cfg, const std::vector<int64_t>& layers, bool pre_process, bool post_process) {
  const TransformerConfig& m = cfg.model;
  const int64_t tp = cfg.parallel.tensor_model_parallel_size;
  const int64_t h = m.hidden_size, hn = m.head_dim();
  const int64_t np = m.num_attention_heads / tp, ng = m.num_query_groups / tp, f = m.ffn_hidden_size / tp;
  const int64_t norm = m.normalization == Normalization::LayerNorm ? 2 * h : h;
  const int64_t fc1_out = (m.swiglu ? 2 : 1) * f;
  const int64_t qkv_out = (np + 2 * ng) * hn;
  const int64_t bias = m.add_bias_linear ? 1 : 0;
  const int64_t dense_mlp = fc1_out * h + bias * fc1_out + h * f + bias * h;  // fc1, fc2
  const int64_t fs = m.moe_shared_expert_intermediate_size / tp, fs1 = (m.swiglu ? 2 : 1) * fs;
  const int64_t moe_mlp = m.num_moe_experts * h  // the router (experts: chunk_expert_params) + the shared expert
                          + (fs > 0 ? fs1 * h + bias * fs1 + h * fs + bias * h : 0)
                          + (m.moe_shared_expert_gate ? h : 0);  // its gate weight [1, h]
  int64_t attention = norm + qkv_out * h + (m.qkv_bias() ? qkv_out : 0)  // input_layernorm, linear_qkv
                      + h * np * hn + bias * h                             // linear_proj (bias replicated)
                      + norm                                               // pre_mlp_layernorm
                      + (m.qk_layernorm ? 2 * norm / h * hn : 0);          // q_layernorm, k_layernorm [hn]
  if (m.multi_latent_attention) {  // multi_latent_attention.h's linears (no biases but linear_proj's), latent norms
    const int64_t dq = m.qk_head_dim + m.qk_pos_emb_head_dim, rq = m.q_lora_rank, rkv = m.kv_lora_rank;
    const int64_t latent_norm = m.qk_layernorm ? norm / h : 0;  // weights (and biases) per channel of a latent
    attention = 2 * norm                                                            // input / pre_mlp layernorms
                + (rq > 0 ? rq / tp * h + np * dq * rq + latent_norm * rq : np * dq * h)  // q down / up, or q_proj
                + (rkv + m.qk_pos_emb_head_dim) / tp * h + np * (m.qk_head_dim + m.v_head_dim) * rkv  // kv down / up
                + latent_norm * rkv + h * np * m.v_head_dim + bias * h;                 // kv_layernorm, linear_proj
  }
  const std::vector<bool> moe = m.moe_layer_pattern();
  const int64_t vocab_local = m.padded_vocab_size / tp;
  const bool tied = !m.untie_embeddings_and_output_weights;
  int64_t p = 0;
  for (int64_t l : layers) p += attention + (moe.at(static_cast<size_t>(l)) ? moe_mlp : dense_mlp);
  if (pre_process) {
    p += vocab_local * h;  // word embeddings (vocab-parallel)
    if (m.position_embedding_type == PositionEmbedding::LearnedAbsolute) p += m.max_position_embeddings * h;
  }
  if (post_process) {
    p += norm;                                     // final_layernorm
    if (!tied || !pre_process) p += vocab_local * h;  // output_layer, or the tied embeddings' copy on the last stage
    if (m.mtp_num_layers > 0) {  // enorm, hnorm, eh_proj [h/tp, 2h], the transformer layer, final_layernorm per depth
      const bool moe_last = moe.at(static_cast<size_t>(m.num_layers - 1));
      p += m.mtp_num_layers * (3 * norm + (h / tp) * 2 * h + attention + (moe_last ? moe_mlp : dense_mlp));
      if (!tied && !pre_process) p += vocab_local * h;  // the word embeddings' copy for the depths' embeddings
    }
  }
  return p;
}

int64_t chunk_expert_params(const PlanConfig& cfg, const std::vector<int64_t>& layers, bool post_process) {
  const TransformerConfig& m = cfg.model;
  if (m.num_moe_experts == 0) return 0;
  const int64_t h = m.hidden_size, f = m.moe_ffn_hidden_size, bias = m.add_bias_linear ? 1 : 0;
  const int64_t etp = cfg.parallel.expert_tp();  // fc1's rows and fc2's columns split over expert-TP
  const int64_t fc1_out = (m.swiglu ? 2 : 1) * f / etp;
  const int64_t expert = fc1_out * h + bias * fc1_out + h * (f / etp) + bias * h;
  const std::vector<bool> moe = m.moe_layer_pattern();
  auto moe_layers = std::count_if(layers.begin(), layers.end(),
                                  [&](int64_t l) { return moe.at(static_cast<size_t>(l)); });
  if (post_process && m.mtp_num_layers > 0 && moe.at(static_cast<size_t>(m.num_layers - 1)))
    moe_layers += m.mtp_num_layers;  // the MTP depths' layers are of the decoder's last layer's kind
  return moe_layers * (m.num_moe_experts / cfg.parallel.expert_model_parallel_size) * expert;
}

int64_t PlanConfig::num_microbatches() const {
  if (parallel.data_parallel_size <= 0 || global_batch_size <= 0)
    fail("num_microbatches: data_parallel_size is not known yet (call apply_world_size)");
  return global_batch_size / (micro_batch_size * parallel.data_parallel_size);
}

// The plan counts bytes in int64: sizes whose products run past 2^44 elements (17 TB of fp32 in one tensor family,
// more than any machine) would overflow it into nonsense. Refuses them first, naming the product.
void check_plannable_sizes(const PlanConfig& cfg) {
  const TransformerConfig& m = cfg.model;
  const double h = static_cast<double>(m.hidden_size), L = static_cast<double>(m.num_layers + m.mtp_num_layers);
  const double s = static_cast<double>(m.seq_length), b = static_cast<double>(cfg.micro_batch_size);
  const double heads = static_cast<double>(std::max<int64_t>(m.num_attention_heads, 1));
  const double ffn = static_cast<double>(std::max(m.ffn_hidden_size, m.moe_ffn_hidden_size));
  const double experts = static_cast<double>(std::max<int64_t>(m.num_moe_experts, 1));
  const struct {
    const char* what;
    double elements;
  } terms[] = {{"hidden_size^2 x num_layers", h * h * L},
               {"hidden_size x ffn_hidden_size x experts x num_layers", h * ffn * experts * L},
               {"padded_vocab_size x hidden_size", static_cast<double>(m.padded_vocab_size) * h},
               {"seq_length x micro_batch_size x hidden_size x num_layers", s * b * h * L},
               {"seq_length^2 x micro_batch_size x num_attention_heads", s * s * b * heads},
               {"seq_length x micro_batch_size x padded_vocab_size", s * b * static_cast<double>(m.padded_vocab_size)}};
  constexpr double kMaxElements = 17592186044416.0;  // 2^44
  for (const auto& t : terms)
    if (!(t.elements <= kMaxElements))
      fail("memory plan: {} = {:.3g} elements, more than any machine's memory holds (the plan's limit is 2^44); "
           "the sizes are not a trainable model", t.what, t.elements);
}

MemoryPlan plan_memory(const PlanConfig& cfg) {
  const ParallelConfig& par = cfg.parallel;
  if (cfg.model.padded_vocab_size <= 0) fail("plan_memory: the vocabulary is not set (padded_vocab_size)");
  check_plannable_sizes(cfg);
  if (par.data_parallel_size <= 0) fail("plan_memory: the world size is not applied (data_parallel_size)");
  if (par.expert_model_parallel_size > 1 && cfg.model.num_moe_experts == 0)
    fail("plan memory: expert_model_parallel_size {}: the model has no mixture-of-experts layers (the trainer "
         "refuses it too)", par.expert_model_parallel_size);
  const pipeline_parallel::PipelineLayout layout =
      pipeline_parallel::make_pipeline_layout(pipeline_parallel::layout_options(cfg.model, par));
  MemoryPlan plan;
  plan.tp = par.tensor_model_parallel_size;
  plan.pp = par.pipeline_model_parallel_size;
  plan.dp = par.data_parallel_size;
  plan.cp = par.context_parallel_size;
  plan.ep = par.expert_model_parallel_size;
  plan.etp = cfg.model.num_moe_experts > 0 ? par.expert_tp() : 1;
  plan.num_moe_experts = cfg.model.num_moe_experts;
  plan.world_size = plan.tp * plan.pp * plan.dp * plan.cp;
  plan.vp = layout.virtual_pipeline_model_parallel_size;
  plan.num_microbatches = cfg.num_microbatches();
  plan.micro_batch_size = cfg.micro_batch_size;
  plan.seq_length = cfg.model.seq_length;
  plan.distributed_optimizer = par.use_distributed_optimizer;
  plan.sequence_parallel = par.sequence_parallel;
  plan.param_dtype = cfg.bf16 ? DType::BF16 : DType::F32;
  // The distributed optimizer shards over the data-parallel x context-parallel ranks (Megatron's dp_cp group).
  const MemoryReport per_param = memory_report(static_cast<int>(plan.dp), plan.distributed_optimizer,
                                               plan.param_dtype, static_cast<int>(plan.cp));
  // MoE experts: replicated (and sharded by the distributed optimizer) over expert-DP = tp * dp * cp / (ep * etp).
  const int64_t edp = plan.tp * plan.dp * plan.cp / (plan.ep * plan.etp);
  const MemoryReport per_expert_param =
      memory_report(static_cast<int>(edp), plan.distributed_optimizer, plan.param_dtype, 1);
  const pipeline_parallel::ScheduleOptions so{.pipeline_model_parallel_size = plan.pp,
                                              .num_microbatches = plan.num_microbatches,
                                              .virtual_pipeline_model_parallel_size = plan.vp};
  pipeline_parallel::validate_schedule_options(so);
  const std::vector<pipeline_parallel::Schedule> schedules = pipeline_parallel::build_all_schedules(so);
  PlanConfig whole = cfg;  // the logical model: TP-replicated tensors (norms, row-parallel biases) once
  whole.parallel.tensor_model_parallel_size = 1;
  whole.parallel.expert_tensor_parallel_size = 1;
  for (int64_t r = 0; r < plan.pp; ++r) {
    StageMemory st;
    st.pp_rank = r;
    for (int64_t v = 0; v < plan.vp; ++v) {
      const pipeline_parallel::StageLayers& sl = layout.at(r, v);
      ChunkMemory c{.vp_stage = v, .pre_process = sl.pre_process, .post_process = sl.post_process, .layers = sl.layers};
      c.params = chunk_params(cfg, sl.layers, sl.pre_process, sl.post_process);
      c.expert_params = chunk_expert_params(cfg, sl.layers, sl.post_process);
      c.context_bytes = chunk_context_bytes(cfg, sl.layers, sl.pre_process, sl.post_process);
      st.params += c.params;
      st.expert_params += c.expert_params;
      // The model's total counts the word embeddings' last-stage copy (tied, or the MTP depths') once (it is the
      // same logical tensor).
      const bool has_copy = cfg.model.last_stage_uses_word_embeddings() && sl.post_process && !sl.pre_process;
      const int64_t copy = has_copy ? cfg.model.padded_vocab_size * cfg.model.hidden_size : 0;
      plan.total_params +=
          chunk_params(whole, sl.layers, sl.pre_process, sl.post_process) - copy +
          chunk_expert_params(whole, sl.layers, sl.post_process) * plan.ep;  // every EP rank's experts, whole
      st.chunks.push_back(std::move(c));
    }
    const auto p = static_cast<double>(st.params), pe = static_cast<double>(st.expert_params);
    st.param_bytes = p * per_param.param_bytes + pe * per_expert_param.param_bytes;
    st.grad_bytes = p * per_param.grad_bytes + pe * per_expert_param.grad_bytes;
    st.main_param_bytes = p * per_param.main_param_bytes + pe * per_expert_param.main_param_bytes;
    st.optimizer_state_bytes = p * per_param.optimizer_state_bytes + pe * per_expert_param.optimizer_state_bytes;
    int64_t live = 0, live_bytes = 0;
    for (const pipeline_parallel::Action& a : schedules[static_cast<size_t>(r)]) {
      if (a.kind != pipeline_parallel::ActionKind::Forward && a.kind != pipeline_parallel::ActionKind::Backward)
        continue;
      const int64_t bytes = st.chunks[static_cast<size_t>(a.chunk)].context_bytes;
      const int64_t sign = a.kind == pipeline_parallel::ActionKind::Forward ? 1 : -1;
      live += sign;
      live_bytes += sign * bytes;
      st.in_flight = std::max(st.in_flight, live);
      st.peak_activation_bytes = std::max(st.peak_activation_bytes, live_bytes);
    }
    plan.stages.push_back(std::move(st));
  }
  return plan;
}

std::string format_bytes(double bytes) {
  constexpr double kMiB = 1024.0 * 1024.0, kGiB = 1024.0 * kMiB;
  return bytes >= kGiB ? fmt::format("{:.3f} GiB", bytes / kGiB) : fmt::format("{:.3f} MiB", bytes / kMiB);
}

double largest_rank_bytes(const MemoryPlan& plan) {
  double b = 0;
  for (const StageMemory& st : plan.stages) b = std::max(b, st.total_bytes());
  return b;
}

MemoryFit fit_memory(const PlanConfig& cfg, double budget_bytes) {
  if (!(budget_bytes > 0)) fail("plan memory: the memory budget must be positive, got {} bytes", budget_bytes);
  MemoryFit fit{.budget_bytes = budget_bytes};
  fit.largest_rank_bytes = largest_rank_bytes(plan_memory(cfg));
  fit.fits = fit.largest_rank_bytes <= budget_bytes;
  const int64_t microbatches = cfg.num_microbatches();
  const auto bytes_at = [&](int64_t mbs) {
    PlanConfig c = cfg;
    c.micro_batch_size = mbs;
    c.global_batch_size = mbs * cfg.parallel.data_parallel_size * microbatches;
    return largest_rank_bytes(plan_memory(c));
  };
  // The plan grows with the micro-batch size (activations are linear in it): double, then bisect.
  constexpr int64_t kMax = int64_t{1} << 20;
  int64_t lo = 0, hi = 1;  // bytes_at(lo) fits (lo = 0: nothing yet), bytes_at(hi) is to be tried
  while (hi <= kMax && bytes_at(hi) <= budget_bytes) lo = hi, hi *= 2;
  hi = std::min(hi, kMax + 1);
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (bytes_at(mid) <= budget_bytes ? lo : hi) = mid;
  }
  fit.max_micro_batch_size = lo;
  return fit;
}

void require_fits(const PlanConfig& cfg, const MemoryPlan& plan, int64_t pp_rank, double device_bytes,
                  const std::string& memory_name) {
  const StageMemory& st = plan.stages.at(static_cast<size_t>(pp_rank));
  if (st.total_bytes() <= device_bytes) return;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const MemoryFit fit = fit_memory(cfg, device_bytes);
  fail("memory plan: pipeline rank {} needs {:.2f} GiB (model state {:.2f} + activations {:.2f}: {} microbatch "
       "context(s) in flight, before transient buffers) but {} has {:.2f} GiB; {}, or raise tensor / pipeline "
       "parallelism, use --use-distributed-optimizer or --recompute-granularity (`mcpp plan memory` shows each "
       "rank)",
       pp_rank, st.total_bytes() / kGiB, st.model_state_bytes() / kGiB,
       static_cast<double>(st.peak_activation_bytes) / kGiB, st.in_flight, memory_name, device_bytes / kGiB,
       fit.max_micro_batch_size > 0
           ? fmt::format("--micro-batch-size {} would fit (now {})", fit.max_micro_batch_size,
                         cfg.micro_batch_size)
           : std::string("not even --micro-batch-size 1 fits"));
}

std::string format_memory_plan(const MemoryPlan& plan) {
  // GiB, or MiB for plans under 1 GiB (small test models would print rows of 0.000)
  const bool gib = largest_rank_bytes(plan) >= 1024.0 * 1024.0 * 1024.0;
  const double scale = gib ? 1024.0 * 1024.0 * 1024.0 : 1024.0 * 1024.0;
  const char* unit = gib ? "GiB" : "MiB";
  std::string out = fmt::format(
      "memory plan: world {} = tp {} x pp {} x dp {}{}{}{}, {} virtual stage(s), {} microbatch(es) of {} x {} tokens, "
      "{} params, {} optimizer, {:.3f} B parameters\n",
      plan.world_size, plan.tp, plan.pp, plan.dp, plan.cp > 1 ? fmt::format(" x cp {}", plan.cp) : "",
      plan.num_moe_experts > 0
          ? fmt::format(" ({} experts{}{})", plan.num_moe_experts, plan.ep > 1 ? fmt::format(", ep {}", plan.ep) : "",
                        plan.etp > 1 ? fmt::format(", expert tp {}", plan.etp) : "")
          : "",
      plan.sequence_parallel ? " (sequence parallel)" : "", plan.vp,
      plan.num_microbatches, plan.micro_batch_size, plan.seq_length, dtype_name(plan.param_dtype),
      plan.distributed_optimizer ? "distributed" : "replicated", static_cast<double>(plan.total_params) / 1e9);
  out += fmt::format("| pp rank | layers | params (this TP rank) | params {0} | grads {0} | main params {0} | "
                     "optimizer {0} | activations / microbatch {0} | in flight | peak activations {0} | total {0} |\n",
                     unit);
  out += "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  const StageMemory* largest = nullptr;
  for (const StageMemory& st : plan.stages) {
    std::string layers, per_mb;
    for (const ChunkMemory& c : st.chunks) {
      if (!layers.empty()) layers += " / ";
      if (!per_mb.empty()) per_mb += " / ";
      layers += c.pre_process ? "E " : "";
      layers += c.layers.empty() ? "-" : fmt::format("{}-{}", c.layers.front(), c.layers.back());
      layers += c.post_process ? " L" : "";
      per_mb += fmt::format("{:.3f}", static_cast<double>(c.context_bytes) / scale);
    }
    out += fmt::format("| {} | {} | {} | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {} | {} | {:.3f} | {:.3f} |\n",
                       st.pp_rank, layers, st.params, st.param_bytes / scale, st.grad_bytes / scale,
                       st.main_param_bytes / scale, st.optimizer_state_bytes / scale, per_mb, st.in_flight,
                       static_cast<double>(st.peak_activation_bytes) / scale, st.total_bytes() / scale);
    if (!largest || st.total_bytes() > largest->total_bytes()) largest = &st;
  }
  if (largest)
    out += fmt::format("largest: pp rank {} at {:.3f} {} (model state {:.3f} + peak activations {:.3f}), before "
                       "transient backward buffers, workspaces and the CUDA context\n",
                       largest->pp_rank, largest->total_bytes() / scale, unit, largest->model_state_bytes() / scale,
                       static_cast<double>(largest->peak_activation_bytes) / scale);
  return out;
}

nlohmann::json to_json(const MemoryPlan& plan) {
  nlohmann::json j{{"event", "memory_plan"},
                   {"world_size", plan.world_size},
                   {"tp", plan.tp},
                   {"pp", plan.pp},
                   {"dp", plan.dp},
                   {"cp", plan.cp},
                   {"ep", plan.ep},
                   {"etp", plan.etp},
                   {"num_moe_experts", plan.num_moe_experts},
                   {"vp", plan.vp},
                   {"num_microbatches", plan.num_microbatches},
                   {"micro_batch_size", plan.micro_batch_size},
                   {"seq_length", plan.seq_length},
                   {"sequence_parallel", plan.sequence_parallel},
                   {"distributed_optimizer", plan.distributed_optimizer},
                   {"param_dtype", std::string(dtype_name(plan.param_dtype))},
                   {"total_params", plan.total_params},
                   {"stages", nlohmann::json::array()}};
  for (const StageMemory& st : plan.stages) {
    nlohmann::json chunks = nlohmann::json::array();
    for (const ChunkMemory& c : st.chunks)
      chunks.push_back({{"vp_stage", c.vp_stage},
                        {"pre_process", c.pre_process},
                        {"post_process", c.post_process},
                        {"layers", c.layers},
                        {"params", c.params},
                        {"expert_params", c.expert_params},
                        {"context_bytes", c.context_bytes}});
    j["stages"].push_back({{"pp_rank", st.pp_rank},
                           {"chunks", chunks},
                           {"params", st.params},
                           {"expert_params", st.expert_params},
                           {"param_bytes", st.param_bytes},
                           {"grad_bytes", st.grad_bytes},
                           {"main_param_bytes", st.main_param_bytes},
                           {"optimizer_state_bytes", st.optimizer_state_bytes},
                           {"in_flight", st.in_flight},
                           {"peak_activation_bytes", st.peak_activation_bytes},
                           {"total_bytes", st.total_bytes()}});
  }
  return j;
}

}  // namespace mcpp::tools
