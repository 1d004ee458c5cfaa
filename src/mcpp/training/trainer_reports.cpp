// Trainer reports (trainer.h): the log line's collective parts — the MoE router losses of the window averaged over
// every rank's layer calls (moe_log_losses; per layer with --moe-per-layer-logging) and the MTP losses per depth
// (mtp_log_losses), both collective over the world — and the end-of-training reports: per-stage activation memory
// and model state measured beside the memory plan (collective), the --timeline trace and its bubble report
// (collective), and on a GPU the peak device memory. The last rank prints them and writes them to the metrics.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "mcpp/core/device_memory.h"
#include "mcpp/training/activation_report.h"
#include "mcpp/training/timeline.h"
#include "mcpp/training/trainer.h"

namespace mcpp {
namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
}  // namespace

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

void Trainer::report_end_of_training() {
  const auto& t = config_.training;
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
}

}  // namespace mcpp
