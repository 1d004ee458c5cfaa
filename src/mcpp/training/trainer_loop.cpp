// The training loop (trainer.h, Megatron's train / evaluate): train() runs train_step until train_iters (or
// --exit-interval), prints Megatron's log line every log_interval (log_window; the MoE router and MTP losses of the
// window are collectives over the world: trainer_reports.cpp), evaluates the valid split every eval_interval, saves
// every save_interval and at the end (trainer_checkpoint.cpp), then — unless --exit-interval ended it — evaluates the
// validation and test sets once more (Megatron's pretrain after train()) and writes the end-of-training reports.
// evaluate(): forward-only schedules over eval_iters global batches, the token-weighted mean over DP; the last rank
// prints Megatron's validation block and writes the metrics record.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>

#include "mcpp/core/module_trace.h"
#include "mcpp/kernels/op_profile.h"
#include "mcpp/optimizer/distributed_optimizer.h"
#include "mcpp/optimizer/lr_scheduler.h"
#include "mcpp/training/flops.h"
#include "mcpp/training/timeline.h"
#include "mcpp/training/trainer.h"

namespace mcpp {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

void Trainer::log_window(int64_t iteration, double lr, int64_t batch, double last_loss) {
  const auto& t = config_.training;
  const double secs = std::chrono::duration<double>(Clock::now() - window_.start).count();
  const int64_t samples = state_.consumed_train_samples - window_.samples_at_start;
  // Megatron's throughput per GPU: the window's model FLOPs over its time and the world's GPUs (ranks)
  const double tflops = num_floating_point_operations(config_, samples) / (secs * 1e12 * pc_.world_size());
  IterationStats st{.iteration = iteration,
                    .train_iters = t.train_iters,
                    .consumed_samples = state_.consumed_train_samples,
                    .elapsed_ms_per_iter = 1000.0 * secs / static_cast<double>(window_.iters),
                    .tokens_per_sec = static_cast<double>(samples * config_.model.seq_length) / secs,
                    .learning_rate = lr,
                    .next_learning_rate = scheduler_->get_lr(),  // Megatron's log line: after the step
                    .global_batch_size = batch,  // the last step's (a ramp-up grows it)
                    .lm_loss = window_.loss_sum / static_cast<double>(window_.iters),
                    .grad_norm = window_.grad_norm_last,
                    .skipped_iters = window_.skipped_total,
                    .nan_iters = window_.nan_total,
                    .load_balancing_loss = std::nullopt,
                    .seq_load_balancing_loss = std::nullopt,
                    .z_loss = std::nullopt,
                    .moe_layers = {},
                    .mtp_losses = {},
                    .moe_load = std::nullopt,
                    .moe_load_layers = {},
                    .tflops_per_gpu = tflops,
                    .mfu = peak_tflops_ > 0.0 ? std::optional<double>(tflops / peak_tflops_) : std::nullopt,
                    .step_ms_min = std::nullopt,
                    .step_ms_max = std::nullopt};
  if (config_.model.num_moe_experts > 0) {  // collectives (every rank)
    moe_log_losses(st);
    moe_log_load(st, window_.iters);
  }
  if (config_.model.mtp_num_layers > 0) mtp_log_losses(st);   // collective (every rank)
  report_window(st, last_loss, samples * config_.model.seq_length);  // collective (every rank)
  window_.loss_sum = 0;
  window_.iters = 0;
  window_.samples_at_start = state_.consumed_train_samples;
  window_.rank = {};
  window_.start = Clock::now();
}

TrainSummary Trainer::train() {
  const auto& t = config_.training;
  TrainSummary summary;
  int64_t iteration = state_.iteration;
  bool exited = false;  // --exit-interval ended the loop: no end-of-training evaluations
  window_ = LogWindow{.samples_at_start = state_.consumed_train_samples};
  if (!t.timeline.empty()) {
    timeline_ = std::make_unique<timeline::TimelineRecorder>(pc_.rank(), pc_.pp_rank(), device_ == Device::CUDA);
    timeline_->start(*pc_.world());
  }
  window_.start = Clock::now();
  if (t.skip_train && is_logging_rank()) fmt::print("skipping training (--skip-train is on) ...\n");
  while (iteration < t.train_iters && !t.skip_train) {
    const double lr = scheduler_->get_lr();
    const int64_t batch = config_.global_batch_size_at(state_.consumed_train_samples);  // this step's
    double grad_norm = 0;
    bool skipped = false;
    const auto step_start = Clock::now();
    std::optional<ModuleTraceRecording> trace;  // --trace-modules N: this step's module tree
    if (iteration + 1 == t.trace_modules) trace.emplace();
    step_iteration_ = iteration + 1;
    const double loss = train_step(&grad_norm, &skipped);
    if (trace) report_module_trace(iteration + 1, trace->take());
    window_.rank.step_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - step_start).count());
    if (summary.iterations_run == 0) ops::op_profile_reset();  // MCPP_PROFILE_OPS: steady state only
    finalize_async_save(/*blocking=*/false);  // a finished background save: vote + commit now
    ++iteration;
    ++summary.iterations_run;
    summary.losses.push_back(loss);
    summary.grad_norms.push_back(grad_norm);
    if (skipped) ++window_.skipped_total, ++window_.nan_total;
    window_.loss_sum += loss;
    window_.grad_norm_last = grad_norm;
    ++window_.iters;
    if (tensorboard_.enabled() && iteration % t.tensorboard_log_interval == 0)
      tensorboard_iteration(iteration, lr, batch, loss, grad_norm);
    if (iteration % t.log_interval == 0 || iteration == t.train_iters) log_window(iteration, lr, batch, loss);
    // Megatron stops its interval-time timer around evaluation and checkpoint saves: the next window's "elapsed time
    // per iteration" (and its tokens/s, TFLOP/s, MFU) is training steps only.
    const auto paused = Clock::now();
    if (t.eval_interval > 0 && iteration % t.eval_interval == 0 && valid_ds_) summary.last_valid_loss = evaluate(iteration);
    if (!t.save.empty() && t.save_interval > 0 && iteration % t.save_interval == 0) save(iteration);
    window_.start += Clock::now() - paused;
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
  report_end_of_training();
  summary.final_iteration = iteration;
  if (step_graph_) {
    summary.cuda_graph_replays = step_graph_->replays();
    summary.cuda_graph_nodes = step_graph_->num_nodes();
  }
  return summary;
}

double Trainer::evaluate(int64_t iteration, Eval which) {
  const bool test = which == Eval::EndTest;
  MegatronDataset* ds = test ? test_ds_.get() : valid_ds_.get();
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
  if (tensorboard_.enabled()) {  // Megatron's "lm loss validation" (/ "test"), also against consumed samples
    const std::string key = std::string("lm loss ") + (test ? "test" : "validation");
    const int64_t samples = state_.consumed_train_samples;
    tensorboard_.add_scalar(key, loss, iteration);
    tensorboard_.add_scalar(key + " vs samples", loss, samples);
    if (config_.training.log_validation_ppl_to_tensorboard) {
      tensorboard_.add_scalar(key + " ppl", std::exp(std::min(loss, 20.0)), iteration);
      tensorboard_.add_scalar(key + " ppl vs samples", std::exp(std::min(loss, 20.0)), samples);
    }
    tensorboard_.flush();
  }
  return loss;
}

}  // namespace mcpp
