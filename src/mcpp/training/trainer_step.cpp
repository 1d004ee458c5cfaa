// One training step (trainer.h, Megatron's train_step): the schedule over the global batch's microbatches
// (run_microbatches: pipeline_parallel/schedule_runner.h; also evaluation's forward-only pass), zero_grad + the
// schedule + the DP grad sync (forward_backward; under --enable-cuda-graph captured once, then replayed:
// forward_backward_graphed), then --calculate-per-token-loss's rescale, finalize_model_grads, the expert-bias update,
// the grad norm + clip and the optimizer and scheduler steps (train_step). Returns the step's loss (mean over DP).
// Between the grad norm and the optimizer step: the NaN / spiky-loss check (a re-run with per-module checks and a
// skipped step: trainer_diagnosis.cpp) and the --inject-fault hooks (fault_injection.h). After the forward-backward of
// a step --check-data-consistency is due at: the world compares the microbatches' hashes (data_consistency.h).
// --rerun-on-cpu: the step's microbatches are recorded as built (run_microbatches), for its CPU re-run.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "mcpp/comm/flight_recorder.h"
#include "mcpp/core/cuda_graph.h"
#include "mcpp/core/trace_range.h"
#include "mcpp/distributed/data_parallel.h"
#include "mcpp/distributed/finalize_grads.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/optimizer/adam.h"
#include "mcpp/optimizer/distributed_optimizer.h"
#include "mcpp/optimizer/lr_scheduler.h"
#include "mcpp/pipeline_parallel/schedule_runner.h"
#include "mcpp/training/fault_injection.h"
#include "mcpp/training/nan_localizer.h"
#include "mcpp/training/timeline.h"
#include "mcpp/training/trainer.h"

namespace mcpp {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

Trainer::StepLoss Trainer::run_microbatches(const MegatronDataset& ds, int64_t first, bool forward_only,
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
        if (static_inputs) {
          const Batch& b = graph_inputs_.at(static_cast<size_t>(m));
          return pipeline_parallel::MicroBatch{b.tokens, b.labels, b.loss_mask, b.packed};
        }
        if (replay_batches_ && !forward_only) {  // --rerun-on-cpu: the step's recorded batches
          const Batch& b = replay_batches_->at(static_cast<size_t>(m));
          return pipeline_parallel::MicroBatch{b.tokens, b.labels, b.loss_mask, b.packed};
        }
        const auto t0 = Clock::now();
        if (faults_ && !forward_only) faults_->before_batch(step_iteration_);  // --inject-fault slow-data
        const Batch b = get_batch(ds, first, m, /*training=*/!forward_only);
        if (!forward_only)  // Megatron's batch-generator timer (level 2): building the microbatch on the host
          timers_->add_ms(TimerId::BatchGenerator,
                          std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        if (record_batches_ && !forward_only) {  // --rerun-on-cpu: kept for a CPU re-run of this step
          if (step_batches_.size() <= static_cast<size_t>(m)) step_batches_.resize(static_cast<size_t>(m) + 1);
          step_batches_[static_cast<size_t>(m)] = b;
        }
        return pipeline_parallel::MicroBatch{b.tokens, b.labels, b.loss_mask, b.packed};
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
        if (nan_probe_) nan_probe_->set_microbatch(m);
        ddps_[static_cast<size_t>(chunk)]->set_is_last_microbatch(m == num_micro - 1);  // no_sync before
        if (const auto& e = expert_ddps_[static_cast<size_t>(chunk)]) e->set_is_last_microbatch(m == num_micro - 1);
      },
      .before_forward = [&](int64_t m, int64_t) {
        if (nan_probe_) nan_probe_->set_microbatch(m);
      },
      .loss_stats = static_inputs ? graph_loss_stats_ : Tensor()};
  for (const auto& c : chunks_) args.chunks.push_back(c.get());
  if (timeline_ && !forward_only) {
    args.timings = timeline_->begin_step();
    args.device_clock = timeline_->device_clock();
  } else if (!forward_only && timers_->log_level() >= 2 && !stream_capturing()) {  // the level-2 schedule timers
    step_actions_.clear();
    args.timings = &step_actions_;
    args.device_clock = timers_->device_clock();
  }
  const size_t actions_before = args.timings ? args.timings->size() : 0;
  const pipeline_parallel::ScheduleRunResult r = pipeline_parallel::run_schedule(args);
  if (args.timings && timers_->log_level() >= 2)
    timers_->add_actions(*args.timings, actions_before, args.device_clock);
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

Trainer::StepLoss Trainer::forward_backward(const MegatronDataset& ds, int64_t first) {
  for (DistributedDataParallel* ddp : all_ddps()) ddp->zero_grad();
  // (a --rampup-batch-size ramp: this step's microbatches, from the samples consumed before it)
  const StepLoss step = run_microbatches(ds, first, /*forward_only=*/false, config_.num_microbatches_at(first));
  const TraceRange sync_range("grad sync");
  const Timers::Scope sync_timer = timers_->scope(TimerId::AllGradsSync);
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

Trainer::StepLoss Trainer::forward_backward_graphed(const MegatronDataset& ds, int64_t first) {
  const int64_t num_micro = config_.num_microbatches();
  const bool last_stage = chunks_.back()->stage().post_process;
  for (int64_t m = 0; m < num_micro; ++m) {  // this step's batches into the static buffers
    const Batch b = get_batch(ds, first, m, /*training=*/true);
    if (graph_inputs_.size() <= static_cast<size_t>(m))  // first step: the buffers (live as long as the graph)
      graph_inputs_.push_back({Tensor::empty(b.tokens.shape(), DType::I32, device_),
                               Tensor::empty(b.labels.shape(), DType::I32, device_),
                               Tensor::empty(b.loss_mask.shape(), DType::F32, device_), {}});
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

double Trainer::global_grad_norm() {
  if (dist_optimizer_) return dist_optimizer_->grad_norm();
  if (config_.model.num_moe_experts > 0) return model_grad_norm(dense_buffers(), expert_buffers(), pc_);
  return model_grad_norm(dense_buffers(), pc_);
}

double Trainer::train_step(double* grad_norm, bool* skipped) {
  const TraceRange step_range("train_step");
  if (dist_optimizer_) {  // previous step's params complete (--overlap-param-gather: the gather's exposed part)
    const Timers::Scope gather_timer = timers_->scope(TimerId::ParamsAllGather);
    dist_optimizer_->wait_param_gather();
  }
  const tensor_parallel::RngTracker rng_before = state_.rng;  // a diagnosis re-run starts from here
  if (comm::FlightRecorder* fr = pc_.world()->recorder())  // hang forensics: this step's calls carry its iteration
    fr->set_context({.iteration = step_iteration_, .pp_stage = pc_.pp_rank()});
  if (faults_) faults_->begin_step(step_iteration_, /*rerun=*/false, *pc_.world());
  step_batches_.clear();  // --rerun-on-cpu records this step's (run_microbatches)
  record_batches_ = config_.training.rerun_on_cpu;
  StepLoss step;
  std::vector<MicrobatchDigest> digests;  // --check-data-consistency (due every N iterations)
  const int64_t every = config_.training.check_data_consistency;
  if (every > 0 && step_iteration_ % every == 0) data_digests_ = &digests;
  {
    const Timers::Scope fb_timer = timers_->scope(TimerId::ForwardBackward);
    step = step_graph_ ? forward_backward_graphed(*train_ds_, state_.consumed_train_samples)
                       : forward_backward(*train_ds_, state_.consumed_train_samples);
  }
  if (faults_) faults_->end_step();
  record_batches_ = false;
  if (data_digests_) {  // collective over the world; a mismatch throws on every rank before the optimizer step
    data_digests_ = nullptr;
    check_data_consistency(pc_, step_iteration_, config_.training.micro_batch_size, digests);
  }
  const TraceRange optimizer_range("optimizer");
  const bool per_token = config_.model.calculate_per_token_loss;
  const double loss = per_token ? scale_grads_per_token(step) : step.mean_loss;
  {  // finalize_model_grads in its two parts, timed apart as Megatron's
    const Timers::Scope ln_timer = timers_->scope(TimerId::LayernormGradsAllReduce);
    allreduce_sequence_parallel_grads(dense_buffers(), pc_);
  }
  {
    const Timers::Scope emb_timer = timers_->scope(TimerId::EmbeddingGradsAllReduce);
    allreduce_embedding_grads(dense_buffers(), pc_, config_.model.last_stage_uses_word_embeddings());
  }
  {  // Megatron's optimizer timer: the expert-bias update, grad norm + clip, the step, the param gather
    const Timers::Scope optimizer_timer = timers_->scope(TimerId::Optimizer);
    if (config_.model.moe_router_enable_expert_bias) {  // Megatron's _update_router_expert_bias, every step
      std::vector<moe::TopKRouter*> routers;
      for (const auto& c : chunks_)
        for (moe::TopKRouter* r : c->routers()) routers.push_back(r);
      moe::update_expert_biases(routers, {pc_.tp(), pc_.cp(), pc_.dp()}, config_.model.moe_router_bias_update_rate);
    }
    const float clip = config_.optimizer.clip_grad;
    {
      const Timers::Scope clip_timer = timers_->scope(TimerId::OptimizerClipMainGrad);
      *grad_norm = global_grad_norm();
    }
    *skipped = !std::isfinite(*grad_norm);
    // --check-for-nan-in-loss-and-grad / --check-for-spiky-loss: re-run, localise, skip (trainer_diagnosis.cpp)
    if (const std::optional<RerunTrigger> trigger = rerun_trigger(*grad_norm, loss)) {
      diagnose_step(*trigger, rng_before, *grad_norm, loss);
      *skipped = true;
    }
    if (!*skipped) {
      const auto lr = static_cast<float>(scheduler_->get_lr());
      // Megatron scales the fp32 grads by the clip coefficient, then steps; the same fp32 product is taken
      // inside the AdamW kernel instead (bitwise the same update, one pass over the grads fewer; the grads
      // themselves stay unscaled and are zeroed before the next step).
      const auto coef = static_cast<float>(clip_coefficient(*grad_norm, clip));
      {
        const Timers::Scope inner_timer = timers_->scope(TimerId::OptimizerInnerStep);
        if (dist_optimizer_) dist_optimizer_->update_shards(lr, coef);
        else optimizer_->step(lr, coef);
      }
      if (dist_optimizer_) {
        const Timers::Scope gather_timer = timers_->scope(TimerId::ParamsAllGather);
        dist_optimizer_->gather_params();  // the updated shards back into the param buffer (async with overlap)
      }
    }
  }
  const int64_t batch = config_.global_batch_size_at(state_.consumed_train_samples);  // this step's (ramp-up)
  scheduler_->step(batch);
  state_.consumed_train_samples += batch;
  const double mean = per_token ? loss : dp_mean(loss);
  if (timeline_) timeline_->end_step();  // the step's collectives, the loss reduction included
  return mean;
}

}  // namespace mcpp
