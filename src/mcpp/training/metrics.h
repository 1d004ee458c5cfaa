// Training progress output: the Megatron-LM log line on stdout and one JSON object per logged
// iteration in a JSONL file (machine-readable twin of the log line; also eval and checkpoint events).
// The line keeps Megatron's fields and order, with throughput per GPU (TFLOP/s/GPU) after the elapsed time as
// Megatron prints it, MFU beside it when a peak is known, and — with several ranks — the min / max over ranks of
// the window's mean step time at the end. Every rank's own file: rank_metrics_path (rank_metrics.h's records).
#pragma once
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace mcpp {

struct IterationStats {
  int64_t iteration = 0;
  int64_t train_iters = 0;
  int64_t consumed_samples = 0;
  double elapsed_ms_per_iter = 0;
  double tokens_per_sec = 0;
  double learning_rate = 0;       // the lr the window's last optimizer step applied (metrics "learning_rate")
  // The lr after that step's scheduler step, i.e. the next iteration's: what Megatron's log line prints (it reads
  // the param groups after opt_param_scheduler.step); "learning rate:" in the log line, metrics "next_learning_rate".
  double next_learning_rate = 0;
  int64_t global_batch_size = 0;
  double lm_loss = 0;
  double grad_norm = 0;
  int64_t skipped_iters = 0;
  int64_t nan_iters = 0;
  // MoE models: Megatron's load_balancing_loss (or seq_load_balancing_loss with the seq_aux_loss type) / z_loss
  // (the router losses over their coefficients, averaged over layers, microbatches, iterations of the window and
  // ranks); unset when the loss is off.
  std::optional<double> load_balancing_loss, seq_load_balancing_loss, z_loss;
  // --moe-per-layer-logging: the same per MoE layer (global index; the metrics record's "moe_layers")
  struct MoeLayerLosses {
    int64_t layer = 0;
    std::optional<double> load_balancing_loss, seq_load_balancing_loss, z_loss;
  };
  std::vector<MoeLayerLosses> moe_layers;
  // Multi-token prediction: Megatron's "mtp_<k> loss" per depth k = 1.. (the depth's mean loss, averaged over
  // microbatches, iterations of the window and data-parallel ranks); empty without MTP.
  std::vector<double> mtp_losses;
  // MoE expert load of the window (per iteration, over every rank's tokens): routes per expert (before any capacity
  // drop), their min / max / coefficient of variation (population std / mean), the fraction of routes dropped at the
  // capacity and the router entropy (mean nats per token of softmax(logits); log(E) is uniform). moe_load: all MoE
  // layers together (unset without MoE); moe_load_layers: per layer with --moe-per-layer-logging.
  struct MoeLoad {
    int64_t layer = -1;  // global layer index; -1: all MoE layers
    std::vector<double> tokens_per_expert;
    double min = 0, max = 0, cv = 0, dropped_fraction = 0, router_entropy = 0;
  };
  std::optional<MoeLoad> moe_load;
  std::vector<MoeLoad> moe_load_layers;
  // Megatron's throughput per GPU: the window's model FLOPs (flops.h) / (seconds * 1e12 * world size); MFU = that /
  // the peak (flops.h; unset when none is known).
  double tflops_per_gpu = 0;
  std::optional<double> mfu;
  // Several ranks: the min / max over ranks of each rank's mean step time in the window (ms).
  std::optional<double> step_ms_min, step_ms_max;
};

// " [2026-11-30 08:00:00] iteration       10/     100 | consumed samples: ... | lm loss: 5.1E+00 | ..."
std::string format_log_line(const IterationStats& s);

class MetricsWriter {
 public:
  MetricsWriter() = default;
  explicit MetricsWriter(const std::string& path);  // appends; empty path = disabled
  void write(const nlohmann::json& record);
  bool enabled() const { return out_.is_open(); }

 private:
  std::ofstream out_;
};

nlohmann::json to_json(const IterationStats& s);

// Fills min / max / cv of l.tokens_per_expert.
void finish_moe_load(IterationStats::MoeLoad& l);

// Rank r's metrics file beside the metrics file: DIR/STEM.jsonl -> DIR/STEM.rank_<r>.jsonl (a stem, not a fixed
// name, so that several runs writing metrics into one directory keep their rank files apart).
std::string rank_metrics_path(const std::string& metrics_path, int rank);

}  // namespace mcpp
