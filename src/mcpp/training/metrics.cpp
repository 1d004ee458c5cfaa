#include "mcpp/training/metrics.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "mcpp/core/error.h"

namespace mcpp {

std::string format_log_line(const IterationStats& s) {
  auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::string moe;  // Megatron prints the MoE losses beside the lm loss
  if (s.load_balancing_loss) moe += fmt::format(" load_balancing_loss: {:.6E} |", *s.load_balancing_loss);
  if (s.seq_load_balancing_loss)
    moe += fmt::format(" seq_load_balancing_loss: {:.6E} |", *s.seq_load_balancing_loss);
  if (s.z_loss) moe += fmt::format(" z_loss: {:.6E} |", *s.z_loss);
  for (size_t k = 0; k < s.mtp_losses.size(); ++k) moe += fmt::format(" mtp_{} loss: {:.6E} |", k + 1, s.mtp_losses[k]);
  std::string flops = fmt::format(" throughput per GPU (TFLOP/s/GPU): {:.1f} |", s.tflops_per_gpu);
  if (s.mfu) flops += fmt::format(" MFU: {:.1f}% |", 100.0 * *s.mfu);
  std::string ranks;
  if (s.step_ms_min && s.step_ms_max)
    ranks = fmt::format(" step time min/max over ranks (ms): {:.1f}/{:.1f} |", *s.step_ms_min, *s.step_ms_max);
  return fmt::format(
      " [{:%Y-%m-%d %H:%M:%S}] iteration {:>8}/{:>8} | consumed samples: {:>12} | elapsed time per iteration (ms): "
      "{:.1f} |{} throughput (tok/s): {:.1f} | learning rate: {:.6E} | global batch size: {:>5} | lm loss: {:.6E} |{} "
      "grad norm: {:.3f} | number of skipped iterations: {:>3} | number of nan iterations: {:>3} |{}",
      fmt::localtime(now), s.iteration, s.train_iters, s.consumed_samples, s.elapsed_ms_per_iter, flops,
      s.tokens_per_sec, s.next_learning_rate, s.global_batch_size, s.lm_loss, moe, s.grad_norm, s.skipped_iters,
      s.nan_iters, ranks);
}

nlohmann::json to_json(const IterationStats& s) {
  nlohmann::json j = {{"event", "train"},          {"iteration", s.iteration},
                      {"consumed_samples", s.consumed_samples}, {"elapsed_ms_per_iter", s.elapsed_ms_per_iter},
                      {"tokens_per_sec", s.tokens_per_sec},     {"learning_rate", s.learning_rate},
                      {"next_learning_rate", s.next_learning_rate},
                      {"global_batch_size", s.global_batch_size}, {"lm_loss", s.lm_loss},
                      {"grad_norm", s.grad_norm},               {"skipped_iters", s.skipped_iters},
                      {"nan_iters", s.nan_iters}};
  if (s.load_balancing_loss) j["load_balancing_loss"] = *s.load_balancing_loss;
  if (s.seq_load_balancing_loss) j["seq_load_balancing_loss"] = *s.seq_load_balancing_loss;
  if (s.z_loss) j["z_loss"] = *s.z_loss;
  if (!s.mtp_losses.empty()) j["mtp_losses"] = s.mtp_losses;
  auto load_json = [](const IterationStats::MoeLoad& l) {
    nlohmann::json e = {{"tokens_per_expert", l.tokens_per_expert}, {"min", l.min}, {"max", l.max}, {"cv", l.cv},
                        {"dropped_fraction", l.dropped_fraction}, {"router_entropy", l.router_entropy}};
    if (l.layer >= 0) e["layer"] = l.layer;
    return e;
  };
  if (s.moe_load) j["moe_load"] = load_json(*s.moe_load);
  for (const IterationStats::MoeLoad& l : s.moe_load_layers) j["moe_load_layers"].push_back(load_json(l));
  j["tflops_per_gpu"] = s.tflops_per_gpu;
  if (s.mfu) j["mfu"] = *s.mfu;
  if (s.step_ms_min) j["step_ms_min_over_ranks"] = *s.step_ms_min;
  if (s.step_ms_max) j["step_ms_max_over_ranks"] = *s.step_ms_max;
  for (const IterationStats::MoeLayerLosses& l : s.moe_layers) {
    nlohmann::json e = {{"layer", l.layer}};
    if (l.load_balancing_loss) e["load_balancing_loss"] = *l.load_balancing_loss;
    if (l.seq_load_balancing_loss) e["seq_load_balancing_loss"] = *l.seq_load_balancing_loss;
    if (l.z_loss) e["z_loss"] = *l.z_loss;
    j["moe_layers"].push_back(std::move(e));
  }
  return j;
}

MetricsWriter::MetricsWriter(const std::string& path) {
  if (path.empty()) return;
  std::filesystem::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  if (ec) fail("metrics_path: cannot create the directory of '{}': {}", path, ec.message());
  out_.open(path, std::ios::app);
  if (!out_) fail("metrics_path: cannot open '{}' for writing", path);
}

void finish_moe_load(IterationStats::MoeLoad& l) {
  const std::vector<double>& t = l.tokens_per_expert;
  if (t.empty()) return;
  double sum = 0, sq = 0;
  l.min = l.max = t[0];
  for (double v : t) {
    sum += v;
    l.min = std::min(l.min, v);
    l.max = std::max(l.max, v);
  }
  const double mean = sum / static_cast<double>(t.size());
  for (double v : t) sq += (v - mean) * (v - mean);
  l.cv = mean > 0.0 ? std::sqrt(sq / static_cast<double>(t.size())) / mean : 0.0;
}

std::string rank_metrics_path(const std::string& metrics_path, int rank) {
  std::filesystem::path p(metrics_path);
  const std::string stem = p.extension() == ".jsonl" ? p.stem().string() : p.filename().string();
  return (p.parent_path() / fmt::format("{}.rank_{}.jsonl", stem, rank)).string();
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  out_ << record.dump() << '\n';
  out_.flush();
}

}  // namespace mcpp
