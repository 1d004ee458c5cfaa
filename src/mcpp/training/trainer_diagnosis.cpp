// The trainer's NaN / spiky-loss diagnosis (trainer.h; the method in training/nan_localizer.h): rerun_trigger decides
// after the grad norm, diagnose_step re-runs the step from the pre-step state with a NanProbe on every rank, gathers
// the findings, classifies (reproducible / transient), and reports: the log lines (last rank), a metrics record
// {"event": "rerun_incident"} (last rank; every rank's own finding in its per-rank metrics) and the JSON incident file
// <metrics stem>.incident_iter<N>.json (last rank). With --rerun-on-cpu the step also re-runs in fp32 on CPU
// (trainer_cpu_rerun.cpp): its verdict joins the incident, plus a {"event": "cpu_rerun"} record and a TensorBoard
// scalar. The caller skips the step. Under --enable-cuda-graph the step is skipped without a re-run (the replayed
// graph runs no module scopes).
#include <algorithm>
#include <cmath>
#include <fstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "mcpp/distributed/data_parallel.h"
#include "mcpp/distributed/finalize_grads.h"
#include "mcpp/training/trainer.h"

namespace mcpp {

double Trainer::world_max_loss(double local_loss) {
  // Only the last stages hold a loss (others 0; losses are >= 0). A non-finite loss anywhere: NaN (MPI's max of NaN
  // is not reliable, so the non-finite count travels beside it).
  Tensor m = Tensor::empty({2});
  m.data<float>()[0] = std::isfinite(local_loss) ? static_cast<float>(local_loss) : 0.0f;
  m.data<float>()[1] = std::isfinite(local_loss) ? 0.0f : 1.0f;
  pc_.world()->host().all_reduce(m, comm::ReduceOp::Max).wait();
  return m.data<float>()[1] > 0 ? std::nan("") : m.data<float>()[0];
}

std::optional<Trainer::RerunTrigger> Trainer::rerun_trigger(double grad_norm, double local_loss) {
  const auto& t = config_.training;
  // grad_norm is global (every rank holds the same value); a NaN / Inf loss reaches the grads, hence the norm
  if (t.check_for_nan_in_loss_and_grad && !std::isfinite(grad_norm)) return RerunTrigger::NanGradNorm;
  if (!t.check_for_spiky_loss) return std::nullopt;
  step_loss_max_ = world_max_loss(local_loss);
  if (is_spiky_loss(step_loss_max_, healthy_losses_, t.spiky_loss_factor)) return RerunTrigger::SpikyLoss;
  if (std::isfinite(grad_norm) && std::isfinite(step_loss_max_)) {
    healthy_losses_.push_back(step_loss_max_);
    if (healthy_losses_.size() > kSpikyLossWindow) healthy_losses_.erase(healthy_losses_.begin());
  }
  return std::nullopt;
}

void Trainer::diagnose_step(RerunTrigger trigger, const tensor_parallel::RngTracker& rng_before, double grad_norm,
                            double local_loss) {
  NanIncident inc;
  inc.iteration = step_iteration_;
  inc.trigger = trigger == RerunTrigger::SpikyLoss ? "spiky_loss" : "nan_grad_norm";
  inc.grad_norm = grad_norm;
  inc.loss = trigger == RerunTrigger::SpikyLoss ? step_loss_max_ : world_max_loss(local_loss);
  if (trigger == RerunTrigger::SpikyLoss && !healthy_losses_.empty())
    inc.spike_reference = *std::max_element(healthy_losses_.begin(), healthy_losses_.end());
  if (step_graph_) {
    if (is_logging_rank())
      fmt::print(" [rerun] iteration {}: {}; no re-run under --enable-cuda-graph; step skipped\n", inc.iteration,
                 inc.trigger);
    return;
  }
  // The pre-step state: parameters and optimizer untouched (no optimizer step yet), the batch the same (consumed
  // samples move after the step), the dropout streams back to the step's start.
  const tensor_parallel::RngTracker rng_after = state_.rng;
  state_.rng = rng_before;
  std::optional<NonFiniteFinding> mine;
  if (faults_) faults_->begin_step(step_iteration_, /*rerun=*/true, *pc_.world());  // a persistent NaN fault
  {
    NanProbe probe(pc_.rank(), pc_.pp_rank());  // installed after the injector: sees the injected NaN
    nan_probe_ = &probe;
    const StepLoss step = forward_backward(*train_ds_, state_.consumed_train_samples);
    if (faults_) faults_->end_step();
    nan_probe_ = nullptr;
    mine = probe.finding();
    const double loss = config_.model.calculate_per_token_loss ? scale_grads_per_token(step) : step.mean_loss;
    allreduce_sequence_parallel_grads(dense_buffers(), pc_);
    allreduce_embedding_grads(dense_buffers(), pc_, config_.model.last_stage_uses_word_embeddings());
    inc.rerun_grad_norm = global_grad_norm();
    inc.rerun_loss = world_max_loss(loss);
  }
  state_.rng = rng_after;  // as the skipped step's draws left it (the re-run drew the same)
  inc.findings = gather_findings(*pc_.world(), mine);
  inc.reproducible = trigger == RerunTrigger::SpikyLoss
                         ? is_spiky_loss(inc.rerun_loss, healthy_losses_, config_.training.spiky_loss_factor)
                         : !std::isfinite(inc.rerun_grad_norm);
  if (config_.training.rerun_on_cpu) inc.cpu = rerun_on_cpu(trigger, rng_before);  // trainer_cpu_rerun.cpp
  const nlohmann::json rec = to_json(inc);
  if (mine) {  // every rank: its own finding in its per-rank metrics
    rank_metrics_.write({{"event", "rerun_finding"}, {"iteration", inc.iteration}, {"rank", pc_.rank()},
                         {"module", mine->module}, {"tensor", mine->tensor()}, {"layer", mine->layer},
                         {"microbatch", mine->microbatch}});
  }
  if (!is_logging_rank()) return;
  fmt::print("{}", describe(inc));
  metrics_.write(rec);
  if (const auto& c = inc.cpu) {  // --rerun-on-cpu's metric: the verdict and what the re-run cost
    metrics_.write({{"event", "cpu_rerun"}, {"iteration", inc.iteration}, {"cpu_fp32", c->verdict()},
                    {"reproduces", c->reproduces}, {"state", c->state}, {"ms", c->ms}});
    if (tensorboard_.enabled())
      tensorboard_.add_scalar("cpu-rerun reproduces", c->reproduces ? 1.0 : 0.0, inc.iteration);
  }
  if (metrics_path_.empty()) return;
  std::string stem = metrics_path_;
  if (stem.ends_with(".jsonl")) stem.resize(stem.size() - 6);
  const std::string path = fmt::format("{}.incident_iter{}.json", stem, inc.iteration);
  std::ofstream out(path);
  out << rec.dump(2) << "\n";
  if (!out) spdlog::warn("could not write the incident file {}", path);
  else fmt::print(" [rerun] iteration {}: incident written to {}\n", inc.iteration, path);
}

}  // namespace mcpp
