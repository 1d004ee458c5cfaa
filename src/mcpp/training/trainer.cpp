#include "mcpp/training/trainer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <optional>

#include "mcpp/core/device_memory.h"
#include "mcpp/core/error.h"
#include "mcpp/core/trace_range.h"
#include "mcpp/kernels/op_profile.h"
#include "mcpp/dist_checkpointing/async_save.h"
#include "mcpp/dist_checkpointing/retention.h"
#include "mcpp/dist_checkpointing/sharded_save.h"
#include "mcpp/optimizer/adam.h"
#include "mcpp/distributed/data_parallel.h"
#include "mcpp/distributed/finalize_grads.h"
#include "mcpp/optimizer/distributed_optimizer.h"
#include "mcpp/pipeline_parallel/layout.h"
#include "mcpp/pipeline_parallel/schedule_runner.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/optimizer/lr_scheduler.h"
#include "mcpp/training/activation_report.h"
#include "mcpp/training/process_settings.h"
#include "mcpp/training/timeline.h"
#include "mcpp/transformer/context_parallel.h"

namespace mcpp {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The split's dataset: the --data-path prefix or Megatron's blend of weighted prefixes (blended_dataset.h), split
// by --split; or with per-split paths the whole of that split's own prefix or blend (null: none given).
std::unique_ptr<BlendedDataset> make_dataset(const Config& c, int split, int64_t num_samples, int64_t eod) {
  const std::vector<std::string>* per_split[] = {&c.data.train_data_path, &c.data.valid_data_path,
                                                 &c.data.test_data_path};
  const char* fields[] = {"train_data_path", "valid_data_path", "test_data_path"};
  const char* whole[] = {"1,0,0", "0,1,0", "0,0,1"};  // Megatron's split of a per-split blend: all of it
  const bool own = c.data.data_path.empty();
  if (own && per_split[split]->empty()) return nullptr;
  const GPTDatasetOptions opt{.prefix = {},  // (the blend's)
                              .split = own ? whole[split] : c.data.split,
                              .split_index = split,
                              .seq_length = c.model.seq_length,
                              .num_samples = num_samples,
                              .seed = static_cast<uint32_t>(c.training.seed),
                              .eod_token = eod,
                              .eod_mask_loss = c.data.eod_mask_loss};
  return std::make_unique<BlendedDataset>(
      own ? parse_data_blend(*per_split[split], fields[split]) : parse_data_blend(c.data.data_path), opt);
}

}  // namespace

Device resolve_training_device(const TrainingConfig& t) {
  if (t.device == "cpu") return Device::CPU;
  if (t.device == "cuda") {
    if (!cuda_available()) fail("device: cuda requested but no CUDA device is visible (or this build has no CUDA)");
    return Device::CUDA;
  }
  return cuda_available() ? Device::CUDA : Device::CPU;  // auto
}

Trainer::Trainer(const Config& config, int64_t eod_token, parallel_state::ParallelContext pc)
    : config_(config), pc_(std::move(pc)), moe_losses_(config_.model.num_layers + config_.model.mtp_num_layers),
      mtp_losses_(config_.model.mtp_num_layers) {
  const auto& t = config_.training;
  const int64_t gbs = t.global_batch_size;
  device_ = resolve_training_device(t);
  apply_process_settings(config_);  // --deterministic-mode: GEMM autotuning off in this process
  if (t.fp16) fail("fp16: training in float16 needs a dynamic loss scaler, which is not implemented; use --bf16");
  if (t.bf16 && device_ != Device::CUDA)
    fail("bf16: mixed-precision training needs the CUDA backend (device resolved to cpu; the CPU trainer runs fp32)");
  if (config_.parallel.expert_model_parallel_size > 1 && config_.model.num_moe_experts == 0)
    fail("expert_model_parallel_size ({}): the model has no mixture-of-experts layers to distribute (set "
         "--num-experts), so expert parallelism would only replicate work; drop --expert-model-parallel-size",
         config_.parallel.expert_model_parallel_size);
  if (t.enable_cuda_graph) {
    if (device_ != Device::CUDA)
      fail("enable_cuda_graph: CUDA graphs need the CUDA backend (device resolved to cpu)");
    if (ops::op_profile_enabled())
      fail("enable_cuda_graph: MCPP_PROFILE_OPS times every op between synchronizations, which a captured "
           "step cannot do; unset it or drop --enable-cuda-graph");
    step_graph_ = std::make_unique<CudaGraph>();
    graph_warmup_left_ = t.cuda_graph_warmup_steps;
  }
  param_dtype_ = t.bf16 ? DType::BF16 : DType::F32;
  const auto& par = config_.parallel;
  if (is_logging_rank())
    fmt::print("{}\n", format_memory_report(memory_report(pc_.dp_size(), par.use_distributed_optimizer, param_dtype_,
                                                          pc_.cp_size())));
  memory_plan_ = tools::plan_memory(config_);
  if (is_logging_rank()) {  // Megatron's "theoretical memory footprints", per pipeline rank
    for (const tools::StageMemory& st : memory_plan_->stages)
      fmt::print("memory plan (pp rank {}): model state {} + peak activations {} ({} microbatch contexts in "
                 "flight) = {}, before transient buffers\n",
                 st.pp_rank, tools::format_bytes(st.model_state_bytes()),
                 tools::format_bytes(static_cast<double>(st.peak_activation_bytes)), st.in_flight,
                 tools::format_bytes(st.total_bytes()));
  }
  // Before anything is allocated: a plan above the GPU's memory would run out of it minutes later.
  if (device_ == Device::CUDA)
    tools::require_fits(config_, *memory_plan_, pc_.pp_rank(), static_cast<double>(cuda_total_memory_bytes()));
  // Megatron's train_val_test_num_samples: train_samples when sample-based (its last, partial batch never trained)
  const int64_t train_samples = t.train_samples > 0 ? t.train_samples : t.train_iters * gbs;
  train_ds_ = make_dataset(config_, 0, train_samples, eod_token);
  if (!train_ds_) fail("data_path: training needs --data-path (or --train-data-path)");
  if (t.eval_iters > 0 && t.eval_interval > 0) {
    const int64_t eval_samples = (t.train_iters / t.eval_interval + 1) * t.eval_iters * gbs;
    valid_ds_ = make_dataset(config_, 1, eval_samples, eod_token);
  }
  // Megatron's test split: eval_iters global batches, evaluated once after training, when the split has a weight
  // (--split's third) or a path of its own (--test-data-path). One too small for a sample skips that evaluation
  // with a warning naming why (the default --split 969,30,1 of a small corpus), rather than failing the run.
  const bool has_test = config_.data.data_path.empty() ? !config_.data.test_data_path.empty()
                                                       : parse_split(config_.data.split)[2] > 0.0;
  if (t.eval_iters > 0 && has_test) {
    try {
      test_ds_ = make_dataset(config_, 2, t.eval_iters * gbs, eod_token);
    } catch (const Error& e) {
      if (!config_.data.test_data_path.empty()) throw;  // its own path: the user asked for this split
      if (is_logging_rank()) spdlog::warn("no test evaluation at the end of training: {}", e.what());
    }
  }
  // Layer placement for this pipeline rank: one model chunk per virtual stage.
  const pipeline_parallel::PipelineLayout layout =
      pipeline_parallel::make_pipeline_layout(pipeline_parallel::layout_options(config_.model, par));
  for (int64_t v = 0; v < layout.virtual_pipeline_model_parallel_size; ++v) {
    const pipeline_parallel::StageLayers& st = layout.at(pc_.pp_rank(), v);
    const int64_t first = st.layers.empty() ? 0 : st.layers.front();
    chunks_.push_back(std::make_unique<ModelChunk>(
        config_.model, static_cast<uint64_t>(t.seed),
        tensor_parallel::TPContext{pc_.tp(), par.sequence_parallel, par.tp_comm_overlap, pc_.cp(),
                                   par.cp_ring(), pc_.ep_size() > 1 ? pc_.ep() : nullptr,
                                   pc_.expert_tp_size() > 1 ? pc_.expert_tp() : nullptr},
        device_,
        GPTModelStage{.pre_process = st.pre_process, .post_process = st.post_process, .first_layer = first,
                      .num_layers = static_cast<int64_t>(st.layers.size())},
        param_dtype_));
    const DdpOptions ddp_opt{.bucket_size = config_.ddp.ddp_bucket_size,
                             .overlap_grad_reduce = config_.ddp.overlap_grad_reduce,
                             .use_distributed_optimizer = par.use_distributed_optimizer};
    ModelChunk& chunk = *chunks_.back();
    chunk.params().set_overwrite_main_grad(config_.ddp.overwrite_main_grad);
    ddps_.push_back(std::make_unique<DistributedDataParallel>(chunk.params(), pc_, ddp_opt));
    // MoE experts: their own buffer, reduced over expert-DP (the distributed optimizer shards it there).
    expert_ddps_.emplace_back();
    if (chunk.has_expert_params()) {
      chunk.expert_params().set_overwrite_main_grad(config_.ddp.overwrite_main_grad);
      DdpOptions eo = ddp_opt;
      eo.expert_parallel = true;  // over expert-DP (= DP at EP 1 without TP / CP), Megatron's expert scaling
      expert_ddps_.back() = std::make_unique<DistributedDataParallel>(chunk.expert_params(), pc_, eo);
    }
  }
  if (par.use_distributed_optimizer) {
    // One DDP per chunk, one optimizer over all chunks' buffers (Megatron's virtual-stage setup).
    std::vector<DistributedDataParallel*> ddps;
    for (auto& d : ddps_) ddps.push_back(d.get());
    for (auto& d : expert_ddps_)
      if (d) ddps.push_back(d.get());
    dist_optimizer_ = std::make_unique<DistributedOptimizer>(
        ddps, DistributedOptimizerOptions{.adam = adam_options_from(config_.optimizer),
                                          .overlap_param_gather = config_.ddp.overlap_param_gather,
                                          .moe_model = config_.model.num_moe_experts > 0});
  } else {
    std::vector<AdamParam> adam_params;
    for (const auto& chunk : chunks_)
      for (ParamAndGradBuffer* buf : chunk->buffers())
        for (const auto& p : buf->params())
          adam_params.push_back({.name = p->spec.key, .param = p->main_param, .main_grad = p->main_grad,
                                 .no_weight_decay = p->spec.no_weight_decay,
                                 .model_param = buf->mixed_precision() ? p->data : Tensor()});
    optimizer_ = std::make_unique<Adam>(std::move(adam_params), adam_options_from(config_.optimizer));
  }
  scheduler_ = std::make_unique<OptimizerParamScheduler>(OptimizerParamScheduler::from_config(
      config_.optimizer, config_.training.global_batch_size, config_.training.train_samples > 0));
  // Dropout streams: seeded by --seed (Megatron's offsets per TP/PP rank); offsets are checkpointed.
  state_.rng = tensor_parallel::RngTracker(static_cast<uint64_t>(t.seed), pc_.tp_rank(), pc_.pp_rank());

  if (!t.load.empty()) {
    LoadOptions lo{.load_optimizer = !t.no_load_optim && !t.finetune,
                   .load_rng = !t.no_load_rng && !t.finetune,
                   .finetune = t.finetune,
                   .override_config_check = t.override_config_check,
                   .verify_checksums = !t.no_verify_checksums};
    uint64_t bytes_read = 0;
    lo.bytes_read = &bytes_read;
    const auto t0 = Clock::now();
    if (load_training_checkpoint(t.load, config_, chunk_ptrs(), optimizer_ref(), state_, lo, &pc_)) {
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (!t.finetune && !state_.scheduler.empty()) scheduler_->load_state_dict(state_.scheduler);
      if (is_logging_rank())
        spdlog::info("loaded checkpoint from {} at iteration {} in {:.1f} ms ({} bytes read by this rank)", t.load,
                     state_.iteration, ms, bytes_read);
    } else if (is_logging_rank()) {
      spdlog::warn("no checkpoint found in '{}': training from scratch", t.load);
    }
  }
  if (!t.save.empty() && pc_.rank() == 0)  // what crashed saves left behind (no save is in flight yet)
    for (const std::string& p : dist_checkpointing::remove_stale_staging(t.save))
      spdlog::warn("removed stale staging path {} (left by an interrupted save)", p);
  if (t.async_save) async_saver_ = std::make_unique<dist_checkpointing::AsyncCheckpointSaver>(pc_.world());
  std::string metrics_path = t.metrics_path;
  if (metrics_path.empty() && !t.save.empty()) metrics_path = t.save + "/metrics.jsonl";
  if (is_logging_rank()) metrics_ = MetricsWriter(metrics_path);
  if (memory_plan_ && is_logging_rank()) metrics_.write(tools::to_json(*memory_plan_));
}

Trainer::~Trainer() = default;

int64_t Trainer::model_state_bytes() const {
  int64_t b = 0;
  for (ParamAndGradBuffer* buf : buffers())
    b += static_cast<int64_t>(buf->param_buffer().nbytes() + buf->grad_buffer().nbytes() +
                              (buf->mixed_precision() && buf->has_main_params() ? buf->main_param_buffer().nbytes() : 0));
  if (optimizer_)
    for (const AdamState& s : optimizer_->state()) b += static_cast<int64_t>(s.exp_avg.nbytes() + s.exp_avg_sq.nbytes());
  if (dist_optimizer_) b += dist_optimizer_->state_bytes();
  return b;
}

std::vector<ModelChunk*> Trainer::chunk_ptrs() const {
  std::vector<ModelChunk*> out;
  for (const auto& c : chunks_) out.push_back(c.get());
  return out;
}

Trainer::Batch Trainer::get_batch(const BlendedDataset& ds, int64_t first, int64_t m) const {
  // Megatron's pretraining sampler: the global batch is num_microbatches slices of mbs * dp samples;
  // DP rank r takes rows [r * mbs, (r + 1) * mbs) of each slice. Past the end, the order repeats.
  const int64_t b = config_.training.micro_batch_size, s = config_.model.seq_length;
  const int64_t base = first + m * b * pc_.dp_size() + pc_.dp_rank() * b;
  Batch batch{Tensor::empty({s, b}, DType::I32), Tensor::empty({s, b}, DType::I32), Tensor::empty({s, b})};
  std::vector<int32_t> tokens(static_cast<size_t>(s + 1));
  std::vector<float> mask(static_cast<size_t>(s));
  const int64_t vocab = config_.model.padded_vocab_size;
  for (int64_t ib = 0; ib < b; ++ib) {
    const int64_t index = (base + ib) % ds.size();
    ds.sample(index, tokens, mask);
    for (int32_t t : tokens)  // checked here for every backend: the CUDA loss reports a bad id only as NaN
      if (t < 0 || t >= vocab)
        fail("data: sample {} of the dataset '{}' holds token id {}, outside the model's vocabulary [0, {}) "
             "(a data file made with another tokenizer, or --vocab-size too small)",
             index, ds.prefix_of(index), t, vocab);
    for (int64_t i = 0; i < s; ++i) {  // sample ib is column ib of the [s, b] layout
      batch.tokens.data<int32_t>()[i * b + ib] = tokens[i];
      batch.labels.data<int32_t>()[i * b + ib] = tokens[i + 1];
      batch.loss_mask.data<float>()[i * b + ib] = mask[i];
    }
  }
  if (pc_.cp_size() == 1) return batch;
  // Context parallelism: this CP rank's rows of every sample (context_parallel.h: a contiguous s / cp chunk, or
  // the ring attention's load-balanced chunks r and 2cp-1-r).
  const std::vector<CpRows> rows =
      cp_rows(s, pc_.cp_size(), pc_.cp_rank(), config_.parallel.cp_ring());
  return {cp_take_rows(batch.tokens, rows), cp_take_rows(batch.labels, rows), cp_take_rows(batch.loss_mask, rows)};
}

double Trainer::dp_mean(double local) const {
  if (pc_.dp_size() == 1) return local;
  Tensor t = Tensor::empty({1});
  t.data<float>()[0] = static_cast<float>(local);
  pc_.dp()->host().all_reduce(t, comm::ReduceOp::Avg).wait();
  return t.data<float>()[0];
}

std::vector<ParamAndGradBuffer*> Trainer::buffers() const {
  std::vector<ParamAndGradBuffer*> out;
  for (const auto& c : chunks_)
    for (ParamAndGradBuffer* b : c->buffers()) out.push_back(b);
  return out;
}

std::vector<ParamAndGradBuffer*> Trainer::dense_buffers() const {
  std::vector<ParamAndGradBuffer*> out;
  for (const auto& c : chunks_) out.push_back(&c->params());
  return out;
}

std::vector<ParamAndGradBuffer*> Trainer::expert_buffers() const {
  std::vector<ParamAndGradBuffer*> out;
  for (const auto& c : chunks_)
    if (c->has_expert_params()) out.push_back(&c->expert_params());
  return out;
}

std::vector<DistributedDataParallel*> Trainer::all_ddps() const {
  std::vector<DistributedDataParallel*> out;
  for (const auto& d : ddps_) out.push_back(d.get());
  for (const auto& d : expert_ddps_)
    if (d) out.push_back(d.get());
  return out;
}

Trainer::StepLoss Trainer::run_microbatches(const BlendedDataset& ds, int64_t first, bool forward_only,
                                            int64_t num_micro) {
  pipeline_parallel::ScheduleOptions so{.pipeline_model_parallel_size = pc_.pp_size(),
                                        .pipeline_model_parallel_rank = pc_.pp_rank(),
                                        .num_microbatches = num_micro,
                                        .virtual_pipeline_model_parallel_size = static_cast<int64_t>(chunks_.size()),
                                        .forward_only = forward_only};
  const pipeline_parallel::Schedule schedule = pipeline_parallel::build_schedule(so);
  const bool static_inputs = !forward_only && !graph_inputs_.empty();
  const int64_t s = config_.model.seq_length / pc_.cp_size() / (config_.parallel.sequence_parallel ? pc_.tp_size() : 1);
  pipeline_parallel::ScheduleRunArgs args{
      .schedule = &schedule,
      .pc = &pc_,
      .get_batch = [&](int64_t m) {
        const Batch b = static_inputs ? graph_inputs_.at(static_cast<size_t>(m)) : get_batch(ds, first, m);
        return pipeline_parallel::MicroBatch{b.tokens, b.labels, b.loss_mask};
      },
      .hidden_shape = {s, config_.training.micro_batch_size, config_.model.hidden_size},
      .variable_seq_lengths = config_.parallel.variable_seq_lengths,
      .hidden_dtype = param_dtype_,
      .hidden_device = device_,
      .forward = {.training = !forward_only, .rng = forward_only ? nullptr : &state_.rng,
                  .moe_losses = forward_only ? nullptr : &moe_losses_,
                  .mtp_losses = forward_only ? nullptr : &mtp_losses_},
      // Megatron: loss / num_microbatches, or the token sum with --calculate-per-token-loss (the gradients
      // are divided by the global token count after the DP reduction: scale_grads_per_token).
      .grad_scale = config_.model.calculate_per_token_loss ? 1.0f : 1.0f / static_cast<float>(num_micro),
      .forward_only = forward_only,
      .before_backward = [&](int64_t m, int64_t chunk) {
        ddps_[static_cast<size_t>(chunk)]->set_is_last_microbatch(m == num_micro - 1);  // no_sync before
        if (const auto& e = expert_ddps_[static_cast<size_t>(chunk)]) e->set_is_last_microbatch(m == num_micro - 1);
      },
      .loss_stats = static_inputs ? graph_loss_stats_ : Tensor()};
  for (const auto& c : chunks_) args.chunks.push_back(c.get());
  if (timeline_ && !forward_only) {
    args.timings = timeline_->begin_step();
    args.device_clock = timeline_->device_clock();
  }
  const pipeline_parallel::ScheduleRunResult r = pipeline_parallel::run_schedule(args);
  if (!forward_only) {
    stage_memory_.max_in_flight = std::max(stage_memory_.max_in_flight, r.max_in_flight);
    stage_memory_.peak_activation_bytes =
        std::max(stage_memory_.peak_activation_bytes, static_cast<int64_t>(r.peak_activation_bytes));
    stage_memory_.context_bytes = std::max(stage_memory_.context_bytes, static_cast<int64_t>(r.max_context_bytes));
  }
  if (static_inputs) return {};  // read from graph_loss_stats_ after the step (the region may be captured)
  const pipeline_parallel::LossTotals totals = pipeline_parallel::loss_totals(r.loss_stats);
  return {totals.loss_sum / static_cast<double>(num_micro), totals.masked_loss_sum, totals.num_tokens};
}

Trainer::StepLoss Trainer::forward_backward(const BlendedDataset& ds, int64_t first) {
  for (DistributedDataParallel* ddp : all_ddps()) ddp->zero_grad();
  // (a --rampup-batch-size ramp: this step's microbatches, from the samples consumed before it)
  const StepLoss step = run_microbatches(ds, first, /*forward_only=*/false, config_.num_microbatches_at(first));
  const TraceRange sync_range("grad sync");
  for (DistributedDataParallel* ddp : all_ddps())
    ddp->finish_grad_sync();  // average over DP (owned shards with the distributed optimizer)
  return step;
}

void Trainer::write_graph_rng_base() {
  const std::array<uint64_t, 2> offsets = state_.rng.offsets();
  Tensor h = Tensor::empty({2}, DType::I64);
  for (size_t i = 0; i < 2; ++i) h.data<int64_t>()[i] = static_cast<int64_t>(offsets[i]);
  graph_rng_base_.copy_from(h);  // host->device, ordered before the replay on the compute stream
}

Trainer::StepLoss Trainer::forward_backward_graphed(const BlendedDataset& ds, int64_t first) {
  const int64_t num_micro = config_.num_microbatches();
  const bool last_stage = chunks_.back()->stage().post_process;
  for (int64_t m = 0; m < num_micro; ++m) {  // this step's batches into the static buffers
    const Batch b = get_batch(ds, first, m);
    if (graph_inputs_.size() <= static_cast<size_t>(m))  // first step: the buffers (live as long as the graph)
      graph_inputs_.push_back({Tensor::empty(b.tokens.shape(), DType::I32, device_),
                               Tensor::empty(b.labels.shape(), DType::I32, device_),
                               Tensor::empty(b.loss_mask.shape(), DType::F32, device_)});
    Batch& dst = graph_inputs_[static_cast<size_t>(m)];
    dst.tokens.copy_from(b.tokens);
    dst.labels.copy_from(b.labels);
    dst.loss_mask.copy_from(b.loss_mask);
  }
  if (last_stage && !graph_loss_stats_.defined()) graph_loss_stats_ = Tensor::zeros({num_micro, 2}, DType::F32, device_);
  if (graph_warmup_left_ > 0) {
    --graph_warmup_left_;
    forward_backward(ds, first);
  } else {
    if (!step_graph_->captured()) {
      const int64_t iteration = first / config_.training.global_batch_size + 1;  // this step's number
      const auto t0 = Clock::now();
      graph_rng_base_ = Tensor::empty({2}, DType::I64, device_);
      write_graph_rng_base();  // this step's start: what the captured keys are relative to
      state_.rng.begin_graph_capture(static_cast<const uint64_t*>(graph_rng_base_.raw()));
      const std::array<uint64_t, 2> before = state_.rng.offsets();
      step_graph_->capture([&] { forward_backward(ds, first); });
      const std::array<uint64_t, 2> after = state_.rng.offsets();  // the capture drew this step's keys
      graph_rng_step_ = {after[0] - before[0], after[1] - before[1]};
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (is_logging_rank()) {
        fmt::print(" captured the training step in a CUDA graph (full_iteration) at iteration {}: {} nodes, "
                   "{:.1f} ms; replaying it from now on\n", iteration, step_graph_->num_nodes(), ms);
        metrics_.write({{"event", "cuda_graph"}, {"iteration", iteration},
                        {"nodes", step_graph_->num_nodes()}, {"capture_ms", ms}});
      }
      step_graph_->replay();  // the capture step: base = its start, the tracker already past it
    } else {
      write_graph_rng_base();
      step_graph_->replay();
      state_.rng.advance(graph_rng_step_);  // as the eager step's draws would have
    }
  }
  if (!last_stage) return {};
  const pipeline_parallel::LossTotals totals = pipeline_parallel::loss_totals(graph_loss_stats_);
  return {totals.loss_sum / static_cast<double>(num_micro), totals.masked_loss_sum, totals.num_tokens};
}

double Trainer::scale_grads_per_token(const StepLoss& local) {
  // Sums over the last stage (other stages contribute 0) and over DP: sum(loss * mask), sum(mask).
  Tensor sums = Tensor::empty({2});
  sums.data<float>()[0] = static_cast<float>(local.masked_loss_sum);
  sums.data<float>()[1] = static_cast<float>(local.num_tokens);
  if (pc_.pp_size() > 1) pc_.pp()->host().all_reduce(sums, comm::ReduceOp::Sum).wait();
  if (pc_.dp_size() > 1) pc_.dp()->host().all_reduce(sums, comm::ReduceOp::Sum).wait();
  const double tokens = sums.data<float>()[1];  // (each CP rank's statistics are its whole sequences' already)
  // The DP reduction averaged the token-sum gradients over dp * cp ranks: * dp * cp / tokens gives
  // d(sum loss*mask / tokens).
  const auto factor = static_cast<float>(tokens > 0 ? pc_.dp_cp()->size() / tokens : 0.0);
  for (ParamAndGradBuffer* b : buffers()) ops::scale_inplace(b->grad_buffer(), factor);
  return tokens > 0 ? sums.data<float>()[0] / tokens : 0.0;
}

double Trainer::train_step(double* grad_norm, bool* skipped) {
  const TraceRange step_range("train_step");
  if (dist_optimizer_) dist_optimizer_->wait_param_gather();  // previous step's params complete
  const StepLoss step = step_graph_ ? forward_backward_graphed(*train_ds_, state_.consumed_train_samples)
                                    : forward_backward(*train_ds_, state_.consumed_train_samples);
  const TraceRange optimizer_range("optimizer");
  const bool per_token = config_.model.calculate_per_token_loss;
  const double loss = per_token ? scale_grads_per_token(step) : step.mean_loss;
  finalize_model_grads(dense_buffers(), pc_, config_.model.last_stage_uses_word_embeddings());
  if (config_.model.moe_router_enable_expert_bias) {  // Megatron's _update_router_expert_bias, every step
    std::vector<moe::TopKRouter*> routers;
    for (const auto& c : chunks_)
      for (moe::TopKRouter* r : c->routers()) routers.push_back(r);
    moe::update_expert_biases(routers, {pc_.tp(), pc_.cp(), pc_.dp()}, config_.model.moe_router_bias_update_rate);
  }
  const float clip = config_.optimizer.clip_grad;
  if (dist_optimizer_) *grad_norm = dist_optimizer_->grad_norm();
  else if (config_.model.num_moe_experts > 0) *grad_norm = model_grad_norm(dense_buffers(), expert_buffers(), pc_);
  else *grad_norm = model_grad_norm(dense_buffers(), pc_);
  *skipped = !std::isfinite(*grad_norm);
  if (!*skipped) {
    const auto lr = static_cast<float>(scheduler_->get_lr());
    // Megatron scales the fp32 grads by the clip coefficient, then steps; the same fp32 product is taken
    // inside the AdamW kernel instead (bitwise the same update, one pass over the grads fewer; the grads
    // themselves stay unscaled and are zeroed before the next step).
    const auto coef = static_cast<float>(clip_coefficient(*grad_norm, clip));
    if (dist_optimizer_) dist_optimizer_->step(lr, coef);
    else optimizer_->step(lr, coef);
  }
  const int64_t batch = config_.global_batch_size_at(state_.consumed_train_samples);  // this step's (ramp-up)
  scheduler_->step(batch);
  state_.consumed_train_samples += batch;
  const double mean = per_token ? loss : dp_mean(loss);
  if (timeline_) timeline_->end_step();  // the step's collectives, the loss reduction included
  return mean;
}

double Trainer::evaluate(int64_t iteration, Eval which) {
  const bool test = which == Eval::EndTest;
  BlendedDataset* ds = test ? test_ds_.get() : valid_ds_.get();
  if (!ds) return -1;
  int64_t test_consumed = 0;  // (the test iterator starts at its first sample: Megatron evaluates it once)
  int64_t& consumed = test ? test_consumed : state_.consumed_valid_samples;
  if (dist_optimizer_) dist_optimizer_->wait_param_gather();
  const auto& t = config_.training;
  double loss_sum = 0, tokens = 0;
  for (int64_t it = 0; it < t.eval_iters; ++it) {
    StepLoss r = run_microbatches(*ds, consumed, /*forward_only=*/true,
                                  config_.num_microbatches());  // whole global batches, ramp-up or not
    loss_sum += r.masked_loss_sum;
    tokens += r.num_tokens;
    consumed += t.global_batch_size;
  }
  if (pc_.dp_size() > 1) {  // token-weighted mean over the whole global batches
    Tensor sums = Tensor::empty({2});
    sums.data<float>()[0] = static_cast<float>(loss_sum);
    sums.data<float>()[1] = static_cast<float>(tokens);
    pc_.dp()->host().all_reduce(sums, comm::ReduceOp::Sum).wait();
    loss_sum = sums.data<float>()[0];
    tokens = sums.data<float>()[1];
  }
  const double loss = tokens > 0 ? loss_sum / tokens : 0.0;
  if (!is_logging_rank()) return loss;
  const std::string line =
      fmt::format(" validation loss at iteration {}{} | lm loss value: {:.6E} | lm loss PPL: {:.6E} |", iteration,
                  which == Eval::Interval ? "" : test ? " on test set" : " on validation set", loss,
                  std::exp(std::min(loss, 20.0)));
  const std::string bar(line.size(), '-');
  fmt::print("{}\n{}\n{}\n", bar, line, bar);
  nlohmann::json rec = {{"event", test ? "test" : "valid"}, {"iteration", iteration}, {"lm_loss", loss},
                        {"ppl", std::exp(std::min(loss, 20.0))}};
  if (which != Eval::Interval) rec["end_of_training"] = true;
  metrics_.write(rec);
  return loss;
}

void Trainer::save(int64_t iteration) {
  state_.iteration = iteration;
  state_.scheduler = scheduler_->state_dict();
  if (dist_optimizer_) dist_optimizer_->wait_param_gather();
  const auto& t = config_.training;
  finalize_async_save(/*blocking=*/true);  // at most one save in flight
  // The pause: training is stopped from here until the snapshot is taken (sync: until committed).
  auto t0 = Clock::now();
  CheckpointSnapshot snap = snapshot_training_checkpoint(config_, chunk_ptrs(), optimizer_ref(), state_, pc_);
  std::string dir;
  if (async_saver_) {
    async_saver_->start(t.save, snap.iteration, std::move(snap.meta), std::move(snap.shards));
  } else {
    dir = dist_checkpointing::save_sharded_checkpoint(t.save, snap.iteration, snap.meta, snap.shards, pc_.world()->host());
  }
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (is_logging_rank()) {
    if (async_saver_) {
      fmt::print(" started async save of checkpoint at iteration {:>7} | save-checkpoint pause (ms): {:.1f}\n",
                 iteration, ms);
      metrics_.write({{"event", "save_start"}, {"iteration", iteration}, {"async", true}, {"pause_ms", ms}});
    } else {
      fmt::print(" saved checkpoint at iteration {:>7} to {} in {:.1f} ms | save-checkpoint pause (ms): {:.1f}\n",
                 iteration, dir, ms, ms);
      metrics_.write({{"event", "save"}, {"iteration", iteration}, {"dir", dir}, {"ms", ms}, {"pause_ms", ms},
                      {"async", false}});
    }
  }
  if (!async_saver_) after_commit(dir, iteration);
}

void Trainer::finalize_async_save(bool blocking) {
  if (!async_saver_ || !async_saver_->in_flight()) return;
  const int64_t iteration = async_saver_->in_flight_iteration();
  const std::optional<std::string> dir = async_saver_->maybe_finalize(blocking);
  if (!dir) return;
  const double ms = 1000.0 * async_saver_->last_save_seconds();
  if (is_logging_rank()) {
    fmt::print(" saved checkpoint at iteration {:>7} to {} (async: committed {:.1f} ms after the snapshot)\n",
               iteration, *dir, ms);
    metrics_.write({{"event", "save"}, {"iteration", iteration}, {"dir", *dir}, {"ms", ms}, {"async", true}});
  }
  after_commit(*dir, iteration);
}

void Trainer::after_commit(const std::string& dir, int64_t iteration) {
  const int64_t keep = config_.training.keep_last_n_checkpoints;
  if (keep <= 0 || pc_.rank() != 0) return;
  for (const std::string& old : dist_checkpointing::remove_old_checkpoints(config_.training.save, keep))
    spdlog::info("--keep-last-n-checkpoints {}: deleted {} (after committing {} at iteration {})", keep, old, dir,
                 iteration);
}

void Trainer::moe_log_losses(IterationStats& st) {
  // this rank's per-layer sums since the last log line (a device read), summed over every rank's MoE layer calls
  const std::vector<moe::LossTracker::Sums> mine = moe_losses_.take();
  const auto layers = static_cast<int64_t>(mine.size());
  Tensor t = Tensor::empty({layers, 3});
  for (int64_t l = 0; l < layers; ++l) {
    float* p = t.data<float>() + 3 * l;
    const moe::LossTracker::Sums& s = mine[static_cast<size_t>(l)];
    p[0] = static_cast<float>(s.load_balancing), p[1] = static_cast<float>(s.z), p[2] = static_cast<float>(s.calls);
  }
  pc_.world()->host().all_reduce(t, comm::ReduceOp::Sum).wait();
  // Ranks that split one sequence (TP under sequence parallelism, CP) each hold a share of its losses (router.h):
  // the mean is over (layer, microbatch, sequence), each sequence's shares summed.
  const double split = static_cast<double>(config_.parallel.sequence_parallel ? pc_.tp_size() : 1) * pc_.cp_size();
  const std::string& balancing = config_.model.moe_router_load_balancing_type;
  const bool aux = config_.model.moe_aux_loss_coeff > 0.0f && balancing == "aux_loss";
  const bool seq = config_.model.moe_aux_loss_coeff > 0.0f && balancing == "seq_aux_loss";
  const bool z = config_.model.moe_z_loss_coeff > 0.0f;
  auto fill = [&](auto& out, double lb, double zl, double calls) {
    if (aux) out.load_balancing_loss = lb / calls;
    if (seq) out.seq_load_balancing_loss = lb / calls;
    if (z) out.z_loss = zl / calls;
  };
  double lb = 0, zl = 0, calls = 0;
  for (int64_t l = 0; l < layers; ++l) {
    const float* p = t.data<float>() + 3 * l;
    lb += p[0], zl += p[1], calls += p[2] / split;
    if (config_.model.moe_per_layer_logging && p[2] > 0) {
      IterationStats::MoeLayerLosses e{.layer = l, .load_balancing_loss = {}, .seq_load_balancing_loss = {},
                                       .z_loss = {}};
      fill(e, p[0], p[1], p[2] / split);
      st.moe_layers.push_back(e);
    }
  }
  if (calls > 0) fill(st, lb, zl, calls);
}

void Trainer::mtp_log_losses(IterationStats& st) {
  // Megatron's track_mtp_metrics: per depth the microbatches' mean losses, averaged over the window's microbatches
  // and the data-parallel ranks (the last stage's TP ranks hold equal values; other stages add nothing)
  const std::vector<std::pair<double, double>> mine = mtp_losses_.take();
  const auto depths = static_cast<int64_t>(mine.size());
  Tensor t = Tensor::empty({depths, 2});
  for (int64_t k = 0; k < depths; ++k) {
    t.data<float>()[2 * k] = static_cast<float>(mine[static_cast<size_t>(k)].first);
    t.data<float>()[2 * k + 1] = static_cast<float>(mine[static_cast<size_t>(k)].second);
  }
  pc_.world()->host().all_reduce(t, comm::ReduceOp::Sum).wait();
  for (int64_t k = 0; k < depths; ++k) {
    const float count = t.data<float>()[2 * k + 1];
    st.mtp_losses.push_back(count > 0 ? t.data<float>()[2 * k] / count : 0.0);
  }
}

TrainSummary Trainer::train() {
  const auto& t = config_.training;
  TrainSummary summary;
  int64_t iteration = state_.iteration;
  int64_t skipped_total = 0, nan_total = 0, iters_in_window = 0;
  bool exited = false;  // --exit-interval ended the loop: no end-of-training evaluations
  int64_t samples_at_window_start = state_.consumed_train_samples;  // tokens/s: a ramp-up's batches differ
  double loss_window = 0, grad_norm_last = 0;
  if (!t.timeline.empty()) {
    timeline_ = std::make_unique<timeline::TimelineRecorder>(pc_.rank(), pc_.pp_rank(), device_ == Device::CUDA);
    timeline_->start(*pc_.world());
  }
  auto window_start = Clock::now();
  if (t.skip_train && is_logging_rank()) fmt::print("skipping training (--skip-train is on) ...\n");
  while (iteration < t.train_iters && !t.skip_train) {
    const double lr = scheduler_->get_lr();
    const int64_t batch = config_.global_batch_size_at(state_.consumed_train_samples);  // this step's
    double grad_norm = 0;
    bool skipped = false;
    const double loss = train_step(&grad_norm, &skipped);
    if (summary.iterations_run == 0) ops::op_profile_reset();  // MCPP_PROFILE_OPS: steady state only
    finalize_async_save(/*blocking=*/false);  // a finished background save: vote + commit now
    ++iteration;
    ++summary.iterations_run;
    summary.losses.push_back(loss);
    summary.grad_norms.push_back(grad_norm);
    if (skipped) ++skipped_total, ++nan_total;
    loss_window += loss;
    grad_norm_last = grad_norm;
    ++iters_in_window;
    if (iteration % t.log_interval == 0 || iteration == t.train_iters) {
      const double secs = std::chrono::duration<double>(Clock::now() - window_start).count();
      IterationStats st{.iteration = iteration,
                        .train_iters = t.train_iters,
                        .consumed_samples = state_.consumed_train_samples,
                        .elapsed_ms_per_iter = 1000.0 * secs / static_cast<double>(iters_in_window),
                        .tokens_per_sec = static_cast<double>((state_.consumed_train_samples -
                                                               samples_at_window_start) *
                                                              config_.model.seq_length) / secs,
                        .learning_rate = lr,
                        .global_batch_size = batch,  // the last step's (a ramp-up grows it)
                        .lm_loss = loss_window / static_cast<double>(iters_in_window),
                        .grad_norm = grad_norm_last,
                        .skipped_iters = skipped_total,
                        .nan_iters = nan_total,
                        .load_balancing_loss = std::nullopt,
                        .seq_load_balancing_loss = std::nullopt,
                        .z_loss = std::nullopt,
                        .moe_layers = {},
                        .mtp_losses = {}};
      if (config_.model.num_moe_experts > 0) moe_log_losses(st);  // collective (every rank)
      if (config_.model.mtp_num_layers > 0) mtp_log_losses(st);   // collective (every rank)
      if (is_logging_rank()) {
        fmt::print("{}\n", format_log_line(st));
        std::fflush(stdout);
        nlohmann::json rec = to_json(st);
        rec["lm_loss_last"] = loss;
        metrics_.write(rec);
      }
      loss_window = 0;
      iters_in_window = 0;
      samples_at_window_start = state_.consumed_train_samples;
      window_start = Clock::now();
    }
    if (t.eval_interval > 0 && iteration % t.eval_interval == 0 && valid_ds_) summary.last_valid_loss = evaluate(iteration);
    if (!t.save.empty() && t.save_interval > 0 && iteration % t.save_interval == 0) save(iteration);
    if (t.exit_interval > 0 && iteration % t.exit_interval == 0) {
      exited = true;
      break;
    }
  }
  if (!t.save.empty() && !t.skip_train && (t.save_interval <= 0 || iteration % t.save_interval != 0))
    save(iteration);
  finalize_async_save(/*blocking=*/true);  // the trainer finalizes at exit
  if (!exited) {  // Megatron's pretrain after train(): the validation and test sets once more (after the save)
    if (valid_ds_) summary.end_valid_loss = evaluate(iteration, Eval::EndValidation);
    if (test_ds_) summary.test_loss = evaluate(iteration, Eval::EndTest);
  }
  if (!t.skip_train) {  // per-stage activation memory and model state (collective on world), measured and planned
    stage_memory_.model_state_bytes = model_state_bytes();
    nlohmann::json report = timeline::gather_activation_report(*pc_.world(), pc_.pp_rank(), stage_memory_);
    if (memory_plan_) timeline::add_planned_activations(report, *memory_plan_);
    if (is_logging_rank()) {
      fmt::print("{}", timeline::format_activation_report(report));
      metrics_.write(report);
    }
  }
  if (timeline_) {
    if (timeline_->comm_dropped() > 0)
      spdlog::warn("timeline: rank {}: {} communication calls of training steps were overwritten in the flight "
                   "recorder's ring before the step ended; the trace's collectives row misses them",
                   pc_.rank(), timeline_->comm_dropped());
    const nlohmann::json trace = timeline::gather_and_write_trace(
        *timeline_, *pc_.world(), pc_.pp_rank(),
        {pc_.pp_size(), config_.num_microbatches(), static_cast<int64_t>(chunks_.size()), timeline_->clock_name()},
        t.timeline,
        is_logging_rank());
    if (is_logging_rank()) {
      const nlohmann::json report = timeline::bubble_report(trace);
      fmt::print("{}", timeline::format_bubble_report(report));
      metrics_.write(report);
    }
  }
  if (device_ == Device::CUDA && is_logging_rank()) {
    const double gib = static_cast<double>(cuda_peak_memory_bytes()) / kGiB;
    nlohmann::json rec{{"event", "memory"}, {"peak_device_gib", gib}};
    if (memory_plan_) {  // the plan of this rank's stage: the measured peak adds transient buffers and workspaces
      const double planned = memory_plan_->stages[static_cast<size_t>(pc_.pp_rank())].total_bytes() / kGiB;
      fmt::print(" peak device memory (rank {}): {:.2f} GiB (memory plan: {:.2f} GiB)\n", pc_.rank(), gib, planned);
      rec["planned_gib"] = planned;
    } else {
      fmt::print(" peak device memory (rank {}): {:.2f} GiB\n", pc_.rank(), gib);
    }
    metrics_.write(rec);
  }
  summary.final_iteration = iteration;
  if (step_graph_) {
    summary.cuda_graph_replays = step_graph_->replays();
    summary.cuda_graph_nodes = step_graph_->num_nodes();
  }
  return summary;
}

}  // namespace mcpp
