#include "mcpp/training/trainer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>

#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/core/error.h"
#include "mcpp/optimizer/adam.h"
#include "mcpp/optimizer/clip_grads.h"
#include "mcpp/optimizer/lr_scheduler.h"

namespace mcpp {
namespace {

using Clock = std::chrono::steady_clock;

GPTDatasetOptions dataset_options(const Config& c, int split, int64_t num_samples, int64_t eod) {
  if (c.data.data_path.size() != 1)
    fail("data_path: exactly one dataset prefix is supported (got {})", c.data.data_path.size());
  return {.prefix = c.data.data_path[0],
          .split = c.data.split,
          .split_index = split,
          .seq_length = c.model.seq_length,
          .num_samples = num_samples,
          .seed = static_cast<uint32_t>(c.training.seed),
          .eod_token = eod,
          .eod_mask_loss = c.data.eod_mask_loss};
}

}  // namespace

Trainer::Trainer(const Config& config, int64_t eod_token) : config_(config) {
  const auto& t = config_.training;
  const int64_t gbs = t.global_batch_size;
  train_ds_ = std::make_unique<GPTDataset>(dataset_options(config_, 0, t.train_iters * gbs, eod_token));
  if (t.eval_iters > 0 && t.eval_interval > 0) {
    const int64_t eval_samples = (t.train_iters / t.eval_interval + 1) * t.eval_iters * gbs;
    valid_ds_ = std::make_unique<GPTDataset>(dataset_options(config_, 1, eval_samples, eod_token));
  }
  model_ = std::make_unique<GPTModel>(config_.model, static_cast<uint64_t>(t.seed),
                                      tensor_parallel::TPContext{comm::make_local_world(), false});
  std::vector<AdamParam> adam_params;
  for (const auto& p : model_->params().params())
    adam_params.push_back({.name = p->spec.key, .param = p->data, .main_grad = p->main_grad,
                           .no_weight_decay = p->spec.no_weight_decay});
  optimizer_ = std::make_unique<Adam>(std::move(adam_params), adam_options_from(config_.optimizer));
  scheduler_ = std::make_unique<OptimizerParamScheduler>(OptimizerParamScheduler::from_config(config_));
  // Dropout stream: seeded by --seed; its offset is part of the checkpoint so a resume replays it.
  state_.rng = tensor_parallel::RngTracker(static_cast<uint64_t>(t.seed), model_->tp().rank(), /*pp_rank=*/0);

  if (!t.load.empty()) {
    LoadOptions lo{.load_optimizer = !t.no_load_optim && !t.finetune,
                   .load_rng = !t.no_load_rng && !t.finetune,
                   .finetune = t.finetune,
                   .override_config_check = t.override_config_check};
    if (load_training_checkpoint(t.load, config_, *model_, optimizer_.get(), state_, lo)) {
      if (!t.finetune && !state_.scheduler.empty()) scheduler_->load_state_dict(state_.scheduler);
      spdlog::info("loaded checkpoint from {} at iteration {}", t.load, state_.iteration);
    } else {
      spdlog::warn("no checkpoint found in '{}': training from scratch", t.load);
    }
  }
  train_cursor_ = std::make_unique<GPTSampleCursor>(*train_ds_, state_.consumed_train_samples);
  std::string metrics_path = t.metrics_path;
  if (metrics_path.empty() && !t.save.empty()) metrics_path = t.save + "/metrics.jsonl";
  metrics_ = MetricsWriter(metrics_path);
}

Trainer::~Trainer() = default;

Trainer::Batch Trainer::next_batch(GPTSampleCursor& cursor) {
  const int64_t b = config_.training.micro_batch_size, s = config_.model.seq_length;
  Batch batch{Tensor::empty({s, b}, DType::I32), Tensor::empty({s, b}, DType::I32), Tensor::empty({s, b})};
  std::vector<int32_t> tokens(static_cast<size_t>(s + 1));
  std::vector<float> mask(static_cast<size_t>(s));
  for (int64_t ib = 0; ib < b; ++ib) {
    cursor.next(tokens, mask);
    for (int64_t i = 0; i < s; ++i) {  // sample ib is column ib of the [s, b] layout
      batch.tokens.data<int32_t>()[i * b + ib] = tokens[i];
      batch.labels.data<int32_t>()[i * b + ib] = tokens[i + 1];
      batch.loss_mask.data<float>()[i * b + ib] = mask[i];
    }
  }
  return batch;
}

double Trainer::train_step(double* grad_norm, bool* skipped) {
  const int64_t num_micro = config_.num_microbatches();
  model_->params().zero_grad();
  double loss = 0;
  for (int64_t m = 0; m < num_micro; ++m) {
    Batch batch = next_batch(*train_cursor_);
    GPTModelCtx ctx;
    LossResult r = model_->forward_loss(ctx, batch.tokens, batch.labels, batch.loss_mask,
                                        {.training = true, .rng = &state_.rng});
    model_->backward(ctx, 1.0f / static_cast<float>(num_micro));  // Megatron: loss / num_microbatches
    loss += r.loss / static_cast<double>(num_micro);
  }
  *grad_norm = clip_grad_norm_fp32(optimizer_->main_grads(), config_.optimizer.clip_grad, identity_reduce);
  *skipped = !std::isfinite(*grad_norm);
  if (!*skipped) optimizer_->step(static_cast<float>(scheduler_->get_lr()));
  scheduler_->step(config_.training.global_batch_size);
  return loss;
}

double Trainer::evaluate(int64_t iteration) {
  if (!valid_ds_) return -1;
  const auto& t = config_.training;
  GPTSampleCursor cursor(*valid_ds_, state_.consumed_valid_samples);
  double loss_sum = 0, tokens = 0;
  for (int64_t it = 0; it < t.eval_iters; ++it)
    for (int64_t m = 0; m < config_.num_microbatches(); ++m) {
      Batch batch = next_batch(cursor);
      GPTModelCtx ctx;
      LossResult r = model_->forward_loss(ctx, batch.tokens, batch.labels, batch.loss_mask, {.training = false});
      loss_sum += r.loss_sum;
      tokens += r.num_tokens;
    }
  state_.consumed_valid_samples = cursor.consumed_samples();
  const double loss = tokens > 0 ? loss_sum / tokens : 0.0;
  const std::string line = fmt::format(" validation loss at iteration {} | lm loss value: {:.6E} | lm loss PPL: {:.6E} |",
                                       iteration, loss, std::exp(std::min(loss, 20.0)));
  const std::string bar(line.size(), '-');
  fmt::print("{}\n{}\n{}\n", bar, line, bar);
  metrics_.write({{"event", "valid"}, {"iteration", iteration}, {"lm_loss", loss}, {"ppl", std::exp(std::min(loss, 20.0))}});
  return loss;
}

void Trainer::save(int64_t iteration) {
  state_.iteration = iteration;
  state_.consumed_train_samples = train_cursor_->consumed_samples();
  state_.scheduler = scheduler_->state_dict();
  auto t0 = Clock::now();
  std::string dir = save_training_checkpoint(config_.training.save, config_, *model_, optimizer_.get(), state_);
  double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  fmt::print(" saved checkpoint at iteration {:>7} to {} in {:.1f} ms\n", iteration, dir, ms);
  metrics_.write({{"event", "save"}, {"iteration", iteration}, {"dir", dir}, {"ms", ms}});
}

TrainSummary Trainer::train() {
  const auto& t = config_.training;
  TrainSummary summary;
  int64_t iteration = state_.iteration;
  int64_t skipped_total = 0, nan_total = 0, iters_in_window = 0;
  double loss_window = 0, grad_norm_last = 0;
  auto window_start = Clock::now();
  while (iteration < t.train_iters) {
    const double lr = scheduler_->get_lr();
    double grad_norm = 0;
    bool skipped = false;
    const double loss = train_step(&grad_norm, &skipped);
    ++iteration;
    ++summary.iterations_run;
    summary.losses.push_back(loss);
    if (skipped) ++skipped_total, ++nan_total;
    loss_window += loss;
    grad_norm_last = grad_norm;
    ++iters_in_window;
    if (iteration % t.log_interval == 0 || iteration == t.train_iters) {
      const double secs = std::chrono::duration<double>(Clock::now() - window_start).count();
      IterationStats st{.iteration = iteration,
                        .train_iters = t.train_iters,
                        .consumed_samples = train_cursor_->consumed_samples(),
                        .elapsed_ms_per_iter = 1000.0 * secs / static_cast<double>(iters_in_window),
                        .tokens_per_sec = static_cast<double>(iters_in_window * t.global_batch_size *
                                                              config_.model.seq_length) / secs,
                        .learning_rate = lr,
                        .global_batch_size = t.global_batch_size,
                        .lm_loss = loss_window / static_cast<double>(iters_in_window),
                        .grad_norm = grad_norm_last,
                        .skipped_iters = skipped_total,
                        .nan_iters = nan_total};
      fmt::print("{}\n", format_log_line(st));
      std::fflush(stdout);
      nlohmann::json rec = to_json(st);
      rec["lm_loss_last"] = loss;
      metrics_.write(rec);
      loss_window = 0;
      iters_in_window = 0;
      window_start = Clock::now();
    }
    if (t.eval_interval > 0 && iteration % t.eval_interval == 0 && valid_ds_) summary.last_valid_loss = evaluate(iteration);
    if (!t.save.empty() && t.save_interval > 0 && iteration % t.save_interval == 0) save(iteration);
    if (t.exit_interval > 0 && iteration % t.exit_interval == 0) break;
  }
  if (!t.save.empty() && (t.save_interval <= 0 || iteration % t.save_interval != 0)) save(iteration);
  summary.final_iteration = iteration;
  return summary;
}

}  // namespace mcpp
