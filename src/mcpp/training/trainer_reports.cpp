// Trainer reports (trainer.h): the log line's collective parts — the MoE router losses of the window averaged over
// every rank's layer calls (moe_log_losses; per layer with --moe-per-layer-logging) and the MTP losses per depth
// (mtp_log_losses), both collective over the world — and the end-of-training reports: per-stage activation memory
// and model state measured beside the memory plan (collective), the --timeline trace and its bubble report
// (collective), and on a GPU the peak device memory. The last rank prints them and writes them to the metrics.
// report_window: the log line with its per-rank parts (rank_metrics.h: every rank's record, the min / max over ranks,
// Megatron's timer report, the straggler report) and the TensorBoard scalars (tensorboard_iteration: per iteration).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>

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

void Trainer::moe_log_load(IterationStats& st, int64_t iters) {
  const std::vector<std::vector<double>> mine = moe_losses_.take_load();  // a device read (CUDA-graph safe)
  const auto layers = static_cast<int64_t>(mine.size());
  const int64_t e = config_.model.num_moe_experts, w = 2 * e + 2;
  Tensor t = Tensor::zeros({layers, w});
  for (int64_t l = 0; l < layers; ++l)
    for (size_t j = 0; j < mine[static_cast<size_t>(l)].size(); ++j)
      t.data<float>()[l * w + static_cast<int64_t>(j)] = static_cast<float>(mine[static_cast<size_t>(l)][j]);
  pc_.world()->host().all_reduce(t, comm::ReduceOp::Sum).wait();
  // Every rank routes its own tokens, except TP ranks without sequence parallelism: they all route the same ones.
  const double copies = (config_.parallel.sequence_parallel ? 1.0 : static_cast<double>(pc_.tp_size())) *
                        static_cast<double>(std::max<int64_t>(iters, 1));
  IterationStats::MoeLoad all{.layer = -1, .tokens_per_expert = std::vector<double>(static_cast<size_t>(e), 0.0)};
  double routes = 0, kept = 0, entropy = 0, tokens = 0;
  for (int64_t l = 0; l < layers; ++l) {
    const float* p = t.data<float>() + l * w;
    if (p[2 * e + 1] <= 0.0f) continue;  // not a MoE layer (or no token routed)
    IterationStats::MoeLoad one{.layer = l, .tokens_per_expert = std::vector<double>(static_cast<size_t>(e))};
    double r = 0, k = 0;
    for (int64_t j = 0; j < e; ++j) {
      one.tokens_per_expert[static_cast<size_t>(j)] = p[j] / copies;
      all.tokens_per_expert[static_cast<size_t>(j)] += p[j] / copies;
      r += p[j], k += p[e + j];
    }
    one.dropped_fraction = r > 0 ? (r - k) / r : 0.0;
    one.router_entropy = p[2 * e] / p[2 * e + 1];
    finish_moe_load(one);
    routes += r, kept += k, entropy += p[2 * e], tokens += p[2 * e + 1];
    if (config_.model.moe_per_layer_logging) st.moe_load_layers.push_back(std::move(one));
  }
  if (tokens <= 0) return;
  all.dropped_fraction = routes > 0 ? (routes - kept) / routes : 0.0;
  all.router_entropy = entropy / tokens;
  finish_moe_load(all);
  st.moe_load = std::move(all);
}

void Trainer::report_window(IterationStats& st, double last_loss, int64_t tokens) {
  const auto& t = config_.training;
  window_.rank.timers_ms = timers_->take();
  const MemoryNow mem = memory_now(device_);
  rank_metrics_.write(rank_record(st.iteration, pc_.rank(), window_.rank, mem, tokens));
  const RanksSummary ranks = gather_ranks(*pc_.world(), window_.rank);  // collective over the world
  if (pc_.world_size() > 1) {
    st.step_ms_min = ranks.step_min();
    st.step_ms_max = ranks.step_max();
  }
  if (!is_logging_rank()) return;
  fmt::print("{}\n", format_log_line(st));
  nlohmann::json rec = to_json(st);
  rec["lm_loss_last"] = last_loss;
  rec["memory"] = to_json(mem);  // this (last) rank's
  if (pc_.world_size() > 1) rec["slowest_rank"] = ranks.slowest();
  if (peak_tflops_ > 0.0) rec["peak_tflops"] = peak_tflops_;
  nlohmann::json timers = nlohmann::json::object();  // per iteration, min / max over the ranks that measured it
  for (int i = 0; i < kNumTimers; ++i) {
    double lo = 0, hi = 0;
    for (const auto& r : ranks.rows) {
      const double v = r[static_cast<size_t>(2 + i)];
      if (v <= 0.0) continue;
      lo = lo == 0.0 ? v : std::min(lo, v);
      hi = std::max(hi, v);
    }
    if (hi > 0.0) timers[std::string(timer_name(static_cast<TimerId>(i)))] = {{"min", lo}, {"max", hi}};
  }
  if (!timers.empty()) rec["timers_ms"] = timers;
  if (t.timing_log_level > 0) {
    const std::string report = format_timers(ranks, t.timing_log_option, static_cast<int>(t.timing_log_level));
    if (!report.empty()) fmt::print("{}\n", report);
  }
  if (t.log_straggler) {
    const nlohmann::json straggler = straggler_json(ranks, t.straggler_threshold);
    fmt::print("{}", format_straggler(straggler));
    nlohmann::json srec = straggler;
    srec["iteration"] = st.iteration;
    metrics_.write(srec);
  }
  std::fflush(stdout);
  metrics_.write(rec);
  if (!tensorboard_.enabled()) return;
  // Megatron's training_log: the MoE / MTP losses every log interval; iteration-time and throughput with
  // --log-timers-to-tensorboard (and each timer's max over ranks as "<name>-time"); memory with
  // --log-memory-to-tensorboard.
  const int64_t it = st.iteration;
  if (st.load_balancing_loss) tensorboard_.add_scalar("load_balancing_loss", *st.load_balancing_loss, it);
  if (st.seq_load_balancing_loss) tensorboard_.add_scalar("seq_load_balancing_loss", *st.seq_load_balancing_loss, it);
  if (st.z_loss) tensorboard_.add_scalar("z_loss", *st.z_loss, it);
  for (size_t k = 0; k < st.mtp_losses.size(); ++k)
    tensorboard_.add_scalar(fmt::format("mtp_{} loss", k + 1), st.mtp_losses[k], it);
  if (st.moe_load) {
    tensorboard_.add_scalar("moe/tokens-per-expert-cv", st.moe_load->cv, it);
    tensorboard_.add_scalar("moe/dropped-fraction", st.moe_load->dropped_fraction, it);
    tensorboard_.add_scalar("moe/router-entropy", st.moe_load->router_entropy, it);
  }
  if (t.log_timers_to_tensorboard) {
    tensorboard_.add_scalar("iteration-time", st.elapsed_ms_per_iter / 1000.0, it);
    tensorboard_.add_scalar("throughput", st.tflops_per_gpu, it);
    for (const auto& [name, v] : timers.items()) tensorboard_.add_scalar(name + "-time", v.at("max").get<double>(), it);
  }
  if (t.log_memory_to_tensorboard) {
    tensorboard_.add_scalar("mem-reserved-bytes", static_cast<double>(mem.reserved_bytes), it);
    tensorboard_.add_scalar("mem-allocated-bytes", static_cast<double>(mem.allocated_bytes), it);
    tensorboard_.add_scalar("mem-max-allocated-bytes", static_cast<double>(mem.peak_bytes), it);
  }
  tensorboard_.flush();
}

namespace {
nlohmann::json module_json(const ModuleNode& n) {
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& [op, calls] : n.ops) ops.push_back({{"op", op}, {"calls", calls}});
  nlohmann::json children = nlohmann::json::array();
  for (const auto& c : n.children) children.push_back(module_json(*c));
  return {{"name", n.name}, {"backward", n.backward}, {"inputs", n.inputs}, {"outputs", n.outputs}, {"ops", ops},
          {"children", children}};
}
}  // namespace

void Trainer::report_module_trace(int64_t iteration, const ModuleTraceRecording::Trees& trees) {
  nlohmann::json rec = {{"event", "module_trace"}, {"iteration", iteration}, {"rank", pc_.rank()}};
  if (trees.forward) rec["forward"] = module_json(*trees.forward);
  if (trees.backward) rec["backward"] = module_json(*trees.backward);
  rank_metrics_.write(rec);
  if (!is_logging_rank()) return;
  metrics_.write(rec);
  fmt::print(" module trace of iteration {} (rank {}: the first microbatch's forward and backward; shapes are this "
             "rank's, [s, b, ...]):\n{}{}",
             iteration, pc_.rank(), trees.forward ? format_module_tree(*trees.forward) : "",
             trees.backward ? format_module_tree(*trees.backward) : "");
  std::fflush(stdout);
}

void Trainer::tensorboard_iteration(int64_t iteration, double lr, int64_t batch, double loss, double grad_norm) {
  // Megatron's per-iteration scalars, against the iteration and against the consumed samples
  const int64_t samples = state_.consumed_train_samples;
  const std::pair<const char*, double> scalars[] = {
      {"learning-rate", lr}, {"batch-size", static_cast<double>(batch)}, {"lm loss", loss}, {"grad-norm", grad_norm}};
  for (const auto& [tag, v] : scalars) {
    tensorboard_.add_scalar(tag, v, iteration);
    tensorboard_.add_scalar(std::string(tag) + " vs samples", v, samples);
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
